"""The helper's restore machine and watchdog, driven through the helper protocol.

Every test starts the real helper over the local transport (as ``tests/test_agent.py``
does), makes a release on disk with the helper's own ``release_create``, and then
asks for what a deploy, a rollback or the watchdog asks for: ``restore_release``,
``confirm_release``, ``release_arm``. Outcomes are read from the files on disk and the
records the helper writes (``restored.json``, the manifest, the journal).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.shell.agent_client import Agent, RemoteStepError
from tests.fixtures.sandbox import wait_until


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture
def agent(local_agent: Agent) -> Agent:
    return local_agent


class Release:
    """A release made by the helper: files changed from ``before`` to ``after`` on disk."""

    def __init__(self, agent: Agent, state: Path, rid: str = "r1", kind: str = "deploy") -> None:
        self.agent, self.state, self.rid, self.kind = agent, state, rid, kind
        self.dir = state / "releases" / rid
        self.files: list[dict[str, Any]] = []
        self.links: list[dict[str, Any]] = []

    def change(self, path: Path, before: bytes | None, after: bytes) -> None:
        """``path`` held ``before`` (None: did not exist) and the release wrote ``after``."""
        self.files.append({"path": path, "before": before, "after": after})

    def create(self, *, server: dict[str, Any] | None = None, budget: float | None = 300.0,
               **plan: Any) -> Path:
        """``release_create`` with the restore plan that puts every ``before`` back, then the
        live files written as the release left them; the journal names the release."""
        self.agent.call("state_init", state_dir=str(self.state))
        wire, planned = [], []
        for n, f in enumerate(self.files):
            wire.append({"path": str(f["path"]), "n": n, "after": b64(f["after"]),
                         "before": None if f["before"] is None else b64(f["before"])})
            planned.append({"path": str(f["path"]), "n": n, "expect": sha(f["after"]), "mode": 0o644,
                            "source": None if f["before"] is None else str(self.dir / "files" / f"{n}.before"),
                            "sha256": None if f["before"] is None else sha(f["before"])})
        spec = {"version": 3, "release": self.rid, "kind": self.kind, "budget": budget,
                "plan": {"files": planned, "links": self.links, "server": server, **plan}}
        made = self.agent.call("release_create", state_dir=str(self.state), release_id=self.rid,
                               manifest={"id": self.rid, "kind": self.kind, "outcome": "deploying"},
                               files=wire, restore=spec)
        assert made["root"] == str(self.dir) and made["seq"] >= 1
        for f in self.files:
            Path(f["path"]).write_bytes(f["after"])
        self.agent.call("put_json", path=str(self.state / "journal.json"),
                        value={"release": self.rid, "step": "committed", "finished": False})
        return self.dir

    def committed(self) -> None:
        self.agent.call("mark", path=str(self.dir / "commit.started"))

    def manifest(self) -> dict[str, Any]:
        return json.loads((self.dir / "manifest.json").read_text())

    def journal(self) -> dict[str, Any]:
        return json.loads((self.state / "journal.json").read_text())


def test_a_restore_puts_files_back_removes_new_ones_and_keeps_a_hand_edit_as_drift(
        agent: Agent, tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_bytes(b"a = 1\n")
    c.write_bytes(b"c = 1\n")
    release = Release(agent, tmp_path / "state")
    release.change(a, b"a = 1\n", b"a = 2\n")
    release.change(b, None, b"b = 2\n")
    release.change(c, b"c = 1\n", b"c = 2\n")
    release.create()
    release.committed()
    c.write_bytes(b"c = 'a colleague wrote this'\n")  # after the commit, before the restore

    record = agent.call("restore_release", release_dir=str(release.dir), by="controller",
                        reason="health failed", within=60.0)

    assert record["ok"] and record["completed"] and record["committed"]
    assert [f["action"] for f in record["files"]] == ["restored", "removed", "restored"]
    assert a.read_bytes() == b"a = 1\n" and not b.exists() and c.read_bytes() == b"c = 1\n"
    drift = record["files"][2]["drift"]
    assert Path(drift).read_bytes() == b"c = 'a colleague wrote this'\n"
    manifest = release.manifest()
    assert (manifest["outcome"], manifest["restored_by"], manifest["error"]) == (
        "rolled_back", "controller", "health failed")
    assert manifest["drift"] == [str(c)]
    journal = release.journal()
    assert (journal["step"], journal["finished"], journal["drift"]) == ("rolled_back", True, [str(c)])
    claim = json.loads((release.dir / "claim.json").read_text())
    assert claim["by"] == "controller" and claim["until"] > claim["time"]

    again = agent.call("restore_release", release_dir=str(release.dir), by="watchdog")
    assert again["already"] and again["by"] == "controller"


def test_a_release_holding_a_person_s_only_copy_is_never_pruned_until_it_is_back(
        agent: Agent, tmp_path: Path) -> None:
    target = tmp_path / "conf.py"
    target.write_bytes(b"old\n")
    release = Release(agent, tmp_path / "state")
    release.change(target, b"old\n", b"new\n")
    release.create()
    release.committed()
    target.write_bytes(b"hand edit\n")
    agent.call("restore_release", release_dir=str(release.dir), by="rollback")

    state = agent.call("state_read", state_dir=str(release.state))
    [listed] = state["releases"]
    assert listed["drift_kept"] == [{"path": str(target), "copy": str(release.dir / "files" / "0.drift")}]
    assert agent.call("release_prune", state_dir=str(release.state), remove=["r1"]) == []
    assert release.dir.is_dir()

    target.write_bytes(b"hand edit\n")  # the person puts their content back
    assert agent.call("release_prune", state_dir=str(release.state), remove=["r1", "../x"]) == ["r1"]
    assert not release.dir.exists()


def test_a_restore_before_the_commit_leaves_what_orch_never_wrote(agent: Agent, tmp_path: Path) -> None:
    """No ``commit.started``: a file whose content is neither the wanted nor orch's is
    somebody else's change, left as it is; one already as wanted is never rewritten."""
    mine, theirs = tmp_path / "mine.py", tmp_path / "theirs.py"
    release = Release(agent, tmp_path / "state")
    release.change(mine, b"m = 1\n", b"m = 2\n")
    release.change(theirs, b"t = 1\n", b"t = 2\n")
    release.create()
    mine.write_bytes(b"m = 1\n")  # the commit never happened: still as before
    theirs.write_bytes(b"t = 'edited by hand'\n")

    record = agent.call("restore_release", release_dir=str(release.dir), by="controller")

    assert record["ok"] and not record["committed"]
    assert [f["action"] for f in record["files"]] == ["unchanged", "left"]
    assert theirs.read_bytes() == b"t = 'edited by hand'\n"
    assert not (release.dir / "files" / "1.drift").exists()


