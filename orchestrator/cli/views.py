"""What a deploy or a rollback draws for a person: steps, the diff, the ``sed -n`` view.

Two media (see ``cli.output``):

- on a terminal, Rich at the terminal's width: ``Syntax`` highlighting with
  long lines *folded* at word boundaries, never cut;
- anywhere else, plain lines exactly as they are in the file, whatever
  their length, so a CI log or ``grep`` sees the inserted line verbatim.

The verification view is what an engineer gets from ``sed -n A,Bp`` plus
a careful eye: line numbers, the changed lines marked ``❱``, three lines
of context. Only the lines a view shows are ever highlighted (the window
is passed to ``Syntax``, not the file: on an 8,000-line ``server_args.py``
that is the difference between milliseconds and seconds of controller CPU),
and nothing is drawn, or even computed, for output that is not shown
(``-q``). Rich's ``Syntax`` (and Pygments behind it) is imported only when
a terminal view is drawn.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.text import Text

from orchestrator.cli.diffs import unified_diff
from orchestrator.cli.output import VERBOSE, Output, live_started, live_stopped, stop_live_views
from orchestrator.cli.words import line, rollback_summary
from orchestrator.core.events import Event
from orchestrator.core.gate import COLUMNS, GateOutcome, plain_table
from orchestrator.core.regions import ViewRange, count_lines, lines_between, view_ranges
from orchestrator.core.secrets import redact_argv
from orchestrator.pipeline.events import Reporter
from orchestrator.pipeline.report import HostReport, RollbackSummary, RunReport

if TYPE_CHECKING:
    from orchestrator.pipeline.plan import HostPlan, PlannedFile

LEXERS = {"py": "python", "yaml": "yaml", "yml": "yaml", "sh": "bash", "json": "json",
          "toml": "toml"}
THEME = "ansi_dark"
MARK = "❱"


def lexer_for(path: str) -> str:
    ext = path.rsplit(".", 1)[-1] if "." in path else ""
    return LEXERS.get(ext, "text")


class ConsoleReporter:
    """The pipeline's ``Reporter``, drawn on an ``Output``.

    ``diff``: show the unified diff of each changed file before it is
    staged (``--diff``). ``planned_view``: show the ``sed -n`` view of the
    plan (``--check``, where there is no read-back to show). A deploy
    always shows the view read back from the host after the commit.
    """

    def __init__(self, out: Output, *, diff: bool = False, planned_view: bool = True,
                 live_line: bool = True) -> None:
        self.out = out
        self.diff = diff
        self.planned_view = planned_view
        self.live_line = live_line  # False in a fleet: its live view shows the health wait
        self._status: Any = None  # a live spinner while the host waits, on a terminal

    @property
    def console(self) -> Any:
        return self.out.console

    def _settle(self) -> None:
        if self._status is not None:
            self._status.stop()
            live_stopped(self._status)
            self._status = None

    def _host_line(self, host: str, text: str, label: str = "", style: str = "", *, problem: bool = False) -> None:
        """``host [label] text``; a ``problem`` (warning, failure) on stderr's console."""
        self._settle()
        prefix = f"[bold cyan]{escape(host)}[/] " + (f"[{style}]{label}[/] " if label else "")
        (self.out.problems if problem else self.console).print(prefix + escape(text))

    def event(self, host: str, ev: Event) -> None:
        """What happened, in the CLI's words (``cli.words``), at the event's level."""
        say(self, host, ev)

    def step(self, host: str, text: str) -> None:
        if not self.out.quiet:
            self._host_line(host, text)

    def note(self, host: str, text: str) -> None:
        if not self.out.quiet:
            self._host_line(host, text, "note:", "dim")

    def warn(self, host: str, text: str) -> None:
        self._host_line(host, text, "warning:", "bold yellow", problem=True)

    def progress(self, host: str, event: dict[str, Any]) -> None:
        """What the host says while a step runs: on the live line only, not as lines.

        A health poll, ``probe: 43/64 requests answered``, ``SIGTERM sent``, "healthy
        after 0.6 s; checking it stays healthy …": each is the state of a step under way,
        and the step lines say the facts once when it ends (``healthy after …``, the gate's
        table, ``rolled back: …``). Printed as lines those read as results (a probe's
        count as failures, "healthy after" twice). So on a terminal they update one
        live line, erased when the next line is printed; elsewhere (a pipe, a fleet
        whose board shows them) they are not printed. ``-v`` prints them as lines, and a
        build's own output (``stream``) is always lines: it is content, not progress.
        """
        msg = event.get("msg")
        if not msg or self.out.quiet:
            return
        elapsed = event.get("elapsed")
        prefix = f"{elapsed:6.1f}s " if isinstance(elapsed, (int, float)) else ""
        line = f"{escape(host)} {prefix}{escape(str(msg))}"
        if event.get("stream") is not None or self.out.verbosity >= VERBOSE:
            self._settle()
            self.console.print(f"[dim]{line}[/]")
            return
        if not (self.live_line and self.out.terminal):
            return  # no live line here: said by the step lines when the step ends
        # one live line that updates, instead of a line per change
        if self._status is None:
            self._status = self.console.status(line)
            self._status.start()
            live_started(self._status)
        else:
            self._status.update(line)

    def plan(self, host: str, plan: HostPlan) -> None:
        if self.out.quiet:
            return  # nothing shown: nothing computed
        for f in plan.files:
            if not f.changed:
                note = "; ".join(f.plan.notes) or "already as planned"
                self.step(host, f"{f.path}: unchanged ({note})")
                continue
            self.step(host, f"{f.path}: {change_summary(f)}")
            if self.diff:
                draw_diff(self.out, f)
            if self.planned_view:
                ranges = view_ranges(f.plan.changes, count_lines(f.plan.result), context=3)
                self.verification(f.path, f.plan.result, ranges, title="planned")
        change = plan.server
        if change is not None and change.restart:
            for c in change.flag_changes:
                self.step(host, f"flag {c}")
            if change.before is None and change.after_argv:
                self.step(host, f"no server running: starting {shlex.join(redact_argv(change.after_argv))}")
            elif not change.flag_changes:
                self.step(host, f"server restarts ({change.why or 'files changed'})")

    def readback(self, host: str, path: str, text: str, ranges: Sequence[Any]) -> None:
        if not self.out.quiet:
            self.verification(path, text, ranges, title=f"read back from {host}")

    def verification(self, path: str, text: str, ranges: Sequence[ViewRange], *, title: str) -> None:
        self._settle()
        draw_view(self.out, path, text, ranges, title=title)

    def server_log(self, host: str, title: str, lines: Sequence[str]) -> None:
        self._settle()
        draw_log(self.out, f"{host}: {title}", lines)

    def gate(self, host: str, outcome: GateOutcome) -> None:
        self._settle()
        draw_gate(self.out, host, outcome)

    def phase(self, host: str, step: str) -> None:
        """A step begins: shown only by a fleet's live view (``cli.live``), not as a line."""


