"""``orch status``: current release, server, health now, drift; an exit code to branch on."""

from __future__ import annotations

from typing import Any

import click

from orchestrator.cli.options import HostFlags, OutputFlags, host_options, output_options
from orchestrator.core.outcomes import worst


@click.command(short_help="Current release, server, health now, drift; exit 0/2/3.")
@host_options
@click.option("--probe", is_flag=True,
              help="Also probe the server now with the current release's gate probes and compare "
                   "with that release's recorded figures, by its rules.")
@click.option("--follow", is_flag=True,
              help="Follow the release in progress (or the newest one nobody has reported) to its verdict, "
                   "replaying its steps from its start; exit with the code its own run would have had.")
@click.option("--reports", "reports_dir", default="reports", metavar="DIR", show_default=True,
              help="With --follow: where a night's report goes when its own controller is gone "
                   "(as `orch nightly --reports`).")
@output_options
def status(out: OutputFlags, where: HostFlags, probe: bool, follow: bool, reports_dir: str) -> int:
    """Current release, server process, health now, and drift since the release.

    Exit codes (the worst host's): 0 healthy, or nothing to check (drift
    is reported, not an error); 1 with --probe: the server fails a rule of
    the current release's performance gate; 2 unreachable; 3 the server is
    not healthy or not running, or a release was left half-done (its
    controller gone: the watchdog restores it; or unfinished: nothing on the
    host finishes it). A run in progress (its helper alive and hearing its
    controller) is shown as such and exits by health now. Reads only
    (--probe sends the gate's requests to the server); hosts are read
    --forks at a time, and each has its own entry.
    """
    if where.list_hosts:
        from orchestrator.cli.hostlist import list_hosts

        return list_hosts(out, where)
    from orchestrator.cli.fleet import read_hosts
    from orchestrator.cli.output import stop_live_views
    from orchestrator.cli.tables import draw_status
    from orchestrator.cli.views import ConsoleReporter, summary_line
    from orchestrator.pipeline.inspect import host_status
    from orchestrator.pipeline.report import HostReport

    targets = where.targets()
    output = out.output()
    options = where.connect(output)
    if follow:
        from pathlib import Path

        from orchestrator.cli.fleet import run_reports
        from orchestrator.cli.live import draw_fleet_summary
        from orchestrator.pipeline.follow import follow_host

        reports = Path(reports_dir)
        report = run_reports(output, targets, lambda target, rep: follow_host(target, options, rep,
                                                                              reports_dir=reports), where.fleet(),
                             ConsoleReporter(output), title="orch status --follow")
        draw_fleet_summary(output, report)
        if out.as_json:
            output.emit_json(report.to_json())
        return report.exit_code
    # the probe's progress on a live line (one host; several have the board), erased before the panel
    reporter = ConsoleReporter(output, live_line=len(targets) == 1) if probe else None
    found = read_hosts(output, targets, lambda target: host_status(target, options, probe=probe, reporter=reporter),
                       where.fleet(),
                       title="orch status", exit_code=lambda s: s.exit_code)
    stop_live_views()
    hosts: dict[str, Any] = {}
    code = worst(got.exit_code for got in found.values())
    for name, got in found.items():
        if isinstance(got, HostReport):
            summary_line(output, name, got)
            hosts[name] = got.to_json()
            continue
        hosts[name] = got.to_json()
        if output.quiet:
            output.line(f"{name}: {'; '.join(got.problems) or 'ok'}",
                        "red" if got.exit_code else None)
        else:
            draw_status(output, got)
    if out.as_json:
        output.emit_json({"exit_code": code, "error": None, "hosts": hosts})
    return code
