"""Run a command as a child subreaper: ``python subreaper.py /usr/sbin/sshd -D ...``.

The fleet bench runs each host's sshd under this (``hostcpu.py``). A process
that leaves its session behind (orch's watchdog, a server a tool started
with ``setsid``) is re-parented here instead of to PID 1, and reaped here at
once, so its CPU lands in this process's children's times, which
``hostcpu.host_tree_cpu`` reads from ``/proc``: nothing a host does escapes
the count. SIGTERM and SIGINT are passed on to the command; this process
exits with the command's exit code as soon as the command has ended, and the
command gets SIGTERM if this process dies first. Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def main(argv: list[str]) -> int:
    if not argv or not os.path.isabs(argv[0]):
        print("usage: subreaper.py /absolute/command [args...]", file=sys.stderr)
        return 2
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    child = os.fork()
    if child == 0:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # the command must not outlive its reaper
        os.execv(argv[0], argv)

    def forward(signum: int, frame: object) -> None:
        os.kill(child, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)  # the command, or an orphan it left
        except ChildProcessError:
            return 1
        if pid == child:
            return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
