"""Everything orch draws for a person: diffs, the ``sed -n`` view, tables.

Rich does the drawing: ``Syntax`` with ``line_numbers``, ``line_range`` and
``highlight_lines`` is exactly the verification view an engineer gets from
``sed -n A,Bp`` plus a careful eye.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from orchestrator.core.regions import ViewRange
from orchestrator.core.secrets import redact_argv
from orchestrator.pipeline.inspect import HistoryRow, HostStatus
from orchestrator.pipeline.plan import HostPlan
from orchestrator.pipeline.report import HostReport, RunReport


def lexer_for(path: str) -> str:
    ext = path.rsplit(".", 1)[-1] if "." in path else ""
    return {"py": "python", "yaml": "yaml", "yml": "yaml", "sh": "bash", "json": "json",
            "toml": "toml"}.get(ext, "text")


class RichReporter:
    """The pipeline's Reporter, drawn on a Rich console."""

    def __init__(self, console: Console, *, verbose: bool = True) -> None:
        self.console = console
        self.verbose = verbose
        self._status: Any = None  # a live spinner while the host waits, on a terminal

    def _settle(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def step(self, host: str, text: str) -> None:
        self._settle()
        self.console.print(f"[bold cyan]{escape(host)}[/] {escape(text)}")

    def note(self, host: str, text: str) -> None:
        self._settle()
        self.console.print(f"[bold cyan]{escape(host)}[/] [dim]note:[/] {escape(text)}")

    def warn(self, host: str, text: str) -> None:
        self._settle()
        self.console.print(f"[bold cyan]{escape(host)}[/] [bold yellow]warning:[/] {escape(text)}")

    def progress(self, host: str, event: dict[str, Any]) -> None:
        msg = event.get("msg")
        if not msg:
            return
        elapsed = event.get("elapsed")
        prefix = f"{elapsed:6.1f}s " if isinstance(elapsed, (int, float)) else ""
        line = f"{escape(host)} {prefix}{escape(str(msg))}"
        if self.console.is_terminal and event.get("event") == "health":
            # one live line that updates, instead of a line per change
            if self._status is None:
                self._status = self.console.status(line)
                self._status.start()
            else:
                self._status.update(line)
            return
        self.console.print(f"[dim]{line}[/]")

    def plan(self, host: str, plan: HostPlan) -> None:
        self._settle()
        for f in plan.files:
            if not f.changed:
                note = "; ".join(f.plan.notes) or "already as planned"
                self.step(host, f"{f.path}: unchanged ({note})")
                continue
            self.console.print(Panel.fit(f"[bold]{escape(f.path)}[/] on {escape(host)}", style="blue"))
            diff = "".join(
                difflib.unified_diff(
                    f.plan.original.splitlines(keepends=True),
                    f.plan.result.splitlines(keepends=True),
                    fromfile=f"{f.path} (now)",
                    tofile=f"{f.path} (planned)",
                )
            )
            self.console.print(Syntax(diff, "diff", theme="ansi_dark", word_wrap=False))
            from orchestrator.core.regions import view_ranges

            ranges = view_ranges(f.plan.changes, len(f.plan.result.splitlines()), context=3)
            self.verification(f.path, f.plan.result, ranges, title="planned")
        change = plan.server
        if change is not None and change.restart:
            for c in change.flag_changes:
                self.step(host, f"flag {c}")
            if not change.flag_changes:
                self.step(host, "server restarts (code changed)")

    def readback(self, host: str, path: str, text: str, ranges: Sequence[Any]) -> None:
        self._settle()
        self.verification(path, text, ranges, title=f"read back from {host}")

    def verification(self, path: str, text: str, ranges: Sequence[ViewRange], *, title: str) -> None:
        for r in ranges:
            header = Text.assemble(("sed -n ", "dim"), (f"{r.start},{r.end}p", "bold"), (f" {path}", ""),
                                   (f"  ({title})", "dim"))
            self.console.print(header)
            self.console.print(
                Syntax(
                    text,
                    lexer_for(path),
                    theme="ansi_dark",
                    line_numbers=True,
                    line_range=(r.start, r.end),
                    highlight_lines=set(r.highlight),
                    word_wrap=False,
                )
            )

    def server_log(self, host: str, title: str, lines: Sequence[str]) -> None:
        self._settle()
        body = "\n".join(lines) if lines else "(empty)"
        self.console.print(Panel(Text(body), title=f"{host}: {title}", border_style="red"))


def print_summary(console: Console, report: RunReport) -> None:
    """The last word per host: outcome, release, and the error in one line."""
    for name, r in report.hosts.items():
        style = {0: "green", 1: "yellow", 2: "red", 3: "bold red"}[r.exit_code]
        line = f"[{style}]{escape(name)}: {r.outcome}[/]"
        if r.release:
            line += f" [dim]release {escape(r.release)}[/]"
        console.print(line)
        if r.error:
            console.print(f"[{style}]  {escape(r.error)}[/]")


def fmt_time(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%m-%d %H:%M:%S") if ts else "?"


def short_path(path: str, keep: int = 3) -> str:
    """``…/sglang/srt/server_args.py``: enough to recognise, short enough for a table."""
    parts = path.split("/")
    return path if len(parts) <= keep + 1 else "…/" + "/".join(parts[-keep:])


def history_table(host: str, rows: Sequence[HistoryRow]) -> Table:
    table = Table(title=f"history of {host}", show_lines=False)
    table.add_column("id", no_wrap=True)
    table.add_column("when", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    for col in ("playbook", "source", "files", "flag changes", "outcome"):
        table.add_column(col, overflow="fold")
    table.add_column("tok/s", justify="right", no_wrap=True)
    table.add_column("duration", justify="right", no_wrap=True)
    for r in rows:
        style = "bold green" if r.current else ("yellow" if "rolled back" in r.outcome else "")
        table.add_row(
            r.id,
            fmt_time(r.when),
            r.kind,
            r.playbook,
            r.source or "-",
            "\n".join(short_path(f) for f in r.files) or "-",
            "\n".join(r.flag_changes) or "-",
            r.outcome + (f"\n{r.error}" if r.error and "rolled back" in r.outcome else ""),
            f"{r.tokens_per_s:.0f}" if r.tokens_per_s is not None else "-",
            f"{r.duration:.1f}s" if r.duration is not None else "-",
            style=style,
        )
    return table


def status_panel(s: HostStatus) -> Panel:
    lines = [f"current release: {s.current or 'none'}" + (f" ({s.playbook})" if s.playbook else "")]
    if s.server:
        lines.append(f"server: pid {s.server.get('pid')} (found by {s.server.get('found_by')})")
        lines.append("  argv: " + " ".join(redact_argv(s.server.get("argv") or [])))
    else:
        lines.append("server: not running (or not known to orch)")
    lines.append(f"health: {s.health}")
    lines.append("drift: " + (", ".join(s.drift) + " changed since the release" if s.drift else "none"))
    if s.journal:
        lines.append(f"UNFINISHED deploy {s.journal.get('release')} at step {s.journal.get('step')}: "
                     f"run `orch rollback --host {s.host}`")
    if s.lock:
        lines.append(f"lock: held by {s.lock.get('user')}@{s.lock.get('controller')} pid {s.lock.get('pid')}")
    style = "green" if s.healthy and not s.drift and not s.journal else "yellow"
    return Panel(Text("\n".join(lines)), title=s.host, border_style=style)


def report_line(r: HostReport) -> str:
    return f"{r.host}: {r.outcome}" + (f" — {r.error}" if r.error else "")
