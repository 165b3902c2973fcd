"""``orch history``: releases and rollbacks on each host, read only."""

from __future__ import annotations

from typing import Any

import click

from orchestrator.cli.options import HostFlags, OutputFlags, host_options, output_options


@click.command(short_help="Releases and rollbacks on hosts.")
@host_options
@click.option("--release", "release", default=None, metavar="ID",
              help="Print one release in full (a full id, a unique prefix or its 4-character suffix).")
@output_options
def history(out: OutputFlags, where: HostFlags, release: str | None) -> int:
    """Releases and rollbacks on the hosts: id, time, playbook, files, flags, outcome.

    Reads only: a host orch never deployed to is left as it was (no state
    dir is created), and its empty history says so. Hosts are read --forks
    at a time. Exit codes: 0 read; 2 a host could not be reached (the others
    are still shown).
    """
    if where.list_hosts:
        from orchestrator.cli.hostlist import list_hosts

        return list_hosts(out, where)
    from orchestrator.cli.fleet import read_hosts
    from orchestrator.cli.tables import draw_history, history_line
    from orchestrator.cli.views import summary_line
    from orchestrator.pipeline.inspect import host_history
    from orchestrator.pipeline.report import HostReport

    if release is not None:
        return _one_release(out, where, release)
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
        if output.quiet:
            output.line(history_line(name, got))
        else:
            draw_history(output, got)
    if out.as_json:
        output.emit_json({"exit_code": code, "error": None, "hosts": hosts, "failed": failed})
    return code


def _one_release(out: OutputFlags, where: HostFlags, ref: str) -> int:
    """``--release ID``: each host that has it prints it in full; the others say they have not."""
    from orchestrator.cli.fleet import read_hosts
    from orchestrator.cli.tables import draw_release
    from orchestrator.cli.views import summary_line
    from orchestrator.pipeline.inspect import NoRelease, host_release
    from orchestrator.pipeline.report import HostReport

    targets = where.targets()
    output = out.output()
    options = where.connect(output)
    found = read_hosts(output, targets, lambda target: host_release(target, options, ref), where.fleet(),
                       title="orch history")
    hosts: dict[str, Any] = {}
    failed: dict[str, Any] = {}
    code = 0
    for name, got in found.items():
        if isinstance(got, HostReport):
            summary_line(output, name, got)
            failed[name] = got.to_json()
            code = max(code, got.exit_code)
        elif isinstance(got, NoRelease):
            output.line(f"{name}: no release {ref}")
            hosts[name] = None
        else:
            draw_release(output, got)
            hosts[name] = got.to_json()
    if all(v is None for v in hosts.values()) and not failed:
        code = 2  # no host has it: a typo, most likely
    if out.as_json:
        output.emit_json({"exit_code": code, "error": None, "hosts": hosts, "failed": failed})
    return code