RichReporter = ConsoleReporter
"""The name this class had; kept for callers written before the media split."""


def say(reporter: Reporter, host: str, ev: Event) -> None:
    """An event as a line at its level: a step, a note or a warning of ``reporter``."""
    text = line(ev)
    if ev.level == "warning":
        reporter.warn(host, text)
    elif ev.level == "note":
        reporter.note(host, text)
    else:
        reporter.step(host, text)


def change_summary(f: PlannedFile) -> str:
    """``2 changes, +11 -0 lines (82-84, 353-360)``: the plan of one file in a line."""
    changes = f.plan.changes
    added = sum(c.new_end - c.new_start + 1 for c in changes)
    removed = sum(c.old_end - c.old_start + 1 for c in changes)
    where = ", ".join(f"{c.new_start}-{c.new_end}" if c.new_end > c.new_start else str(c.new_start)
                      for c in changes)
    count = f"{len(changes)} change{'s' if len(changes) != 1 else ''}"
    return f"{count}, +{added} -{removed} lines" + (f" (at {where})" if where else "")


# ------------------------------------------------------------------- drawing


def draw_diff(out: Output, f: PlannedFile) -> None:
    """The unified diff of one planned file (hunks follow the planned edits)."""
    diff = unified_diff(f.plan.original, f.plan.result, f.plan.changes,
                        fromfile=f"{f.path} (now)", tofile=f"{f.path} (planned)")
    if out.terminal:
        from rich.syntax import Syntax

        # made safe whole, before Rich folds it: a fold could split a secret the console would miss
        out.console.print(Syntax(out.safe(diff.rstrip("\n")), "diff", theme=THEME, word_wrap=True))
        return
    styles = {"+": "green", "-": "red", "@": "cyan"}
    for row in diff.splitlines():
        style = None if row.startswith(("+++", "---")) else styles.get(row[:1])
        out.line(row, style)


