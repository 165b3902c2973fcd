"""Issue 17: a live deploy is in progress, not unfinished; outcomes come from the host's record.

One view of the host (``core.progress.host_view``) tells a run in progress
(its helper alive and hearing its controller) from one whose controller is
gone (the watchdog restores it) from one nobody finishes; ``status``,
``deploy``, ``--check``, ``nightly`` and ``rollback`` print its words.
The end-to-end tests reach the real sshd through the latency proxy, hold
the deploy where the fault must land with files the test creates (the
stand-in's ``STANDIN_READY_FILE``, a hook or a validator that waits), and
check files by sha256, the server's argv and health, the journal and the
exit code.
"""

from __future__ import annotations

import base64
import getpass
import json
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.core.progress import (
    HostState,
    JournalRecord,
    LockRecord,
    TakeOver,
    WatchdogRecord,
    clock,
    host_view,
    take_over_decision,
)
from orchestrator.shell.agent_client import RemoteStepError
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
from tests.test_agent import start

HOLDER = f"{getpass.getuser()}@{socket.gethostname()}"

# ---------------------------------------------------------------- the view, pure


def journal(step: str = "restarting", finished: bool = False, kind: str = "deploy") -> JournalRecord:
    return JournalRecord(release="R1", kind=kind, step=step, since=1000.0, finished=finished)


def lock(alive: bool = True, age: float = 3.0) -> LockRecord:
    return LockRecord(user="ann", controller="lap", controller_id="lap/1", pid=42, command="deploy x.yaml",
                      started=900.0, token="t", helper_pid=77, helper_alive=alive, heartbeat_age=age)


WATCHDOG = WatchdogRecord(release="R1", alive=True, acts_at=2000.0)
DEAD_WATCHDOG = WatchdogRecord(release="R1", alive=False, acts_at=2000.0)


@pytest.mark.parametrize(("j", "lk", "wd", "state"), [
    (journal(), lock(), WATCHDOG, HostState.IN_PROGRESS),
    (journal(), lock(), None, HostState.IN_PROGRESS),  # before the watchdog is armed
    (journal(finished=True), lock(), None, HostState.IN_PROGRESS),  # a run still planning
    (journal(), lock(age=60.0), WATCHDOG, HostState.CONTROLLER_GONE),  # its helper no longer hears it
    (journal(), lock(alive=False), WATCHDOG, HostState.CONTROLLER_GONE),
    (journal(), None, WATCHDOG, HostState.CONTROLLER_GONE),
    (journal(), None, DEAD_WATCHDOG, HostState.UNFINISHED),
    (journal(), None, WatchdogRecord(release="R0", alive=True, acts_at=1.0), HostState.UNFINISHED),  # another's
    (journal(), None, None, HostState.UNFINISHED),
    (journal(finished=True), None, WATCHDOG, HostState.IDLE),
    (None, lock(alive=False), None, HostState.IDLE),
    (None, None, None, HostState.IDLE),
])
def test_one_view_of_the_host(j: JournalRecord | None, lk: LockRecord | None, wd: WatchdogRecord | None,
                              state: HostState) -> None:
    assert host_view("gpu", j, lk, wd).state is state


