"""After the commit the host's runner carries the release to its verdict (issue 19): a dead
controller changes nothing, a dead runner is restored by its guard at once, a Ctrl-C aborts
the runner, which restores. Over real sshd behind the 20 ms proxy, with the stand-in server;
each step is held from outside by a ``before_stop`` hook that waits for a file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.host import eventlog
from tests.fixtures.sandbox import Sandbox, cmdline, get_json, sha256, wait_until
from tests.test_faults import Link, finish, read, story
from tests.test_faults import link as link  # noqa: F401 - the fixture, used by name


def held(box: Sandbox, hold: Path, name: str = "held.yaml") -> Path:
    """The story, with a ``before_stop`` hook that waits until ``hold`` exists."""
    path = story(box, name)
    spec = yaml.safe_load(path.read_text())
    spec["server"]["before_stop"] = f"sh -c 'while [ ! -e {hold} ]; do sleep 0.1; done'"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def held_at_before_stop(box: Sandbox) -> Path:
    """The release's directory once its runner waits in the hook (the journal says restarting)."""
    journal = box.state_dir / "journal.json"
    wait_until(lambda: journal.exists() and read(journal).get("step") == "restarting", timeout=120,
               what="the runner to reach the before_stop hook")
    return box.state_dir / "releases" / read(journal)["release"]


def start_held(box: Sandbox, *args: str) -> tuple[subprocess.Popen[str], Path, Path, str]:
    """A deploy (with ``args``) whose runner waits in its ``before_stop`` hook: the controller,
    the release, the file that lets the hook go, and the target's sha256 before."""
    box.start_by_hand()
    original = sha256(box.server_args)
    hold = box.root / "go"
    proc = box.start_orch("deploy", "--host", "gpu", "--json", *args, str(held(box, hold)))
    return proc, held_at_before_stop(box), hold, original


def outcome(release: Path) -> str:
    return str(read(release / "manifest.json").get("outcome"))


def test_controller_killed_at_before_stop_the_runner_makes_the_release_current(link: Link) -> None:
    box = link.box
    proc, release, hold, original = start_held(box)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # the runner holds the lock: a deploy from this same machine is refused as in progress
    refused = box.orch("deploy", "--host", "gpu", str(story(box, "other.yaml", threshold=8)))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"release {release.name} in progress" in refused.stdout + refused.stderr
    hold.write_text("")
    wait_until(lambda: outcome(release) == "deployed", timeout=180, what="the runner to confirm alone")
    assert sha256(box.server_args) != original
    assert get_json(box.port, "/get_server_info")["speculative_disable_batch_threshold"] == 32
    assert "--speculative-disable-batch-threshold" in cmdline(box.server_pid())
    journal = read(box.state_dir / "journal.json")
    assert journal["step"] == "confirmed" and journal["finished"] is True
    assert not (release / "restored.json").exists()
    wait_until(lambda: not (box.state_dir / "lock.json").exists(), what="the runner to give the lock back")
    manifest = read(release / "manifest.json")
    assert {"restart", "health", "confirm"} <= {s["step"] for s in manifest["steps"]}
    assert read(box.state_dir / "state.json")["applied"][-1] == release.name
    status = box.orch("status", "--host", "gpu")
    assert status.returncode == 0, status.stdout + status.stderr
    assert release.name in status.stdout


def test_runner_killed_the_guard_restores_at_once(link: Link) -> None:
    box = link.box
    proc, release, hold, original = start_held(box)
    runner = read(release / "runner.json")
    os.kill(runner["pid"], signal.SIGKILL)
    code, report, out = finish(proc)
    assert code == 1, out
    assert report["outcome"] == "rolled_back", out
    record = read(release / "restored.json")
    assert record["by"] == "guard" and record["ok"] is True
    assert outcome(release) == "rolled_back"
    assert sha256(box.server_args) == original
    assert cmdline(box.server_pid()) == box.hand_argv
    assert not (box.state_dir / "lock.json").exists()
    verdicts = [w for w in eventlog.lines(str(release)) if w.get("event") == "verdict"]
    assert [v["verdict"] for v in verdicts] == ["restored"]
    assert "the runner was killed (signal 9)" in read(release / "manifest.json")["error"]


def test_ctrl_c_after_the_commit_aborts_the_runner_which_restores(link: Link) -> None:
    box = link.box
    proc, release, hold, original = start_held(box)
    proc.send_signal(signal.SIGINT)
    code, report, out = finish(proc)
    assert code == 1, out
    assert report["outcome"] == "rolled_back", out
    assert read(release / "restored.json")["by"] == "runner"
    assert sha256(box.server_args) == original
    assert cmdline(box.server_pid()) == box.hand_argv
    assert not hold.exists()  # nothing let the hook go: the abort stopped it


