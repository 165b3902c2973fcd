"""``orch lint``: everything a deploy would refuse that can be known without a host.

For a CI step before a deploy: the inventory and each playbook are parsed
and checked against their schema, then each playbook is rendered for every
inventory host with that host's vars (``defaults.vars`` overlaid by its
own, ``--var`` on top), exactly as a deploy renders it — file paths,
templates and inline content, commands word by word, flags, health checks,
and ``validate`` commands with a stand-in ``{{ staged }}``. A template
syntax error or an undefined variable is found here, with its
``file:line: key``. No host is contacted, so anchors (which need the
target file) are not checked.

A problem found the same way for several hosts is reported once, naming
them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.core.inventory import host_target
from orchestrator.core.models import Inventory
from orchestrator.core.rendering import render_playbook, render_validate, vars_for_host
from orchestrator.core.target import HostTarget
from orchestrator.core.yamlsrc import load_yaml
from orchestrator.errors import ConfigError
from orchestrator.shell.config_files import (
    LoadedPlaybook,
    load_inventory,
    load_playbook,
    make_renderer,
)

STAGED = "/orch-lint/.staged-copy"
"""What ``{{ staged }}`` renders to while linting (the real one exists only on the host)."""

DEFAULTS_ONLY = "(defaults)"
"""The pseudo-host a playbook is rendered for when the inventory has no hosts."""


@dataclass
class Problem:
    """One refusal, as a deploy would print it, and the hosts it applies to."""

    message: str
    hosts: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if not self.hosts:
            return self.message
        return f"{self.message} (for host{'s' if len(self.hosts) > 1 else ''} {', '.join(self.hosts)})"

    def to_json(self) -> dict[str, Any]:
        return {"error": self.message, "hosts": list(self.hosts)}


@dataclass
class LintReport:
    inventory: str | None
    hosts: list[str]
    playbooks: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 2 if self.problems else 0

    def add(self, message: str, host: str | None = None) -> None:
        for known in self.problems:
            if known.message == message:
                if host and host not in known.hosts:
                    known.hosts.append(host)
                return
        self.problems.append(Problem(message, [host] if host else []))

    def to_json(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "error": None,
            "hosts": {},
            "inventory": self.inventory,
            "rendered_for": self.hosts,
            "playbooks": self.playbooks,
            "skipped": self.skipped,
            "problems": [p.to_json() for p in self.problems],
        }


def lint(playbooks: list[Path], inventory: str | None, cli_vars: dict[str, Any]) -> LintReport:
    """Check ``inventory`` and ``playbooks``; never raises for what it checks."""
    try:
        inv, inv_name = load_inventory(inventory)
    except ConfigError as e:
        report = LintReport(inventory, [])
        report.add(str(e))
        inv, inv_name = Inventory(), inventory or "inventory.yaml"
    else:
        report = LintReport(inv_name if (inventory or inv.hosts or inv.groups) else None, [])
    targets = render_targets(inv)
    report.hosts = [t.name for t in targets]
    for path in playbooks:
        try:
            loaded = load_playbook(path)
        except ConfigError as e:
            if is_nightly_spec(path):
                report.skipped.append(f"{path}: a nightly spec, not a playbook")
                continue
            report.add(str(e))
            continue
        report.playbooks.append(loaded.display)
        for target in targets:
            problem = render_problem(loaded, target, cli_vars)
            if problem is not None:
                report.add(problem, None if target.name == DEFAULTS_ONLY else target.name)
    return report


def render_targets(inv: Inventory) -> list[HostTarget]:
    """Every inventory host (their vars), or one with ``defaults`` only when there are none."""
    if not inv.hosts:
        return [HostTarget(name=DEFAULTS_ONLY, vars=dict(inv.defaults.vars))]
    return [host_target(inv, name) for name in inv.hosts]


def render_problem(loaded: LoadedPlaybook, target: HostTarget, cli_vars: dict[str, Any]) -> str | None:
    """The first thing that stops ``loaded`` from rendering for ``target``, or None."""
    renderer = make_renderer(loaded)
    variables = vars_for_host(loaded.model, target, cli_vars)
    try:
        rendered = render_playbook(loaded.model, loaded.locations, {"command": "", **variables},
                                   renderer)
        for entry in rendered.files:
            for step in entry.validate:
                render_validate(step, variables, STAGED, renderer)
    except ConfigError as e:
        return str(e.located(file=loaded.display))
    return None


def is_nightly_spec(path: Path) -> bool:
    """A nightly spec (``source:`` and ``stack:``) lives beside playbooks; ``orch nightly`` reads it."""
    try:
        data = load_yaml(path.read_text(encoding="utf-8"), str(path)).data
    except (OSError, UnicodeDecodeError, ConfigError):
        return False
    return isinstance(data, dict) and "source" in data and "stack" in data
