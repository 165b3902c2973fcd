"""What a restore must do, and what it did: the plan and the record.

Every change orch makes on a host is a release whose directory holds a
durable restore plan (``restore.json``). One host-side function executes it
for whoever acts — the controller's automatic rollback, the watchdog, or
``orch rollback`` — re-reading it from disk at that moment (see the restore
machine in ``host/restore.py``). The two shapes that cross the wire, the plan
the controller writes and the record of what the restore actually did, are
defined once in ``orchestrator.host.restore_plan`` (both sides read them);
this module builds the plan's file (the words of what a restore did are the
CLI's: ``cli.restore_words``). Pure: values in, values out.
"""

from __future__ import annotations

from typing import Any

from orchestrator.host.restore_plan import (
    FileOutcome,
    RestorePlan,
    RestoreRecord,
    RestoreSpec,
    ServerStart,
    ServerTarget,
)

__all__ = ["FileOutcome", "RestorePlan", "RestoreRecord", "RestoreSpec", "ServerStart", "ServerTarget",
           "restore_spec"]


def restore_spec(
    release_id: str,
    kind: str,
    plan: RestorePlan,
    *,
    budget: float | None = None,
    started: dict[str, Any] | None = None,
    mask: list[str] | None = None,
) -> dict[str, Any]:
    """``restore.json``: the plan, the watchdog's budget, and what the release starts.

    ``budget`` is a duration (seconds from the arming), counted by the
    watchdog on the host's monotonic clock: an absolute deadline computed on
    the controller would be off by however far its clock is from the host's
    (an hour behind, and the watchdog restored every good deploy at once).
    ``mask``: the release's secret var values (the file is 0600, and holds the
    server's real environment already): a later ``orch history --release`` or
    ``status`` without the playbook masks them in what it shows of the
    release's files.
    """
    return RestoreSpec(release_id, kind, plan, budget, started, list(mask or [])).to_wire()
