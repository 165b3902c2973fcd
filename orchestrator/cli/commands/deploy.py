"""``orch deploy``: the whole story on each host, or ``--check`` to plan it only."""

from __future__ import annotations

import click

from orchestrator.cli.options import (
    HostFlags,
    OutputFlags,
    complete_playbooks,
    host_options,
    output_options,
)


@click.command(short_help="Deploy a playbook on hosts; roll back by itself on failure.")
@host_options
@click.option("--check", is_flag=True, help="Plan, render, stage and validate; change nothing.")
@click.option("--diff", "show_diff", is_flag=True,
              help="Also show the unified diff of each changed file before it is staged.")
@click.option("--break-lock", is_flag=True, help="Take a stale lock whose holder cannot be checked.")
@click.option("--baseline", is_flag=True,
              help="Performance gate: probe the running server before the stop, even where the "
                   "current release has recorded figures to compare with.")
@click.argument("playbook", required=False, shell_complete=complete_playbooks)
@output_options
def deploy(out: OutputFlags, where: HostFlags, check: bool, show_diff: bool, break_lock: bool,
           baseline: bool, playbook: str | None) -> int:
    """Deploy PLAYBOOK (default: playbooks/site.yaml here, else the shipped one) on the hosts.

    Any failure after the backup rolls the host back by itself, a rule of
    the playbook's performance gate (gate:) that fails included. Exit codes:
    0 changed, unchanged or planned; 1 failed and rolled back; 2 refused
    before anything changed (with --check: where a deploy would refuse);
    3 the host is not known to be healthy.
    """
    from orchestrator.cli.views import ConsoleReporter, print_summary
    from orchestrator.core.rendering import vars_for_host
    from orchestrator.core.secrets import secret_names, secret_values
    from orchestrator.pipeline.deploy import deploy_host
    from orchestrator.pipeline.report import RunReport
    from orchestrator.shell.config_files import (
        display_path,
        find_playbook,
        is_shipped,
        load_playbook,
    )

    variables = where.variables()
    path = find_playbook(playbook)
    loaded = load_playbook(path)
    targets = where.targets()
    output = out.output()
    if playbook is None and is_shipped(path):
        output.line(f"note: no playbooks/site.yaml here; using the shipped {display_path(path)}",
                    "dim")
    for target in targets:  # never shown, even at -vv
        merged = vars_for_host(loaded.model, target, variables)
        output.hide(secret_values(merged, secret_names(merged, loaded.model.secrets)))
    reporter = ConsoleReporter(output, diff=show_diff, planned_view=check)
    options = where.connect(break_lock=break_lock)
    report = RunReport()
    for target in targets:
        report.hosts[target.name] = deploy_host(target, loaded, variables, options, reporter,
                                                check=check, baseline=baseline)
    print_summary(output, report)
    if out.as_json:
        output.emit_json(report.to_json())
    return report.exit_code
