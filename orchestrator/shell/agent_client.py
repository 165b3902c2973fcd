"""The controller's end of the helper protocol (see ``orchestrator.host``).

One ``Agent`` per host per run: it starts the helper over the transport
with a single exec, then every step is a request on that one channel.
``calls`` counts round trips, which the benchmarks report.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import json
import logging
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.core.kept import Kept
from orchestrator.errors import (
    BecomeRefusedError,
    InterruptedTwice,
    LinkLostError,
    MalformedReplyError,
    RemoteError,
    Terminated,
    UnreachableError,
)
from orchestrator.host.protocol import Hello
from orchestrator.host.wire import LINK_TIMEOUT_FLOOR, SILENCE_SECONDS, beat_seconds
from orchestrator.shell.replies import Envelope, Malformed, decode
from orchestrator.shell.transport import (
    PumpedProcess,
    RemoteProcess,
    Transport,
    explain_become_failure,
)

HOST_PACKAGE = Path(__file__).resolve().parent.parent / "host"
"""The helper: ``orchestrator/host``, shipped whole (``helper_archive``)."""
ARCHIVE_TIME = (1980, 1, 1, 0, 0, 0)
ARCHIVE_TOP = ("orchestrator/__init__.py", b'"""orch\'s host side only: a host has nothing else of orch."""\n')
"""The archive's own ``orchestrator`` package: the host imports ``orchestrator.host`` from
the archive, never the rest of an orch that happens to be installed there."""


@functools.cache
def helper_members() -> tuple[tuple[str, bytes], ...]:
    """The archive's members, read once a run: the id and the archive are made of the same bytes
    even if the source changes while orch runs."""
    return (ARCHIVE_TOP,) + tuple(
        (f"orchestrator/host/{path.name}", path.read_bytes()) for path in sorted(HOST_PACKAGE.glob("*.py")))


