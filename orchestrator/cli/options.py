"""The options commands share, and what they turn into.

Two groups, each one decorator, so a new command (in its own module) takes
the same words with the same meaning:

- ``output_options``: ``--json``, ``-v``/``-vv``, ``-q``, ``--color/--no-color``;
- ``host_options``: ``--host``, ``-i``, ``--var``, ``--ssh-config``,
  ``--accept-new-host-key``.

Only Click is imported at module level: ``orch --help`` stays fast, and
shell completion (``_ORCH_COMPLETE``) too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.shell_completion import CompletionItem

if TYPE_CHECKING:
    from orchestrator.cli.output import Output
    from orchestrator.core.target import HostTarget
    from orchestrator.pipeline.session import ConnectOptions

F = Callable[..., Any]

HOST_HELP = (
    "An inventory host, a group, `all`, an IP address, a Host of the ssh config, or an "
    "explicit user@name[:port] / ssh://name; repeatable. Any other name is refused."
)


@dataclass(frozen=True)
class OutputFlags:
    """``--json``, verbosity and colour, as given."""

    as_json: bool = False
    verbosity: int = 0
    color: bool | None = None

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
    return OutputFlags(as_json=as_json, verbosity=-1 if quiet else min(verbose, 2), color=color)


@dataclass(frozen=True)
class HostFlags:
    """``--host`` and how to reach the hosts, as given."""

    hosts: tuple[str, ...]
    inventory: str | None
    cli_vars: tuple[str, ...]
    ssh_config: str | None
    accept_new_host_key: bool

    def targets(self) -> list[HostTarget]:
        """The selected hosts; a bare word in no inventory is refused before any lookup."""
        from orchestrator.core.inventory import resolve_hosts
        from orchestrator.shell.config_files import load_inventory, ssh_host_aliases

        inv, filename = load_inventory(self.inventory)
        if self.inventory is None and not Path(filename).is_file():
            filename = f"no ./{filename} here; -i PATH names one"
        return resolve_hosts(inv, list(self.hosts), filename=filename,
                             ssh_aliases=lambda: ssh_host_aliases(self.ssh_config))

    def require(self) -> None:
        """Fail as Click does for a missing required ``--host`` (see ``host_options``)."""
        if not self.hosts:
            raise click.MissingParameter(ctx=click.get_current_context(silent=True), param_type="option",
                                         param_hint="'--host'")

    def variables(self) -> dict[str, Any]:
        from orchestrator.core.rendering import parse_cli_vars

        return parse_cli_vars(list(self.cli_vars))

    def connect(self, *, break_lock: bool = False) -> ConnectOptions:
        from orchestrator.pipeline.session import ConnectOptions

        return ConnectOptions(accept_new_host_key=self.accept_new_host_key,
                              ssh_config_path=self.ssh_config, break_lock=break_lock)


def host_options(fn: F | None = None, *, required: bool = True) -> Any:
    """The options of every command that talks to hosts, gathered into ``where: HostFlags``.

    ``@host_options(required=False)``: for a command with a mode that needs no
    host (``orch nightly --list-schedules``); it calls ``where.require()``
    where a host is needed, which fails as a missing ``--host`` does.
    """

    def decorate(fn: F) -> F:
        fn = click.option("--ssh-config", "ssh_config", default=None, metavar="PATH",
                          type=click.Path(dir_okay=False),
                          help="ssh_config file to read instead of ~/.ssh/config.")(fn)
        fn = click.option("--accept-new-host-key", is_flag=True,
                          help="Add an unknown SSH host key to known_hosts (never a changed one).")(fn)
        fn = click.option("--var", "cli_vars", multiple=True, metavar="K=V",
                          help="Set a variable, k=v (value read as YAML); repeatable; wins over "
                               "every other source.")(fn)
        fn = click.option("-i", "--inventory", default=None, metavar="PATH",
                          type=click.Path(dir_okay=False),
                          help="Inventory file (default: ./inventory.yaml if present).")(fn)
        fn = click.option("--host", "hosts", multiple=True, required=required, metavar="H",
                          shell_complete=complete_hosts, help=HOST_HELP)(fn)
        return _collect(fn, ("hosts", "inventory", "cli_vars", "ssh_config", "accept_new_host_key"),
                        "where", HostFlags)

    return decorate(fn) if fn is not None else decorate


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
