"""``orch lint``: check playbooks and the inventory without contacting any host."""

from __future__ import annotations

import click

from orchestrator.cli.options import (
    OutputFlags,
    complete_playbooks,
    output_options,
    settings_in_effect,
    var_options,
)


@click.command(short_help="Check playbooks and the inventory without contacting hosts.")
@click.option("-i", "--inventory", default=None, metavar="PATH", type=click.Path(dir_okay=False),
              help="Inventory file (else ORCH_INVENTORY, else the config file, "
                   "else ./inventory.yaml if present).")
@click.option("--var", "cli_vars", multiple=True, metavar="K=V|@FILE",
              help="Set a variable, k=v (value read as YAML), or a YAML file's keys (@vars.yaml), "
                   "as a deploy would.")
@click.argument("playbooks", nargs=-1, shell_complete=complete_playbooks)
@output_options
def lint(out: OutputFlags, inventory: str | None, cli_vars: tuple[str, ...],
         playbooks: tuple[str, ...]) -> int:
    """Check PLAYBOOKS (default: the one deploy would use) and the inventory.

    Parse, schema, template syntax, and undefined variables, rendering each
    playbook for every inventory host with its vars. No host is contacted:
    facts and the defaults from them (sglang_root, vllm_root) are not
    checked; without an inventory, other undefined variables are warnings.
    Exit codes: 0 no problem (warnings allowed); 2 problems (one line each,
    file:line: key).
    """
    from orchestrator.pipeline.lint import lint as run_lint
    from orchestrator.shell.config_files import find_playbook

    variables = var_options(cli_vars)
    inventory = settings_in_effect({"inventory": inventory}).inventory.value
    paths = [find_playbook(p) for p in playbooks] if playbooks else [find_playbook(None)]
    output = out.output()
    report = run_lint(paths, inventory, variables)
    for problem in report.problems:
        output.line(str(problem), "red")
    for warning in report.warnings:
        output.line(f"warning: {warning}", "yellow")
    for skipped in report.skipped:
        if not output.quiet:
            output.line(f"skipped {skipped}", "dim")
    # the outcome line, -q included (docs/CLI.md: -q keeps each outcome)
    where = f" with {report.inventory} ({len(report.hosts)} host"
    where = (where + f"{'s' if len(report.hosts) != 1 else ''})") if report.inventory else ""
    found, warned = len(report.problems), len(report.warnings)
    verdict = f"{found} problem{'s' if found != 1 else ''}" if found else "ok"
    if warned:
        verdict += f", {warned} warning{'s' if warned != 1 else ''}"
    output.line(f"lint: {report.given} playbook{'s' if report.given != 1 else ''}"
                f"{where}: {verdict}", "red" if found else "green")
    if out.as_json:
        output.emit_json(report.to_json())
    return report.exit_code
