"""What a run's end means: the outcome word and the exit code, decided here only.

Every run — deploy, ``--check``, a night, a rollback, status, lint, a fleet
— ends with an outcome word (``Outcome``) and an exit code (``ExitCode``),
and both come from the functions of this module: nowhere else in the
controller is an outcome word or an exit code written (a test,
``tests/test_outcomes.py``, scans the source for them). The words and codes
are the contract's (/work/shared/DESIGN.md, docs/CLI.md):

- 0 changed / unchanged / planned (and ``orch rollback``'s rolled_back)
- 1 rolled_back: the deploy failed and the host is back as it was
  (also ``failed`` after a Ctrl-C that came before anything changed)
- 2 failed / unreachable / not_started: refused or unreachable before
  anything changed
- 3 rollback_failed / unreachable: the host is not known to be healthy

``verdict`` maps *what happened* (the cause, an exception from
``orchestrator.errors`` or a Ctrl-C) and *how far the run got* (the
``Step`` reached) — and, when a restore ran, *what the restore recorded* —
to the outcome and exit code. Because the mapping lives in one table-like
function and not in a chain of ``except`` clauses, no cause can be
shadowed by another's branch. The other functions name the ends that have
no cause (a deploy confirmed, a host with nothing to do, a rollback's
restore) so that the pipeline says *which* end it reached, never *what
that means*.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import TYPE_CHECKING, Any

from orchestrator.errors import (
    HostKeyError,
    HostUnsafeError,
    LinkLostError,
    MalformedReplyError,
    PreflightRefusedError,
    ServerFailedError,
    UnreachableError,
)
from orchestrator.host.records import RecordedOutcome

if TYPE_CHECKING:  # only a type here: core.restore reads core.releases, which reads these words
    from orchestrator.core.restore import RestoreRecord


class Outcome(str, Enum):
    """The outcome words of the contract. A ``str``: it compares equal to its word,
    prints as its word and is written as its word in JSON and in the host's records.

    The words a release's record also ends with (``failed``, ``rolled_back``,
    ``rollback_failed``) are the record's own (``RecordedOutcome``, defined once in the
    host package, which writes them): the same word by construction, never by copy."""

    CHANGED = "changed"
    UNCHANGED = "unchanged"
    PLANNED = "planned"
    FAILED = RecordedOutcome.FAILED.value
    ROLLED_BACK = RecordedOutcome.ROLLED_BACK.value
    ROLLBACK_FAILED = RecordedOutcome.ROLLBACK_FAILED.value
    UNREACHABLE = "unreachable"
    NOT_STARTED = "not_started"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class ExitCode(IntEnum):
    """The exit codes of the contract; a fleet's (or several hosts') is the worst, the highest."""

    OK = 0  # done: changed, unchanged, planned; a rollback that succeeded
    FAILED = 1  # failed and restored (or a status whose gate regressed; Ctrl-C before any change)
    REFUSED = 2  # refused or unreachable before anything changed; bad input
    UNSAFE = 3  # the host is not known to be healthy: a person or ``orch rollback`` must act


MEANING: dict[Outcome, str] = {
    Outcome.CHANGED: "the release is deployed and current (exit 0)",
    Outcome.UNCHANGED: "nothing to do: files and server already as planned (exit 0)",
    Outcome.PLANNED: "--check: planned, rendered, staged and validated (the pre-flight too, on the staged "
                     "files); nothing changed (exit 0)",
    Outcome.FAILED: "refused or stopped before anything on the host changed (exit 2; 1 for Ctrl-C)",
    Outcome.ROLLED_BACK: "the deploy failed and the host is back as it was (exit 1); "
                         "for `orch rollback`, the rollback succeeded (exit 0)",
    Outcome.ROLLBACK_FAILED: "the host is not known to be healthy: a person or `orch rollback` "
                             "must act (exit 3)",
    Outcome.UNREACHABLE: "the host could not be reached or logged into; nothing changed (exit 2)",
    Outcome.NOT_STARTED: "a fleet run stopped before this host's turn (a batch failed, or Ctrl-C): "
                         "never connected, nothing changed (exit 2)",
}
"""Each outcome word and what it means, for ``--help`` and docs/CLI.md."""

RETRY_OUTCOMES = frozenset({Outcome.FAILED, Outcome.ROLLED_BACK, Outcome.ROLLBACK_FAILED, Outcome.UNREACHABLE,
                            Outcome.NOT_STARTED})
"""Outcomes whose hosts go into the retry file: everything but done (changed, unchanged, planned)."""

FAILED_OUTCOMES = frozenset({Outcome.FAILED, Outcome.ROLLED_BACK, Outcome.ROLLBACK_FAILED, Outcome.UNREACHABLE})
"""Outcomes that count as a failure of a batch (``not_started`` is never in a batch)."""


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
    """An outcome and its exit code (a plain ``int``: printed and compared as the number)."""

    outcome: Outcome
    exit_code: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "exit_code", int(self.exit_code))


# ------------------------------------------------------------------ ends without a cause

CHANGED = Verdict(Outcome.CHANGED, ExitCode.OK)
"""A deploy or a night confirmed: the release is current."""

UNCHANGED = Verdict(Outcome.UNCHANGED, ExitCode.OK)
"""Nothing to do (deploy, ``--check``, rollback)."""

PLANNED = Verdict(Outcome.PLANNED, ExitCode.OK)
"""``--check``: planned, staged and validated; nothing changed."""

CHECK_REFUSED = Verdict(Outcome.FAILED, ExitCode.REFUSED)
"""``--check`` where a deploy would refuse: nothing changed."""

UNSAFE = Verdict(Outcome.ROLLBACK_FAILED, ExitCode.UNSAFE)
"""A restore that could not run, or was left half-way: the host is not known to be healthy."""

INTERRUPTED = Verdict(Outcome.FAILED, ExitCode.FAILED)
"""A host a Ctrl-C stopped in a fleet run, before its own run could say more."""

NOT_STARTED = Verdict(Outcome.NOT_STARTED, ExitCode.REFUSED)
"""A host a fleet run never reached: never connected, nothing changed."""

STOPPED_FOLLOWING = Verdict(Outcome.UNREACHABLE, ExitCode.UNSAFE)
"""The controller stopped following a release's runner (a second Ctrl-C): the host finishes it
by itself, and this run cannot say how — as when the link is lost after the commit."""

RESTORED = Verdict(Outcome.ROLLED_BACK, ExitCode.FAILED)
"""A release after its commit, restored: the host is as it was."""


ABORTED = Verdict(Outcome.ROLLED_BACK, ExitCode.OK)
"""``orch rollback --abort``: the runner aborted and restored, as asked."""


def runner_verdict(confirmed: bool, restored_ok: bool | None, *, aborted: bool = False) -> Verdict:
    """The outcome of a release whose runner ended it: confirmed; restored (by the runner, its
    guard, or a person's ``orch rollback``); or a restore that failed (``restored_ok`` False)
    or that no record describes (None). ``aborted``: what ``orch rollback --abort`` asked for
    (a restore is its success)."""
    if confirmed:
        return CHANGED
    if restored_ok:
        return ABORTED if aborted else RESTORED
    return UNSAFE


def rollback_verdict(restore: RestoreRecord) -> Verdict:
    """``orch rollback``'s end, from the host's record of its restore: succeeding is its
    purpose (``rolled_back``, exit 0); a restore that failed leaves the host unsafe."""
    return Verdict(Outcome.ROLLED_BACK, ExitCode.OK) if restore.ok else UNSAFE


def undone_verdict(rollback: Verdict) -> Verdict:
    """A host whose deploy succeeded and that ``--rollback-all-on-failure`` undid with its
    failed batch: back as it was, but the run failed there too (``rolled_back``, exit 1);
    a rollback that did not succeed keeps its own word (unsafe, unreachable, failed), at
    least exit 2: still on the release it deployed, or not known to be healthy."""
    if rollback.outcome == Outcome.ROLLED_BACK and rollback.exit_code == ExitCode.OK:
        return Verdict(Outcome.ROLLED_BACK, ExitCode.FAILED)
    kept = (Outcome.ROLLBACK_FAILED, Outcome.UNREACHABLE, Outcome.FAILED)
    outcome = Outcome(rollback.outcome) if rollback.outcome in kept else Outcome.FAILED
    return Verdict(outcome, max(rollback.exit_code, ExitCode.REFUSED))


def read_verdict(cause: BaseException) -> Verdict:
    """A host whose read-only command (history, status) raised: nothing changes in those,
    so a lost link is ``unreachable`` (2) too."""
    if isinstance(cause, UnreachableError | HostKeyError | LinkLostError):
        return Verdict(Outcome.UNREACHABLE, ExitCode.REFUSED)
    return Verdict(Outcome.FAILED, error_exit_code(cause))


def error_exit_code(cause: BaseException) -> int:
    """The exit code of an error that ends a command outside a host run (bad input, a
    refusal, an unsafe host): by its class, as Click's ``ClickException.exit_code``."""
    if isinstance(cause, HostUnsafeError):
        return int(ExitCode.UNSAFE)
    if isinstance(cause, ServerFailedError):
        return int(ExitCode.FAILED)
    return int(ExitCode.REFUSED)  # RefusedError, a lost link before anything changed, any other


def status_exit_code(problems: Iterable[str], regressed: bool) -> int:
    """``orch status``: 3 when a problem makes the host unsafe (not healthy, not running, a
    release left half-done), 1 when ``--probe`` finds the gate's rules failing, else 0."""
    if any(True for _ in problems):
        return int(ExitCode.UNSAFE)
    return int(ExitCode.FAILED if regressed else ExitCode.OK)


def lint_exit_code(problems: int) -> int:
    """``orch lint``: bad input is exit 2, as for every command."""
    return int(ExitCode.REFUSED if problems else ExitCode.OK)


def usage_exit_code() -> int:
    """A usage mistake on the command line (Click's own) or bad input before any host."""
    return int(ExitCode.REFUSED)


def worst(codes: Iterable[int]) -> int:
    """The exit code of several hosts (a fleet, several hosts read): the worst host's, the
    highest (3 unsafe, 2 refused, 1 failed); 0 with no host."""
    return int(max(codes, default=ExitCode.OK))


def demo_exit_code(ok: bool) -> int:
    """``orch demo``: 0 when every scenario ended as it should, else 1."""
    return int(ExitCode.OK if ok else ExitCode.FAILED)


def outcome_of(word: Any) -> Outcome | None:
    """The ``Outcome`` a word read back (a stored report, a record) names, or None."""
    try:
        return Outcome(word)
    except ValueError:
        return None


# ------------------------------------------------------------------ a run that ended with a cause

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
            return UNSAFE
        if isinstance(cause, PreflightRefusedError):
            # step 7 of the contract: a refusal after the commit, undone (even when only
            # the command line was to change): the deploy failed, the host is as it was
            return Verdict(Outcome.ROLLED_BACK, ExitCode.FAILED)
        if reached < Step.COMMITTING and not restore.wrote_files:
            # The release was closed; nothing on the host had changed.
            return Verdict(Outcome.FAILED, ExitCode.FAILED if interrupted else ExitCode.REFUSED)
        return Verdict(Outcome.ROLLED_BACK, ExitCode.FAILED)
    if isinstance(cause, UnreachableError | HostKeyError):
        return Verdict(Outcome.UNREACHABLE, ExitCode.REFUSED)
    if isinstance(cause, MalformedReplyError) and reached < Step.COMMITTING:
        return Verdict(Outcome.FAILED, ExitCode.REFUSED)  # the host answered, badly: a refusal of that host, nothing changed
    if isinstance(cause, LinkLostError):
        return Verdict(Outcome.UNREACHABLE, ExitCode.REFUSED if reached < Step.COMMITTING else ExitCode.UNSAFE)
    if reached < Step.COMMITTING:
        if interrupted:
            return INTERRUPTED
        return Verdict(Outcome.FAILED, ExitCode.REFUSED)
    # Failed after the commit and no restore record came back: unknown state.
    return UNSAFE


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
