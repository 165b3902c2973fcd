"""The helper's health wait, server processes and release records, through its protocol.

The real helper over the local transport; a real HTTP server on loopback whose
answers the test changes between polls; real server processes the helper starts,
finds by port or pidfile, and stops.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.target import HostTarget
from orchestrator.shell.agent_client import Agent, RemoteStepError
from orchestrator.shell.transport import open_transport
from tests.fixtures.sandbox import wait_until
from tests.fixtures.sshd import free_port  # reserved: nobody takes it before the server binds


@pytest.fixture
def agent(local_agent: Agent) -> Agent:
    return local_agent


class Health:
    """What the stand-in health endpoint answers: the test sets it, polls see it."""

    def __init__(self) -> None:
        self.status = 503
        self.doc: dict[str, Any] = {"ready": False}
        self.polls = 0
        self.healthy_after: int | None = None  # answer 200 from this poll on
        self.sick_after: int | None = None  # answer 503 from this poll on


@pytest.fixture
def health() -> Iterator[tuple[str, Health]]:
    state = Health()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            state.polls += 1
            status = state.status
            if state.healthy_after is not None and state.polls >= state.healthy_after:
                status = 200
            if state.sick_after is not None and state.polls >= state.sick_after:
                status = 503
            data = json.dumps(state.doc).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_POST = do_GET  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()


def test_health_wait_polls_until_the_checks_pass_and_says_what_it_waits_for(
        agent: Agent, health: tuple[str, Health]) -> None:
    url, state = health
    state.healthy_after = 3
    state.doc = {"ready": True, "workers": 2}
    events: list[dict] = []
    got = agent.call("health_wait", base_url=url, timeout=60.0, interval=0.1, on_event=events.append,
                     checks=[{"method": "get", "path": "/health", "expect": {"ready": True, "workers": 2.0}}])
    assert got["polls"] == 3 and got["last"] == "GET /health: ok"
    assert [e["msg"] for e in events if e.get("event") == "health"][0] == "GET /health: HTTP 503 (want 200)"


@pytest.mark.parametrize(("check", "doc", "seen"), [
    ({"method": "get", "path": "/h", "body": "ready.*yes"}, {"ready": "no"}, "GET /h: body does not match 'ready.*yes'"),
    ({"method": "get", "path": "/h", "expect": {"model": "m"}}, {"ready": True}, "GET /h: no key 'model'"),
    ({"method": "post", "path": "/h", "json": {"q": 1}, "expect": {"ready": True}}, {"ready": False},
     "POST /h: ready is False (want True)"),
    ({"method": "get", "path": "/h", "status": 204}, {}, "GET /h: HTTP 200 (want 204)"),
])
def test_a_check_that_fails_says_what_it_saw(agent: Agent, health: tuple[str, Health], check: dict,
                                            doc: dict, seen: str) -> None:
    url, state = health
    state.status, state.doc = 200, doc
    with pytest.raises(RemoteStepError) as failed:
        agent.call("health_wait", base_url=url, checks=[check], timeout=0, interval=1.0)
    assert failed.value.kind == "health_timeout" and failed.value.message == f"not healthy: {seen}"


def test_health_wait_gives_up_at_its_deadline_with_the_last_thing_seen(
        agent: Agent, health: tuple[str, Health], tmp_path: Path) -> None:
    url, _ = health
    log = tmp_path / "server.log"
    log.write_text("loading weights\nstill loading\n")
    with pytest.raises(RemoteStepError) as slow:
        agent.call("health_wait", base_url=url, checks=[{"method": "get", "path": "/h"}], timeout=1.0,
                   interval=0.2, log=str(log))
    assert slow.value.kind == "health_timeout"
    assert slow.value.message == "not healthy after 1.0s: GET /h: HTTP 503 (want 200)"
    assert slow.value.details["log_tail"] == ["loading weights", "still loading"]


def test_a_server_that_turns_unhealthy_within_the_stable_period_fails(
        agent: Agent, health: tuple[str, Health]) -> None:
    url, state = health
    state.healthy_after, state.sick_after = 1, 3
    with pytest.raises(RemoteStepError) as unstable:
        agent.call("health_wait", base_url=url, checks=[{"method": "get", "path": "/h"}], timeout=60.0,
                   interval=0.1, stable_for=60.0)
    assert unstable.value.kind == "unstable" and "after it first passed its checks" in unstable.value.message
    assert unstable.value.details["last"] == "GET /h: HTTP 503 (want 200)"


def test_a_server_that_stays_healthy_for_the_stable_period_passes(agent: Agent, health: tuple[str, Health]) -> None:
    url, state = health
    state.status = 200
    got = agent.call("health_wait", base_url=url, checks=[{"method": "get", "path": "/h"}], timeout=60.0,
                     interval=0.1, stable_for=0.5)
    assert got["stable_for"] == 0.5 and got["polls"] >= 2


def test_a_server_is_found_by_its_port_and_stopped_until_the_port_is_free(agent: Agent, tmp_path: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)]
    started = agent.call("batch", steps=[
        {"op": "server_start", "args": {"argv": argv, "cwd": str(tmp_path), "env": {"EXTRA": "1"},
                                        "log": str(tmp_path / "logs" / "srv.log")}},
        {"op": "health_wait", "args": {"base_url": f"http://127.0.0.1:{port}", "pid": "started", "timeout": 60.0,
                                       "interval": 0.1, "checks": [{"method": "get", "path": "/"}]}},
    ])[0]
    found = agent.call("server_find", port=port)
    assert found["pid"] == started["pid"] and found["found_by"] == "port"
    assert found["argv"] == argv and found["cwd"] == str(tmp_path) and found["env"]["EXTRA"] == "1"
    assert agent.call("process", pid=started["pid"])["found_by"] == "pid command"

    stopped = agent.call("server_stop", pid=found["pid"], pgid=found["pgid"], port=port, stop_timeout=30.0)

    assert started["pid"] in stopped["stopped"] and stopped["killed"] is False
    assert agent.call("server_find", port=port) is None
    assert agent.call("process", pid=started["pid"]) is None
    # a second start rotates the log: the first server's output is kept beside it
    agent.call("server_start", argv=["true"], log=str(tmp_path / "logs" / "srv.log"))
    assert (tmp_path / "logs" / "srv.log.1").exists()


def kernel_thread_pid() -> int:
    """A kernel thread (a child of kthreadd, no command line): what a stale pidfile's pid can name now."""
    for name in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{name}/stat").read_bytes()
            if name.isdigit() and stat.rsplit(b")", 1)[1].split()[1] == b"2" and not Path(
                    f"/proc/{name}/cmdline").read_bytes():
                return int(name)
        except OSError:
            continue
    raise AssertionError("no kernel thread in /proc")