def test_the_words_of_each_state() -> None:
    live = host_view("gpu", journal(), lock(), WATCHDOG)
    assert live.words() == f"release R1 in progress (step restarting since {clock(1000.0)}, started by ann@lap)"
    assert "orch rollback" not in live.words() and "orch rollback" not in live.refusal()
    assert live.to_json() == {"release": "R1", "kind": "deploy", "step": "restarting", "since": 1000.0,
                              "holder": "ann@lap", "state": "in_progress", "restores_at": None, "guard": None}
    gone = host_view("gpu", journal(), None, WATCHDOG)
    assert gone.words() == (f"release R1 in progress, its controller gone (last step restarting): the watchdog "
                            f"restores it at {clock(2000.0)} (host clock); `orch rollback --host gpu` restores now")
    assert gone.problem() is None  # its watchdog finishes it: in progress, not unfinished
    # a runner's release (its lock says runner@): "no guard" once the guard it armed is dead
    runner = LockRecord(user="ann", controller="lap", controller_id="runner@gpu", pid=42, command="deploy x.yaml",
                        started=900.0, token="t", helper_pid=78, helper_alive=True, heartbeat_age=1.0)
    armed = WatchdogRecord(release="R1", alive=True, acts_at=2000.0, pid=79, armed=True)
    assert host_view("gpu", journal(), runner, armed).guard is True
    alone = host_view("gpu", journal(), runner, WatchdogRecord(release="R1", alive=False, pid=79, armed=True))
    assert alone.state is HostState.IN_PROGRESS and alone.guard is False
    assert alone.words().endswith("started by ann@lap; no guard)") and alone.to_json()["guard"] is False  # type: ignore[index]
    assert "no guard" not in live.words()
    dead = host_view("gpu", journal(), None, None)
    assert "stopped at step restarting" in dead.words() and "orch rollback --host gpu" in dead.words()
    assert "never finished" in dead.refusal()
    # issue 16 item 8: a night is named as a night
    night = host_view("gpu", journal("building", kind="night"), lock(), None)
    assert night.words().startswith("night R1 in progress (step building")
    assert host_view("gpu", journal("switching", kind="night"), None, None).words().startswith(
        "night R1 stopped at step switching")


@pytest.mark.parametrize(("lk", "same", "here", "brk", "want"), [
    (lock(alive=True, age=600.0), True, False, True, TakeOver.HELD),  # a live helper: never, not even so
    (lock(alive=True, age=2.0), True, False, False, TakeOver.HELD),
    (lock(alive=False, age=2.0), True, False, False, TakeOver.TAKE),  # same machine, all of it gone
    (lock(alive=False, age=2.0), True, True, False, TakeOver.HELD),  # its controller still runs here
    (lock(alive=False, age=600.0), False, False, False, TakeOver.STALE),
    (lock(alive=False, age=600.0), False, False, True, TakeOver.BREAK),
    (lock(alive=False, age=2.0), False, False, True, TakeOver.HELD),
])
def test_a_lock_whose_helper_lives_is_never_taken_over(lk: LockRecord, same: bool, here: bool, brk: bool,
                                                       want: TakeOver) -> None:
    assert take_over_decision(lk, same_controller=same, holder_alive_here=here, break_lock=brk,
                              stale_after=30.0) is want


# ---------------------------------------------------------------- the helper's record


