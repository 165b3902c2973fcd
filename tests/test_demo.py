"""``orch demo``, the README's first command, runs end to end and cleans up."""

from __future__ import annotations

import os
import re
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
    # the demo's sandbox under tmp_path (TMPDIR): its servers are told from other runs' by path
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "demo"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, COLUMNS="120", NO_COLOR="1", TMPDIR=str(tmp_path)))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "demo finished as expected" in out
    assert "speculative decoding on" in out
    # act 1: the speculation patch, gated: the before/after table, probed on the running server
    assert "sandbox performance gate: pass (baseline: probed before the stop)" in out
    assert re.search(r"^  probe +figure +before +after +change +rule +verdict$", out, re.M)
    assert re.search(r"^  /generate@32 +tokens_per_s +\S+ ±\S+ +\S+ ±\S+ +\+\S+% +≥ 0.95 × before +pass$", out, re.M)
    assert "tokens/s at 32 concurrent requests: " in out
    assert "speculative_disable_batch_threshold = 8" in out
    # act 2: a change that halves the throughput, judged against act 1's record, rolled back
    assert re.search(r"sandbox performance gate: fail \(baseline: release \S+'s record\)", out)
    assert re.search(r"^  /generate@32 +tokens_per_s .* fail$", out, re.M)
    assert "regression: rolled_back" in out
    assert "performance gate failed: tokens_per_s.min_ratio on /generate@32" in out
    assert "the server runs again with threshold 8" in out
    # act 2: the pre-flight quotes the parser and the running server is never stopped
    assert "pre-flight refused the new command line" in out
    assert "unrecognized arguments: --speculative-disable-batch-treshold 8" in out
    assert "the running server was never stopped" in out
    # act 3: a server that crashes at start is rolled back by itself
    assert "RuntimeError: this patch breaks the server at start" in out
    assert "after the automatic rollback the server runs again with threshold 8" in out
    assert "sha256 equals the original: True" in out
    assert "history of sandbox" in out
    assert servers_of(tmp_path) == set(), "the demo left a server running"


def test_demo_keep_leaves_a_sandbox_a_person_can_go_on_with(tmp_path) -> None:
    """What docs/CLI.md tells a newcomer to do after `orch demo --keep`, done for real."""
    import json
    import shutil
    import urllib.request

    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env["COLUMNS"] = "80"
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "demo", "--keep"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=180, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # the demo's words agree with themselves: the misspelt flag had no file to restore and
    # never stopped the server; the bad patch's file was restored
    assert "rolled back: no file to restore; the running server (pid" in out
    assert "rolled back: files restored" in out
    kept = Path(re.search(r"sandbox kept in (\S+) ", out).group(1))
    try:
        assert (kept / "README.txt").is_file() and (kept / "inventory.yaml").is_file()
        port = int(re.search(r"port (\d+)", (kept / "start-server.sh").read_text()).group(1))

        def orch(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=kept,
                                  capture_output=True, text=True, timeout=180, env=env)

        started = subprocess.run(["./start-server.sh"], cwd=kept, capture_output=True, text=True,
                                 timeout=30)
        assert started.returncode == 0, started.stderr
        deadline = time.monotonic() + 60
        while orch("status", "--host", "sandbox").returncode != 0:
            assert time.monotonic() < deadline, "the stand-in started by hand never became healthy"
            time.sleep(0.2)
        deploy = orch("deploy", "--host", "sandbox", "speculative-disable")
        assert deploy.returncode == 0, deploy.stdout + deploy.stderr
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_server_info", timeout=5) as r:
            assert json.load(r)["speculative_disable_batch_threshold"] == 32
        assert orch("rollback", "--host", "sandbox").returncode == 0
        history = orch("history", "--host", "sandbox", "--json")
        rows = json.loads(history.stdout)["hosts"]["sandbox"]
        assert [r["kind"] for r in rows][-2:] == ["deploy", "rollback"]  # after the demo's own five
        assert len(rows) == 7
    finally:
        subprocess.run(["./stop-server.sh"], cwd=kept, capture_output=True, timeout=30)
        deadline = time.monotonic() + 30
        while servers_of(kept) and time.monotonic() < deadline:
            time.sleep(0.1)
        shutil.rmtree(kept, ignore_errors=True)
    assert servers_of(kept) == set(), "stop-server.sh left the kept sandbox's server running"


def servers_of(sandbox: Path) -> set[int]:
    """Stand-in servers whose environment points into ``sandbox`` (its PYTHONPATH)."""
    found = set()
    for pid in standin_processes():
        try:
            if str(sandbox).encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found.add(pid)
        except OSError:
            continue
    return found
