"""Which variables are secrets, and keeping their values out of output.

Vars end up in reports, the history and error messages. A playbook declares
its secrets (``secrets: [hf_token]``) and anything whose name looks like one
(``api_key``, ``db_password`` …) is treated as one too, because forgetting to
declare a token must not print it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

SECRET_NAME = re.compile(r"(?i)(secret|token|passw|api[_-]?key|credential|private)")
MASK = "***"
_MIN_LENGTH = 4


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
    return text


def redact_argv(argv: Iterable[str], values: Iterable[Any] = ()) -> list[str]:
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
        if word.startswith("-") and SECRET_NAME.search(name):
            if eq:
                out.append(f"{name}={MASK}")
            else:
                out.append(word)
                hide_next = True
            continue
        out.append(redact_text(word, known))
    return out


def redact_env(env: Mapping[str, str] | None) -> dict[str, str] | None:
    """An environment fit to record: secret-looking variables (HF_TOKEN …) masked."""
    if env is None:
        return None
    return {k: (MASK if SECRET_NAME.search(k) else v) for k, v in env.items()}