def test_a_damaged_backup_fails_the_restore_and_leaves_the_file_and_says_so(
        agent: Agent, tmp_path: Path) -> None:
    target = tmp_path / "model.py"
    release = Release(agent, tmp_path / "state")
    release.change(target, b"good = 1\n", b"good = 2\n")
    release.create(server={"manager": "process", "port": 1, "start": None})
    release.committed()
    (release.dir / "files" / "0.before").write_bytes(b"bit rot\n")

    record = agent.call("restore_release", release_dir=str(release.dir), by="controller")

    assert not record["ok"] and record["completed"] and record["error_kind"] == "restore"
    assert "is damaged" in record["error"] and str(target) in record["error"]
    assert target.read_bytes() == b"good = 2\n"
    assert record["listening"] == {"port": 1, "listening": False, "pid": None}
    manifest = release.manifest()
    assert manifest["outcome"] == "rollback_failed" and "is damaged" in manifest["restore_error"]
    assert release.journal()["step"] == "restore_failed"
    # a failed restore may be tried again: it is not "already" restored
    retry = agent.call("restore_release", release_dir=str(release.dir), by="controller")
    assert not retry["ok"] and "already" not in retry


def test_a_rollback_s_restore_marks_the_rollback_done_not_rolled_back(agent: Agent, tmp_path: Path) -> None:
    target = tmp_path / "x.py"
    release = Release(agent, tmp_path / "state", rid="rb1", kind="rollback")
    release.change(target, b"x = 1\n", b"x = 2\n")
    release.create(always=True)  # a rollback's plan applies whether or not a commit began

    record = agent.call("restore_release", release_dir=str(release.dir), by="rollback")

    assert record["ok"] and record["committed"] and target.read_bytes() == b"x = 1\n"
    assert release.manifest()["outcome"] == "done"
    assert release.journal()["step"] == "done"