def test_a_failed_batch_after_the_commit_carries_what_the_commit_wrote(tmp_path: Path) -> None:
    """An error the helper did not anticipate (here: the journal's directory is gone) after the
    commit still brings back the commit's answer: the files it wrote."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("one\n")
    b.write_text("two\n")
    agent = start()
    try:
        files = [{"path": str(p), "data": base64.b64encode(p.read_bytes() + b"new\n").decode()} for p in (a, b)]
        staged = agent.call("stage", files=files, token="t1")
        wire = [{"path": str(p), "staged": s["staged"], "before": sha256(p), "after": s["sha256"]}
                for p, s in zip((a, b), staged, strict=True)]
        with pytest.raises(RemoteStepError) as got:
            agent.call("batch", steps=[
                {"op": "commit", "args": {"files": wire}},
                {"op": "put_json", "args": {"path": str(tmp_path / "gone" / "journal.json"), "value": {}}},
            ])
    finally:
        agent.close()
    assert got.value.kind == "internal" and "FileNotFoundError" in got.value.message
    assert got.value.details["step"] == 1 and got.value.details["done"] == [[str(a), str(b)]]
    assert a.read_text() == "one\nnew\n"


def test_state_read_says_whether_the_lock_holder_and_the_watchdog_live(tmp_path: Path) -> None:
    state = tmp_path / "state"
    release = state / "releases" / "R1"
    release.mkdir(parents=True)
    (state / "journal.json").write_text(json.dumps({"release": "R1", "step": "restarting", "finished": False}))
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        start_ticks = Path(f"/proc/{sleeper.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        (release / "watchdog.json").write_text(json.dumps({"pid": sleeper.pid, "starttime": int(start_ticks)}))
        (release / "restore.json").write_text(json.dumps({"deadline": 1234.5, "plan": {}}))
        holder = start()
        reader = start()
        try:
            assert holder.call("lock_acquire", state_dir=str(state), holder={"user": "ann"})["acquired"]
            seen = reader.call("state_read", state_dir=str(state))
            assert seen["lock"]["agent_alive"] is True and seen["lock"]["heartbeat_age"] < 20
            assert seen["watchdog"] == {"release": "R1", "pid": sleeper.pid, "alive": True, "acts_at": 1234.5,
                                        "armed": True, "restored": False}
            # a pid reused by another process is not the watchdog
            (release / "watchdog.json").write_text(json.dumps({"pid": sleeper.pid, "starttime": 1}))
            assert reader.call("state_read", state_dir=str(state))["watchdog"]["alive"] is False
        finally:
            holder.close()
        after = reader.call("state_read", state_dir=str(state))
        reader.close()
        assert after["lock"] is None  # the helper gave it back as it left
    finally:
        sleeper.kill()
        sleeper.wait()


# ---------------------------------------------------------------- end to end, through the latency proxy


@pytest.fixture
def box(sandbox: Sandbox) -> Iterator[Sandbox]:
    """The sandbox host, reached through a proxy that adds 20 ms each way (``box.proxy``)."""
    proxy = TcpProxy(sandbox.sshd.port, delay=0.02)
    known = sandbox.root / "known_hosts_proxy"
    known.write_text(f"[127.0.0.1]:{proxy.port} {sandbox.sshd.host_key_pub}\n")
    sandbox.write_inventory(port=proxy.port, known_hosts=str(known))
    sandbox.proxy = proxy  # type: ignore[attr-defined]
    try:
        yield sandbox
    finally:
        proxy.close()


def playbook(box: Sandbox, name: str = "story.yaml", *, env: dict[str, str] | None = None,
             timeout: str = "5m", after_healthy: str | None = None, files: list[dict[str, Any]] | None = None,
             server: bool = True) -> Path:
    spec = yaml.safe_load(SHIPPED_SPEC)
    spec["server"].update(stop_timeout="5s", free_timeout="5s", preflight_timeout="15s", env=env or {})
    spec["health"].update(timeout=timeout, stable_for="1s", confirm_timeout="1s", interval="0.2s")
    if after_healthy:
        spec["server"]["after_healthy"] = after_healthy
    if files is not None:
        spec["files"] = files
    if not server:
        spec.pop("server")
        spec.pop("health")
    path = box.root / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def wait_for(path: Path) -> str:
    return f"sh -c 'while [ ! -e {path} ]; do sleep 0.05; done'"


def orch_json(box: Sandbox, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = box.orch(*args, "--json")
    text = proc.stdout + proc.stderr
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(text) from None
    return proc.returncode, data, text


def at_once(*runs: Callable[[], Any]) -> list[Any]:
    """Each run's result, in order, the runs side by side (``orch`` commands that only read the
    host or are refused: what one of them does is not what another one answers to)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return [f.result() for f in [pool.submit(run) for run in runs]]


def nightly_spec(box: Sandbox) -> Path:
    """A valid night; it is refused at the lock, before anything it names is touched."""
    spec = {"name": "refused-night",
            "source": {"git": {"repo": str(box.root / "no-repo"), "commit": "0" * 40}},
            "builds_dir": str(box.root / "builds"), "install": [], "stack": [],
            "server": {"manager": "process", "command": "python3 -m sglang.launch_server --port 1"},
            "health": {"base_url": "http://127.0.0.1:1", "checks": [{"get": "/health"}]}}
    path = box.root / "night.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def as_before(box: Sandbox, original: str) -> None:
    assert sha256(box.server_args) == original
    wait_healthy(box.port, 60)
    assert cmdline(box.server_pid()) == box.hand_argv


