"""The fault suite: "never leaves a box broken", tried over a link with real latency.

Every test reaches the host's real sshd through a TCP proxy that adds 20 ms
each way (tests/fixtures/proxy.py): on plain loopback a race that a real link
always loses can look won. Faults are caused from outside orch — the proxy
severs or stalls the link, ``kill -9``, a small tmpfs, a second writer,
``chattr +i``, and stand-in servers that crash, hang, trickle, flap or die —
never through a hook inside orch. No test waits on a race: where a fault
must land inside a step, the stand-in holds that step open until the test
says so (``STANDIN_READY_FILE``), or a validator waits for a file.

After each fault the test checks the files by sha256, the server's argv and
health, the journal and the exit code.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.host import eventlog
from tests.fixtures.proxy import TcpProxy
from tests.fixtures.sandbox import (
    SHIPPED_SPEC,
    Sandbox,
    cmdline,
    get_json,
    sha256,
    wait_healthy,
    wait_until,
)


@dataclass
class Link:
    box: Sandbox
    proxy: TcpProxy


@pytest.fixture
def link(sandbox: Sandbox) -> Iterator[Link]:
    """The sandbox host, reached through a proxy that adds 20 ms each way."""
    proxy = TcpProxy(sandbox.sshd.port, delay=0.02)
    known = sandbox.root / "known_hosts_proxy"
    known.write_text(f"[127.0.0.1]:{proxy.port} {sandbox.sshd.host_key_pub}\n")
    sandbox.write_inventory(port=proxy.port, known_hosts=str(known))
    try:
        yield Link(sandbox, proxy)
    finally:
        proxy.close()


def story(box: Sandbox, name: str = "story.yaml", *, env: dict[str, str] | None = None, timeout: str = "20s",
          stable_for: str = "1s", validate: list[str] | None = None, threshold: int = 32) -> Path:
    """The story's playbook with short timeouts, and switches for the NEW server only."""
    spec = yaml.safe_load(SHIPPED_SPEC)
    spec["vars"]["threshold"] = threshold
    spec["server"].update(stop_timeout="5s", free_timeout="5s", preflight_timeout="15s", env=env or {})
    spec["health"].update(timeout=timeout, stable_for=stable_for, confirm_timeout="1s", interval="0.2s")
    if validate:
        spec["files"][0]["validate"] = ["python-syntax", *validate]
    path = box.root / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def release_dirs(box: Sandbox) -> list[Path]:
    return sorted((box.state_dir / "releases").iterdir()) if (box.state_dir / "releases").exists() else []


