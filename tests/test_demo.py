"""``orch demo``, the README's first command, runs end to end and cleans up."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from tests.fixtures.forkrun import run_orch


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
    proc = run_orch(["demo"], cwd=tmp_path, timeout=180,
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


def test_demo_keep_leaves_a_sandbox_a_person_can_go_on_with_then_its_readme_walked_in_order(
        tmp_path) -> None:
    """One `orch demo --keep` (a run takes most of a minute), used twice in the order that needs:
    first what docs/CLI.md tells a newcomer to do after it, done for real (which needs the demo's
    own five history rows and nothing else), its server stopped by stop-server.sh; then every
    command of the kept sandbox's README.txt, run as the text says, in its order (issue 20)."""
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env["COLUMNS"] = "80"
    proc = run_orch(["demo", "--keep"], cwd=tmp_path, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # the demo's words agree with themselves: the misspelt flag had no file to restore and
    # never stopped the server; the bad patch's file was restored
    assert "rolled back: no file to restore; the running server (pid" in out
    assert "rolled back: files restored" in out
    kept = Path(re.search(r"sandbox kept in (\S+) ", out).group(1))
    server_args = kept / "sglang" / "python" / "sglang" / "srt" / "server_args.py"
    original = server_args.read_bytes() if server_args.is_file() else None
    try:
        go_on_as_the_docs_say(kept, env)
        stop_kept(kept)
        assert servers_of(kept) == set(), "stop-server.sh left the kept sandbox's server running"
        assert original is not None and server_args.read_bytes() == original
        walk_the_readme(kept, original, dict(os.environ, COLUMNS="120", NO_COLOR="1", TMPDIR=str(tmp_path)))
    finally:
        leave_kept(kept)
    assert servers_of(kept) == set(), "stop-server.sh left the kept sandbox's server running"


def go_on_as_the_docs_say(kept: Path, env: dict[str, str]) -> None:
    """What docs/CLI.md tells a newcomer to do after `orch demo --keep`: start the server by hand,
    deploy, roll back; history has the demo's own five releases and these two."""
    import json
    import urllib.request

    assert (kept / "README.txt").is_file() and (kept / "inventory.yaml").is_file()
    port = int(re.search(r"port (\d+)", (kept / "start-server.sh").read_text()).group(1))

    def orch(*args: str) -> subprocess.CompletedProcess[str]:
        return run_orch([*args], cwd=kept, timeout=180, env=env)

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


README_STEP = re.compile(r"^  (?P<command>\./\S+|orch .*?)(?:\s+#\s*(?P<comment>.*))?$")

def stop_kept(kept: Path) -> None:
    """Stop the kept sandbox's server with its own stop-server.sh, waiting for it to go."""
    subprocess.run(["./stop-server.sh"], cwd=kept, capture_output=True, timeout=30)
    deadline = time.monotonic() + 30
    while servers_of(kept) and time.monotonic() < deadline:
        time.sleep(0.1)


def leave_kept(kept: Path) -> None:
    """Stop the kept sandbox's server with its own stop-server.sh (waiting for it to go), then remove it."""
    stop_kept(kept)
    shutil.rmtree(kept, ignore_errors=True)


def readme_steps(readme: str) -> list[tuple[list[str], str]]:
    """The kept sandbox's README.txt commands, in order, with their comments."""
    import shlex

    return [(shlex.split(m["command"]), m["comment"] or "")
            for m in map(README_STEP.match, readme.splitlines()) if m]


def walk_the_readme(kept: Path, original: bytes, env: dict[str, str]) -> None:
    """Every command of the kept sandbox's README.txt, run as the text says, in its order;
    each exits as its comment says, and the outcomes the issue pins hold (issue 20).
    ``original``: server_args.py as the demo left it."""
    import json
    import urllib.request

    port = int(re.search(r"port (\d+)", (kept / "start-server.sh").read_text()).group(1))
    server_args = kept / "sglang" / "python" / "sglang" / "srt" / "server_args.py"

    def info() -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_server_info", timeout=5) as r:
            return dict(json.load(r))

    def applied() -> list[str]:
        return list(json.loads((kept / "state" / "state.json").read_text())["applied"])

    def listening() -> int | None:
        from orchestrator.demo import listening_pid

        return listening_pid(port)

    steps = readme_steps((kept / "README.txt").read_text())
    assert [" ".join(dict.fromkeys(argv[:2] + argv[-1:])) for argv, _ in steps] == [
        "./start-server.sh", "orch status sandbox", "orch deploy speculative-disable", "orch deploy gated.yaml",
        "orch status --probe", "orch deploy gated.yaml", "orch deploy speculative-disable",
        "orch deploy bad-flag.yaml", "orch deploy bad-flag.yaml", "orch deploy bad-patch.yaml", "orch rollback sandbox",
        "orch rollback sandbox", "orch history sandbox", "./stop-server.sh",
    ]
    promised: list[int] = []  # each orch step's exit code as its comment says first
    rollbacks = 0
    for argv, comment in steps:
        before = {"pid": listening(), "applied": applied()}
        run = (run_orch(argv[1:], cwd=kept, timeout=300, env=env) if argv[0] == "orch" else
               subprocess.run(argv, cwd=kept, capture_output=True, text=True, timeout=300, env=env))
        out = run.stdout + run.stderr
        said = [int(code) for code in re.findall(r"exit (\d)", comment)]  # the first, or another it names
        if argv[0] == "orch":
            assert said, f"the README's comment on `{' '.join(argv)}` says no exit code"
        if said:
            assert run.returncode in said, f"{' '.join(argv)}: {comment}\n{out}"
            promised.append(said[0])
        elif argv[0] != "./stop-server.sh":
            assert run.returncode == 0, out
        if argv[-1] == "gated.yaml" and "--var" not in argv:
            assert info()["speculative_disable_batch_threshold"] == 8
            gated = applied()[-1]
        if "slowdown=2" in argv:
            assert "performance gate failed" in out and applied() == before["applied"]
            assert info()["speculative_disable_batch_threshold"] == 8
        if argv[-1] == "speculative-disable" and "--check" not in argv:
            assert (f"declaration provided by release {gated} (playbook speculative-disable-gated)"
                    in out), out
            assert info()["speculative_disable_batch_threshold"] == 32
            assert server_args.read_text().count("speculative_disable_batch_threshold: ") == 1
        if argv[-1] == "bad-flag.yaml":
            assert "unrecognized arguments: --speculative-disable-batch-treshold" in out, out
            assert listening() == before["pid"] and before["pid"] is not None
            assert applied() == before["applied"]
        if argv[-1] == "bad-patch.yaml":
            assert "this patch breaks the server at start" in out
            assert info()["speculative_disable_batch_threshold"] == 32
        if argv[1:2] == ["rollback"]:
            rollbacks += 1
            if rollbacks == 1:
                assert applied() == [gated]
                assert info()["speculative_disable_batch_threshold"] == 8
            else:
                assert applied() == []
                assert info().get("speculative_disable_batch_threshold") is None
                assert "--speculative-disable-batch-threshold" not in " ".join(cmdline_of(listening()))
                assert server_args.read_bytes() == original
    # the comments themselves, pinned: what the issue asks each step to do
    assert promised == [0, 0, 0, 0, 1, 0, 2, 1, 1, 0, 0, 0], promised


def cmdline_of(pid: int | None) -> list[str]:
    if pid is None:
        return []
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]


