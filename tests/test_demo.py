"""``orch demo``, the README's first command, runs end to end and cleans up."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def standin_processes() -> set[int]:
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"sglang.launch_server" in argv and any(b"orch-demo-" in a for a in argv + [b""]):
            found.add(int(name))
        elif b"sglang.launch_server" in argv:
            try:
                env = Path(f"/proc/{name}/environ").read_bytes()
            except OSError:
                continue
            if b"orch-demo-" in env:
                found.add(int(name))
    return found


def test_demo_runs_the_whole_story_and_stops_everything(tmp_path) -> None:
    before = standin_processes()
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "demo"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, COLUMNS="120", NO_COLOR="1"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "demo finished as expected" in out
    assert "speculative_disable_batch_threshold = 32" in out
    assert "unrecognized arguments: --speculative-disable-batch-treshold 8" in out
    assert "sha256 equals the original: True" in out
    assert "history of sandbox" in out
    time.sleep(0.5)
    assert standin_processes() - before == set(), "the demo left a server running"