def read(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def finish(proc: subprocess.Popen[str]) -> tuple[int, dict[str, Any], str]:
    out, err = proc.communicate(timeout=240)
    report = json.loads(out)["hosts"]["gpu"] if out.strip() else {}
    return proc.returncode, report, out + err


def assert_as_before(box: Sandbox, original: str) -> None:
    """Files, server argv and health as before the deploy."""
    assert sha256(box.server_args) == original
    wait_healthy(box.port, 60)
    assert cmdline(box.server_pid()) == box.hand_argv


def hold_ready(box: Sandbox) -> Path:
    """A hand-started server that, when started again by a restore, waits for the test's go."""
    gate = box.root / "ready"
    gate.write_text("")
    box.start_by_hand(env={"STANDIN_READY_FILE": str(gate)})
    gate.unlink()  # it is up; an instance started later waits until the test creates the file again
    return gate


# ---------------------------------------------------------------- the watchdog and the link


def test_controller_killed_the_runner_restores_files_and_server_after_the_health_timeout(link: Link) -> None:
    """Defect 1, with a runner: the host restores the server too, from the plan on disk, by itself."""
    box = link.box
    box.start_by_hand()
    original = sha256(box.server_args)
    # the controller is killed as soon as the restart shows; the runner's health wait ends 3 s later
    proc = box.start_orch("deploy", "--host", "gpu", str(story(box, env={"STANDIN_NEVER_READY": "1"}, timeout="3s")))
    wait_until(lambda: box.journal().get("step") == "restarting", "the restart")
    proc.send_signal(signal.SIGKILL)  # the controller dies: the host's runner goes on
    proc.wait()
    wait_until(lambda: box.journal().get("finished"), "the runner's health timeout and restore", 240)
    assert box.journal()["step"] == "rolled_back"
    assert_as_before(box, original)
    record = read(release_dirs(box)[-1] / "restored.json")
    assert record["by"] == "runner" and record["ok"] is True
    assert record["server"]["action"] == "restarted"
    rows = json.loads(box.orch("history", "--host", "gpu", "--json").stdout)["hosts"]["gpu"]
    assert rows[-1]["outcome"] == "rolled back"


def test_link_severed_after_the_commit_exits_3_and_the_host_finishes_the_release(link: Link) -> None:
    box = link.box
    box.start_by_hand()
    original = sha256(box.server_args)
    # connecting again is tried for 6 connect timeouts (12 s), in vain; the runner's health
    # wait (4 s from the restart, which the link is cut at) ends in a restore meanwhile
    proc = box.start_orch("deploy", "--host", "gpu", "--json", "--connect-timeout", "2",
                          str(story(box, env={"STANDIN_NEVER_READY": "1"}, timeout="4s")))
    wait_until(lambda: box.journal().get("step") == "restarting", "the restart")
    link.proxy.refuse()  # severed, and no way back: orch tries to connect again, in vain
    code, rep, text = finish(proc)
    assert code == 3, text
    assert rep["outcome"] == "unreachable"
    assert "connecting again to follow it" in text
    assert "after the commit" in rep["error"] and "the host finishes it by itself" in rep["error"]
    assert "orch status --follow --host gpu" in rep["error"]
    # the runner's health wait ends; it restores; the link works again for new connections
    wait_until(lambda: box.journal().get("finished"), "the runner to restore", 240)
    assert box.journal()["step"] == "rolled_back"
    assert_as_before(box, original)
    assert read(release_dirs(box)[-1] / "restored.json")["by"] == "runner"
    box.write_inventory()  # a route back, straight to sshd
    status = box.orch("status", "--host", "gpu")
    assert status.returncode == 0, status.stdout + status.stderr


def test_link_severed_during_the_runners_restore_the_host_finishes_it(link: Link) -> None:
    """Defect 2: once the release is claimed for a restore, a dropped link changes nothing."""
    box = link.box
    gate = hold_ready(box)
    original = sha256(box.server_args)
    proc = box.start_orch("deploy", "--host", "gpu", "--json", "--connect-timeout", "2",
                          str(story(box, env={"STANDIN_CRASH_AT_START": "1"})))
    release = wait_until(lambda: next((d for d in release_dirs(box) if (d / "claim.json").exists()), None),
                         "the runner's claim")
    assert read(release / "claim.json")["by"] == "runner"
    link.proxy.refuse()  # the restore is under way on the host (the old server waits for `gate`); no way back
    code, rep, text = finish(proc)
    assert code == 3, text
    assert rep["outcome"] == "unreachable"
    assert "the host finishes it by itself" in rep["error"]
    gate.write_text("")  # let the restored server come up
    wait_until(lambda: box.journal().get("finished"), "the restore to finish on the host")
    assert box.journal()["step"] == "rolled_back"
    assert read(release / "restored.json")["by"] == "runner"
    assert_as_before(box, original)


def test_a_runner_that_dies_mid_restore_is_backed_up_by_its_guard_at_once(link: Link) -> None:
    """Defect 2, the other half: the runner's guard restores at once when it dies, any time."""
    box = link.box
    gate = hold_ready(box)
    original = sha256(box.server_args)
    proc = box.start_orch("deploy", "--host", "gpu", "--json",
                          str(story(box, env={"STANDIN_CRASH_AT_START": "1"})))
    release = wait_until(lambda: next((d for d in release_dirs(box) if (d / "claim.json").exists()), None),
                         "the runner's claim")
    # mid-restore: the previous server started again (its pidfile written), waiting for `gate`
    wait_until(lambda: len([w for w in eventlog.lines(str(release))
                            if str(w.get("msg", "")).startswith("started pid")]) >= 2, "the restore's start")
    runner = int(read(release / "runner.json")["pid"])
    assert int(read(box.state_dir / "lock.json")["agent_pid"]) == runner  # the lock is the runner's
    os.kill(runner, signal.SIGKILL)  # the host-side restorer dies mid-restore
    gate.write_text("")
    code, rep, text = finish(proc)
    assert code == 1, text
    assert rep["outcome"] == "rolled_back", rep
    assert box.journal()["finished"] is True
    assert read(release / "restored.json")["by"] == "guard"
    assert_as_before(box, original)
    rows = json.loads(box.orch("history", "--host", "gpu", "--json").stdout)["hosts"]["gpu"]
    assert rows[-1]["outcome"] == "rolled back (guard)"

def test_a_stalled_link_is_reported_and_nothing_waits_on_it(link: Link) -> None:
    """Defect 6: a silent link is noticed once; no later request (the lock's release) waits on it.
    The link's silence limit is set short (``ORCH_LINK_TIMEOUT``): the same fault, a fifth of the wait."""
    box = link.box
    box.start_by_hand()
    box.extra_env["ORCH_LINK_TIMEOUT"] = "6"
    proc = box.start_orch("deploy", "--host", "gpu", "--json", "--connect-timeout", "2",
                          str(story(box, env={"STANDIN_NEVER_READY": "1"}, timeout="5m")))
    wait_until(lambda: box.journal().get("step") == "restarting", "the restart")
    link.proxy.stall()  # new connections stall too: connecting again fails
    code, rep, text = finish(proc)
    assert code == 3, text
    assert rep["outcome"] == "unreachable" and "no data from" in rep["error"]
    assert re.search(r"no data from [^;]*? for 6 s", rep["error"]), rep["error"]  # the limit set, not 30 s
    # the reconnects' handshakes stalled too: said in orch's one line, never paramiko's traceback
    assert "Traceback" not in text and "Exception (client)" not in text, text
    # open_state, plan, stage+validate, backup+arm, the commit followed by the runner's events:
    # and not one more (hello's answer comes with the helper's first line)
    assert rep["round_trips"] == 5, (rep, text)
    assert "the host finishes it by itself" in rep["error"]
    # on the host the release goes on: the lock is its runner's, alive, whatever the link does
    lock = read(box.state_dir / "lock.json")
    release = box.state_dir / "releases" / box.journal()["release"]
    runner = read(release / "runner.json")
    assert lock["controller_id"].startswith("runner@") and lock["agent_pid"] == runner["pid"]
    assert Path(f"/proc/{runner['pid']}").exists()
    os.kill(runner["pid"], signal.SIGTERM)  # abort it (the health wait would take 5 minutes)
    wait_until(lambda: not (box.state_dir / "lock.json").exists(), "the runner to restore and give the lock back")
    assert read(release / "restored.json")["by"] == "runner"


def test_a_link_lost_before_anything_changed_is_exit_2(link: Link) -> None:
    """Defect 6: before the commit, a lost link is an unreachable host (2), not an unsafe one (3)."""
    box = link.box
    pid = box.start_by_hand()
    original = sha256(box.server_args)
    go = box.root / "go"
    wait = f"sh -c 'while [ ! -e {go} ]; do sleep 0.05; done'"
    proc = box.start_orch("deploy", "--host", "gpu", "--json", str(story(box, validate=[wait])))
    staged = wait_until(lambda: list(box.server_args.parent.glob(".server_args.orch-staged-*.py")), "the staged copy")
    link.proxy.sever()
    go.write_text("")
    code, rep, text = finish(proc)
    assert code == 2, text
    assert rep["outcome"] == "unreachable" and "nothing on the host was changed" in rep["error"]
    wait_until(lambda: not (box.state_dir / "lock.json").exists(), "the helper to release the lock", 60)
    assert not staged[0].exists()  # the helper removed what it had staged
    assert sha256(box.server_args) == original and box.server_pid() == pid
    assert release_dirs(box) == [] and box.journal() == {}


def watchdog_alive(release: Path) -> bool:
    """The release's own watchdog (by its pid and name: other tests' watchdogs run beside it)."""
    try:
        pid = int((release / "watchdog.pid").read_text())
        return Path(f"/proc/{pid}/comm").read_text().strip() == "orch-watchdog"
    except (OSError, ValueError):
        return False


class StderrLines:
    """A running orch's stderr, read as it comes, so a test can wait for a line."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.text = ""
        assert proc.stderr is not None
        self._stream = proc.stderr
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def all(self) -> str:
        """Everything, once the process has closed its stderr."""
        self._thread.join(240)
        return self.text

    def _read(self) -> None:
        for line in self._stream:
            self.text += line


def test_ctrl_c_between_the_backup_and_the_commit_closes_the_release_at_once(sandbox: Sandbox) -> None:
    """Issue 16.6: the release is closed at once (journal, watchdog, staged copy), exit 1, and it says so.

    Held from outside: a link slow enough (0.5 s each way) that the proxy is
    stalled while the backup's answer is on its way; the Ctrl-C is let through
    once orch has seen it (its "interrupted" line), then the link comes back.
    """
    box = sandbox
    proxy = TcpProxy(box.sshd.port, delay=0.5)
    known = box.root / "known_hosts_proxy"
    known.write_text(f"[127.0.0.1]:{proxy.port} {box.sshd.host_key_pub}\n")
    box.write_inventory(port=proxy.port, known_hosts=str(known))
    try:
        pid = box.start_by_hand()
        original = sha256(box.server_args)
        proc = box.start_orch("deploy", "--host", "gpu", "--json", str(story(box)))
        err = StderrLines(proc)
        wait_until(lambda: box.journal().get("step") == "backed_up", "the backup on the host")
        proxy.stall()  # the backup's answer (or the commit) is held on the link
        release = release_dirs(box)[-1]
        # the journal says backed_up a moment before the same batch arms the watchdog
        wait_until(lambda: watchdog_alive(release), "the watchdog armed", 60)
        staged = list(box.server_args.parent.glob(".server_args.orch-staged-*.py"))
        assert staged
        proc.send_signal(signal.SIGINT)
        wait_until(lambda: "Ctrl-C again" in err.text, "orch to see the Ctrl-C")
        proxy.unstall()
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.wait(240)
        text = out + err.all()
        rep = json.loads(out)["hosts"]["gpu"]
        assert proc.returncode == 1, text
        assert rep["outcome"] == "failed", text
        assert "nothing on the host was changed" in rep["error"] and f"release {release.name} closed" in text
        journal = box.journal()
        assert journal["release"] == release.name and journal["finished"] is True, journal
        wait_until(lambda: not watchdog_alive(release), "the watchdog to leave", 30)
        assert not any(p.exists() for p in staged)
        assert list(box.server_args.parent.glob(".server_args.orch-staged-*")) == []
        assert sha256(box.server_args) == original and box.server_pid() == pid
        assert read(release / "manifest.json")["outcome"] == "failed"
        # nothing blocks what comes next; it need not crawl over the 0.5 s link: straight to sshd
        box.write_inventory()
        status = box.orch("status", "--host", "gpu")
        assert status.returncode == 0, status.stdout + status.stderr
        again = box.orch("deploy", "--host", "gpu", str(story(box)))
        assert again.returncode == 0, again.stdout + again.stderr
    finally:
        proxy.close()


def test_a_full_state_dir_after_the_commit_still_restores_and_says_what_was_recorded(link: Link) -> None:
    """Defect 3: a full disk must neither disarm the restore nor yield a report of one that did not happen."""
    box = link.box
    box.state_dir.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(box.state_dir)], check=True)
    try:
        box.start_by_hand()
        original = sha256(box.server_args)
        gate = box.root / "go"
        proc = box.start_orch("deploy", "--host", "gpu", "--json", str(story(
            box, env={"STANDIN_READY_FILE": str(gate), "STANDIN_EXIT_AFTER_READY": "0.1"})))
        wait_until(lambda: box.journal().get("step") == "restarting", "the restart")
        subprocess.run(["dd", "if=/dev/zero", f"of={box.state_dir}/fill", "bs=64k"], capture_output=True)
        gate.write_text("")  # the new server comes up, then dies: the restore runs on a full disk
        code, rep, text = finish(proc)
        assert code == 1, text
        assert rep["outcome"] == "rolled_back" and "files restored" in text, text
        assert {f["action"] for f in rep["restore"]["files"]} == {"restored"}  # the host's record, as fields
        assert "could not record the restore" in text and "No space left" in text
        assert_as_before(box, original)
        assert box.journal()["step"] == "restarting"  # the truth on disk: it could not be written
        running = box.server_pid()
        (box.state_dir / "fill").unlink()
        back = box.orch("rollback", "--host", "gpu", "--json")
        assert back.returncode == 0, back.stdout + back.stderr
        assert box.server_pid() == running  # already as planned: no second restart
        assert box.journal()["finished"] is True
        assert_as_before(box, original)
    finally:
        box.stop_all()
        (box.state_dir / "fill").unlink(missing_ok=True)
        subprocess.run(["umount", "-l", str(box.state_dir)], check=False)


# ---------------------------------------------------------------- servers that fail


@pytest.mark.parametrize(("env", "why"), [
    ({"STANDIN_CRASH_AT_START": "1"}, "server exited during start (code 1)"),
    # dies 0.3 s after its first full health poll was answered (not after a delay from
    # readiness, which a busy machine's first poll can come later than)
    ({"STANDIN_EXIT_AFTER_ANSWERED": "0.3"}, " after it became healthy"),
    ({"STANDIN_FLAP": "0.4"}, "became unhealthy"),
    ({"STANDIN_HANG": "1"}, "not healthy after"),
], ids=["crashes", "dies-after-healthy", "flaps", "hangs"])
def test_a_failing_server_is_rolled_back(link: Link, env: dict[str, str], why: str) -> None:
    """Defect 5 among them: a server that dies right after its first healthy answer is not made current."""
    box = link.box
    box.start_by_hand()
    original = sha256(box.server_args)
    timeout = "2s" if "STANDIN_HANG" in env else "20s"
    proc = box.start_orch("deploy", "--host", "gpu", "--json", str(story(box, env=env, timeout=timeout,
                                                                         stable_for="3s")))
    code, rep, text = finish(proc)
    assert code == 1, text
    if why == " after it became healthy":
        # seen by its exit, or by its closed port when the exit takes longer than the
        # helper's grace to show (both say it died after it passed its checks)
        assert re.search(r"exited .* after it became healthy|became unhealthy .* after it first passed",
                         rep["error"]), rep
    else:
        assert why in rep["error"], rep
    assert rep["outcome"] == "rolled_back", rep
    assert_as_before(box, original)
    assert box.journal()["finished"] is True and box.journal()["step"] == "rolled_back"
    assert read(release_dirs(box)[-1] / "restored.json")["by"] == "runner"


def test_a_trickling_health_answer_is_bounded_by_the_health_timeout(link: Link) -> None:
    """Defect 4: each request is bounded by the overall deadline, so the runner (not its
    guard, whose backstop comes after) is the one that restores."""
    box = link.box
    box.start_by_hand()
    original = sha256(box.server_args)
    proc = box.start_orch("deploy", "--host", "gpu", "--json",
                          str(story(box, env={"STANDIN_TRICKLE": "0.5"}, timeout="3s")))
    code, rep, text = finish(proc)
    assert code == 1, text
    assert rep["outcome"] == "rolled_back" and "no complete answer" in rep["error"], rep
    assert_as_before(box, original)
    release = release_dirs(box)[-1]
    assert read(release / "restored.json")["by"] == "runner"
    assert read(release / "manifest.json")["restored_by"] == "runner"


def kill_the_restored_server(box: Sandbox) -> tuple[int, dict[str, Any], str]:
    """A deploy whose new server crashes at start; the previous server, restarted by the
    restore, killed before it is healthy (its ready file held): the run's (code, report, text)."""
    hand_pid = box.hand.pid if box.hand else 0
    proc = box.start_orch("deploy", "--host", "gpu", "--json", str(story(box, env={"STANDIN_CRASH_AT_START": "1"})))
    pidfile = box.state_dir / "server.pid"

    def restored_server() -> int | None:
        try:
            pid = int(pidfile.read_text())
            return pid if pid != hand_pid and cmdline(pid) == box.hand_argv else None
        except (OSError, ValueError):
            return None

    os.kill(wait_until(restored_server, "the restore to start the previous server"), signal.SIGKILL)
    return finish(proc)


def test_the_previous_server_killed_during_the_restore_is_exit_3_then_orch_rollback_finishes(link: Link) -> None:
    box = link.box
    gate = hold_ready(box)
    original = sha256(box.server_args)
    code, rep, text = kill_the_restored_server(box)
    assert code == 3, text
    assert rep["outcome"] == "rollback_failed"
    assert "files restored" in rep["error"] and "ROLLBACK FAILED" in rep["error"]
    assert "server exited during start" in rep["error"]
    ending = rep["ending"]  # the same, as fields: what failed, what the restore did, where the backups are
    assert ending["kind"] == "restore_failed" and ending["release"] == release_dirs(box)[-1].name, ending
    assert ending["release_dir"] == str(release_dirs(box)[-1]) and not ending["done"]["ok"]
    assert [f["action"] for f in ending["done"]["files"]] == ["restored"]
    assert "server exited during start" in ending["reason"] and ending["run"] == "deploy"
    assert sha256(box.server_args) == original
    assert box.journal()["finished"] is False and box.journal()["step"] == "restore_failed"
    gate.write_text("")
    back = box.orch("rollback", "--host", "gpu", "--json")
    assert back.returncode == 0, back.stdout + back.stderr
    assert_as_before(box, original)
    assert box.journal()["finished"] is True


def test_a_damaged_backup_is_named_and_the_file_left_as_it_is(link: Link) -> None:
    box = link.box
    box.start_by_hand()
    gate = box.root / "go"
    proc = box.start_orch("deploy", "--host", "gpu", "--json",
                          str(story(box, env={"STANDIN_READY_FILE": str(gate), "STANDIN_EXIT_AFTER_READY": "0.1"})))
    wait_until(lambda: box.journal().get("step") == "restarting", "the restart")
    patched = sha256(box.server_args)
    backup = release_dirs(box)[-1] / "files" / "0.before"
    backup.write_text("garbage\n")
    gate.write_text("")  # the new server comes up, then dies: the restore meets the damaged backup
    code, rep, text = finish(proc)
    assert code == 3, text
    assert rep["outcome"] == "rollback_failed"
    assert f"backup {backup} is damaged" in rep["error"] and "left as it is" in rep["error"]
    assert sha256(box.server_args) == patched
    assert box.journal()["finished"] is False


# ---------------------------------------------------------------- the target


def test_an_immutable_target_is_refused_with_nothing_changed(link: Link) -> None:
    """Defect 7: the commit fails, the untouched file is never rewritten, and nothing blocks the next deploy."""
    box = link.box
    pid = box.start_by_hand()
    original = sha256(box.server_args)
    subprocess.run(["chattr", "+i", str(box.server_args)], check=True)
    try:
        proc = box.orch("deploy", "--host", "gpu", "--json", str(story(box)))
    finally:
        subprocess.run(["chattr", "-i", str(box.server_args)], check=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    rep = json.loads(proc.stdout)["hosts"]["gpu"]
    assert rep["outcome"] == "failed" and "Operation not permitted" in rep["error"]
    assert sha256(box.server_args) == original and box.server_pid() == pid
    assert list(box.server_args.parent.glob(".*orch-staged*")) == []
    assert box.journal()["finished"] is True
    assert box.orch("deploy", "--host", "gpu", str(story(box))).returncode == 0


def test_a_target_directory_that_is_not_writable_is_refused(link: Link) -> None:
    box = link.box
    pid = box.start_by_hand()
    original = sha256(box.server_args)
    subprocess.run(["chattr", "+i", str(box.server_args.parent)], check=True)
    try:
        proc = box.orch("deploy", "--host", "gpu", "--json", str(story(box)))
    finally:
        subprocess.run(["chattr", "-i", str(box.server_args.parent)], check=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    rep = json.loads(proc.stdout)["hosts"]["gpu"]
    assert rep["outcome"] == "failed" and "cannot stage" in rep["error"]
    assert sha256(box.server_args) == original and box.server_pid() == pid
    assert release_dirs(box) == []


def test_a_hand_edit_during_validation_is_never_overwritten(link: Link) -> None:
    """Defect 8: the commit is a compare-and-swap on the content that was planned."""
    box = link.box
    pid = box.start_by_hand()
    go = box.root / "go"
    wait = f"sh -c 'while [ ! -e {go} ]; do sleep 0.05; done'"
    proc = box.start_orch("deploy", "--host", "gpu", "--json", str(story(box, validate=[wait])))
    wait_until(lambda: list(box.server_args.parent.glob(".server_args.orch-staged-*.py")), "the staged copy")
    with box.server_args.open("a") as f:
        f.write("# a colleague's note\n")
    edited = sha256(box.server_args)
    go.write_text("")
    code, rep, text = finish(proc)
    assert code == 2, text
    assert rep["outcome"] == "failed" and "changed on the host since it was planned" in rep["error"]
    assert sha256(box.server_args) == edited and box.server_pid() == pid
    assert box.journal()["finished"] is True
    assert read(release_dirs(box)[-1] / "manifest.json")["outcome"] == "failed"


def test_a_hand_edit_during_the_health_wait_is_kept_as_drift(link: Link) -> None:
    """Defect 8: the automatic rollback saves what a person wrote before it restores."""
    box = link.box
    box.start_by_hand()
    original = sha256(box.server_args)
    gate = box.root / "go"
    proc = box.start_orch("deploy", "--host", "gpu", "--json",
                          str(story(box, env={"STANDIN_READY_FILE": str(gate), "STANDIN_EXIT_AFTER_READY": "0.1"})))
    wait_until(lambda: box.journal().get("step") == "restarting", "the restart")
    with box.server_args.open("a") as f:
        f.write("# hot fix typed on the box\n")
    edited = box.server_args.read_bytes()
    gate.write_text("")  # now let the new server come up and die
    code, rep, text = finish(proc)
    assert code == 1, text
    assert rep["outcome"] == "rolled_back" and rep["drift"] == [str(box.server_args)]
    drift = release_dirs(box)[-1] / "files" / "0.drift"
    assert drift.read_bytes() == edited
    assert f"kept in {drift}" in text
    assert_as_before(box, original)
    assert box.journal()["drift"] == [str(box.server_args)]


def test_check_never_removes_what_a_colleague_makes_beside_the_target(link: Link) -> None:
    """Defect 9: clean-up removes the staged copy and what derives from its exact name, nothing else."""
    box = link.box
    box.start_by_hand()
    go = box.root / "go"
    wait = f"sh -c 'while [ ! -e {go} ]; do sleep 0.05; done'"
    proc = box.start_orch("deploy", "--check", "--host", "gpu", "--json", str(story(box, validate=[wait])))
    wait_until(lambda: list(box.server_args.parent.glob(".server_args.orch-staged-*.py")), "the staged copy")
    srt = box.server_args.parent
    (srt / "NOTES.md").write_text("mine\n")
    (srt / "checkpoints").mkdir()
    (srt / "checkpoints" / "step-100.pt").write_bytes(b"\0" * 1024)
    go.write_text("")
    code, rep, text = finish(proc)
    assert code == 0 and rep["outcome"] == "planned", text
    assert (srt / "NOTES.md").read_text() == "mine\n"
    assert (srt / "checkpoints" / "step-100.pt").stat().st_size == 1024
    assert list(srt.glob(".*orch-staged*")) == []


def test_a_symlinked_target_is_patched_through_the_link_and_stays_a_link(link: Link) -> None:
    """Defect 10."""
    box = link.box
    real = box.root / "shared" / "server_args.py"
    real.parent.mkdir()
    real.write_bytes(box.server_args.read_bytes())
    box.server_args.unlink()
    box.server_args.symlink_to(real)
    box.start_by_hand()
    original = sha256(real)
    assert box.orch("deploy", "--host", "gpu", str(story(box, stable_for="0.2s"))).returncode == 0
    assert box.server_args.is_symlink() and os.readlink(box.server_args) == str(real)
    assert sha256(real) != original
    assert get_json(box.port, "/get_server_info")["speculative_disable_batch_threshold"] == 32
    assert box.orch("rollback", "--host", "gpu").returncode == 0
    assert box.server_args.is_symlink() and os.readlink(box.server_args) == str(real)
    assert sha256(real) == original


def test_retention_never_prunes_a_release_that_rollback_needs(link: Link) -> None:
    """Defect 11: keep_releases is a soft cap; every release in effect is kept."""
    box = link.box
    box.start_by_hand()
    box.write_inventory(port=link.proxy.port, known_hosts=str(box.root / "known_hosts_proxy"), keep_releases=2)
    original = sha256(box.server_args)
    failing = story(box, "fail.yaml", env={"STANDIN_CRASH_AT_START": "1"}, threshold=9)
    assert box.orch("deploy", "--host", "gpu", str(failing)).returncode == 1  # a release never in effect
    for t in (1, 2, 3):  # what is kept is the point here, not how long a server must stay up
        proc = box.orch("deploy", "--host", "gpu", str(story(box, f"t{t}.yaml", threshold=t, stable_for="0.2s")))
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "none of them is pruned" in proc.stdout + proc.stderr
    kinds = [read(d / "manifest.json")["outcome"] for d in release_dirs(box)]
    assert kinds == ["deployed"] * 3  # the failed one was pruned; the three in effect were not
    for t in (2, 1):
        assert box.orch("rollback", "--host", "gpu").returncode == 0
        assert get_json(box.port, "/get_server_info")["speculative_disable_batch_threshold"] == t
    last = box.orch("rollback", "--host", "gpu")
    assert last.returncode == 0 and "the state before any release" in last.stdout + last.stderr
    assert_as_before(box, original)


def test_retention_never_prunes_a_release_holding_drift_until_it_is_restored_or_removed(link: Link) -> None:
    """Issue 16.4: drift is saved into a rolled back release, the first kind retention prunes;
    it stays until the person's content is back or the copy is removed, and history says so."""
    box = link.box
    box.start_by_hand()
    box.write_inventory(port=link.proxy.port, known_hosts=str(box.root / "known_hosts_proxy"), keep_releases=2)
    gate = box.root / "go"
    proc = box.start_orch("deploy", "--host", "gpu", "--json",
                          str(story(box, env={"STANDIN_READY_FILE": str(gate), "STANDIN_EXIT_AFTER_READY": "0.1"})))
    wait_until(lambda: box.journal().get("step") == "restarting", "the restart")
    with box.server_args.open("a") as f:
        f.write("# hot fix typed on the box\n")
    edited = box.server_args.read_bytes()
    gate.write_text("")
    code, rep, text = finish(proc)
    assert code == 1 and rep["drift"] == [str(box.server_args)], text
    failed = release_dirs(box)[-1]
    drift = failed / "files" / "0.drift"
    assert drift.read_bytes() == edited
    for t in (1, 2):  # two deploys later: the rolled back release is the first one retention would take
        done = box.orch("deploy", "--host", "gpu", str(story(box, f"t{t}.yaml", threshold=t, stable_for="0.2s")))
        assert done.returncode == 0, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert f"release {failed.name} is kept beyond keep_releases" in said and str(box.server_args) in said
    assert drift.read_bytes() == edited
    rows = json.loads(box.orch("history", "--host", "gpu", "--json").stdout)["hosts"]["gpu"]
    row = next(r for r in rows if r["id"] == failed.name)
    assert f"drift kept: {box.server_args}" in row["outcome"] and row["drift_kept"] == [str(box.server_args)]
    assert f"drift kept: {box.server_args}" in box.orch("history", "--host", "gpu").stdout
    drift.unlink()  # a person has looked at the edit and let it go: the release may go too
    done = box.orch("deploy", "--host", "gpu", str(story(box, "t3.yaml", threshold=3, stable_for="0.2s")))
    assert done.returncode == 0, done.stdout + done.stderr
    assert not failed.exists()
    assert [read(d / "manifest.json")["outcome"] for d in release_dirs(box)] == ["deployed"] * 3


CRASH_LOOP = """\
name: crash-loop
vars: {{port: {port}}}
files: []
server:
  manager: commands
  command: "{python} -m sglang.launch_server --model-path /models/standin --port {{{{ port }}}}"
  flags: {{"--speculative-accept-threshold-acc": 0.5}}
  start: "sh -c 'cd {box}; PYTHONPATH={tree} setsid {box}/supervise.sh {{{{ command }}}} > {box}/loop.log 2>&1 < /dev/null & echo $! > {box}/loop.pid'"
  stop: "sh -c 'kill -TERM -$(cat {box}/loop.pid); while kill -0 $(cat {box}/loop.pid) 2>/dev/null; do sleep 0.05; done'"
  pid: "cat {box}/loop.pid"
  stop_timeout: 5s
  free_timeout: 5s
health:
  base_url: "http://127.0.0.1:{{{{ port }}}}"
  timeout: 30s
  interval: 0.2s
  stable_for: 3s
  confirm_timeout: 1s
  checks: [{{get: /health}}]
"""

SUPERVISE = """\
#!/bin/sh
# A supervisor that restarts its server whenever it exits (systemd's Restart=always).
# The new command line (with --speculative-accept-threshold-acc) dies 0.3 s after it
# becomes healthy: a crash loop, which a single health check would call healthy.
case "$*" in *--speculative-accept-threshold-acc*) export STANDIN_EXIT_AFTER_READY=0.3;; esac
while :; do "$@"; sleep 0.3; done
"""


def test_a_crash_looping_server_under_a_supervisor_is_rolled_back(link: Link) -> None:
    box = link.box
    tree = box.sglang_root.parent
    (box.root / "supervise.sh").write_text(SUPERVISE)
    (box.root / "supervise.sh").chmod(0o755)
    pb = box.root / "loop.yaml"
    pb.write_text(CRASH_LOOP.format(port=box.port, python=sys.executable, box=box.root, tree=tree))
    # the server runs under its supervisor from the start, as the playbook's own start would run it
    subprocess.run(["sh", "-c", f"cd {box.root}; PYTHONPATH={tree} setsid {box.root}/supervise.sh "
                    f"{shlex.join(box_argv(box))} > {box.root}/loop.log 2>&1 < /dev/null & "
                    f"echo $! > {box.root}/loop.pid"], check=True)
    wait_healthy(box.port)
    loop = int((box.root / "loop.pid").read_text())
    proc = box.start_orch("deploy", "--host", "gpu", "--json", str(pb))
    code, rep, text = finish(proc)
    try:
        assert code == 1, text
        assert rep["outcome"] == "rolled_back" and "became unhealthy" in rep["error"], rep
        wait_healthy(box.port, 60)
        restored = int((box.root / "loop.pid").read_text())
        assert restored != loop  # the supervisor was restarted with the previous command line
        assert "--speculative-accept-threshold-acc" not in cmdline(box.server_pid())
        assert box.journal()["finished"] is True and box.journal()["step"] == "rolled_back"
    finally:
        subprocess.run(["sh", "-c", f"kill -TERM -$(cat {box.root}/loop.pid)"], check=False)


def box_argv(box: Sandbox) -> list[str]:
    return [sys.executable, "-m", "sglang.launch_server", "--model-path", "/models/standin", "--port", str(box.port)]
