"""A night after its switch belongs to the host's runner (issue 19): a dead controller changes
nothing, a failing build is switched back by the runner, a Ctrl-C aborts the runner, and the
night's report is written by the next controller that learns the verdict. Over real sshd
behind the 20 ms proxy, with the stand-in server started from ``current/``; the new server's
health is held from outside by the stand-in's ready file (``STANDIN_READY_FILE``)."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.host import eventlog
from tests.fixtures.proxy import TcpProxy
from tests.fixtures.sandbox import (
    Sandbox,
    cmdline,
    get_json,
    health_status,
    wait_healthy,
    wait_until,
)
from tests.test_nightly import NightBox, server_build
from tests.test_nightly import nightbox as nightbox  # noqa: F401 - the fixture, used by name

HELD_ENV = ', STANDIN_READY_FILE: "{{ ready_file }}", STANDIN_EXIT_AFTER_READY: "{{ exit_after_ready }}"'


@dataclass
class Held(NightBox):
    proxy: TcpProxy | None = None  # the 20 ms proxy every connection to sshd goes through


@pytest.fixture
def held(nightbox: NightBox) -> Iterator[Held]:  # noqa: F811 - the fixture above, by name
    """The night box over the 20 ms proxy; each night's server healthy only once the file
    ``--var ready_file=…`` names exists (``exit_after_ready``: it exits that long after)."""
    box = nightbox.box
    proxy = TcpProxy(box.sshd.port, delay=0.02)
    try:
        known = box.root / "known_hosts_proxy"
        known.write_text(f"[127.0.0.1]:{proxy.port} {box.sshd.host_key_pub}\n")
        box.write_inventory(port=proxy.port, known_hosts=str(known), vars={
            "model": "/models/standin", "port": box.port, "source_repo": str(nightbox.src),
            "builds_root": str(nightbox.builds), "exit_after_ready": "0"})
        # a 1 s stability window: a server that exits 0.3 s after it was ready (a starved one
        # may answer a little longer) is gone well inside it
        nightbox.write_spec(extra_server_env=HELD_ENV, server_timeouts="stop_timeout: 5s\n  free_timeout: 5s",
                            stable_for="1s")
        yield Held(**vars(nightbox), proxy=proxy)
    finally:
        proxy.close()


def good_night(nb: NightBox) -> tuple[str, list[str]]:
    """A first night, healthy at once: its build and its server's argv."""
    ready = nb.box.root / "ready-first"
    ready.write_text("")
    ok, rep = nb.night("--var", f"ready_file={ready}")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    return rep["hosts"]["gpu"]["build"], cmdline(nb.box.server_pid())


def start_held_night(nb: NightBox, ready: Path, *more: str) -> tuple[subprocess.Popen[str], str]:
    """A night whose runner waits at health (its new server up, unhealthy until ``ready``):
    the controller, and the night's release id."""
    box = nb.box
    first = nb.current()
    proc = box.start_orch("nightly", str(nb.spec), "--host", "gpu", "--json", "--var", f"ready_file={ready}", *more)

    def switched_and_held() -> bool:
        return (box.journal().get("step") == "switching" and nb.current() != first
                and health_status(box.port) == 503)

    wait_until(switched_and_held, "the new build switched in and held unhealthy", 240)
    return proc, str(box.journal()["release"])


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate()


def release(box: Sandbox, night: str) -> Path:
    return box.state_dir / "releases" / night


def record(box: Sandbox, night: str) -> dict[str, Any]:
    return dict(json.loads((release(box, night) / "manifest.json").read_text()))


def verdicts(box: Sandbox, night: str) -> list[str]:
    return [w["verdict"] for w in eventlog.lines(str(release(box, night))) if w.get("event") == "verdict"]


def report_of(nb: NightBox, night: str) -> dict[str, Any]:
    return dict(json.loads((nb.reports / f"{night}.json").read_text()))


