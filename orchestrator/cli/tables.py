"""``orch history`` and ``orch status`` for a person, fitted to the medium.

- A terminal wide enough for a Rich table in which every word fits gets
  that table (words are never cut or ellipsized).
- A narrower terminal gets one block per release: a title line, then
  labelled lines whose values wrap at word boundaries under their column,
  so nothing is broken mid-word at 80 columns.
- Off a terminal: no box-drawing at all. ``history`` is one line per
  release (aligned columns first: id, time, duration, outcome, kind,
  playbook; then a night's source and tokens/s, files, flags and the error
  in full, never cut); ``status`` is ``host label: value`` lines, like a deploy's.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from orchestrator.cli.output import Output
from orchestrator.cli.views import draw_gate
from orchestrator.core.secrets import redact_argv
from orchestrator.pipeline.inspect import HistoryRow, HostHistory, HostStatus, ReleaseView


def fmt_time(ts: float, *, full: bool = False) -> str:
    """A time recorded on the host, in the controller's local zone with its UTC offset.

    Without the offset, two engineers in two zones (or a controller and a
    host) read one release's time differently.
    """
    if not ts:
        return "?"
    local = datetime.fromtimestamp(ts).astimezone()
    return local.strftime("%Y-%m-%d %H:%M:%S %z" if full else "%m-%d %H:%M:%S %z")


def fmt_duration(seconds: float | None) -> str:
    return f"{seconds:.1f}s" if seconds is not None else "-"


FOLDED_PATH_WIDTH = 30
"""The narrowest a history table's files column may be: longer paths fold within it."""


def row_style(r: HistoryRow) -> str:
    failed = "rolled back" in r.outcome or "switched back" in r.outcome
    return "bold green" if r.current else ("yellow" if failed else "")


def fmt_tokens(r: HistoryRow) -> str:
    """The probe's output tokens/s, where the release has a probe (a night)."""
    return f"{r.tokens_per_s:.1f}" if r.tokens_per_s is not None else "-"


# ------------------------------------------------------------------- history


def draw_history(out: Output, history: HostHistory) -> None:
    rows = history.rows
    if not rows:
        out.line(f"{history.host}: {history.empty_reason}")
        return
    if not out.terminal:
        _history_lines(out, history.host, rows)
    else:
        table = history_table(history.host, rows)
        # a column is never narrower than its longest word: the table only when they all fit
        needed = sum(c.min_width or 0 for c in table.columns) + 3 * len(table.columns) + 1
        if needed <= out.console.width:
            out.console.print(table)
        else:
            _history_blocks(out, history.host, rows)
    if history.pruned_line:  # what keep_releases removed is said, never dropped silently
        out.line(history.pruned_line)


def history_line(host: str, history: HostHistory) -> str:
    """``-q``'s one line: ``H: current <id>, N releases`` (or why there are none)."""
    rows = history.rows
    if not rows:
        return f"{host}: {history.empty_reason}"
    current = next((r.id for r in reversed(rows) if r.current), None)
    count = f"{len(rows)} release{'s' if len(rows) != 1 else ''}"
    return f"{host}: current {current}, {count}" if current else f"{host}: no current release, {count}"