def test_a_pidfile_naming_a_kernel_thread_names_no_server_and_no_argv_is_never_recorded(
        agent: Agent, tmp_path: Path) -> None:
    """A rollback restarts the recorded argv: a record with none would restart nothing."""
    pid = kernel_thread_pid()
    pidfile = tmp_path / "server.pid"
    pidfile.write_text(f"{pid}\n")
    assert agent.call("server_find", pidfile=str(pidfile)) is None  # stale: looked for by its port, none given
    with pytest.raises(RemoteStepError, match=f"process {pid} has no command line"):
        agent.call("process", pid=pid)


def test_a_stop_takes_the_servers_group_and_a_worker_that_left_it(agent: Agent, tmp_path: Path) -> None:
    """A server whose worker moved to a session of its own (outside the group a SIGTERM to the
    group reaches) and whose grandchild stayed in the group: all three are signalled and gone,
    found in one pass over ``/proc``."""
    pids = tmp_path / "pids"
    code = ("import os, subprocess, sys, time\n"
            "loop = [sys.executable, '-c', 'import time\\nwhile True: time.sleep(1)']\n"
            "apart = subprocess.Popen(loop, start_new_session=True)\n"
            "inner = subprocess.Popen([sys.executable, '-c', 'import subprocess, sys, time\\n'\n"
            "    'subprocess.Popen([sys.executable, \"-c\", \"import time\\\\nwhile True: time.sleep(1)\"])\\n'\n"
            "    'while True: time.sleep(1)'])\n"
            f"open({str(pids)!r} + '.tmp', 'w').write('%d %d' % (apart.pid, inner.pid))\n"
            f"os.rename({str(pids)!r} + '.tmp', {str(pids)!r})\n"
            "while True: time.sleep(1)")
    started = agent.call("server_start", argv=[sys.executable, "-c", code], log=str(tmp_path / "l"))
    wait_until(pids.exists, "the server to start its workers", 60)
    apart, inner = map(int, pids.read_text().split())

    def grandchildren() -> list[int]:
        return [int(p) for p in Path(f"/proc/{inner}/task/{inner}/children").read_text().split()]

    wait_until(grandchildren, "the worker to start its own child", 60)
    grandchild = grandchildren()[0]
    assert os.getpgid(apart) != started["pgid"] and os.getpgid(grandchild) == started["pgid"]

    stopped = agent.call("server_stop", pid=started["pid"], pgid=started["pgid"], stop_timeout=30.0)

    assert set(stopped["stopped"]) >= {started["pid"], apart, inner, grandchild}, stopped
    for pid in (started["pid"], apart, inner, grandchild):
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"), pid


