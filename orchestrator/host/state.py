"""The state dir: its lock, its records (journal, state, releases), the
release sequence, and what ``history``/``status``/``rollback`` read."""

import base64
import errno
import fcntl
import json
import os
import shutil
import socket
import time

from .files import live_sha256, read_json, read_record, write_atomic, write_json, write_mark
from .keep import keep_helper
from .processes import proc_starttime, same_process
from .wire import AgentError, expand, named, payload, sha256_bytes, sha256_file


def op_state_init(s, state_dir):
    root = expand(state_dir)
    for sub in ("", "releases"):
        d = os.path.join(root, sub)
        if not os.path.isdir(d):
            os.makedirs(d, 0o700)
    os.chmod(root, 0o700)
    keep_helper(s)  # a first deploy: the state dir exists from now on
    return root


def lock_view(path):
    """The lock as another run sees it: its holder, and the heartbeat's age."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    holder = read_record(path) or {}
    holder["heartbeat_age"] = time.time() - st.st_mtime
    # pid + start time: a reused pid is not the helper that took the lock
    holder["agent_alive"] = same_process(holder.get("agent_pid"), holder.get("agent_starttime"))
    return holder


def take_over(path, token):
    """Remove the lock ``token`` names, as a compare-and-swap: of two runs
    taking over the same stale lock, exactly one succeeds.

    The lock is first renamed to a name of our own (only one rename of a
    given file can succeed), then checked: if what we moved is not the
    stale lock (someone took over first and made a new one), it is put back.
    """
    aside = "%s.takeover-%d-%s" % (path, os.getpid(), base64.b16encode(os.urandom(4)).decode())
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    moved = read_record(aside) or {}
    if moved.get("token") != token:
        try:
            os.link(aside, path)
        except OSError:
            pass
        os.unlink(aside)
        return False
    os.unlink(aside)
    return True


def op_lock_acquire(s, state_dir, holder, replace_token=None):
    """Take the host's lock, or report who holds it.

    ``holder`` carries who/where/pid/start; the heartbeat is the lock
    file's mtime, renewed every few seconds while this session lives.
    ``replace_token`` takes over a lock the controller judged gone or stale,
    only if it is still that same lock.
    """
    path = os.path.join(expand(state_dir), "lock.json")
    if replace_token is not None and not take_over(path, replace_token):
        return {"acquired": False, "holder": lock_view(path) or {}, "changed_hands": True}
    lock = dict(holder)
    lock["token"] = "%s-%d-%d" % (socket.gethostname(), os.getpid(), int(time.time() * 1000))
    lock["agent_pid"] = os.getpid()
    lock["agent_starttime"] = proc_starttime(os.getpid())
    lock["taken"] = time.time()
    lock["since"] = lock["taken"]  # this host's clock: the holder's ``started`` is its controller's
    # Written whole under a name of our own, then linked into place: link()
    # fails if the lock exists, so the lock appears complete or not at all.
    tmp = "%s.new-%d-%s" % (path, os.getpid(), base64.b16encode(os.urandom(4)).decode())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (json.dumps(lock, indent=1, sort_keys=True) + "\n").encode())
        os.fsync(fd)
        os.link(tmp, path)
    except OSError as e:
        os.close(fd)
        if e.errno == errno.EEXIST:
            return {"acquired": False, "holder": lock_view(path) or {}}
        raise named(e, path) from e
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    s.lock = (path, fd)
    return {"acquired": True, "token": lock["token"]}


def release_own_lock(s):
    """Remove the lock this session holds, if the file there is still ours."""
    lock = s.lock
    if lock is None:
        return False
    path, fd = lock
    s.lock = None
    released = False
    try:
        mine, there = os.fstat(fd), os.stat(path)
        if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
            os.unlink(path)
            released = True
    except OSError:
        pass
    try:
        os.close(fd)
    except OSError:
        pass
    return released


def op_open_state(s, state_dir, holder=None, replace_token=None):
    """Start of a run in one round trip: the state dir, the lock, the records."""
    root = op_state_init(s, state_dir)
    lock = op_lock_acquire(s, root, holder, replace_token) if holder is not None else None
    return {"root": root, "lock": lock, "state": op_state_read(s, root)}


def op_lock_release(s, state_dir):
    return release_own_lock(s)


def op_state_read(s, state_dir):
    """Everything history/status/rollback need, in one round trip."""
    root = expand(state_dir)
    releases = []
    rel_root = os.path.join(root, "releases")
    try:
        names = sorted(os.listdir(rel_root))
    except FileNotFoundError:
        names = []
    for name in names:
        manifest = read_json(os.path.join(rel_root, name, "manifest.json"))
        if manifest is not None:
            if manifest.get("drift"):
                manifest["drift_kept"] = kept_drift(os.path.join(rel_root, name))
            releases.append(manifest)
    journal = read_json(os.path.join(root, "journal.json"))
    return {
        "root": root,
        "exists": os.path.isdir(root),
        "journal": journal,
        "state": read_json(os.path.join(root, "state.json"), {"applied": []}),
        "lock": lock_view(os.path.join(root, "lock.json")),
        "releases": releases,
        "watchdog": watchdog_view(root, journal),
        "host_time": time.time(),
        "pruned": pruned_count(root),
    }


def watchdog_view(root, journal):
    """Whether the watchdog of the journal's release is alive, and when it acts
    (host clock): with the lock's view, what tells a run in progress from one
    whose controller is gone (the watchdog still restores it) from one nobody
    finishes. None when the journal names no release."""
    release = (journal or {}).get("release")
    if not release or "/" in release or release in (".", ".."):
        return None
    release_dir = os.path.join(root, "releases", release)
    record = read_record(os.path.join(release_dir, "watchdog.json")) or {}
    pid, starttime = record.get("pid"), record.get("starttime")
    if pid is None:  # armed by an older helper: the pid alone, and its name
        try:
            with open(os.path.join(release_dir, "watchdog.pid")) as f:
                pid = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pid = None
    alive = same_process(pid, starttime) if pid else False
    if alive and starttime is None:
        try:
            with open("/proc/%d/comm" % pid) as f:
                alive = f.read().strip() == "orch-watchdog"
        except OSError:
            alive = False
    spec = read_json(os.path.join(release_dir, "restore.json")) or {}
    claim = read_record(os.path.join(release_dir, "claim.json")) or {}
    acts_at = record.get("fires_at") or spec.get("deadline")  # host wall time; "deadline": an older helper's
    if claim.get("by") in ("controller", "rollback") and claim.get("until"):
        acts_at = claim["until"]  # backing up a restore under way (as watchdog_wait), host wall time
    return {"release": release, "pid": pid, "alive": alive, "acts_at": acts_at,
            "armed": bool(pid), "restored": os.path.exists(os.path.join(release_dir, "restored.json"))}


SEQ_FILE = "seq"


def next_seq(state_root):
    """The host's next release sequence number: 1, 2, 3 ... in the order releases are made.

    History, retention and ``keep_builds`` order by it, never by a clock: ids
    and build names are stamped with a time, and two controllers (or a host
    whose clock was stepped) can stamp them out of order. Taken while the
    run holds the host's lock; the flock on ``seq.lock`` also keeps two
    helpers that somehow both got here from handing out one number twice.
    """
    fd = os.open(os.path.join(state_root, SEQ_FILE + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = os.path.join(state_root, SEQ_FILE)
        try:
            with open(path) as f:
                last = int(f.read().strip() or 0)
        except (FileNotFoundError, ValueError):
            last = 0
        write_atomic(path, ("%d\n" % (last + 1)).encode(), 0o600)
        return last + 1
    finally:
        os.close(fd)  # closing drops the flock


def op_release_create(s, state_dir, release_id, manifest, files, restore=None):
    """Back up every file into a new release, and check the backups read back.

    ``files``: ``[{"path", "n", "before": data|None, "after": data}]`` (data: see
    ``payload``; the after copy is usually the staged file, copied here). The
    before copy is what restores the host; it is re-read and its sha256
    compared before the controller is allowed to touch the live file.
    ``restore`` is the release's durable restore plan (``restore.json``,
    see the restore machine below). The manifest gets the host's next
    ``seq`` (``next_seq``); the answer is ``{"root", "seq"}``.
    """
    root = os.path.join(expand(state_dir), "releases", release_id)
    os.makedirs(os.path.join(root, "files"), 0o700)
    for f in files:
        for side in ("before", "after"):
            if f.get(side) is None:
                continue
            data = payload(s, f[side])
            dest = os.path.join(root, "files", "%d.%s" % (f["n"], side))
            write_atomic(dest, data, 0o600)
            got = sha256_file(dest)
            if got != sha256_bytes(data):
                raise AgentError("backup", "backup %s reads back with sha256 %s" % (dest, got))
    manifest = dict(manifest, seq=next_seq(expand(state_dir)))
    write_json(os.path.join(root, "manifest.json"), manifest)
    if restore is not None:
        write_json(os.path.join(root, "restore.json"), restore)
    # The restore machine's lock file exists from the start: locking it later
    # needs no free space, so a full disk cannot stop a restore.
    write_mark(os.path.join(root, RESTORE_LOCK))
    return {"root": root, "seq": manifest["seq"]}


def op_release_update(s, state_dir, release_id, fields):
    path = os.path.join(expand(state_dir), "releases", release_id, "manifest.json")
    manifest = read_json(path)
    if manifest is None:
        raise AgentError("state", "release %s has no manifest" % release_id)
    manifest.update(fields)
    write_json(path, manifest)
    return manifest


PRUNED_FILE = "pruned.json"


def pruned_count(state_root):
    """``pruned.json`` as ``history`` reads it: ``{"count", "keep_releases"}``, or None
    (a state dir an older orch pruned: how many it removed is unknown)."""
    record = read_json(os.path.join(state_root, PRUNED_FILE))
    return record if isinstance(record, dict) and isinstance(record.get("count"), int) else None


def nothing_pruned_yet(state_root):
    """Whether this state dir provably never lost a release: every release has a
    manifest with a ``seq``, and they are as many as the sequence handed out.
    Only then may a first ``pruned.json`` start at 0; otherwise it stays absent."""
    try:
        with open(os.path.join(state_root, SEQ_FILE)) as f:
            last = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return False
    rel_root = os.path.join(state_root, "releases")
    try:
        names = os.listdir(rel_root)
    except OSError:
        return False
    seqs = set()
    for name in names:
        manifest = read_json(os.path.join(rel_root, name, "manifest.json"))
        if not isinstance(manifest, dict) or not isinstance(manifest.get("seq"), int):
            return False
        seqs.add(manifest["seq"])
    return seqs == set(range(1, last + 1))


def op_release_prune(s, state_dir, remove, keep=None):
    """Remove the releases ``remove`` names (never one holding drift) and count them
    in ``pruned.json`` with ``keep`` (the ``keep_releases`` that chose them), so that
    ``history`` can say how many older records are gone."""
    state_root = expand(state_dir)
    root = os.path.join(state_root, "releases")
    known = pruned_count(state_root)
    if known is None and nothing_pruned_yet(state_root):
        known = {"count": 0}
    removed = []
    for rid in remove:
        d = os.path.join(root, rid)
        if os.path.isdir(d) and "/" not in rid and rid not in ("", ".", "..") and not kept_drift(d):
            # a release holding what a person wrote (drift) is never pruned, whatever was asked
            shutil.rmtree(d)
            removed.append(rid)
    if known is not None:
        record = {"count": known["count"] + len(removed),
                  "keep_releases": keep if keep is not None else known.get("keep_releases")}
        write_json(os.path.join(state_root, PRUNED_FILE), record)
    return removed


def op_release_log(s, state_dir, release_id, text):
    path = os.path.join(expand(state_dir), "releases", release_id, "run.log")
    # 0600 like the release's other records: the controller masks it, but it is a person's log
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        os.fchmod(fd, 0o600)  # one an older orch wrote 0644
        with os.fdopen(fd, "a") as f:
            f.write(text)
    except OSError as e:
        raise named(e, path) from e
    return True


RESTORE_LOCK = "restore.lock"


def kept_drift(release_dir):
    """The drift copies of a release that still hold the only copy of what a person wrote.

    A copy is needed while it exists and its content is not back in the
    live file; once restored there, or removed by a person, the release may
    be pruned. Returns ``[{"path", "copy"}]`` (empty for most releases).
    """
    record = read_record(os.path.join(release_dir, "restored.json")) or {}
    kept = []
    for f in record.get("files") or []:
        copy = f.get("drift")
        if not copy or not os.path.exists(copy):
            continue
        if live_sha256(os.path.realpath(f["path"])) == f.get("sha256_live"):
            continue  # the person's content is in place again
        kept.append({"path": f["path"], "copy": copy})
    return kept
