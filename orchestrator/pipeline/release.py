"""What a deploy and a night share around their commit: the two batches that arm the
release and hand it to its runner (``Handover``), and, when they fail before the
commit, the restore this controller asks for and the ways it can come back without
a record.

Each supplies its own records (a deploy's backups and manifest, a night's switch
record and restore plan) and its own program; the shape is the same: the records,
the program, the journal and the guard armed in one round trip, before anything
live is touched; then the commit (a deploy's files; a night has none) with the
runner started and followed in one more.

After the commit a release is its runner's (``host/runner.py``), followed by
``follow.RunnerFollow``; before it, a failure (a refused pre-flight, a Ctrl-C, a
build that broke) is closed from here: the one restore machine runs the release's
plan on the host (``ops.restore_release``, ``by: controller``), within the budget
its server and health allow. Its record says what was done; when none comes back,
``RestoreCut`` says why, and by when the host's backstop finishes the restore by
itself, for the caller's words.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.core.restore import RestoreRecord
from orchestrator.errors import LinkLostError, OrchError
from orchestrator.pipeline.follow import Followed, RunnerFollow, StoppedFollowing, reported_op
from orchestrator.pipeline.session import HostSession
from orchestrator.shell import ops
from orchestrator.shell.agent_client import RemoteStepError
from orchestrator.shell.program import STEPS_FILE, ReleaseProgram, release_follow, release_run


@dataclass(frozen=True)
class Handover:
    """The release's two batches around its commit, for a deploy (``command`` "deploy") and
    a night ("nightly"): the command names whose report the host marks the verdict with."""

    session: HostSession
    state_dir: str
    release_dir: str
    command: str

    def arm(self, records: list[ops.Op], program: ReleaseProgram, journal: ops.Op) -> float | None:
        """The release's records, its program and its journal written, and its guard armed, in
        one round trip: the host's time at which the backstop restores it (None if not said)."""
        arm = ops.release_arm(self.state_dir, self.release_dir)
        fires_at: float | None = self.session.batch([*records, program.write(self.release_dir), journal, arm])[arm]
        return fires_at

    def run(self, follower: RunnerFollow, commit: list[ops.Op], started: float,
            steps: list[dict[str, Any]]) -> Followed | StoppedFollowing:
        """``commit`` (the files swapped in and the journal's step), the steps' times so far,
        and the runner started and followed to its verdict, in one round trip."""
        run, follow = release_run(self.release_dir, self.state_dir), release_follow(self.release_dir)
        return follower.run([*commit, ops.put_json(f"{self.release_dir}/{STEPS_FILE}",
                                                   {"started": started, "steps": steps}),
                             run, follow, reported_op(self.release_dir, self.command)], follow)


class Cut(enum.Enum):
    """How a controller's restore came back without a record."""

    LINK_LOST = "link_lost"  # the link dropped: the host finishes the restore by itself
    INTERRUPTED = "interrupted"  # a second Ctrl-C: orch stopped waiting, the restore stopped where it was
    ABSENT = "absent"  # the host has no such release (a Ctrl-C before the host made it): nothing to close
    COULD_NOT_RUN = "could_not_run"  # the host refused or failed to run it


@dataclass(frozen=True)
class RestoreCut:
    """No record came back: ``why``, the error that said so, and ``until``, the host's time by
    which its backstop restores the release at the latest (the host counts it itself)."""

    why: Cut
    until: float
    error: OrchError | None = None


def restore_here(session: HostSession, release_dir: str, within: float, reason: str,
                 on_event: Callable[[dict[str, Any]], None]) -> RestoreRecord | RestoreCut:
    """Restore a release that failed before its commit, from this controller, within ``within``
    seconds (``core.budget.restore_budget``): its record, or how it was cut short."""
    until = session.host_time() + within
    try:
        record: RestoreRecord = session.run(
            ops.restore_release(release_dir, "controller", within=within, reason=reason), on_event=on_event)
    except LinkLostError as e:
        return RestoreCut(Cut.LINK_LOST, until, e)
    except KeyboardInterrupt:
        return RestoreCut(Cut.INTERRUPTED, until)
    except RemoteStepError as e:
        return RestoreCut(Cut.ABSENT if e.kind == "absent" else Cut.COULD_NOT_RUN, until, e)
    except OrchError as e:
        return RestoreCut(Cut.COULD_NOT_RUN, until, e)
    return record