def test_the_process_table_gives_descendants_and_group_members() -> None:
    from orchestrator.host.processes import descendants, group_members, process_table

    table = {10: (1, 10), 11: (10, 10), 12: (11, 12), 13: (12, 12), 20: (1, 10), 30: (1, 30)}
    assert sorted(descendants(10, table)) == [11, 12, 13]
    assert descendants(30, table) == []
    assert sorted(group_members(10, table)) == [10, 11, 20]
    live = process_table()
    assert live[os.getpid()] == (os.getppid(), os.getpgid(0))


def test_a_commands_manager_s_start_is_watched_by_the_pid_its_pid_command_prints(
        agent: Agent, tmp_path: Path) -> None:
    got = agent.call("commands_start", start=["sh", "-c", f"echo started > {tmp_path / 'out'}"],
                     pid_cmd=["echo", "12345"])
    assert got == {"pid": 12345, "log": None} and (tmp_path / "out").read_text() == "started\n"
    with pytest.raises(RemoteStepError) as failed:
        agent.call("run_ok", argv=["sh", "-c", "echo no GPU >&2; exit 7"])
    assert failed.value.kind == "server" and failed.value.message.endswith("exited 7: no GPU")
    with pytest.raises(RemoteStepError) as bad_start:
        agent.call("server_start", argv=["/nonexistent/server"])
    assert bad_start.value.kind == "server" and "cannot start /nonexistent/server" in bad_start.value.message


def test_release_records_are_updated_and_logged_privately(agent: Agent, tmp_path: Path) -> None:
    state = tmp_path / "state"
    staged = tmp_path / "staged.py"
    staged.write_bytes(b"new\n")
    agent.call("state_init", state_dir=str(state))
    made = agent.call("release_create", state_dir=str(state), release_id="r1", manifest={"id": "r1"},
                      files=[{"path": "/x", "n": 0, "before": base64.b64encode(b"old\n").decode(),
                              "after": {"copy_of": str(staged), "sha256": hashlib.sha256(b"new\n").hexdigest()}}])
    root = Path(made["root"])
    assert (root / "files" / "0.after").read_bytes() == b"new\n" and made["seq"] == 1

    assert agent.call("release_update", state_dir=str(state), release_id="r1",
                      fields={"outcome": "deployed"}) == {"id": "r1", "seq": 1, "outcome": "deployed"}
    agent.call("release_log", state_dir=str(state), release_id="r1", text="step one\n")
    agent.call("release_log", state_dir=str(state), release_id="r1", text="step two\n")
    assert (root / "run.log").read_text() == "step one\nstep two\n"
    assert (root / "run.log").stat().st_mode & 0o777 == 0o600
    assert agent.call("log_tail", path=str(root / "run.log"), lines=1) == ["step two"]

    with pytest.raises(RemoteStepError) as missing:
        agent.call("release_update", state_dir=str(state), release_id="r9", fields={})
    assert missing.value.kind == "state" and "r9 has no manifest" in missing.value.message
    with pytest.raises(RemoteStepError) as changed:
        agent.call("release_create", state_dir=str(state), release_id="r2", manifest={"id": "r2"},
                   files=[{"path": "/x", "n": 0, "after": {"copy_of": str(staged), "sha256": "0" * 64}}])
    assert changed.value.kind == "backup" and "planned " + "0" * 64 in changed.value.message
    with pytest.raises(RemoteStepError) as gone:
        agent.call("release_create", state_dir=str(state), release_id="r3", manifest={"id": "r3"},
                   files=[{"path": "/x", "n": 0, "after": {"copy_of": str(tmp_path / "no"), "sha256": "0"}}])
    assert gone.value.kind == "backup" and "cannot read" in gone.value.message
    assert agent.call("release_create", state_dir=str(state), release_id="r4", manifest={"id": "r4"},
                      files=[])["seq"] == 2  # the refused ones took no number


