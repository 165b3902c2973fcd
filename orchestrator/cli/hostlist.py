"""``--list-hosts``: what a command would touch, shown before it touches anything.

Before ``--host all --limit 'gpu*' --serial 1,25%`` reaches fifty GPU
boxes, a person wants to see which ones, in which batches. This resolves
the selection exactly as the command would (inventory, groups, ranges,
``--limit``, ``--serial``) and stops there: no name is looked up, no host
is contacted.
"""

from __future__ import annotations

from orchestrator.cli.options import BatchFlags, HostFlags, OutputFlags


def list_hosts(out: OutputFlags, where: HostFlags, batches: BatchFlags | None = None) -> int:
    """Print the selected hosts (and their batches with ``--serial``); exit 0."""
    from orchestrator.core.selection import plan_batches

    plan = where.fleet(batches)  # a bad --serial is exit 2 here too, as in the real run
    targets = where.targets()
    groups = plan_batches(targets, list(plan.serial) or None) if targets else []
    output = out.output()
    numbered = len(groups) > 1 or bool(plan.serial)
    for number, batch in enumerate(groups, start=1):
        if numbered:
            output.line(f"batch {number} ({len(batch)} host{'s' if len(batch) != 1 else ''}):", "bold")
        for target in batch:
            address = target.address or "local"
            shown = target.name if address == target.name else f"{target.name}  {address}"
            output.line(("  " if numbered else "") + shown)
    output.line(f"{len(targets)} host{'s' if len(targets) != 1 else ''} selected; nothing contacted",
                "dim")
    if out.as_json:
        hosts = {t.name: {"address": t.address or "local", "batch": number}
                 for number, batch in enumerate(groups, start=1) for t in batch}
        output.emit_json({"exit_code": 0, "error": None, "hosts": hosts,
                          "batches": [[t.name for t in batch] for batch in groups]})
    return 0