def test_a_live_deploy_is_in_progress_and_nobody_may_act_on_it(box: Sandbox) -> None:
    box.start_by_hand()
    original = sha256(box.server_args)
    ready, go = box.root / "ready", box.root / "go"
    pb = playbook(box, env={"STANDIN_READY_FILE": str(ready)}, after_healthy=wait_for(go))
    proc = box.start_orch("deploy", "--host", "gpu", "--json", str(pb))
    try:
        wait_until(lambda: box.journal().get("step") == "restarting", "the restart")
        assert box.hand is not None
        wait_until(lambda: box.hand.poll() is not None, "the old server to stop")  # not healthy now
        release = box.journal()["release"]
        token = json.loads((box.state_dir / "lock.json").read_text())["token"]
        words = f"release {release} in progress (step restarting since "

        # held at its health wait: in progress, and not healthy now -> 3, never "orch rollback";
        # the two statuses and every command refused run side by side (none of them changes the host)
        night = nightly_spec(box)
        refused = (["deploy", "--host", "gpu", str(pb)],
                   ["deploy", "--check", "--host", "gpu", str(pb)],
                   ["deploy", "--host", "gpu", "--break-lock", str(pb)],
                   ["rollback", "--host", "gpu"],
                   ["rollback", "--host", "gpu", "--break-lock"],
                   ["nightly", str(night), "--host", "gpu", "--ssh-config", str(box.sshd.ssh_config)])
        (code, data, text), plain, *answers = at_once(
            lambda: orch_json(box, "status", "--host", "gpu"), lambda: box.orch("status", "--host", "gpu"),
            *[lambda args=args: orch_json(box, *args) for args in refused])
        st = data["hosts"]["gpu"]
        assert code == 3, text
        assert st["in_progress"]["state"] == "in_progress" and st["in_progress"]["release"] == release
        assert st["in_progress"]["step"] == "restarting" and st["in_progress"]["holder"] == HOLDER
        assert words in st["state_words"] and f"started by {HOLDER})" in st["state_words"]
        assert words in plain.stdout and "orch rollback" not in plain.stdout + plain.stderr

        for args, (code, data, text) in zip(refused, answers, strict=True):
            assert code == 2, (args, text)
            error = data["hosts"]["gpu"]["error"] if data.get("hosts", {}).get("gpu") else data.get("error")
            assert words in error, (args, error)
            assert "orch rollback" not in error, (args, error)
        assert json.loads((box.state_dir / "lock.json").read_text())["token"] == token  # nobody took it
        assert box.journal()["release"] == release and box.journal()["finished"] is False

        # healthy now, still in progress (its after_healthy hook waits for `go`): exit 0
        ready.write_text("")
        wait_healthy(box.port, 60)
        code, data, text = orch_json(box, "status", "--host", "gpu")
        assert code == 0, text
        assert data["hosts"]["gpu"]["in_progress"]["state"] == "in_progress"
        go.write_text("")
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out + err
    assert json.loads(out)["hosts"]["gpu"]["outcome"] == "changed"
    assert sha256(box.server_args) != original
    assert "--speculative-disable-batch-threshold" in cmdline(box.server_pid())
    assert get_json(box.port, "/get_server_info")["speculative_disable_batch_threshold"] == 32
    assert box.journal()["finished"] is True and box.journal()["step"] == "confirmed"
    code, data, text = orch_json(box, "status", "--host", "gpu")
    assert code == 0 and data["hosts"]["gpu"]["in_progress"] is None, text


def watchdog_time(box: Sandbox, release: str) -> str:
    """When the watchdog acts, as the host recorded it when it armed (host wall time)."""
    return clock(json.loads((box.state_dir / "releases" / release / "watchdog.json").read_text())["fires_at"])


