"""The helper's entry point: what the bootstrap runs (``agent_client.BOOTSTRAP``).

orch's helper on the host: a stdlib-only program the controller starts once
per host per run, and sends requests as JSON lines; each request does a
whole step for every file at once (read all targets, stage all, commit all,
poll health until ready), so round trips per deploy stay a small constant.
It is also the host-side watchdog (``backstop``).

Protocol: the controller writes one JSON request per line,
``{"id": 1, "op": "read", "args": {...}}``. The helper answers with zero or
more events ``{"id": 1, "event": "progress", ...}`` (a ``tick`` at least
every few seconds while an op runs, so the controller can tell a slow step
from a dead link), then one ``{"id": 1, "done": true, "ok": true,
"result": ...}`` or ``{"id": 1, "done": true, "ok": false, "error":
{"type": ..., "message": ...}}``. Bytes travel as blob lines (``wire``).
"""

import os
import signal
import sys

from .dispatch import serve
from .keep import keep_helper
from .session import Session


def main(archive=None, cache=None):
    """Serve this process's stdin/stdout. ``archive``: the helper as it was sent (to be kept
    under ``cache`` = (state dir, helper id)); None when it runs from a kept copy."""
    os.umask(0o022)
    # A dropped SSH session must not kill a restore half-way: the helper
    # notices the end of its input and leaves by itself.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    name_process("orch-helper")
    s = Session(sys.stdout.buffer, archive, cache)
    keep_helper(s)
    serve(s, sys.stdin.buffer)


def name_process(name):
    """What ``ps -o comm`` and ``top`` show for this process (its argv stays the helper's)."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name)
    except OSError:
        pass