def test_status_follow_from_a_second_controller_gives_the_verdict_and_no_secret(link: Link) -> None:
    from tests.test_secrets import SECRET, SECRETS, playbook

    box = link.box
    box.start_by_hand()
    hold = box.root / "go"
    path = Path(playbook(box, "secret.yaml"))
    spec = yaml.safe_load(path.read_text())
    spec["server"]["before_stop"] = f"sh -c 'while [ ! -e {hold} ]; do sleep 0.1; done'"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    proc = box.start_orch("deploy", "--host", "gpu", "--json", "--var", f"hub_access={SECRET}", str(path))
    release = held_at_before_stop(box)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # another controller, without the playbook: it follows the release from its start
    follower = box.start_orch("status", "--follow", "--host", "gpu", "--json")
    wait_until(lambda: (release / "events.jsonl").exists(), what="the runner's log")
    hold.write_text("")
    out, err = follower.communicate(timeout=240)
    assert follower.returncode == 0, out + err
    report = json.loads(out)["hosts"]["gpu"]
    assert report.get("outcome") == "changed" and report.get("release") == release.name, out
    for secret in SECRETS:
        assert secret not in out + err
    assert outcome(release) == "deployed"
    assert read(release / "reported.json")["by"]["command"] == "status --follow"
    # no record of the release but the program and the restore plan holds a secret value (the
    # copy of the patched file holds it: this playbook writes it into that file)
    holding = sorted(str(p.relative_to(release)) for p in release.rglob("*") if p.is_file()
                     and any(s.encode() in p.read_bytes() for s in SECRETS))
    assert holding == ["files/0.after", "program.json", "restore.json"], holding
    # both followers (the killed controller's helper, then this one) took their doorbells away
    wait_until(lambda: not any((release / eventlog.DOORBELLS).iterdir()), what="no follower's doorbell left")
    # reported: a second follow has nothing to follow
    again = box.orch("status", "--follow", "--host", "gpu")
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"nothing in progress (last: {release.name}, deployed)" in again.stdout


def test_sigterm_after_the_commit_stops_following_and_aborts_nothing(link: Link) -> None:
    box = link.box
    proc, release, hold, original = start_held(box)
    proc.send_signal(signal.SIGTERM)
    code, report, out = finish(proc)
    assert code == 3, out
    assert report["outcome"] == "unreachable" and report["release"] == release.name, out
    assert report["error"].startswith(f"SIGTERM: orch stopped following release {release.name}")
    assert "`orch status --follow --host gpu`" in report["error"] and "Traceback" not in out
    # nothing was aborted: the runner waits in the hook, then finishes the release
    assert outcome(release) == "in_progress" and not (release / "restored.json").exists()
    hold.write_text("")
    wait_until(lambda: outcome(release) == "deployed", timeout=180, what="the runner to confirm")
    assert sha256(box.server_args) != original


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["sigterm", "sighup"])
def test_sigterm_before_the_commit_is_failed_and_changes_nothing(link: Link, sig: signal.Signals) -> None:
    """docs/CLI.md, "Signals": before the commit a SIGTERM or SIGHUP ends the run as a Ctrl-C
    does, and the run names the signal it got: a service manager, ``timeout`` or a closed SSH
    session sent it, not a person at the keys (it was said as "interrupted (Ctrl-C)")."""
    box = link.box
    box.start_by_hand()
    original = sha256(box.server_args)
    go = box.root / "go"
    wait = f"sh -c 'while [ ! -e {go} ]; do sleep 0.05; done'"
    proc = box.start_orch("deploy", "--host", "gpu", "--json", str(story(box, validate=[wait])))
    wait_until(lambda: list(box.server_args.parent.glob(".server_args.orch-staged-*.py")), "the staged copy")
    proc.send_signal(sig)
    go.write_text("")
    code, report, out = finish(proc)
    assert code == 1, out
    assert report["outcome"] == "failed" and "Traceback" not in out, out
    assert report["error"].startswith(f"stopped by {sig.name}"), report["error"]
    assert f"stopped by {sig.name}: stopping the hosts at work" in out
    assert "Ctrl-C" not in out, out
    assert sha256(box.server_args) == original
    assert cmdline(box.server_pid()) == box.hand_argv
    wait_until(lambda: not list(box.server_args.parent.glob(".server_args.orch-staged-*.py")),
               "the staged copy to go")


def test_link_severed_after_the_commit_the_controller_reconnects_and_exits_with_the_verdict(link: Link) -> None:
    box = link.box
    proc, release, hold, original = start_held(box)
    connections = link.proxy.connections
    link.proxy.sever()  # the controller's connection dies; new ones get through
    hold.write_text("")
    code, report, out = finish(proc)
    assert code == 0, out
    assert report["outcome"] == "changed" and report["release"] == release.name, out
    assert "connecting again to follow it" in out
    assert link.proxy.connections > connections  # it did connect again
    assert outcome(release) == "deployed" and sha256(box.server_args) != original
    assert read(release / "reported.json")["by"]["command"] == "deploy"