def test_links_are_pointed_back_removed_or_recorded_as_drift(agent: Agent, tmp_path: Path) -> None:
    builds = tmp_path / "builds"
    for name in ("b1", "b2", "b3"):
        (builds / name).mkdir(parents=True)
    current, extra, moved = builds / "current", builds / "extra", builds / "moved"
    current.symlink_to("b2")  # the night pointed it from b1 to b2
    extra.symlink_to("b2")  # the night made this one
    moved.symlink_to("b3")  # orch pointed it at b2, a person then at b3
    release = Release(agent, tmp_path / "state", kind="night")
    release.links = [{"path": str(current), "target": "b1", "expect": "b2"},
                     {"path": str(extra), "target": None, "expect": "b2"},
                     {"path": str(moved), "target": "b1", "expect": "b2"},
                     {"path": str(builds / "same"), "target": None, "expect": None}]
    release.create()

    record = agent.call("restore_release", release_dir=str(release.dir), by="controller")

    assert record["ok"], record
    assert [(ln["action"], ln.get("drift")) for ln in record["links"]] == [
        ("restored", None), ("removed", None), ("restored", "b3"), ("unchanged", None)]
    assert os.readlink(current) == "b1" and os.readlink(moved) == "b1" and not extra.is_symlink()
    assert sorted(p.name for p in builds.iterdir()) == ["b1", "b2", "b3", "current", "moved"]


def test_a_confirmed_release_is_never_restored_and_a_restored_one_never_confirmed(
        agent: Agent, tmp_path: Path) -> None:
    target = tmp_path / "f.py"
    first = Release(agent, tmp_path / "state", rid="r1")
    first.change(target, b"1\n", b"2\n")
    first.create()
    confirmed = agent.call("confirm_release", release_dir=str(first.dir),
                           steps=[{"op": "mark", "args": {"path": str(first.dir / "confirmed.mark")}}])
    assert confirmed == {"confirmed": True, "results": [True]}
    assert (first.dir / "confirmed.mark").exists()
    with pytest.raises(RemoteStepError) as refused:
        agent.call("restore_release", release_dir=str(first.dir), by="watchdog")
    assert refused.value.kind == "confirmed" and "orch rollback" in refused.value.message
    assert target.read_bytes() == b"2\n"

    second = Release(agent, tmp_path / "state", rid="r2")
    second.change(target, b"2\n", b"3\n")
    second.create()
    agent.call("restore_release", release_dir=str(second.dir), by="controller")
    late = agent.call("confirm_release", release_dir=str(second.dir), steps=[])
    assert late["confirmed"] is False and late["restored"]["by"] == "controller"
    assert target.read_bytes() == b"2\n"


def test_a_restore_of_a_release_the_host_never_made_or_without_a_plan_is_refused(
        agent: Agent, tmp_path: Path) -> None:
    with pytest.raises(RemoteStepError) as absent:
        agent.call("restore_release", release_dir=str(tmp_path / "releases" / "nope"), by="controller")
    assert absent.value.kind == "absent" and "nope does not exist" in absent.value.message
    planless = tmp_path / "releases" / "bare"
    planless.mkdir(parents=True)
    with pytest.raises(RemoteStepError) as bare:
        agent.call("restore_release", release_dir=str(planless), by="controller")
    assert bare.value.kind == "restore" and "no restore plan" in bare.value.message
    with pytest.raises(RemoteStepError) as unarmed:
        agent.call("release_arm", state_dir=str(tmp_path), release_dir=str(planless))
    assert unarmed.value.kind == "arm"


def test_commands_managed_server_is_stopped_and_started_by_its_commands_when_touched(
        agent: Agent, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    server = {"manager": "commands", "stop": ["sh", "-c", f"echo stop >> {log}"],
              "start": ["sh", "-c", f"echo start >> {log}"], "pid_cmd": ["echo", "4242"]}
    untouched = Release(agent, tmp_path / "state", rid="r1")
    untouched.change(tmp_path / "u.py", b"u\n", b"v\n")
    untouched.create(server=server)
    assert agent.call("restore_release", release_dir=str(untouched.dir), by="controller")["server"] == {
        "action": "untouched"}
    assert not log.exists()

    touched = Release(agent, tmp_path / "state", rid="r2")
    touched.change(tmp_path / "t.py", b"t\n", b"w\n")
    touched.create(server=server)
    touched.committed()
    agent.call("mark", path=str(touched.dir / "server.touched"))
    record = agent.call("restore_release", release_dir=str(touched.dir), by="controller")
    assert record["server"] == {"action": "restarted", "pid": 4242, "log": None}
    assert log.read_text() == "stop\nstart\n"

    stop_only = Release(agent, tmp_path / "state", rid="r3")
    stop_only.change(tmp_path / "s.py", b"s\n", b"x\n")
    stop_only.create(server={"manager": "commands", "stop": ["sh", "-c", "exit 3"], "start": None})
    agent.call("mark", path=str(stop_only.dir / "server.touched"))
    assert agent.call("restore_release", release_dir=str(stop_only.dir), by="controller")["server"] == {
        "action": "stopped", "stop_rc": 3}


def sleeper(pidfile: Path) -> list[str]:
    """A long-running "server" that writes its own pidfile (as a real launcher does)."""
    code = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    return [sys.executable, "-c", code]


def test_a_touched_process_server_is_replaced_by_the_plan_s_command(agent: Agent, tmp_path: Path) -> None:
    pidfile = tmp_path / "server.pid"
    old = subprocess.Popen(sleeper(pidfile), start_new_session=True)
    started: int | None = None
    try:
        wait_until(lambda: pidfile.exists() and pidfile.read_text() == str(old.pid), "the old server's pidfile", 60)
        release = Release(agent, tmp_path / "state")
        release.change(tmp_path / "srv.py", b"1\n", b"2\n")
        release.create(server={"manager": "process", "pidfile": str(pidfile), "stop_timeout": 10.0,
                               "start": {"argv": sleeper(pidfile), "cwd": str(tmp_path)},
                               "log": str(tmp_path / "server.log")})
        release.committed()
        agent.call("mark", path=str(release.dir / "server.touched"))

        record = agent.call("restore_release", release_dir=str(release.dir), by="controller")

        assert record["ok"], record
        assert record["server"]["action"] == "restarted"
        started = record["server"]["pid"]
        assert started and started != old.pid
        assert old.wait(30) is not None  # the old server was stopped
        wait_until(lambda: pidfile.read_text().strip() == str(started), "the new server's pidfile", 60)
        found = agent.call("server_find", pidfile=str(pidfile))
        assert found["pid"] == started
    finally:
        for pid in (old.pid, started):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)


