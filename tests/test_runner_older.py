"""A host's runner and the orch from before it (issue 19 items 3, 5, 6).

orch 0.5.0 (commit a6a80ed, the code on main before the runner) is exported from this
repository once per test session and run as ``python -m orchestrator`` with its own tree on
``PYTHONPATH``: against a release this branch's runner holds, and as the deploy whose
watchdog this branch then finds waiting. Over real sshd behind the 20 ms proxy, with the
stand-in server; each release is held from outside by a ``before_stop`` hook that waits for
a file, and controllers, guards are ended with ``kill -9``.

Runner and guard both killed (unfinished, ``orch rollback`` finishes it) is
``tests/test_progress.py::test_a_deploy_whose_runner_and_guard_are_gone_is_unfinished``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.progress import clock
from tests.fixtures.sandbox import Sandbox, cmdline, sha256, wait_healthy, wait_until
from tests.test_faults import Link, read, story
from tests.test_faults import link as link  # noqa: F401 - the fixture, used by name
from tests.test_runner import outcome, start_held

REPO = Path(__file__).resolve().parents[1]
ORCH_0_5_0 = "a6a80ed"  # orch 0.5.0: its deploys arm a watchdog and are sequenced by the controller


@pytest.fixture(scope="session")
def orch_0_5_0(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """orch 0.5.0's tree, exported from this repository's history (once per test session)."""
    known = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{ORCH_0_5_0}^{{commit}}"],
                           capture_output=True)
    if known.returncode != 0:
        pytest.fail(f"commit {ORCH_0_5_0} (orch 0.5.0) is not in {REPO}: a full clone is needed", pytrace=False)
    tree = tmp_path_factory.mktemp("orch-0.5.0")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ORCH_0_5_0], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    assert '__version__ = "0.5.0"' in (tree / "orchestrator" / "__init__.py").read_text()
    return tree


def old_command(box: Sandbox, tree: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    """0.5.0's CLI as a user would run it from the sandbox: its own code, nothing of this branch."""
    env = {k: v for k, v in os.environ.items() if k != "ORCH_TEST_COVERAGE"}
    env.update(COLUMNS="200", NO_COLOR="1", PYTHONPATH=str(tree))
    return [sys.executable, "-m", "orchestrator", *args, "--ssh-config", str(box.sshd.ssh_config)], env


