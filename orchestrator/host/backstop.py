"""The backstop: armed before a commit, it restores the release by itself
unless the deploy confirms in time, so a dead link or a dead controller
never leaves the box broken.

Its interface is two calls: ``op_release_arm`` (arm it for a release whose
plan is on disk) and ``watchdog_main`` (wait, then restore if due). Today
the watchdog is this helper, forked (``fork_watchdog``); a guard process
can later take the same two calls over.
"""

import json
import os
import signal
import sys
import time

from .eventlog import reserve
from .files import read_json, read_record, write_json, write_mark
from .held import hold_package
from .main import name_process
from .processes import proc_starttime
from .restore import op_restore_release
from .session import Session
from .wire import AgentError, expand


def op_release_arm(s, state_dir, release_dir, python=None):
    """Leave a watchdog on the host for this release (its plan is already on disk).

    The watchdog is this helper, forked: it needs nothing from the
    controller after this call (this program is in its memory; the plan and
    the backups are on the host's disk), and a fork costs no second
    interpreter start and compile per deploy (40 ms of a host's CPU,
    measured; a fleet's hosts each paid it). ``python`` is accepted from
    older controllers and not used.
    """
    release_dir = expand(release_dir)
    spec = read_json(os.path.join(release_dir, "restore.json"))
    budget = watchdog_budget(spec)
    if budget is None:
        raise AgentError("arm", "release %s has no restore plan with a budget" % release_dir)
    fire_at = time.monotonic() + budget
    fires_at = time.time() + budget
    reserve(release_dir)  # the runner's log has room even if the disk fills up later
    hold_package()  # the code in memory before the fork: a person may remove the kept copy while it waits
    go_read, go_write = os.pipe()  # "run" through it starts the runner (``runner.op_release_run``)
    try:
        pid = fork_watchdog(release_dir, os.path.join(release_dir, "watchdog.log"), fire_at, go_read)
    finally:
        os.close(go_read)
    old = s.guards.pop(release_dir, None)
    if old is not None:
        os.close(old)
    s.guards[release_dir] = go_write
    write_mark(os.path.join(release_dir, "watchdog.pid"), "%d\n" % pid)
    # pid + start time (``same_process``): ``state_read`` tells a live watchdog from a reused pid;
    # fires_at: when it acts, in this host's wall time (for people and ``orch status``)
    write_json(os.path.join(release_dir, WATCHDOG_FILE),
               {"pid": pid, "starttime": proc_starttime(pid), "budget": budget, "armed": fires_at - budget,
                "fires_at": fires_at, "clock": "host"}, durable=False)
    return {"pid": pid, "deadline": fires_at, "fires_at": fires_at, "budget": budget}


WATCHDOG_FILE = "watchdog.json"  # when the watchdog fires, in this host's wall time: for people and `orch status`


def watchdog_budget(spec):
    """Seconds the watchdog waits from now: the plan's ``budget``; from an older
    controller's absolute ``deadline``, what is left of it on this host's clock."""
    if spec is None:
        return None
    if spec.get("budget") is not None:
        return max(0.0, float(spec["budget"]))
    if spec.get("deadline"):
        return max(0.0, float(spec["deadline"]) - time.time())
    return None


def fork_watchdog(release_dir, log_path, fire_at=None, go_fd=None):
    """Fork ``watchdog_main`` off this helper, detached: its own session, its
    output to ``log_path``, none of this helper's files (the SSH channel
    must close when the helper leaves, and the lock file is the helper's).

    Only the forking thread lives on in the child, and the child touches
    nothing the other threads may have held locked at the fork (stdin's
    buffer, the session's locks, ``sys.stdout``): ``watchdog_main`` makes its
    own session, and the child its own ``sys.stdout``.
    """
    import warnings

    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+ warns of fork with threads: see above
        pid = os.fork()
    if pid:
        os.close(log_fd)
        os.close(null_fd)
        return pid

    def watchdog():
        os.setsid()
        os.chdir("/")
        os.dup2(null_fd, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        if go_fd is not None:
            os.dup2(go_fd, 3)
        close_fds_from(3 if go_fd is None else 4)
        sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)
        name_process("orch-watchdog")
        if go_fd is None:
            return watchdog_main(release_dir, fire_at)
        from .runner import guard_main

        return guard_main(release_dir, fire_at, 3)

    exit_child("watchdog", watchdog)


def exit_child(name, body):
    """``body()`` in a forked child, then ``os._exit`` with its code whatever happens: a child
    must never return into its parent's loop (SIGTERM's ``SystemExit`` included)."""
    code = 1
    try:
        code = body()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0
    except BaseException as e:  # noqa: BLE001 - see above
        try:
            print("%s: %s: %s" % (name, type(e).__name__, e))
        except Exception:  # noqa: BLE001
            pass
    finally:
        try:
            sys.stdout.flush()
        finally:
            os._exit(code)


def close_fds_from(low):
    """Close every open descriptor from ``low`` up (those ``/proc/self/fd`` lists)."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        os.closerange(low, 4096)
        return
    for fd in fds:
        if fd >= low:
            try:
                os.close(fd)
            except OSError:
                pass


def watchdog_due(claim, fire_at):
    """The backstop has passed: ``fire_at`` on the monotonic clock (a duration
    counted on this host: no controller's clock and no step of this host's
    wall clock moves it), or a restore's claim that has not completed in time."""
    if claim.get("by") in ("controller", "rollback"):
        if claim.get("until_monotonic") is not None:
            return time.monotonic() >= claim["until_monotonic"]  # backing up a restore under way
        if claim.get("until"):
            return time.time() >= claim["until"]  # an older controller's absolute time
    return time.monotonic() >= fire_at


def watchdog_wait(release_dir, spec, fire_at):
    """Sleep until the watchdog must act (True) or is no longer needed (False)."""
    while True:
        claim = read_record(os.path.join(release_dir, "claim.json")) or {}
        done = read_record(os.path.join(release_dir, "restored.json")) or {}
        if claim.get("by") == "confirmed" or done.get("completed"):
            return False
        if watchdog_due(claim, fire_at):
            return True
        time.sleep(0.5)


def watchdog_main(release_dir, fire_at=None):
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(os.EX_OK))  # the helper process's own status, not a run's
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    release_dir = expand(release_dir)
    spec = read_json(os.path.join(release_dir, "restore.json"))
    if fire_at is None:  # not handed one by ``op_release_arm``: the plan's budget from now
        fire_at = time.monotonic() + (watchdog_budget(spec) or 0.0)
    if spec is None or not watchdog_wait(release_dir, spec, fire_at):
        return 0
    s = Session(open(os.devnull, "wb"))  # its own: nothing of the helper's conversation is its business
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    print("%s watchdog: deadline passed with the release neither confirmed nor restored; restoring" % stamp)
    sys.stdout.flush()
    try:
        record = op_restore_release(s, release_dir, "watchdog",
                                    reason="not confirmed before the watchdog's deadline")
    except AgentError as e:
        print("watchdog: nothing to do: %s" % e.message)
        return 0
    if record.get("already"):
        print("watchdog: already restored by %s" % record.get("by"))
        return 0
    print("restored: %s" % json.dumps(record, sort_keys=True))
    return 0 if record["ok"] else 1
