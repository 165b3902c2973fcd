"""What a run on many hosts shows while it runs, and at its end.

- ``FleetReporter``: the pipeline's ``Reporter`` for several hosts' threads
  at once. Each message (a line, a ``sed -n`` view, a server's log tail) is
  drawn whole under the output's lock, so hosts never interleave mid-line or
  mid-view, and each line is prefixed with its host, as with one host.
- ``HostBoard``: on a terminal, a Rich live table with one row per host —
  its current step (``pipeline.timings``'s names), time so far, and its last
  event — kept below the scrolling lines. Health polls go to the board
  instead of the scroll. Off a terminal there is no board: the plain lines
  are exactly those of a one-host run.
- ``draw_fleet_summary``: at the end, on a terminal, a table (host, outcome,
  release, duration, error); elsewhere the one-host summary lines. Then why
  the run stopped early and where its retry file is. ``draw_stats``: each
  host's step timings (``--stats``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from orchestrator.cli.output import VERBOSE, Output, live_started
from orchestrator.cli.views import ConsoleReporter, one_line, print_summary, say
from orchestrator.core.events import Event
from orchestrator.core.gate import GateOutcome
from orchestrator.pipeline.report import HostReport, RunReport
from orchestrator.pipeline.timings import STEPS

if TYPE_CHECKING:
    from rich.live import Live

    from orchestrator.pipeline.plan import HostPlan

STYLE = {0: "green", 1: "yellow", 2: "red", 3: "bold red"}
"""An outcome's colour by its exit code, as in the one-host summary line."""


@dataclass
class BoardRow:
    """One host on the live board."""

    host: str
    step: str = "waiting"
    started: float | None = None
    ended: float | None = None
    last: str = ""
    outcome: str | None = None
    exit_code: int = 0

    def elapsed(self, now: float) -> str:
        if self.started is None:
            return ""
        return f"{(self.ended or now) - self.started:.1f}s"


class HostBoard:
    """The rows of the live table; updated from the hosts' threads, drawn by Rich's refresh thread."""

    def __init__(self, hosts: Sequence[str], title: str) -> None:
        self.rows = {h: BoardRow(h) for h in hosts}
        self.title = title
        self._lock = threading.Lock()

    def started(self, host: str) -> None:
        with self._lock:
            row = self.rows[host]
            row.started, row.step = time.monotonic(), "connect"

    def phase(self, host: str, step: str) -> None:
        with self._lock:
            if host in self.rows:
                self.rows[host].step = step

    def event(self, host: str, text: str) -> None:
        with self._lock:
            if host in self.rows:
                self.rows[host].last = one_line(text)

    def finished(self, host: str, outcome: str, exit_code: int) -> None:
        with self._lock:
            row = self.rows[host]
            row.ended, row.outcome, row.exit_code, row.step = time.monotonic(), outcome, exit_code, outcome

    def __rich__(self) -> Table:
        now = time.monotonic()
        with self._lock:
            rows = [BoardRow(**r.__dict__) for r in self.rows.values()]
        done = sum(1 for r in rows if r.outcome is not None)
        table = Table(title=f"{self.title}: {done} of {len(rows)} done", title_justify="left",
                      expand=False, show_edge=False, pad_edge=False)
        table.add_column("host", no_wrap=True, style="bold cyan")
        table.add_column("step", no_wrap=True)
        table.add_column("elapsed", justify="right", no_wrap=True)
        table.add_column("last event", overflow="ellipsis", no_wrap=True, max_width=80)
        for r in rows:
            style = STYLE.get(r.exit_code, "red") if r.outcome else ("dim" if r.started is None else "")
            table.add_row(r.host, Text(r.step, style=style), r.elapsed(now), Text(r.last, style="dim"))
        return table


