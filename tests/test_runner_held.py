"""Issue 19's must-show cases for a deploy held at each step after the commit (pre-flight,
health, the gate, ``after_healthy``): a dead runner is restored by its guard at once, a Ctrl-C
aborts the runner, a dead controller changes nothing, a link that stalls or is severed comes
back to the verdict. Over real sshd behind the 20 ms proxy, with the stand-in server.

Every step is held from outside orch, by a file the test creates when it wants the step to
end: a ``server.preflight`` command and an ``after_healthy`` hook that wait for it, the new
server's ``STANDIN_READY_FILE`` (health) and ``STANDIN_GENERATE_HOLD_FILE`` (the gate's probe
of the new server). The baseline server, started by hand, has neither switch.

Each test checks the files by sha256, the server's argv and health, the journal, the release
record (who restored: ``by``) and the exit code. One body serves each held step
(parametrized); the suite's budget keeps the cases few.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.host import eventlog
from tests.fixtures.sandbox import Sandbox, cmdline, get_json, health_status, sha256, wait_until
from tests.test_faults import Link, finish, hold_ready, read, story
from tests.test_faults import link as link  # noqa: F401 - the fixture, used by name

GATE_PROBE = {"post": "/generate", "json": {"text": "held", "sampling_params": {"max_new_tokens": 4}},
              "requests": 4, "concurrency": 2, "rounds": 1, "timeout": "600s"}
"""A small probe: the gate here is held, not measured. Its one rule (``errors: 0``) does not
depend on how long the test held the requests. Its timeout is longer than any wait here
(``finish``: 240 s): an abort that waited for the held request to time out, instead of
stopping the step, fails the test."""


def wait_for(path: Path) -> str:
    """A shell loop that waits until ``path`` exists (test paths hold no quote)."""
    return f"while [ ! -e {path} ]; do sleep 0.1; done"


@dataclass
class Held:
    """A deploy held at ``step``: the controller, its release, the file that lets the step go,
    the target's sha256 before the deploy."""

    step: str
    proc: subprocess.Popen[str]
    release: Path
    go: Path
    original: str

    def let_go(self) -> None:
        self.go.write_text("")


def held_playbook(box: Sandbox, step: str, go: Path, at: Path, *, env: dict[str, str] | None = None,
                  timeout: str = "60s") -> Path:
    """The story's playbook, its ``step`` held until ``go`` exists (``at`` marks a hook's start)."""
    env = dict(env or {})
    if step == "health":
        env["STANDIN_READY_FILE"] = str(go)
    if step == "gate":
        env["STANDIN_GENERATE_HOLD_FILE"] = str(go)
    path = story(box, f"held-{step}.yaml", env=env, timeout=timeout)
    spec = yaml.safe_load(path.read_text())
    if step == "preflight":
        spec["server"]["preflight"] = f"sh -c 'touch {at}; {wait_for(go)}'"
    if step == "after_healthy":
        spec["server"]["after_healthy"] = f"sh -c 'touch {at}; {wait_for(go)}'"
    if step == "gate":
        # the health checks must not wait on the held /generate: only the gate's probe does
        spec["health"]["checks"] = [c for c in spec["health"]["checks"] if "post" not in c]
        spec["gate"] = {"probes": [GATE_PROBE], "rules": {"errors": 0}}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def began(release: Path, step: str) -> bool:
    return any(w.get("event") == "step" and w.get("step") == step and w.get("state") == "began"
               for w in eventlog.lines(str(release)))


def current_release(box: Sandbox) -> Path | None:
    release = box.journal().get("release")
    return box.state_dir / "releases" / str(release) if release else None


def wait_held(box: Sandbox, step: str, at: Path) -> Path:
    """The release once its runner is in ``step``: the hook's mark for a command we run, the
    step's ``began`` event for the stand-in's (the new server answers nothing until let go)."""
    def there() -> Path | None:
        release = current_release(box)
        if release is None or not began(release, step):
            return None
        return release if step in ("health", "gate") or at.exists() else None

    return wait_until(there, f"the runner to be held at {step}", timeout=180)


def start_held(box: Sandbox, step: str, *args: str, env: dict[str, str] | None = None, timeout: str = "60s") -> Held:
    if box.hand is None:
        box.start_by_hand()
    original = sha256(box.server_args)
    go, at = box.root / f"go-{step}", box.root / f"at-{step}"
    proc = box.start_orch("deploy", "--host", "gpu", "--json", *args, str(held_playbook(box, step, go, at, env=env, timeout=timeout)))
    return Held(step, proc, wait_held(box, step, at), go, original)