def old_orch(box: Sandbox, tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd, env = old_command(box, tree, *args)
    return subprocess.run(cmd, cwd=box.root, env=env, capture_output=True, text=True, timeout=240)


def host_json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        return dict(json.loads(proc.stdout)["hosts"]["gpu"])
    except (ValueError, KeyError):
        raise AssertionError(proc.stdout + proc.stderr) from None


def argv_now(box: Sandbox) -> list[str]:
    """The command line of the server that listens on the box's port now."""
    pid = box.server_pid()
    assert pid is not None, "no server listens on the port"
    return cmdline(pid)


def gone(pid: int) -> bool:
    """The process has ended (a zombie counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_a_runner_without_its_guard_is_in_progress_0_5_0_sees_it_held_and_it_finishes(
        link: Link, orch_0_5_0: Path) -> None:
    box = link.box
    proc, release, hold, original = start_held(box)
    proc.send_signal(signal.SIGKILL)  # the controller dies: the runner holds the release
    proc.wait()
    ran = read(release / "runner.json")
    assert read(release / "watchdog.json")["pid"] == ran["guard"]  # the guard is what the release armed
    os.kill(ran["guard"], signal.SIGKILL)
    wait_until(lambda: gone(ran["guard"]), "the guard's end")

    # item 3: in progress, "no guard"; the old server still serves (held before its stop): exit 0
    st = box.orch("status", "--host", "gpu", "--json")
    data = host_json(st)
    assert st.returncode == 0, st.stdout + st.stderr
    assert data["in_progress"]["state"] == "in_progress" and data["in_progress"]["release"] == release.name
    assert data["in_progress"]["guard"] is False
    assert f"release {release.name} in progress (step restarting" in data["state_words"]
    assert data["state_words"].endswith("; no guard)") and data["problems"] == []
    plain = box.orch("status", "--host", "gpu")
    assert "no guard" in plain.stdout and "orch rollback" not in plain.stdout, plain.stdout

    # orch 0.5.0 against the live runner: the lock is held, nothing is taken or changed
    lock = read(box.state_dir / "lock.json")
    assert lock["controller_id"].startswith("runner@") and lock["agent_pid"] == ran["pid"]
    committed, argv = sha256(box.server_args), argv_now(box)
    assert committed != original
    old = old_orch(box, orch_0_5_0, "status", "--host", "gpu", "--json")
    seen = host_json(old)
    assert old.returncode == 0, old.stdout + old.stderr
    assert seen["in_progress"]["state"] == "in_progress" and seen["in_progress"]["release"] == release.name
    assert f"release {release.name} in progress" in seen["state_words"]
    other = str(story(box, "other.yaml", threshold=8))
    for extra in ([], ["--break-lock"]):
        refused = old_orch(box, orch_0_5_0, "deploy", "--host", "gpu", "--json", *extra, other)
        assert refused.returncode == 2, (extra, refused.stdout + refused.stderr)
        assert f"release {release.name} in progress" in host_json(refused)["error"], extra
    assert sha256(box.server_args) == committed and argv_now(box) == argv
    after = read(box.state_dir / "lock.json")
    assert after["token"] == lock["token"] and after["controller_id"] == lock["controller_id"]
    assert outcome(release) == "in_progress" and not (release / "restored.json").exists()

    # the hold released: the runner finishes alone, without a guard and without a controller
    hold.write_text("")
    wait_until(lambda: outcome(release) == "deployed", timeout=180, what="the runner to confirm alone")
    assert sha256(box.server_args) == committed
    assert "--speculative-disable-batch-threshold" in argv_now(box)
    assert not (release / "restored.json").exists()
    assert read(box.state_dir / "state.json")["applied"][-1] == release.name
    wait_until(lambda: not (box.state_dir / "lock.json").exists(), what="the runner to give the lock back")
    done = box.orch("status", "--host", "gpu", "--json")
    assert done.returncode == 0 and host_json(done)["in_progress"] is None, done.stdout + done.stderr


def test_a_release_held_by_0_5_0_s_watchdog_is_in_progress_refused_and_rollback_abort_restores_it(
        link: Link, orch_0_5_0: Path) -> None:
    box = link.box
    box.start_by_hand()
    original = sha256(box.server_args)
    # its new server never answers health (5-minute timeout): the watchdog's deadline lies minutes away
    playbook = story(box, "old.yaml", env={"STANDIN_NEVER_READY": "1"}, timeout="5m")
    cmd, env = old_command(box, orch_0_5_0, "deploy", "--host", "gpu", "--json", str(playbook))
    proc = subprocess.Popen(cmd, cwd=box.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def new_server_waits_for_health() -> bool:
        pid = box.server_pid()
        return (box.journal().get("step") == "restarting" and pid is not None
                and "--speculative-disable-batch-threshold" in cmdline(pid))

    try:
        wait_until(new_server_waits_for_health, "0.5.0's new server, waiting for health")
    finally:
        proc.send_signal(signal.SIGKILL)  # its controller dies after the commit: its watchdog waits
        proc.communicate()
    rid = box.journal()["release"]
    release = box.state_dir / "releases" / rid
    assert not (release / "runner.json").exists()  # 0.5.0 has no runner: a watchdog alone
    watchdog = read(release / "watchdog.json")
    committed, argv = sha256(box.server_args), argv_now(box)
    assert committed != original
    # 0.5.0's helper stops its health wait once its controller is gone, and gives the lock back
    wait_until(lambda: not (box.state_dir / "lock.json").exists(), "0.5.0's helper to give the lock back")
    assert not gone(watchdog["pid"])

    # item 6: in progress, with the deadline 0.5.0 wrote; exit 3 only for the health now
    st = box.orch("status", "--host", "gpu", "--json")
    data = host_json(st)
    assert st.returncode == 3, st.stdout + st.stderr
    assert data["problems"] == ["server not healthy"], data["problems"]
    assert data["in_progress"]["release"] == rid and data["in_progress"]["restores_at"] == watchdog["fires_at"]
    words = data["state_words"]
    assert words.startswith(f"release {rid} in progress"), words
    assert f"the watchdog restores it at {clock(watchdog['fires_at'])} (host clock)" in words
    refused = box.orch("deploy", "--host", "gpu", "--json", str(story(box, "again.yaml", threshold=8)))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"release {rid} in progress" in host_json(refused)["error"]
    assert sha256(box.server_args) == committed and argv_now(box) == argv
    assert box.journal()["release"] == rid and box.journal()["finished"] is False

    # item 5: `orch rollback --abort` on a release only an older watchdog holds restores now
    aborted = box.orch("rollback", "--abort", "--host", "gpu", "--json")
    rep = host_json(aborted)
    assert aborted.returncode == 0, aborted.stdout + aborted.stderr
    assert rep["outcome"] == "rolled_back" and rep["release"] == rid, rep
    assert sha256(box.server_args) == original
    wait_healthy(box.port, 60)
    assert argv_now(box) == box.hand_argv
    assert read(release / "restored.json")["by"] == "rollback"
    assert box.journal()["finished"] is True
    # the old watchdog finds the release restored and leaves without restoring it again
    wait_until(lambda: gone(watchdog["pid"]), "0.5.0's watchdog to leave", 120)
    assert read(release / "restored.json")["by"] == "rollback"
    again = box.orch("status", "--host", "gpu", "--json")
    assert again.returncode == 0 and host_json(again)["in_progress"] is None, again.stdout + again.stderr
