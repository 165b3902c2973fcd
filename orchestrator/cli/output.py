"""Where orch's human output goes, and how it fits the medium.

One ``Output`` per run decides, once, everything the views need to know:

- **the stream**: a host's steps on stdout, its warnings and failures
  (``problem``) on stderr, each line flushed as it is written so that
  ``2>&1`` keeps the order things happened in; with ``--json`` every human
  line goes to stderr (stdout is only the JSON report);
- **the medium**: a terminal gets Rich's layout at the terminal's width
  (long lines folded at word boundaries, tables and panels); anything else
  (a pipe, a file, CI) gets plain lines that are never cut, folded or
  boxed, so ``grep`` and a log reader see exactly what orch saw;
- **colour**: on a terminal unless ``NO_COLOR`` is set; ``--color`` and
  ``--no-color`` win over both;
- **how much**: ``-q`` (outcomes, warnings and errors only), the default,
  ``-v`` (plus each request to the host's helper and the commands it runs
  there, and every event), ``-vv`` (plus every line of the helper protocol);
- **what must never show**: the run's ``Masker`` (``core.secrets``). Every
  piece of text the console writes passes through ``SafeConsole``, which
  masks secrets and shows control characters escaped (``core.safetext``),
  whatever view drew it; the ``--json`` report passes ``Masker.record``.

Rich is imported here because an ``Output`` is only made by a command
that prints; ``orch --help`` never gets this far.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

import click
from rich.console import Console
from rich.segment import Segment
from rich.text import Text

from orchestrator.core.safetext import printable
from orchestrator.core.secrets import MASK, Masker

QUIET, NORMAL, VERBOSE, PROTOCOL = -1, 0, 1, 2
"""Verbosity levels: ``-q``, none, ``-v``, ``-vv``."""

PROTOCOL_LOGGER = "orchestrator.protocol"
"""The logger ``shell.agent_client`` writes every helper line to (at DEBUG)."""


class SafeConsole(Console):
    """A Rich console whose every written piece of text is made safe first.

    The one place the console channel masks secrets and escapes control
    characters: whatever a view draws (a line, a table cell, a panel, a
    ``Syntax`` window of a file read back), its text segments pass through
    ``clean`` just before they are written. Rich's own control segments
    (cursor moves of a live view) and its styles are left alone, so colours
    still work while a host's ``\x1b[2J`` shows as text.
    """

    def __init__(self, *args: Any, clean: Callable[[str], str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clean = clean

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        clean = self._clean
        return super()._render_buffer(
            seg if seg.control or not seg.text else Segment(clean(seg.text), seg.style, seg.control)
            for seg in buffer)


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
    masker: Masker = field(default_factory=Masker)
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    err: Console | None = None
    """Where warnings and failures go: stderr (``console`` itself when that is stderr already)."""
    err_terminal: bool | None = None

    @property
    def quiet(self) -> bool:
        return self.verbosity <= QUIET

    def safe(self, text: str) -> str:
        """``text`` fit to show: secrets masked, control characters escaped."""
        return printable(self.masker.text(text))

    @property
    def problems(self) -> Console:
        """The console of warnings and failures: stderr, so that a script reading stdout
        gets the steps and a person sees what went wrong even with stdout redirected.

        While a live view (spinner, board) is on a terminal that stderr shares, stdout's
        console, which draws it: Rich prints above its own live view only (it writes past
        the redirect of ``sys.stderr`` a live view sets up), and a line written to the
        terminal beside it would join the spinner's line.
        """
        if self.err is None or (self.err_terminal and self.terminal and _LIVE_VIEWS):
            return self.console
        return self.err

    @property
    def problems_terminal(self) -> bool:
        return self.terminal if self.err_terminal is None else self.err_terminal

    def line(self, text: str, style: str | None = None) -> None:
        """One line of text as it is (never read as markup), made ``safe``, on stdout's console."""
        self._write(self.console, text, style)

    def problem(self, text: str, style: str | None = None) -> None:
        """One warning or failure line, as ``line`` does it, on stderr's console."""
        self._write(self.problems, text, style)

    def _write(self, console: Console, text: str, style: str | None) -> None:
        """Where Rich would neither fold the line (``soft_wrap``: off a terminal)
        nor colour it, the line is written as it is: Rich's layout pass would
        only give it back unchanged, at a cost a fleet's hundreds of lines
        notice. Flushed at once (as Rich flushes each print): stdout and
        stderr joined by ``2>&1`` then keep the order lines were written in.
        """
        line = Text(self.safe(text), style=style or "")
        with self.lock:
            if not console.soft_wrap or console.color_system:
                console.print(line)
            else:
                line.expand_tabs(console.tab_size)
                console.file.write(line.plain + "\n")
                console.file.flush()

    def emit_json(self, data: dict[str, Any]) -> None:
        """The ``--json`` report: always on stdout, whatever the console uses; secrets masked
        (JSON itself writes control characters as ``\\u001b``).

        The report is the run's last word: from its first byte on, a Ctrl-C is ignored, so
        that a script never reads half of it, or two reports (this one, then the one of an
        interrupted run).
        """
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        click.echo(json.dumps(self.masker.record(data), indent=2, sort_keys=True, default=str))

    def hide(self, values: Iterable[Any]) -> None:
        """Values (secret vars) that must never be printed, even at ``-vv``."""
        self.masker.hide(values)


