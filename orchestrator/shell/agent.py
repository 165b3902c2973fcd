"""orch's helper on the host: a stdlib-only program sent over the connection.

Why it exists: every SSH exec costs a process spawn and often a slow
``~/.bashrc`` (conda or pyenv init), and every request costs a round trip.
So the controller starts this one program once per host per run and sends
it requests as JSON lines; each request does a whole step for every file at
once (read all targets, stage all, commit all, poll health until ready).
Round trips per deploy stay a small constant whatever the number of files,
edits and health polls.

It is also the host-side watchdog: armed before a commit, it restores the
release by itself unless the deploy confirms in time, so a dead link or a
dead controller never leaves the box broken (``python3 agent.py watchdog DIR``).

Rules for this file: standard library only, Python 3.8 syntax, no imports
from orchestrator (it runs on a host where orch is not installed). It is
read as text by ``agent_client`` and executed there with ``AGENT_SOURCE``
set to its own text.

Protocol: the controller writes one JSON request per line,
``{"id": 1, "op": "read", "args": {...}}``. The agent answers with zero or
more events ``{"id": 1, "event": "progress", ...}`` (a ``tick`` at least
every few seconds while an op runs, so the controller can tell a slow step
from a dead link), then one ``{"id": 1, "done": true, "ok": true,
"result": ...}`` or ``{"id": 1, "done": true, "ok": false, "error":
{"type": ..., "message": ...}}``.
"""

import base64
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

PROTOCOL = 1
READY_MAGIC = "ORCH-AGENT-READY"
TICK_SECONDS = 5.0
LOCK_HEARTBEAT_SECONDS = 5.0
LOG_TAIL_LINES = 40

PYTHON_SYNTAX_CHECK = (
    "import sys\n"
    "staged, shown = sys.argv[1], sys.argv[2]\n"
    "src = open(staged, 'rb').read()\n"
    "try:\n"
    "    compile(src, shown, 'exec', dont_inherit=True)\n"
    "except SyntaxError as e:\n"
    "    lines = src.decode('utf-8', 'replace').splitlines()\n"
    "    n = e.lineno or 0\n"
    "    line = lines[n - 1].strip() if 0 < n <= len(lines) else ''\n"
    "    print('%s:%s: SyntaxError: %s%s' % (shown, e.lineno, e.msg, (' :: ' + line) if line else ''))\n"
    "    sys.exit(1)\n"
)


class AgentError(Exception):
    """A step failed in a way the controller should report as such."""

    def __init__(self, kind, message, **details):
        Exception.__init__(self, message)
        self.kind = kind
        self.message = message
        self.details = details


# ---------------------------------------------------------------- small helpers


def b64e(data):
    return base64.b64encode(data).decode("ascii")


def b64d(text):
    return base64.b64decode(text.encode("ascii"))


def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def expand(path):
    return os.path.abspath(os.path.expanduser(path))


def write_atomic(path, data, mode=None, uid=None, gid=None):
    """Write ``data`` to ``path`` by a rename from a sibling, fsynced.

    A reader (or the server starting) sees the old file or the new one,
    never half of one; mode and owner are set before the rename.
    """
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, ".%s.orch-tmp-%d" % (os.path.basename(path), os.getpid()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        if uid is not None and gid is not None:
            try:
                os.chown(tmp, uid, gid)
            except PermissionError:
                pass
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(directory)


def fsync_dir(directory):
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json(path, value):
    write_atomic(path, (json.dumps(value, indent=1, sort_keys=True) + "\n").encode(), 0o600)


def read_json(path, default=None):
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode())
    except FileNotFoundError:
        return default


def tail_lines(path, count=LOG_TAIL_LINES):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[-count:]


def pid_alive(pid):
    if not pid or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        if state in ("Z", "X"):
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            return False
    except (OSError, IndexError):
        pass
    return True


# ---------------------------------------------------------------- the dispatcher

OPS = {}


def op(name):
    def register(fn):
        OPS[name] = fn
        return fn

    return register


class Session(object):
    """One controller's conversation: output lock, ticks, held lock heartbeat."""

    def __init__(self, out):
        self.out = out
        self.out_lock = threading.Lock()
        self.current_id = None
        self.lock_path = None
        self.lock_token = None
        self.children = {}  # pid -> Popen, servers this agent started
        self.stopping = False
        self.requests = []  # lines read by the reader thread, waiting to run
        self.cond = threading.Condition()
        self.cancelled = False  # the controller asked to stop the running op, or went away
        self.eof = False
        self.last_started = {}  # the server this session started last: health_wait(pid="started")

    def reader(self, stdin):
        """Read requests while an op runs, so a ``cancel`` (Ctrl-C on the
        controller) or the end of the connection stops a long wait at once."""
        while True:
            line = stdin.readline()
            with self.cond:
                if not line:
                    self.eof = self.cancelled = True
                    self.cond.notify_all()
                    return
                try:
                    if json.loads(line.decode()).get("op") == "cancel":
                        self.cancelled = True
                        continue
                except ValueError:
                    pass
                self.requests.append(line)
                self.cond.notify_all()

    def next_request(self):
        with self.cond:
            while not self.requests and not self.eof:
                self.cond.wait()
            if self.requests:
                self.cancelled = False
                return self.requests.pop(0)
            return None

    def check_cancel(self):
        if self.cancelled:
            raise AgentError("cancelled", "cancelled by the controller")

    def send(self, message):
        line = json.dumps(message, separators=(",", ":")) + "\n"
        with self.out_lock:
            self.out.write(line.encode())
            self.out.flush()

    def event(self, kind, **fields):
        if self.current_id is None:
            return
        fields["id"] = self.current_id
        fields["event"] = kind
        self.send(fields)

    def background(self):
        """Ticks while an op runs; renews the lock heartbeat while held."""
        last_beat = last_tick = 0.0
        while not self.stopping:
            time.sleep(1.0)
            now = time.time()
            if self.current_id is not None and now - last_tick >= TICK_SECONDS:
                last_tick = now
                try:
                    self.event("tick", t=now)
                except (OSError, ValueError):
                    return
            if self.lock_path and now - last_beat >= LOCK_HEARTBEAT_SECONDS:
                last_beat = now
                renew_heartbeat(self.lock_path, self.lock_token)


SESSION = None  # type: Session


