"""How orch reaches a host: open one connection, spawn processes on it.

orch talks to each host through ONE long-lived helper process that it
spawns over the host's transport and drives with JSON lines on its
stdin/stdout. So a transport only has to do two things well: keep one
connection for the whole run, and start processes with binary pipes whose
reads honour a timeout (a silent link must be noticed, not waited on).

Everything runs as an argv list. The SSH side joins it with
``shlex.join`` (every word quoted) for the remote login shell, so no word
can add shell syntax; the local side hands the list to ``exec`` directly.
This assumes a Bourne-compatible login shell on the host (sh, bash, zsh,
dash), which is what ``exec`` over SSH gets on every server we target.

``become=True`` prefixes ``sudo -n --``: ``-n`` makes sudo fail at once
rather than wait for a password prompt nobody can answer, and ``--`` keeps
a command that starts with ``-`` from being read as a sudo option.

This module holds the shared types and plumbing; ``shell.ssh`` (Fabric and
Paramiko, imported only when a host needs SSH, to keep ``orch`` start-up
light) and ``shell.local`` hold the two implementations.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from orchestrator import heap
from orchestrator.core.target import HostTarget
from orchestrator.errors import LinkLostError, RemoteError

#: What ``become`` puts in front of a command.
SUDO_PREFIX: tuple[str, ...] = ("sudo", "-n", "--")

#: How much of a process's stderr is kept (the tail; older bytes are dropped).
STDERR_LIMIT = 64 * 1024
WAKE_SECONDS = 0.2  # the longest a reader sleeps between looks (a Ctrl-C raised in its thread lands then)


@dataclass(frozen=True)
class CommandResult:
    """Outcome of a one-off command. A non-zero ``rc`` is data, not an error."""

    rc: int
    stdout: bytes
    stderr: bytes


@runtime_checkable
class RemoteProcess(Protocol):
    """A process on the host with binary pipes, as the helper client needs it."""

    def write(self, data: bytes) -> None:
        """Send ``data`` to the process's stdin; ``LinkLostError`` if that is impossible."""
        ...

    def close_stdin(self) -> None:
        """Send EOF on stdin (the helper takes it as "controller gone")."""
        ...

    def readline(self, timeout: float) -> bytes:
        """One stdout line including ``b"\\n"``; ``b""`` at EOF.

        Raises ``LinkLostError`` when nothing arrives within ``timeout``
        seconds, or when the connection dropped before the process ended.
        """
        ...

    def stderr_text(self) -> str:
        """What the process wrote to stderr so far (last 64 KiB), without blocking."""
        ...

    def wait(self, timeout: float) -> int | None:
        """Exit code, or ``None`` if still running after ``timeout`` seconds."""
        ...

    def kill(self) -> None:
        """Best effort: end the process (local) or close its channel (SSH)."""
        ...


@runtime_checkable
class Transport(Protocol):
    """One connection to one host for the whole run."""

    target: HostTarget

    def connect(self) -> None:
        """Open the connection if it is not open; one-line errors naming the host."""
        ...

    def spawn(self, argv: Sequence[str]) -> RemoteProcess:
        """Start ``argv`` on the host (through ``sudo -n`` when ``become``)."""
        ...

    def run(self, argv: Sequence[str], *, timeout: float, stdin: bytes = b"") -> CommandResult:
        """Run a one-off command to completion; ``RemoteError`` on timeout."""
        ...

    def close(self) -> None:
        """Close the connection (processes still running see EOF on stdin)."""
        ...

    @property
    def exec_count(self) -> int:
        """Commands (SSH channels) opened so far: what benchmarks count as round trips."""
        ...


def open_transport(
    target: HostTarget,
    *,
    accept_new_host_key: bool = False,
    ssh_config_path: str | None = None,
    connect_timeout: float = 10.0,
    keepalive: float = 10.0,
) -> Transport:
    """Build the transport ``target`` asks for. Nothing is contacted until ``connect``.

    ``ssh_config_path`` replaces ``~/.ssh/config`` and ``/etc/ssh/ssh_config``
    (as ``ssh -F`` does); tests pass their own so the machine's is not read.
    """
    if target.connection == "local":
        from orchestrator.shell.local import LocalTransport

        heap.loaded()
        return LocalTransport(target)
    from orchestrator.shell.ssh import SSHTransport

    heap.loaded()  # Fabric and Paramiko were the last heavy imports: ``orchestrator.heap``
    return SSHTransport(
        target,
        accept_new_host_key=accept_new_host_key,
        ssh_config_path=ssh_config_path,
        connect_timeout=connect_timeout,
        keepalive=keepalive,
    )


