"""``orch rollback``: undo the current release (again: one further back), or ``--to R``."""

from __future__ import annotations

import click

from orchestrator.cli.options import HostFlags, OutputFlags, host_options, output_options


@click.command(short_help="Undo the current release (again: one further back).")
@host_options
@click.option("--to", "to", default=None, metavar="RELEASE",
              help="Put the host in the state right after RELEASE (an id or a unique prefix).")
@click.option("--break-lock", is_flag=True, help="Take a stale lock whose holder cannot be checked.")
@output_options
def rollback(out: OutputFlags, where: HostFlags, to: str | None, break_lock: bool) -> int:
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
    report = run_reports(output, targets, lambda target, reporter: rollback_host(target, to, options, reporter),
                         where.fleet(), ConsoleReporter(output), title="orch rollback")
    draw_fleet_summary(output, report)
    if out.as_json:
        output.emit_json(report.to_json())
    return report.exit_code