def helper_archive() -> bytes:
    """``orchestrator/host/*.py`` as one zip, the same bytes for the same source (as Ansible's
    AnsiballZ ships a module with its utils): sorted names, fixed times and modes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in helper_members():
            info = zipfile.ZipInfo(name, date_time=ARCHIVE_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3
            info.external_attr = 0o100644 << 16
            archive.writestr(info, data, compresslevel=9)
    return buffer.getvalue()


_ARCHIVE: Kept[str, bytes] = Kept(1)


def shipped_archive() -> bytes:
    """The archive this run sends to every host that has no copy of it yet: built once, when a
    host first needs it (not at import: a command that reaches no host never builds it, and a
    Ctrl-C during a start-up import never lands inside zipfile). A fleet's workers all ask at
    once; ``Kept`` makes the others wait for the first build rather than each compress it
    (25 hosts: 25 builds, 0.4 s of the controller's CPU)."""
    return _ARCHIVE.get("archive", helper_archive)


@functools.cache
def helper_id() -> str:
    """Names this helper's copy in a host's state dir (another orch version keeps its own): the
    hash of the archive's members, each name and content, so that a start on a host that keeps
    this copy builds no archive (compressing it cost each run 15 ms of the controller's CPU)."""
    digest = hashlib.sha256(b"orch-helper\0")
    for name, data in helper_members():
        digest.update(b"%d:%s%d:" % (len(name), name.encode(), len(data)))
        digest.update(data)
    return digest.hexdigest()[:16]


READY_MAGIC = "ORCH-AGENT-READY"
# The bootstrap, on the command line: argv = [state dir, helper id].
# A host keeps the helper in ``<state dir>/helper/<id>/orchestrator/host/*.py``
# with their ``__pycache__`` (``host/keep.py``): a start then costs no transfer
# and no compile. The copy is used only when that directory, the helper dir and
# the state dir belong to the login user and nobody else can write them; the
# helper holds a shared flock on it while it runs (it imports a module when its
# op first runs), so another orch version's helper never removes a copy in use.
# Otherwise the bootstrap asks for the archive (one line, base64) and imports
# the package from memory: a meta-path finder over the archive's members,
# rather than a temp file for zipimport, which would have to outlive every
# lazy import (and the watchdog) and could never be removed (the helper leaves
# by ``os._exit``). Code compiled from memory is named
# ``orchestrator/host/<module>.py``. The helper then keeps the archive for next
# time. Python 3.6 syntax, so that an older interpreter is told in one line that it is too old
# (the package needs 3.8). ``-c`` puts the working directory (the login's home) first on
# ``sys.path``: a ``json.py`` or ``random.py`` left there would be imported in place of the
# standard library's, so it goes. The interpreter runs with ``-S``: the helper needs the standard
# library only, and a host's ``site`` (its site-packages' ``.pth`` hooks, a distribution's
# ``sitecustomize``) is not its business and cost each start about 3 ms of CPU here, more
# on a box with a large environment; ``ORCH_HELPER_SITE=1`` in the host's environment runs
# ``site`` after all (a ``sitecustomize`` that measures the helper: the test suite's coverage).
BOOTSTRAP = """\
import os, sys
if sys.path and sys.path[0] == '':
    del sys.path[0]
if os.environ.get('ORCH_HELPER_SITE'):
    import site
    site.main()
if sys.version_info < (3, 8):
    sys.stderr.write("orch-helper: the host's Python is %s (%s); orch's helper needs 3.8 or newer: set python: in the inventory\\n" % (sys.version.split()[0], sys.executable))
    sys.exit(3)
def kept(state, hid):
    try:
        here = os.path.join(os.path.abspath(os.path.expanduser(state)), 'helper')
        top = os.path.join(here, hid)
        for d in (os.path.dirname(here), here, top):
            st = os.stat(d)
            if st.st_uid != os.getuid() or st.st_mode & 0o022:
                return None
        import fcntl
        fcntl.flock(os.open(top, os.O_RDONLY), fcntl.LOCK_SH)
        return top if os.path.isfile(os.path.join(top, 'orchestrator', 'host', 'main.py')) else None
    except Exception:
        return None
top = kept(sys.argv[1], sys.argv[2]) if sys.argv[1] else None
archive = None
if top:
    sys.path.insert(0, top)
else:
    sys.stdout.write('{"send": true}\\n')
    sys.stdout.flush()
    import base64, io, zipfile, importlib.util
    archive = base64.b64decode(sys.stdin.buffer.readline())
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        files = dict((n, z.read(n)) for n in z.namelist())
    class Archive(object):
        def find_spec(self, name, path=None, target=None):
            base = name.replace('.', '/')
            for origin, package in ((base + '/__init__.py', True), (base + '.py', False)):
                if origin in files:
                    return importlib.util.spec_from_loader(name, self, origin=origin, is_package=package)
        def create_module(self, spec):
            return None
        def exec_module(self, module):
            origin = module.__spec__.origin
            exec(compile(files[origin], origin, 'exec'), module.__dict__)
    sys.meta_path.insert(0, Archive())
from orchestrator.host.main import main
main(archive, (sys.argv[1], sys.argv[2]))
"""
# Ticks arrive every 5 s while an op runs: this much silence means the link is dead. The
# default of the ``link_timeout`` setting; a run's own value is sent to the helper in its
# first request (``hello``), so both ends keep the same limit.
LINK_TIMEOUT = SILENCE_SECONDS
# And the other way: the controller pings the helper this often (every 5 s, or a third of
# a shorter limit: ``beat_seconds``), so a helper that hears nothing for the limit knows its
# controller is gone (host/session.py).
PING_SECONDS = beat_seconds(LINK_TIMEOUT)
START_TIMEOUT = 60.0
# File contents travel as blob lines of this many bytes (base64 on the wire), each its own
# write: pings go between them, and no line takes long to cross even a slow link.
BLOB_CHUNK = 192 * 1024

EventHandler = Callable[[dict[str, Any]], None]


@functools.cache
def bootstrap_payload() -> bytes:
    """The helper's archive as the bootstrap reads it: encoded once per run, not per host."""
    return base64.b64encode(shipped_archive()) + b"\n"

PROTOCOL_LOG = logging.getLogger("orchestrator.protocol")
"""Every line on the helper's channel, at DEBUG (``orch -v``/``-vv`` show them; off by default)."""


def _trace(label: str, direction: str, line: Any) -> None:
    if PROTOCOL_LOG.isEnabledFor(logging.DEBUG):
        if isinstance(line, bytes):
            line = line.decode("utf-8", "replace").rstrip("\n")
        PROTOCOL_LOG.debug("%s %s %s", label, direction, line,
                           extra={"orch_host": label, "orch_dir": direction, "orch_line": line})


def _fill_blobs(value: Any, blobs: dict[int, bytearray]) -> Any:
    """``value`` with each ``{"blob": n}`` replaced by blob n's bytes (each copied once, then dropped)."""
    if isinstance(value, dict):
        if len(value) == 1 and isinstance(value.get("blob"), int):
            data = blobs.pop(value["blob"], None)
            return bytes(data) if data is not None else b""
        return {k: _fill_blobs(v, blobs) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill_blobs(v, blobs) for v in value]
    return value


def wire_bytes(value: bytes | bytearray | str | None) -> bytes:
    """File content from an answer: ``bytes`` (it came as blob lines, see
    ``host.wire``), or base64 text where a caller built the answer by hand."""
    if value is None:
        return b""
    if isinstance(value, str):
        return base64.b64decode(value)
    return bytes(value)


PYTHON_DUMP = ("Fatal Python error", "Python runtime state", "Current thread", "Thread 0x", "<no Python frame>")
"""Lines of an interpreter's crash dump: they say nothing to whoever reads orch's message."""


def helper_reason(stderr: str) -> str:
    """The helper's last meaningful stderr line (its own ``orch-helper: ...`` first), on one line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    own = [line for line in lines if line.startswith("orch-helper:")]
    if own:
        return " ".join(own[-1].split())
    useful = [line for line in lines if not line.startswith(PYTHON_DUMP) and not line.startswith("File ")]
    return " ".join(useful[-1].split()) if useful else ""


class RemoteStepError(RemoteError):
    """A step the helper ran failed; ``kind`` says which sort, ``details`` the rest."""

    def __init__(self, op: str, kind: str, message: str, details: dict[str, Any]) -> None:
        super().__init__(message)
        self.op = op
        self.kind = kind
        self.message = message
        self.details = details

    @property
    def log_tail(self) -> list[str]:
        """The server's (or the build's) last log lines the failed step sent, if any."""
        tail = self.details.get("log_tail")
        return [str(line) for line in tail] if isinstance(tail, list) else []


@dataclass
class Agent:
    """A running helper on one host."""

    transport: Transport
    python: str = "python3"
    state_dir: str = ""  # where the host keeps its copy of the helper ("": nowhere)
    link_timeout: float = LINK_TIMEOUT
    calls: int = 0
    interrupted_twice: bool = False  # a second Ctrl-C came while a cancelled op was answering
    cancelled: bool = False  # a Ctrl-C asked the host to stop an op (a runner's restore then follows)
    info: dict[str, Any] = field(default_factory=dict)
    info_monotonic: float = 0.0  # this controller's monotonic clock when ``info`` (the hello) arrived
    dead: str | None = None  # why the link is gone: later calls fail at once, never wait on it
    _proc: RemoteProcess | None = None
    _next_id: int = 0
    _next_blob: int = 0
    _write_lock: threading.Lock = field(default_factory=threading.Lock)
    _closed: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Agent:
        """Start the helper; raises ``UnreachableError`` when it cannot run there."""
        if not self.link_timeout >= LINK_TIMEOUT_FLOOR:
            raise ValueError(f"link_timeout {self.link_timeout!r}: {LINK_TIMEOUT_FLOOR:g} s at least")
        label = self.transport.target.label
        argv = [self.python, "-S", "-u", "-c", BOOTSTRAP, self.state_dir, helper_id()]
        _trace(self.transport.target.name, "$", argv)
        proc = self.transport.spawn(argv)
        # A login shell may print banners (conda, motd) before the helper runs:
        # skip lines until the helper's ready line.
        for _ in range(1000):
            try:
                line = proc.readline(START_TIMEOUT)
            except LinkLostError as e:
                raise UnreachableError(f"{label}: orch's helper did not start: {e}") from None
            if not line:
                if self.transport.target.become:
                    self._refuse_become(proc)
                # stdout ended; the stderr pump may not have read the helper's last words yet
                said = (proc.stderr_bytes(settle=5.0).decode("utf-8", "replace")
                        if isinstance(proc, PumpedProcess) else proc.stderr_text())
                err = said.strip().splitlines()
                tail = err[-1] if err else "no output"
                raise UnreachableError(
                    f"{label}: cannot start orch's helper with {self.python!r}: {tail}"
                )
            _trace(self.transport.target.name, "<", line)
            try:
                msg = decode(line)
            except Malformed:
                continue  # a banner, however odd, is not the helper yet
            if isinstance(msg, dict) and msg.get("send") is True:
                proc.write(bootstrap_payload())  # the host has no copy of this helper yet
                continue
            if isinstance(msg, dict) and msg.get("ready") == READY_MAGIC:
                self._proc = proc
                if self.link_timeout != LINK_TIMEOUT:
                    self._send_link_timeout()
                threading.Thread(target=self._ping, name=f"orch-ping-{label}", daemon=True).start()
                self.info = msg["hello"] if isinstance(msg.get("hello"), dict) else self.call("hello")
                if not isinstance(self.info, dict):
                    raise self.malformed("hello", Malformed("result is not an object"))
                self.info_monotonic = time.monotonic()
                return self
        raise UnreachableError(f"{label}: orch's helper never said it was ready")

    def _send_link_timeout(self) -> None:
        """Tell the helper this run's silence limit (``hello``'s ``link_timeout``) before anything
        else: it keeps the same limit and ticks within it. Sent ahead, not waited for: requests
        are served in order, so it is in effect before the next one, and its answer, which
        names its own id, is passed over by the next call's wait. No round trip is spent."""
        self._next_id += 1
        line = json.dumps({"id": self._next_id, **Hello(link_timeout=self.link_timeout).to_wire()},
                          separators=(",", ":"))
        _trace(self.transport.target.name, ">", line)
        self._write(line.encode("utf-8") + b"\n")

    def _refuse_become(self, proc: RemoteProcess) -> None:
        """The helper ended before its ready line under ``become``: if sudo is why (a password
        prompt it may not show, no sudoers entry, no sudo), that is a refusal naming the host."""
        rc = proc.wait(5.0)
        stderr = proc.stderr_bytes(settle=2.0) if isinstance(proc, PumpedProcess) else proc.stderr_text()
        reason = explain_become_failure(rc, stderr)
        if reason is None:
            return
        label = self.transport.target.label
        if "needs a password" in reason:
            user = self.transport.target.user or "the login user"
            raise BecomeRefusedError(
                f"sudo asks for a password on {label}: become: true runs `sudo -n`, which never prompts; "
                f"allow passwordless sudo (NOPASSWD) for {user}, or set become: false"
            )
        raise BecomeRefusedError(f"{label}: {reason}")

    def call(
        self,
        op: str,
        *,
        on_event: EventHandler | None = None,
        **args: Any,
    ) -> Any:
        """One round trip: send a request, pass events to ``on_event``, return the result."""
        if self.dead is not None:
            raise LinkLostError(self.dead)
        if self._proc is None:
            raise RemoteError("the helper is not running")
        self._next_id += 1
        rid = self._next_id
        self.calls += 1
        blobs: list[tuple[int, bytes | bytearray | memoryview]] = []

        def blob_ref(value: Any) -> dict[str, int]:
            # bytes anywhere in the arguments are sent ahead in blob lines, named here
            if isinstance(value, (bytes, bytearray, memoryview)):
                self._next_blob += 1
                blobs.append((self._next_blob, value))
                return {"blob": self._next_blob}
            raise TypeError(f"cannot send {type(value).__name__} to the helper")

        request = json.dumps({"id": rid, "op": op, "args": args}, separators=(",", ":"), default=blob_ref)
        _trace(self.transport.target.name, ">", request)
        sent = False
        try:
            for blob, data in blobs:
                self._send_blob(blob, data)
            self._write(request.encode("utf-8") + b"\n")
            sent = True
            return self._await(rid, op, on_event)
        except LinkLostError as e:
            said = self._helper_said() if self._proc is not None else ""
            self.dead = str(e) if not said or said in str(e) else f"{e}{said}"
            if self.dead != str(e):
                raise LinkLostError(self.dead) from None
            raise
        except KeyboardInterrupt as e:
            if isinstance(e, Terminated):
                # SIGTERM/SIGHUP: nothing is cancelled on the host (a runner goes on); the answer
                # will never be read, so nothing more is sent on this link
                self.dead = f"{self.transport.target.label}: terminated during {op}"
                raise
            if sent:
                self._cancel(rid, op, on_event, twice=isinstance(e, InterruptedTwice))
            else:
                # Interrupted while the request was being written: the helper never got it
                # (there is no answer to wait for), and a line may be cut short. Nothing more
                # is sent on this link; the helper cleans up when the channel closes.
                self.dead = f"{self.transport.target.label}: interrupted while sending {op}"
            raise

    def _send_blob(self, blob: int, data: bytes | bytearray | memoryview) -> None:
        """``data`` as blob lines of ``BLOB_CHUNK`` bytes (one line at least, for empty data):
        one write each, so a ping can go between two of them. Not traced: the request
        that follows names the blob, and the protocol view has no use for the base64."""
        view = memoryview(data)
        head = b'{"op":"blob","blob":%d,"data":"' % blob
        for start in range(0, max(len(view), 1), BLOB_CHUNK):
            self._write(head + base64.b64encode(view[start:start + BLOB_CHUNK]) + b'"}\n')

    def _write(self, data: bytes) -> None:
        """One line to the helper; requests and pings come from two threads."""
        assert self._proc is not None
        with self._write_lock:
            self._proc.write(data)

    def _ping(self) -> None:
        """Tell the helper every few seconds that its controller is alive, so that a
        helper whose link went silent stops what only we cared about and frees the lock."""
        while not self._closed.wait(beat_seconds(self.link_timeout)):
            if self.dead is not None or self._proc is None:
                return
            try:
                self._write(b'{"op":"ping"}\n')
            except Exception:  # noqa: BLE001 - the request path reports a dead link
                return

    def _cancel(self, rid: int, op: str, on_event: EventHandler | None = None, twice: bool = False) -> None:
        """Ctrl-C: stop the op running on the host before anything else is sent; what it says
        while it stops (a runner's restore) still goes to ``on_event``.

        A second Ctrl-C while waiting for that interrupts this too, at once; the op's answer
        is then never read, so nothing more is sent on this link (``interrupted_twice``).
        """
        if self._proc is None or self.dead is not None:
            return
        self.cancelled = True
        try:
            self._write(b'{"op":"cancel"}\n')
            if twice:  # the second Ctrl-C came with the first: the abort is asked, not waited for
                raise KeyboardInterrupt
            self._await(rid, op, on_event)
        except LinkLostError as e:
            self.dead = str(e)
        except (RemoteStepError, RemoteError):
            pass
        except KeyboardInterrupt:
            self.interrupted_twice = True
            self.dead = f"{self.transport.target.label}: interrupted twice during {op}"
            raise

    def _await(self, rid: int, op: str, on_event: EventHandler | None) -> Any:
        """Events to ``on_event`` until the answer; the bytes the answer names ``{"blob": n}``
        come ahead of it in blob lines and are put in its place (as ``bytes``)."""
        assert self._proc is not None
        label = self.transport.target.label
        blobs: dict[int, bytearray] = {}
        while True:
            line = self._proc.readline(self.link_timeout)
            if not line:
                _trace(self.transport.target.name, "<", line)
                raise LinkLostError(f"{label}: the connection closed during {op}{self._helper_said()}")
            try:
                raw = decode(line)
            except Malformed as e:
                _trace(self.transport.target.name, "<", line)
                raise self.malformed(op, e) from None
            if isinstance(raw, dict) and isinstance(raw.get("blob"), int) and not raw.get("done"):
                _trace(self.transport.target.name, "<", json.dumps(  # the piece's size, not its base64
                    {"id": raw.get("id"), "blob": raw["blob"], "bytes": len(str(raw.get("data", ""))) * 3 // 4}))
                if raw.get("id") == rid:
                    blobs.setdefault(raw["blob"], bytearray()).extend(self._blob_piece(op, raw))
                continue
            _trace(self.transport.target.name, "<", line)
            try:
                msg = Envelope.check(raw)
            except Malformed as e:
                raise self.malformed(op, e) from None
            if msg.id != rid:
                continue
            if not msg.done:
                if on_event is not None and msg.event != "tick":
                    on_event(msg.raw or {})
                continue
            if msg.ok:
                return _fill_blobs(msg.result, blobs) if blobs else msg.result
            error: dict[str, Any] = msg.error or {}
            raise RemoteStepError(op, error["type"], error["message"], error.get("details") or {})

    def _blob_piece(self, op: str, raw: dict[str, Any]) -> bytes:
        """One blob line's bytes; a piece that is not base64 makes the answer malformed."""
        try:
            return base64.b64decode(raw["data"], validate=True)
        except (KeyError, TypeError, ValueError) as e:
            raise self.malformed(op, Malformed(f"blob {raw['blob']} has a piece that is not base64 ({e})")) from None

    def malformed(self, op: str, why: Malformed) -> MalformedReplyError:
        """A bad answer to ``op``: this host's error, and the end of its link (the next
        line could be the answer to anything: the channel is not trusted again)."""
        message = f"{self.transport.target.label}: orch's helper gave a malformed answer to {op}: {why}"
        self.dead = message
        return MalformedReplyError(message)

    def _helper_said(self) -> str:
        """`` (why)`` from the helper's last words on stderr, on one line, or ``""``."""
        assert self._proc is not None
        reason = helper_reason(self._proc.stderr_text())
        return f" ({reason})" if reason else ""

    def close(self) -> None:
        """Say goodbye and let the channel close; never raises."""
        self._closed.set()
        with self._write_lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        if self.dead is not None:
            proc.kill()  # the link is gone: nothing to say goodbye to, nothing to wait for
            return
        try:
            proc.write(json.dumps({"id": 0, "op": "bye", "args": {}}).encode() + b"\n")
            proc.close_stdin()
            if proc.wait(5.0) is None:
                proc.kill()
        except Exception:  # noqa: BLE001 - closing is best effort
            proc.kill()
