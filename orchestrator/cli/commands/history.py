"""``orch history``: releases and rollbacks on each host, read only."""

from __future__ import annotations

from typing import Any

import click

from orchestrator.cli.options import HostFlags, OutputFlags, host_options, output_options


@click.command(short_help="Releases and rollbacks on hosts.")
@host_options
@output_options
def history(out: OutputFlags, where: HostFlags) -> int:
    """Releases and rollbacks on the hosts: id, time, playbook, files, flags, outcome.

    Reads only: a host orch never deployed to is left as it was (no state
    dir is created), and its empty history says so. Exit codes: 0 read;
    2 a host could not be reached (the others are still shown).
    """
    from orchestrator.cli.tables import draw_history
    from orchestrator.cli.views import summary_line
    from orchestrator.errors import OrchError
    from orchestrator.pipeline.inspect import host_history
    from orchestrator.pipeline.report import HostReport, error_outcome

    targets = where.targets()
    output = out.output()
    options = where.connect()
    hosts: dict[str, Any] = {}
    failed: dict[str, Any] = {}
    code = 0
    for target in targets:
        try:
            found = host_history(target, options)
        except OrchError as e:
            outcome, exit_code = error_outcome(e)
            report = HostReport(target.name, outcome, exit_code, error=str(e))
            summary_line(output, target.name, report)
            failed[target.name] = report.to_json()
            code = max(code, exit_code)
            continue
        hosts[target.name] = [r.to_json() for r in found.rows]
        if not output.quiet:
            draw_history(output, found)
    if out.as_json:
        output.emit_json({"exit_code": code, "error": None, "hosts": hosts, "failed": failed})
    return code
