"""What a host run's end means: the outcome word and the exit code.

One function, ``verdict``, maps *what happened* (the cause, an exception
from ``orchestrator.errors`` or a Ctrl-C) and *how far the run got* (the
``Step`` reached) — and, when a restore ran, *what the restore recorded* —
to the outcome and exit code of the contract. Because the mapping lives in
one table-like function and not in a chain of ``except`` clauses, no cause
can be shadowed by another's branch.

- 0 changed / unchanged / planned
- 1 rolled_back: the deploy failed and the host is back as it was
  (also ``failed`` after a Ctrl-C that came before anything changed)
- 2 failed / unreachable: refused or unreachable before anything changed
- 3 rollback_failed / unreachable: the host is not known to be healthy
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from orchestrator.core.restore import RestoreRecord
from orchestrator.errors import (
    HostKeyError,
    LinkLostError,
    MalformedReplyError,
    PreflightRefusedError,
    UnreachableError,
)


class Step(IntEnum):
    """How far a host run got; later steps compare greater."""

    CONNECTING = 0  # nothing on the host yet
    PLANNING = 1  # lock held: reading, planning, staging, validating; nothing changed
    ARMED = 2  # release, backups and journal written, watchdog armed; live files untouched
    COMMITTING = 3  # the commit was sent: live files may have changed
    RESTARTING = 4  # the running server may have been stopped
    CONFIRMING = 5  # everything passed; confirming


@dataclass(frozen=True)
class Verdict:
    outcome: str
    exit_code: int


def verdict(cause: BaseException, reached: Step, restore: RestoreRecord | None = None) -> Verdict:
    """The outcome and exit code of a host run that ended with ``cause``.

    ``restore``: the record of the restore the failure led to, if one ran
    to its end; it, not a guess from the cause, says whether the host is
    back in its previous state — and whether anything had been written (a
    restore that put a file back means the deploy changed it, however far
    the controller believed the run got).
    """
    interrupted = isinstance(cause, KeyboardInterrupt)
    if restore is not None:
        if not restore.ok:
            return Verdict("rollback_failed", 3)
        if isinstance(cause, PreflightRefusedError):
            # step 7 of the contract: a refusal after the commit, undone (even when only
            # the command line was to change): the deploy failed, the host is as it was
            return Verdict("rolled_back", 1)
        if reached < Step.COMMITTING and not restore.wrote_files:
            # The release was closed; nothing on the host had changed.
            return Verdict("failed", 1 if interrupted else 2)
        return Verdict("rolled_back", 1)
    if isinstance(cause, UnreachableError | HostKeyError):
        return Verdict("unreachable", 2)
    if isinstance(cause, MalformedReplyError) and reached < Step.COMMITTING:
        return Verdict("failed", 2)  # the host answered, badly: a refusal of that host, nothing changed
    if isinstance(cause, LinkLostError):
        return Verdict("unreachable", 2 if reached < Step.COMMITTING else 3)
    if reached < Step.COMMITTING:
        if interrupted:
            return Verdict("failed", 1)
        return Verdict("failed", 2)
    # Failed after the commit and no restore record came back: unknown state.
    return Verdict("rollback_failed", 3)


def committed_paths(details: dict[str, Any]) -> list[str] | None:
    """What the commit wrote, by the host's record, when its batch failed.

    ``details``: the failed batch's error details. The commit is the
    batch's step 0: failing there, its own record (``committed``) says which
    files it had renamed into place; failing at a later step, its answer is
    the first of the steps ``done``. None when the host said nothing
    (unknown: the commit may have written, and a restore's record decides).
    """
    step = details.get("step")
    if step is None:
        return None
    if step == 0:
        got = details.get("committed")
        return [str(p) for p in got] if isinstance(got, list) else None
    done = details.get("done")
    if isinstance(done, list) and done and isinstance(done[0], list):
        return [str(p) for p in done[0]]
    return None
