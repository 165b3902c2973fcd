"""Which values are secrets, and keeping them out of everything a person or a log sees.

Vars end up in reports, the history and error messages. A playbook declares
its secrets (``secrets: [hf_token]``) and any var whose name looks like one
(``api_key``, ``db_password`` …) is treated as one too, because forgetting to
declare a token must not print it.

A server's environment, its command line's flags and the health checks'
headers hold secrets that are no var at all (``MYSQL_PWD`` set by hand, a
``DATABASE_URL`` with a password in it, an ``Authorization`` header). Those
are found by a broader rule on their *names* (``SENSITIVE_NAME``), plus the
names a playbook lists under ``secrets:``, and by the password of any URL
(``scheme://user:pass@host``). ``Masker`` holds all of it for one run; each
channel a person or a log reads (the console, ``--json``, ``run.log``, the
release's records) passes its text or data through it in one place.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

SECRET_NAME = re.compile(r"(?i)(secret|token|passw|api[_-]?key|credential|private)")
"""Var names whose values are secrets even when the playbook does not declare them."""
SENSITIVE_NAME = re.compile(r"(?i)(pass|pwd|key|token|secret|auth|credential|private|signing)")
"""Environment variables, flags and header names whose values are masked (a broader rule:
over-masking a ``--tokenizer-path`` on a screen costs less than printing a ``DB_PASS``)."""
NOT_SENSITIVE = frozenset({"pwd", "oldpwd"})
"""Names the rule matches that are no secret: the shell's working directories."""
URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:/?#@'\"]*:)([^\s/?#@'\"]+)@")
"""``scheme://user:password@host``: the password is group 2."""
MASK = "***"
MASKED_NAMES = "masked_names"
"""A release manifest's list of its playbook's ``secrets:`` names (a key no rule masks)."""
_MIN_LENGTH = 4
_MIN_FOUND_LENGTH = 6


def secret_names(vars: Mapping[str, Any], declared: Iterable[str]) -> set[str]:
    """Declared names plus every var whose name looks like a secret."""
    names = set(declared)
    names.update(name for name in vars if SECRET_NAME.search(name))
    return names


