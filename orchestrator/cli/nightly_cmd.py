"""``orch nightly``: a reproducible night per host, its reports, and its cron entry.

Registered on the ``orch`` group by importing this module (``cli/app.py``).
Heavy modules are imported inside the command, as everywhere in the CLI.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from orchestrator.cli.app import COMMON_HELP, _console, _finish, _options, _targets, cli
from orchestrator.errors import ConfigError, OrchError


@cli.command()
@click.argument("spec", required=False)
@click.option("--host", "hosts", multiple=True, metavar="H",
              help="A host name, a group, `all`, or [user@]address[:port]; repeatable.")
@click.option("-i", "--inventory", default=None, metavar="PATH", help=COMMON_HELP["inventory"])
@click.option("--var", "cli_vars", multiple=True, metavar="K=V", help=COMMON_HELP["var"])
@click.option("--json", "as_json", is_flag=True, help=COMMON_HELP["json"])
@click.option("--accept-new-host-key", is_flag=True, help=COMMON_HELP["accept"])
@click.option("--ssh-config", "ssh_config", default=None, metavar="PATH",
              help="ssh_config file to read instead of ~/.ssh/config.")
@click.option("--frozen", is_flag=True, help="Refuse when any input differs from the last good night.")
@click.option("--force", is_flag=True, help="Build even over hand edits (drift) in the current build.")
@click.option("--break-lock", is_flag=True, help="Take a stale lock whose holder cannot be checked.")
@click.option("--reports", "reports_dir", default="reports", metavar="DIR", show_default=True,
              help="Where reports/<host>/ (JSON per night, index.html, trend.svg) go.")
@click.option("--schedule", "schedule", default=None, metavar="CRON",
              help='Install a crontab entry that runs this night, e.g. "0 2 * * *".')
@click.option("--unschedule", is_flag=True, help="Remove the crontab entry of this spec and host.")
@click.option("--list-schedules", is_flag=True, help="Show orch's crontab entries.")
def nightly(spec: str | None, hosts: tuple[str, ...], inventory: str | None, cli_vars: tuple[str, ...],
            as_json: bool, accept_new_host_key: bool, ssh_config: str | None, frozen: bool, force: bool,
            break_lock: bool, reports_dir: str, schedule: str | None, unschedule: bool,
            list_schedules: bool) -> None:
    """Rebuild SPEC (default playbooks/nightly.yaml) from its pin on the hosts, switch, probe, report."""
    console = _console(as_json)
    try:
        if list_schedules:
            _list_schedules(console, as_json)
            return
        if not hosts:
            raise ConfigError("missing option --host", key="--host")
        if schedule is not None or unschedule:
            _schedule(console, as_json, spec, hosts, inventory, cli_vars, ssh_config, reports_dir, frozen,
                      schedule, unschedule)
            return
        _run(console, as_json, spec, hosts, inventory, cli_vars, accept_new_host_key, ssh_config, frozen,
             force, break_lock, reports_dir)
    except OrchError as e:
        if as_json:
            click.echo(json.dumps({"exit_code": e.exit_code, "error": str(e), "hosts": {}}, indent=2))
        raise


def _run(console: Any, as_json: bool, spec: str | None, hosts: tuple[str, ...], inventory: str | None,
         cli_vars: tuple[str, ...], accept_new_host_key: bool, ssh_config: str | None, frozen: bool,
         force: bool, break_lock: bool, reports_dir: str) -> None:
    from orchestrator.cli.views import RichReporter
    from orchestrator.core.rendering import parse_cli_vars
    from orchestrator.pipeline.nightly import NightOptions, nightly_host
    from orchestrator.pipeline.nightly_report import notify, write_report
    from orchestrator.pipeline.report import RunReport
    from orchestrator.shell.nightly_files import find_nightly, load_nightly

    variables = parse_cli_vars(list(cli_vars))
    loaded = load_nightly(find_nightly(spec))
    targets = _targets(hosts, inventory)
    options = _options(accept_new_host_key, ssh_config, break_lock)
    reporter = RichReporter(console)
    report = RunReport()
    for target in targets:
        result = nightly_host(target, loaded, variables, options, reporter, NightOptions(frozen, force))
        files = write_report(Path(reports_dir), result, loaded.model.name, loaded.display)
        for note in files.notes:
            reporter.note(target.name, note)
        reporter.step(target.name, f"report: {files.json} (page {files.index})")
        if loaded.model.notify:
            warning = notify(loaded.model.notify, result, files)
            if warning:
                reporter.warn(target.name, warning)
        host_report = result.host_report()
        host_report.extra["report"] = str(files.json)
        report.hosts[target.name] = host_report
    _finish(report, as_json, console)


def _absolute(path: str | None) -> str | None:
    return str(Path(path).expanduser().resolve()) if path else None


def _schedule(console: Any, as_json: bool, spec: str | None, hosts: tuple[str, ...], inventory: str | None,
              cli_vars: tuple[str, ...], ssh_config: str | None, reports_dir: str, frozen: bool,
              schedule: str | None, unschedule: bool) -> None:
    """Install (or remove) the crontab entry that runs this very command, with absolute paths."""
    from orchestrator.core.schedule import (
        add_entry,
        check_schedule,
        cron_command,
        remove_entry,
        schedule_key,
    )
    from orchestrator.shell.crontab import read_crontab, write_crontab
    from orchestrator.shell.nightly_files import find_nightly, load_nightly

    spec_path = find_nightly(spec).resolve()
    load_nightly(spec_path)  # refuse a broken spec now, not at 2 a.m.
    key = schedule_key(",".join(hosts), str(spec_path))
    before = read_crontab()
    if unschedule:
        text, found = remove_entry(before or "", key)
        if not found:
            raise ConfigError(f"no orch entry for {key} in the crontab", key="--unschedule")
        write_crontab(None if before is None or (not text and before == "") else text)
        _say(console, as_json, {"unscheduled": key})
        return
    expression = check_schedule(schedule or "")
    inv = _absolute(inventory) or (_absolute("inventory.yaml") if Path("inventory.yaml").is_file() else None)
    reports = Path(reports_dir).expanduser().resolve()
    reports.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "orchestrator", "nightly", str(spec_path)]
    for host in hosts:
        argv += ["--host", host]
    if inv:
        argv += ["-i", inv]
    for item in cli_vars:
        argv += ["--var", item]
    if ssh_config:
        argv += ["--ssh-config", str(_absolute(ssh_config))]
    if frozen:
        argv.append("--frozen")
    argv += ["--reports", str(reports)]
    command = cron_command(argv, os.getcwd(), str(reports / "cron.log"))
    write_crontab(add_entry(before or "", key, expression, command))
    _say(console, as_json, {"scheduled": key, "schedule": expression, "command": command})


def _list_schedules(console: Any, as_json: bool) -> None:
    from orchestrator.core.schedule import list_entries
    from orchestrator.shell.crontab import read_crontab

    entries = list_entries(read_crontab() or "")
    if as_json:
        click.echo(json.dumps({"exit_code": 0, "schedules": [
            {"key": e.key, "schedule": e.schedule, "command": e.command} for e in entries]}, indent=2))
        return
    if not entries:
        console.print("no orch nightly entries in the crontab")
    for e in entries:
        console.print(f"[bold]{e.schedule}[/]  {e.key}\n  {e.command}", highlight=False, markup=True)


def _say(console: Any, as_json: bool, data: dict[str, Any]) -> None:
    if as_json:
        click.echo(json.dumps({"exit_code": 0, **data}, indent=2))
    else:
        for k, v in data.items():
            console.print(f"{k}: {v}", markup=False)
