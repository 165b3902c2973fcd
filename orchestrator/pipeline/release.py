"""What a deploy and a night share when they fail before their commit: the restore this
controller asks for, and the ways it can come back without a record.

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
from orchestrator.pipeline.session import HostSession
from orchestrator.shell import ops
from orchestrator.shell.agent_client import RemoteStepError


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