def test_ctrl_c_while_reaching_the_host_again_stops_following_exit_3_and_the_runner_finishes(link: Link) -> None:
    """The link was lost after the commit and the controller is trying to reach the host again:
    a Ctrl-C there cannot ask the runner to abort (no link), and must not be taken for a failure
    before the commit. It stops the following, in one line naming the release and where its
    verdict is (exit 3); the runner, which nothing told, finishes the release by itself."""
    box = link.box
    box.start_by_hand()
    original = sha256(box.server_args)
    hold = box.root / "go"
    # a pipe read as it comes (the controller's line that it is reaching the host again)
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "deploy", "--host", "gpu", "--json", "--connect-timeout", "2.4",
         str(held(box, hold)), "--ssh-config", str(box.sshd.ssh_config)],
        cwd=box.root, env=dict(os.environ, COLUMNS="200", NO_COLOR="1", **box.extra_env),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    release = held_at_before_stop(box)
    link.proxy.refuse()  # every try to connect again is refused: the controller waits between tries
    assert proc.stderr is not None
    said = []
    for line in proc.stderr:
        said.append(line)
        if "connecting again to follow it" in line:
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 3, "".join(said) + err
    report = json.loads(out)["hosts"]["gpu"]
    assert report["outcome"] == "unreachable", out
    assert f"while reaching the host again: orch stopped following release {release.name}" in report["error"]
    assert "`orch status --follow --host gpu`" in report["error"]
    assert report["ending"] == {"kind": "stopped_following", "host": "gpu", "release": release.name,
                                "run": "deploy", "signame": None, "reconnecting": True}
    assert "Traceback" not in err
    assert outcome(release) == "in_progress"  # nothing aborted it
    hold.write_text("")
    wait_until(lambda: outcome(release) == "deployed", timeout=120, what="the runner to confirm by itself")
    assert sha256(box.server_args) != original
    wait_until(lambda: box.server_pid() is not None, timeout=60, what="the new server")
    assert cmdline(box.server_pid()) != box.hand_argv


def test_reconnects_refused_exit_3_then_status_follow_gives_the_verdict(link: Link) -> None:
    box = link.box
    box.start_by_hand()
    hold = box.root / "go"
    proc = box.start_orch("deploy", "--host", "gpu", "--json", "--connect-timeout", "2.4", str(held(box, hold)))
    release = held_at_before_stop(box)
    link.proxy.refuse()  # the route is gone: every new connection is refused (tries at 0, 5, 10 s of 14.4)
    code, report, out = finish(proc)
    assert code == 3, out
    assert report["outcome"] == "unreachable", out
    assert "the host finishes it by itself" in report["error"]
    assert "`orch status --follow --host gpu`" in report["error"]
    # the same ending as fields (``core.endings``): which release, and when its backstop acts
    ending = report["ending"]
    assert ending["kind"] == "lost_after_commit" and ending["release"] == release.name, ending
    assert ending["host"] == "gpu" and ending["run"] == "deploy" and isinstance(ending["backstop_at"], float)
    assert ending["reason"] in report["error"]
    assert outcome(release) == "in_progress"  # nothing was aborted
    box.write_inventory()  # the route back (straight to sshd)
    follower = box.start_orch("status", "--follow", "--host", "gpu", "--json")
    hold.write_text("")
    out, err = follower.communicate(timeout=240)
    assert follower.returncode == 0, out + err
    assert json.loads(out)["hosts"]["gpu"]["outcome"] == "changed"
    assert outcome(release) == "deployed"


def test_a_followers_watch_on_the_runner_names_that_one_process(tmp_path: Path) -> None:
    """``RunnerWatch`` keeps the runner's ``/proc/<pid>/stat`` open: alive while the process
    runs, not once it has ended (a zombie, then reaped), and never a process whose start
    time is not the one ``runner.json`` records (a reused pid)."""
    from orchestrator.host.files import write_json
    from orchestrator.host.processes import proc_starttime
    from orchestrator.host.runner import RUNNER_FILE, RunnerWatch

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    watch = RunnerWatch(str(tmp_path))
    try:
        assert not watch.alive()  # no runner.json yet: asked the old way, and it names no one
        write_json(str(tmp_path / RUNNER_FILE), {"pid": child.pid, "starttime": proc_starttime(child.pid)})
        assert watch.alive() and watch.watch.fd is not None
        child.stdin.close()  # type: ignore[union-attr]
        wait_until(lambda: not watch.alive(), "the watch to see the ended child (a zombie until reaped)")
        child.wait(30)
        assert not watch.alive()  # reaped: the open file reads no process
    finally:
        watch.close()
        child.kill()
        child.wait(30)
    me = os.getpid()
    write_json(str(tmp_path / RUNNER_FILE), {"pid": me, "starttime": (proc_starttime(me) or 0) + 1})
    other = RunnerWatch(str(tmp_path))
    try:
        assert not other.alive() and other.watch.fd is None  # a live pid, but not the process recorded
    finally:
        other.close()
