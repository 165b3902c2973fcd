"""Issue 21, table row 1: a files-only deploy (``local-logging``, no ``server:``) says that the
running server started before the release and still runs the old code; ``status`` says it
again for the current release. The real CLI over sshd against the stand-in server."""

from __future__ import annotations

import json
import os
import signal

from tests.fixtures.sandbox import Sandbox, wait_until


def host_of(proc) -> dict:  # type: ignore[no-untyped-def]
    return json.loads(proc.stdout)["hosts"]["gpu"]


def test_row1_files_only_deploy_and_status_name_the_server_that_predates_the_release(sandbox: Sandbox) -> None:
    pid = sandbox.start_by_hand()
    done = sandbox.orch("deploy", "--host", "gpu", "--json", "local-logging")
    assert done.returncode == 0, done.stdout + done.stderr
    rep = host_of(done)
    assert rep["outcome"] == "changed" and rep["server_predates_release"] is True, rep
    note = f"the running server (pid {pid}, started "
    assert note in done.stderr and "restart it to use the change" in done.stderr, done.stderr
    assert sandbox.server_pid() == pid  # a files-only release restarts nothing

    status = sandbox.orch("status", "--host", "gpu", "--json")
    assert status.returncode == 0, status.stdout + status.stderr  # the exit code is unchanged: ok
    got = host_of(status)
    assert got["server_predates_release"] is True and got["current"] == rep["release"], got
    shown = sandbox.orch("status", "--host", "gpu")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert note in shown.stdout and "still runs the code it loaded before this release" in shown.stdout

    # restarted by hand after the release: it loaded the new files, no note
    os.killpg(pid, signal.SIGKILL)
    assert sandbox.hand is not None
    sandbox.hand.wait(30)
    wait_until(lambda: sandbox.server_pid() is None, "the port to be free")
    again = sandbox.start_by_hand()
    after = sandbox.orch("status", "--host", "gpu", "--json")
    assert after.returncode == 0, after.stdout + after.stderr
    assert host_of(after)["server_predates_release"] is False
    plain = sandbox.orch("status", "--host", "gpu")
    assert f"pid {again}" not in plain.stdout and "still runs the code" not in plain.stdout, plain.stdout


def test_row1_files_only_deploy_with_no_server_running_says_false(sandbox: Sandbox) -> None:
    done = sandbox.orch("deploy", "--host", "gpu", "--json", "local-logging")
    assert done.returncode == 0, done.stdout + done.stderr
    rep = host_of(done)
    assert rep["outcome"] == "changed" and rep["server_predates_release"] is False, rep
    assert "still runs the code" not in done.stdout + done.stderr
    status = sandbox.orch("status", "--host", "gpu", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    assert host_of(status)["server_predates_release"] is False


def test_row1_predates_is_unknown_without_a_start_or_a_commit_time() -> None:
    from orchestrator.core.predates import commit_time, server_predates
    from orchestrator.host.records import ServerProcess

    steps = [{"step": "backup", "at": 100.0, "seconds": 1.0}, {"step": "commit", "at": 101.0, "seconds": 0.5}]
    assert commit_time(steps) == 101.5 and commit_time([{"step": "confirm", "at": 1.0}]) is None
    assert server_predates(ServerProcess(pid=7, started_at=101.0), 101.5) is True
    assert server_predates(ServerProcess(pid=7, started_at=102.0), 101.5) is False
    assert server_predates(ServerProcess(pid=7), 101.5) is None  # an older helper sent no start
    assert server_predates(None, 101.5) is False and server_predates(None, None) is None
