"""How long the host-side watchdog waits before it restores by itself.

The deadline is derived here and nowhere else, as the sum of what the
steps after the commit may take, plus ``health.confirm_timeout`` of slack.
The watchdog must never act while the controller can still be working
normally (that would restore a deploy the controller is about to confirm,
or race the controller's own rollback), and must act soon enough after
the controller could no longer be working. Each item names the key that
sets it, so ``orch deploy -v`` and the README can show the sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.core.models import Gate, Health, ProbeConfig, Server

COMMIT_ALLOWANCE = 30.0
"""Commit, verification read and the journal writes around them (one round trip each)."""
KILL_GRACE = 10.0
"""After SIGKILL, how long the helper waits for the processes to be gone."""
NO_HEALTH_WAIT = 60.0
"""A playbook without health checks: the restart itself, then confirm."""


@dataclass(frozen=True)
class BudgetItem:
    name: str
    seconds: float
    source: str  # the key (or constant) that sets it

    def __str__(self) -> str:
        return f"{self.name} {self.seconds:g} s ({self.source})"


def restart_items(server: Server | None, health: Health | None) -> list[BudgetItem]:
    """Stopping the old server, starting the new one and waiting for it to be healthy and stable."""
    items: list[BudgetItem] = []
    if server is not None:
        items += [
            BudgetItem("stop", server.stop_timeout + KILL_GRACE, "server.stop_timeout + SIGKILL grace"),
            BudgetItem("port and GPUs free", server.free_timeout, "server.free_timeout"),
        ]
    if health is not None:
        items += [
            BudgetItem("health", health.timeout, "health.timeout"),
            BudgetItem("stable", health.stable_for, "health.stable_for"),
        ]
    else:
        items.append(BudgetItem("start", NO_HEALTH_WAIT, "no health checks"))
    return items


def deploy_budget(
    server: Server | None, health: Health | None, extra: Sequence[BudgetItem] = ()
) -> list[BudgetItem]:
    """Every step after the commit, then the confirm slack.

    ``extra``: steps a playbook adds after the commit (a pre-flight, hooks,
    a performance gate), each with its own timeout.
    """
    items = [BudgetItem("commit and read-back", COMMIT_ALLOWANCE, "fixed")]
    items += list(extra)
    items += restart_items(server, health)
    confirm = health.confirm_timeout if health is not None else 60.0
    items.append(BudgetItem("confirm", confirm, "health.confirm_timeout"))
    return items


def restore_budget(server: Server | None, health: Health | None) -> list[BudgetItem]:
    """How long the controller's own rollback may take before the watchdog backs it up."""
    items = [BudgetItem("files", COMMIT_ALLOWANCE, "fixed"), *restart_items(server, health)]
    if server is not None and server.after_healthy:
        items.append(BudgetItem("put back", server.hook_timeout, "server.hook_timeout"))
    return items


def probe_seconds(probe: ProbeConfig) -> float:
    """The longest one probe (all its rounds) may take on the host.

    The helper bounds each batch of requests by ``timeout × (count //
    concurrency + 2)`` (``probe_batch`` in ``host/probe.py``), and the
    greedy request by ``timeout``.
    """

    def batch(count: int) -> float:
        return probe.timeout * (count // probe.concurrency + 2)

    seconds = probe.rounds * batch(probe.requests)
    if probe.warmup:
        seconds += batch(probe.warmup)
    if probe.greedy:
        seconds += probe.timeout
    return seconds


def gate_items(gate: Gate, *, baseline: bool) -> list[BudgetItem]:
    """A gate's share of the deploy: the new server's probes and their re-probes,
    and, when the baseline is probed before the stop (not taken from a record), that too."""
    one = sum(probe_seconds(p) for p in gate.probes)
    items = [BudgetItem("gate", one, "gate.probes: rounds, requests, timeout")]
    if gate.reprobes:
        items.append(BudgetItem("gate re-probes", one * gate.reprobes, "gate.reprobes"))
    if baseline:
        items.append(BudgetItem("gate baseline", one, "probed before the stop"))
    return items


def total(items: Sequence[BudgetItem]) -> float:
    return sum(item.seconds for item in items)
