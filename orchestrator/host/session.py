"""One controller's conversation with the helper (``Session``): the reader of
requests, the writer of answers and events, ticks, cancel, the held lock, and
what this helper made that must not outlive the conversation (staged copies).

Passed explicitly to every op as its first argument: the helper keeps no
module-level state, so the watchdog (a fork) simply makes its own.
"""

import json
import os
import select
import threading
import time

from .wire import (
    BLOB_CHUNK,
    HEARD_SECONDS,
    LOCK_HEARTBEAT_SECONDS,
    READ_PIECE,
    SILENCE_SECONDS,
    TICK_SECONDS,
    AgentError,
    Blob,
    b64d,
    b64e,
    beat_seconds,
)


def wake_pipe():
    """A pipe whose reader a ``select`` waits on until a byte is written to wake it (a
    ``Session``'s wake, the guard's SIGCHLD): neither end ever blocks, so a wake written
    while one is pending is simply dropped."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    return r, w


def drain(fd):
    """Read a non-blocking pipe or FIFO empty: the wakes heard so far are forgotten."""
    try:
        while os.read(fd, 512):
            pass
    except OSError:
        pass


class Session(object):
    """One controller's conversation: output, ticks, cancel, the held lock.

    Two ways an op can be told to stop are kept apart: an explicit
    ``cancel`` (Ctrl-C on the controller) stops any op, while the end of the
    connection (``eof``: the controller died or the link dropped) stops a
    wait that only the controller cared about but never a restore — a
    restore that has begun is finished on the host whatever the link does.
    """

    def __init__(self, out, archive=None, cache=None):
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
        self.staged_fds = {}  # staged path -> its open, flocked descriptor: the file this helper wrote there
        # Keeping this helper in the state dir (keep.py): the archive it came as, when it was
        # sent (None when it runs from a kept copy), and (state dir, helper id) to keep it under.
        self.archive = archive
        self.cache = cache
        self.kept = False
        self.guards = {}  # release dir -> the pipe's write end to its guard (``runner.op_release_run``)
        self.follow_link_timeout(SILENCE_SECONDS)
        # A byte in this pipe ends a ``pause``: a cancel, the end of the link, an abort.
        self.wake_r, self.wake_w = wake_pipe()

    def follow_link_timeout(self, limit):
        """The controller's silence limit (``hello``'s ``link_timeout``), which this end keeps too:
        silent that long, the controller is gone; ticks come at a third of it (5 s at most),
        so the controller never waits as long for a word; the lock's heartbeat stops sooner."""
        self.silence_seconds = float(limit)
        self.tick_seconds = beat_seconds(self.silence_seconds)
        self.heard_seconds = min(HEARD_SECONDS, self.silence_seconds)

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
                self.wake()
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
                self.wake()
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
        return time.monotonic() - self.last_heard > self.silence_seconds

    def hears_controller(self):
        """The controller was heard lately (it pings every 5 s, or sooner): only then is the
        lock's heartbeat renewed, so a fresh heartbeat tells another run that this
        helper is alive AND still hears its controller (a run in progress), and a
        stale one that nobody is steering it any more."""
        return not self.eof and time.monotonic() - self.last_heard < self.heard_seconds

    def next_request(self):
        with self.cond:
            while not self.requests and not self.eof:
                if self.silent():
                    self.eof = True  # treat a silent controller as gone: free the host
                    self.gone = "no word from the controller for %g s" % self.silence_seconds
                    break
                self.cond.wait(1.0)
            if self.requests:
                self.cancel_requested = False
                return self.requests.pop(0)
            return None

    def wake(self):
        """End the ``pause`` under way (or the next one) early: a stop was asked."""
        try:
            os.write(self.wake_w, b"!")
        except OSError:
            pass  # the pipe is full: a wake is pending already

    def pause(self, seconds, fds=()):
        """Wait up to ``seconds`` (1 s at most, so that a silent controller is noticed in
        time) for one of ``fds`` to become readable or for a ``wake``: the descriptors
        that did. A wait that wakes only for news costs no CPU while nothing happens
        (sleeping in 0.1 s slices to look for a cancel cost a model's load of many
        minutes ten wakes a second, in the runner and in the helper following it)."""
        try:
            ready = select.select([self.wake_r] + list(fds), [], [], max(0.0, min(seconds, 1.0)))[0]
        except (OSError, ValueError):
            time.sleep(max(0.0, min(seconds, 0.1)))  # a descriptor closed under us: poll as before
            return []
        if self.wake_r in ready:
            drain(self.wake_r)
        return [fd for fd in ready if fd != self.wake_r]

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

    def answered(self, step, answers, judged=None):
        """A program's step ended with ``answers``: a controller reads them in the step's answer;
        the runner's session logs them (``runner.RunnerSession``)."""

    def background(self):
        """Ticks while an op runs; renews the lock heartbeat while held."""
        last_beat = last_tick = 0.0
        while not self.stopping:
            time.sleep(min(1.0, self.tick_seconds / 2))
            now = time.monotonic()  # intervals: a step of the wall clock must not stop the ticks
            if self.current_id is not None and now - last_tick >= self.tick_seconds:
                last_tick = now
                self.event("tick", t=time.time())
            elif self.receiving(now) and now - last_tick >= self.tick_seconds:
                # The controller has sent a request's bytes and now waits for an answer, while
                # they still cross a slow link (its buffers took them long ago): tell it we hear.
                last_tick = now
                self.send({"id": None, "event": "tick", "t": time.time(), "receiving": True})
            if self.lock is not None and now - last_beat >= LOCK_HEARTBEAT_SECONDS and self.hears_controller():
                last_beat = now
                renew_heartbeat(self.lock)


def renew_heartbeat(lock):
    """The lock's heartbeat is its file's mtime, renewed through the fd this
    session holds: after a take-over that fd names the old (renamed) file,
    so a slow heartbeat can never overwrite the new holder's lock."""
    try:
        os.utime(lock[1])
    except (OSError, NotImplementedError):
        pass