def test_the_lock_is_refused_while_held_and_a_take_over_of_a_changed_lock_fails(
        agent: Agent, tmp_path: Path) -> None:
    state = tmp_path / "state"
    mine = agent.call("open_state", state_dir=str(state), holder={"who": "first"})
    assert mine["lock"]["acquired"] and mine["state"]["lock"]["who"] == "first"
    transport = open_transport(HostTarget(name="local", connection="local", python=sys.executable))
    transport.connect()
    other = Agent(transport, python=sys.executable).start()
    try:
        held = other.call("lock_acquire", state_dir=str(state), holder={"who": "second"})
        assert held["acquired"] is False and held["holder"]["who"] == "first"
        assert held["holder"]["agent_alive"] is True
        stale = other.call("lock_acquire", state_dir=str(state), holder={"who": "second"},
                           replace_token="not-the-lock-s-token")
        assert stale["acquired"] is False and stale["changed_hands"] and stale["holder"]["who"] == "first"
        assert json.loads((state / "lock.json").read_text())["who"] == "first"
        assert agent.call("lock_release", state_dir=str(state)) is True
        assert agent.call("lock_release", state_dir=str(state)) is False
        taken = other.call("lock_acquire", state_dir=str(state), holder={"who": "second"})
        assert taken["acquired"]
    finally:
        other.close()
    # the second helper gave its lock back when it left
    wait_until(lambda: not (state / "lock.json").exists(), "the leaving helper to free the lock", 60)


def stage_in_a_helper_that_then_leaves(target: Path, data: bytes, token: str) -> dict[str, Any]:
    """A staged copy left by another run's helper (a ``--check``, or a deploy's first connection)."""
    transport = open_transport(HostTarget(name="local", connection="local", python=sys.executable))
    transport.connect()
    first = Agent(transport, python=sys.executable).start()
    try:
        return first.call("stage", token=token, files=[{"path": str(target), "data": base64.b64encode(data).decode()}])[0]
    finally:
        first.close()


def test_a_copy_staged_by_an_earlier_helper_is_validated_and_committed_by_the_next(
        agent: Agent, tmp_path: Path) -> None:
    target = tmp_path / "mod.py"
    target.write_bytes(b"x = 1\n")
    staged = stage_in_a_helper_that_then_leaves(target, b"x = 2\n", "t1")
    assert Path(staged["staged"]).read_bytes() == b"x = 2\n"

    checked = agent.call("validate", token="t1", checks=[{"target": str(target), "argvs": [["python-syntax"]]}])
    assert checked[0]["rc"] == 0
    assert agent.call("commit", files=[{"path": str(target), "staged": staged["staged"],
                                        "before": hashlib.sha256(b"x = 1\n").hexdigest(),
                                        "after": staged["sha256"]}]) == [str(target)]
    assert target.read_bytes() == b"x = 2\n" and sorted(p.name for p in tmp_path.iterdir()) == ["mod.py"]

    other = stage_in_a_helper_that_then_leaves(target, b"x = (\n", "t2")
    failed = agent.call("validate", token="t2", keep_staged=False,
                        checks=[{"target": str(target), "argvs": [["python-syntax"]]}])
    assert failed[0]["rc"] == 1 and not Path(other["staged"]).exists()