class FleetReporter:
    """A thread-safe ``Reporter`` over a ``ConsoleReporter``, feeding the board when there is one."""

    def __init__(self, inner: ConsoleReporter, board: HostBoard | None = None) -> None:
        self.inner = inner
        self.out = inner.out
        self.board = board

    def _note(self, host: str, text: str) -> None:
        if self.board is not None:
            self.board.event(host, text)

    def event(self, host: str, ev: Event) -> None:
        """As a line at its level, so the board's row and the scroll say the same words."""
        say(self, host, ev)

    def step(self, host: str, text: str) -> None:
        self._note(host, text)
        with self.out.lock:
            self.inner.step(host, text)

    def note(self, host: str, text: str) -> None:
        self._note(host, f"note: {text}")
        with self.out.lock:
            self.inner.note(host, text)

    def warn(self, host: str, text: str) -> None:
        self._note(host, f"warning: {text}")
        with self.out.lock:
            self.inner.warn(host, text)

    def plan(self, host: str, plan: HostPlan) -> None:
        with self.out.lock:
            self.inner.plan(host, plan)

    def readback(self, host: str, path: str, text: str, ranges: Sequence[Any]) -> None:
        with self.out.lock:
            self.inner.readback(host, path, text, ranges)

    def server_log(self, host: str, title: str, lines: Sequence[str]) -> None:
        with self.out.lock:
            self.inner.server_log(host, title, lines)

    def gate(self, host: str, outcome: GateOutcome) -> None:
        self._note(host, f"gate: {outcome.verdict}")
        with self.out.lock:
            self.inner.gate(host, outcome)

    def progress(self, host: str, event: dict[str, Any]) -> None:
        msg = event.get("msg")
        if msg:
            self._note(host, str(msg))
        if self.board is not None and event.get("event") == "health" and self.out.verbosity < VERBOSE:
            return  # a health poll: the board's row says it, the scroll does not
        with self.out.lock:
            self.inner.progress(host, event)

    def phase(self, host: str, step: str) -> None:
        if self.board is not None:
            self.board.phase(host, step)

    def finished(self, host: str, report: HostReport) -> None:
        """``gpu02 finished: changed``, as each host ends (the summary comes at the end of all)."""
        if self.board is not None:
            self.board.finished(host, report.outcome, report.exit_code)
        if self.out.quiet:
            return
        text = f"{host} finished: {report.outcome}" + (f": {one_line(report.error)}" if report.error else "")
        (self.out.line if report.exit_code == 0 else self.out.problem)(text, STYLE.get(report.exit_code, "red"))

    def started(self, host: str) -> None:
        if self.board is not None:
            self.board.started(host)


def start_board(out: Output, board: HostBoard) -> Live:
    """Show ``board`` live below the scrolling lines until ``.stop()``; it vanishes then."""
    from rich.live import Live

    live = Live(board, console=out.console, refresh_per_second=4, transient=True,
                redirect_stdout=False, redirect_stderr=False)
    live.start()
    live_started(live)
    return live


# ------------------------------------------------------------------- the end


def fmt_seconds(value: Any) -> str:
    return f"{value:.1f}s" if isinstance(value, (int, float)) else "-"


def draw_fleet_summary(out: Output, report: RunReport) -> None:
    """The last word on every host; then why the run stopped early, and its retry file."""
    if out.terminal and len(report.hosts) > 1:
        table = Table(title="summary", title_justify="left")
        for name in ("host", "outcome", "release", "duration", "error"):
            table.add_column(name, no_wrap=name != "error", overflow="fold",
                             justify="right" if name == "duration" else "left")
        for name, r in report.hosts.items():
            style = STYLE.get(r.exit_code, "red")
            table.add_row(Text(name, style="bold"), Text(r.outcome, style=style), Text(r.release or "-"),
                          fmt_seconds(r.extra.get("duration")), Text(one_line(r.error or ""), style=style))
        with out.lock:
            out.console.print(table)
    else:
        with out.lock:
            print_summary(out, report)
    if report.stopped and len(report.hosts) > 1:  # one host's own outcome line already says why
        out.problem(f"stopped: {report.stopped}", "red")
    if report.retry_file:
        retry = [n for n, r in report.hosts.items() if r.exit_code != 0]
        out.problem(f"retry: {len(retry)} host{'s' if len(retry) != 1 else ''} failed or not started, listed in "
                    f"{report.retry_file}; rerun them with --limit @{report.retry_file}", "yellow")


def draw_stats(out: Output, hosts: dict[str, HostReport]) -> None:
    """``--stats``: seconds per step per host (a table on a terminal, ``host stats:`` lines elsewhere)."""
    timings = {name: dict(r.extra.get("timings") or {}) for name, r in hosts.items()}
    steps = [s for s in STEPS if any(s in t for t in timings.values())]
    if not steps:
        return
    if not out.terminal:
        for name, t in timings.items():
            parts = [f"{s} {t[s]:.2f}s" for s in steps if s in t]
            out.line(f"{name} stats: " + (", ".join(parts) or "no step timed"))
        return
    table = Table(title="seconds per step", title_justify="left")
    table.add_column("host", style="bold cyan", no_wrap=True)
    for s in steps:
        table.add_column(s, justify="right", no_wrap=True)
    table.add_column("total", justify="right", no_wrap=True)
    for name, t in timings.items():
        table.add_row(escape(name), *(f"{t[s]:.2f}" if s in t else "-" for s in steps),
                      fmt_seconds(hosts[name].extra.get("duration")))
    with out.lock:
        out.console.print(table)