def serve(stdin, stdout):
    global SESSION
    SESSION = Session(stdout)
    ticker = threading.Thread(target=SESSION.background, daemon=True)
    ticker.start()
    SESSION.send(
        {"ready": READY_MAGIC, "protocol": PROTOCOL, "pid": os.getpid(), "python": sys.version.split()[0]}
    )
    threading.Thread(target=SESSION.reader, args=(stdin,), daemon=True).start()
    while True:
        line = SESSION.next_request()
        if not line:
            break
        try:
            request = json.loads(line.decode())
        except ValueError:
            SESSION.send({"id": None, "done": True, "ok": False,
                          "error": {"type": "protocol", "message": "bad request line"}})
            continue
        rid = request.get("id")
        SESSION.current_id = rid
        try:
            fn = OPS.get(request.get("op"))
            if fn is None:
                raise AgentError("protocol", "unknown op %r" % request.get("op"))
            result = fn(**(request.get("args") or {}))
            reply = {"id": rid, "done": True, "ok": True, "result": result}
        except AgentError as e:
            reply = {"id": rid, "done": True, "ok": False,
                     "error": {"type": e.kind, "message": e.message, "details": e.details}}
        except Exception as e:  # reported, not fatal: the controller decides
            reply = {"id": rid, "done": True, "ok": False,
                     "error": {"type": "internal", "message": "%s: %s" % (type(e).__name__, e)}}
        SESSION.current_id = None
        SESSION.send(reply)
        if request.get("op") == "bye":
            # Leave at once: a normal interpreter exit would wait on the reader
            # thread blocked in stdin (a second of stall per run, measured).
            sys.stdout.flush()
            os._exit(0)
    SESSION.stopping = True


@op("bye")
def op_bye():
    return True


@op("batch")
def op_batch(steps):
    """Several ops in one round trip; stops at the first failure."""
    results = []
    for i, step in enumerate(steps):
        fn = OPS.get(step["op"])
        if fn is None:
            raise AgentError("protocol", "unknown op %r" % step["op"])
        try:
            results.append(fn(**(step.get("args") or {})))
        except AgentError as e:
            e.details["step"] = i
            e.details["done"] = results
            raise
    return results


@op("hello")
def op_hello():
    return {
        "protocol": PROTOCOL,
        "pid": os.getpid(),
        "python": sys.executable,
        "python_version": sys.version.split()[0],
        "hostname": socket.gethostname(),
        "uid": os.getuid(),
        "home": os.path.expanduser("~"),
        "nvidia_smi": shutil.which("nvidia-smi"),
        "time": time.time(),
    }


# ---------------------------------------------------------------- files


def file_info(path, with_data=True):
    path = expand(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return {"path": path, "exists": False}
    with open(path, "rb") as f:
        data = f.read()
    info = {"path": path, "exists": True, "mode": st.st_mode & 0o7777, "uid": st.st_uid,
            "gid": st.st_gid, "sha256": sha256_bytes(data), "size": len(data)}
    if with_data:
        info["data"] = b64e(data)
    return info


@op("read")
def op_read(paths, with_data=True):
    return [file_info(p, with_data) for p in paths]


@op("sha256")
def op_sha256(paths):
    out = {}
    for p in paths:
        try:
            out[p] = sha256_file(expand(p))
        except FileNotFoundError:
            out[p] = None
    return out


def staged_name(path, token):
    directory, base = os.path.split(path)
    stem, ext = os.path.splitext(base)
    return os.path.join(directory, ".%s.orch-staged-%s%s" % (stem, token, ext))


STALE_STAGED_SECONDS = 600.0


def remove_stale_staged(path):
    """Staged siblings a dead controller left behind (older than 10 minutes,
    so a ``--check`` running right now is not disturbed)."""
    directory, base = os.path.split(path)
    stem, ext = os.path.splitext(base)
    prefix, removed = ".%s.orch-staged-" % stem, []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(prefix) and name.endswith(ext)):
            continue
        full = os.path.join(directory, name)
        try:
            if time.time() - os.lstat(full).st_mtime > STALE_STAGED_SECONDS:
                os.unlink(full)
                removed.append(full)
        except OSError:
            pass
    return removed


@op("stage")
def op_stage(files, token, clean_stale=False):
    """Write each new content to a hidden sibling of its target.

    Same directory, so the final rename is atomic and a validator sees the
    file where it will live (relative imports, config lookups). A deploy
    (``clean_stale``) first removes the siblings a dead run left.
    """
    out = []
    for f in files:
        path = expand(f["path"])
        data = b64d(f["data"])
        staged = staged_name(path, token)
        if clean_stale:
            remove_stale_staged(path)
        try:
            st = os.stat(path)
            mode, uid, gid = st.st_mode & 0o7777, st.st_uid, st.st_gid
        except FileNotFoundError:
            mode, uid, gid = 0o644, None, None
        try:
            write_atomic(staged, data, mode, uid, gid)
        except OSError as e:
            raise AgentError("stage", "cannot stage %s: %s" % (path, e.strerror or e), path=path)
        got = sha256_file(staged)
        if got != sha256_bytes(data):
            raise AgentError("stage", "staged copy of %s reads back wrong (sha256 %s)" % (path, got))
        out.append({"path": path, "staged": staged, "sha256": got})
    return out


def dir_snapshot(directory):
    snap = set()
    for sub in (directory, os.path.join(directory, "__pycache__")):
        try:
            for name in os.listdir(sub):
                snap.add(os.path.join(sub, name))
        except OSError:
            pass
    snap.add(os.path.join(directory, "__pycache__")) if os.path.isdir(
        os.path.join(directory, "__pycache__")) else None
    return snap


def run_argv(argv, cwd=None, env=None, timeout=600.0, stdin=None, limit=64 * 1024):
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    try:
        proc = subprocess.run(argv, cwd=cwd, env=full_env, input=stdin, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout)
    except FileNotFoundError:
        return {"rc": 127, "stdout": "", "stderr": "command not found: %s" % argv[0]}
    except subprocess.TimeoutExpired:
        return {"rc": 124, "stdout": "", "stderr": "timed out after %ss" % timeout}
    return {"rc": proc.returncode,
            "stdout": proc.stdout[-limit:].decode("utf-8", "replace"),
            "stderr": proc.stderr[-limit:].decode("utf-8", "replace")}


@op("run")
def op_run(argv, cwd=None, env=None, timeout=600.0, stdin=None):
    return run_argv(argv, cwd and expand(cwd), env, timeout, b64d(stdin) if stdin else None)


