"""The restore machine.

Every change orch makes on a host is a release directory with a durable
restore plan, ``restore.json``: the state to bring the host to (for a
deploy: as it was before; for ``orch rollback``: the state it asked for).
ONE function executes it, ``op_restore_release``, for all three who may:
the controller's automatic rollback, the watchdog, and ``orch rollback``
finishing a deploy that never did. It re-reads the plan from disk when it
acts, so whoever acts restores the same thing. Around it:

- ``restore.lock`` (flock): one restorer at a time, and no confirm while a
  restore runs. It exists from the release's creation, so locking it
  needs no disk space.
- ``claim.json``: who acts. ``confirmed`` ends the watchdog; a controller
  or ``orch rollback`` claim turns the watchdog into a back-up that acts
  only if that restore has not completed by the claim's ``until``.
- ``restored.json``: what a restore actually did, file by file. Every
  message orch prints about a restore is built from this record.
- ``commit.started``: the commit began, so a target may hold orch's
  content. Without it, a target that changed was changed by somebody
  else, and is left alone.
- ``server.touched``: the server was (about to be) stopped.

Files are restored as compare-and-swap on content: a file that already
holds the wanted content is never rewritten; one that holds content orch
did not write is first saved into the release as drift (``files/<n>.drift``),
named in the record, then restored: nothing a person wrote is lost.
"""

import fcntl
import os
import time

from .dispatch import op_batch
from .files import (
    followable,
    fsync_dir,
    live_sha256,
    point_link,
    read_json,
    read_nofollow,
    read_record,
    try_write_json,
    write_atomic,
    write_json,
)
from .health import op_health_wait
from .processes import (
    op_server_find,
    op_server_start,
    op_server_stop,
    pid_listening_on,
    port_busy,
    proc_start_epoch,
    run_argv,
    run_server_cmd,
    same_process,
)
from .state import RESTORE_LOCK
from .wire import AgentError, expand, sha256_bytes, sha256_file


class ReleaseLock(object):
    """``with ReleaseLock(release_dir):`` — the restore machine's mutex (flock).

    Held by a process, it is released when that process dies: a restorer
    killed mid-way never blocks the watchdog that backs it up.
    """

    def __init__(self, release_dir):
        self.path = os.path.join(release_dir, RESTORE_LOCK)
        self.fd = None

    def __enter__(self):
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)


def save_drift(release_dir, n, path, live):
    """Keep what a person wrote before orch writes over it."""
    dest = os.path.join(release_dir, "files", "%d.drift" % n)
    data = read_nofollow(path)
    write_atomic(dest, data, 0o600)
    if sha256_file(dest) != live:
        raise AgentError("restore", "the drift copy %s reads back wrong" % dest)
    return dest


def restore_file(release_dir, n, f, committed):
    """Bring one file to ``f``'s content; returns what was done.

    ``f``: ``path``, ``source`` (the file holding the wanted content, or
    None: the file must not exist), ``sha256`` (the wanted content's),
    ``expect`` (what orch left there), ``mode``/``uid``/``gid``.
    """
    path = expand(f["path"])
    real, refused = followable(path)
    if refused:
        # a link another user put at the target: replaced, never written through
        done = {"path": path, "sha256_live": None, "refused": [refused + "; the link is replaced by the restored file"]}
        if not committed:
            done["action"] = "left"
            return done
        real = path
    else:
        live = live_sha256(real)
        done = {"path": path, "sha256_live": live}
        if live == f.get("sha256"):
            done["action"] = "unchanged"  # already as wanted: never rewritten
            return done
        if live is not None and live != f.get("expect"):
            if not committed:
                # orch never wrote here: this is somebody else's change, not ours to undo
                done["action"] = "left"
                return done
            done["drift"] = save_drift(release_dir, n, real, live)
    if f.get("source") is None:
        os.unlink(real)
        done["action"] = "removed"
        return done
    data = read_nofollow(f["source"])
    if sha256_bytes(data) != f["sha256"]:
        raise AgentError("restore", "backup %s is damaged (sha256 %s, recorded %s); %s was left as it is" % (
            f["source"], sha256_bytes(data), f["sha256"], path))
    planted = []
    try:
        write_atomic(real, data, f.get("mode"), f.get("uid"), f.get("gid"), planted)
    finally:
        if planted:
            done["refused"] = done.get("refused", []) + planted
    if sha256_bytes(read_nofollow(real)) != f["sha256"]:
        raise AgentError("restore", "%s reads back wrong after restore" % path)
    done["action"] = "restored"
    return done