def history_table(host: str, rows: Sequence[HistoryRow]) -> Table:
    """Nights bring two columns, source and tok/s; a history of deploys only has none."""
    nights = any(r.source or r.tokens_per_s is not None for r in rows)
    columns = ["id", "when", "kind", "playbook", *(["source"] if nights else []), "files",
               "flag changes", "outcome", *(["tok/s"] if nights else []), "duration"]
    whole_columns = {"id", "when", "kind", "tok/s", "duration"}  # never wrapped at all
    cells = []
    for r in rows:
        failed = "rolled back" in r.outcome or "switched back" in r.outcome
        by_column = {
            "id": r.id, "when": fmt_time(r.when), "kind": r.kind, "playbook": r.playbook,
            "source": r.source or "-",
            "files": "\n".join(r.files) or "-",
            "flag changes": "\n".join(r.flag_changes) or "-",
            "outcome": r.outcome + (f"\n{r.error}" if r.error and failed else ""),
            "tok/s": fmt_tokens(r), "duration": fmt_duration(r.duration),
        }
        cells.append(tuple(by_column[c] for c in columns))
    table = Table(title=f"history of {host}")
    for i, col in enumerate(columns):
        whole = col in whole_columns
        longest = max((len(part) for c in cells
                       for part in (c[i].splitlines() if whole else c[i].split())), default=1)
        if col == "files":  # a path is folded where it must be, never cut or shortened
            longest = min(longest, FOLDED_PATH_WIDTH)
        table.add_column(col, min_width=max(longest, len(col)), no_wrap=whole, overflow="fold",
                         justify="right" if col in ("duration", "tok/s") else "left")
    for r, row in zip(rows, cells, strict=True):
        table.add_row(*(Text(c) for c in row), style=row_style(r))  # what a host recorded: never markup
    return table


def _history_blocks(out: Output, host: str, rows: Sequence[HistoryRow]) -> None:
    out.console.print(Text(f"history of {host}", style="bold"))
    for r in rows:
        title = Text.assemble((r.id, "bold"), "  ", fmt_time(r.when), "  ", r.kind, " ", r.playbook,
                              "  ", fmt_duration(r.duration))
        out.console.print(title)
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="dim", no_wrap=True)
        grid.add_column(overflow="fold")
        grid.add_row("  outcome", Text(r.outcome, style=row_style(r)))
        if r.source:
            grid.add_row("  source", Text(r.source))
        if r.tokens_per_s is not None:
            grid.add_row("  probe", Text(f"{fmt_tokens(r)} tok/s"))
        if r.files:
            grid.add_row("  files", Text("\n".join(r.files), overflow="fold"))
        if r.flag_changes:
            grid.add_row("  flags", Text("\n".join(r.flag_changes)))
        if r.error:
            grid.add_row("  error", Text(r.error))
        out.console.print(grid)