def test_controller_killed_after_the_switch_the_night_ends_alone_and_status_follow_reports_it(
    held: Held,
) -> None:
    nb, box = held, held.box
    first, first_argv = good_night(nb)
    ready = box.root / "ready-second"
    proc, night = start_held_night(nb, ready, "--var", "threshold=24")
    kill(proc)  # the controller is gone: only the host can finish the night
    assert not (nb.reports / f"{night}.json").exists()
    # a second controller follows the night in progress from its start
    follower = box.start_orch("status", "--follow", "--host", "gpu", "--json")
    wait_until(lambda: (release(box, night) / "events.jsonl").exists(), what="the runner's log")
    ready.write_text("")  # the new server becomes healthy
    out, err = follower.communicate(timeout=240)
    assert follower.returncode == 0, out + err
    followed = json.loads(out)["hosts"]["gpu"]
    assert followed["outcome"] == "changed" and followed["release"] == night, out

    # the night ended without its controller: current, healthy on the new build's argv, confirmed
    assert nb.current() == night
    wait_healthy(box.port, 30)
    argv, cwd = server_build(box, nb.builds)
    assert cwd == night and argv != first_argv
    assert get_json(box.port, "/get_server_info")["speculative_disable_batch_threshold"] == 24
    journal = box.journal()
    assert journal["step"] == "confirmed" and journal["finished"] is True and journal["release"] == night
    rec = record(box, night)
    assert rec["outcome"] == "deployed" and "restored_by" not in rec
    assert not (release(box, night) / "restored.json").exists()
    assert verdicts(box, night) == ["confirmed"]
    assert json.loads((box.state_dir / "state.json").read_text())["applied"][-1] == night
    wait_until(lambda: not (box.state_dir / "lock.json").exists(), what="the runner to give the lock back")
    # the host summed up the probe (the stamp): into the release's record and the build's manifest
    built = json.loads((nb.builds / night / "manifest.json").read_text())
    assert built["finished"] and built["probe"]["summary"]["requests"] == 16
    assert built["probe"]["summary"]["errors"] == 0 and built["probe"]["greedy_sha256"]
    assert rec["probe"]["summary"] == built["probe"]["summary"]
    assert [s["step"] for s in rec["steps"]][-4:] == ["restart", "health", "probe", "confirm"]

    # status --follow wrote the night's report, as its own controller would have
    report = report_of(nb, night)
    assert report["outcome"] == "changed" and report["exit_code"] == 0 and report["seq"] == rec["seq"]
    assert f"gpu report: reports/gpu/{night}.json" in err, err  # ``events.LateReportWritten``
    assert report["last_good"] == first and report["probe"]["requests"] == 16
    assert report["spec"]["name"] == "test-nightly"
    assert any("threshold" in c for c in report["changes"]), report["changes"]
    assert (nb.reports / f"{night}.log").exists() and night in (nb.reports / "index.html").read_text()
    assert json.loads((release(box, night) / "reported.json").read_text())["by"]["command"] == "status --follow"
    # and it is reported once: the next status --follow has nothing in progress
    again = box.orch("status", "--follow", "--host", "gpu", "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    rows = json.loads(box.orch("history", "--host", "gpu", "--json").stdout)["hosts"]["gpu"]
    assert [r["outcome"] for r in rows] == ["good", "current"]

    # SIGTERM after the switch: one line naming where the verdict is, exit 3; nothing aborted
    ready_last = box.root / "ready-last"
    proc, last = start_held_night(nb, ready_last)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 3, out + err
    assert "`orch status --follow --host gpu`" in json.loads(out)["hosts"]["gpu"]["error"], out
    assert json.loads(out)["hosts"]["gpu"]["ending"] == {
        "kind": "stopped_following", "host": "gpu", "release": last, "run": "night", "signame": "SIGTERM",
        "reconnecting": False}, out
    ready_last.write_text("")
    wait_until(lambda: verdicts(box, last) == ["confirmed"], "the runner to confirm the night alone", 240)
    assert nb.current() == last and record(box, last)["outcome"] == "deployed"
    wait_healthy(box.port, 30)
    assert server_build(box, nb.builds)[1] == last


def test_a_crashing_build_is_switched_back_by_the_runner_then_ctrl_c_and_a_severed_link_after_a_switch(
    held: Held,
) -> None:
    """kill -9 of the controller at health, the new server exits just after it became ready:
    the runner switches back (``by: runner``) and the next ``orch nightly`` writes that night's
    report. That next night is interrupted once after its switch: the runner switches it back,
    exit 1. The one after it loses its link after the switch: it connects again, exit 0."""
    nb, box = held, held.box
    first, first_argv = good_night(nb)
    ready = box.root / "ready-crash"
    proc, crashed = start_held_night(nb, ready, "--var", "exit_after_ready=0.3")
    kill(proc)
    ready.write_text("")  # healthy, then gone within the stability window
    wait_until(lambda: box.journal().get("finished") is True, "the runner to switch the night back", 240)
    assert nb.current() == first
    wait_healthy(box.port, 60)
    argv, cwd = server_build(box, nb.builds)
    assert argv == first_argv and cwd == first
    restored = json.loads((release(box, crashed) / "restored.json").read_text())
    assert restored["by"] == "runner" and restored["ok"] is True
    assert restored["links"][0]["action"] == "restored" and restored["server"]["action"] == "restarted"
    assert record(box, crashed)["outcome"] == "rolled_back" and verdicts(box, crashed) == ["restored"]
    assert not (release(box, crashed) / "reported.json").exists()  # nobody heard the verdict yet

    # the next night: it writes the crashed night's report first, then is interrupted after its switch
    ready_next = box.root / "ready-next"
    proc, night = start_held_night(nb, ready_next)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, out + err
    host = json.loads(out)["hosts"]["gpu"]
    assert host["outcome"] == "rolled_back" and "interrupted (Ctrl-C)" in host["error"], out
    ending = host["ending"]  # as fields: the runner's abort, switched back by the runner
    assert (ending["kind"], ending["run"], ending["failure"], ending["by"]) == ("restored", "night", "cancelled",
                                                                              "runner"), ending
    assert json.loads((release(box, night) / "restored.json").read_text())["by"] == "runner"
    assert not ready_next.exists()  # nothing let the health go: the abort stopped it
    assert nb.current() == first
    wait_healthy(box.port, 60)
    assert server_build(box, nb.builds) == (first_argv, first)
    assert verdicts(box, night) == ["restored"]
    said = {e["event"]: e for e in host["events"]}
    assert said["switched_back"]["by"] == "runner"

    late = report_of(nb, crashed)
    assert late["outcome"] == "rolled_back" and late["exit_code"] == 1 and late["night"] == crashed
    assert "exited" in str(late["error"]) or "stab" in str(late["error"]), late["error"]
    assert late["ending"]["kind"] == "runner_failed" and late["ending"]["release"] == crashed, late["ending"]
    assert late["ending"]["reason"] == late["error"]
    assert json.loads((release(box, crashed) / "reported.json").read_text())["by"]["command"] == "nightly"
    assert f"report of night {crashed}" in err
    assert report_of(nb, night)["outcome"] == "rolled_back"
    rows = json.loads(box.orch("history", "--host", "gpu", "--json").stdout)["hosts"]["gpu"]
    assert [r["outcome"] for r in rows] == ["current", "switched back", "switched back"]

    # the link severed after the switch: the controller connects again and follows to the verdict
    ready_sever = box.root / "ready-sever"
    proc, severed = start_held_night(nb, ready_sever)
    assert held.proxy is not None
    connections = held.proxy.connections
    held.proxy.sever()  # the controller's connection dies; new ones get through
    ready_sever.write_text("")
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, out + err
    assert json.loads(out)["hosts"]["gpu"]["outcome"] == "changed" and "connecting again to follow it" in err
    assert held.proxy.connections > connections  # it did connect again
    assert nb.current() == severed and verdicts(box, severed) == ["confirmed"]
    assert json.loads((release(box, severed) / "reported.json").read_text())["by"]["command"] == "nightly"
