"""Hooks around the restart: drain the host from its router before the stop, put it
back once healthy — and a restore puts it back too. Over real sshd, with the
stand-in server; the "router" is a file the hooks write, one line per call."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.fixtures.sandbox import SHIPPED_SPEC, Sandbox, cmdline, get_json, sha256


def hooked(box: Sandbox, name: str, *, before_stop: str | None = None, env: dict[str, str] | None = None) -> Path:
    router = box.root / "router.log"
    spec = yaml.safe_load(SHIPPED_SPEC)
    spec["server"].update(
        stop_timeout="5s", free_timeout="5s", env=env or {},
        before_stop=before_stop or f"sh -c 'echo drain >> {router}'",
        # the command line it is given says which server was put back
        after_healthy=f"sh -c 'echo \"serve $0\" >> {router}' {{{{ command }}}}",
    )
    spec["health"].update(timeout="20s", stable_for="0.2s")
    path = box.root / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def calls(box: Sandbox) -> list[str]:
    path = box.root / "router.log"
    return path.read_text().splitlines() if path.exists() else []


def test_a_deploy_drains_the_host_then_puts_it_back_once_healthy(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    proc = sandbox.orch("deploy", "--host", "gpu", "--json", str(hooked(sandbox, "ok.yaml")))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = calls(sandbox)
    assert got[0] == "drain" and got[1].startswith("serve ") and len(got) == 2
    assert "--speculative-disable-batch-threshold 32" in got[1]  # the new command line was put back
    assert get_json(sandbox.port, "/get_server_info")["speculative_disable_batch_threshold"] == 32


def test_a_rollback_puts_the_host_back_with_the_previous_server(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    original = sha256(sandbox.server_args)
    proc = sandbox.orch("deploy", "--host", "gpu", "--json",
                        str(hooked(sandbox, "crash.yaml", env={"STANDIN_CRASH_AT_START": "1"})))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["hosts"]["gpu"]["outcome"] == "rolled_back"
    got = calls(sandbox)
    assert got[0] == "drain" and len(got) == 2
    assert got[1].startswith("serve ") and "--speculative-disable-batch-threshold" not in got[1]
    assert sha256(sandbox.server_args) == original
    assert cmdline(sandbox.server_pid()) == sandbox.hand_argv


def test_a_failing_before_stop_stops_nothing(sandbox: Sandbox) -> None:
    pid = sandbox.start_by_hand()
    original = sha256(sandbox.server_args)
    router = sandbox.root / "router.log"
    failing = f"sh -c 'echo drain >> {router}; echo router unreachable >&2; exit 3'"
    proc = sandbox.orch("deploy", "--host", "gpu", "--json", str(hooked(sandbox, "drain-fails.yaml",
                                                                        before_stop=failing)))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rep = json.loads(proc.stdout)["hosts"]["gpu"]
    assert rep["outcome"] == "rolled_back" and "router unreachable" in rep["error"]
    assert "was never stopped" in proc.stderr + proc.stdout
    assert rep["restore"]["server"]["action"] == "untouched" and rep["restore"]["server"]["pid"] == pid
    assert sandbox.server_pid() == pid  # the running server was never stopped
    assert sha256(sandbox.server_args) == original
    assert calls(sandbox)[0] == "drain" and calls(sandbox)[1].startswith("serve ")  # put back anyway