@op("validate")
def op_validate(checks, timeout=600.0):
    """Run each file's validators on its staged copy, then clean up after them.

    A validator may leave files beside the target (``__pycache__``, a
    ``.mypy_cache``): whatever appeared in the target's directory while it ran
    is removed, so a check leaves no trace.
    """
    results = []
    for check in checks:
        staged, target = check["staged"], check["target"]
        directory = os.path.dirname(target)
        before = dir_snapshot(directory)
        for argv in check["argvs"]:
            if argv == ["python-syntax"]:
                argv = [check.get("python") or sys.executable, "-c", PYTHON_SYNTAX_CHECK, staged, target]
            res = run_argv(argv, cwd=directory, env={"PYTHONDONTWRITEBYTECODE": "1"}, timeout=timeout)
            res["argv"] = argv
            res["target"] = target
            results.append(res)
            if res["rc"] != 0:
                break
        left = sorted(dir_snapshot(directory) - before)
        for extra in left:
            if extra == staged:
                continue
            if os.path.isdir(extra) and not os.path.islink(extra):
                shutil.rmtree(extra, ignore_errors=True)
            else:
                try:
                    os.unlink(extra)
                except OSError:
                    pass
        if results and results[-1]["rc"] != 0:
            break
    return results


@op("remove")
def op_remove(paths):
    removed = []
    for p in paths:
        try:
            os.unlink(expand(p))
            removed.append(p)
        except FileNotFoundError:
            pass
    return removed


@op("commit")
def op_commit(files):
    """Move each staged file over its target (atomic rename), mode and owner kept.

    The whole file is re-read and its sha256 must be the planned one.
    Returns the files committed, in order, so a failure part-way tells the
    controller exactly which to restore.
    """
    done = []
    for f in files:
        path, staged = expand(f["path"]), f["staged"]
        try:
            st = os.stat(path)
            os.chmod(staged, st.st_mode & 0o7777)
            try:
                os.chown(staged, st.st_uid, st.st_gid)
            except PermissionError:
                pass
        except FileNotFoundError:
            pass
        try:
            os.replace(staged, path)
        except OSError as e:
            raise AgentError("commit", "cannot commit %s: %s" % (path, e.strerror or e),
                             committed=done, path=path)
        fsync_dir(os.path.dirname(path))
        got = sha256_file(path)
        if got != f["sha256"]:
            raise AgentError("commit", "%s reads back with sha256 %s, planned %s" % (path, got, f["sha256"]),
                             committed=done + [path], path=path)
        done.append(path)
    return done


# ---------------------------------------------------------------- state dir, lock, journal


@op("state_init")
def op_state_init(state_dir):
    root = expand(state_dir)
    for sub in ("", "releases"):
        d = os.path.join(root, sub)
        if not os.path.isdir(d):
            os.makedirs(d, 0o700)
    os.chmod(root, 0o700)
    return root


def renew_heartbeat(path, token):
    lock = read_json(path)
    if not lock or lock.get("token") != token:
        return
    lock["heartbeat"] = time.time()
    try:
        write_json(path, lock)
    except OSError:
        pass


