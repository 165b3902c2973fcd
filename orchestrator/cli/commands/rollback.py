"""``orch rollback``: undo the current release (again: one further back), or ``--to R``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from orchestrator.cli.options import HostFlags, OutputFlags, host_options, output_options
from orchestrator.core.outcomes import ExitCode, Outcome

if TYPE_CHECKING:
    from collections.abc import Sequence

    from orchestrator.cli.output import Output
    from orchestrator.core.target import HostTarget
    from orchestrator.pipeline.report import RunReport
    from orchestrator.pipeline.session import ConnectOptions


@click.command(short_help="Undo the current release (again: one further back).")
@host_options
@click.option("--to", "to", default=None, metavar="RELEASE",
              help="Put the host in the state right after RELEASE (an id or a unique prefix).")
@click.option("--break-lock", is_flag=True, help="Take a stale lock whose holder cannot be checked.")
@click.option("--abort", is_flag=True,
              help="Ask the runner of the deploy in progress to stop and restore it, and follow that restore.")
@click.option("--reports", "reports_dir", default="reports", metavar="DIR", show_default=True,
              help="Where `orch nightly` writes reports/<host>/: a host's page there is rewritten.")
@output_options
def rollback(out: OutputFlags, where: HostFlags, to: str | None, break_lock: bool, abort: bool,
             reports_dir: str) -> int:
    """Undo the current release: files and server command line as they were; restart; check.

    Run again, it goes one release further back (it never toggles). It also
    finishes a deploy that never did. Several hosts run --forks at a time;
    each has its own outcome. Exit codes (the worst host's): 0 rolled back or
    nothing to do; 2 refused (an unknown or undone --to, in every state) or
    unreachable; 3 the rollback failed and the host is not known to be healthy.
    """
    if where.list_hosts:
        from orchestrator.cli.hostlist import list_hosts

        return list_hosts(out, where)
    from orchestrator.cli.fleet import run_reports
    from orchestrator.cli.live import draw_fleet_summary
    from orchestrator.cli.views import ConsoleReporter
    from orchestrator.pipeline.rollback import rollback_host

    targets = where.targets()
    output = out.output()
    options = where.connect(output, break_lock=break_lock)
    if abort:
        from orchestrator.pipeline.follow import follow_host

        report = run_reports(output, targets, lambda target, reporter: follow_host(target, options, reporter,
                                                                                   abort=True),
                             where.fleet(), ConsoleReporter(output), title="orch rollback --abort")
        draw_fleet_summary(output, report)
        if out.as_json:
            output.emit_json(report.to_json())
        return report.exit_code
    report = run_reports(output, targets, lambda target, reporter: rollback_host(target, to, options, reporter),
                         where.fleet(), ConsoleReporter(output), title="orch rollback")
    draw_fleet_summary(output, report)
    _rewrite_nightly_pages(output, targets, options, report, Path(reports_dir))
    if out.as_json:
        output.emit_json(report.to_json())
    return report.exit_code


def _rewrite_nightly_pages(output: Output, targets: Sequence[HostTarget], options: ConnectOptions,
                           report: RunReport, reports_dir: Path) -> None:
    """A rollback moves what ``current`` points to: a host's nightly page (if it has one
    under ``--reports``) is rewritten with the host's words, so it marks the right build live.
    A host whose rollback was refused as bad input (exit 2: an unknown or ambiguous ``--to``)
    moved nothing, so its page is left alone and the host is not contacted again."""
    for target in targets:
        host = report.hosts.get(target.name)
        if (host is None or host.outcome == Outcome.UNREACHABLE or host.exit_code == ExitCode.REFUSED
                or not (reports_dir / target.name).is_dir()):
            continue
        from orchestrator.pipeline.nightly_report import refresh_report

        files = refresh_report(reports_dir, target, options)
        if files is None or output.quiet:
            continue
        for note in files.notes:
            output.line(f"{target.name}: note: {note}", "dim")
        output.line(f"{target.name}: nightly page rewritten: {files.index}")