def redact(vars: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """A copy of ``vars`` with the values of ``names`` replaced by ``***``."""
    hidden = set(names)
    return {k: (MASK if k in hidden else v) for k, v in vars.items()}


def secret_values(vars: Mapping[str, Any], names: Iterable[str]) -> list[str]:
    """The values of the secret vars, as strings, for ``redact_text``."""
    return [str(vars[name]) for name in names if name in vars and vars[name] is not None]


def redact_text(text: str, values: Iterable[Any]) -> str:
    """``text`` with every secret value in it replaced by ``***``.

    Values shorter than 4 characters are ignored: masking every ``1`` or
    ``on`` in a log would make it unreadable and protect nothing.
    """
    candidates = {str(v) for v in values if v is not None and len(str(v)) >= _MIN_LENGTH}
    for value in sorted(candidates, key=len, reverse=True):  # longest first: no partial leftovers
        text = text.replace(value, MASK)
    return mask_urls(text)


def mask_urls(text: str) -> str:
    """``postgres://u:p@h/db`` → ``postgres://u:***@h/db``, anywhere in ``text``."""
    return URL_USERINFO.sub(rf"\1{MASK}@", text) if "://" in text else text


def redact_argv(argv: Iterable[str], values: Iterable[Any] = (), declared: Iterable[str] = ()) -> list[str]:
    """A command line fit to show: the value of any secret-looking flag
    (``--api-key X``, ``--hf-token=X``) and any known secret value masked.

    Used where orch has no playbook to ask (``orch status`` reading a
    process's argv from ``/proc``) as well as where it does.
    """
    out: list[str] = []
    hide_next = False
    known = [v for v in values if v is not None]
    for word in argv:
        if hide_next and not word.startswith("--"):
            out.append(MASK)
            hide_next = False
            continue
        hide_next = False
        name, eq, _ = word.partition("=")
        if word.startswith("-") and is_sensitive(name, declared):
            if eq:
                out.append(f"{name}={MASK}")
            else:
                out.append(word)
                hide_next = True
            continue
        out.append(redact_text(word, known))
    return out


def redact_env(env: Mapping[str, str] | None, values: Iterable[Any] = (),
               declared: Iterable[str] = ()) -> dict[str, str] | None:
    """An environment fit to record: sensitive variables (``HF_TOKEN``, ``MYSQL_PWD`` …)
    masked whole, URL passwords and known secret values masked in the others."""
    if env is None:
        return None
    known = [v for v in values if v is not None]
    return {k: (MASK if is_sensitive(k, declared) else redact_text(str(v), known)) for k, v in env.items()}


def normal_name(name: str) -> str:
    """``--hf-token``, ``HF_TOKEN`` and ``hf_token`` are one name: lower case, ``_`` for ``-``,
    no leading dashes."""
    return name.lstrip("-").replace("-", "_").lower()


def is_sensitive(name: str, declared: Iterable[str] = ()) -> bool:
    """An env var, flag or header whose value is masked: by the rule, or listed in ``secrets:``."""
    wanted = normal_name(name)
    if any(normal_name(d) == wanted for d in declared):
        return True
    return wanted not in NOT_SENSITIVE and bool(SENSITIVE_NAME.search(name))


def worth_masking(value: str) -> bool:
    """A value found by a rule (not a declared var) that is masked wherever it appears:
    6 characters or more, not a number, not a path. Masking a ``/models/x`` or a
    ``false`` found under a ``*_TOKEN*`` name everywhere would make output unreadable."""
    return (len(value) >= _MIN_FOUND_LENGTH and not value.isdigit()
            and not value.startswith(("/", "~", "./", "../")))


ARGV_KEYS = frozenset({"argv", "argvs", "start", "stop", "start_cmd", "stop_cmd", "restore_start_cmd",
                       "pid_cmd", "before_stop", "after_healthy", "preflight", "install", "command"})
"""Keys under which a list of words is a command line (in records and helper messages)."""


def _looks_like_argv(key: str, data: list[Any] | tuple[Any, ...]) -> bool:
    """A command line: words under a command key, or words that start with a program and
    have flags after it (not a list of ``--flag: a -> b`` changes, whose first word is one)."""
    if not data or not all(isinstance(w, str) for w in data):
        return False
    return key in ARGV_KEYS or (not data[0].startswith("-") and any(w.startswith("-") for w in data[1:]))


RESTORE_MASK = "mask"
"""The key of ``restore.json`` that lists a release's secret var values (``core.restore.restore_spec``)."""


class Masker:
    """Every secret of one run, and the rules; masks text, command lines, environments and records.

    Built once per run (the CLI makes it with the run's ``Output`` and hands it
    to the pipeline in ``ConnectOptions``): secret vars' values go in at the
    start (``hide``); values found later — a running server's environment, the
    command line, the health checks' headers, a restore plan read back from a
    host — are ``learn``-ed as the pipeline meets them, so a log tail printed
    afterwards is masked too. Thread-safe: a fleet's hosts share it.
    """

    def __init__(self, values: Iterable[Any] = (), declared: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._values: set[str] = set()
        self._ordered: tuple[str, ...] = ()
        self._declared: frozenset[str] = frozenset()  # replaced, never changed: read without the lock
        self.hide(values)
        self.declare(declared)

    # ------------------------------------------------------------ what is secret

    def hide(self, values: Iterable[Any]) -> None:
        """Values (secret vars) that are masked wherever they appear (4 characters or more)."""
        self._add(str(v) for v in values if v is not None and len(str(v)) >= _MIN_LENGTH)

    def declare(self, names: Iterable[str]) -> None:
        """Names from a playbook's ``secrets:``: env vars, flags and headers masked like the rule's."""
        new = frozenset(n for n in names if n)
        with self._lock:
            self._declared = self._declared | new

    @property
    def declared(self) -> frozenset[str]:
        return self._declared

    def declare_recorded(self, manifests: Iterable[Mapping[str, Any]]) -> None:
        """The ``secrets:`` names each release recorded (``masked_names``): ``orch rollback``,
        ``status`` and ``history`` have no playbook to ask, and mask them all the same."""
        self.declare(str(n) for m in manifests for n in (m.get(MASKED_NAMES) or []) if isinstance(n, str))

    def learn(self, data: Any, key: str = "") -> None:
        """Remember the secrets inside a record or wire message (env, argv, headers, URLs)."""
        if isinstance(data, dict) and isinstance(data.get(RESTORE_MASK), list):
            self.hide(v for v in data[RESTORE_MASK] if isinstance(v, str))  # secret vars' values
        self._add(v for v in self._found(data, key) if worth_masking(v))

    def _found(self, data: Any, key: str) -> Iterable[str]:
        if key == RESTORE_MASK:  # learned whole by ``learn`` (secret var values)
            return
        if isinstance(data, dict):
            for k, v in data.items():
                k = str(k)
                if key == "headers" and isinstance(v, str):
                    yield v
                    yield v.split(" ", 1)[-1]  # "Bearer <token>": the token on its own too
                elif key == "env" and isinstance(v, str) and self.sensitive(k):
                    yield v
                else:
                    yield from self._found(v, k)
        elif isinstance(data, (list, tuple)):
            if _looks_like_argv(key, data):
                yield from self._flag_values(list(data))
            for item in data:
                yield from self._found(item, key)
        elif isinstance(data, str):
            yield from (m.group(2) for m in URL_USERINFO.finditer(data))

    def _flag_values(self, argv: list[str]) -> Iterable[str]:
        for i, word in enumerate(argv):
            name, eq, value = word.partition("=")
            if not word.startswith("-") or not self.sensitive(name):
                continue
            if eq:
                yield value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                yield argv[i + 1]

    def _add(self, values: Iterable[str]) -> None:
        new = set(values)
        with self._lock:
            if new - self._values:
                self._values |= new
                self._ordered = tuple(sorted(self._values, key=len, reverse=True))

    def sensitive(self, name: str) -> bool:
        return is_sensitive(name, self._declared)

    # ------------------------------------------------------------ masking

    def text(self, text: str) -> str:
        """``text`` with every known secret value, and every URL's password, as ``***``."""
        for value in self._ordered:  # longest first: no partial leftovers
            if value in text:
                text = text.replace(value, MASK)
        return mask_urls(text)

    def argv(self, argv: Iterable[str]) -> list[str]:
        return redact_argv(argv, self._ordered, self._declared)

    def env(self, env: Mapping[str, Any] | None) -> dict[str, str] | None:
        return redact_env(env, self._ordered, self._declared)

    def record(self, data: Any, key: str = "") -> Any:
        """A JSON-like record fit for people: env and argv by the rules, every header value,
        string values under secret-looking keys, and known values anywhere."""
        if isinstance(data, dict):
            if key == "env":
                return self.env({str(k): str(v) for k, v in data.items()})
            if key == "headers":
                return {k: MASK for k in data}
            return {k: self.record(v, str(k)) for k, v in data.items()}
        if isinstance(data, (list, tuple)):
            if key == RESTORE_MASK:  # restore.json's list of the secret values themselves
                return [MASK for _ in data]
            if _looks_like_argv(key, data):
                return self.argv(data)
            return [self.record(v, key) for v in data]
        if isinstance(data, str):
            if key and SECRET_NAME.search(key) and data != MASK:
                return MASK
            return self.text(data)
        return data