def _history_lines(out: Output, host: str, rows: Sequence[HistoryRow]) -> None:
    out.line(f"history of {host} ({len(rows)} release{'s' if len(rows) != 1 else ''})")
    cells = [(r.id, fmt_time(r.when, full=True), fmt_duration(r.duration), r.outcome, r.kind, r.playbook)
             for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    for r, row in zip(rows, cells, strict=True):
        text = "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
        more = r.files or r.flag_changes or r.error or r.source or r.tokens_per_s is not None
        text = text if more else text.rstrip()
        if r.source:
            text += "  source: " + r.source
        if r.tokens_per_s is not None:
            text += f"  tok/s: {fmt_tokens(r)}"
        if r.files:
            text += "  files: " + ", ".join(r.files)
        if r.flag_changes:
            text += "  flags: " + "; ".join(r.flag_changes)
        if r.error:
            text += "  error: " + r.error
        out.line(text, row_style(r) or None)


def draw_release(out: Output, view: ReleaseView) -> None:
    """One release in full: its record, each file's sha256 before and after, and the
    ``sed -n`` view of what it changed, read from the host's own copies."""
    from orchestrator.cli.views import draw_view
    from orchestrator.core.gate import GateOutcome
    from orchestrator.core.regions import text_changes, view_ranges

    m = view.manifest
    rows = [
        ("kind", m.kind),
        ("playbook", m.playbook_name or "-"),
        ("when", fmt_time(m.created, full=True)),
        ("outcome", view.outcome),
    ]
    if m.restored_by:
        rows.append(("restored by", str(m.restored_by)))
    if m.error:
        rows.append(("error", str(m.error)))
    for f in view.files:
        rows.append(("file", f.path))
        rows.append(("  sha256 before", f.sha256_before or "(did not exist)"))
        rows.append(("  sha256 after", f.sha256_after or "(removed)"))
    for side, server in (("before", m.server_before), ("after", m.server_after)):
        if server is not None and server.argv:
            rows.append((f"argv {side}", " ".join(redact_argv(server.argv))))
    rows.extend(("flag", change) for change in m.flag_changes)
    health = m.health or {}
    if health.get("checks"):
        checks = ", ".join(f"{c.get('method', 'GET')} {c.get('path')}" for c in health["checks"])
        rows.append(("health", f"{checks} at {health.get('base_url')}"))
    timings = m.timings or {}
    if timings:
        rows.append(("timings", ", ".join(f"{k} {v:.1f}s" for k, v in timings.items())))
    title = f"release {view.release} on {view.host}" + (" (current)" if view.current else "")
    out.line(title, "bold")
    width = max(len(label) for label, _ in rows)
    for label, value in rows:  # folded on a terminal, whole through a pipe: never cut
        out.line(f"  {label:<{width}}  {value}")
    if m.gate is not None:
        draw_gate(out, view.host, GateOutcome.from_json(m.gate))
    for f in view.files:
        if f.before is None or f.after is None:
            continue
        ranges = view_ranges(text_changes(f.before, f.after), len(f.after.splitlines()))
        draw_view(out, f.path, f.after, ranges, title=f"release {view.release[-4:]}, after")


# -------------------------------------------------------------------- status


def status_lines(s: HostStatus) -> list[tuple[str, str]]:
    """``(label, value)`` pairs, in the order a person reads them."""
    current = s.current or ("none (orch never deployed here)" if not s.state_dir_exists else "none")
    rows = [("current release", current + (f" ({s.playbook})" if s.playbook else ""))]
    if s.server:
        rows.append(("server", f"pid {s.server.pid} (found by {s.server.found_by})"))
        rows.append(("argv", " ".join(redact_argv(s.server.argv or []))))
    else:
        rows.append(("server", "not running" if s.server_expected else "not known to orch"))
    if s.predates_text:
        rows.append(("note", s.predates_text))
    rows.append(("health", s.health))
    rows.append(("drift", ", ".join(s.drift) + " changed since the release" if s.drift else "none"))
    if s.view is not None and s.view.busy:
        rows.append((s.view.state.value.replace("_", " "), s.view.words()))
    if s.lock:
        rows.append(("lock", f"held by {s.lock.who} pid {s.lock.pid}"))
    if s.gate_note:
        rows.append(("probe", s.gate_note))
    elif s.gate is not None:
        rows.append(("probe", f"{s.gate.verdict} against release {s.current}'s record"))
    if s.problems:
        rows.append(("status", "; ".join(s.problems)))
    elif s.regressed and s.gate is not None:
        rows.append(("status", "performance regressed: " + ", ".join(f"{c.name} on {c.probe}"
                                                                      for c in s.gate.failing)))
    elif s.gate is not None and s.gate.verdict == "inconclusive":  # within the noise: no regression shown
        rows.append(("status", s.gate.inconclusive_line()))
    else:
        rows.append(("status", "ok"))
    return rows


def draw_status(out: Output, s: HostStatus) -> None:
    style = "green" if s.exit_code == 0 and not s.drift else ("yellow" if s.exit_code <= 1 else "red")
    rows = status_lines(s)
    if s.gate is not None:
        draw_gate(out, s.host, s.gate)
    if not out.terminal:
        for label, value in rows:
            out.console.print(f"[bold cyan]{escape(s.host)}[/] {escape(label)}: "
                              + (f"[{style}]{escape(value)}[/]" if label == "status" else escape(value)))
        return
    from rich.panel import Panel

    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column()
    for label, value in rows:
        grid.add_row(label, Text(value, style=style if label == "status" else "", overflow="fold"))
    out.console.print(Panel(grid, title=escape(s.host), border_style=style))