@op("lock_acquire")
def op_lock_acquire(state_dir, holder, replace_token=None):
    """Take the host's lock, or report who holds it.

    ``holder`` carries who/where/pid/start; the agent adds the heartbeat it
    renews every few seconds while this session lives. ``replace_token``
    takes over a lock the controller judged gone or stale (compare-and-swap:
    only if it is still that same lock).
    """
    path = os.path.join(expand(state_dir), "lock.json")
    lock = dict(holder)
    lock["token"] = "%s-%d-%d" % (socket.gethostname(), os.getpid(), int(time.time() * 1000))
    lock["heartbeat"] = time.time()
    lock["agent_pid"] = os.getpid()
    data = (json.dumps(lock, indent=1, sort_keys=True) + "\n").encode()
    existing = read_json(path)
    if existing is not None:
        if replace_token is None or existing.get("token") != replace_token:
            existing["heartbeat_age"] = time.time() - float(existing.get("heartbeat", 0))
            existing["agent_alive"] = pid_alive(existing.get("agent_pid"))
            return {"acquired": False, "holder": existing}
        os.unlink(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        if e.errno == errno.EEXIST:
            existing = read_json(path) or {}
            existing["heartbeat_age"] = time.time() - float(existing.get("heartbeat", 0))
            return {"acquired": False, "holder": existing}
        raise
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    SESSION.lock_path, SESSION.lock_token = path, lock["token"]
    return {"acquired": True, "token": lock["token"]}


@op("open_state")
def op_open_state(state_dir, holder=None, replace_token=None):
    """Start of a run in one round trip: the state dir, the lock, the records."""
    root = op_state_init(state_dir)
    lock = op_lock_acquire(root, holder, replace_token) if holder is not None else None
    return {"root": root, "lock": lock, "state": op_state_read(root)}


@op("lock_release")
def op_lock_release(state_dir):
    path = os.path.join(expand(state_dir), "lock.json")
    lock = read_json(path)
    if lock and lock.get("token") == SESSION.lock_token:
        os.unlink(path)
    SESSION.lock_path = SESSION.lock_token = None
    return True


@op("get_json")
def op_get_json(path, default=None):
    return read_json(expand(path), default)


@op("put_json")
def op_put_json(path, value):
    write_json(expand(path), value)
    return True


@op("state_read")
def op_state_read(state_dir):
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
            releases.append(manifest)
    return {
        "root": root,
        "exists": os.path.isdir(root),
        "journal": read_json(os.path.join(root, "journal.json")),
        "state": read_json(os.path.join(root, "state.json"), {"applied": []}),
        "lock": read_json(os.path.join(root, "lock.json")),
        "releases": releases,
    }


# ---------------------------------------------------------------- releases


@op("release_create")
def op_release_create(state_dir, release_id, manifest, files):
    """Back up every file into a new release, and check the backups read back.

    ``files``: ``[{"path", "n", "before": b64|None, "after": b64}]``. The
    before copy is what restores the host; it is re-read and its sha256
    compared before the controller is allowed to touch the live file.
    """
    root = os.path.join(expand(state_dir), "releases", release_id)
    os.makedirs(os.path.join(root, "files"), 0o700)
    for f in files:
        for side in ("before", "after"):
            if f.get(side) is None:
                continue
            data = b64d(f[side])
            dest = os.path.join(root, "files", "%d.%s" % (f["n"], side))
            write_atomic(dest, data, 0o600)
            got = sha256_file(dest)
            if got != sha256_bytes(data):
                raise AgentError("backup", "backup %s reads back with sha256 %s" % (dest, got))
    write_json(os.path.join(root, "manifest.json"), manifest)
    return root


@op("release_update")
def op_release_update(state_dir, release_id, fields):
    path = os.path.join(expand(state_dir), "releases", release_id, "manifest.json")
    manifest = read_json(path)
    if manifest is None:
        raise AgentError("state", "release %s has no manifest" % release_id)
    manifest.update(fields)
    write_json(path, manifest)
    return manifest


@op("release_prune")
def op_release_prune(state_dir, remove):
    root = os.path.join(expand(state_dir), "releases")
    removed = []
    for rid in remove:
        d = os.path.join(root, rid)
        if os.path.isdir(d) and "/" not in rid and rid not in ("", ".", ".."):
            shutil.rmtree(d)
            removed.append(rid)
    return removed


@op("release_log")
def op_release_log(state_dir, release_id, text):
    path = os.path.join(expand(state_dir), "releases", release_id, "run.log")
    with open(path, "a") as f:
        f.write(text)
    return True


# ---------------------------------------------------------------- server processes


def listening_inodes(port):
    inodes = set()
    hexport = ":%04X" % port
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[1].endswith(hexport) and parts[3] == "0A":
                        inodes.add(parts[9])
        except OSError:
            pass
    return inodes


def pid_listening_on(port):
    inodes = listening_inodes(port)
    if not inodes:
        return None
    targets = set("socket:[%s]" % i for i in inodes)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fd_dir = "/proc/%s/fd" % name
        try:
            for fd in os.listdir(fd_dir):
                try:
                    if os.readlink(os.path.join(fd_dir, fd)) in targets:
                        return int(name)
                except OSError:
                    continue
        except OSError:
            continue
    return None


def port_busy(port):
    return bool(listening_inodes(port))


def process_record(pid):
    """argv, cwd and environment of a running process: what rollback restarts."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = [a.decode("utf-8", "surrogateescape") for a in f.read().split(b"\0")[:-1]]
        cwd = os.readlink("/proc/%d/cwd" % pid)
        with open("/proc/%d/environ" % pid, "rb") as f:
            env = {}
            for item in f.read().split(b"\0"):
                if b"=" in item:
                    k, v = item.split(b"=", 1)
                    env[k.decode("utf-8", "surrogateescape")] = v.decode("utf-8", "surrogateescape")
    except OSError as e:
        raise AgentError("server", "cannot read process %d: %s" % (pid, e))
    return {"pid": pid, "pgid": os.getpgid(pid), "sid": os.getsid(pid), "argv": argv, "cwd": cwd, "env": env}


def read_pidfile(pidfile):
    if not pidfile:
        return None
    try:
        with open(expand(pidfile)) as f:
            pid = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) else None


@op("server_find")
def op_server_find(pidfile=None, port=None):
    """The running server, by its pidfile or by the process listening on the port."""
    pid = read_pidfile(pidfile)
    how = "pidfile"
    if pid is None and port:
        pid, how = pid_listening_on(port), "port"
    if pid is None:
        return None
    rec = process_record(pid)
    rec["found_by"] = how
    return rec


@op("process")
def op_process(pid):
    """The record of a pid a ``commands`` manager's ``pid`` command printed."""
    if not pid_alive(pid):
        return None
    rec = process_record(pid)
    rec["found_by"] = "pid command"
    return rec


def descendants(pid):
    """Every live process below ``pid``: a server's workers (SGLang's scheduler
    and detokenizer) must go with it, or they keep the GPUs."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.append(child)
                todo.append(child)
    return out


def group_members(pgid):
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.getpgid(int(name)) == pgid and pid_alive(int(name)):
                members.append(int(name))
        except OSError:
            continue
    return members


def gpu_pids():
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    res = run_argv([exe, "--query-compute-apps=pid", "--format=csv,noheader"], timeout=30)
    if res["rc"] != 0:
        return None
    return set(int(x) for x in res["stdout"].split() if x.strip().isdigit())


@op("server_stop")
def op_server_stop(pid, pgid=None, stop_timeout=30.0, port=None, free_timeout=120.0):
    """SIGTERM the whole process group, SIGKILL after ``stop_timeout``.

    Then wait for the port to be free and, where nvidia-smi exists, for the
    old processes to leave the GPUs: starting a new server while the old one
    still holds GPU memory is a guaranteed out-of-memory at load.
    """
    own = os.getpgid(0)
    use_group = pgid is not None and pgid not in (own, 0, 1) and pgid == pid
    targets = group_members(pgid) if use_group else [pid]
    if pid not in targets and pid_alive(pid):
        targets.append(pid)
    for child in descendants(pid):
        if child not in targets:
            targets.append(child)

    def signal_all(sig):
        if use_group:
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
        for p in targets:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass

    signal_all(signal.SIGTERM)
    SESSION.event("progress", msg="SIGTERM sent to %s" % ("group %d" % pgid if use_group else "pid %d" % pid))
    killed = False
    deadline = time.time() + stop_timeout
    while any(pid_alive(p) for p in targets):
        reap_children()
        if time.time() >= deadline:
            if killed:
                break
            signal_all(signal.SIGKILL)
            SESSION.event("progress", msg="still running after %ss: SIGKILL" % stop_timeout)
            killed = True
            deadline = time.time() + 10.0
        time.sleep(0.1)
    reap_children()
    left = [p for p in targets if pid_alive(p)]
    if left:
        raise AgentError("server", "server processes %s did not exit" % left)
    deadline = time.time() + free_timeout
    while port and port_busy(port):
        if time.time() >= deadline:
            raise AgentError("server", "port %d still in use %ss after the server stopped" % (port, free_timeout))
        time.sleep(0.1)
    while True:
        on_gpu = gpu_pids()
        if not on_gpu or not (on_gpu & set(targets)):
            break
        if time.time() >= deadline:
            raise AgentError("server", "old server processes still hold GPUs: %s" % sorted(on_gpu & set(targets)))
        time.sleep(0.5)
    return {"stopped": targets, "killed": killed}


def reap_children():
    for pid, proc in list(SESSION.children.items()) if SESSION else []:
        if proc.poll() is not None:
            pass


@op("server_start")
def op_server_start(argv, cwd=None, env=None, log=None, pidfile=None, replace_env=False):
    """Start the server detached: own session, output to its log, a pidfile.

    ``replace_env``: the environment is exactly ``env`` (a recorded one, so
    rollback restarts exactly what ran), else the agent's plus ``env``.
    """
    full_env = dict(env or {}) if replace_env else dict(os.environ, **(env or {}))
    cwd = expand(cwd) if cwd else None
    log_path = expand(log) if log else os.devnull
    if log:
        d = os.path.dirname(log_path)
        if not os.path.isdir(d):
            os.makedirs(d, 0o755)
        if os.path.exists(log_path):
            os.replace(log_path, log_path + ".1")
    out = open(log_path, "ab")
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=full_env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    except OSError as e:
        raise AgentError("server", "cannot start %s: %s" % (argv[0], e.strerror or e))
    finally:
        out.close()
    if SESSION is not None:
        SESSION.children[proc.pid] = proc
        SESSION.last_started = {"pid": proc.pid, "log": log_path}
        SESSION.event("progress", msg="started pid %d, log %s" % (proc.pid, log_path))
    if pidfile:
        p = expand(pidfile)
        d = os.path.dirname(p)
        if not os.path.isdir(d):
            os.makedirs(d, 0o755)
        write_atomic(p, ("%d\n" % proc.pid).encode(), 0o644)
    return {"pid": proc.pid, "pgid": proc.pid, "argv": argv, "cwd": cwd, "log": log_path}


@op("run_ok")
def op_run_ok(argv, timeout=600.0):
    """A user's server command (``commands`` manager) that must succeed."""
    return run_server_cmd(argv, timeout)


@op("commands_start")
def op_commands_start(start, pid_cmd=None, timeout=600.0):
    """The ``commands`` manager's start, then its ``pid`` command, so the
    health wait can watch that process (``health_wait(pid="started")``)."""
    run_server_cmd(start, timeout)
    SESSION.last_started = {}
    if pid_cmd:
        got = run_argv(pid_cmd, timeout=60.0)
        words = got["stdout"].split()
        if got["rc"] == 0 and words and words[0].isdigit():
            SESSION.last_started = {"pid": int(words[0]), "log": None}
            SESSION.event("progress", msg="started pid %s" % words[0])
    return dict(SESSION.last_started)


def exit_code_of(pid):
    """The exit code if ``pid`` has ended, else None."""
    proc = SESSION.children.get(pid) if SESSION else None
    if proc is not None:
        return proc.poll()
    return None if pid_alive(pid) else "unknown"


def run_check(base_url, check, timeout):
    url = base_url.rstrip("/") + check["path"]
    body = None
    headers = dict(check.get("headers") or {})
    if check.get("json") is not None:
        body = json.dumps(check["json"]).encode()
        headers.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=body, method=check["method"].upper(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, text = resp.status, resp.read(1 << 20).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read(1 << 16).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return False, "%s %s: %s" % (check["method"].upper(), check["path"], reason)
    want = check.get("status", 200)
    if status != want:
        return False, "%s %s: HTTP %d (want %d)" % (check["method"].upper(), check["path"], status, want)
    if check.get("body") and not re.search(check["body"], text):
        return False, "%s %s: body does not match %r" % (check["method"].upper(), check["path"], check["body"])
    expect = check.get("expect") or {}
    if expect:
        try:
            doc = json.loads(text)
        except ValueError:
            return False, "%s %s: body is not JSON" % (check["method"].upper(), check["path"])
        for key, value in expect.items():
            if not isinstance(doc, dict) or key not in doc:
                return False, "%s %s: no key %r" % (check["method"].upper(), check["path"], key)
            if not same_value(doc[key], value):
                return False, "%s %s: %s is %r (want %r)" % (
                    check["method"].upper(), check["path"], key, doc[key], value)
    return True, "%s %s: ok" % (check["method"].upper(), check["path"])


def same_value(got, want):
    if got == want:
        return True
    if isinstance(got, (int, float)) and isinstance(want, (int, float)) and not isinstance(got, bool):
        return float(got) == float(want)
    return False


@op("health_wait")
def op_health_wait(base_url, checks, timeout, interval, pid=None, log=None, settle=0.0):
    """Poll every check until all pass, the timeout passes, or the server dies.

    The process is watched between polls: if it exits, this fails at once
    with its exit code and the tail of its log — the SyntaxError or the
    ``unrecognized arguments`` is on screen seconds after the start, not
    after a fifteen-minute timeout.
    """
    if pid == "started":  # in a batch right after server_start
        pid, log = SESSION.last_started.get("pid"), SESSION.last_started.get("log")
    if timeout > 0:
        SESSION.event("progress", msg="waiting up to %.0f s for %s to be healthy" % (timeout, base_url))
    start = time.time()
    deadline = start + timeout
    last = said = ""
    said_at = 0.0
    polls = 0
    while True:
        SESSION.check_cancel()
        if pid is not None:
            code = exit_code_of(pid)
            if code is not None:
                why = "code %s" % code if code != "unknown" else "not started by orch's helper: exit code unknown"
                raise AgentError("server_exited", "server exited during start (%s)" % why,
                                 code=code, log_tail=tail_lines(log) if log else [], polls=polls)
        ok_all = True
        for check in checks:
            ok, last = run_check(base_url, check, min(max(interval, 1.0) * 5, 30.0))
            if not ok:
                ok_all = False
                break
        polls += 1
        if ok_all:
            return {"elapsed": time.time() - start, "polls": polls, "last": last}
        # Say what we wait for when it changes, and every 10 s: not at every poll.
        now = time.time()
        if last != said or now - said_at >= 10.0:
            said, said_at = last, now
            SESSION.event("health", msg=last, elapsed=round(now - start, 1), polls=polls)
        if time.time() >= deadline:
            raise AgentError("health_timeout", "not healthy after %ss: %s" % (timeout, last),
                             log_tail=tail_lines(log) if log else [], polls=polls, last=last)
        # Poll quickly at first (a small server is up in a fraction of a
        # second), backing off to ``interval``: 0.05, 0.1, 0.2 … s.
        wake = time.time() + min(interval, 0.05 * (2 ** min(polls, 10)))
        while time.time() < wake:
            SESSION.check_cancel()
            time.sleep(min(0.1, max(0.0, wake - time.time())))


@op("log_tail")
def op_log_tail(path, lines=LOG_TAIL_LINES):
    return tail_lines(expand(path), lines)


# ---------------------------------------------------------------- restoring a state


def restore_files(files):
    """Put each file back as recorded; ``source`` None means it did not exist."""
    done = []
    for f in files:
        path = expand(f["path"])
        if f.get("source") is None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            done.append(path)
            continue
        with open(f["source"], "rb") as src:
            data = src.read()
        if sha256_bytes(data) != f["sha256"]:
            raise AgentError("restore", "backup %s is damaged (sha256 %s, recorded %s)" % (
                f["source"], sha256_bytes(data), f["sha256"]))
        write_atomic(path, data, f.get("mode"), f.get("uid"), f.get("gid"))
        if sha256_file(path) != f["sha256"]:
            raise AgentError("restore", "%s reads back wrong after restore" % path)
        done.append(path)
    return done


@op("restore_files")
def op_restore_files(files):
    return restore_files(files)


def run_server_cmd(argv, timeout=600.0):
    res = run_argv(argv, timeout=timeout)
    if res["rc"] != 0:
        raise AgentError("server", "%s exited %d: %s" % (
            " ".join(argv), res["rc"], (res["stderr"] or res["stdout"]).strip()[-300:]))
    return res


def apply_server(server):
    """Bring the server to a recorded state: stop what runs, start ``start``."""
    if not server:
        return None
    manager = server.get("manager", "process")
    if manager == "commands":
        if server.get("stop"):
            run_server_cmd(server["stop"])
        started = None
        if server.get("start"):
            run_server_cmd(server["start"])
            started = {"pid": None}
        return started
    running = op_server_find(server.get("pidfile"), server.get("port"))
    if running is not None:
        op_server_stop(running["pid"], running["pgid"], server.get("stop_timeout", 30.0), server.get("port"))
    start = server.get("start")
    if not start:
        return None
    return op_server_start(start["argv"], start.get("cwd"), start.get("env"), server.get("log"),
                           server.get("pidfile"), start.get("replace_env", False))


@op("apply_state")
def op_apply_state(files, server=None, health=None):
    """Restore files, restart the recorded server, health-check it.

    One code path for an automatic rollback, ``orch rollback`` and the
    watchdog, so they cannot drift apart.
    """
    result = {"files": restore_files(files)}
    SESSION.event("progress", msg="files restored: %d" % len(result["files"]))
    started = apply_server(server)
    result["server"] = started
    if started is not None and health:
        result["health"] = op_health_wait(pid=started.get("pid"), log=started.get("log"), **health)
    return result


# ---------------------------------------------------------------- the watchdog


def claim(release_dir, who):
    """Exactly one of confirm / controller rollback / watchdog acts on a release."""
    path = os.path.join(release_dir, "claim")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        if e.errno == errno.EEXIST:
            with open(path) as f:
                return f.read().strip()
        raise
    with os.fdopen(fd, "w") as f:
        f.write(who)
    return who


@op("watchdog_arm")
def op_watchdog_arm(state_dir, release_dir, deadline, plan, python=None):
    """Leave a process on the host that restores ``plan`` at ``deadline``.

    It needs nothing from the controller after this call: its own copy of
    this program, the plan and the backups are on the host's disk.
    """
    root = expand(state_dir)
    agent_path = os.path.join(root, "agent.py")
    write_atomic(agent_path, AGENT_SOURCE.encode(), 0o600)  # noqa: F821 (set by the bootstrap)
    write_json(os.path.join(release_dir, "restore.json"), {"deadline": deadline, "plan": plan})
    log = open(os.path.join(release_dir, "watchdog.log"), "ab")
    proc = subprocess.Popen([python or sys.executable, agent_path, "watchdog", release_dir],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, close_fds=True, cwd="/")
    log.close()
    with open(os.path.join(release_dir, "watchdog.pid"), "w") as f:
        f.write("%d\n" % proc.pid)
    return {"pid": proc.pid, "deadline": deadline}


@op("claim_then")
def op_claim_then(release_dir, who, steps):
    """Claim the release and, only if this claim won, run ``steps`` (one round trip)."""
    holder = op_claim(release_dir, who)
    if holder != who:
        return {"holder": holder, "results": None}
    return {"holder": holder, "results": op_batch(steps)}


@op("claim")
def op_claim(release_dir, who):
    """Claim a release for ``who``; returns who holds the claim now."""
    holder = claim(release_dir, who)
    if holder == who:
        try:
            with open(os.path.join(release_dir, "watchdog.pid")) as f:
                os.kill(int(f.read().strip()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
    return holder


def watchdog_main(release_dir):
    spec = read_json(os.path.join(release_dir, "restore.json"))
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while time.time() < spec["deadline"]:
        if os.path.exists(os.path.join(release_dir, "claim")):
            return 0
        time.sleep(min(1.0, max(0.05, spec["deadline"] - time.time())))
    if claim(release_dir, "watchdog") != "watchdog":
        return 0
    print("%s watchdog: deadline passed unconfirmed; restoring" % time.strftime("%Y-%m-%dT%H:%M:%S"))
    sys.stdout.flush()
    global SESSION
    SESSION = Session(open(os.devnull, "wb"))
    outcome = {"watchdog": True, "time": time.time()}
    try:
        result = op_apply_state(**spec["plan"])
        outcome.update(ok=True, result=result)
        print("restored: %s" % json.dumps(result))
    except Exception as e:
        outcome.update(ok=False, error=str(e))
        print("restore FAILED: %s" % e)
    write_json(os.path.join(release_dir, "watchdog.json"), outcome)
    manifest_path = os.path.join(release_dir, "manifest.json")
    manifest = read_json(manifest_path) or {}
    manifest["outcome"] = "rolled_back" if outcome["ok"] else "rollback_failed"
    manifest["error"] = manifest.get("error") or "not confirmed before the watchdog deadline"
    manifest["restored_by"] = "watchdog"
    write_json(manifest_path, manifest)
    state_root = os.path.dirname(os.path.dirname(release_dir))
    journal_path = os.path.join(state_root, "journal.json")
    journal = read_json(journal_path)
    if journal and journal.get("release") == os.path.basename(release_dir) and outcome["ok"]:
        journal["step"] = "restored_by_watchdog"
        journal["finished"] = True
        write_json(journal_path, journal)
    return 0 if outcome["ok"] else 1


# ================================================================ nightly: builds, the link switch, the probe
#
# Ops added for `orch nightly` (and the probe a performance gate builds on).
# They touch nothing above: a night builds into a fresh directory beside the
# live one, and only `nightly_link_swap` changes what is live, by one rename.


def nightly_git_env():
    """Never prompt for credentials on the host: a night runs unattended."""
    return {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "/bin/true", "LC_ALL": "C"}


def stream_argv(argv, cwd=None, env=None, log=None, timeout=3600.0):
    """Run ``argv``, sending each output line as a progress event and to ``log``.

    The build's own output is what a person watches during a night, and what
    they read the next morning in the log; the last lines come back with a
    failure. Cancel (Ctrl-C on the controller) and ``timeout`` end the whole
    process group.
    """
    full_env = dict(os.environ)
    full_env.update(env or {})
    tail = []
    log_file = open(log, "ab") if log else None
    try:
        if log_file is not None:
            log_file.write(("$ %s\n" % " ".join(argv)).encode())
            log_file.flush()
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env=full_env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True)
        except OSError as e:
            raise AgentError("build", "cannot run %s: %s" % (argv[0], e.strerror or e), argv=argv)

        def pump():
            for raw in iter(proc.stdout.readline, b""):
                if log_file is not None:
                    log_file.write(raw)
                    log_file.flush()
                line = raw.decode("utf-8", "replace").rstrip("\r\n").split("\r")[-1]
                tail.append(line)
                del tail[:-LOG_TAIL_LINES]
                if SESSION is not None:
                    SESSION.event("progress", msg=line, stream="build")

        reader = threading.Thread(target=pump)
        reader.daemon = True
        reader.start()
        deadline = time.time() + timeout
        why = None
        while proc.poll() is None:
            if SESSION is not None and SESSION.cancelled:
                why = "cancelled by the controller"
            elif time.time() >= deadline:
                why = "timed out after %ss" % timeout
            if why:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.wait()
                break
            time.sleep(0.05)
        reader.join(5.0)
        if why:
            raise AgentError("build", "%s %s" % (" ".join(argv[:3]), why), log_tail=list(tail), argv=argv)
        if proc.returncode != 0:
            raise AgentError("build", "%s exited %d" % (" ".join(argv[:3]), proc.returncode),
                             log_tail=list(tail), argv=argv, rc=proc.returncode)
        return {"rc": 0, "tail": list(tail)}
    finally:
        if log_file is not None:
            log_file.close()


def capture_argv(argv, cwd=None, env=None, timeout=600.0):
    res = run_argv(argv, cwd=cwd, env=env, timeout=timeout)
    if res["rc"] != 0:
        raise AgentError("build", "%s exited %d: %s" % (" ".join(argv[:3]), res["rc"],
                                                      (res["stderr"] or res["stdout"]).strip()[-300:]))
    return res["stdout"]


def build_path(builds_dir, name):
    """A build's directory: a plain name directly inside ``builds_dir``."""
    if not name or "/" in name or name in (".", "..") or name.startswith("."):
        raise AgentError("build", "not a build name: %r" % name)
    return os.path.join(expand(builds_dir), name)


def read_link(link):
    try:
        return os.readlink(link)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise AgentError("switch", "%s exists and is not a symlink" % link)
        raise


@op("nightly_prepare")
def op_nightly_prepare(builds_dir, build):
    """Make ``builds_dir`` (and its ``logs/``), say what ``current`` points to.

    The new build's directory must not exist yet: a night never builds over
    anything.
    """
    root = expand(builds_dir)
    for d in (root, os.path.join(root, "logs")):
        if not os.path.isdir(d):
            os.makedirs(d, 0o755)
    dest = build_path(root, build)
    if os.path.lexists(dest):
        raise AgentError("build", "%s already exists" % dest)
    current = read_link(os.path.join(root, "current"))
    builds = sorted(n for n in os.listdir(root)
                    if not n.startswith(".") and n not in ("current", "logs")
                    and os.path.isdir(os.path.join(root, n)) and not os.path.islink(os.path.join(root, n)))
    return {"builds_dir": root, "build_dir": dest, "current": current, "builds": builds,
            "log": os.path.join(root, "logs", build + ".log"), "python_version": sys.version.split()[0]}


@op("nightly_fetch_git")
def op_nightly_fetch_git(repo, commit, builds_dir, build, log, timeout=3600.0):
    """Fetch ``repo`` into a mirror cache on the host, check out exactly ``commit``.

    The cache (``builds_dir/.cache/git/<hash of the URL>.git``) makes the
    next night a fetch, not a clone; the build itself is a local clone of the
    cache, checked out detached at the commit, and ``HEAD`` is read back.
    """
    root = expand(builds_dir)
    dest = build_path(root, build)
    env = nightly_git_env()
    cache = os.path.join(root, ".cache", "git", sha256_bytes(repo.encode())[:16] + ".git")
    if not os.path.isdir(cache):
        os.makedirs(os.path.dirname(cache), 0o755) if not os.path.isdir(os.path.dirname(cache)) else None
        partial = cache + ".partial-%d" % os.getpid()
        if os.path.isdir(partial):
            shutil.rmtree(partial)
        stream_argv(["git", "clone", "--mirror", "--quiet", "--", repo, partial], env=env, log=log,
                    timeout=timeout)
        os.rename(partial, cache)
    else:
        stream_argv(["git", "-C", cache, "fetch", "--quiet", "--prune", "origin"], env=env, log=log,
                    timeout=timeout)
    have = run_argv(["git", "-C", cache, "cat-file", "-e", commit + "^{commit}"], env=env)
    if have["rc"] != 0:
        stream_argv(["git", "-C", cache, "fetch", "--quiet", "origin", commit], env=env, log=log,
                    timeout=timeout)
        if run_argv(["git", "-C", cache, "cat-file", "-e", commit + "^{commit}"], env=env)["rc"] != 0:
            raise AgentError("source", "commit %s is not in %s" % (commit, repo))
    stream_argv(["git", "clone", "--quiet", "--no-checkout", "--", cache, dest], env=env, log=log,
                timeout=timeout)
    stream_argv(["git", "-C", dest, "checkout", "--quiet", "--detach", commit], env=env, log=log,
                timeout=timeout)
    head = capture_argv(["git", "-C", dest, "rev-parse", "HEAD"], env=env).strip()
    if head != commit:
        raise AgentError("source", "HEAD of %s is %s after checking out %s" % (dest, head, commit))
    return {"commit": head, "cache": cache}


@op("nightly_pip")
def op_nightly_pip(builds_dir, build, requirements, python, pip_args, log, timeout=3600.0):
    """A fresh venv in the build, then ``pip install --require-hashes``.

    ``requirements`` is the hash-locked file's text; it is written into the
    build (``requirements.lock.txt``) so the build says what it was made of.
    Returns every installed distribution's name and version.
    """
    dest = build_path(builds_dir, build)
    os.makedirs(dest, 0o755)
    req = os.path.join(dest, "requirements.lock.txt")
    write_atomic(req, requirements.encode("utf-8"), 0o644)
    venv = os.path.join(dest, ".venv")
    stream_argv([python, "-m", "venv", venv], log=log, timeout=timeout)
    vpython = os.path.join(venv, "bin", "python")
    stream_argv([vpython, "-m", "pip", "install", "--require-hashes", "--no-input",
                 "--disable-pip-version-check", "-r", req] + list(pip_args), cwd=dest, log=log,
                timeout=timeout)
    listed = capture_argv([vpython, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"])
    return {"packages": json.loads(listed), "venv": venv}


@op("nightly_run")
def op_nightly_run(argv, cwd, env=None, log=None, timeout=3600.0):
    """One ``install`` command in the build's directory, its output streamed."""
    return stream_argv(argv, cwd=expand(cwd), env=env, log=log, timeout=timeout)


@op("nightly_remove_build")
def op_nightly_remove_build(builds_dir, build):
    """Remove a half-built build (never the one ``current`` points to)."""
    root = expand(builds_dir)
    dest = build_path(root, build)
    if read_link(os.path.join(root, "current")) == build:
        raise AgentError("build", "refusing to remove %s: current points to it" % dest)
    if os.path.isdir(dest) and not os.path.islink(dest):
        shutil.rmtree(dest)
        return True
    return False


@op("nightly_prune")
def op_nightly_prune(builds_dir, remove):
    """Remove old builds and their logs; never the one ``current`` points to."""
    root = expand(builds_dir)
    current = read_link(os.path.join(root, "current"))
    removed = []
    for name in remove:
        dest = build_path(root, name)
        if name == current or not os.path.isdir(dest) or os.path.islink(dest):
            continue
        shutil.rmtree(dest)
        try:
            os.unlink(os.path.join(root, "logs", name + ".log"))
        except OSError:
            pass
        removed.append(name)
    return removed


@op("nightly_link_swap")
def op_nightly_link_swap(link, to, expect):
    """Point the symlink ``link`` at ``to``, only if it points at ``expect`` now.

    Compare-and-swap: ``expect`` None means "no link yet", ``to`` None
    removes the link. A link already at ``to`` is left alone (so a retried
    undo is harmless). The new link is made beside the old one and renamed
    over it: a reader sees the old build or the new one, never no link.
    """
    link = expand(link)
    now = read_link(link)
    if now == to:
        return {"changed": False, "was": now}
    if now != expect:
        raise AgentError("switch", "%s points to %s, expected %s; not switching" % (link, now, expect))
    if to is None:
        os.unlink(link)
    else:
        tmp = "%s.orch-new-%d" % (link, os.getpid())
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        os.symlink(to, tmp)
        os.replace(tmp, link)
    fsync_dir(os.path.dirname(link))
    return {"changed": True, "was": now}


# ---------------------------------------------------------------- the probe


def probe_tokens(doc):
    """Only what counts output tokens: OpenAI ``usage`` or SGLang ``meta_info``."""
    if isinstance(doc, dict):
        usage = doc.get("usage")
        if isinstance(usage, dict):
            return {"usage": {"completion_tokens": usage.get("completion_tokens")}}
        meta = doc.get("meta_info")
        if isinstance(meta, dict):
            return {"meta_info": [{"completion_tokens": meta.get("completion_tokens")}]}
        return None
    if isinstance(doc, list):
        metas = [d.get("meta_info") for d in doc if isinstance(d, dict) and isinstance(d.get("meta_info"), dict)]
        return {"meta_info": [{"completion_tokens": m.get("completion_tokens")} for m in metas]} if metas else None
    return None


def probe_request(url, payload, headers, timeout, keep_doc=False):
    """One POST, bounded by ``timeout`` (connect, each read, and in total)."""
    started = time.time()
    req = urllib.request.Request(url, data=payload, method="POST", headers=headers)
    status, raw, error = None, b"", None
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status = resp.status
            raw = resp.read(4 << 20)
    except urllib.error.HTTPError as e:
        status = e.code
        error = "HTTP %d" % e.code
    except (urllib.error.URLError, OSError, ValueError) as e:
        error = str(getattr(e, "reason", e)) or type(e).__name__
    latency = time.time() - started
    if error is None and latency > timeout:
        error = "no answer within %ss" % timeout
    doc = None
    if raw:
        try:
            doc = json.loads(raw.decode("utf-8"))
        except ValueError:
            if error is None:
                error = "the answer is not JSON"
    out = {"latency": latency, "status": status, "error": error, "tokens": probe_tokens(doc)}
    if keep_doc:
        out["doc"] = doc
    return out


def probe_batch(url, payload, headers, timeout, count, concurrency):
    """``count`` requests from ``concurrency`` threads; a sample per request, in order."""
    samples = [None] * count
    lock = threading.Lock()
    state = {"next": 0, "done": 0}

    def worker():
        while True:
            with lock:
                i = state["next"]
                if i >= count or (SESSION is not None and SESSION.cancelled):
                    return
                state["next"] = i + 1
            samples[i] = probe_request(url, payload, headers, timeout)
            with lock:
                state["done"] += 1

    threads = [threading.Thread(target=worker) for _ in range(max(1, min(concurrency, count)))]
    started = time.time()
    for t in threads:
        t.daemon = True
        t.start()
    # Every request is bounded by ``timeout``; the batch by the worst case of that.
    deadline = started + timeout * (count // max(1, concurrency) + 2)
    said = started
    for t in threads:
        while t.is_alive() and time.time() < deadline:
            t.join(0.2)
            if SESSION is not None and time.time() - said >= 2.0:
                said = time.time()
                SESSION.event("progress", msg="probe: %d/%d requests answered" % (state["done"], count))
    if SESSION is not None:
        SESSION.check_cancel()
    duration = time.time() - started
    for i, s in enumerate(samples):
        if s is None:
            samples[i] = {"latency": duration, "status": None, "error": "no answer before the probe's deadline",
                          "tokens": None}
    return samples, duration


@op("probe_http")
def op_probe_http(base_url, path, body, requests, concurrency, timeout, headers=None, warmup=0,
                  greedy_body=None):
    """Send ``requests`` POSTs of ``body`` to ``path`` at ``concurrency``; time each.

    First ``warmup`` requests (not counted), then, when ``greedy_body`` is
    given, that one request alone (its whole answer comes back: the
    controller fingerprints its text), then the measured batch. Returns the
    raw samples; the figures are computed on the controller
    (``core.probe``), where they can be tested without a server.
    """
    url = base_url.rstrip("/") + path
    hdrs = {"Content-Type": "application/json"}
    hdrs.update(headers or {})
    payload = json.dumps(body if body is not None else {}).encode("utf-8")
    if warmup:
        SESSION.event("progress", msg="probe: %d warm-up request(s)" % warmup)
        probe_batch(url, payload, hdrs, timeout, warmup, concurrency)
    greedy = None
    if greedy_body is not None:
        greedy = probe_request(url, json.dumps(greedy_body).encode("utf-8"), hdrs, timeout, keep_doc=True)
    SESSION.event("progress", msg="probe: %d request(s) to %s at concurrency %d" % (requests, path, concurrency))
    samples, duration = probe_batch(url, payload, hdrs, timeout, requests, concurrency)
    return {"samples": samples, "duration": duration, "greedy": greedy}


def main(argv):
    if len(argv) >= 3 and argv[1] == "watchdog":
        sys.exit(watchdog_main(argv[2]))
    os.umask(0o022)
    serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    if "AGENT_SOURCE" not in globals():
        with open(__file__) as _f:
            AGENT_SOURCE = _f.read()
    main(sys.argv)