def draw_view(out: Output, path: str, text: str, ranges: Sequence[ViewRange], *, title: str) -> None:
    """``sed -n A,Bp`` of each range: line numbers, changed lines marked, nothing cut."""
    for r in ranges:
        header = Text.assemble(("sed -n ", "dim"), (r.sed, "bold"), (f" {path}", ""),
                               (f"  ({title})", "dim"))
        out.console.print(header)
        window = lines_between(text, r.start, r.end)  # not the whole file's lines: it may be 50 MB
        if out.terminal:
            from rich.syntax import Syntax

            out.console.print(Syntax(  # made safe whole before Rich folds it (see draw_diff)
                out.safe("\n".join(window)), lexer_for(path), theme=THEME, line_numbers=True,
                start_line=r.start, highlight_lines=set(r.highlight), word_wrap=True,
            ))
            continue
        width = len(str(r.end))
        marked = set(r.highlight)
        for n, row in enumerate(window, start=r.start):
            mark = MARK if n in marked else " "
            out.line(f"{mark} {n:>{width}} {row}", "bold" if n in marked else None)


def draw_log(out: Output, title: str, lines: Sequence[str]) -> None:
    """A server's log tail, shown because it failed: on stderr, with the failure it explains;
    a red panel on a terminal, ``| ``-prefixed lines elsewhere."""
    if out.problems_terminal:
        from rich.panel import Panel

        body = out.safe("\n".join(lines)) if lines else "(empty)"  # before Rich folds it or drops a BEL
        out.problems.print(Panel(Text(body), title=escape(title), border_style="red"))
        return
    out.problem(f"{title}:", "red")
    for row in lines or ["(empty)"]:
        out.problem(f"  | {row}")


VERDICT_STYLE = {"pass": "green", "fail": "bold red", "inconclusive": "yellow"}


def draw_gate(out: Output, host: str, outcome: GateOutcome) -> None:
    """The gate's before/after table: a Rich table on a terminal, aligned plain lines elsewhere.

    Shown whatever the verbosity (``-q`` too): it is the reason a deploy
    was kept or rolled back.
    """
    rows = outcome.rows()
    # a table only where every cell fits whole: nothing is ever cut or ellipsized
    needed = sum(max(len(r[i]) for r in [COLUMNS, *rows]) for i in range(len(COLUMNS))) + 3 * len(COLUMNS) + 1
    if not out.terminal:
        lines = plain_table(outcome)
        out.line(f"{host} {lines[0]}", VERDICT_STYLE.get(outcome.verdict))
        for row in lines[1:]:
            out.line(row)
        return
    if needed > out.console.width:  # a narrow terminal: a sentence per row, wrapped at word boundaries
        out.line(f"{host} {outcome.title()}", VERDICT_STYLE.get(outcome.verdict))
        for check, (probe, figure, before, after, change, rule, verdict) in zip(outcome.checks, rows, strict=True):
            change = f" ({change})" if change else ""
            out.console.print(Text.assemble(f"  {probe} {figure}: {before} → {after}{change}, {rule}: ",
                                            (verdict, VERDICT_STYLE.get(check.verdict, ""))))
        return
    from rich.table import Table

    table = Table(title=f"{escape(host)} {escape(outcome.title())}", title_justify="left")
    for name in COLUMNS:
        table.add_column(name, justify="right" if name in ("before", "after", "change") else "left",
                         no_wrap=True)
    for check, cells_of in zip(outcome.checks, rows, strict=True):
        style = VERDICT_STYLE.get(check.verdict, "")
        cells = [Text(c) for c in cells_of[:-1]] + [Text(cells_of[-1], style=style)]
        table.add_row(*cells)
    out.console.print(table)


def print_summary(out: Output, report: RunReport) -> None:
    """The last word per host: ``name: outcome``, the release, then the error in one line.
    A spinner still on screen (a run stopped in its wait) is erased first."""
    stop_live_views()
    for name, r in report.hosts.items():
        summary_line(out, name, r)


def summary_line(out: Output, name: str, r: HostReport) -> None:
    """A host's outcome and its error; a failure (exit code not 0) on stderr, as its warnings."""
    style = {0: "green", 1: "yellow", 2: "red", 3: "bold red"}.get(r.exit_code, "red")
    console = out.console if r.exit_code == 0 else out.problems
    line = f"[{style}]{escape(name)}: {r.outcome}[/]"
    summary = r.extra.get("summary")
    if isinstance(summary, RollbackSummary):  # a rollback: what it undid and what is current, not its own id
        line += f"[{style}]:[/] {escape(rollback_summary(summary))}"
    elif r.release:
        line += f" [dim]release {escape(r.release)}[/]"
    console.print(line)
    if r.error:
        (out.line if r.exit_code == 0 else out.problem)("  " + one_line(r.error), style)


def one_line(text: str) -> str:
    """``text`` on one line (an error is printed as exactly one)."""
    return re.sub(r"\s*\n\s*", " ", text.strip())
