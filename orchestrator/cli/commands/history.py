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
    dir is created), and its empty history says so. Hosts are read --forks
    at a time. Exit codes: 0 read; 2 a host could not be reached (the others
    are still shown).
    """
    from orchestrator.cli.fleet import read_hosts
    from orchestrator.cli.tables import draw_history
    from orchestrator.cli.views import summary_line
    from orchestrator.pipeline.inspect import host_history
    from orchestrator.pipeline.report import HostReport

    targets = where.targets()
    output = out.output()
    options = where.connect(output)
    found = read_hosts(output, targets, lambda target: host_history(target, options), where.fleet(),
                       title="orch history")
    hosts: dict[str, Any] = {}
    failed: dict[str, Any] = {}
    code = 0
    for name, got in found.items():
        if isinstance(got, HostReport):
            summary_line(output, name, got)
            failed[name] = got.to_json()
            code = max(code, got.exit_code)
            continue
        hosts[name] = [r.to_json() for r in got.rows]
        if not output.quiet:
            draw_history(output, got)
    if out.as_json:
        output.emit_json({"exit_code": code, "error": None, "hosts": hosts, "failed": failed})
    return code