def test_a_commit_whose_staged_copy_is_gone_or_not_orch_s_writes_nothing(agent: Agent, tmp_path: Path) -> None:
    target = tmp_path / "mod.py"
    target.write_bytes(b"x = 1\n")
    before = hashlib.sha256(b"x = 1\n").hexdigest()
    gone = tmp_path / ".mod.orch-staged-gone.py"
    with pytest.raises(RemoteStepError) as missing:
        agent.call("commit", files=[{"path": str(target), "staged": str(gone), "before": before, "after": "0"}])
    assert missing.value.kind == "commit" and "its staged copy" in missing.value.message
    assert missing.value.details["committed"] == []
    planted = tmp_path / ".mod.orch-staged-link.py"
    planted.symlink_to(tmp_path / "elsewhere.py")
    with pytest.raises(RemoteStepError) as link:
        agent.call("commit", files=[{"path": str(target), "staged": str(planted), "before": before, "after": "0"}])
    assert link.value.kind == "planted"
    assert target.read_bytes() == b"x = 1\n"
    with pytest.raises(RemoteStepError) as changed:
        agent.call("commit", files=[{"path": str(target), "staged": str(gone), "before": "0" * 64, "after": "0"}])
    assert changed.value.kind == "changed" and "nothing was written" in changed.value.message


def test_leftover_temp_dirs_are_removed_only_when_abandoned_and_orch_s(agent: Agent, tmp_path: Path) -> None:
    """A killed helper's private temp dir (0700, holding only ``new``) goes at the next deploy's
    clean-up; one holding anything else, one others may write, or a link by that name stays."""
    target = tmp_path / "mod.py"
    target.write_text("x = 1\n")
    abandoned = tmp_path / ".mod.py.orch-tmp-0a1b"
    abandoned.mkdir(mode=0o700)
    (abandoned / "new").write_text("half written\n")
    empty = tmp_path / ".mod.py.orch-tmp-0a1c"
    empty.mkdir(mode=0o700)
    busy = tmp_path / ".mod.py.orch-tmp-0a1d"
    busy.mkdir(mode=0o700)
    (busy / "notes").write_text("not orch's\n")
    shared = tmp_path / ".mod.py.orch-tmp-0a1e"
    shared.mkdir()
    shared.chmod(0o777)
    link = tmp_path / ".mod.py.orch-tmp-0a1f"
    link.symlink_to(busy)
    twice = tmp_path / ".mod.orch-staged-twice.py"
    twice.write_text("x = 0\n")
    (tmp_path / "hardlink").hardlink_to(twice)

    agent.call("stage", token="now", clean_stale=True,
               files=[{"path": str(target), "data": base64.b64encode(b"x = 2\n").decode()}])

    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([".mod.orch-staged-now.py", ".mod.orch-staged-twice.py", busy.name, shared.name,
                           link.name, "hardlink", "mod.py"])
    assert (busy / "notes").read_text() == "not orch's\n"


def test_a_server_is_held_until_its_pidfile_is_written_and_never_runs_if_its_starter_dies(tmp_path: Path) -> None:
    """The runner killed between the fork and the pidfile: the server must not run unseen
    (a restore that takes over would not find it and start a second one on its port)."""
    from orchestrator.host.processes import spawn_held

    marker = tmp_path / "ran"
    program = [sys.executable, "-c", f"import os; open({str(marker)!r}, 'w').write(str(os.getpid()))"]
    with open(os.devnull, "wb") as out:
        abandoned, go = spawn_held(program, None, dict(os.environ), out)
    os.close(go)  # its starter died before saying "go"
    assert abandoned.wait(timeout=30) == 125 and not marker.exists()

    with open(os.devnull, "wb") as out:
        released, go = spawn_held(program, str(tmp_path), dict(os.environ), out)
    assert not marker.exists()  # held: nothing of the server's own runs before "go"
    os.write(go, b"go\n")
    os.close(go)
    assert released.wait(timeout=30) == 0 and marker.read_text() == str(released.pid)  # exec: the same pid
