"""``orch rollback`` is run by the host's runner, as a deploy's steps after its commit are
(issue 19, item 1): armed with its guard, handed on in the same round trip, its events
followed by the controller. A controller killed mid-restore changes nothing; a restore that
fails is ``rollback_failed`` (exit 3), and the runner never restores a second time.

Over real sshd behind the 20 ms proxy, with the stand-in server. The restored server's
health is held from outside: the server started by hand has ``STANDIN_READY_FILE``, so the
same command line, started again by the rollback, waits until the test creates the file.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from orchestrator.host import eventlog
from tests.fixtures.sandbox import Sandbox, cmdline, get_json, sha256, wait_healthy, wait_until
from tests.test_faults import Link, hold_ready, read, release_dirs, story
from tests.test_faults import link as link  # noqa: F401 - the fixture, used by name


def deployed_then_held(box: Sandbox) -> tuple[Path, str, str]:
    """A good deploy over a hand-started server whose restart will wait for the ready file
    (held from now on): that file, the target's sha256 before the deploy, and after."""
    gate = hold_ready(box)
    original = sha256(box.server_args)
    gate.write_text("")  # the deploy's new server (same environment) comes up at once
    done = box.orch("deploy", "--host", "gpu", "--json", str(story(box, stable_for="0.2s")))  # short waits
    assert done.returncode == 0, done.stdout + done.stderr
    gate.unlink()  # from now on a server started again waits for the test
    return gate, original, sha256(box.server_args)


def rollback_release(box: Sandbox) -> Path:
    """The rollback's release, once its runner's restore has started the previous server again."""
    def started() -> Path | None:
        for d in release_dirs(box):
            if (d / "manifest.json").exists() and read(d / "manifest.json").get("kind") == "rollback" and any(
                    str(w.get("msg", "")).startswith("started pid") for w in eventlog.lines(str(d))):
                return d
        return None
    found: Path = wait_until(started, "the rollback's runner to start the previous server", 120)
    return found


def verdicts(release: Path) -> list[str]:
    return [str(w["verdict"]) for w in eventlog.lines(str(release)) if w.get("event") == "verdict"]


def test_the_rollbacks_controller_killed_mid_restore_the_runner_finishes_the_rollback(link: Link) -> None:
    box = link.box
    gate, original, patched = deployed_then_held(box)
    assert patched != original
    proc = box.start_orch("rollback", "--host", "gpu", "--json")
    release = rollback_release(box)
    runner = read(release / "runner.json")
    assert int(read(box.state_dir / "lock.json")["agent_pid"]) == runner["pid"]  # the lock is the runner's
    proc.send_signal(signal.SIGKILL)  # mid-restore: the previous server waits for its ready file
    proc.wait()
    gate.write_text("")
    wait_until(lambda: verdicts(release), "the runner's verdict", 120)
    assert verdicts(release) == ["confirmed"]
    record = read(release / "restored.json")
    assert record["by"] == "rollback" and record["ok"] is True
    assert sha256(box.server_args) == original
    wait_healthy(box.port, 60)
    assert cmdline(box.server_pid()) == box.hand_argv
    assert "speculative_disable_batch_threshold" not in get_json(box.port, "/get_server_info") or get_json(
        box.port, "/get_server_info")["speculative_disable_batch_threshold"] is None
    journal = read(box.state_dir / "journal.json")
    assert journal["release"] == release.name and journal["finished"] is True
    wait_until(lambda: not (box.state_dir / "lock.json").exists(), "the runner to give the lock back")
    assert read(box.state_dir / "state.json")["applied"] == []
    status = box.orch("status", "--host", "gpu")
    assert status.returncode == 0, status.stdout + status.stderr


