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

What only the host knows is not an error here: ``facts.*`` and the
defaults derived from them (``sglang_root``, ``vllm_root`` where no var sets
them) render as unknown values, true as conditions so what they guard is
still checked. Any other undefined variable is an error when an inventory
was found (``-i``, else ``./inventory.yaml``, as every command finds one) and
a warning ("not checked: no inventory") when none was: the inventory is
where such vars usually come from. Every undefined name is reported, not
only the first; every schema error of a file too.

A problem found the same way for several hosts is reported once, naming
them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.core.facts import ROOT_VARS, Unknown
from orchestrator.core.inventory import host_target
from orchestrator.core.models import Inventory
from orchestrator.core.outcomes import lint_exit_code
from orchestrator.core.rendering import render_playbook, render_validate, vars_for_host
from orchestrator.core.target import HostTarget
from orchestrator.core.yamlsrc import load_yaml
from orchestrator.errors import ConfigError
from orchestrator.shell.config_files import (
    DEFAULT_INVENTORY,
    LoadedPlaybook,
    load_inventory,
    load_playbook,
    make_renderer,
)

STAGED = "/orch-lint/.staged-copy"
"""What ``{{ staged }}`` renders to while linting (the real one exists only on the host)."""

DEFAULTS_ONLY = "(defaults)"
"""The pseudo-host a playbook is rendered for when the inventory has no hosts."""

NO_INVENTORY = "not checked: no inventory"
"""Why an undefined variable is only a warning: no inventory was found to give it."""

MAX_UNDEFINED = 50
"""Undefined names reported per playbook and host before giving up (each costs a render)."""

_UNDEFINED = re.compile(r"^'([A-Za-z_]\w*)' is undefined$")


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
    warnings: list[Problem] = field(default_factory=list)
    given: int = 0  # the files named on the command line (or the default one)

    @property
    def exit_code(self) -> int:
        return lint_exit_code(len(self.problems))

    def add(self, message: str, host: str | None = None, *, warning: bool = False) -> None:
        found = self.warnings if warning else self.problems
        for known in found:
            if known.message == message:
                if host and host not in known.hosts:
                    known.hosts.append(host)
                return
        found.append(Problem(message, [host] if host else []))

    def to_json(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "error": None,
            "hosts": {},
            "inventory": self.inventory,
            "rendered_for": self.hosts,
            "given": self.given,
            "playbooks": self.playbooks,
            "skipped": self.skipped,
            "problems": [p.to_json() for p in self.problems],
            "warnings": [p.to_json() for p in self.warnings],
        }


def lint(playbooks: list[Path], inventory: str | None, cli_vars: dict[str, Any]) -> LintReport:
    """Check ``inventory`` and ``playbooks``; never raises for what it checks."""
    found = inventory is not None or Path(DEFAULT_INVENTORY).is_file()
    try:
        inv, inv_name = load_inventory(inventory)
    except ConfigError as e:
        report = LintReport(inventory, [])
        for problem in every_problem(e):
            report.add(problem)
        inv, inv_name = Inventory(), inventory or DEFAULT_INVENTORY
    else:
        report = LintReport(inv_name if found else None, [])
    report.given = len(playbooks)
    targets = render_targets(inv)
    report.hosts = [t.name for t in targets]
    for path in playbooks:
        try:
            loaded = load_playbook(path)
        except ConfigError as e:
            if is_nightly_spec(path):
                report.skipped.append(f"{path}: a nightly spec, not a playbook")
                continue
            for problem in every_problem(e):
                report.add(problem)
            continue
        report.playbooks.append(loaded.display)
        for target in targets:
            host = None if target.name == DEFAULTS_ONLY else target.name
            for message, warning in render_problems(loaded, target, cli_vars, inventory_found=found):
                report.add(message, host, warning=warning)
    return report


def every_problem(error: ConfigError) -> list[str]:
    """Each schema problem of the file ``error`` is the first of (one line each)."""
    return [str(p) for p in getattr(error, "problems", ()) or (error,)]


def render_targets(inv: Inventory) -> list[HostTarget]:
    """Every inventory host (their vars), or one with ``defaults`` only when there are none."""
    if not inv.hosts:
        return [HostTarget(name=DEFAULTS_ONLY, vars=dict(inv.defaults.vars))]
    return [host_target(inv, name) for name in inv.hosts]


def host_only_vars(variables: dict[str, Any]) -> dict[str, Any]:
    """What only the host can tell, as ``Unknown``: ``facts``, and each fact-derived default
    (``sglang_root``, ``vllm_root``) that no var sets."""
    unknown: dict[str, Any] = {"facts": Unknown("facts")}
    unknown.update({var: Unknown(var) for var in ROOT_VARS if var not in variables})
    return unknown


def render_problems(
    loaded: LoadedPlaybook, target: HostTarget, cli_vars: dict[str, Any], *, inventory_found: bool = True
) -> list[tuple[str, bool]]:
    """Everything that stops ``loaded`` from rendering for ``target``: (message, is a warning).

    An undefined variable is recorded, then stood in for by an ``Unknown`` and the
    render tried again, so one run names every undefined variable (and what comes
    after them). Without an inventory, undefined variables are warnings.
    """
    renderer = make_renderer(loaded)
    variables = vars_for_host(loaded.model, target, cli_vars)
    variables = {**host_only_vars(variables), "command": "", **variables}
    out: list[tuple[str, bool]] = []
    for _ in range(MAX_UNDEFINED):
        try:
            rendered = render_playbook(loaded.model, loaded.locations, variables, renderer)
            for entry in rendered.files:
                for step in entry.validate:
                    render_validate(step, variables, STAGED, renderer)
            return out
        except ConfigError as e:
            located = e.located(file=loaded.display)
            match = _UNDEFINED.match(e.message)
            if match is None or match.group(1) in variables:
                out.append((str(located), False))
                return out
            if inventory_found:
                out.append((str(located), False))
            else:
                out.append((f"{located} ({NO_INVENTORY})", True))
            variables[match.group(1)] = Unknown(match.group(1))
    return out


def is_nightly_spec(path: Path) -> bool:
    """A nightly spec (``source:`` and ``stack:``) lives beside playbooks; ``orch nightly`` reads it."""
    try:
        data = load_yaml(path.read_text(encoding="utf-8"), str(path)).data
    except (OSError, UnicodeDecodeError, ConfigError):
        return False
    return isinstance(data, dict) and "source" in data and "stack" in data
