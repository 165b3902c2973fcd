"""``orch deploy``: the whole story on each host, or ``--check`` to plan it only."""

from __future__ import annotations

import click

from orchestrator.cli.options import (
    BatchFlags,
    HostFlags,
    OutputFlags,
    batch_options,
    complete_playbooks,
    host_options,
    output_options,
)


@click.command(short_help="Deploy a playbook on hosts; roll back by itself on failure.")
@host_options
@batch_options
@click.option("--check", is_flag=True, help="Plan, render, stage, validate and run the pre-flight on the staged files; change nothing.")
@click.option("--diff", "show_diff", is_flag=True,
              help="Also show the unified diff of each changed file before it is staged.")
@click.option("--break-lock", is_flag=True, help="Take a stale lock whose holder cannot be checked.")
@click.option("--baseline", is_flag=True,
              help="Performance gate: probe the running server before the stop, even where the "
                   "current release has recorded figures to compare with.")
@click.option("--stats", is_flag=True, help="At the end, the seconds each step took on each host.")
@click.argument("playbook", required=False, shell_complete=complete_playbooks)
@output_options
def deploy(out: OutputFlags, where: HostFlags, batches: BatchFlags, check: bool, show_diff: bool,
           break_lock: bool, baseline: bool, stats: bool, playbook: str | None) -> int:
    """Deploy PLAYBOOK (default: playbooks/site.yaml here, else the shipped one) on the hosts.

    Any failure after the backup rolls the host back by itself, a rule of the
    playbook's performance gate (gate:) that fails included. Several hosts run
    --forks at a time, in --serial batches if given. Exit codes (the worst
    host's): 0 changed, unchanged or planned; 1 failed and rolled back; 2
    refused before anything changed (with --check: where a deploy would
    refuse), or hosts left not started; 3 a host is not known to be healthy.
    """
    if where.list_hosts:
        from orchestrator.cli.hostlist import list_hosts

        return list_hosts(out, where, batches)
    from orchestrator.cli.fleet import run_reports
    from orchestrator.cli.live import draw_fleet_summary, draw_stats
    from orchestrator.cli.views import ConsoleReporter
    from orchestrator.core.rendering import vars_for_host
    from orchestrator.core.secrets import secret_names, secret_values
    from orchestrator.pipeline.deploy import deploy_host
    from orchestrator.pipeline.follow import follow_again
    from orchestrator.pipeline.rollback import rollback_host
    from orchestrator.shell.config_files import (
        display_path,
        find_playbook,
        is_shipped,
        load_playbook,
    )

    variables = where.variables()
    plan = where.fleet(batches)  # a bad --serial or --max-fail-percent: exit 2 before any host
    path = find_playbook(playbook)
    loaded = load_playbook(path)
    targets = where.targets()
    output = out.output()
    if playbook is None and is_shipped(path):
        output.line(f"note: no playbooks/site.yaml here; using the shipped {display_path(path)}",
                    "dim")
    output.masker.declare(loaded.model.secrets)  # env vars, flags and headers of those names too
    for target in targets:  # never shown, even at -vv
        merged = vars_for_host(loaded.model, target, variables)
        output.hide(secret_values(merged, secret_names(merged, loaded.model.secrets)))
    options = where.connect(output, break_lock=break_lock)
    undo = None
    if batches.rollback_all_on_failure and not check:
        def undo(target, reporter):  # type: ignore[no-untyped-def]
            return rollback_host(target, None, options, reporter)
    follow = None
    if len(targets) > 1 and not check:
        def follow(target, reporter, lost, when):  # type: ignore[no-untyped-def]
            return follow_again(target, options, reporter, lost, when)
    report = run_reports(
        output, targets,
        lambda target, reporter: deploy_host(target, loaded, variables, options, reporter, check=check,
                                             baseline=baseline),
        plan, ConsoleReporter(output, diff=show_diff, planned_view=check),
        title="orch deploy --check" if check else "orch deploy", undo=undo, follow=follow)
    draw_fleet_summary(output, report)
    if stats:
        draw_stats(output, report.hosts)
    if out.as_json:
        output.emit_json(report.to_json())
    return report.exit_code
