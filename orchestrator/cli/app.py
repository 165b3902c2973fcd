"""The ``orch`` command line.

Heavy modules (Fabric, Paramiko, Rich, Jinja2) are imported inside the
commands, so ``orch --help`` and ``orch --version`` start fast. Errors are
mapped to exit codes in one place, ``main``: an ``OrchError`` carries its
own ``exit_code`` and prints as one line, never a traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import click

from orchestrator import __version__
from orchestrator.errors import OrchError

COMMON_HELP = {
    "inventory": "Inventory file (default: ./inventory.yaml if present).",
    "var": "Set a variable, k=v (value read as YAML); repeatable; wins over every other source.",
    "json": "Print a machine-readable report on stdout (human output goes to stderr).",
    "accept": "Add an unknown SSH host key to known_hosts (never a changed one).",
}


def common(fn: Any) -> Any:
    """Options every host command takes."""
    fn = click.option("--ssh-config", "ssh_config", default=None, metavar="PATH",
                      help="ssh_config file to read instead of ~/.ssh/config.")(fn)
    fn = click.option("--accept-new-host-key", is_flag=True, help=COMMON_HELP["accept"])(fn)
    fn = click.option("--json", "as_json", is_flag=True, help=COMMON_HELP["json"])(fn)
    fn = click.option("--var", "cli_vars", multiple=True, metavar="K=V", help=COMMON_HELP["var"])(fn)
    fn = click.option("-i", "--inventory", default=None, metavar="PATH", help=COMMON_HELP["inventory"])(fn)
    fn = click.option("--host", "hosts", multiple=True, required=True, metavar="H",
                      help="A host name, a group, `all`, or [user@]address[:port]; repeatable.")(fn)
    return fn


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="orch")
def cli() -> None:
    """Change code and flags on remote inference servers, and never leave a box broken."""


def _console(as_json: bool) -> Any:
    from rich.console import Console

    return Console(stderr=as_json, highlight=False)


def _targets(hosts: Sequence[str], inventory: str | None) -> list[Any]:
    from orchestrator.core.inventory import resolve_hosts
    from orchestrator.shell.config_files import load_inventory

    inv, filename = load_inventory(inventory)
    return resolve_hosts(inv, list(hosts), filename=filename)


def _options(accept_new_host_key: bool, ssh_config: str | None, break_lock: bool = False) -> Any:
    from orchestrator.pipeline.session import ConnectOptions

    return ConnectOptions(accept_new_host_key=accept_new_host_key, ssh_config_path=ssh_config,
                          break_lock=break_lock)


def _finish(report: Any, as_json: bool, console: Any) -> None:
    from orchestrator.cli.views import print_summary

    print_summary(console, report)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2, sort_keys=True))
    sys.exit(report.exit_code)


@cli.command()
@common
@click.option("--check", is_flag=True, help="Plan, render, stage and validate; change nothing.")
@click.option("--break-lock", is_flag=True, help="Take a stale lock whose holder cannot be checked.")
@click.argument("playbook", required=False)
def deploy(hosts: tuple[str, ...], inventory: str | None, cli_vars: tuple[str, ...], as_json: bool,
           accept_new_host_key: bool, ssh_config: str | None, check: bool, break_lock: bool,
           playbook: str | None) -> None:
    """Deploy PLAYBOOK (default playbooks/site.yaml) on the hosts; roll back on failure."""
    from orchestrator.cli.views import RichReporter
    from orchestrator.core.rendering import parse_cli_vars
    from orchestrator.pipeline.deploy import deploy_host
    from orchestrator.pipeline.report import RunReport
    from orchestrator.shell.config_files import find_playbook, load_playbook

    console = _console(as_json)
    variables = parse_cli_vars(list(cli_vars))
    loaded = load_playbook(find_playbook(playbook))
    targets = _targets(hosts, inventory)
    options = _options(accept_new_host_key, ssh_config, break_lock)
    reporter = RichReporter(console)
    report = RunReport()
    for target in targets:
        report.hosts[target.name] = deploy_host(target, loaded, variables, options, reporter, check=check)
    _finish(report, as_json, console)


@cli.command()
@common
@click.option("--to", "to", default=None, metavar="RELEASE", help="Put the host in the state right after RELEASE.")
@click.option("--break-lock", is_flag=True, help="Take a stale lock whose holder cannot be checked.")
def rollback(hosts: tuple[str, ...], inventory: str | None, cli_vars: tuple[str, ...], as_json: bool,
             accept_new_host_key: bool, ssh_config: str | None, to: str | None, break_lock: bool) -> None:
    """Undo the current release (again: one further back), restart, health-check."""
    from orchestrator.cli.views import RichReporter
    from orchestrator.pipeline.report import RunReport
    from orchestrator.pipeline.rollback import rollback_host

    console = _console(as_json)
    options = _options(accept_new_host_key, ssh_config, break_lock)
    report = RunReport()
    for target in _targets(hosts, inventory):
        report.hosts[target.name] = rollback_host(target, to, options, RichReporter(console))
    _finish(report, as_json, console)


@cli.command()
@common
def history(hosts: tuple[str, ...], inventory: str | None, cli_vars: tuple[str, ...], as_json: bool,
            accept_new_host_key: bool, ssh_config: str | None) -> None:
    """Releases and rollbacks on the hosts: id, time, playbook, files, flags, outcome."""
    from orchestrator.cli.views import history_table
    from orchestrator.pipeline.inspect import history_rows, read_state

    console = _console(as_json)
    options = _options(accept_new_host_key, ssh_config)
    out: dict[str, Any] = {}
    for target in _targets(hosts, inventory):
        rows = history_rows(read_state(target, options))
        out[target.name] = [r.to_json() for r in rows]
        console.print(history_table(target.name, rows))
    if as_json:
        click.echo(json.dumps({"exit_code": 0, "hosts": out}, indent=2, sort_keys=True))


@cli.command()
@common
def status(hosts: tuple[str, ...], inventory: str | None, cli_vars: tuple[str, ...], as_json: bool,
           accept_new_host_key: bool, ssh_config: str | None) -> None:
    """Current release, server process, health now, and drift since the release."""
    from orchestrator.cli.views import status_panel
    from orchestrator.pipeline.inspect import host_status

    console = _console(as_json)
    options = _options(accept_new_host_key, ssh_config)
    out: dict[str, Any] = {}
    for target in _targets(hosts, inventory):
        st = host_status(target, options)
        out[target.name] = st.to_json()
        console.print(status_panel(st))
    if as_json:
        click.echo(json.dumps({"exit_code": 0, "hosts": out}, indent=2, sort_keys=True, default=str))


import orchestrator.cli.nightly_cmd  # noqa: E402, F401  (registers `orch nightly`)


@cli.command()
@click.option("--keep", is_flag=True, help="Leave the sandbox directory (and stop the server) for a look.")
def demo(keep: bool) -> None:
    """The embedded default: a local sandbox with the stand-in server, end to end."""
    from orchestrator.demo import run_demo

    sys.exit(run_demo(keep=keep))


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: the one place where errors become exit codes."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="orch", standalone_mode=False)
    except OrchError as e:
        click.echo(f"orch: error: {e}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("orch: interrupted", err=True)
        sys.exit(1)
    except click.ClickException as e:
        e.show()
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("orch: interrupted", err=True)
        sys.exit(1)
    sys.exit(0)
