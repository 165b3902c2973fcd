"""Pre-flight: the server's own argument parser accepts the new command line, before anything stops.

A misspelt flag used to cost a restart: orch stopped the healthy server,
started the new command line, watched argparse exit 2 with
``unrecognized arguments``, and rolled back. After the commit the patched
files are on disk, so the server's own parser — the one the new process
would build — can be run on the new argv by itself, in a second, with the
running server untouched (it has its code loaded already).

``server.preflight`` is that command, rendered like ``start``: a word that
is exactly ``{{ argv }}`` becomes the new command line's words, and
``{{ command }}`` is the same command line shell-quoted as one word (for
``sh -c``). Without it, ``default_preflight`` knows SGLang's launchers
(``python -m sglang.launch_server …``, ``sglang serve …``): it builds
SGLang's parser exactly as ``prepare_server_args`` does
(``ServerArgs.add_cli_args``), parses, and exits without starting a server.
The stand-in server keeps that API in all its layouts, so the same default
checks it. Pure.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.core.cmdline import split_words
from orchestrator.core.templating import Renderer
from orchestrator.errors import ConfigError

SGLANG_PARSE = """\
import argparse, sys
argv = sys.argv[1:]
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
if "--config" in argv:
    merger = None
    for name in ("sglang.srt.server_args_config_parser", "sglang.srt.utils.server_args_config_parser"):
        try:
            merger = __import__(name, fromlist=["ConfigArgumentMerger"]).ConfigArgumentMerger
            break
        except ImportError:
            pass
    if merger is not None:
        argv = merger(parser).merge_config_with_args(argv)
parser.parse_args(argv)
print("orch pre-flight: the arguments parse")
"""
"""Run as ``python -c SGLANG_PARSE ARGS…``: SGLang's own parser on ARGS, exit 2 and argparse's
message when it refuses them, exit 0 when they parse. Starts nothing."""

_PYTHON = re.compile(r"^(python|pypy)[0-9.]*$")
_ARGV_WORD = re.compile(r"^\{\{-?\s*argv\s*-?\}\}$")


def _is_python(word: str) -> bool:
    return bool(_PYTHON.match(os.path.basename(word)))


def _after_python_options(argv: Sequence[str]) -> int:
    """Index of the first word after the interpreter's own options (``-u``, ``-X dev`` …)."""
    index = 1
    while index < len(argv) and argv[index].startswith("-") and argv[index] not in ("-m", "-c"):
        index += 2 if argv[index] in ("-X", "-W") else 1
    return index


def default_preflight(argv: Sequence[str], python: str | None = None) -> list[str] | None:
    """The pre-flight for a server command line orch knows, or ``None``.

    - ``PY -m sglang.launch_server ARGS`` → ``PY -c SGLANG_PARSE ARGS``;
    - ``PY …/sglang serve ARGS`` (a console script run by its interpreter)
      → ``PY -c SGLANG_PARSE ARGS``;
    - ``…/sglang serve ARGS`` → the same with ``python`` (``server.python``),
      else the ``python`` beside the script (a virtualenv's ``bin/``), else
      ``python3``.
    """
    words = list(argv)
    if not words:
        return None
    if _is_python(words[0]):
        at = _after_python_options(words)
        rest = words[at:]
        if rest[:2] == ["-m", "sglang.launch_server"]:
            return [words[0], "-c", SGLANG_PARSE, *rest[2:]]
        if len(rest) >= 2 and os.path.basename(rest[0]) == "sglang" and rest[1] == "serve":
            return [words[0], "-c", SGLANG_PARSE, *rest[2:]]
        return None
    if os.path.basename(words[0]) == "sglang" and words[1:2] == ["serve"]:
        interpreter = python
        if interpreter is None:
            folder = os.path.dirname(words[0])
            interpreter = os.path.join(folder, "python") if folder else "python3"
        return [interpreter, "-c", SGLANG_PARSE, *words[2:]]
    return None


def render_preflight(
    template: str,
    argv: Sequence[str],
    variables: Mapping[str, Any],
    renderer: Renderer,
    *,
    file: str | None = None,
    line: int | None = None,
    key: str | None = None,
) -> list[str]:
    """``server.preflight`` for the new command line ``argv``.

    Split into words first (like every command); a word that is exactly
    ``{{ argv }}`` is replaced by the words of ``argv``, every other word is
    rendered on its own with ``command`` = ``argv`` shell-quoted.
    """
    try:
        words = split_words(template)
    except ConfigError as exc:
        raise exc.located(file=file, line=line, key=key) from None
    out: list[str] = []
    context = {**variables, "command": shlex.join(argv), "argv": list(argv)}
    for word in words:
        if _ARGV_WORD.match(word.strip()):
            out.extend(argv)
        else:
            out.append(renderer.render_string(word, context, file=file, line=line, key=key))
    return out


@dataclass(frozen=True)
class PreflightResult:
    """What the server's parser said about the new command line."""

    argv: list[str]
    rc: int
    stdout: str
    stderr: str
    error_line: str | None  # argparse's own line: "sglang serve: error: unrecognized arguments: …"
    message: str | None  # the part after "error: "

    @property
    def ok(self) -> bool:
        return self.rc == 0

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> PreflightResult:
        return cls(
            argv=list(data.get("argv") or []),
            rc=int(data["rc"]),
            stdout=str(data.get("stdout") or ""),
            stderr=str(data.get("stderr") or ""),
            error_line=data.get("error_line"),
            message=data.get("message"),
        )

    def refusal(self) -> str:
        """One line for the deploy's error: the parser's own words, and what did not happen."""
        if self.error_line:
            said = self.error_line
        else:
            tail = (self.stderr or self.stdout).strip().splitlines()
            said = tail[-1] if tail else f"exit {self.rc}"
        return (
            f"the pre-flight refused the new command line (exit {self.rc}): {said}; "
            "the running server was not touched"
        )