def restore_link(link):
    """A symlink back to ``target`` (``expect``: where orch pointed it);
    ``target`` None: there was no link before, so it is removed."""
    path = expand(link["path"])
    try:
        now = os.readlink(path)
    except OSError:
        now = None
    done = {"path": path, "was": now, "target": link["target"]}
    if now == link["target"]:
        done["action"] = "unchanged"
        return done
    if now != link.get("expect"):
        done["drift"] = now  # somebody pointed it elsewhere; recorded, then restored
    if link["target"] is None:
        os.unlink(path)
        fsync_dir(os.path.dirname(path) or ".")
        done["action"] = "removed"
        return done
    point_link(path, link["target"])
    done["action"] = "restored"
    return done


def server_settled(server, touched, paths, running):
    """Whether the server already is as the plan wants it, so that restoring
    it again would only cost a restart (minutes, on a GPU box).

    It is when the process running before was never stopped (same pid and
    start time, and nobody marked it touched), or when the wanted command
    line runs and started after every restored file got its content back.
    """
    before = server.get("before") or {}
    if not touched and before.get("pid") and same_process(before["pid"], before.get("starttime")):
        return True
    start = server.get("start")
    if start is None:
        return not touched  # nothing ran before; a server running now is not ours to stop
    if running is None or running["argv"] != start["argv"]:
        return False
    started_at = proc_start_epoch(running["pid"])
    newest = 0.0
    for p in paths:
        try:
            newest = max(newest, os.lstat(p).st_mtime)
        except OSError:
            pass
    # The start time is known to a clock tick: a process that started within
    # a tick before the newest restored file would pass, and none does — the
    # restore writes every file before it starts anything.
    return started_at is not None and started_at + 1.0 / os.sysconf("SC_CLK_TCK") >= newest


def restore_server(s, release_dir, server, paths):
    """Bring the server to the plan's state: stop what runs, start ``start``."""
    touched = os.path.exists(os.path.join(release_dir, "server.touched"))
    manager = server.get("manager", "process")
    if manager == "commands":
        if not touched:
            return {"action": "untouched"}
        stopped = run_argv(server["stop"], timeout=server.get("stop_timeout", 30.0) + 60) if server.get("stop") else None
        if not server.get("start"):
            return {"action": "stopped", "stop_rc": stopped and stopped["rc"]}
        run_server_cmd(server["start"])
        started = {"action": "restarted", "pid": None, "log": None}
        if server.get("pid_cmd"):
            got = run_argv(server["pid_cmd"], timeout=60.0)
            words = got["stdout"].split()
            if got["rc"] == 0 and words and words[0].isdigit():
                started["pid"] = int(words[0])
        return started
    running = op_server_find(s, server.get("pidfile"), server.get("port"))
    if server_settled(server, touched, paths, running):
        if not touched:
            return {"action": "untouched", "pid": (server.get("before") or {}).get("pid")}
        return {"action": "already running", "pid": running["pid"] if running else None}
    if running is not None:
        op_server_stop(s, running["pid"], running["pgid"], server.get("stop_timeout", 30.0), server.get("port"),
                       server.get("free_timeout", 120.0))
    start = server.get("start")
    if not start:
        return {"action": "stopped"}
    got = op_server_start(s, start["argv"], start.get("cwd"), start.get("env"), server.get("log"),
                          server.get("pidfile"), start.get("replace_env", False))
    return {"action": "restarted", "pid": got["pid"], "log": got["log"]}


def run_restore(s, release_dir, spec, by):
    """Execute a restore plan; returns the record of what was done (never raises)."""
    plan = spec["plan"]
    committed = plan.get("always") or os.path.exists(os.path.join(release_dir, "commit.started"))
    earlier = earlier_restored(release_dir)
    record = {"by": by, "started": time.time(), "files": [], "links": [], "server": None, "health": None,
              "ok": False, "completed": False, "error": None, "committed": bool(committed)}
    try:
        for n, f in enumerate(plan.get("files") or []):
            s.check_cancel()
            done = restore_file(release_dir, f.get("n", n), f, committed)
            if done["action"] == "unchanged" and done["path"] in earlier:
                # an earlier restore of this release (one that failed later on) wrote it back
                done["action"], done["earlier"] = earlier[done["path"]]
            record["files"].append(done)
        for link in plan.get("links") or []:
            record["links"].append(restore_link(link))
        s.event("progress", msg=describe_restored(record))
        server = plan.get("server")
        if server:
            paths = [os.path.realpath(expand(f["path"])) for f in plan.get("files") or []]
            paths += [expand(link["path"]) for link in plan.get("links") or []]
            record["server"] = restore_server(s, release_dir, server, paths)
            started = record["server"]
            if started.get("action") in ("restarted", "already running") and plan.get("health"):
                record["health"] = op_health_wait(s, pid=started.get("pid"), log=started.get("log"), **plan["health"])
            if server.get("after_healthy") and os.path.exists(os.path.join(release_dir, "drained")):
                # the deploy took the host out of its router: put it back, the server is healthy again
                run_server_cmd(server["after_healthy"], server.get("hook_timeout", 300.0))
                record["put_back"] = True
        if plan.get("on_success"):
            op_batch(s, plan["on_success"])
        record["ok"] = record["completed"] = True
    except AgentError as e:
        record["error"], record["error_kind"] = e.message, e.kind
        record["log_tail"] = e.details.get("log_tail") or []
        record["completed"] = e.kind != "cancelled"
    except Exception as e:  # a restore reports, it does not crash
        record["error"], record["error_kind"] = "%s: %s" % (type(e).__name__, e), "internal"
        record["completed"] = True
    if not record["ok"]:
        record["listening"] = listener_now(plan)
    record["finished"] = time.time()
    return record