def holding(go: Path) -> list[int]:
    """The pids of processes still waiting for ``go`` (a held hook or pre-flight left behind)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if str(go).encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                    pids.append(int(name))
            except OSError:
                continue
    return pids


def verdicts(release: Path) -> list[dict[str, Any]]:
    return [w for w in eventlog.lines(str(release)) if w.get("event") == "verdict"]


def assert_restored(box: Sandbox, h: Held, by: str) -> dict[str, Any]:
    """Files, argv, health, journal and the release's records as before the deploy, restored by ``by``."""
    assert sha256(box.server_args) == h.original
    wait_until(lambda: health_status(box.port) == 200, "the restored server healthy", 60)
    assert cmdline(box.server_pid()) == box.hand_argv
    record = read(h.release / "restored.json")
    assert record["by"] == by and record["ok"] is True, record
    manifest = read(h.release / "manifest.json")
    assert manifest["outcome"] == "rolled_back" and manifest["restored_by"] == by, manifest
    journal = box.journal()
    assert journal["release"] == h.release.name and journal["finished"] is True
    assert journal["step"] == "rolled_back", journal
    assert [v["verdict"] for v in verdicts(h.release)] == ["restored"]
    wait_until(lambda: not (box.state_dir / "lock.json").exists(), "the lock to be given back")
    if h.step in ("preflight", "after_healthy"):
        assert holding(h.go) == []  # the held command ended with the step, not left waiting
    return record


def assert_deployed(box: Sandbox, h: Held) -> None:
    """The patch live and healthy, the release current and confirmed, no restore."""
    assert sha256(box.server_args) != h.original
    wait_until(lambda: health_status(box.port) == 200, "the new server healthy", 60)
    assert get_json(box.port, "/get_server_info")["speculative_disable_batch_threshold"] == 32
    argv = cmdline(box.server_pid())
    assert argv[argv.index("--speculative-disable-batch-threshold") + 1] == "32"
    journal = box.journal()
    assert journal["release"] == h.release.name and journal["step"] == "confirmed" and journal["finished"] is True
    assert read(h.release / "manifest.json")["outcome"] == "deployed"
    assert not (h.release / "restored.json").exists()
    assert [v["verdict"] for v in verdicts(h.release)] == ["confirmed"]
    assert read(box.state_dir / "state.json")["applied"][-1] == h.release.name
    wait_until(lambda: not (box.state_dir / "lock.json").exists(), "the runner to give the lock back")


HELD = ["preflight", "health", "gate"]


# ---------------------------------------------------------------- the runner killed: its guard


@pytest.mark.parametrize("step", HELD)
def test_runner_killed_at_a_held_step_the_guard_restores_before_the_backstop(link: Link, step: str) -> None:
    box = link.box
    h = start_held(box, step)
    armed = read(h.release / "watchdog.json")  # the backstop's deadline, as the host recorded it at arm
    os.kill(int(read(h.release / "runner.json")["pid"]), signal.SIGKILL)
    code, report, out = finish(h.proc)
    assert code == 1, out
    assert report["outcome"] == "rolled_back" and report["release"] == h.release.name, out
    record = assert_restored(box, h, "guard")
    assert record["finished"] < armed["fires_at"]  # restored at once, not by the backstop
    assert "the runner was killed (signal 9)" in read(h.release / "manifest.json")["error"]


# ---------------------------------------------------------------- Ctrl-C on the controller


@pytest.mark.parametrize("step", HELD)
def test_ctrl_c_once_at_a_held_step_the_runner_aborts_and_restores(link: Link, step: str) -> None:
    box = link.box
    h = start_held(box, step)
    h.proc.send_signal(signal.SIGINT)
    code, report, out = finish(h.proc)
    assert code == 1, out
    assert report["outcome"] == "rolled_back" and report["release"] == h.release.name, out
    assert "Traceback" not in out
    assert_restored(box, h, "runner")
    assert read(h.release / "manifest.json")["error"] == "interrupted (Ctrl-C)"
    assert not h.go.exists()  # nothing let the step go: the abort ended it


@pytest.mark.parametrize("step", ["health", "gate"])
def test_ctrl_c_twice_at_a_held_step_stops_following_and_the_runner_still_finishes(link: Link, step: str) -> None:
    """(At the pre-flight the old server was never stopped: its restore puts files back and
    restarts nothing, so there the moment is held on the link: tests/test_ctrl_c_twice_preflight.py.)"""
    box = link.box
    ready = hold_ready(box)  # the restore's server waits for `ready`: the second Ctrl-C lands in it
    # the new server inherits the running one's environment: at the gate it must not wait for `ready`
    h = start_held(box, step, env={"STANDIN_READY_FILE": ""} if step == "gate" else None)
    h.proc.send_signal(signal.SIGINT)
    wait_until(lambda: (h.release / "claim.json").exists(), "the runner's restore to begin")
    h.proc.send_signal(signal.SIGINT)
    code, report, out = finish(h.proc)
    assert code == 3, out
    assert report["outcome"] == "unreachable" and report["release"] == h.release.name, out
    assert report["error"].startswith(f"interrupted again: orch stopped following release {h.release.name}")
    assert "`orch status --follow --host gpu`" in report["error"] and "Traceback" not in out
    assert verdicts(h.release) == []  # the controller left before the verdict
    ready.write_text("")  # the restore goes on without the controller
    follower = box.orch("status", "--follow", "--host", "gpu", "--json")
    assert follower.returncode == 1, follower.stdout + follower.stderr
    followed = json.loads(follower.stdout)["hosts"]["gpu"]
    assert followed["outcome"] == "rolled_back" and followed["release"] == h.release.name, followed
    assert_restored(box, h, "runner")
    assert read(h.release / "reported.json")["by"]["command"] == "status --follow"


