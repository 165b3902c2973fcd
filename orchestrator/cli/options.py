"""The options commands share, and what they turn into.

Three groups, each one decorator, so a new command (in its own module) takes
the same words with the same meaning:

- ``output_options``: ``--json``, ``-v``/``-vv``, ``-q``, ``--color/--no-color``;
- ``host_options``: ``--host``, ``--limit``, ``-i``, ``--var``, ``--ssh-config``,
  ``--accept-new-host-key``, ``--forks``, ``--connect-timeout``, ``--link-timeout``;
- ``batch_options`` (deploy): ``--serial``, ``--max-fail-percent``,
  ``--rollback-all-on-failure``.

Only Click is imported at module level: ``orch --help`` stays fast, and
shell completion (``_ORCH_COMPLETE``) too.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.shell_completion import CompletionItem

if TYPE_CHECKING:
    from orchestrator.cli.output import Output
    from orchestrator.core.settings import Settings
    from orchestrator.core.target import HostTarget
    from orchestrator.pipeline.fleet import FleetPlan
    from orchestrator.pipeline.session import ConnectOptions
    from orchestrator.shell.config_files import FoundConfig

F = Callable[..., Any]

LINK_TIMEOUT_FLOOR = 3.0
"""``host.wire.LINK_TIMEOUT_FLOOR``, the shortest link timeout, written out: only Click is
imported here (``tests/test_settings.py`` holds the two equal)."""

HOST_HELP = (
    "An inventory host, a group, `all`, an IP address, a Host of the ssh config, or an "
    "explicit user@name[:port] / ssh://name; repeatable. Any other name is refused."
)


@dataclass(frozen=True)
class OutputFlags:
    """``--json``, verbosity and colour, as given."""

    as_json: bool = False
    verbosity: int = 0
    color: bool | None = None  # in effect: --color/--no-color, else NO_COLOR, else the config file
    color_flag: bool | None = None  # --color/--no-color as typed (orch config names the source)

    def output(self) -> Output:
        from orchestrator.cli.output import make_output

        return make_output(as_json=self.as_json, color=self.color, verbosity=self.verbosity)


def output_options(fn: F) -> F:
    """``--json``, ``-v``/``-vv``, ``-q`` and ``--color/--no-color``, gathered into ``out: OutputFlags``."""

    fn = click.option("--color/--no-color", "color", default=None,
                      help="Colour even off a terminal, or never (default: on a terminal, "
                           "unless NO_COLOR is set).")(fn)
    fn = click.option("-q", "--quiet", is_flag=True,
                      help="Only each host's outcome, warnings and errors.")(fn)
    fn = click.option("-v", "--verbose", count=True,
                      help="-v: also each request to the host's helper, the commands it runs "
                           "there, and every event; -vv: every helper protocol line.")(fn)
    fn = click.option("--json", "as_json", is_flag=True,
                      help="Print a JSON report on stdout, on every run (errors too); "
                           "human output goes to stderr.")(fn)
    return _collect(fn, ("as_json", "verbose", "quiet", "color"), "out", _output_flags)


def _output_flags(as_json: bool, verbose: int, quiet: bool, color: bool | None) -> OutputFlags:
    if quiet and verbose:
        raise click.UsageError("-q and -v cannot be used together")
    in_effect = settings_in_effect({"color": color}).color.value
    return OutputFlags(as_json=as_json, verbosity=-1 if quiet else min(verbose, 2), color=in_effect,
                       color_flag=color)


def settings_in_effect(flags: dict[str, Any]) -> Settings:
    """orch's settings from ``flags`` (those given), the environment and the config file.

    The config file is found and read once per process; a warning about a
    file that was skipped is printed once, on stderr.
    """
    from orchestrator.core.settings import resolve_settings

    found = _config_file()
    return resolve_settings(flags, os.environ, found.model, found.path)


def var_options(items: Sequence[str]) -> dict[str, Any]:
    """``--var`` in command-line order; ``@file.yaml`` read here, where files may be read."""
    from orchestrator.core.rendering import parse_cli_vars
    from orchestrator.shell.config_files import read_var_file

    return parse_cli_vars([read_var_file(item[1:]) if item.startswith("@") else item for item in items])


@functools.cache
def _config_file() -> FoundConfig:
    from orchestrator.shell.config_files import find_config

    found = find_config(os.environ)
    if found.warning:
        click.echo(f"orch: warning: {found.warning}", err=True)
    return found


@dataclass(frozen=True)
class HostFlags:
    """``--host`` and how to reach the hosts, as given."""

    hosts: tuple[str, ...]
    inventory: str | None
    cli_vars: tuple[str, ...]
    ssh_config: str | None
    accept_new_host_key: bool
    limit: str | None = None
    forks: int = 10
    connect_timeout: float = 10.0
    link_timeout: float = 30.0  # in effect: --link-timeout, else ORCH_LINK_TIMEOUT, else the config file
    list_hosts: bool = False

    def targets(self) -> list[HostTarget]:
        """The selected hosts, narrowed by ``--limit``; a bare word in no inventory is
        refused before any lookup, and so is a limit term that matches nothing."""
        from orchestrator.core.inventory import resolve_hosts
        from orchestrator.core.selection import apply_limit, limit_files
        from orchestrator.shell.config_files import (
            load_inventory,
            read_retry_file,
            ssh_host_aliases,
        )

        inv, filename = load_inventory(self.inventory)
        if self.inventory is None and not Path(filename).is_file():
            filename = f"no ./{filename} here; -i PATH names one"
        targets = resolve_hosts(inv, list(self.hosts), filename=filename,
                                ssh_aliases=lambda: ssh_host_aliases(self.ssh_config))
        if self.limit is None:
            return targets
        files = {name: read_retry_file(name) for name in limit_files(self.limit)}
        kept = set(apply_limit([t.name for t in targets], self.limit, hosts=list(inv.hosts),
                               groups=inv.groups, files=files))
        return [t for t in targets if t.name in kept]

    def require(self) -> None:
        """Fail as Click does for a missing required ``--host`` (see ``host_options``)."""
        if not self.hosts:
            raise click.MissingParameter(ctx=click.get_current_context(silent=True), param_type="option",
                                         param_hint="'--host'")

    def variables(self) -> dict[str, Any]:
        return var_options(self.cli_vars)

    def connect(self, output: Output, *, break_lock: bool = False) -> ConnectOptions:
        """How to reach the hosts; the pipeline shares ``output``'s masker (one per run)."""
        from orchestrator.cli.words import line
        from orchestrator.pipeline.session import ConnectOptions

        return ConnectOptions(accept_new_host_key=self.accept_new_host_key,
                              ssh_config_path=self.ssh_config, break_lock=break_lock,
                              connect_timeout=self.connect_timeout, link_timeout=self.link_timeout,
                              masker=output.masker, words=line)

    def fleet(self, batches: BatchFlags | None = None) -> FleetPlan:
        """How many hosts at once, and (deploy) in which batches."""
        from orchestrator.pipeline.fleet import FleetPlan

        if batches is None:
            return FleetPlan(forks=self.forks)
        return batches.plan(self.forks)


