"""``orch history``: releases and rollbacks on each host, read only."""

from __future__ import annotations

from typing import Any

import click

from orchestrator.cli.options import HostFlags, OutputFlags, host_options, output_options
from orchestrator.core.outcomes import ExitCode, worst


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
    from orchestrator.cli.tables import draw_history, draw_release, history_line
    from orchestrator.pipeline.inspect import NoRelease, host_history, host_release

    output = out.output()
    options = where.connect(output)
    pruned: dict[str, int | None] = {}  # --json: each host's count of pruned records (null: unknown)
    if release is None:
        def show(name: str, got: Any) -> Any:
            if output.quiet:
                output.line(history_line(name, got))
            else:
                draw_history(output, got)
            pruned[name] = got.pruned
            return [r.to_json() for r in got.rows]

        hosts, failed, code = _read_each(where, output, lambda t: host_history(t, options), show)
    else:
        def show(name: str, got: Any) -> Any:
            if isinstance(got, NoRelease):
                output.line(f"{name}: no release {release}")
                return None
            draw_release(output, got)
            return got.to_json()

        hosts, failed, code = _read_each(where, output, lambda t: host_release(t, options, release), show)
        if all(v is None for v in hosts.values()) and not failed:
            code = int(ExitCode.REFUSED)  # no host has it: a typo, most likely
    if out.as_json:
        report = {"exit_code": code, "error": None, "hosts": hosts, "failed": failed}
        if release is None:
            report["pruned"] = pruned
        output.emit_json(report)
    return code


def _read_each(where: HostFlags, output: Any, read: Any,
               show: Any) -> tuple[dict[str, Any], dict[str, Any], int]:
    """Each host read ``--forks`` at a time; ``show`` prints a host's answer and gives its JSON.

    A host that could not be read says so in its summary line and goes under
    ``failed``; the code is the worst of those (the others read fine: 0).
    """
    from orchestrator.cli.fleet import read_hosts
    from orchestrator.cli.views import summary_line
    from orchestrator.pipeline.report import HostReport

    found = read_hosts(output, where.targets(), read, where.fleet(), title="orch history")
    hosts: dict[str, Any] = {}
    failed: dict[str, Any] = {}
    for name, got in found.items():
        if isinstance(got, HostReport):
            summary_line(output, name, got)
            failed[name] = got.to_json()
        else:
            hosts[name] = show(name, got)
    return hosts, failed, worst(r.exit_code for r in found.values() if isinstance(r, HostReport))