# ---------------------------------------------------------------- the controller killed


@pytest.mark.parametrize("step", ["preflight", "gate", "after_healthy"])
def test_controller_killed_at_a_held_step_the_release_becomes_current_without_it(link: Link, step: str) -> None:
    """(Held at health, the controller is gone too in the twice-Ctrl-C case and the SIGTERM
    case of tests/test_runner.py.)"""
    box = link.box
    h = start_held(box, step)
    h.proc.send_signal(signal.SIGKILL)
    h.proc.wait()
    h.let_go()
    wait_until(lambda: verdicts(h.release), "the runner's verdict without a controller")
    assert_deployed(box, h)
    status = box.orch("status", "--host", "gpu", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    now = json.loads(status.stdout)["hosts"]["gpu"]
    assert now["current"] == h.release.name and now["healthy"] is True and now["drift"] == [], now


@pytest.mark.parametrize("fault", ["STANDIN_CRASH_AT_START", "STANDIN_NEVER_READY"])
def test_controller_killed_at_health_with_a_bad_patch_the_runner_restores(link: Link, fault: str) -> None:
    box = link.box
    # the controller is gone within moments of the health step's start: 5 s is long enough
    h = start_held(box, "health", env={fault: "1"}, timeout="5s")
    h.proc.send_signal(signal.SIGKILL)
    h.proc.wait()
    h.let_go()  # ready file or not, this server never becomes healthy (crashed, or never ready)
    wait_until(lambda: verdicts(h.release), "the runner's verdict without a controller", 240)
    assert_restored(box, h, "runner")
    follower = box.orch("status", "--follow", "--host", "gpu", "--json")
    assert follower.returncode == 1, follower.stdout + follower.stderr
    assert json.loads(follower.stdout)["hosts"]["gpu"]["outcome"] == "rolled_back", follower.stdout


# ---------------------------------------------------------------- the link


@pytest.mark.parametrize("step", ["health", "gate"])
def test_link_stalled_at_a_held_step_comes_back_and_the_controller_exits_with_the_verdict(
        link: Link, step: str) -> None:
    box = link.box
    h = start_held(box, step)
    link.proxy.stall()
    h.let_go()
    wait_until(lambda: verdicts(h.release), "the runner's verdict while the link is stalled")
    link.proxy.unstall()
    code, report, out = finish(h.proc)
    assert code == 0, out
    assert report["outcome"] == "changed" and report["release"] == h.release.name, out
    assert_deployed(box, h)
    assert read(h.release / "reported.json")["by"]["command"] == "deploy"


def test_link_severed_at_the_gate_the_controller_reconnects_and_exits_with_the_verdict(link: Link) -> None:
    box = link.box
    h = start_held(box, "gate")
    connections = link.proxy.connections
    link.proxy.sever()
    h.let_go()
    code, report, out = finish(h.proc)
    assert code == 0, out
    assert report["outcome"] == "changed" and report["release"] == h.release.name, out
    assert report["gate"]["verdict"] == "pass", report
    assert "connecting again to follow it" in out
    assert link.proxy.connections > connections
    assert_deployed(box, h)
    assert read(h.release / "reported.json")["by"]["command"] == "deploy"


# ---------------------------------------------------------------- the probe under an abort


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy-request", "batch"])
def test_an_abort_ends_a_probe_whose_server_holds_its_requests(tmp_path: Path, greedy: bool) -> None:
    """What the held gate found: the runner's abort (its SIGTERM sets ``cancel_requested``) did
    not end a probe until the held request timed out (a signal does not end a socket read).
    A real listener that accepts and never answers; the probe's timeout is far beyond the wait."""
    import socket
    import threading

    from orchestrator.host.probe import op_probe_http
    from orchestrator.host.runner import RunnerSession
    from orchestrator.host.wire import AgentError

    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: [accepted.append(listener.accept()[0]) for _ in range(8)], daemon=True).start()
    s = RunnerSession(str(tmp_path), [])
    ended: list[BaseException | None] = []

    def probe() -> None:
        try:
            op_probe_http(s, f"http://127.0.0.1:{listener.getsockname()[1]}", "/generate", {"text": "x"}, 2, 2, 600,
                          greedy_body={"text": "x"} if greedy else None)
            ended.append(None)
        except AgentError as e:
            ended.append(e)

    threading.Thread(target=probe, daemon=True).start()
    wait_until(lambda: accepted, "the probe's request to be held")
    s.cancel_requested = True  # what the runner's SIGTERM handler does
    wait_until(lambda: ended, "the probe to end at the abort", timeout=60)
    listener.close()
    assert isinstance(ended[0], AgentError) and ended[0].kind == "cancelled", ended