def host_options(fn: F | None = None, *, required: bool = True) -> Any:
    """The options of every command that talks to hosts, gathered into ``where: HostFlags``.

    ``@host_options(required=False)``: for a command with a mode that needs no
    host (``orch nightly --list-schedules``); it calls ``where.require()``
    where a host is needed, which fails as a missing ``--host`` does.
    """

    def decorate(fn: F) -> F:
        fn = click.option("--list-hosts", "list_hosts", is_flag=True,
                          help="Print the hosts selected (and, with --serial, their batches); "
                               "resolve and contact nothing.")(fn)
        fn = click.option("--connect-timeout", "connect_timeout", default=10.0, show_default=True,
                          type=click.FloatRange(min=0.1), metavar="SECONDS",
                          help="How long to wait for a host's SSH connection before it is unreachable.")(fn)
        fn = click.option("--link-timeout", "link_timeout", default=None, metavar="SECONDS",
                          type=click.FloatRange(min=LINK_TIMEOUT_FLOOR, max=float("inf"), max_open=True),
                          help="How long a connected host's link may stay silent before it is taken "
                               "for lost (the host's helper keeps the same limit); else "
                               "ORCH_LINK_TIMEOUT, else the config file, else 30.")(fn)
        fn = click.option("--forks", default=None, type=click.IntRange(min=1), metavar="N",
                          help="How many hosts at once (each with its own connection); "
                               "else ORCH_FORKS, else the config file, else 10.")(fn)
        fn = click.option("--limit", default=None, metavar="PATTERN",
                          help="Narrow the selected hosts: globs over host and group names, "
                               "'!' excludes, '&' intersects, @FILE reads a retry file "
                               "(e.g. 'gpu*:!gpu07', 'blackwell:&rack2', @orch.retry).")(fn)
        fn = click.option("--ssh-config", "ssh_config", default=None, metavar="PATH",
                          type=click.Path(dir_okay=False),
                          help="ssh_config file to read instead of ~/.ssh/config "
                               "(else ORCH_SSH_CONFIG, else the config file).")(fn)
        fn = click.option("--accept-new-host-key", is_flag=True,
                          help="Add an unknown SSH host key to known_hosts (never a changed one).")(fn)
        fn = click.option("--var", "cli_vars", multiple=True, metavar="K=V|@FILE",
                          help="Set a variable, k=v (value read as YAML), or every top-level key "
                               "of a YAML file (@vars.yaml); repeatable, later wins; wins over "
                               "every other source.")(fn)
        fn = click.option("-i", "--inventory", default=None, metavar="PATH",
                          type=click.Path(dir_okay=False),
                          help="Inventory file (else ORCH_INVENTORY, else the config file, "
                               "else ./inventory.yaml if present).")(fn)
        fn = click.option("--host", "hosts", multiple=True, required=required, metavar="H",
                          shell_complete=complete_hosts, help=HOST_HELP)(fn)
        return _collect(fn, ("hosts", "inventory", "cli_vars", "ssh_config", "accept_new_host_key", "limit",
                             "forks", "connect_timeout", "link_timeout", "list_hosts"), "where", _host_flags)

    return decorate(fn) if fn is not None else decorate


