"""``orch status``: current release, server, health now, drift; an exit code to branch on."""

from __future__ import annotations

from typing import Any

import click

from orchestrator.cli.options import HostFlags, OutputFlags, host_options, output_options


@click.command(short_help="Current release, server, health now, drift; exit 0/2/3.")
@host_options
@output_options
def status(out: OutputFlags, where: HostFlags) -> int:
    """Current release, server process, health now, and drift since the release.

    Exit codes (the worst host's): 0 healthy, or nothing to check (drift
    is reported, not an error); 2 unreachable; 3 the server is not healthy
    or not running, or a deploy never finished. Reads only; hosts are read
    --forks at a time, and each has its own entry.
    """
    from orchestrator.cli.fleet import read_hosts
    from orchestrator.cli.tables import draw_status
    from orchestrator.cli.views import summary_line
    from orchestrator.pipeline.inspect import host_status
    from orchestrator.pipeline.report import HostReport

    targets = where.targets()
    output = out.output()
    options = where.connect()
    found = read_hosts(output, targets, lambda target: host_status(target, options), where.fleet(),
                       title="orch status", exit_code=lambda s: s.exit_code)
    hosts: dict[str, Any] = {}
    code = 0
    for name, got in found.items():
        if isinstance(got, HostReport):
            summary_line(output, name, got)
            hosts[name] = got.to_json()
            code = max(code, got.exit_code)
            continue
        hosts[name] = got.to_json()
        code = max(code, got.exit_code)
        if not output.quiet or got.exit_code:
            draw_status(output, got)
    if out.as_json:
        output.emit_json({"exit_code": code, "error": None, "hosts": hosts})
    return code