def become_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` run through non-interactive sudo."""
    return [*SUDO_PREFIX, *argv]


def check_argv(argv: Sequence[str]) -> list[str]:
    """Refuse argv lists that cannot be passed through exec faithfully."""
    words = list(argv)
    if not words:
        raise ValueError("empty argv")
    for word in words:
        if not isinstance(word, str):
            raise TypeError(f"argv words must be str, got {type(word).__name__}: {word!r}")
        if "\x00" in word:
            raise ValueError(f"argv word contains a NUL byte: {word!r}")
    return words


def explain_become_failure(rc: int | None, stderr: str | bytes) -> str | None:
    """Why a ``sudo -n`` prefixed command failed before it ran, or ``None``.

    ``run`` applies this itself; the helper client can call it when the
    helper process ends at once, to say "sudo needs a password" instead of
    showing a bare exit code.
    """
    text = stderr.decode("utf-8", "replace") if isinstance(stderr, bytes) else stderr
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if rc == 127 and any("sudo" in line and "not found" in line for line in lines):
        return "become is set but sudo is not installed (sudo: command not found)"
    sudo_lines = [line for line in lines if line.startswith("sudo:")]
    if rc == 1 and sudo_lines:
        first = sudo_lines[0]
        if "password is required" in first:
            return (
                "become is set but sudo -n needs a password; allow passwordless sudo "
                "for this user or set become: false"
            )
        return f"become failed: {first}"
    return None


def one_line(text: str) -> str:
    """Collapse whitespace so a message stays on one line."""
    return " ".join(text.split())


class LineBuffer:
    """Bytes from a pump thread, handed out as lines with a strict timeout.

    A reader thread owns the blocking reads, so a caller's timeout is exact
    whatever the stream does, and the producer never stalls on us. The
    timeout is on silence, not on the line: a long line whose bytes keep
    coming over a slow link is a live link.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._eof = False
        self._cond = threading.Condition()
        self._fed_at = time.monotonic()  # when bytes last arrived

    def feed(self, data: bytes) -> None:
        with self._cond:
            self._buf += data
            self._fed_at = time.monotonic()
            self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def readline(self, timeout: float | None) -> bytes | None:
        """A line (or the last partial line, then ``b""``) at EOF; ``None`` when no
        byte at all arrived for ``timeout`` seconds."""
        started = time.monotonic()
        searched = 0  # the buffer before this has no newline: each byte is searched once
        with self._cond:
            while True:
                end = self._buf.find(b"\n", searched)
                if end >= 0:
                    line = bytes(self._buf[: end + 1])
                    del self._buf[: end + 1]
                    return line
                searched = len(self._buf)
                if self._eof:
                    line = bytes(self._buf)
                    self._buf.clear()
                    return line
                deadline = None if timeout is None else max(started, self._fed_at) + max(timeout, 0.0)
                if not self._wait(deadline):
                    return None

    def read_to_eof(self, timeout: float | None) -> bytes | None:
        """Everything up to EOF, or ``None`` if EOF does not come in time."""
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        with self._cond:
            while not self._eof:
                if not self._wait(deadline):
                    return None
            data = bytes(self._buf)
            self._buf.clear()
            return data

    def _wait(self, deadline: float | None) -> bool:
        """Caller holds the lock; False once the deadline has passed. Each wait is at most
        ``WAKE_SECONDS``: a Ctrl-C meant for a fleet's worker thread is raised in it
        (``pipeline.fleet.raise_in_thread``) and lands only when it runs Python again, not
        while it sleeps in the lock; on a silent link it would wait for the next byte or the
        link's whole timeout (30 s) instead of stopping at once."""
        if deadline is None:
            self._cond.wait(WAKE_SECONDS)
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        self._cond.wait(min(remaining, WAKE_SECONDS))
        return True


class TailBuffer:
    """Keeps the last ``limit`` bytes of a stream (stderr can be chatty)."""

    def __init__(self, limit: int = STDERR_LIMIT) -> None:
        self._limit = limit
        self._buf = bytearray()
        self._lock = threading.Lock()

    def feed(self, data: bytes) -> None:
        with self._lock:
            self._buf += data
            if len(self._buf) > 2 * self._limit:  # trim in batches, not per chunk
                del self._buf[: -self._limit]

    def finish(self) -> None:
        pass

    def data(self) -> bytes:
        with self._lock:
            return bytes(self._buf[-self._limit :])

    def text(self) -> str:
        return self.data().decode("utf-8", "replace")


class _Sink(Protocol):
    def feed(self, data: bytes) -> None: ...
    def finish(self) -> None: ...


def start_pump(read: Callable[[], bytes], sink: _Sink, name: str) -> threading.Thread:
    """Copy ``read()`` chunks into ``sink`` on a daemon thread until ``b""`` or an error."""

    def pump() -> None:
        try:
            while True:
                try:
                    data = read()
                except (OSError, EOFError, ValueError):
                    return
                if not data:
                    return
                sink.feed(data)
        finally:
            sink.finish()

    thread = threading.Thread(target=pump, name=name, daemon=True)
    thread.start()
    return thread


class PumpedProcess:
    """Shared half of both process kinds: stdout lines and stderr tail via pumps.

    Subclasses start the pumps (``_start_pumps``) and implement ``write``,
    ``close_stdin``, ``wait``, ``kill`` and ``_link_lost``.
    """

    label: str

    def __init__(self, label: str) -> None:
        self.label = label
        self._out = LineBuffer()
        self._err = TailBuffer()
        self._pumps: list[threading.Thread] = []

    def _start_pumps(self, read_out: Callable[[], bytes], read_err: Callable[[], bytes]) -> None:
        self._pumps = [
            start_pump(read_out, self._out, f"orch-stdout-{self.label}"),
            start_pump(read_err, self._err, f"orch-stderr-{self.label}"),
        ]

    def _link_lost(self) -> str | None:
        """A reason when EOF on stdout means "connection dropped", not "process ended"."""
        return None

    def readline(self, timeout: float) -> bytes:
        line = self._out.readline(timeout)
        if line is None:
            raise LinkLostError(f"no data from {self.label} for {timeout:g} s")
        if not line:
            reason = self._link_lost()
            if reason:
                raise LinkLostError(reason)
        return line

    def read_to_eof(self, timeout: float) -> bytes | None:
        """All remaining stdout, or ``None`` if the process keeps it open past ``timeout``."""
        return self._out.read_to_eof(timeout)

    def stderr_text(self) -> str:
        return self._err.text()

    def stderr_bytes(self, settle: float = 0.0) -> bytes:
        """The stderr tail, after giving the stderr pump ``settle`` s to reach EOF."""
        if settle > 0 and len(self._pumps) > 1:
            self._pumps[1].join(settle)
        return self._err.data()

    # Implemented by subclasses; declared for run_on().
    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def close_stdin(self) -> None:
        raise NotImplementedError

    def wait(self, timeout: float) -> int | None:
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError


def run_on(
    spawn: Callable[[Sequence[str]], PumpedProcess],
    argv: Sequence[str],
    *,
    label: str,
    become: bool,
    timeout: float,
    stdin: bytes,
) -> CommandResult:
    """``Transport.run`` for both transports: spawn, feed stdin, collect, wait.

    stdin is written on its own thread so a command that does not read it
    (or reads it only after writing lots) cannot stall us past ``timeout``.
    """
    deadline = time.monotonic() + timeout
    proc = spawn(argv)

    def feed() -> None:
        # A command may exit without reading its stdin; that is not an error,
        # and a dropped link shows up on the stdout side anyway.
        try:
            if stdin:
                proc.write(stdin)
            proc.close_stdin()
        except Exception:
            pass

    feeder = threading.Thread(target=feed, name=f"orch-stdin-{label}", daemon=True)
    feeder.start()
    shown = one_line(" ".join(argv))
    if len(shown) > 80:
        shown = shown[:77] + "..."
    out = proc.read_to_eof(deadline - time.monotonic())
    rc = None if out is None else proc.wait(max(deadline - time.monotonic(), 1.0))
    if rc is None or out is None:
        proc.kill()
        raise RemoteError(f"{label}: `{shown}` did not finish within {timeout:g} s")
    stderr = proc.stderr_bytes(settle=max(deadline - time.monotonic(), 1.0))
    if become:
        reason = explain_become_failure(rc, stderr)
        if reason:
            raise RemoteError(f"{label}: {reason}")
    return CommandResult(rc=rc, stdout=out, stderr=stderr)