@pytest.mark.parametrize("fault", ["kill-9", "sever"])
def test_a_deploy_whose_controller_is_gone_is_in_progress_and_rollback_abort_restores_it(box: Sandbox,
                                                                                          fault: str) -> None:
    box.start_by_hand()
    original = sha256(box.server_args)
    # severed, the controller tries again every 5 s for 6 connect timeouts before it exits 3:
    # 2.4 s makes that window 14.4 s (tries at 0, 5 and 10 s) instead of the default's 60 s
    wait = ["--connect-timeout", "2.4"] if fault == "sever" else []
    proc = box.start_orch("deploy", "--host", "gpu", "--json", *wait,
                          str(playbook(box, env={"STANDIN_NEVER_READY": "1"})))
    wait_until(lambda: box.journal().get("step") == "restarting", "the restart")
    release = box.journal()["release"]
    if fault == "kill-9":
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    else:
        box.proxy.refuse()  # type: ignore[attr-defined]
        proc.communicate(timeout=240)
        assert proc.returncode == 3
        box.write_inventory()  # a route back, straight to sshd
    assert sha256(box.server_args) != original
    # its runner goes on, holding the lock: the release is in progress, whoever asks (side by side)
    again = playbook(box, "again.yaml")
    (code, data, text), deploy, rollback = at_once(
        lambda: orch_json(box, "status", "--host", "gpu"),
        lambda: orch_json(box, "deploy", "--host", "gpu", str(again)),
        lambda: orch_json(box, "rollback", "--host", "gpu"))
    st = data["hosts"]["gpu"]
    assert st["in_progress"]["state"] == "in_progress" and st["in_progress"]["release"] == release, text
    assert code == 3, text  # in progress is no error; the new server does not answer health now
    for code, data, text in (deploy, rollback):
        assert code == 2 and f"release {release} in progress" in data["hosts"]["gpu"]["error"], text
    # `orch rollback --abort`: the runner stops its health wait and restores; the restore is followed
    code, data, text = orch_json(box, "rollback", "--abort", "--host", "gpu")
    assert code == 0, text
    assert data["hosts"]["gpu"]["outcome"] == "rolled_back" and data["hosts"]["gpu"]["release"] == release
    as_before(box, original)
    assert box.journal()["finished"] is True and box.journal()["step"] == "rolled_back"
    assert json.loads((box.state_dir / "releases" / release / "restored.json").read_text())["by"] == "runner"


def test_a_deploy_whose_runner_and_guard_are_gone_is_unfinished(box: Sandbox) -> None:
    box.start_by_hand()
    original = sha256(box.server_args)
    proc = box.start_orch("deploy", "--host", "gpu", "--json",
                          str(playbook(box, env={"STANDIN_NEVER_READY": "1"})))
    wait_until(lambda: box.journal().get("step") == "restarting", "the restart")
    release = box.journal()["release"]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ran = json.loads((box.state_dir / "releases" / release / "runner.json").read_text())
    os.kill(ran["guard"], signal.SIGKILL)  # the guard first: else it restores when its runner dies
    wait_until(lambda: not Path(f"/proc/{ran['guard']}/status").exists()
               or "Z" in Path(f"/proc/{ran['guard']}/status").read_text().split("State:")[1][:4], "the guard's end")
    os.kill(ran["pid"], signal.SIGKILL)

    code, data, text = orch_json(box, "status", "--host", "gpu")
    assert code == 3, text
    st = data["hosts"]["gpu"]
    assert st["in_progress"]["state"] == "unfinished"
    assert f"deploy {release} unfinished" in st["problems"]
    assert "stopped at step restarting" in st["state_words"] and "orch rollback --host gpu" in st["state_words"]
    code, data, text = orch_json(box, "deploy", "--check", "--host", "gpu", str(playbook(box, "again.yaml")))
    assert code == 2 and "never finished" in data["hosts"]["gpu"]["error"], text
    # the dead runner's lock is provably gone (the host checked its pid): taken with a note
    code, data, text = orch_json(box, "rollback", "--host", "gpu")
    assert code == 0, text
    as_before(box, original)
    assert box.journal()["finished"] is True