def test_the_demo_stops_a_releases_guard_and_runner_by_the_pids_their_release_recorded(tmp_path: Path) -> None:
    """A demo (or test) cut short mid-release leaves a runner that would restart a server after
    the cleanup stopped it: the guard and the runner (its whole group) go first, by their records."""
    import json
    import signal

    from orchestrator.demo import alive, stop_release_processes
    from tests.fixtures.sandbox import wait_until

    release = tmp_path / "releases" / "r1"
    release.mkdir(parents=True)
    step_child = tmp_path / "child.pid"
    guard = subprocess.Popen(["sleep", "600"], start_new_session=True)
    runner = subprocess.Popen(["sh", "-c", f"sleep 600 & echo $! > {step_child}; wait"], start_new_session=True)
    wait_until(lambda: step_child.exists() and step_child.read_text().strip(), "the runner's step to start")
    child = int(step_child.read_text())
    (release / "watchdog.pid").write_text(f"{guard.pid}\n")
    (release / "runner.json").write_text(json.dumps({"pid": runner.pid, "guard": guard.pid}))
    try:
        stop_release_processes(tmp_path)
        assert guard.wait(timeout=30) == -signal.SIGKILL
        assert runner.wait(timeout=30) == -signal.SIGKILL
        wait_until(lambda: not alive(child), "what the runner's step ran to be killed with it")
    finally:
        for proc in (guard, runner):
            if proc.poll() is None:
                proc.kill()
