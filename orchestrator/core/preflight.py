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
checks it.

``--check`` runs the same pre-flight against the *staged* files, before
anything is committed: the built-in one with ``python -B`` (no bytecode
beside the targets) and ``STAGED_FINDER`` first, an import finder that reads
each module whose file is a planned target from its staged copy (the map
comes in env ``ORCH_STAGED``, JSON ``{target: staged}``). A custom
``server.preflight`` gets the same JSON as ``{{ staged_files }}`` and in
``ORCH_STAGED``; one that uses neither (``staged_aware``) would check the
files on disk, not the planned ones, so ``--check`` does not run it. Pure.
"""

from __future__ import annotations

import json
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

PASSED = "passed"
REFUSED = "refused"
NOT_CHECKED = "not_checked"
"""``--check``'s ``preflight`` field: the server's parser accepted the staged command line, refused
it, or was not run against the staged files (a custom pre-flight that is not ``staged_aware``).
Absent (null) where the deploy would run no pre-flight."""

NOT_CHECKED_NOTE = "pre-flight not run against the staged files"
"""What ``--check`` says when it did not run a custom pre-flight (it would have judged the files on disk)."""

STAGED_ENV = "ORCH_STAGED"
"""The environment variable that carries ``--check``'s map of target path → staged copy (JSON)."""

STAGED_FINDER = """\
import os as _os, sys as _sys
def _orch_staged_finder():
    import json
    from importlib.util import spec_from_file_location
    staged = dict((_os.path.realpath(_os.path.expanduser(k)), v)
                  for k, v in json.loads(_os.environ.get("ORCH_STAGED") or "{}").items())
    class StagedLoader(object):
        def __init__(self, origin, copy):
            self.origin, self.copy = origin, copy
        def create_module(self, spec):
            return None
        def exec_module(self, module):
            with open(self.copy, "rb") as f:
                code = compile(f.read(), self.origin, "exec", dont_inherit=True)
            exec(code, module.__dict__)
    class StagedFinder(object):
        def find_spec(self, name, path=None, target=None):
            for finder in _sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
            copy = staged.get(_os.path.realpath(spec.origin)) if spec.origin else None
            if copy is None:
                return spec
            return spec_from_file_location(name, spec.origin, loader=StagedLoader(spec.origin, copy),
                                           submodule_search_locations=spec.submodule_search_locations)
    if staged:
        _sys.meta_path.insert(0, StagedFinder())
_orch_staged_finder()
"""
"""Prepended to ``SGLANG_PARSE`` by ``--check``: every module whose file is a key of
``ORCH_STAGED`` is compiled from its staged copy (``__file__`` stays the target's, so
relative reads still work); every other import is the interpreter's own. Python 3.8+."""

_STAGED_WORD = re.compile(r"\{\{-?\s*staged_files\b")

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


def staged_builtin(argv: Sequence[str]) -> list[str] | None:
    """``--check``'s form of a built-in pre-flight (``default_preflight``'s ``PY -c SGLANG_PARSE
    ARGS``): ``PY -B -c STAGED_FINDER+SGLANG_PARSE ARGS``; ``None`` for any other command."""
    words = list(argv)
    if words[1:3] != ["-c", SGLANG_PARSE]:
        return None
    return [words[0], "-B", "-c", STAGED_FINDER + SGLANG_PARSE, *words[3:]]


def staged_aware(template: str) -> bool:
    """A custom ``server.preflight`` that can check the staged files: one of its words renders
    ``{{ staged_files }}`` or mentions ``ORCH_STAGED`` (the word's text, before rendering)."""
    try:
        words = split_words(template)
    except ConfigError:
        return False
    return any(_STAGED_WORD.search(word) or STAGED_ENV in word for word in words)


def staged_files_json(staged: Mapping[str, str]) -> str:
    """The map ``--check`` hands a pre-flight (``{{ staged_files }}``, ``ORCH_STAGED``)."""
    return json.dumps(dict(staged), sort_keys=True)


def render_preflight(
    template: str,
    argv: Sequence[str],
    variables: Mapping[str, Any],
    renderer: Renderer,
    *,
    file: str | None = None,
    line: int | None = None,
    key: str | None = None,
    staged: Mapping[str, str] | None = None,
) -> list[str]:
    """``server.preflight`` for the new command line ``argv``.

    Split into words first (like every command); a word that is exactly
    ``{{ argv }}`` is replaced by the words of ``argv``, every other word is
    rendered on its own with ``command`` = ``argv`` shell-quoted and
    ``staged_files`` = ``staged`` as JSON (``{}`` for the deploy, whose
    pre-flight runs after the commit, on the files in place).
    """
    try:
        words = split_words(template)
    except ConfigError as exc:
        raise exc.located(file=file, line=line, key=key) from None
    out: list[str] = []
    context = {**variables, "command": shlex.join(argv), "argv": list(argv),
               "staged_files": staged_files_json(staged or {})}
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

    def refusal(self, *, staged: bool = False) -> str:
        """One line for the deploy's error (``staged``: ``--check``'s): the parser's own words, and
        what did not happen."""
        if self.error_line:
            said = self.error_line
        else:
            tail = (self.stderr or self.stdout).strip().splitlines()
            said = tail[-1] if tail else f"exit {self.rc}"
        if staged:
            return (f"the pre-flight refused the new command line with the staged files (exit {self.rc}): "
                    f"{said}; nothing was changed (--check)")
        return (
            f"the pre-flight refused the new command line (exit {self.rc}): {said}; "
            "the running server was not touched"
        )
