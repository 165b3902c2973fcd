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
dead controller never leaves the box broken (``fork_watchdog``).

Rules for this file: standard library only, Python 3.8 syntax, no imports
from orchestrator (it runs on a host where orch is not installed). It is
read as text by ``agent_client`` and executed there.

Protocol: the controller writes one JSON request per line,
``{"id": 1, "op": "read", "args": {...}}``. The agent answers with zero or
more events ``{"id": 1, "event": "progress", ...}`` (a ``tick`` at least
every few seconds while an op runs, so the controller can tell a slow step
from a dead link), then one ``{"id": 1, "done": true, "ok": true,
"result": ...}`` or ``{"id": 1, "done": true, "ok": false, "error":
{"type": ..., "message": ...}}``.

File contents never travel as one long line: a line that takes longer to
send than the link's silence limit would pass for a dead link. Bytes go as
``blob`` lines of at most ``BLOB_CHUNK`` bytes (base64), ahead of the line
that uses them, which names them ``{"blob": n}``: the controller sends
``{"op": "blob", "blob": n, "data": ...}`` before its request, the helper
``{"id": 1, "blob": n, "data": ...}`` before its answer. Pings and ticks
go between them, and both ends count any bytes that arrive as a sign of
life, not only whole lines.
"""

import base64
import errno
import fcntl
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

PROTOCOL = 1


def http():
    """``urllib.request`` (its ``HTTPError``/``URLError`` too), imported when first
    needed: it is half of the helper's start-up, and a no-op or a --check never uses it."""
    import urllib.request

    return urllib.request

READY_MAGIC = "ORCH-AGENT-READY"
TICK_SECONDS = 5.0
SILENCE_SECONDS = 30.0  # the controller pings every 5 s: this much silence means it is gone
BLOB_CHUNK = 192 * 1024  # bytes per blob line (256 KiB of base64): about a second at 200 KB/s
READ_PIECE = 64 * 1024  # stdin is read in pieces this big, so a long line is heard as it arrives
LOCK_HEARTBEAT_SECONDS = 5.0
HEARD_SECONDS = 12.0  # two missed pings and a margin: past this the lock's heartbeat stops
LOG_TAIL_LINES = 40