def _host_flags(*, inventory: str | None, ssh_config: str | None, forks: int | None,
                link_timeout: float | None, **given: Any) -> HostFlags:
    """``HostFlags`` with the inventory, ssh_config, forks and link timeout in effect (flag > env > file)."""
    settings = settings_in_effect({"inventory": inventory, "ssh_config": ssh_config, "forks": forks,
                                   "link_timeout": link_timeout})
    return HostFlags(inventory=settings.inventory.value, ssh_config=settings.ssh_config.value,
                     forks=settings.forks.value, link_timeout=settings.link_timeout.value, **given)


@dataclass(frozen=True)
class BatchFlags:
    """``--serial``, ``--max-fail-percent`` and ``--rollback-all-on-failure``, as given."""

    serial: str | None = None
    max_fail_percent: str | None = None
    rollback_all_on_failure: bool = False

    def plan(self, forks: int) -> FleetPlan:
        """The parsed plan; ``ConfigError`` (exit 2, one line) before any host is contacted.

        ``--rollback-all-on-failure`` without ``--max-fail-percent`` means 0:
        all or nothing, any failure fails its batch.
        """
        from fractions import Fraction

        from orchestrator.core.selection import parse_max_fail_percent, parse_serial
        from orchestrator.pipeline.fleet import FleetPlan

        serial = tuple(parse_serial(self.serial)) if self.serial is not None else ()
        if self.max_fail_percent is not None:
            limit: Fraction | None = parse_max_fail_percent(self.max_fail_percent)
        else:
            limit = Fraction(0) if self.rollback_all_on_failure else None
        return FleetPlan(forks=forks, serial=serial, max_fail_percent=limit)


def batch_options(fn: F) -> F:
    """Canary and batches (``deploy``), gathered into ``batches: BatchFlags``."""
    fn = click.option("--rollback-all-on-failure", is_flag=True,
                      help="When a batch fails, also roll back that batch's hosts that succeeded "
                           "(implies --max-fail-percent 0 unless given).")(fn)
    fn = click.option("--max-fail-percent", default=None, metavar="P",
                      help="Stop before the next batch when more than P% of a batch failed "
                           "(0: at the first failure). A batch that failed entirely always stops.")(fn)
    fn = click.option("--serial", default=None, metavar="N|N%|LIST",
                      help="Deploy in batches: N hosts, N% of them, or a list such as 1,25%,100% "
                           "(a canary, then growing batches; the last size repeats).")(fn)
    return _collect(fn, ("serial", "max_fail_percent", "rollback_all_on_failure"), "batches", BatchFlags)


def _collect(fn: F, names: Sequence[str], into: str, build: Callable[..., Any]) -> F:
    """Wrap ``fn`` so the options ``names`` arrive as one value ``into``."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs[into] = build(**{name: kwargs.pop(name) for name in names})
        return fn(*args, **kwargs)

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    wrapper.__click_params__ = getattr(fn, "__click_params__", [])  # type: ignore[attr-defined]
    return wrapper


# ----------------------------------------------------------------- completion


def complete_hosts(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Inventory hosts, groups and ``all`` (from ``-i`` if already typed)."""
    try:
        from orchestrator.shell.config_files import load_inventory

        inv, _ = load_inventory(ctx.params.get("inventory"))
    except Exception:  # noqa: BLE001 - completion must never print an error
        return []
    names = [*inv.hosts, *inv.groups, "all"]
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]


def complete_playbooks(_ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Playbook names in ./playbooks and the shipped ones, then files."""
    from orchestrator.shell.config_files import packaged_dir

    names: dict[str, None] = {}
    for folder in (Path("playbooks"), packaged_dir("playbooks")):
        for path in sorted(folder.glob("*.y*ml")):
            names.setdefault(path.stem, None)
    found = [CompletionItem(n) for n in names if n.startswith(incomplete)]
    return found or [CompletionItem(incomplete, type="file")]
