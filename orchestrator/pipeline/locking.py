"""The host's lock and journal, as every changing command takes them.

A deploy, a night and a rollback each open the host's state directory,
take its lock (one changing run per host at a time) and read its records
in one round trip, and refuse to start over a run in progress or a journal
that says an earlier run never finished (``core.progress`` tells which). The lock's heartbeat is kept by the helper on the host;
if our link dies, the helper gives the lock back by itself, so releasing it
never waits on a dead link.
"""

from __future__ import annotations

import contextlib
import os
from datetime import datetime, timezone

from orchestrator.core import events
from orchestrator.core.progress import (
    FRESH_HEARTBEAT_SECONDS,
    HostState,
    HostView,
    LockRecord,
    TakeOver,
    take_over_decision,
    view_of_state,
)
from orchestrator.errors import LockHeldError, UnfinishedDeployError
from orchestrator.host.records import HostRecords
from orchestrator.host.values import replace  # the host records are value classes, not dataclasses
from orchestrator.pipeline.events import Reporter
from orchestrator.pipeline.session import HostSession, controller_id, lock_holder
from orchestrator.shell import ops

STALE_LOCK_SECONDS = 30.0


def local_pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def open_state(
    session: HostSession, command: str, break_lock: bool, reporter: Reporter
) -> tuple[str, HostRecords]:
    """State dir, lock and records in one round trip (a second one only to take over a lock).

    A lock held by a run in progress (its helper alive and hearing its
    controller) is refused in the words ``orch status`` prints, and never
    taken over. The records returned carry no lock of this run's own.
    """
    got: ops.OpenedState = session.run(ops.open_state(session.target.state_dir, lock_holder(command)))
    root = got.root
    assert got.lock is not None  # asked for: a holder was sent
    token = got.lock.token
    if not got.lock.acquired:
        view = view_of_state(session.target.name, got.state)
        if view.state is HostState.IN_PROGRESS:
            raise LockHeldError(f"{view.refusal()}; locked by {describe_holder(got.lock.holder)}")
        token = take_over_lock(session, root, command, break_lock, reporter, got.lock)
        got = session.run(ops.open_state(root))
    state = got.state
    if state.lock is not None and state.lock.token == token:
        state = replace(state, lock=None)  # our own: not another run's
    return root, state


def describe_holder(h: LockRecord | None) -> str:
    """Who holds the lock, and since when on the host's clock: ``taken`` is stamped by the
    helper there (the holder's ``started`` is its own controller's clock, hours off maybe)."""
    if h is None:
        return "?@? pid ?"
    since = datetime.fromtimestamp(h.since, timezone.utc).strftime("%H:%M:%S")
    return f"{h.who} pid {h.pid or '?'} ({h.command}, since {since} UTC, host clock)"


def take_over_lock(
    session: HostSession,
    state_dir: str,
    command: str,
    break_lock: bool,
    reporter: Reporter,
    refused: ops.LockAnswer,
) -> str | None:
    """The lock was held (``refused`` is the helper's answer): take it over, or fail fast naming who holds it.

    A holder on this same machine whose process is gone, and whose helper on
    the host is gone too, is provably dead: its lock is taken with a note. A
    holder whose heartbeat stopped but which we cannot check (another
    controller) is only reported as stale, and taken with ``--break-lock``.
    A lock whose helper still lives on the host is never taken (see
    ``core.progress.take_over_decision``). The take-over itself is a
    compare-and-swap on the host: of two runs taking over, one wins.
    Returns the new lock's token.
    """
    label = session.target.name
    lock = refused.holder or LockRecord()  # the lock vanished before the helper read it: held; a retry takes it
    who = describe_holder(lock)
    pid = lock.pid or 0
    decision = take_over_decision(
        lock, same_controller=lock.controller_id == controller_id(),
        holder_alive_here=bool(pid) and local_pid_alive(pid), break_lock=break_lock,
        stale_after=STALE_LOCK_SECONDS)
    age = lock.heartbeat_age
    if decision is TakeOver.TAKE:
        reporter.event(label, events.LockTakenOver(who))
    elif decision is TakeOver.BREAK:
        reporter.event(label, events.StaleLockBroken(who, age))
    elif decision is TakeOver.STALE:
        raise LockHeldError(
            f"{label}: stale lock held by {who}, no heartbeat for {age:.0f} s; "
            "if that run is really gone, pass --break-lock"
        )
    elif lock.helper_alive and age > FRESH_HEARTBEAT_SECONDS:
        raise LockHeldError(
            f"{label}: locked by {who}: its helper (pid {lock.helper_pid}) is still alive on the host but no "
            f"longer hears its controller (heartbeat {age:.0f} s ago); it gives the lock back once its step "
            "ends; try again then (`orch status`)")
    else:
        raise LockHeldError(f"{label}: locked by {who}, heartbeat {age:.0f} s ago")
    again: ops.LockAnswer = session.run(ops.lock_acquire(state_dir, lock_holder(command),
                                                         replace_token=lock.token))
    if not again.acquired:
        raise LockHeldError(f"{label}: another run took the lock first; try again")
    return again.token or None


def release_lock(session: HostSession, state_dir: str) -> None:
    """Give the lock back, if the link still works (else the helper does it by itself)."""
    if not session.link_alive:
        return
    with contextlib.suppress(Exception):
        session.run(ops.lock_release(state_dir))


def current_release_dir(state: HostRecords) -> str | None:
    """The current release's directory on the host, from a ``state_read`` answer."""
    current = state.state.current
    return state.paths.release(current) if current else None


def refuse_busy(label: str, state: HostRecords) -> HostView:
    """Refuse (exit 2) a host where a run is in progress, or left a release half-done
    (its controller gone, or nothing finishing it), in the words ``orch status`` prints.
    ``state``: a ``state_read`` answer without this run's own lock."""
    view = view_of_state(label, state)
    if view.state is HostState.IN_PROGRESS:
        raise LockHeldError(view.refusal())
    if view.busy:
        raise UnfinishedDeployError(view.refusal())
    return view