SYNTAX_CHECK = (
    "def syntax_problem(staged, shown):\n"
    "    src = open(staged, 'rb').read()\n"
    "    try:\n"
    "        compile(src, shown, 'exec', dont_inherit=True)\n"
    "    except SyntaxError as e:\n"
    "        lines = src.decode('utf-8', 'replace').splitlines()\n"
    "        n = e.lineno or 0\n"
    "        line = lines[n - 1].strip() if 0 < n <= len(lines) else ''\n"
    "        return '%s:%s: SyntaxError: %s%s' % (shown, e.lineno, e.msg, (' :: ' + line) if line else '')\n"
    "    return None\n"
)
"""``python-syntax``: one source for both ways it runs (``syntax_check``)."""
PYTHON_SYNTAX_CHECK = SYNTAX_CHECK + (
    "import sys\n"
    "problem = syntax_problem(sys.argv[1], sys.argv[2])\n"
    "if problem:\n"
    "    print(problem)\n"
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


class Blob(object):
    """Bytes in an op's answer: ``Session.send`` sends them ahead as bounded blob lines."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data


def payload(value):
    """The bytes a request carries: ``{"blob": n}`` (sent ahead in blob lines), ``{"copy_of":
    path, "sha256": ...}`` (a file already on this host, orch's staged copy: not sent again),
    or base64 text (small data from callers that do not use blobs)."""
    if isinstance(value, dict) and "copy_of" in value:
        return copy_of(value["copy_of"], value["sha256"])
    if isinstance(value, dict):
        return SESSION.take_blob(value["blob"])
    return b64d(value)


def copy_of(path, sha256):
    """The content of ``path``, which must be exactly the planned content ``sha256``."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise AgentError("backup", "cannot read %s: %s" % (path, e.strerror or e), path=path)
    got = sha256_bytes(data)
    if got != sha256:
        raise AgentError("backup", "%s holds sha256 %s, planned %s" % (path, got, sha256), path=path)
    return data


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


def named(error, path):
    """``error`` saying which file: a failed ``write``/``fsync`` (ENOSPC, EIO, EDQUOT)
    carries no file name, so "No space left on device" alone would not say where."""
    if isinstance(error, OSError) and error.filename is None and error.errno is not None:
        return OSError(error.errno, error.strerror or os.strerror(error.errno), path)
    return error
TMP_MARK = ".orch-tmp-"
"""Temp directories are ``.<name>.orch-tmp-<16 random hex>`` (``private_dir``):
unpredictable, and recognisable, so the next run can remove what a killed
helper left (``remove_leftovers``; older helpers made flat temp files named
``.<name>.orch-tmp-<pid>``, removed the same way)."""
WRITE_ATTEMPTS = 8
PLANTED = []  # what write_atomic refused since the last drain (a restore reports it per file)


class PlantedError(OSError):
    """A name orch writes was taken by a file or link orch did not make: refused, never followed."""

    def __init__(self, message):
        OSError.__init__(self, errno.EEXIST, message)


def note_planted(message):
    PLANTED.append(message)


def drain_planted():
    """The refusals noted since the last call (and forget them)."""
    out = list(PLANTED)
    del PLANTED[:]
    return out


def tmp_name(directory, base):
    return os.path.join(directory, ".%s%s%s" % (base, TMP_MARK, base64.b16encode(os.urandom(8)).decode().lower()))


def same_file(path, fd):
    """``path`` (not followed) names the file open as ``fd``: nobody swapped the name."""
    try:
        there, mine = os.lstat(path), os.fstat(fd)
    except OSError:
        return False
    return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)


def create_exclusive(path, mode=0o600):
    """A new file at ``path``, opened read-write and flocked, or None.

    ``O_EXCL|O_NOFOLLOW``: whatever already sits at the name (a link another
    user planted, in a directory they can write) is never followed nor
    truncated (``FileExistsError``). The flock marks the file as live: the
    next run's clean-up (``remove_abandoned``) removes only files nobody
    holds. None: the clean-up took the name between the create and the
    flock (try another name).
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        pass
    if same_file(path, fd):
        return fd
    os.close(fd)
    return None


def write_fd(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)


def set_owner_mode(fd, mode=None, uid=None, gid=None):
    """Owner, then mode, on the open file (never a name that could be swapped
    for a link); owner first, as a chown clears set-id bits."""
    if uid is not None and gid is not None:
        try:
            os.fchown(fd, uid, gid)
        except PermissionError:
            pass
    if mode is not None:
        os.fchmod(fd, mode)


def private_dir(dfd, base):
    """``(name, fd)`` of a new directory of our own (0700) beside the target,
    in the directory open as ``dfd``: nobody else can put anything inside
    it, so a file renamed out of it through ``fd`` is the file orch wrote,
    whatever happens to the names around it. A name taken already
    (planted) is refused and another one drawn."""
    for _ in range(WRITE_ATTEMPTS):
        name = os.path.basename(tmp_name(".", base))
        try:
            os.mkdir(name, 0o700, dir_fd=dfd)
        except FileExistsError:
            note_planted("%s existed before orch made it: refused, not followed" % name)
            continue
        try:
            pfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
        except OSError:
            note_planted("%s was swapped right after orch made it: refused, not followed" % name)
            continue
        st = os.fstat(pfd)
        if st.st_uid == os.getuid() and not st.st_mode & 0o077:
            return name, pfd
        os.close(pfd)
        note_planted("%s was swapped right after orch made it: refused, not followed" % name)
    raise PlantedError("another user keeps taking orch's temp names beside %s" % base)


def drop_private_dir(dfd, name, pfd):
    """Remove our (now empty) private directory, if the name is still ours."""
    try:
        if same_stat(os.stat(name, dir_fd=dfd, follow_symlinks=False), os.fstat(pfd)):
            os.rmdir(name, dir_fd=dfd)
        else:
            note_planted("%s was renamed or replaced by another user while orch wrote: not followed, "
                         "orch's file was written through its own directory" % name)
    except OSError:
        pass
    finally:
        os.close(pfd)


def open_dir(directory):
    """A descriptor of ``directory`` to create and rename relative to; a
    directory this user may write but not list (no read bit) is opened as
    O_PATH (it then just is not fsynced)."""
    try:
        return os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except PermissionError:
        return os.open(directory, getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY)


def same_stat(a, b):
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def write_atomic(path, data, mode=None, uid=None, gid=None):
    """Write ``data`` to ``path`` by a rename from a sibling, fsynced.

    A reader (or the server starting) sees the old file or the new one,
    never half of one; mode and owner are set before the rename.

    The directory may be one another user can write (a shared source tree):
    the new file is made inside a private directory of ours beside the
    target (``.<name>.orch-tmp-<random>``, 0700, see ``private_dir``),
    ``O_EXCL|O_NOFOLLOW``, owner and mode set through its descriptor, and
    renamed onto ``path`` relative to directory descriptors — so no name
    another user can swap is ever followed, written through or renamed.
    """
    directory = os.path.dirname(path) or "."
    base = os.path.basename(path)
    dfd = open_dir(directory)
    try:
        for _ in range(WRITE_ATTEMPTS):
            name, pfd = private_dir(dfd, base)
            try:
                try:
                    fd = os.open("new", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=pfd)
                except FileNotFoundError:
                    continue  # a clean-up took our empty directory: draw again
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)  # live: the clean-up leaves it alone
                    if os.fstat(fd).st_nlink == 0:
                        continue  # the clean-up got there first
                    write_fd(fd, data)
                    set_owner_mode(fd, mode, uid, gid)
                    os.replace("new", base, src_dir_fd=pfd, dst_dir_fd=dfd)
                except BaseException:
                    try:
                        os.unlink("new", dir_fd=pfd)
                    except OSError:
                        pass
                    raise
                finally:
                    os.close(fd)
            finally:
                drop_private_dir(dfd, name, pfd)
            try:
                os.fsync(dfd)
            except OSError:
                pass
            return
        raise PlantedError("cannot write %s: its temp files keep disappearing" % path)
    except PlantedError:
        raise
    except OSError as e:
        raise named(e, path) from e  # ENOSPC and the like say which file
    finally:
        os.close(dfd)


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


def try_write_json(path, value):
    """``write_json`` for records that must not stop a restore (a full disk):
    returns the error as text, or None when written."""
    try:
        write_json(path, value)
        return None
    except OSError as e:
        return "cannot write %s: %s" % (path, e.strerror or e)


def real_path(path):
    """The file ``path`` names, symlinks followed: orch writes the real file
    and leaves a link pointing at it as it was."""
    return os.path.realpath(expand(path))


def read_json(path, default=None):
    try:
        return json.loads(read_nofollow(path).decode())
    except FileNotFoundError:
        return default


def read_record(path):
    """A small record the restore machine polls or re-reads: absent or
    unreadable (a half-written file on a full disk) both read as None."""
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


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


def proc_starttime(pid):
    """When the process started, in clock ticks since boot: with the pid it
    names one process, even after the pid has been reused."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError, TypeError):
        return None


def proc_start_epoch(pid):
    """The process's start as a Unix time (to within a clock tick), or None."""
    ticks = proc_starttime(pid)
    if ticks is None:
        return None
    try:
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - uptime + ticks / float(os.sysconf("SC_CLK_TCK"))


def same_process(pid, starttime):
    """``pid`` is alive and is the process that was recorded (not a reused pid)."""
    if not pid or not pid_alive(pid):
        return False
    return starttime is None or proc_starttime(pid) == starttime


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
    """One controller's conversation: output, ticks, cancel, the held lock.

    Two ways an op can be told to stop are kept apart: an explicit
    ``cancel`` (Ctrl-C on the controller) stops any op, while the end of the
    connection (``eof``: the controller died or the link dropped) stops a
    wait that only the controller cared about but never a restore — a
    restore that has begun is finished on the host whatever the link does.
    """

    def __init__(self, out):
        self.out = out
        self.out_lock = threading.Lock()
        self.out_broken = False  # the controller can no longer hear us
        self.current_id = None
        self.lock = None  # (path, fd) of the host lock this session holds
        self.children = {}  # pid -> Popen, servers this agent started
        self.stopping = False
        self.requests = []  # lines read by the reader thread, waiting to run
        self.cond = threading.Condition()
        self.cancel_requested = False
        self.eof = False
        self.finishing = False  # a restore runs: the end of the link does not stop it
        self.last_heard = time.monotonic()  # any bytes from the controller, pings included
        self.blobs = {}  # blob id -> bytearray, from blob lines the controller sent ahead of a request
        self.gone = None  # why the helper stopped serving, when it was not told to (said on stderr)
        self.partial = 0  # bytes of a line still arriving (a request's blob lines, on a slow link)
        self.last_data = time.monotonic()  # the last blob piece or part of a line (pings not counted)
        self.last_started = {}  # the server this session started last: health_wait(pid="started")
        self.staged = set()  # staged copies not committed yet: removed if the controller goes away

    def reader(self, stdin):
        """Read requests while an op runs, so a ``cancel`` or the end of the
        connection is seen at once, not after a long wait.

        Read in pieces, not by lines: every piece counts as word from the
        controller, so a long line on a slow link is not taken for silence.
        """
        read = getattr(stdin, "read1", None) or stdin.readline
        pending = bytearray()
        while True:
            piece = read(READ_PIECE)
            with self.cond:
                self.last_heard = time.monotonic()
            if not piece:
                if pending:
                    self.take_line(bytes(pending))  # a last line without its newline
                with self.cond:
                    self.eof = True
                    self.cond.notify_all()
                return
            start = len(pending)
            pending += piece
            end = pending.find(b"\n", start)
            while end >= 0:
                line = bytes(pending[: end + 1])
                del pending[: end + 1]
                self.take_line(line)
                end = pending.find(b"\n")
            self.partial = len(pending)
            if pending:
                self.last_data = time.monotonic()  # part of a line arrived (not a whole ping)

    def take_line(self, line):
        """One whole line from the controller: a ping, a cancel, a blob piece, or a request."""
        try:
            message = json.loads(line.decode())
            kind = message.get("op")
        except (ValueError, AttributeError):
            message, kind = None, None
        with self.cond:
            if kind == "ping":
                return
            if kind == "cancel":
                self.cancel_requested = True
                return
            if kind == "blob":
                self.last_data = time.monotonic()
                try:
                    self.blobs.setdefault(message["blob"], bytearray()).extend(b64d(message["data"]))
                except (KeyError, TypeError, ValueError, AttributeError):
                    # a malformed piece spoils its blob (the request naming it fails); the reader lives on
                    self.blobs[message.get("blob")] = None
                return
            self.requests.append(line)
            self.cond.notify_all()

    def take_blob(self, blob):
        """The bytes of blob ``blob``: complete, since its lines came before the request."""
        with self.cond:
            data = self.blobs.pop(blob, None)
        if data is None:
            raise AgentError("protocol", "blob %r was named but not (wholly) sent" % (blob,))
        return data

    def receiving(self, now):
        """Between requests, a request's bytes are still arriving (no op runs yet to tick).

        Judged by the request's own bytes (blob pieces, part of a line), not by
        pings: blobs whose request never came (its controller was interrupted
        while sending) must not make the helper tick for ever, which would keep
        that controller waiting for an answer that cannot come."""
        return (self.current_id is None and (self.partial or self.blobs)
                and now - self.last_data < TICK_SECONDS)

    def silent(self):
        """The controller stopped pinging: its link stalled, or it is gone."""
        return time.monotonic() - self.last_heard > SILENCE_SECONDS

    def hears_controller(self):
        """The controller was heard lately (it pings every 5 s): only then is the
        lock's heartbeat renewed, so a fresh heartbeat tells another run that this
        helper is alive AND still hears its controller (a run in progress), and a
        stale one that nobody is steering it any more."""
        return not self.eof and time.monotonic() - self.last_heard < HEARD_SECONDS

    def next_request(self):
        with self.cond:
            while not self.requests and not self.eof:
                if self.silent():
                    self.eof = True  # treat a silent controller as gone: free the host
                    self.gone = "no word from the controller for %g s" % SILENCE_SECONDS
                    break
                self.cond.wait(1.0)
            if self.requests:
                self.cancel_requested = False
                return self.requests.pop(0)
            return None

    def stop_asked(self):
        """The running op should stop: cancelled, or the controller is gone (unless a restore runs)."""
        return self.cancel_requested or ((self.eof or self.silent()) and not self.finishing)

    def check_cancel(self):
        if self.cancel_requested:
            raise AgentError("cancelled", "cancelled by the controller")
        if (self.eof or self.silent()) and not self.finishing:
            raise AgentError("cancelled", "the controller went away")

    def send(self, message):
        """One message; the ``Blob`` values in it go first, as bounded blob lines
        (ticks may come between them), and the message names them ``{"blob": n}``."""
        blobs = []

        def blob_ref(value):
            if isinstance(value, Blob):
                blobs.append(value.data)
                return {"blob": len(blobs)}
            raise TypeError("cannot send %s" % type(value).__name__)

        line = json.dumps(message, separators=(",", ":"), default=blob_ref) + "\n"
        rid = message.get("id")
        for n, data in enumerate(blobs, 1):
            view = memoryview(data)
            for start in range(0, max(len(data), 1), BLOB_CHUNK):  # a line even for no bytes
                self.write_line('{"id":%s,"blob":%d,"data":"%s"}\n'
                                % (json.dumps(rid), n, b64e(view[start:start + BLOB_CHUNK])))
        self.write_line(line)

    def write_line(self, line):
        with self.out_lock:
            if self.out_broken:
                return
            try:
                self.out.write(line.encode())
                self.out.flush()
            except (OSError, ValueError):
                self.out_broken = True  # the link is gone; the work goes on

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
            now = time.monotonic()  # intervals: a step of the wall clock must not stop the ticks
            if self.current_id is not None and now - last_tick >= TICK_SECONDS:
                last_tick = now
                self.event("tick", t=time.time())
            elif self.receiving(now) and now - last_tick >= TICK_SECONDS:
                # The controller has sent a request's bytes and now waits for an answer, while
                # they still cross a slow link (its buffers took them long ago): tell it we hear.
                last_tick = now
                self.send({"id": None, "event": "tick", "t": time.time(), "receiving": True})
            if self.lock is not None and now - last_beat >= LOCK_HEARTBEAT_SECONDS and self.hears_controller():
                last_beat = now
                renew_heartbeat(self.lock)


SESSION = None  # type: Session


def serve(stdin, stdout):
    global SESSION
    SESSION = Session(stdout)
    ticker = threading.Thread(target=SESSION.background, daemon=True)
    ticker.start()
    SESSION.send(  # with hello's answer: the controller needs no round trip for it
        {"ready": READY_MAGIC, "protocol": PROTOCOL, "pid": os.getpid(), "python": sys.version.split()[0],
         "hello": op_hello()}
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
        with SESSION.cond:
            SESSION.blobs.clear()  # what this request sent and no op took: not kept for ever
        SESSION.current_id = None
        SESSION.send(reply)
        if request.get("op") == "bye":
            # Leave at once: a normal interpreter exit would wait on the reader
            # thread blocked in stdin (a second of stall per run, measured).
            release_own_lock()
            sys.stdout.flush()
            os._exit(0)
    # The controller is gone (it died or the link dropped): whatever op was
    # running has finished. Leave nothing half-done behind: staged copies it
    # never committed go, and the host's lock is given back by us, so nobody
    # has to wait for a heartbeat to go stale.
    for staged in list(SESSION.staged):
        if staged in STAGED_FDS:
            forget_staged(staged)
            continue
        try:
            os.unlink(staged)
        except OSError:
            pass
    release_own_lock()
    SESSION.stopping = True
    leave(SESSION.gone)


def leave(reason):
    """End the helper now, saying why on stderr in one line.

    Not a normal interpreter exit: with the reader thread blocked in stdin,
    that can die in a "Fatal Python error" dump whose last line, ``<no
    Python frame>``, is what the controller would show as the reason.
    """
    try:
        if reason:
            sys.stderr.write("orch-helper: %s; stopped\n" % reason)
            sys.stderr.flush()
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    os._exit(0)


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
        except Exception as e:  # unanticipated: the results of the steps before it still reach the controller
            raise AgentError("internal", "%s: %s" % (type(e).__name__, e), step=i, done=results)
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
    """A file as the controller plans with it; a symlink is read through
    (``real`` names the file that is actually written)."""
    path = expand(path)
    real = checked_real(path)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return {"path": path, "real": real, "exists": False}
    with open(real, "rb") as f:
        data = f.read()
    info = {"path": path, "real": real, "exists": True, "mode": st.st_mode & 0o7777, "uid": st.st_uid,
            "gid": st.st_gid, "sha256": sha256_bytes(data), "size": len(data)}
    if with_data:
        info["data"] = Blob(data)
    return info


@op("read")
def op_read(paths, with_data=True):
    return [file_info(p, with_data) for p in paths]


@op("sha256")
def op_sha256(paths):
    out = {}
    for p in paths:
        try:
            out[p] = sha256_file(real_path(p))
        except FileNotFoundError:
            out[p] = None
    return out


def staged_name(path, token):
    """The staged copy of ``path``: a hidden sibling of the real file, same
    extension, named with this run's random ``token`` — so it, and whatever a
    validator derives from its name, is provably orch's own."""
    directory, base = os.path.split(real_path(path))
    stem, ext = os.path.splitext(base)
    return os.path.join(directory, ".%s.orch-staged-%s%s" % (stem, token, ext))


STAGED_FDS = {}  # staged path -> its open, flocked descriptor: the file this helper wrote there


def leftover_patterns(path):
    """The exact names orch gives its temp files and staged copies beside
    ``path``'s real file: only these are ever cleaned up there."""
    directory, base = os.path.split(real_path(path))
    stem, ext = os.path.splitext(base)
    tmp = re.compile(r"^\.%s%s[0-9a-f]+$" % (re.escape(base), re.escape(TMP_MARK)))
    staged = re.compile(r"^\.%s\.orch-staged-[A-Za-z0-9_-]+%s$" % (re.escape(stem), re.escape(ext)))
    return directory, (tmp, staged)


def remove_abandoned(full, dir_fd=None):
    """Remove ``full`` if it is a regular file of this uid's that no live
    helper holds (``create_exclusive``'s flock). A link, another user's
    file, or one in use is never touched; nothing is followed."""
    import stat

    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return False  # a symlink (ELOOP), gone, or unreadable
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_nlink != 1:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # a running helper's (a --check under way)
        if not same_stat(os.stat(full, dir_fd=dir_fd, follow_symlinks=False), st):
            return False
        os.unlink(full, dir_fd=dir_fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def remove_abandoned_dir(full):
    """Remove a temp directory a killed helper left (``private_dir``): only
    one of this uid's, 0700, holding nothing but an abandoned ``new`` file."""
    try:
        pfd = os.open(full, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False  # a link, or not a directory
    try:
        st = os.fstat(pfd)
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            return False
        names = os.listdir(pfd)
        if any(name != "new" for name in names):
            return False
        if names and not remove_abandoned("new", pfd):
            return False
        if not same_stat(os.lstat(full), st):
            return False
        os.rmdir(full)
        return True
    except OSError:
        return False
    finally:
        os.close(pfd)


def remove_leftovers(path):
    """Temp files and staged copies a killed helper, a Ctrl-C or a stale lock
    left beside ``path`` (run by a deploy, which holds the host's lock)."""
    directory, patterns = leftover_patterns(path)
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if any(p.match(name) for p in patterns):
            full = os.path.join(directory, name)
            if remove_abandoned(full) or remove_abandoned_dir(full):
                removed.append(full)
    return removed


def remove_stale_staged(path):
    """Kept for callers of the old name: see ``remove_leftovers``."""
    return remove_leftovers(path)


def create_staged(staged, data, mode):
    """The staged copy, created at its (predictable) name exclusively: a file
    or link already there is refused, never followed nor replaced — the
    validator must read the file orch wrote. Owned by this uid until the
    commit gives it the target's owner (so a leftover is recognisably orch's)."""
    try:
        fd = create_exclusive(staged, 0o600)
    except FileExistsError:
        fd = None
    if fd is None:
        raise PlantedError("%s already exists and orch did not make it (a planted file or link?): refused, "
                           "not followed" % staged)
    try:
        write_fd(fd, data)
        os.fchmod(fd, mode & 0o777)
    except BaseException:
        forget_staged(staged, fd)
        raise
    return fd


def fd_sha256(fd):
    h = hashlib.sha256()
    os.lseek(fd, 0, 0)
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return h.hexdigest()
        h.update(chunk)


def forget_staged(staged, fd=None, remove=True):
    """Close a staged copy's descriptor; remove the name if it is still ours."""
    fd = STAGED_FDS.pop(staged, fd)
    if fd is None:
        return
    try:
        if remove and same_file(staged, fd):
            os.unlink(staged)
    except OSError:
        pass
    finally:
        os.close(fd)


def staged_intact(staged):
    """The staged name still names the file this helper wrote (not swapped)."""
    fd = STAGED_FDS.get(staged)
    return fd is None or same_file(staged, fd)


@op("stage")
def op_stage(files, token, clean_stale=False):
    """Write each new content to a hidden sibling of its target.

    Same directory as the real file, so the final rename is atomic and a
    validator sees the file where it will live (relative imports, config
    lookups). A deploy (``clean_stale``) first removes the siblings a dead
    run left.
    """
    out = []
    try:
        for f in files:
            out.append(stage_one(f, token, clean_stale))
    except BaseException:
        for done in out:  # a failed stage leaves nothing behind
            forget_staged(done["staged"])
        raise
    return out


def stage_one(f, token, clean_stale):
    """One file staged: a hidden sibling of the real file, read back by sha256."""
    path = expand(f["path"])
    real = real_path(path)
    data = payload(f["data"])
    staged = staged_name(path, token)
    if clean_stale:
        remove_leftovers(path)
    try:
        mode = os.stat(real).st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    try:
        fd = create_staged(staged, data, mode)
    except PlantedError as e:
        raise AgentError("planted", "cannot stage %s: %s" % (path, e.strerror), path=path)
    except OSError as e:
        raise AgentError("stage", "cannot stage %s: %s" % (path, e.strerror or e), path=path)
    STAGED_FDS[staged] = fd
    got = fd_sha256(fd)
    if got != sha256_bytes(data):
        forget_staged(staged)
        raise AgentError("stage", "staged copy of %s reads back wrong (sha256 %s)" % (path, got))
    if SESSION is not None:
        SESSION.staged.add(staged)
    return {"path": path, "real": real, "staged": staged, "sha256": got}


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
    return run_argv(argv, cwd and expand(cwd), env, timeout, bytes(payload(stdin)) if stdin else None)


def derived_files(staged):
    """What a validator may have made from the staged copy's exact name
    (e.g. ``__pycache__/.x.orch-staged-1a2b.cpython-311.pyc``). Only these are
    ever removed: anything else in the directory may be somebody's."""
    directory, base = os.path.split(staged)
    stem = os.path.splitext(base)[0]
    out = []
    for sub in (directory, os.path.join(directory, "__pycache__")):
        try:
            names = os.listdir(sub)
        except OSError:
            continue
        for name in names:
            full = os.path.join(sub, name)
            if name.startswith(stem) and full != staged and os.path.isfile(full) and not os.path.islink(full):
                try:
                    if os.lstat(full).st_uid == os.getuid():  # another user's file is theirs
                        out.append(full)
                except OSError:
                    pass
    return out


@op("validate")
def op_validate(checks, token, keep_staged=True, timeout=600.0):
    """Run each file's validators on its staged copy, then clean up after them.

    The clean-up removes only files derived from the staged copy's exact
    name (its bytecode), and a ``__pycache__`` directory only when it was
    made during this run and is empty again: a colleague's file that
    appears in the directory meanwhile is never touched (``--check`` holds
    no lock).
    """
    results = []
    for check in checks:
        target = expand(check["target"])
        staged = staged_name(target, token)
        directory = os.path.dirname(staged)
        cache = os.path.join(directory, "__pycache__")
        cache_existed = os.path.isdir(cache)
        refuse_if_swapped(staged, "before its validators ran")
        for argv in check["argvs"]:
            here = False
            if argv == ["python-syntax"]:
                python = check.get("python") or sys.executable
                argv = [python, "-c", PYTHON_SYNTAX_CHECK, staged, target]
                here = is_this_interpreter(python)
            if here:
                res = syntax_check(staged, target)
            else:
                res = run_argv(argv, cwd=directory, env={"PYTHONDONTWRITEBYTECODE": "1"}, timeout=timeout)
            res["argv"] = argv
            res["target"] = target
            results.append(res)
            if res["rc"] != 0:
                break
        refuse_if_swapped(staged, "while its validators ran; their verdict is void")
        for extra in derived_files(staged):
            try:
                os.unlink(extra)
            except OSError:
                pass
        if not cache_existed:
            try:
                os.rmdir(cache)  # only succeeds when empty
            except OSError:
                pass
        if results and results[-1]["rc"] != 0:
            break
    if not keep_staged:
        for check in checks:
            staged = staged_name(check["target"], token)
            if staged in STAGED_FDS:
                forget_staged(staged)
                continue
            try:
                os.unlink(staged)
            except OSError:
                pass
    return results


def refuse_if_swapped(staged, when):
    """A validator must judge the file orch wrote: a staged name that now
    names another file (a link planted by another user) stops the deploy."""
    if not staged_intact(staged):
        raise AgentError("planted", "%s was replaced by a file orch did not write %s: refused (another user "
                         "can write in that directory)" % (staged, when), path=staged)


def is_this_interpreter(python):
    """``python`` (a path or a name on PATH) is the binary this helper runs on.

    The same binary compiles a text alike wherever it is started from, so
    the syntax check then runs in this process: no second interpreter start
    per host and deploy (15 ms of the host's CPU, measured on the fleet
    bench). Another binary (the server's own, another version) runs it.
    """
    found = python if os.sep in python else shutil.which(python)
    try:
        return bool(found) and os.path.realpath(found) == os.path.realpath(sys.executable)
    except (OSError, ValueError):
        return False


def syntax_check(staged, shown):
    """``PYTHON_SYNTAX_CHECK`` in this process, with the answer ``run_argv`` would give."""
    scope = {}
    exec(SYNTAX_CHECK, scope)
    try:
        problem = scope["syntax_problem"](staged, shown)
    except Exception as e:  # noqa: BLE001 - the script would die with this and exit 1
        return {"rc": 1, "stdout": "", "stderr": "%s: %s" % (type(e).__name__, e)}
    return {"rc": 1 if problem else 0, "stdout": problem + "\n" if problem else "", "stderr": ""}


@op("remove")
def op_remove(paths):
    removed = []
    for p in paths:
        if expand(p) in STAGED_FDS:  # a staged copy: removed only if the name is still ours
            forget_staged(expand(p))
            removed.append(p)
            continue
        try:
            os.unlink(expand(p))
            removed.append(p)
        except FileNotFoundError:
            pass
    return removed


def live_sha256(path):
    try:
        return sha256_file(path)
    except FileNotFoundError:
        return None


@op("commit")
def op_commit(files, release_dir=None):
    """Move each staged copy over its target: compare-and-swap on content.

    Every target must still hold exactly the content that was planned
    (``before``): a file edited by hand since, or during validation, is
    never overwritten — the commit refuses and writes nothing. Then
    ``commit.started`` is marked in the release (so a restore knows these
    files may hold orch's content), and each file is renamed into place,
    mode and owner kept, symlinks followed (the link stays a link). The
    whole file is re-read and must have the planned sha256 (``after``).
    On any failure the staged copies not yet moved are removed.
    """
    renamed = []
    try:
        checked = []
        for f in files:
            real = checked_real(f["path"])
            live = live_sha256(real)
            if live != f["before"]:
                raise AgentError(
                    "changed", "%s changed on the host since it was planned (sha256 %s, planned over %s); "
                    "nothing was written" % (f["path"], live, f["before"]), path=f["path"], committed=[])
            checked.append((f, real))
        if release_dir:
            started = os.path.join(expand(release_dir), "commit.started")
            try:
                write_mark(started, "%f\n" % time.time())
            except OSError as e:
                raise named(e, started) from e
        for f, real in checked:
            try:
                fd = staged_fd(f["staged"], f["path"])
            except AgentError as e:
                e.details["committed"] = list(renamed)
                raise
            try:
                st = os.stat(real)
                set_owner_mode(fd, st.st_mode & 0o7777, st.st_uid, st.st_gid)
            except FileNotFoundError:
                pass
            try:
                os.replace(f["staged"], real)
            except OSError as e:
                raise AgentError("commit", "cannot commit %s: %s" % (f["path"], e.strerror or e),
                                 committed=list(renamed), path=f["path"])
            renamed.append(f["path"])
            SESSION.staged.discard(f["staged"])
            fsync_dir(os.path.dirname(real))
            if not same_file(real, fd):
                raise AgentError("planted", "%s was swapped for a file orch did not write just before the commit "
                                 "renamed it onto %s: refused; the restore puts the file back" % (
                                     f["staged"], f["path"]), committed=list(renamed), path=f["path"])
            got = fd_sha256(fd)
            forget_staged(f["staged"], remove=False)
            if got != f["after"]:
                raise AgentError("commit", "%s reads back with sha256 %s, planned %s" % (f["path"], got, f["after"]),
                                 committed=list(renamed), path=f["path"])
        return renamed
    except (AgentError, OSError) as e:
        for f in files:
            if f["staged"] in STAGED_FDS:
                forget_staged(f["staged"], remove=f["path"] not in renamed)
            elif f["path"] not in renamed:
                try:
                    os.unlink(f["staged"])
                except OSError:
                    pass
        if isinstance(e, OSError):
            raise AgentError("commit", "cannot commit: %s" % (e.strerror or e), committed=list(renamed))
        raise


def staged_fd(staged, path):
    """The descriptor of the staged copy this helper wrote, checked to be still
    at its name; a copy staged by another helper is opened without following
    a link and must be a regular file of this uid's."""
    import stat

    fd = STAGED_FDS.get(staged)
    if fd is None:
        try:
            fd = os.open(staged, os.O_RDWR | os.O_NOFOLLOW)
        except OSError as e:
            raise AgentError("planted" if e.errno == errno.ELOOP else "commit",
                             "cannot commit %s: its staged copy %s: %s" % (path, staged, e.strerror or e), path=path)
        STAGED_FDS[staged] = fd
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            raise AgentError("planted", "cannot commit %s: %s is not a file orch wrote: refused" % (path, staged),
                             path=path)
    if not same_file(staged, fd):
        raise AgentError("planted", "cannot commit %s: its staged copy %s was replaced by a file orch did not "
                         "write: refused, not followed" % (path, staged), path=path)
    return fd


def write_mark(path, text=""):
    """A small marker file in the release, created or truncated without following a link."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


# ---------------------------------------------------------------- state dir, lock, journal


@op("state_init")
def op_state_init(state_dir):
    root = expand(state_dir)
    for sub in ("", "releases"):
        d = os.path.join(root, sub)
        if not os.path.isdir(d):
            os.makedirs(d, 0o700)
    os.chmod(root, 0o700)
    keep_helper()  # a first deploy: the state dir exists from now on
    return root


def renew_heartbeat(lock):
    """The lock's heartbeat is its file's mtime, renewed through the fd this
    session holds: after a take-over that fd names the old (renamed) file,
    so a slow heartbeat can never overwrite the new holder's lock."""
    try:
        os.utime(lock[1])
    except (OSError, NotImplementedError):
        pass


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


@op("lock_acquire")
def op_lock_acquire(state_dir, holder, replace_token=None):
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
    SESSION.lock = (path, fd)
    return {"acquired": True, "token": lock["token"]}


def release_own_lock():
    """Remove the lock this session holds, if the file there is still ours."""
    lock = SESSION.lock if SESSION is not None else None
    if lock is None:
        return False
    path, fd = lock
    SESSION.lock = None
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


@op("open_state")
def op_open_state(state_dir, holder=None, replace_token=None):
    """Start of a run in one round trip: the state dir, the lock, the records."""
    root = op_state_init(state_dir)
    lock = op_lock_acquire(root, holder, replace_token) if holder is not None else None
    return {"root": root, "lock": lock, "state": op_state_read(root)}


@op("lock_release")
def op_lock_release(state_dir):
    return release_own_lock()


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


# ---------------------------------------------------------------- releases


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


@op("release_create")
def op_release_create(state_dir, release_id, manifest, files, restore=None):
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
            data = payload(f[side])
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
        if os.path.isdir(d) and "/" not in rid and rid not in ("", ".", "..") and not kept_drift(d):
            # a release holding what a person wrote (drift) is never pruned, whatever was asked
            shutil.rmtree(d)
            removed.append(rid)
    return removed


@op("release_log")
def op_release_log(state_dir, release_id, text):
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
    return {"pid": pid, "pgid": os.getpgid(pid), "sid": os.getsid(pid), "argv": argv, "cwd": cwd, "env": env,
            "starttime": proc_starttime(pid)}


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
    deadline = time.monotonic() + stop_timeout
    # Polls start at 10 ms and back off to 100 ms: a server that leaves at
    # once costs the restart no 100 ms sleep, one that takes a minute no CPU.
    pause = 0.01
    while any(pid_alive(p) for p in targets):
        reap_children()
        if time.monotonic() >= deadline:
            if killed:
                break
            signal_all(signal.SIGKILL)
            SESSION.event("progress", msg="still running after %ss: SIGKILL" % stop_timeout)
            killed = True
            deadline = time.monotonic() + 10.0
        time.sleep(pause)
        pause = min(0.1, pause * 2)
    reap_children()
    left = [p for p in targets if pid_alive(p)]
    if left:
        raise AgentError("server", "server processes %s did not exit" % left)
    deadline = time.monotonic() + free_timeout
    pause = 0.01
    while port and port_busy(port):
        if time.monotonic() >= deadline:
            raise AgentError("server", "port %d still in use %ss after the server stopped" % (port, free_timeout))
        time.sleep(pause)
        pause = min(0.1, pause * 2)
    while True:
        on_gpu = gpu_pids()
        if not on_gpu or not (on_gpu & set(targets)):
            break
        if time.monotonic() >= deadline:
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
    try:
        # not through a link: one sitting here now was put there after the rotation (another user's);
        # 0600: a server logs its own secrets (SGLang prints its ServerArgs, api_key included)
        out = os.fdopen(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600), "ab")
    except OSError as e:
        raise AgentError("planted" if e.errno == errno.ELOOP else "server", "cannot open the server's log %s: %s" % (
            log_path, "a link sits there: refused, not followed" if e.errno == errno.ELOOP else e.strerror or e))
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
        # Best effort: the server runs either way, and is found by its port
        # when its pidfile cannot be written (a full disk must not turn a
        # started server into a failed restore).
        p = expand(pidfile)
        try:
            d = os.path.dirname(p)
            if not os.path.isdir(d):
                os.makedirs(d, 0o755)
            write_atomic(p, ("%d\n" % proc.pid).encode(), 0o644)
        except OSError as e:
            if SESSION is not None:
                SESSION.event("progress", msg="could not write the pidfile %s: %s" % (p, e.strerror or e))
    return {"pid": proc.pid, "pgid": proc.pid, "argv": argv, "cwd": cwd, "log": log_path}


def run_server_cmd(argv, timeout=600.0):
    """A user's server command (``commands`` manager) that must succeed."""
    res = run_argv(argv, timeout=timeout)
    if res["rc"] != 0:
        raise AgentError("server", "%s exited %d: %s" % (
            " ".join(argv), res["rc"], (res["stderr"] or res["stdout"]).strip()[-300:]))
    return res


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


BODY_LIMIT = 1 << 20  # a health answer larger than this is cut: nothing we check needs more


def fetch(url, method, body, headers, timeout):
    """One HTTP request: (status, text), or (None, reason). Bounded by the
    socket timeout per read; ``bounded_fetch`` bounds the whole of it."""
    got = fetch_plain(url, method, body, headers, timeout)
    if got is not None:
        return got
    request = http()
    req = request.Request(url, data=body, method=method, headers=headers)
    try:
        with request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read(BODY_LIMIT).decode("utf-8", "replace")
    except request.HTTPError as e:
        try:
            text = e.read(BODY_LIMIT).decode("utf-8", "replace")
        except Exception:
            text = ""
        return e.code, text
    except (request.URLError, OSError, ValueError) as e:
        return None, str(getattr(e, "reason", e))


HEAD_LIMIT = 64 * 1024
CONTENT_LENGTH = re.compile(br"(?im)^content-length:[ \t]*(\d+)[ \t]*$")


def fetch_plain(url, method, body, headers, timeout):
    """``fetch`` of a plain ``http://host:port/path`` over a socket; None for
    anything it does not expect, which then goes to ``urllib`` as before.

    Importing ``urllib.request`` (with ``http.client``, ``email`` and
    ``ssl``) cost a host 30 ms of CPU per deploy, more than all its health
    checks; a fleet pays it on every host. The request is HTTP/1.0, so the
    server sends no chunked body and closes after its answer: what arrives
    is the answer (cut at ``Content-Length`` when one is given). https, a
    user in the URL, IPv6 literals, a redirect (``urllib`` follows it) and a
    chunked answer are left to ``urllib``.
    """
    if not url.startswith("http://"):
        return None
    where, _, path = url[len("http://"):].partition("/")
    if not where or "@" in where or where.startswith("["):
        return None
    host, _, port = where.partition(":")
    try:
        port = int(port) if port else 80
    except ValueError:
        return None
    lines = ["%s /%s HTTP/1.0" % (method, path), "Host: %s" % where, "Accept-Encoding: identity",
             "Connection: close"]
    if body is not None:
        lines.append("Content-Length: %d" % len(body))
    for key, value in (headers or {}).items():
        if any(c in "%s%s" % (key, value) for c in "\r\n"):
            return None
        lines.append("%s: %s" % (key, value))
    try:
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
    except UnicodeEncodeError:
        return None
    raw = bytearray()
    head = None
    length = -1  # no Content-Length: the answer ends where the server closes
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(request)
            while len(raw) <= HEAD_LIMIT + BODY_LIMIT:
                data = sock.recv(65536)
                if not data:
                    break
                raw += data
                if head is None and b"\r\n\r\n" in raw:
                    head = bytes(raw).partition(b"\r\n\r\n")[0]
                    found = CONTENT_LENGTH.search(head)
                    length = int(found.group(1)) if found else -1
                if head is not None and 0 <= length <= len(raw) - len(head) - 4:
                    break  # all of it, even from a server that keeps the connection open
    except OSError as e:
        return None, str(e)
    if head is None:
        return None
    rest = bytes(raw[len(head) + 4:])
    status = re.match(br"HTTP/1\.[01] (\d{3})[ \r]", head + b"\r")
    if not status or re.search(br"(?im)^transfer-encoding:", head):
        return None
    code = int(status.group(1))
    if 300 <= code < 400:
        return None
    if length >= 0:
        rest = rest[:length]
    return code, rest[:BODY_LIMIT].decode("utf-8", "replace")


def bounded_fetch(url, method, body, headers, timeout):
    """``fetch``, but over in ``timeout`` seconds whatever the server does.

    A socket timeout only bounds each read: a body that trickles a byte a
    second never trips it. The request runs on a thread we stop waiting for
    at the deadline (the thread ends with its socket timeout).
    """
    box = {}

    def run():
        box["got"] = fetch(url, method, body, headers, max(0.1, timeout))

    worker = threading.Thread(target=run, name="orch-check")
    worker.daemon = True
    worker.start()
    worker.join(max(0.0, timeout))
    if "got" not in box:
        return None, "no complete answer within %.1f s" % timeout
    return box["got"]


def run_check(base_url, check, timeout):
    """One health check against its expectations: (passed, what was seen)."""
    url = base_url.rstrip("/") + check["path"]
    label = "%s %s" % (check["method"].upper(), check["path"])
    body = None
    headers = dict(check.get("headers") or {})
    if check.get("json") is not None:
        body = json.dumps(check["json"]).encode()
        headers.setdefault("Content-Type", "application/json")
    status, text = bounded_fetch(url, check["method"].upper(), body, headers, timeout)
    if status is None:
        return False, "%s: %s" % (label, text)
    want = check.get("status", 200)
    if status != want:
        return False, "%s: HTTP %d (want %d)" % (label, status, want)
    if check.get("body") and not re.search(check["body"], text):
        return False, "%s: body does not match %r" % (label, check["body"])
    expect = check.get("expect") or {}
    if expect:
        try:
            doc = json.loads(text)
        except ValueError:
            return False, "%s: body is not JSON" % label
        for key, value in expect.items():
            if not isinstance(doc, dict) or key not in doc:
                return False, "%s: no key %r" % (label, key)
            if not same_value(doc[key], value):
                return False, "%s: %s is %r (want %r)" % (label, key, doc[key], value)
    return True, "%s: ok" % label


def same_value(got, want):
    if got == want:
        return True
    if isinstance(got, (int, float)) and isinstance(want, (int, float)) and not isinstance(got, bool):
        return float(got) == float(want)
    return False


CHECK_TIMEOUT = 30.0  # one request, at most (and never past the overall deadline)


def check_all(base_url, checks, interval, deadline):
    """Every check once, each bounded by the overall ``deadline``: (passed, last seen)."""
    last = ""
    for check in checks:
        per_check = min(max(interval, 1.0) * 5, CHECK_TIMEOUT)
        if deadline is not None:
            per_check = min(per_check, max(0.1, deadline - time.monotonic()))
        ok, last = run_check(base_url, check, per_check)
        if not ok:
            return False, last
    return True, last


def watch_process(pid, log, polls, phase):
    """Fail at once when the watched server has exited."""
    if pid is None:
        return
    code = exit_code_of(pid)
    if code is not None:
        why = "code %s" % code if code != "unknown" else "not started by orch's helper: exit code unknown"
        raise AgentError("server_exited", "server exited %s (%s)" % (phase, why),
                         code=code, log_tail=tail_lines(log) if log else [], polls=polls)


def sleep_watching(seconds):
    wake = time.monotonic() + seconds
    while time.monotonic() < wake:
        SESSION.check_cancel()
        time.sleep(min(0.1, max(0.0, wake - time.monotonic())))


@op("health_wait")
def op_health_wait(base_url, checks, timeout, interval, pid=None, log=None, stable_for=0.0):
    """Poll every check until all pass, then keep them passing for ``stable_for``.

    Every request is bounded by the overall deadline (``timeout``), however
    slowly a server answers. The process is watched between polls: if it
    exits, this fails at once with its exit code and the tail of its log —
    the SyntaxError is on screen seconds after the start, not after a
    fifteen-minute timeout. After the first pass the server must stay
    healthy, and alive, for ``stable_for`` seconds: a server that dies two
    seconds after answering is not a success. ``timeout`` 0 checks once.
    """
    if pid == "started":  # in a batch right after server_start
        pid, log = SESSION.last_started.get("pid"), SESSION.last_started.get("log")
    if timeout <= 0:
        ok, last = check_all(base_url, checks, interval, None)
        if not ok:
            raise AgentError("health_timeout", "not healthy: %s" % last, polls=1, last=last)
        return {"elapsed": 0.0, "polls": 1, "last": last, "stable_for": 0.0}
    SESSION.event("progress", msg="waiting up to %.0f s for %s to be healthy" % (timeout, base_url))
    start = time.monotonic()
    deadline = start + timeout
    last = said = ""
    said_at = 0.0
    polls = 0
    while True:
        SESSION.check_cancel()
        watch_process(pid, log, polls, "during start")
        ok, last = check_all(base_url, checks, interval, deadline)
        polls += 1
        watch_process(pid, log, polls, "during start")
        if ok:
            break
        # Say what we wait for when it changes, and every 10 s: not at every poll.
        now = time.monotonic()
        if last != said or now - said_at >= 10.0:
            said, said_at = last, now
            SESSION.event("health", msg=last, elapsed=round(now - start, 1), polls=polls)
        if now >= deadline:
            raise AgentError("health_timeout", "not healthy after %ss: %s" % (timeout, last),
                             log_tail=tail_lines(log) if log else [], polls=polls, last=last)
        # Poll quickly at first (a small server is up in a fraction of a
        # second), backing off to ``interval``: 0.05, 0.1, 0.2 … s.
        sleep_watching(min(interval, 0.05 * (2 ** min(polls, 10)), max(0.0, deadline - now)))
    healthy_after = time.monotonic() - start
    if stable_for > 0:
        SESSION.event("progress", msg="healthy after %.1f s; checking it stays healthy for %.0f s"
                      % (healthy_after, stable_for))
        stable_until = time.monotonic() + stable_for
        while time.monotonic() < stable_until:
            sleep_watching(min(interval, 1.0, max(0.0, stable_until - time.monotonic())))
            watch_process(pid, log, polls, "%.1f s after it became healthy" % (time.monotonic() - start - healthy_after))
            ok, seen = check_all(base_url, checks, interval, max(stable_until, time.monotonic() + 1.0))
            polls += 1
            if not ok:
                raise AgentError("unstable", "server became unhealthy %.1f s after it first passed its checks: %s"
                                 % (time.monotonic() - start - healthy_after, seen),
                                 log_tail=tail_lines(log) if log else [], polls=polls, last=seen)
    return {"elapsed": healthy_after, "polls": polls, "last": last, "stable_for": stable_for}


@op("log_tail")
def op_log_tail(path, lines=LOG_TAIL_LINES):
    return tail_lines(expand(path), lines)


# ---------------------------------------------------------------- the restore machine
#
# Every change orch makes on a host is a release directory with a durable
# restore plan, ``restore.json``: the state to bring the host to (for a
# deploy: as it was before; for ``orch rollback``: the state it asked for).
# ONE function executes it, ``restore_release``, for all three who may:
# the controller's automatic rollback, the watchdog, and ``orch rollback``
# finishing a deploy that never did. It re-reads the plan from disk when it
# acts, so whoever acts restores the same thing. Around it:
#
# - ``restore.lock`` (flock): one restorer at a time, and no confirm while a
#   restore runs. It exists from the release's creation, so locking it
#   needs no disk space.
# - ``claim.json``: who acts. ``confirmed`` ends the watchdog; a controller
#   or ``orch rollback`` claim turns the watchdog into a back-up that acts
#   only if that restore has not completed by the claim's ``until``.
# - ``restored.json``: what a restore actually did, file by file. Every
#   message orch prints about a restore is built from this record.
# - ``commit.started``: the commit began, so a target may hold orch's
#   content. Without it, a target that changed was changed by somebody
#   else, and is left alone.
# - ``server.touched``: the server was (about to be) stopped.
#
# Files are restored as compare-and-swap on content: a file that already
# holds the wanted content is never rewritten; one that holds content orch
# did not write is first saved into the release as drift (``files/<n>.drift``),
# named in the record, then restored — nothing a person wrote is lost.

RESTORE_LOCK = "restore.lock"


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
    drain_planted()
    try:
        write_atomic(real, data, f.get("mode"), f.get("uid"), f.get("gid"))
    finally:
        planted = drain_planted()
        if planted:
            done["refused"] = done.get("refused", []) + planted
    if sha256_bytes(read_nofollow(real)) != f["sha256"]:
        raise AgentError("restore", "%s reads back wrong after restore" % path)
    done["action"] = "restored"
    return done


def followable(path):
    """``(real file, None)``, or ``(None, why)`` when ``path`` is a symlink that
    another user made to somebody else's file (``fs.protected_symlinks``'s
    rule, on any directory): orch, running as root, must not write through it."""
    try:
        link = os.lstat(path)
    except OSError:
        return os.path.realpath(path), None
    real = os.path.realpath(path)
    if not os.path.islink(path) or link.st_uid == os.getuid():
        return real, None
    try:
        owner = os.stat(real).st_uid
    except OSError:
        owner = None
    if owner is not None and owner != link.st_uid:
        return None, ("%s is a link made by uid %d to %s, a file of uid %d's: refused, not followed" % (
            path, link.st_uid, real, owner))
    return real, None


def checked_real(path):
    """The file ``path`` names, for orch to read and write: a link another
    user planted at it (``followable``) stops the step instead."""
    real, refused = followable(expand(path))
    if refused:
        raise AgentError("planted", refused, path=path)
    return real


def read_nofollow(path):
    """A file orch wrote (a backup, a restored target), read without following a link put in its place."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def point_link(path, target):
    """Make the symlink ``path`` point at ``target``, atomically (rename over).

    Made in a private directory of ours (``private_dir``) and renamed from
    there: a link planted at any name orch might use is never replaced nor
    followed."""
    directory = os.path.dirname(path) or "."
    dfd = open_dir(directory)
    try:
        name, pfd = private_dir(dfd, os.path.basename(path))
        try:
            os.symlink(target, "new", dir_fd=pfd)
            os.replace("new", os.path.basename(path), src_dir_fd=pfd, dst_dir_fd=dfd)
        finally:
            drop_private_dir(dfd, name, pfd)
        try:
            os.fsync(dfd)
        except OSError:
            pass
    finally:
        os.close(dfd)


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


def restore_server(release_dir, server, paths):
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
    running = op_server_find(server.get("pidfile"), server.get("port"))
    if server_settled(server, touched, paths, running):
        if not touched:
            return {"action": "untouched", "pid": (server.get("before") or {}).get("pid")}
        return {"action": "already running", "pid": running["pid"] if running else None}
    if running is not None:
        op_server_stop(running["pid"], running["pgid"], server.get("stop_timeout", 30.0), server.get("port"),
                       server.get("free_timeout", 120.0))
    start = server.get("start")
    if not start:
        return {"action": "stopped"}
    got = op_server_start(start["argv"], start.get("cwd"), start.get("env"), server.get("log"),
                          server.get("pidfile"), start.get("replace_env", False))
    return {"action": "restarted", "pid": got["pid"], "log": got["log"]}


def run_restore(release_dir, spec, by):
    """Execute a restore plan; returns the record of what was done (never raises)."""
    plan = spec["plan"]
    committed = plan.get("always") or os.path.exists(os.path.join(release_dir, "commit.started"))
    earlier = earlier_restored(release_dir)
    record = {"by": by, "started": time.time(), "files": [], "links": [], "server": None, "health": None,
              "ok": False, "completed": False, "error": None, "committed": bool(committed)}
    try:
        for n, f in enumerate(plan.get("files") or []):
            SESSION.check_cancel()
            done = restore_file(release_dir, f.get("n", n), f, committed)
            if done["action"] == "unchanged" and done["path"] in earlier:
                # an earlier restore of this release (one that failed later on) wrote it back
                done["action"], done["earlier"] = earlier[done["path"]]
            record["files"].append(done)
        for link in plan.get("links") or []:
            record["links"].append(restore_link(link))
        SESSION.event("progress", msg=describe_restored(record))
        server = plan.get("server")
        if server:
            paths = [os.path.realpath(expand(f["path"])) for f in plan.get("files") or []]
            paths += [expand(link["path"]) for link in plan.get("links") or []]
            record["server"] = restore_server(release_dir, server, paths)
            started = record["server"]
            if started.get("action") in ("restarted", "already running") and plan.get("health"):
                record["health"] = op_health_wait(pid=started.get("pid"), log=started.get("log"), **plan["health"])
            if server.get("after_healthy") and os.path.exists(os.path.join(release_dir, "drained")):
                # the deploy took the host out of its router: put it back, the server is healthy again
                run_server_cmd(server["after_healthy"], server.get("hook_timeout", 300.0))
                record["put_back"] = True
        if plan.get("on_success"):
            op_batch(plan["on_success"])
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


JOURNAL_STEP_BY = {"controller": "rolled_back", "watchdog": "restored_by_watchdog", "rollback": "rolled_back"}


def finish_records(release_dir, spec, record, reason):
    """Write what the restore did into the release and the journal (best
    effort: on a full disk the record still reaches the controller)."""
    problems = []
    err = try_write_json(os.path.join(release_dir, "restored.json"), record)
    if err:
        problems.append(err)
    manifest_path = os.path.join(release_dir, "manifest.json")
    manifest = read_json(manifest_path) or {}
    kind = manifest.get("kind", spec.get("kind", "deploy"))
    if kind == "rollback":
        manifest["outcome"] = "done" if record["ok"] else "rollback_failed"
    else:
        manifest["outcome"] = "rolled_back" if record["ok"] else "rollback_failed"
        manifest["restored_by"] = record["by"]
        if reason and not manifest.get("error"):
            manifest["error"] = reason
    drift = [f["path"] for f in record["files"] if f.get("drift")]
    if drift:
        manifest["drift"] = drift
    if not record["ok"]:
        manifest["restore_error"] = record["error"]
    err = try_write_json(manifest_path, manifest)
    if err:
        problems.append(err)
    journal_path = os.path.join(os.path.dirname(os.path.dirname(release_dir)), "journal.json")
    journal = read_json(journal_path)
    if journal and journal.get("release") == os.path.basename(release_dir):
        if record["ok"]:
            journal["step"] = "done" if kind == "rollback" else JOURNAL_STEP_BY.get(record["by"], "rolled_back")
            journal["finished"] = True
        else:
            journal["step"] = "restore_failed" if record["completed"] else "restore_interrupted"
        journal["drift"] = drift
        journal["time"] = time.time()
        err = try_write_json(journal_path, journal)
        if err:
            problems.append(err)
    return problems


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


@op("restore_release")
def op_restore_release(release_dir, by, until=None, reason=None, within=None):
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
    SESSION.finishing = True  # a dropped link does not stop a restore
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
            record = run_restore(release_dir, spec, by)
            record["record_errors"] = ([claim_error] if claim_error else []) + finish_records(
                release_dir, spec, record, reason)
            return record
    finally:
        SESSION.finishing = False


@op("confirm_release")
def op_confirm_release(release_dir, steps):
    """The deploy passed: claim the release as confirmed (the watchdog then
    leaves) and run ``steps`` — unless a restore got there first."""
    release_dir = expand(release_dir)
    with ReleaseLock(release_dir):
        done = read_record(os.path.join(release_dir, "restored.json"))
        claim = read_record(os.path.join(release_dir, "claim.json"))
        if done is not None or (claim and claim.get("by") not in (None, "confirmed")):
            return {"confirmed": False, "restored": done, "claim": claim}
        write_json(os.path.join(release_dir, "claim.json"), {"by": "confirmed", "time": time.time()})
    return {"confirmed": True, "results": op_batch(steps)}


@op("mark")
def op_mark(path):
    """An empty marker file (``server.touched``): creating one needs no data blocks."""
    write_mark(expand(path))
    return True


@op("release_arm")
def op_release_arm(state_dir, release_dir, python=None):
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
    pid = fork_watchdog(release_dir, os.path.join(release_dir, "watchdog.log"), fire_at)
    write_mark(os.path.join(release_dir, "watchdog.pid"), "%d\n" % pid)
    # pid + start time (``same_process``): ``state_read`` tells a live watchdog from a reused pid;
    # fires_at: when it acts, in this host's wall time (for people and ``orch status``)
    write_json(os.path.join(release_dir, WATCHDOG_FILE),
               {"pid": pid, "starttime": proc_starttime(pid), "budget": budget, "armed": fires_at - budget,
                "fires_at": fires_at, "clock": "host"})
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


def fork_watchdog(release_dir, log_path, fire_at=None):
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
    code = 1
    try:
        os.setsid()
        os.chdir("/")
        os.dup2(null_fd, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        close_fds_from(3)
        sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)
        name_process("orch-watchdog")
        code = watchdog_main(release_dir, fire_at)
    except SystemExit as e:  # SIGTERM (watchdog_main's handler)
        code = e.code if isinstance(e.code, int) else 0
    except BaseException as e:  # noqa: BLE001 - the child must never return into the helper's loop
        try:
            print("watchdog: %s: %s" % (type(e).__name__, e))
        except Exception:  # noqa: BLE001
            pass
    finally:
        try:
            sys.stdout.flush()
        finally:
            os._exit(code)


def name_process(name):
    """What ``ps -o comm`` and ``top`` show for this process (its argv stays the helper's)."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name)
    except OSError:
        pass


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
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    release_dir = expand(release_dir)
    spec = read_json(os.path.join(release_dir, "restore.json"))
    if fire_at is None:  # not handed one by ``op_release_arm``: the plan's budget from now
        fire_at = time.monotonic() + (watchdog_budget(spec) or 0.0)
    if spec is None or not watchdog_wait(release_dir, spec, fire_at):
        return 0
    global SESSION
    SESSION = Session(open(os.devnull, "wb"))
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    print("%s watchdog: deadline passed with the release neither confirmed nor restored; restoring" % stamp)
    sys.stdout.flush()
    try:
        record = op_restore_release(release_dir, "watchdog",
                                    reason="not confirmed before the watchdog's deadline")
    except AgentError as e:
        print("watchdog: nothing to do: %s" % e.message)
        return 0
    if record.get("already"):
        print("watchdog: already restored by %s" % record.get("by"))
        return 0
    print("restored: %s" % json.dumps(record, sort_keys=True))
    return 0 if record["ok"] else 1


# ================================================================ facts, files and imports; pre-flight
# (helper side of core.facts, core.flags and core.preflight; controller side:
# pipeline.plan's read and the deploy's pre-flight, through shell/ops.py)

FACTS_SCRIPT = (
    "import importlib.util, json, os, sys\n"
    "try:\n"
    "    from importlib import metadata\n"
    "except ImportError:\n"
    "    metadata = None\n"
    "out = {'python': sys.executable, 'python_version': '%d.%d.%d' % sys.version_info[:3], 'packages': {}}\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        spec = importlib.util.find_spec(name)\n"
    "    except Exception:\n"
    "        spec = None\n"
    "    if spec is None:\n"
    "        continue\n"
    "    places = list(spec.submodule_search_locations or [])\n"
    "    path = places[0] if places else (os.path.dirname(spec.origin) if spec.origin else None)\n"
    "    version = None\n"
    "    if metadata is not None:\n"
    "        try:\n"
    "            version = metadata.version(name)\n"
    "        except Exception:\n"
    "            version = None\n"
    "    out['packages'][name] = {'path': path, 'version': version}\n"
    "print(json.dumps(out))\n"
)
FACT_MARKER = re.compile("\x00orch-fact:([^\x00]*)\x00")
FOLLOW_MAX_BYTES = 4 * 1024 * 1024
PYTHON_NAME = re.compile(r"^(python|pypy)[0-9.]*$")


def server_python(record):
    """The interpreter a running server was started with (its argv[0], if that is a Python)."""
    if not record or not record.get("argv"):
        return None
    first = record["argv"][0]
    if not PYTHON_NAME.match(os.path.basename(first)):
        return None
    if "/" in first and not os.path.isabs(first):
        first = os.path.join(record.get("cwd") or "/", first)
    return first


def gather_facts(python, packages, env, timeout):
    """What ``python`` (the server's interpreter) imports as each package: its directory and version."""
    res = run_argv([python, "-c", FACTS_SCRIPT] + list(packages), env=env, timeout=timeout)
    if res["rc"] != 0:
        last = (res["stderr"] or res["stdout"]).strip().splitlines()
        return {"python": python, "packages": {}, "error": last[-1] if last else "exit %d" % res["rc"]}
    try:
        facts = json.loads(res["stdout"].strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"python": python, "packages": {}, "error": "no facts in its output"}
    return facts


def fill_facts(path, facts):
    """Replace each fact marker in a path with the fact (a deferred ``{{ sglang_root }}``)."""

    def value(match):
        node = facts
        for part in match.group(1).split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node if isinstance(node, str) else ""

    return FACT_MARKER.sub(value, path)


FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+[.\w]", re.M)
FROM_AFTER_SEMICOLON = re.compile(r";[ \t]*from[ \t]+[.\w]")  # "import os; from x import y"
INDENT = re.compile(r"[ \t]*")
IMPORT_WORD = re.compile(r"[\s.]import\b")
IMPORT_PAREN_TRIES = 20  # bounds the work a line of prose like "from (a) ..." can cause
IMPORT_MAX_CHARS = 16384


def import_froms(text):
    """The ``from ... import ...`` statements of ``text``, outer ones first.

    A regex finds the lines that can start one and ``ast`` parses each, with
    its backslash-continued and parenthesised rest: parsing the whole module
    and walking every node of it was most of the helper's CPU in a no-op
    (11 ms for a 3,900-line ``server_args.py``, on every host of a fleet).
    A line inside a string that looks like an import is parsed too; that can
    only add a module that exists, which is then looked at, never hide one.
    Text that would make this parse more than a few times its size (prose
    full of "from x import (") gets the whole-module parse instead.
    """
    import ast

    found = []
    budget = 4 * len(text) + IMPORT_MAX_CHARS
    starts = {m.start() for m in FROM_IMPORT.finditer(text)}
    starts.update(text.rfind("\n", 0, m.start()) + 1 for m in FROM_AFTER_SEMICOLON.finditer(text))
    for start in sorted(starts):
        indent = INDENT.match(text, start).end() - start
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        while text[start:end].rstrip().endswith("\\") and end < len(text):
            after = text.find("\n", end + 1)
            end = len(text) if after < 0 else after
        if not IMPORT_WORD.search(text, start, end):
            continue  # prose that starts with "from"
        tree = None
        for _ in range(IMPORT_PAREN_TRIES):
            budget -= end - start
            if budget < 0:
                return [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ImportFrom)]
            try:
                tree = ast.parse(text[start:end].strip())
                break
            except (SyntaxError, ValueError):
                # a parenthesised list goes on to a later ")" (a comment may hold one first)
                close = text.find(")", end) if "(" in text[start:end] else -1
                if close < 0 or close - start > IMPORT_MAX_CHARS:
                    break
                end = close + 1
        if tree is None:
            continue
        # outer statements first, as a walk of the whole tree would meet them
        found.extend((indent, start, node) for node in tree.body if isinstance(node, ast.ImportFrom))
    return [node for _, _, node in sorted(found, key=lambda item: item[:2])]


def imported_modules(path, text):
    """Files of the same package that ``path`` imports (``from pkg.a.b import c``; relative too)."""
    try:
        nodes = import_froms(text)
    except (SyntaxError, ValueError):  # the whole-module parse, for a text that does not parse
        return []
    parts = os.path.abspath(path).split(os.sep)
    out = []
    for node in nodes:
        if node.level:
            base = os.path.dirname(os.path.abspath(path))
            for _ in range(node.level - 1):
                base = os.path.dirname(base)
            module_dir = os.path.join(base, *(node.module or "").split(".")) if node.module else base
        else:
            if not node.module:
                continue
            names = node.module.split(".")
            tops = [i for i, part in enumerate(parts[:-1]) if part == names[0]]
            if not tops:
                continue
            root = os.sep.join(parts[: tops[-1]]) or os.sep
            module_dir = os.path.join(root, *names)
        candidates = [module_dir + ".py", os.path.join(module_dir, "__init__.py")]
        candidates += [os.path.join(module_dir, alias.name + ".py") for alias in node.names]
        for candidate in candidates:
            if os.path.isfile(candidate) and candidate not in out and candidate != os.path.abspath(path):
                out.append(candidate)
    return out


def follow_imports(path, names):
    """The modules ``path`` imports that mention any of ``names`` (where a layout keeps its fields)."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    found = []
    for module in imported_modules(path, text):
        try:
            if os.path.getsize(module) > FOLLOW_MAX_BYTES:
                continue
            with open(module, "rb") as f:
                data = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        if any(name in data for name in names):
            found.append(file_info(module))
    return found


@op("read_host")
def op_read_host(paths, packages=(), python=None, pidfile=None, port=None, follow=None, timeout=60.0):
    """Facts, then the files (their paths may hold fact markers), then the modules they import
    that mention the given names — in one round trip; and the running server (``server``:
    its record, found by the pidfile or the port, as ``server_find`` does).

    Facts are gathered by the server's interpreter with the server's
    environment when a server runs (found like ``server_find``), else by
    ``python`` (or python3) with this helper's.
    """
    record = None
    try:
        record = op_server_find(pidfile, port)
    except AgentError:
        record = None
    interpreter = python or server_python(record) or "python3"
    env = dict(record["env"]) if record and record.get("env") else None
    facts = gather_facts(interpreter, packages, env, timeout) if packages else {"packages": {}}
    resolved = [fill_facts(p, facts) for p in paths]
    files = [file_info(p) for p in resolved]
    companions = {}
    for item in follow or []:
        index = int(item["index"])
        if 0 <= index < len(resolved) and files[index]["exists"]:
            companions[str(index)] = follow_imports(expand(resolved[index]), item["names"])
    return {"facts": facts, "paths": resolved, "files": files, "companions": companions, "server": record}


PARSER_ERROR = re.compile(r"^(\S.*?): error: (.*)$")


@op("preflight")
def op_preflight(argv, cwd=None, env=None, replace_env=False, timeout=120.0):
    """Run a server's argument parser on its new command line (``core.preflight``), nothing else.

    Returns its exit code, output, and the parser's own error line
    (``sglang serve: error: unrecognized arguments: …``) when there is one.
    """
    if replace_env:
        full_env = dict(env or {})
        res = _run_exact_env(argv, cwd and expand(cwd), full_env, timeout)
    else:
        res = run_argv(argv, cwd and expand(cwd), env, timeout)
    error_line = None
    message = None
    for line in reversed((res["stderr"] + "\n" + res["stdout"]).splitlines()):
        match = PARSER_ERROR.match(line.strip())
        if match:
            error_line, message = match.group(0), match.group(2)
            break
    res["error_line"] = error_line
    res["message"] = message
    res["argv"] = argv
    return res


def _run_exact_env(argv, cwd, env, timeout):
    """``run_argv`` with exactly ``env`` (a recorded server environment), not this helper's plus it."""
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout)
    except (FileNotFoundError, PermissionError) as e:
        return {"rc": 127, "stdout": "", "stderr": "cannot run %s: %s" % (argv[0], e)}
    except subprocess.TimeoutExpired:
        return {"rc": 124, "stdout": "", "stderr": "timed out after %ss" % timeout}
    return {"rc": proc.returncode,
            "stdout": proc.stdout[-64 * 1024:].decode("utf-8", "replace"),
            "stderr": proc.stderr[-64 * 1024:].decode("utf-8", "replace")}


# ================================================================ end of facts, files and imports; pre-flight


# ================================================================ nightly: builds, the link switch, the probe
#
# Ops added for `orch nightly` (and the probe a performance gate builds on).
# They touch nothing above: a night builds into a fresh directory beside the
# live one, and only `nightly_link_swap` changes what is live, by one rename.


def nightly_stop_reason():
    """Why a build or a probe must stop now (Ctrl-C on the controller, or the
    controller gone), or None: the same two causes ``check_cancel`` raises for."""
    if SESSION is None or not SESSION.stop_asked():
        return None
    return "cancelled by the controller" if SESSION.cancel_requested else "the controller went away"


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
        deadline = time.monotonic() + timeout
        why = None
        while proc.poll() is None:
            why = nightly_stop_reason()
            if why is None and time.monotonic() >= deadline:
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
    found = op_nightly_builds(root)
    return {"builds_dir": root, "build_dir": dest, "current": found["current"], "builds": found["builds"],
            "complete": found["complete"], "seqs": found["seqs"],
            "log": os.path.join(root, "logs", build + ".log"), "python_version": sys.version.split()[0]}


@op("nightly_builds")
def op_nightly_builds(builds_dir):
    """The builds in ``builds_dir`` and where ``current`` points; reads only
    (``orch rollback`` checks that the build it switches back to is still there)."""
    root = expand(builds_dir)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return {"builds_dir": root, "current": None, "builds": []}
    builds = sorted(n for n in names
                    if not n.startswith(".") and n not in ("current", "logs")
                    and os.path.isdir(os.path.join(root, n)) and not os.path.islink(os.path.join(root, n)))
    # complete: a night confirmed it (its manifest is written by the confirm); the others were
    # built half-way, or never passed, and never count toward keep_builds
    complete = [n for n in builds if os.path.isfile(os.path.join(root, n, "manifest.json"))]
    return {"builds_dir": root, "current": read_link(os.path.join(root, "current")), "builds": builds,
            "complete": complete, "seqs": build_seqs(root, builds)}


def build_seqs(root, builds):
    """Each build's ``seq`` from its own manifest (nights made by older versions have none):
    ``keep_builds`` orders by it, not by the names, which are stamped with a clock."""
    seqs = {}
    for name in builds:
        seq = (read_json(os.path.join(root, name, "manifest.json")) or {}).get("seq")
        if isinstance(seq, int) and not isinstance(seq, bool):
            seqs[name] = seq
    return seqs


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
        fsync_dir(os.path.dirname(link))
    else:
        point_link(link, to)
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
    request = http()
    req = request.Request(url, data=payload, method="POST", headers=headers)
    status, raw, error = None, b"", None
    try:
        with request.urlopen(req, timeout=timeout) as resp:
            status = resp.status
            raw = resp.read(4 << 20)
    except request.HTTPError as e:
        status = e.code
        error = "HTTP %d" % e.code
    except (request.URLError, OSError, ValueError) as e:
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
                if i >= count or nightly_stop_reason() is not None:
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


HELPER_KEPT = False


def keep_helper():
    """Keep this helper's source where the next run's bootstrap imports it
    (``agent_client.BOOTSTRAP``): ``<state dir>/helper/<name>.py``, older
    versions' copies removed. Tried at start and again when ``state_init``
    makes the state dir; only into a state dir that the login user owns and
    nobody else can write. A copy that cannot be kept costs the next run a
    transfer and a compile, nothing else.

    ``HELPER_CACHE`` (state dir, name) and ``HELPER_SOURCE`` are set by the
    bootstrap when it received the source; a helper imported from its copy
    has neither and keeps nothing.
    """
    global HELPER_KEPT
    cache, source = globals().get("HELPER_CACHE"), globals().get("HELPER_SOURCE")
    if HELPER_KEPT or not cache or not cache[0] or not source:
        return
    state_dir, name = cache
    state = expand(state_dir)
    here = os.path.join(state, "helper")
    try:
        if not owned_private(state):
            return
        HELPER_KEPT = True
        if not os.path.isdir(here):
            os.mkdir(here, 0o700)
        if not owned_private(here):
            return
        for entry in os.listdir(here):
            if entry.startswith("orch_helper_") and entry != name + ".py":
                os.unlink(os.path.join(here, entry))
        shutil.rmtree(os.path.join(here, "__pycache__"), ignore_errors=True)
        path = os.path.join(here, name + ".py")
        write_atomic(path, source.encode("utf-8"), 0o600)
        # Compiled now, where the import machinery looks for it: a host whose
        # environment sets PYTHONDONTWRITEBYTECODE would never write it itself.
        import importlib.util
        import py_compile

        py_compile.compile(path, cfile=importlib.util.cache_from_source(path), doraise=True)
    except Exception:  # noqa: BLE001 - best effort: see above
        pass


def owned_private(path):
    """``path`` belongs to this user and nobody else can write it (what the bootstrap checks)."""
    st = os.stat(path)
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def main(argv):
    os.umask(0o022)
    # A dropped SSH session must not kill a restore half-way: the helper
    # notices the end of its input and leaves by itself.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    name_process("orch-helper")
    keep_helper()
    serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main(sys.argv)
