"""Values the host could not use, refused while planning: exit 2, nothing staged.

A rendered value travels to the host and is handed to the kernel or to a
library there: command lines and environments to ``execve``, paths to
``open``/``stat``, health headers and URLs to an HTTP client. Some values
those refuse — a NUL byte in any of them, an environment name that is
empty or holds ``=``, a header with a line break. Found on the host, such a
value fails a step *after* the commit (the pre-flight, the restart), and a
deploy that never had a chance is committed and restored for nothing. So
every such value is checked here, on the rendered plan, before anything is
staged, and refused in one line that names the file, line and key it came
from (a ``--var`` reaches the host through the key that uses it).

Pure: fed the rendered values and where they sit in the playbook.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.core.facts import MARKER
from orchestrator.core.rendering import RenderedPlaybook, RenderedServer
from orchestrator.core.yamlsrc import Loc
from orchestrator.errors import ConfigError

Kind = Literal["argv", "env", "path", "url", "headers"]

HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
"""RFC 9110 ``token``: what an HTTP client accepts as a header name."""


@dataclass(frozen=True)
class HostValue:
    """One value the host will use: what it is (``kind``), and where it comes from (``loc``)."""

    loc: Loc
    kind: Kind
    value: Any


def _shown(text: str, limit: int = 40) -> str:
    """A value as a message shows it: NULs and line breaks visible, long ones cut."""
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 4] + "...'"


def argv_problem(words: Sequence[str]) -> str | None:
    """Why ``execve`` would refuse this command line, or None."""
    for i, word in enumerate(words):
        if "\0" in word:
            return (f"word {i + 1} of the command line ({_shown(word)}) contains a NUL byte: "
                    "no command line can carry one")
    return None


def env_problem(env: Mapping[str, str]) -> str | None:
    """Why ``execve`` would refuse this environment, or None (Python's own ``os.execve`` rules)."""
    for name, value in env.items():
        if not name:
            return "an environment variable has an empty name"
        if "=" in name:
            return f"environment variable name {_shown(name)} contains '=': a name ends at the first '='"
        if "\0" in name:
            return f"environment variable name {_shown(name)} contains a NUL byte"
        if "\0" in str(value):
            return f"the value of environment variable {name} contains a NUL byte"
    return None


FACT_MARKER = re.compile(re.escape(MARKER).replace(re.escape("{}"), "[^\x00]*"))
"""A host fact not gathered yet (``core.facts.MARKER``): orch's own placeholder, which the
helper fills in before it opens the path — not a NUL the host would be handed."""


def path_problem(path: str) -> str | None:
    if "\0" in FACT_MARKER.sub("", path):
        return f"path {_shown(path)} contains a NUL byte: no file name can hold one"
    return None


def url_problem(url: str) -> str | None:
    if any(ord(c) < 0x21 or c == "\x7f" for c in url):
        return f"URL {_shown(url)} contains a space or a control character"
    return None


def headers_problem(headers: Mapping[str, str]) -> str | None:
    for name, value in headers.items():
        if not HEADER_NAME.match(name):
            return f"header name {_shown(name)} is not a valid HTTP header name"
        if any(c in str(value) for c in "\r\n\0"):
            return f"the value of header {name} contains a line break or a NUL byte"
    return None


PROBLEM: dict[Kind, Callable[[Any], str | None]] = {
    "argv": argv_problem,
    "env": env_problem,
    "path": path_problem,
    "url": url_problem,
    "headers": headers_problem,
}


def first_problem(values: Iterable[HostValue]) -> tuple[HostValue, str] | None:
    """The first value the host could not use, with why; None when all are usable."""
    for v in values:
        if v.value is None:
            continue
        problem = PROBLEM[v.kind](v.value)
        if problem:
            return v, problem
    return None


def refuse_unusable(values: Iterable[HostValue], where: Callable[[Loc], dict[str, Any]]) -> None:
    """``ConfigError`` (exit 2) naming the first unusable value's file, line and key."""
    found = first_problem(values)
    if found is not None:
        value, problem = found
        raise ConfigError(f"{problem}; the host cannot use it (nothing was staged)", **where(value.loc))


def flag_words(name: str, value: Any) -> list[str]:
    """A ``flags`` entry as the words it adds to the command line (for the NUL check)."""
    if value is None or value is True or value is False:
        return [name]
    if isinstance(value, list | tuple):
        return [name, *(str(v) for v in value)]
    return [name, str(value)]


def server_values(server: RenderedServer) -> list[HostValue]:
    """``server``'s rendered values, flags before the command (a flag names the closer key)."""
    base: Loc = ("server",)
    out = [HostValue((*base, "flags", name), "argv", flag_words(name, value))
           for name, value in server.flags.items()]
    out.append(HostValue((*base, "command"), "argv", server.argv))
    out += [HostValue((*base, "env", name), "env", {name: value}) for name, value in server.env.items()]
    for key in ("workdir", "pidfile", "log", "python"):
        out.append(HostValue((*base, key), "path", getattr(server, key)))
    for key in ("start", "stop", "pid", "status", "before_stop", "after_healthy"):
        out.append(HostValue((*base, key), "argv", getattr(server, key)))
    return out


def playbook_values(rendered: RenderedPlaybook) -> list[HostValue]:
    """Every value of a rendered playbook that reaches the host as argv, environment, path or HTTP."""
    out = [HostValue(("files", f.index, "path"), "path", f.path) for f in rendered.files]
    if rendered.server is not None:
        out += server_values(rendered.server)
    if rendered.health is not None:
        out.append(HostValue(("health", "base_url"), "url", rendered.health.base_url))
        out += [HostValue(("health", "checks", i, "path"), "url", c.path)
                for i, c in enumerate(rendered.health.checks)]
        out += [HostValue(("health", "checks", i, "headers"), "headers", c.headers)
                for i, c in enumerate(rendered.health.checks)]
    if rendered.gate is not None:
        out += [HostValue(("gate", "probes", i, "headers"), "headers", p.headers)
                for i, p in enumerate(rendered.gate.probes)]
    return out


__all__ = [
    "HostValue",
    "argv_problem",
    "env_problem",
    "first_problem",
    "flag_words",
    "headers_problem",
    "path_problem",
    "playbook_values",
    "refuse_unusable",
    "server_values",
    "url_problem",
]
