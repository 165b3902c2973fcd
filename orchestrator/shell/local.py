"""The transport for ``connection: local``: processes on this machine.

It behaves like the SSH transport as far as the helper can tell, so one
code path serves both:

- processes start in the user's home directory, as an SSH session does,
  and in a new session (``setsid``), so a Ctrl-C in orch's terminal reaches
  orch, not the helper (over SSH it never reaches the helper either);
- ``close`` closes our ends of the pipes and does not kill: the helper sees
  EOF on stdin, exactly as when an SSH connection closes.

``become`` adds ``sudo -n --`` unless orch already runs as root (then sudo
would change nothing, and it is often not installed in containers).
``sudo_when_root=True`` keeps the prefix anyway; tests use it to check the
prefix with a stand-in ``sudo`` on ``PATH``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Sequence

from orchestrator.core.target import HostTarget
from orchestrator.errors import LinkLostError, RemoteError
from orchestrator.shell.transport import (
    CommandResult,
    PumpedProcess,
    become_argv,
    check_argv,
    run_on,
)


class LocalProcess(PumpedProcess):
    """A child process with stdout lines and a stderr tail pumped by threads."""

    def __init__(self, popen: subprocess.Popen[bytes], label: str) -> None:
        super().__init__(label)
        self._popen = popen
        assert popen.stdin and popen.stdout and popen.stderr
        out, err = popen.stdout, popen.stderr
        # The pumps hold the file objects, not bare fd numbers: once this process
        # object is collected its pipes would be closed and their numbers reused
        # by the next process's pipes, which an old pump would then read from.
        self._start_pumps(lambda: os.read(out.fileno(), 65536), lambda: os.read(err.fileno(), 65536))

    @property
    def pid(self) -> int:
        return self._popen.pid

    def write(self, data: bytes) -> None:
        stdin = self._popen.stdin
        try:
            assert stdin is not None
            stdin.write(data)
            stdin.flush()
        except (OSError, ValueError) as exc:  # BrokenPipeError, or stdin already closed
            raise LinkLostError(
                f"cannot write to the process on {self.label}: its input is closed"
            ) from exc

    def close_stdin(self) -> None:
        stdin = self._popen.stdin
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(OSError):  # unflushed data and the reader gone
                stdin.close()

    def wait(self, timeout: float) -> int | None:
        """Exit code; negative ``-N`` when the process died of signal ``N``."""
        try:
            return self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self._popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._popen.kill()
        self.close_stdin()

    def release(self) -> None:
        """Close our pipe ends without killing: the process sees EOF on stdin."""
        self.close_stdin()


class LocalTransport:
    """``Transport`` for this machine; ``connect`` has nothing to open."""

    def __init__(self, target: HostTarget, *, sudo_when_root: bool = False) -> None:
        self.target = target
        self._sudo_when_root = sudo_when_root
        self._count = 0
        self._procs: list[LocalProcess] = []

    @property
    def exec_count(self) -> int:
        return self._count

    def connect(self) -> None:
        """Nothing to open; present so the pipeline treats both transports alike."""

    def _uses_sudo(self) -> bool:
        return self.target.become and (self._sudo_when_root or os.geteuid() != 0)

    def spawn(self, argv: Sequence[str]) -> LocalProcess:
        words = check_argv(argv)
        if self._uses_sudo():
            words = become_argv(words)
        label = self.target.label
        try:
            popen = subprocess.Popen(
                words,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=os.path.expanduser("~"),
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            if self._uses_sudo():
                raise RemoteError(
                    f"{label}: become is set but sudo is not installed (sudo: command not found)"
                ) from exc
            raise RemoteError(f"{label}: cannot run {words[0]!r}: command not found") from exc
        except OSError as exc:
            raise RemoteError(f"{label}: cannot run {words[0]!r}: {exc.strerror or exc}") from exc
        self._count += 1
        proc = LocalProcess(popen, label)
        self._procs = [p for p in self._procs if p.wait(0) is None]
        self._procs.append(proc)
        return proc

    def run(self, argv: Sequence[str], *, timeout: float, stdin: bytes = b"") -> CommandResult:
        return run_on(
            self.spawn,
            argv,
            label=self.target.label,
            become=self._uses_sudo(),
            timeout=timeout,
            stdin=stdin,
        )

    def close(self) -> None:
        for proc in self._procs:
            proc.release()
        self._procs.clear()

    def __enter__(self) -> LocalTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