def make_output(
    *, as_json: bool = False, color: bool | None = None, verbosity: int = NORMAL,
    stream: IO[str] | None = None,
) -> Output:
    """An ``Output`` for this process: the streams, the medium, colour and verbosity.

    ``stream`` given (a test's buffer): every line goes to it, problems too.
    """
    separate = stream is None and not as_json
    stream = stream or (sys.stderr if as_json else sys.stdout)
    terminal = _isatty(stream)
    masker = Masker()
    console = _console(stream, terminal, masker, color)
    err, err_terminal = None, None
    if separate:
        # file=None, stderr=True: Rich looks sys.stderr up at each write, so a live view that
        # redirects stderr (``cli.live``) prints these lines above itself, not through it
        err_terminal = _isatty(sys.stderr)
        err = _console(None, err_terminal, masker, color)
    out = Output(console=console, terminal=terminal, json=as_json, verbosity=verbosity, masker=masker,
                 err=err, err_terminal=err_terminal)
    if verbosity >= VERBOSE:
        _echo_protocol(out)
    return out


def _console(stream: IO[str] | None, terminal: bool, masker: Masker, color: bool | None) -> SafeConsole:
    """A console on ``stream`` (``None``: stderr, looked up at each write) that masks and escapes."""
    return SafeConsole(
        clean=lambda text: printable(masker.text(text)),
        file=stream,
        stderr=stream is None,
        # --color off a terminal: colours, but still the plain layout (see ``terminal``)
        force_terminal=True if color else None,
        no_color=(not color) if color is not None else None,  # None: Rich reads NO_COLOR
        soft_wrap=not terminal,  # off a terminal, print() never wraps or cuts a line
        highlight=False,
        emoji=False,
    )


class LiveView(Protocol):
    """A Rich live view (``Live``, ``Status``): a line redrawn in place until ``stop``."""

    def stop(self) -> None: ...


_LIVE_VIEWS: set[LiveView] = set()
"""The live views now on screen. Process-wide on purpose: however a run ends (its
report, an error, a first or a second Ctrl-C), ``app.main`` clears them through
``stop_live_views`` before its last line, so no spinner is left on the screen for the
shell's prompt to join (Rich's refresh thread is a daemon: nothing else would)."""


def live_started(view: LiveView) -> None:
    _LIVE_VIEWS.add(view)


def live_stopped(view: LiveView) -> None:
    _LIVE_VIEWS.discard(view)