def earlier_restored(release_dir):
    """Files an earlier, unfinished restore of this release already brought back
    (path -> (action, by)): a re-run finds them as wanted, and must still say
    they were restored, not that orch never wrote them."""
    done = read_record(os.path.join(release_dir, "restored.json")) or {}
    out = {}
    if not isinstance(done, dict):
        return out
    for f in done.get("files") or []:
        if isinstance(f, dict) and f.get("action") in ("restored", "removed"):
            out[f.get("path")] = (f["action"], f.get("earlier") or done.get("by"))
    return out


def listener_now(plan):
    """After a failed restore: whether a server listens on the health port now, and its
    pid (None when the socket's owner cannot be seen) — the first thing a person needs
    to know is whether the host still serves."""
    port = (plan.get("server") or {}).get("port")
    if not port:
        return None
    try:
        return {"port": port, "listening": port_busy(port), "pid": pid_listening_on(port)}
    except Exception:  # a record, never a reason to crash the restore's report
        return {"port": port, "listening": None, "pid": None}


def describe_restored(record):
    counts = {}
    for f in record["files"]:
        counts[f["action"]] = counts.get(f["action"], 0) + 1
    if not counts:
        return "files to restore: none"
    return "files: " + ", ".join("%d %s" % (v, k) for k, v in sorted(counts.items()))


def restore_claim(by, within, until):
    """``claim.json`` for a restore under way: who, and when the watchdog backs it up.

    ``within`` (seconds, counted here on the monotonic clock) is what a
    controller sends: a deadline computed on its own clock would be off by
    however far that clock is from this host's. ``until`` (an absolute time)
    is what older controllers sent. ``until`` is written as this host's wall
    time either way, for people and ``orch status`` (host clock).
    """
    claim = {"by": by, "time": time.time(), "until": until}
    if within is not None:
        claim["until"] = time.time() + within
        claim["until_monotonic"] = time.monotonic() + within
    return claim


def op_restore_release(s, release_dir, by, until=None, reason=None, within=None):
    """Bring the host to the release's restore plan (see the banner above).

    ``within``: seconds after which the watchdog backs this restore up if
    it has not completed (the claim; ``until`` is the older absolute form).
    Returns the restore record; a restore another party already completed is
    returned as it was (``already``).
    """
    release_dir = expand(release_dir)
    if not os.path.isdir(release_dir):
        # a deploy interrupted while asking for its backup: the host never made the release
        raise AgentError("absent", "release %s does not exist on this host" % os.path.basename(release_dir))
    s.finishing = True  # a dropped link does not stop a restore
    try:
        with ReleaseLock(release_dir):
            done = read_record(os.path.join(release_dir, "restored.json"))
            if done and done.get("completed") and done.get("ok"):
                done["already"] = True
                return done
            claim = read_record(os.path.join(release_dir, "claim.json"))
            if claim and claim.get("by") == "confirmed":
                raise AgentError("confirmed", "release %s was confirmed: it is current, and `orch rollback` "
                                 "undoes it" % os.path.basename(release_dir))
            spec = read_json(os.path.join(release_dir, "restore.json"))
            if spec is None:
                raise AgentError("restore", "release %s has no restore plan" % os.path.basename(release_dir))
            claim_error = try_write_json(os.path.join(release_dir, "claim.json"), restore_claim(by, within, until))
            record = run_restore(s, release_dir, spec, by)
            # the records are parsed here, not on import: a deploy that confirms never pays for them
            from .restore_records import finish_records

            record["record_errors"] = ([claim_error] if claim_error else []) + finish_records(
                release_dir, spec, record, reason)
            return record
    finally:
        s.finishing = False


def op_confirm_release(s, release_dir, steps):
    """The deploy passed: claim the release as confirmed (the watchdog then
    leaves) and run ``steps`` — unless a restore got there first."""
    release_dir = expand(release_dir)
    with ReleaseLock(release_dir):
        done = read_record(os.path.join(release_dir, "restored.json"))
        claim = read_record(os.path.join(release_dir, "claim.json"))
        if done is not None or (claim and claim.get("by") not in (None, "confirmed")):
            return {"confirmed": False, "restored": done, "claim": claim}
        write_json(os.path.join(release_dir, "claim.json"), {"by": "confirmed", "time": time.time()})
    return {"confirmed": True, "results": op_batch(s, steps)}
