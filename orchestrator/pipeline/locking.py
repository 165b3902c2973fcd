"""The host's lock and journal, as every changing command takes them.

A deploy, a night and a rollback each open the host's state directory,
take its lock (one changing run per host at a time) and read its records
in one round trip, and refuse to start over a journal that says an earlier
run never finished. The lock's heartbeat is kept by the helper on the host;
if our link dies, the helper gives the lock back by itself, so releasing it
never waits on a dead link.
"""

from __future__ import annotations

import contextlib
import os
from datetime import datetime, timezone
from typing import Any

from orchestrator.errors import LockHeldError, UnfinishedDeployError
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
) -> tuple[str, dict[str, Any]]:
    """State dir, lock and records in one round trip (a second one only to take over a lock)."""
    got = session.run(ops.open_state(session.target.state_dir, lock_holder(command)))
    root = got["root"]
    if not got["lock"]["acquired"]:
        take_over_lock(session, root, command, break_lock, reporter, got["lock"])
        got = session.run(ops.open_state(root))
    return root, got["state"]


def describe_holder(h: dict[str, Any]) -> str:
    """Who holds the lock, and since when on the host's clock: ``taken`` is stamped by the
    helper there (the holder's ``started`` is its own controller's clock, hours off maybe)."""
    since = datetime.fromtimestamp(float(h.get("taken") or h.get("started") or 0), timezone.utc).strftime("%H:%M:%S")
    return (f"{h.get('user', '?')}@{h.get('controller', '?')} pid {h.get('pid', '?')} "
            f"({h.get('command', '?')}, since {since} UTC, host clock)")


def take_over_lock(
    session: HostSession,
    state_dir: str,
    command: str,
    break_lock: bool,
    reporter: Reporter,
    refused: dict[str, Any],
) -> None:
    """The lock was held (``refused`` is the helper's answer): take it over, or fail fast naming who holds it.

    A holder on this same machine whose process is gone is provably dead:
    its lock is taken with a note. A holder whose heartbeat stopped but
    which we cannot check (another controller) is only reported as stale,
    and taken with ``--break-lock``. The take-over itself is a
    compare-and-swap on the host: of two runs taking over, one wins.
    """
    label = session.target.name
    h = refused["holder"]
    who = describe_holder(h)
    age = float(h.get("heartbeat_age", 0))
    if h.get("controller_id") == controller_id() and not local_pid_alive(int(h.get("pid", 0))):
        reporter.note(label, f"took the lock left by {who}: that process is gone")
    elif age > STALE_LOCK_SECONDS and not h.get("agent_alive"):
        if not break_lock:
            raise LockHeldError(
                f"{label}: stale lock held by {who}, no heartbeat for {age:.0f} s; "
                "if that run is really gone, pass --break-lock"
            )
        reporter.warn(label, f"breaking the stale lock of {who} (no heartbeat for {age:.0f} s)")
    else:
        raise LockHeldError(f"{label}: locked by {who}, heartbeat {age:.0f} s ago")
    again = session.run(ops.lock_acquire(state_dir, lock_holder(command), replace_token=h.get("token")))
    if not again["acquired"]:
        raise LockHeldError(f"{label}: another run took the lock first; try again")


def release_lock(session: HostSession, state_dir: str) -> None:
    """Give the lock back, if the link still works (else the helper does it by itself)."""
    if not session.link_alive:
        return
    with contextlib.suppress(Exception):
        session.run(ops.lock_release(state_dir))


def current_release_dir(state: dict[str, Any]) -> str | None:
    """The current release's directory on the host, from a ``state_read`` answer."""
    applied = state["state"].get("applied", [])
    return f"{state['root']}/releases/{applied[-1]}" if applied else None


def refuse_unfinished(label: str, journal: dict[str, Any] | None) -> None:
    if journal and not journal.get("finished"):
        raise UnfinishedDeployError(
            f"{label}: {journal.get('kind', 'deploy')} {journal.get('release')} never finished "
            f"(last step: {journal.get('step')}); run `orch rollback --host {label}` to finish restoring it"
        )