def test_the_watchdog_restores_a_release_nobody_confirmed(agent: Agent, tmp_path: Path) -> None:
    target = tmp_path / "w.py"
    release = Release(agent, tmp_path / "state")
    release.change(target, b"w = 1\n", b"w = 2\n")
    release.create(budget=0.0)
    release.committed()

    armed = agent.call("release_arm", state_dir=str(release.state), release_dir=str(release.dir))

    assert armed["budget"] == 0.0 and armed["pid"] > 0
    wait_until(lambda: release.journal()["step"] != "committed", "the watchdog's restore", 120)
    assert target.read_bytes() == b"w = 1\n"
    assert release.journal()["step"] == "restored_by_watchdog"
    manifest = release.manifest()
    assert (manifest["outcome"], manifest["restored_by"]) == ("rolled_back", "watchdog")
    assert manifest["error"] == "not confirmed before the watchdog's deadline"
    wait_until(lambda: "restored: " in (release.dir / "watchdog.log").read_text(), "the watchdog's log", 60)
    assert "deadline passed" in (release.dir / "watchdog.log").read_text()


def test_a_confirmed_release_s_watchdog_leaves_without_restoring(agent: Agent, tmp_path: Path) -> None:
    target = tmp_path / "c.py"
    release = Release(agent, tmp_path / "state")
    release.change(target, b"c = 1\n", b"c = 2\n")
    release.create(budget=3600.0)
    release.committed()
    armed = agent.call("release_arm", state_dir=str(release.state), release_dir=str(release.dir))
    view = agent.call("state_read", state_dir=str(release.state))["watchdog"]
    assert view["pid"] == armed["pid"] and view["alive"] and view["armed"] and not view["restored"]
    assert abs(view["acts_at"] - armed["fires_at"]) < 1e-6

    assert agent.call("confirm_release", release_dir=str(release.dir), steps=[])["confirmed"]

    wait_until(lambda: not agent.call("state_read", state_dir=str(release.state))["watchdog"]["alive"],
               "the confirmed release's watchdog to leave", 120)
    assert target.read_bytes() == b"c = 2\n"
    assert not (release.dir / "restored.json").exists()
    assert (release.dir / "watchdog.log").read_text() == ""


def test_a_restore_under_way_is_backed_up_by_the_watchdog_when_its_claim_runs_out(
        agent: Agent, tmp_path: Path) -> None:
    """A controller claimed the restore (``within``) and never finished it: the watchdog
    acts at the claim's end, not at its own (much later) deadline."""
    target = tmp_path / "k.py"
    release = Release(agent, tmp_path / "state")
    release.change(target, b"k = 1\n", b"k = 2\n")
    release.create(budget=3600.0)
    release.committed()
    # the claim a controller's restore_release writes first, as a restore killed mid-way leaves it
    agent.call("put_json", path=str(release.dir / "claim.json"),
               value={"by": "controller", "time": 0, "until": 1.0})
    armed = agent.call("release_arm", state_dir=str(release.state), release_dir=str(release.dir))
    assert armed["budget"] == 3600.0
    wait_until(lambda: release.journal()["step"] == "restored_by_watchdog", "the watchdog's restore", 120)
    assert target.read_bytes() == b"k = 1\n"
    assert json.loads((release.dir / "restored.json").read_text())["by"] == "watchdog"
