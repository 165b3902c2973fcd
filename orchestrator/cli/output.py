"""Where orch's human output goes, and how it fits the medium.

One ``Output`` per run decides, once, everything the views need to know:

- **the stream**: stdout, or stderr when ``--json`` owns stdout;
- **the medium**: a terminal gets Rich's layout at the terminal's width
  (long lines folded at word boundaries, tables and panels); anything else
  (a pipe, a file, CI) gets plain lines that are never cut, folded or
  boxed, so ``grep`` and a log reader see exactly what orch saw;
- **colour**: on a terminal unless ``NO_COLOR`` is set; ``--color`` and
  ``--no-color`` win over both;
- **how much**: ``-q`` (outcomes, warnings and errors only), the default,
  ``-v`` (plus each request to the host's helper and the commands it runs
  there, and every event), ``-vv`` (plus every line of the helper protocol).

Rich is imported here because an ``Output`` is only made by a command
that prints; ``orch --help`` never gets this far.
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO, Any

import click
from rich.console import Console
from rich.text import Text

from orchestrator.core.secrets import MASK, SECRET_NAME, redact_argv, redact_env, redact_text

QUIET, NORMAL, VERBOSE, PROTOCOL = -1, 0, 1, 2
"""Verbosity levels: ``-q``, none, ``-v``, ``-vv``."""

PROTOCOL_LOGGER = "orchestrator.protocol"
"""The logger ``shell.agent_client`` writes every helper line to (at DEBUG)."""


@dataclass
class Output:
    """The human side of one run (the JSON side is ``emit_json``).

    ``lock`` is held for each line, and by a fleet's reporter for each
    host's message or view, so that lines from several hosts' threads never
    mix mid-line and a ``sed -n`` view stays in one piece.
    """

    console: Console
    terminal: bool
    json: bool = False
    verbosity: int = NORMAL
    secret_values: set[str] = field(default_factory=set)
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    @property
    def quiet(self) -> bool:
        return self.verbosity <= QUIET

    def line(self, text: str, style: str | None = None) -> None:
        """One line of text as it is (never read as markup).

        Where Rich would neither fold the line (``soft_wrap``: off a
        terminal) nor colour it, the line is written as it is: Rich's layout
        pass would only give it back unchanged, at a cost a fleet's hundreds
        of lines notice.
        """
        line = Text(text, style=style or "")
        with self.lock:
            if not self.console.soft_wrap or self.console.color_system:
                self.console.print(line)
            else:
                line.expand_tabs(self.console.tab_size)
                self.console.file.write(line.plain + "\n")

    def emit_json(self, data: dict[str, Any]) -> None:
        """The ``--json`` report: always on stdout, whatever the console uses."""
        click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))

    def hide(self, values: Iterable[Any]) -> None:
        """Values (secret vars) that must never be printed, even at ``-vv``."""
        self.secret_values.update(str(v) for v in values if v is not None)


def make_output(
    *, as_json: bool = False, color: bool | None = None, verbosity: int = NORMAL,
    stream: IO[str] | None = None,
) -> Output:
    """An ``Output`` for this process: the stream, the medium, colour and verbosity."""
    stream = stream or (sys.stderr if as_json else sys.stdout)
    terminal = _isatty(stream)
    console = Console(
        file=stream,
        # --color off a terminal: colours, but still the plain layout (see ``terminal``)
        force_terminal=True if color else None,
        no_color=(not color) if color is not None else None,  # None: Rich reads NO_COLOR
        soft_wrap=not terminal,  # off a terminal, print() never wraps or cuts a line
        highlight=False,
        emoji=False,
    )
    out = Output(console=console, terminal=terminal, json=as_json, verbosity=verbosity)
    if verbosity >= VERBOSE:
        _echo_protocol(out)
    return out


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# ----------------------------------------------------------------- -v / -vv


COMMAND_KEYS = ("argv", "argvs", "start", "stop", "start_cmd", "stop_cmd", "restore_start_cmd",
                "pid_cmd")
"""Request arguments that hold a command the helper runs on the host."""

RECORDING_OPS = frozenset({"put_json", "watchdog_arm", "release_create", "release_update",
                           "release_log"})
"""Ops that only write records: the command lines inside them are kept for a restore, not run."""

LONG = 160
"""Strings longer than this are elided in protocol lines (file contents travel as base64)."""


class ProtocolEcho(logging.Handler):
    """Shows the helper protocol the way ``-v`` / ``-vv`` promise.

    ``shell.agent_client`` logs each line it sends (``>``) or reads (``<``)
    and the command that starts the helper (``$``), with the host in
    ``orch_host``. Secrets are masked: secret-looking flags and
    environment variables by name, and the run's secret values anywhere.
    """

    def __init__(self, out: Output) -> None:
        super().__init__(logging.DEBUG)
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        host = getattr(record, "orch_host", "?")
        kind = getattr(record, "orch_dir", "")
        payload = getattr(record, "orch_line", "")
        try:
            for text in self.lines(kind, payload):
                self.out.line(f"{host} {redact_text(text, self.out.secret_values)}", "dim")
        except Exception:  # noqa: BLE001 - a display problem must never stop a deploy
            self.handleError(record)

    def lines(self, kind: str, payload: Any) -> list[str]:
        verbose_only = self.out.verbosity < PROTOCOL
        if kind == "$":
            words = [w if len(w) <= LONG else "<orch helper bootstrap>" for w in payload]
            return [f"$ {shlex.join(words)}"]
        try:
            msg = json.loads(payload)
        except ValueError:
            return [] if verbose_only else [f"{kind} {payload[:LONG]}"]
        if not verbose_only:
            return [f"{kind} {json.dumps(elided(masked(msg)), separators=(',', ':'))}"]
        if kind == ">":
            return describe_request(msg)
        if (isinstance(msg, dict) and not msg.get("done") and not msg.get("msg")
                and msg.get("event") not in (None, "tick")):  # events with a msg are shown anyway
            return [f"  event {json.dumps(masked(msg), separators=(',', ':'))}"]
        return []


def describe_request(msg: dict[str, Any]) -> list[str]:
    """``-v``: one line per request (op names; a batch lists its steps), then its commands."""
    args = msg.get("args") or {}
    steps = args.get("steps") if msg.get("op") in ("batch", "claim_then") else None
    title = str(msg.get("op", "?"))
    run: list[Any] = [] if title in RECORDING_OPS else [args]
    if isinstance(steps, list):
        steps = [s for s in steps if isinstance(s, dict)]
        title += ": " + ", ".join(str(s.get("op")) for s in steps)
        run = [s.get("args") for s in steps if s.get("op") not in RECORDING_OPS]
    out = [f"-> {title}"]
    out += [f"     $ {shlex.join(redact_argv(argv))}" for argv in commands_in(run)]
    return out


def commands_in(value: Any) -> list[list[str]]:
    """Every command line (a list of words) under ``COMMAND_KEYS``, depth first."""
    found: list[list[str]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if key in COMMAND_KEYS and _is_words(item):
                found.append([str(w) for w in item])
            elif key in COMMAND_KEYS and isinstance(item, list) and all(_is_words(i) for i in item):
                found.extend([str(w) for w in i] for i in item)
            else:
                found.extend(commands_in(item))
    elif isinstance(value, list):
        for item in value:
            found.extend(commands_in(item))
    return found


def _is_words(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(w, str) for w in value)


def masked(value: Any, key: str = "") -> Any:
    """A protocol message fit to show: long strings elided, secret-looking values masked."""
    if isinstance(value, dict):
        if key == "env":
            return redact_env({str(k): str(v) for k, v in value.items()})
        return {k: masked(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        if _is_words(value):
            return [w if len(w) <= LONG else f"<{len(w)} chars>" for w in redact_argv(value)]
        return [masked(v, key) for v in value]
    if isinstance(value, str) and len(value) > LONG:
        return f"<{len(value)} chars>"
    if isinstance(value, str) and key and SECRET_NAME.search(key) and value != MASK:
        return MASK
    return value


BIG = 4 * LONG


def elided(value: Any) -> Any:
    """``value`` with every list or mapping whose JSON exceeds ``BIG`` shown as ``<N chars>``.

    ``-vv`` shows each protocol line; a file list or a state read of many
    releases would be one line of tens of thousands of characters. The
    message's own keys stay, so the line still says what it was.
    """
    if isinstance(value, dict):
        return {k: _small(v) for k, v in value.items()}
    return _small(value)


def _small(value: Any) -> Any:
    if not isinstance(value, dict | list):
        return value
    size = len(json.dumps(value, separators=(",", ":")))
    if size <= BIG:
        return value
    if isinstance(value, dict):
        inner = {k: _small(v) for k, v in value.items()}
        if len(json.dumps(inner, separators=(",", ":"))) <= BIG:
            return inner
    return f"<{size} chars>"


def _echo_protocol(out: Output) -> None:
    logger = logging.getLogger(PROTOCOL_LOGGER)
    logger.handlers = [ProtocolEcho(out)]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