def test_a_rollback_whose_restart_fails_is_exit_3_rollback_failed_and_restored_once(link: Link) -> None:
    box = link.box
    gate, original, _ = deployed_then_held(box)
    proc = box.start_orch("rollback", "--host", "gpu", "--json")
    release = rollback_release(box)
    pid = int((box.state_dir / "server.pid").read_text())
    # "started pid" is said once "go" is written; the held start's shell execs the server a
    # moment later (until then /proc shows the shell's argv, or none mid-exec)
    wait_until(lambda: cmdline(pid) == box.hand_argv, "the previous server's own program to run", 60)
    os.kill(pid, signal.SIGKILL)  # the previous server, started again, dies before it is healthy
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 3, out + err
    report = json.loads(out)["hosts"]["gpu"]
    assert report["outcome"] == "rollback_failed" and report["release"] == release.name, out
    assert "FAILED" in report["error"] and "Traceback" not in out + err
    ending = report["ending"]  # the same, as fields: which rollback, what it was, what its restore did
    assert ending["kind"] == "rollback_failed" and ending["release"] == release.name and ending["host"] == "gpu"
    # what it was is fields, not words: an undo, of releases this host has, the release current after it
    assert ending["did"] == "undid" and ending["releases"] and not ending["done"]["ok"], ending
    assert all((box.state_dir / "releases" / r).is_dir() for r in ending["releases"]), ending
    assert f"rolled back {', '.join(ending['releases'])}; current release: " in report["error"], ending
    assert verdicts(release) == ["rollback_failed"]
    record = read(release / "restored.json")
    assert record["by"] == "rollback" and record["ok"] is False  # the guard did not restore again
    assert not (release / "claim.json").exists() or read(release / "claim.json")["by"] == "rollback"
    assert sha256(box.server_args) == original  # the files were restored before the restart failed
    rows = json.loads(box.orch("history", "--host", "gpu", "--json").stdout)["hosts"]["gpu"]
    assert len([r for r in rows if r.get("kind") == "rollback"]) == 1, rows
    # the guard left nothing running, and `orch rollback` finishes what is unfinished
    gate.write_text("")
    back = box.orch("rollback", "--host", "gpu", "--json")
    assert back.returncode == 0, back.stdout + back.stderr
    wait_healthy(box.port, 60)
    assert cmdline(box.server_pid()) == box.hand_argv


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_mid_restore_stops_the_following_exit_3_and_the_runner_finishes_the_rollback(
        link: Link, sig: signal.Signals) -> None:
    """docs/CLI.md, "Signals": once a rollback is handed on, nothing is aborted — a Ctrl-C or a
    SIGTERM stops the following with one line naming the rollback and where its verdict is,
    `unreachable`, exit 3 (this run cannot say how it ends); the runner finishes it."""
    box = link.box
    gate, original, _patched = deployed_then_held(box)
    proc = box.start_orch("rollback", "--host", "gpu", "--json")
    release = rollback_release(box)  # its runner waits on the previous server's ready file
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, out + err
    report = json.loads(out)["hosts"]["gpu"]
    assert report["outcome"] == "unreachable" and report["release"] == release.name, report
    said = "interrupted (Ctrl-C)" if sig == signal.SIGINT else "SIGTERM"
    assert report["error"] == (f"{said}: orch stopped following rollback {release.name}, which its runner on the "
                               "host finishes; `orch status --follow --host gpu` gives the verdict"), report
    assert report["ending"] == {"kind": "stopped_following", "host": "gpu", "release": release.name, "run": "rollback",
                                "signame": None if sig == signal.SIGINT else "SIGTERM", "reconnecting": False}
    assert verdicts(release) == []  # nothing aborted: the runner still waits on the server
    gate.write_text("")
    wait_until(lambda: verdicts(release), "the runner's verdict", 120)
    assert verdicts(release) == ["confirmed"]
    assert read(release / "restored.json")["by"] == "rollback"
    assert sha256(box.server_args) == original
    follow = box.orch("status", "--follow", "--host", "gpu")
    assert follow.returncode == 0, follow.stdout + follow.stderr
    assert read(release / "reported.json")["by"]["command"] == "status --follow"
