"""The safe deploy end to end: the real CLI, over real sshd, against the stand-in server."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from tests.fixtures.sandbox import Sandbox, cmdline, get_json, health_status, sha256, wait_until

BAD_FLAG = """\
name: bad-flag
vars: {port: 30000}
files: []
server:
  manager: process
  flags: {"--speculative-disable-batch-treshold": 8}
health:
  base_url: "http://127.0.0.1:{{ port }}"
  timeout: 5m
  interval: 0.2s
  checks: [{get: /health}]
"""

NEVER_HEALTHY = """\
name: never-healthy
vars: {port: 30000}
files: []
server:
  manager: process
  flags: {"--log-level": "debug"}
  env: {STANDIN_NEVER_READY: "1"}
health:
  base_url: "http://127.0.0.1:{{ port }}"
  timeout: 1s
  interval: 0.2s
  checks: [{get: /health}]
"""


def report(proc) -> dict:
    return json.loads(proc.stdout)


def test_deploy_changes_file_restarts_with_flag_and_is_idempotent(sandbox: Sandbox) -> None:
    hand_pid = sandbox.start_by_hand()
    before = sha256(sandbox.server_args)

    first = sandbox.orch("deploy", "--host", "gpu", "--json", "speculative-disable")
    assert first.returncode == 0, first.stdout + first.stderr
    rep = report(first)["hosts"]["gpu"]
    assert rep["outcome"] == "changed"
    assert rep["files"] == [str(sandbox.server_args)]
    assert sha256(sandbox.server_args) != before
    info = get_json(sandbox.port, "/get_server_info")
    assert info["speculative_disable_batch_threshold"] == 32
    new_pid = sandbox.server_pid()
    assert new_pid and new_pid != hand_pid
    argv = cmdline(new_pid)
    assert argv[-2:] == ["--speculative-disable-batch-threshold", "32"]
    assert argv[:-2] == sandbox.hand_argv  # the hand-started command line, plus the flag
    # the verification read is on screen: the inserted call with line numbers
    assert "sed -n" in first.stderr and "--speculative-disable-batch-threshold" in first.stderr

    hist = sandbox.orch("history", "--host", "gpu", "--json")
    rows = report(hist)["hosts"]["gpu"]
    assert [r["outcome"] for r in rows] == ["current"]
    assert rows[0]["flag_changes"] == ["--speculative-disable-batch-threshold: (absent) -> 32"]

    again = sandbox.orch("deploy", "--host", "gpu", "--json", "speculative-disable")
    assert again.returncode == 0, again.stderr
    assert report(again)["hosts"]["gpu"]["outcome"] == "unchanged"
    assert sandbox.server_pid() == new_pid  # no restart
    # a no-op is two round trips (the state with the lock, the read); the lock goes back
    # with the helper's goodbye, before orch exits
    assert report(again)["hosts"]["gpu"]["round_trips"] == 2
    assert not (sandbox.state_dir / "lock.json").exists()

    flags_only = sandbox.orch("deploy", "--host", "gpu", "--json", "--var", "threshold=64",
                              "speculative-disable")
    assert flags_only.returncode == 0, flags_only.stderr
    assert report(flags_only)["hosts"]["gpu"]["outcome"] == "changed"
    assert report(flags_only)["hosts"]["gpu"]["files"] == []
    assert sandbox.server_pid() != new_pid
    assert get_json(sandbox.port, "/get_server_info")["speculative_disable_batch_threshold"] == 64


def test_a_misspelt_flag_is_refused_by_the_preflight_and_the_server_never_stopped(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    (sandbox.root / "playbooks").mkdir(exist_ok=True)
    (sandbox.root / "playbooks" / "bad-flag.yaml").write_text(BAD_FLAG)
    ok = sandbox.orch("deploy", "--host", "gpu", "speculative-disable")
    assert ok.returncode == 0, ok.stderr
    good_pid = sandbox.server_pid()
    good_argv = cmdline(good_pid)
    file_sha = sha256(sandbox.server_args)

    bad = sandbox.orch("deploy", "--host", "gpu", "--json", "bad-flag")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    rep = report(bad)["hosts"]["gpu"]
    assert rep["outcome"] == "rolled_back"
    # the parser's own line, quoted; and the server was never touched: same process, never restarted
    assert "pre-flight refused the new command line" in rep["error"]
    assert "unrecognized arguments: --speculative-disable-batch-treshold 8" in rep["error"]
    assert "the running server was not touched" in rep["error"]
    ending = rep["ending"]  # the same, as fields: the host's pre-flight step refused it; the runner restored
    assert ending["kind"] == "restored" and ending["release"] == rep["release"] and ending["run"] == "deploy"
    assert (ending["step"], ending["failure"], ending["by"]) == ("preflight", "refused", "runner"), ending
    assert ending["reason"] == rep["error"]
    assert sandbox.server_pid() == good_pid
    assert sha256(sandbox.server_args) == file_sha
    assert health_status(sandbox.port) == 200
    assert cmdline(sandbox.server_pid()) == good_argv
    rows = report(sandbox.orch("history", "--host", "gpu", "--json"))["hosts"]["gpu"]
    assert [r["outcome"] for r in rows] == ["current", "rolled back"]


def test_server_that_never_becomes_healthy_is_rolled_back_after_timeout(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    hand_argv = list(sandbox.hand_argv)
    (sandbox.root / "never.yaml").write_text(NEVER_HEALTHY)
    proc = sandbox.orch("deploy", "--host", "gpu", "--json", str(sandbox.root / "never.yaml"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rep = report(proc)["hosts"]["gpu"]
    assert rep["outcome"] == "rolled_back"
    assert "not healthy after 1" in rep["error"]
    assert (rep["ending"]["kind"], rep["ending"]["step"], rep["ending"]["by"]) == ("restored", "health", "runner")
    assert health_status(sandbox.port) == 200
    assert cmdline(sandbox.server_pid()) == hand_argv


def test_rollback_restores_files_and_hand_started_command_line(sandbox: Sandbox) -> None:
    sandbox.start_by_hand("--log-level", "warning")
    original = sha256(sandbox.server_args)
    hand_argv = list(sandbox.hand_argv)
    assert sandbox.orch("deploy", "--host", "gpu", "speculative-disable").returncode == 0

    back = sandbox.orch("rollback", "--host", "gpu", "--json")
    assert back.returncode == 0, back.stdout + back.stderr
    assert sha256(sandbox.server_args) == original
    assert health_status(sandbox.port) == 200
    assert cmdline(sandbox.server_pid()) == hand_argv
    assert "speculative_disable_batch_threshold" not in get_json(sandbox.port, "/get_server_info")

    again = sandbox.orch("rollback", "--host", "gpu", "--json")
    assert again.returncode == 0, again.stderr
    assert "nothing to roll back" in again.stdout + again.stderr
    rows = report(sandbox.orch("history", "--host", "gpu", "--json"))["hosts"]["gpu"]
    assert [r["kind"] for r in rows] == ["deploy", "rollback"]
    assert rows[0]["outcome"].startswith("undone by")


def test_second_rollback_goes_further_back_never_toggles(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    original = sha256(sandbox.server_args)
    assert sandbox.orch("deploy", "--host", "gpu", "speculative-disable").returncode == 0
    after_first = sha256(sandbox.server_args)
    assert sandbox.orch("deploy", "--host", "gpu", "--var", "threshold=8", "speculative-disable").returncode == 0
    assert get_json(sandbox.port, "/get_server_info")["speculative_disable_batch_threshold"] == 8

    assert sandbox.orch("rollback", "--host", "gpu").returncode == 0
    assert get_json(sandbox.port, "/get_server_info")["speculative_disable_batch_threshold"] == 32
    assert sha256(sandbox.server_args) == after_first
    assert sandbox.orch("rollback", "--host", "gpu").returncode == 0
    assert sha256(sandbox.server_args) == original
    assert "speculative_disable_batch_threshold" not in get_json(sandbox.port, "/get_server_info")


def test_rollback_to_release(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    assert sandbox.orch("deploy", "--host", "gpu", "speculative-disable").returncode == 0
    first = report(sandbox.orch("history", "--host", "gpu", "--json"))["hosts"]["gpu"][0]["id"]
    for t in ("8", "16"):
        assert sandbox.orch("deploy", "--host", "gpu", "--var", f"threshold={t}", "speculative-disable").returncode == 0
    proc = sandbox.orch("rollback", "--host", "gpu", "--to", first[:18], "--json")  # a unique prefix (to the millisecond)
    assert proc.returncode == 0, proc.stderr
    assert get_json(sandbox.port, "/get_server_info")["speculative_disable_batch_threshold"] == 32
    rows = report(sandbox.orch("history", "--host", "gpu", "--json"))["hosts"]["gpu"]
    assert rows[0]["current"] and rows[0]["id"] == first


def test_status_reports_release_server_health_and_drift(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    assert sandbox.orch("deploy", "--host", "gpu", "speculative-disable").returncode == 0
    st = report(sandbox.orch("status", "--host", "gpu", "--json"))["hosts"]["gpu"]
    assert st["current"] and st["healthy"] is True and st["drift"] == []
    assert st["server"]["argv"][-1] == "32"
    with sandbox.server_args.open("a") as f:
        f.write("# a hand edit\n")
    st = report(sandbox.orch("status", "--host", "gpu", "--json"))["hosts"]["gpu"]
    assert st["drift"] == [str(sandbox.server_args)]


def test_second_deploy_while_locked_fails_fast_naming_the_holder(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    import subprocess
    import sys

    slow = sandbox.root / "slow.yaml"
    # the holder waits for a server that never turns healthy: it holds the lock until the
    # test has seen the refusal and interrupts it (Ctrl-C: it rolls back and lets go)
    slow.write_text(NEVER_HEALTHY.replace("timeout: 1s", "timeout: 5m"))
    env_cmd = [sys.executable, "-m", "orchestrator", "deploy", "--host", "gpu",
               "--ssh-config", str(sandbox.sshd.ssh_config), str(slow)]
    first = subprocess.Popen(env_cmd, cwd=sandbox.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        lock = sandbox.state_dir / "lock.json"
        deadline = time.time() + 30
        while not lock.exists() and time.time() < deadline:
            time.sleep(0.05)
        assert lock.exists()
        second = sandbox.orch("deploy", "--host", "gpu", "speculative-disable")
        assert second.returncode == 2, second.stderr
        out = second.stdout + second.stderr
        assert "locked by" in out and f"pid {first.pid}" in out
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(120)


def test_stale_lock_is_reported_and_break_lock_takes_it(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    sandbox.state_dir.mkdir(mode=0o700)
    (sandbox.state_dir / "lock.json").write_text(json.dumps({
        "user": "alice", "controller": "laptop-of-alice", "controller_id": "laptop-of-alice/abc",
        "pid": 4242, "started": time.time() - 3600, "heartbeat": time.time() - 600,
        "command": "deploy site.yaml", "token": "old", "agent_pid": 999999,
    }))
    # the heartbeat is the lock file's mtime: ten minutes without one
    os.utime(sandbox.state_dir / "lock.json", (time.time() - 600, time.time() - 600))
    refused = sandbox.orch("deploy", "--host", "gpu", "speculative-disable")
    assert refused.returncode == 2
    out = refused.stdout + refused.stderr
    assert "stale lock held by alice@laptop-of-alice" in out
    assert "--break-lock" in out
    taken = sandbox.orch("deploy", "--host", "gpu", "--break-lock", "speculative-disable")
    assert taken.returncode == 0, taken.stderr
    assert "breaking the stale lock" in taken.stdout + taken.stderr
    assert not (sandbox.state_dir / "lock.json").exists()


def test_controller_killed_at_health_is_in_progress_and_an_aborted_runner_restores(
        sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    original = sha256(sandbox.server_args)
    # A deploy whose controller dies (kill -9) mid-health-wait: the host's runner goes on alone.
    import subprocess
    import sys

    slow = sandbox.root / "slow.yaml"
    spec = (Path(__file__).resolve().parents[1] / "playbooks" / "speculative-disable.yaml").read_text()
    slow.write_text(spec.replace("server:\n  manager: process\n",
                                 "server:\n  manager: process\n  env: {STANDIN_NEVER_READY: \"1\"}\n"))
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "deploy", "--host", "gpu",
                             "--ssh-config", str(sandbox.sshd.ssh_config), str(slow)],
                            cwd=sandbox.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    journal = sandbox.state_dir / "journal.json"
    wait_until(lambda: journal.exists() and json.loads(journal.read_text()).get("step") == "restarting",
               timeout=120, what="the deploy to reach its restart")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    release = json.loads(journal.read_text())["release"]
    manifest = sandbox.state_dir / "releases" / release / "manifest.json"
    # its runner holds the lock and waits for health (15 minutes): a new deploy is refused
    refused = sandbox.orch("deploy", "--host", "gpu", "speculative-disable")
    assert refused.returncode == 2, refused.stderr
    assert f"release {release} in progress" in refused.stdout + refused.stderr
    # an abort (what `orch rollback --abort` sends): the runner stops waiting and restores by itself
    runner = json.loads((manifest.parent / "runner.json").read_text())
    os.kill(runner["pid"], signal.SIGTERM)
    wait_until(lambda: json.loads(manifest.read_text()).get("outcome") == "rolled_back", timeout=180,
               what="the runner to restore the release")
    record = json.loads((manifest.parent / "restored.json").read_text())
    assert record["by"] == "runner" and record["ok"] is True
    assert sha256(sandbox.server_args) == original
    assert health_status(sandbox.port) == 200
    status = sandbox.orch("status", "--host", "gpu")
    assert status.returncode == 0, status.stdout + status.stderr
    assert cmdline(sandbox.server_pid()) == sandbox.hand_argv
