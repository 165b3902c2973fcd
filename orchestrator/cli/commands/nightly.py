"""``orch nightly``: a reproducible night per host, its reports, and its cron entry."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from orchestrator.cli.options import HostFlags, OutputFlags, host_options, output_options
from orchestrator.core import events
from orchestrator.core.outcomes import Outcome

if TYPE_CHECKING:
    from orchestrator.cli.output import Output


@click.command(short_help="Rebuild a server from a pinned spec, switch once, probe, report.")
@host_options(required=False)
@click.option("--frozen", is_flag=True, help="Refuse when any input differs from the last good night.")
@click.option("--force", is_flag=True, help="Build even over hand edits (drift) in the current build.")
@click.option("--break-lock", is_flag=True, help="Take a stale lock whose holder cannot be checked.")
@click.option("--reports", "reports_dir", default="reports", metavar="DIR", show_default=True,
              help="Where reports/<host>/ go (a JSON per night, index.html, trend.svg).")
@click.option("--schedule", "schedule", default=None, metavar="CRON",
              help='Install a crontab entry that runs this night, e.g. "0 2 * * *".')
@click.option("--unschedule", is_flag=True, help="Remove the crontab entry of this spec and host.")
@click.option("--list-schedules", is_flag=True, help="Show orch's crontab entries (no --host needed).")
@click.argument("spec", required=False)
@output_options
def nightly(out: OutputFlags, where: HostFlags, frozen: bool, force: bool, break_lock: bool,
            reports_dir: str, schedule: str | None, unschedule: bool, list_schedules: bool,
            spec: str | None) -> int:
    """Rebuild SPEC (default: playbooks/nightly.yaml) on the hosts from its pin: build beside
    the live server, patch with the stack, switch once, probe, write the manifest and report.

    Exit codes: 0 the night is current; 1 it failed after the switch and the
    host was switched back; 2 refused or failed before the switch (nothing
    live touched); 3 the host is not known to be healthy.
    """
    if where.list_hosts:
        from orchestrator.cli.hostlist import list_hosts

        where.require()
        return list_hosts(out, where)
    output = out.output()
    if list_schedules:
        return _list_schedules(output, out.as_json)
    where.require()
    if schedule is not None or unschedule:
        return _schedule(output, out.as_json, where, spec, reports_dir, frozen, schedule, unschedule)
    return _run(output, out.as_json, where, spec, reports_dir, frozen, force, break_lock)


def _run(output: Output, as_json: bool, where: HostFlags, spec: str | None, reports_dir: str,
         frozen: bool, force: bool, break_lock: bool) -> int:
    from orchestrator.cli.views import ConsoleReporter, print_summary
    from orchestrator.pipeline.nightly import NightOptions, nightly_host
    from orchestrator.pipeline.nightly_late import write_late
    from orchestrator.pipeline.nightly_report import host_rows, notify, write_report
    from orchestrator.pipeline.report import RunReport
    from orchestrator.shell.nightly_files import find_nightly, load_nightly

    variables = where.variables()
    loaded = load_nightly(find_nightly(spec))
    targets = where.targets()
    reporter = ConsoleReporter(output, planned_view=False)
    options = where.connect(output, break_lock=break_lock)
    report = RunReport()
    for target in targets:
        result = nightly_host(target, loaded, variables, options, reporter, NightOptions(frozen, force))
        if (late := result.late) is not None:  # a night before this one ended without its controller
            path = write_late(Path(reports_dir), late, None)
            reporter.step(target.name, f"report of night {late.result.name} (ended without its controller): {path}")
        rows, unread = host_rows(target, options) if result.outcome in READABLE else (None, None)
        files = write_report(Path(reports_dir), result, loaded.model.name, loaded.display, rows)
        for note in files.notes:
            reporter.note(target.name, note)
        if unread:
            reporter.event(target.name, events.HistoryUnread(unread))
        chart = f", chart {files.chart}" if files.chart else ""  # never a path to a chart not drawn
        reporter.step(target.name, f"report: {files.json} (page {files.index}{chart})")
        if loaded.model.notify:
            warning = notify(loaded.model.notify, result, files)
            if warning:
                reporter.warn(target.name, warning)
        host_report = result.host_report()
        host_report.extra["report"] = str(files.json)
        report.hosts[target.name] = host_report
    print_summary(output, report)
    if as_json:
        output.emit_json(report.to_json())
    return report.exit_code


READABLE = (Outcome.CHANGED, Outcome.ROLLED_BACK, Outcome.FAILED)
"""Outcomes after which the host answered: its history is read again for the page's words
(never after ``unreachable`` or a failed switch back: that read would wait on a dead link)."""


def _absolute(path: str | None) -> str | None:
    return str(Path(path).expanduser().resolve()) if path else None


def _schedule(output: Output, as_json: bool, where: HostFlags, spec: str | None, reports_dir: str,
              frozen: bool, schedule: str | None, unschedule: bool) -> int:
    """Install (or remove) the crontab entry that runs this very command, with absolute paths."""
    from orchestrator.core.schedule import (
        add_entry,
        check_schedule,
        cron_command,
        remove_entry,
        schedule_key,
    )
    from orchestrator.errors import ConfigError
    from orchestrator.shell.crontab import read_crontab, write_crontab
    from orchestrator.shell.nightly_files import find_nightly, load_nightly

    spec_path = find_nightly(spec).resolve()
    load_nightly(spec_path)  # refuse a broken spec now, not at 2 a.m.
    key = schedule_key(",".join(where.hosts), str(spec_path))
    before = read_crontab()
    if unschedule:
        text, found = remove_entry(before or "", key)
        if not found:
            raise ConfigError(f"no orch entry for {key} in the crontab", key="--unschedule")
        write_crontab(text or None)  # nothing left: no crontab, as before the first --schedule
        return _said(output, as_json, {"unscheduled": key})
    expression = check_schedule(schedule or "")
    inventory = _absolute(where.inventory) or (_absolute("inventory.yaml") if Path("inventory.yaml").is_file()
                                               else None)
    reports = Path(reports_dir).expanduser().resolve()
    reports.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "orchestrator", "nightly", str(spec_path)]
    for host in where.hosts:
        argv += ["--host", host]
    if inventory:
        argv += ["-i", inventory]
    for item in where.cli_vars:
        argv += ["--var", item]
    if where.ssh_config:
        argv += ["--ssh-config", str(_absolute(where.ssh_config))]
    if frozen:
        argv.append("--frozen")
    argv += ["--reports", str(reports)]
    command = cron_command(argv, os.getcwd(), str(reports / "cron.log"))
    write_crontab(add_entry(before or "", key, expression, command))
    return _said(output, as_json, {"scheduled": key, "schedule": expression, "command": command})


def _list_schedules(output: Output, as_json: bool) -> int:
    from orchestrator.core.schedule import list_entries
    from orchestrator.shell.crontab import read_crontab

    entries = list_entries(read_crontab() or "")
    if not output.quiet:
        if not entries:
            output.line("no orch nightly entries in the crontab")
        for e in entries:
            output.line(f"{e.schedule}  {e.key}", "bold")
            output.line(f"  {e.command}")
    if as_json:
        output.emit_json({"exit_code": 0, "error": None, "hosts": {}, "schedules": [
            {"key": e.key, "schedule": e.schedule, "command": e.command} for e in entries]})
    return 0


def _said(output: Output, as_json: bool, data: dict[str, Any]) -> int:
    if not output.quiet:
        for k, v in data.items():
            output.line(f"{k}: {v}")
    if as_json:
        output.emit_json({"exit_code": 0, "error": None, "hosts": {}, **data})
    return 0
