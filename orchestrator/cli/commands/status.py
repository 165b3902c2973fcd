"""``orch status``: current release, server, health now, drift; an exit code to branch on."""

from __future__ import annotations

from typing import Any

import click

from orchestrator.cli.options import HostFlags, OutputFlags, host_options, output_options


@click.command(short_help="Current release, server, health now, drift; exit 0/2/3.")
@host_options
@click.option("--probe", is_flag=True,
              help="Also probe the server now with the current release's gate probes and compare "
                   "with that release's recorded figures, by its rules.")
@output_options
def status(out: OutputFlags, where: HostFlags, probe: bool) -> int:
    """Current release, server process, health now, and drift since the release.

    Exit codes (the worst host's): 0 healthy, or nothing to check (drift
    is reported, not an error); 1 with --probe: the server fails a rule of
    the current release's performance gate; 2 unreachable; 3 the server is
    not healthy or not running, or a deploy never finished. Reads only
    (--probe sends the gate's requests to the server).
    """
    from orchestrator.cli.tables import draw_status
    from orchestrator.cli.views import ConsoleReporter, summary_line
    from orchestrator.errors import OrchError
    from orchestrator.pipeline.inspect import host_status
    from orchestrator.pipeline.report import HostReport, error_outcome

    targets = where.targets()
    output = out.output()
    options = where.connect()
    hosts: dict[str, Any] = {}
    code = 0
    for target in targets:
        try:
            found = host_status(target, options, probe=probe,
                                reporter=ConsoleReporter(output) if probe else None)
        except OrchError as e:
            outcome, exit_code = error_outcome(e)
            report = HostReport(target.name, outcome, exit_code, error=str(e))
            summary_line(output, target.name, report)
            hosts[target.name] = report.to_json()
            code = max(code, exit_code)
            continue
        hosts[target.name] = found.to_json()
        code = max(code, found.exit_code)
        if not output.quiet or found.exit_code or found.gate is not None:
            draw_status(output, found)
    if out.as_json:
        output.emit_json({"exit_code": code, "error": None, "hosts": hosts})
    return code