def stop_live_views() -> None:
    """Stop (and so erase: they are transient) every live view still on screen."""
    for view in list(_LIVE_VIEWS):
        # the run is ending: a display problem must not hide its error
        with contextlib.suppress(Exception):
            view.stop()
        _LIVE_VIEWS.discard(view)


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
    ``orch_host``. Secrets are masked by the run's ``Masker``: flags,
    environment variables and headers by name, the run's secret values
    and URL passwords anywhere.
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
                self.out.line(f"{host} {text}", "dim")
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
            return [f"{kind} {json.dumps(within_line_limit(masked(msg, self.out.masker)), separators=(',', ':'))}"]
        if kind == ">":
            return describe_request(msg, self.out.masker)
        if (isinstance(msg, dict) and not msg.get("done") and not msg.get("msg")
                and msg.get("event") not in (None, "tick")):  # events with a msg are shown anyway
            return [f"  event {json.dumps(masked(msg, self.out.masker), separators=(',', ':'))}"]
        return []


def describe_request(msg: dict[str, Any], masker: Masker) -> list[str]:
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
    out += [f"     $ {shown_command(masker.argv(argv))}" for argv in commands_in(run)]
    return out


def shown_command(argv: list[str]) -> str:
    """A masked command line as a shell would read it (``***`` left bare, as in every other line)."""
    return " ".join(w if w == MASK else shlex.quote(w) for w in argv)


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


def masked(value: Any, masker: Masker) -> Any:
    """A protocol message fit to show: secrets masked (``Masker.record``: env, argv and
    headers by name, known values anywhere), then long strings elided."""
    return _short_strings(masker.record(value))


def _short_strings(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _short_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_short_strings(v) for v in value]
    if isinstance(value, str) and len(value) > LONG:
        return f"<{len(value)} chars>"
    return value


LINE_LIMIT = 4000
"""The longest a ``-vv`` protocol line may grow before its biggest parts are elided."""


def within_line_limit(value: Any, limit: int = LINE_LIMIT) -> Any:
    """``value`` with its biggest lists and mappings shown as ``<N chars>`` until it fits ``limit``.

    ``-vv`` shows each protocol line; a state read of many releases would be
    one line of tens of thousands of characters. The biggest part goes first,
    then the next, so what is small (an op's arguments, a short environment)
    stays readable, and the message's own keys always stay.
    """
    while _size(value) > limit:
        path = _biggest_part(value)
        if path is None:
            return value
        value = _replaced(value, path)
    return value


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), default=str))


def _biggest_part(value: Any) -> tuple[Any, ...] | None:
    """The path to the part to elide next: the largest list or mapping, followed down while
    one of its own parts makes up most of it (so a state read loses its releases, not its
    journal and state beside it); where none does, that largest part alone (so a batch loses
    its biggest step, and the steps beside it stay readable). Never ``value`` itself."""
    path: tuple[Any, ...] = ()
    node = value
    while True:
        children = [(k, c) for k, c in _items(node) if isinstance(c, dict | list) and c]
        if not children:
            return path or None
        key, child = max(children, key=lambda kc: _size(kc[1]))
        if path and _size(child) * 2 < _size(node):
            return (*path, key)  # no one part dominates this one: its biggest goes first
        path, node = (*path, key), child


def _items(node: Any) -> list[tuple[Any, Any]]:
    if isinstance(node, dict):
        return list(node.items())
    if isinstance(node, list):
        return list(enumerate(node))
    return []


def _replaced(value: Any, path: tuple[Any, ...]) -> Any:
    """A copy of ``value`` with the part at ``path`` shown as its size."""
    key, rest = path[0], path[1:]
    child = value[key]
    new = _replaced(child, rest) if rest else f"<{_size(child)} chars>"
    if isinstance(value, dict):
        return {**value, key: new}
    return [new if i == key else v for i, v in enumerate(value)]


def _echo_protocol(out: Output) -> None:
    logger = logging.getLogger(PROTOCOL_LOGGER)
    logger.handlers = [ProtocolEcho(out)]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