def test_a_commit_that_wrote_one_file_before_failing_is_rolled_back_not_nothing_changed(box: Sandbox) -> None:
    box.start_by_hand()
    pid = box.server_pid()
    first = box.server_args.with_name("first_args.py")
    first.write_bytes(box.server_args.read_bytes())
    originals = {first: sha256(first), box.server_args: sha256(box.server_args)}
    go = box.root / "go"
    spec = yaml.safe_load(SHIPPED_SPEC)
    entry = spec["files"][0]
    files = [dict(entry, path=str(first), validate=["python-syntax", wait_for(go)]), dict(entry)]
    proc = box.start_orch("deploy", "--host", "gpu", "--json", str(playbook(box, files=files)))
    try:
        wait_until(lambda: list(box.server_args.parent.glob(".server_args.orch-staged-*.py"))
                   and list(first.parent.glob(".first_args.orch-staged-*.py")), "both staged copies")
        subprocess.run(["chattr", "+i", str(box.server_args)], check=True)
        go.write_text("")
        out, err = proc.communicate(timeout=240)
    finally:
        subprocess.run(["chattr", "-i", str(box.server_args)], check=False)
        if proc.poll() is None:
            proc.kill()
    text = out + err
    rep = json.loads(out)["hosts"]["gpu"]
    assert proc.returncode == 1, text
    assert rep["outcome"] == "rolled_back", rep
    assert f"written by the commit before it failed: {first}" in text
    assert f"files restored: {first}" in text
    assert rep["restore"]["written_by_commit"] == [str(first)]  # the host's record of the batch, as fields
    assert {"path": str(first), "action": "restored"}.items() <= rep["restore"]["files"][0].items()
    assert "nothing was changed" not in text and "nothing on the host was changed" not in text
    assert all(sha256(p) == sha for p, sha in originals.items())
    assert box.server_pid() == pid  # the server was never touched
    assert box.journal()["finished"] is True and box.journal()["step"] == "rolled_back"


@pytest.mark.parametrize("name", ["file.", "...", "a name with spaces.txt"])
def test_the_validator_gets_the_staged_path_the_host_made(box: Sandbox, name: str) -> None:
    target = box.sglang_root / name
    target.write_text("alpha\nbeta\n")
    original = sha256(target)
    seen = box.root / "seen.txt"
    check = f"sh -c 'test -f \"$1\" && printf %s \"$1\" > {seen}' check {{{{ staged }}}}"
    files = [{"path": str(target), "markers": False,
              "edits": [{"content": "gamma\n", "after": "alpha"}], "validate": [check]}]
    pb = playbook(box, files=files, server=False)
    code, data, text = orch_json(box, "deploy", "--check", "--host", "gpu", str(pb))
    assert code == 0 and data["hosts"]["gpu"]["outcome"] == "planned", text
    staged = seen.read_text()
    assert Path(staged).parent == target.parent and ".orch-staged-" in staged
    assert not Path(staged).exists() and sha256(target) == original  # --check removed it, changed nothing
    code, data, text = orch_json(box, "deploy", "--host", "gpu", str(pb))
    assert code == 0 and data["hosts"]["gpu"]["outcome"] == "changed", text
    assert target.read_text() == "alpha\ngamma\nbeta\n"
    assert [p.name for p in target.parent.iterdir() if ".orch-staged-" in p.name] == []


def test_the_helper_renews_its_heartbeat_only_while_it_hears_its_controller(tmp_path: Path) -> None:
    """A fresh heartbeat must mean "steered": the helper's background loop renews the lock
    only while its controller was heard lately (pings every 5 s), never on its own."""
    import io
    import threading
    import time

    from orchestrator.host import session as helper

    path = tmp_path / "lock.json"
    path.write_text("{}")
    old = time.time() - 600
    os.utime(path, (old, old))
    session = helper.Session(io.BytesIO())
    session.lock = (str(path), os.open(path, os.O_RDONLY))
    session.last_heard = time.monotonic() - 60  # its controller went silent a minute ago
    loop = threading.Thread(target=session.background, daemon=True)
    loop.start()
    try:
        wait_until(lambda: loop.is_alive(), "the loop")
        assert not session.hears_controller()
        session.last_heard = time.monotonic() + 3600  # heard (kept "just now" for the loop's next pass)
        wait_until(lambda: path.stat().st_mtime > old + 1, "the heartbeat once the controller is heard", 30)
        session.last_heard = time.monotonic() - 60
        session.eof = True
        assert not session.hears_controller()
    finally:
        session.stopping = True
        loop.join(10)
        os.close(session.lock[1])
    renewed = path.stat().st_mtime
    assert renewed > old + 1
