"""``orch nightly`` end to end: the real CLI over real sshd, a git repository the test
makes from the stand-in tree, the real stand-in server started from ``current/``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from orchestrator.core.nightly import NightManifest
from orchestrator.standin import make_tree
from tests.fixtures.forkrun import run_orch
from tests.fixtures.proxy import TcpProxy
from tests.fixtures.sandbox import (
    REPO,
    Sandbox,
    cmdline,
    get_json,
    health_status,
    wait_healthy,
    wait_until,
)
from tests.test_cli import run_in_pty

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid"}
ANCHOR = "server_args = prepare_server_args(sys.argv[1:])"


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}, check=True)
    return done.stdout.strip()


PROBE = """\
probe:
  post: /generate
  json: {text: "night probe", sampling_params: {max_new_tokens: 4}}
  requests: 16
  concurrency: 8
"""


def spec_text(commit: str, *, extra_server_env: str = "", notify: str | None = None,
              source: str | None = None, sglang_root: str = "{{ build }}/python/sglang",
              python: str = "python3", keep_builds: int = 2, health_timeout: str = "1m",
              server_timeouts: str = "", probe: bool = True, install: str = "", stable_for: str = "0.5s") -> str:
    """The test's spec. Every night's server takes two switches from ``--var``: ``crash=1``
    (it fails at start) and ``never_ready=1`` (its health stays 503). It is ready as soon as it
    listens (``STANDIN_STARTUP_DELAY`` 0, not the stand-in's half second) and stable after
    ``stable_for`` (half a second: two polls or more at 0.2 s): no test here is about a slow
    start or a flapping server, and every night, switch back and rollback would wait them out."""
    source = source or f"git: {{repo: \"{{{{ source_repo }}}}\", commit: {commit}}}"
    return f"""\
name: test-nightly
source:
  {source}
builds_dir: "{{{{ builds_root }}}}"
vars:
  sglang_root: "{sglang_root}"
  threshold: 16
  crash: "0"
  never_ready: "0"
stack:
  - speculative-disable.yaml
  - local-logging.yaml
server:
  manager: process
  command: "{python} -m sglang.launch_server --model-path {{{{ model }}}} --port {{{{ port }}}} --speculative-algorithm EAGLE"
  flags: {{"--speculative-disable-batch-threshold": "{{{{ threshold }}}}"}}
  workdir: "{{{{ builds_dir }}}}/current"
  env: {{PYTHONPATH: "{{{{ builds_dir }}}}/current/python", PYTHONDONTWRITEBYTECODE: "1", STANDIN_CRASH_AT_START: "{{{{ crash }}}}", STANDIN_NEVER_READY: "{{{{ never_ready }}}}", STANDIN_STARTUP_DELAY: "0"{extra_server_env}}}
  {server_timeouts}
health:
  base_url: "http://127.0.0.1:{{{{ port }}}}"
  timeout: {health_timeout}
  interval: 0.2s
  stable_for: {stable_for}
  confirm_timeout: 1s
  checks:
    - get: /health
    - get: /get_server_info
      expect: {{speculative_disable_batch_threshold: "{{{{ threshold }}}}", log_requests: true}}
{PROBE if probe else ""}
keep_builds: {keep_builds}
{f"notify: {notify}" if notify else ""}
{f"install: [{json.dumps(install)}]" if install else ""}
"""


@dataclass
class NightBox:
    box: Sandbox
    src: Path
    builds: Path
    spec: Path
    commit: str

    @property
    def reports(self) -> Path:
        return self.box.root / "reports" / "gpu"

    def write_spec(self, commit: str | None = None, **kw: Any) -> None:
        if commit:
            self.commit = commit
        self.spec.write_text(spec_text(self.commit, **kw))

    def night(self, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
        proc = self.box.orch("nightly", str(self.spec), "--host", "gpu", "--json",
                             "--ssh-config", str(self.box.sshd.ssh_config), *args, timeout=300)
        try:
            data = json.loads(proc.stdout)
        except ValueError:
            raise AssertionError(proc.stdout + proc.stderr) from None
        return proc, data

    def commit_change(self, rel: str, old: str, new: str, message: str) -> str:
        path = self.src / rel
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new))
        git(self.src, "commit", "-qam", message)
        return git(self.src, "rev-parse", "HEAD")

    def current(self) -> str:
        return os.readlink(self.builds / "current")

    def manifest(self, report: dict[str, Any]) -> NightManifest:
        data = json.loads((self.reports / f"{report['build']}.json").read_text())
        return NightManifest.model_validate(data["manifest"])


@pytest.fixture
def nightbox(sandbox: Sandbox) -> Iterator[NightBox]:
    src = sandbox.root / "src"
    make_tree(src)
    git(src, "init", "-q")
    git(src, "add", "-A")
    git(src, "commit", "-qm", "the stand-in tree")
    commit = git(src, "rev-parse", "HEAD")
    builds = sandbox.root / "builds"
    sandbox.write_inventory(vars={"model": "/models/standin", "port": sandbox.port, "source_repo": str(src),
                                  "builds_root": str(builds)})
    playbooks = sandbox.root / "playbooks"
    playbooks.mkdir(exist_ok=True)
    for name in ("speculative-disable.yaml", "local-logging.yaml"):
        shutil.copy(REPO / "playbooks" / name, playbooks / name)
    shutil.copytree(REPO / "templates", sandbox.root / "templates")
    nb = NightBox(sandbox, src, builds, playbooks / "nightly.yaml", commit)
    nb.write_spec()
    yield nb


def svg_points(svg: Path, gid: str) -> int:
    """How many points the line with ``gid`` has in matplotlib's SVG."""
    root = ElementTree.parse(svg).getroot()
    for element in root.iter():
        if element.get("id") == gid:
            path = next(p for p in element.iter() if p.tag.endswith("path"))
            d = path.get("d", "")
            return d.count("L") + d.count("M")
    raise AssertionError(f"no element {gid} in {svg}")


def test_three_nights_same_manifest_flag_from_current_changes_named_and_charted(nightbox: NightBox) -> None:
    box = nightbox.box
    first, rep1 = nightbox.night()
    assert first.returncode == 0, first.stdout + first.stderr
    one = rep1["hosts"]["gpu"]
    assert one["outcome"] == "changed"
    assert nightbox.current() == one["build"]
    # the server runs from current/ with the patched code: the new flag and the second patch
    info = get_json(box.port, "/get_server_info")
    assert info["speculative_disable_batch_threshold"] == 16 and info["log_requests"] is True
    pid = box.server_pid()
    assert pid is not None
    assert Path(f"/proc/{pid}/cwd").resolve() == (nightbox.builds / one["build"]).resolve()
    assert cmdline(pid)[-2:] == ["--speculative-disable-batch-threshold", "16"]
    # stdout/stderr show the build streamed and every step
    assert "stack[1] local-logging.yaml" in first.stderr and "switching" in first.stderr

    second, rep2 = nightbox.night()
    assert second.returncode == 0, second.stdout + second.stderr
    two = rep2["hosts"]["gpu"]
    assert two["build"] != one["build"] and nightbox.current() == two["build"]
    m1, m2 = nightbox.manifest(one), nightbox.manifest(two)
    assert m1.comparable() == m2.comparable()  # identical but times, build name and probe
    assert (m1.build, m1.started) != (m2.build, m2.started)
    assert m1.probe and m2.probe and m1.probe["greedy_sha256"] == m2.probe["greedy_sha256"]
    assert [f.path for f in m2.files] == ["python/sglang/srt/server_args.py", "python/sglang/launch_server.py"]
    host_manifest = json.loads((nightbox.builds / two["build"] / "manifest.json").read_text())
    assert NightManifest.model_validate(host_manifest).comparable() == m2.comparable()
    svg = nightbox.reports / "trend.svg"
    svg_after_two = svg.read_bytes()
    assert svg_points(svg, "tokens_per_s") == 2

    new_commit = nightbox.commit_change("python/sglang/version.py", "0.0.0-standin", "0.0.1-standin",
                                        "a new upstream version")
    nightbox.write_spec(new_commit)
    third, rep3 = nightbox.night()
    assert third.returncode == 0, third.stdout + third.stderr
    three = rep3["hosts"]["gpu"]
    report = json.loads((nightbox.reports / f"{three['build']}.json").read_text())
    assert f"commit {m2.source.commit} -> {new_commit}" in report["changes"]
    assert any(c.startswith("spec test-nightly changed") for c in report["changes"])
    assert get_json(box.port, "/get_server_info")["version"] == "0.0.1-standin"
    page = (nightbox.reports / "index.html").read_text()
    assert new_commit in page and "trend.svg" in page
    nights = sorted(nightbox.reports.glob("*.json"))
    assert [p.stem for p in nights] == sorted([one["build"], two["build"], three["build"]])
    assert svg.read_bytes() != svg_after_two and svg_points(svg, "tokens_per_s") == 3
    assert svg_points(svg, "p99_ms") == 3
    # keep_builds: 2 -> the first night's build is pruned, never current or the previous good one
    kept = sorted(p.name for p in nightbox.builds.iterdir() if p.name not in ("current", "logs", ".cache"))
    assert kept == sorted([two["build"], three["build"]])
    # orch history lists the nights: kind, source, tokens/s
    hist = box.orch("history", "--host", "gpu", "--json")
    rows = json.loads(hist.stdout)["hosts"]["gpu"]
    assert [r["kind"] for r in rows] == ["night"] * 3
    assert rows[-1]["source"] == f"git {new_commit[:12]}"
    assert all(isinstance(r["tokens_per_s"], float) and r["tokens_per_s"] > 0 for r in rows)


def test_anchor_that_moved_fails_before_the_switch_while_the_old_night_serves(nightbox: NightBox) -> None:
    box = nightbox.box
    ok, rep = nightbox.night()
    assert ok.returncode == 0, ok.stdout + ok.stderr
    good = rep["hosts"]["gpu"]["build"]
    pid = box.server_pid()
    moved = nightbox.commit_change("python/sglang/launch_server.py", ANCHOR,
                                   "server_args = prepare_server_args(list(sys.argv[1:]))",
                                   "upstream moves on")
    notified = box.root / "notified.txt"
    nightbox.write_spec(moved, notify=f"\"sh -c 'env | grep ^ORCH_NIGHT_ > {notified}'\"")

    statuses: list[int | None] = []
    pids: list[int | None] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            statuses.append(health_status(box.port))
            pids.append(box.server_pid())
            time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        bad, data = nightbox.night()
    finally:
        stop.set()
        poller.join()
    assert bad.returncode == 2, bad.stdout + bad.stderr
    host = data["hosts"]["gpu"]
    assert host["outcome"] == "failed"
    assert "local-logging.yaml" in host["error"] and "files[0].edits[0].after" in host["error"]
    assert "launch_server.py" in host["error"] and ANCHOR in host["error"]
    assert len(statuses) > 5 and set(statuses) == {200} and set(pids) == {pid}  # served the whole time
    assert nightbox.current() == good
    assert sorted(p.name for p in nightbox.builds.iterdir() if p.name[0].isdigit()) == [good]
    report = json.loads((nightbox.reports / f"{host['build']}.json").read_text())
    assert report["outcome"] == "failed" and ANCHOR in report["error"]
    assert (nightbox.reports / f"{host['build']}.log").is_file()  # the build's log, kept beside the reports
    env = dict(line.split("=", 1) for line in notified.read_text().splitlines())
    assert env["ORCH_NIGHT_OUTCOME"] == "failed" and env["ORCH_NIGHT_EXIT_CODE"] == "2"
    assert env["ORCH_NIGHT_REPORT"] == str((nightbox.reports / f"{host['build']}.json").resolve())
    assert "local-logging.yaml" in env["ORCH_NIGHT_SUMMARY"]


def test_a_new_server_that_crashes_at_start_is_switched_back(nightbox: NightBox) -> None:
    box = nightbox.box
    ok, rep = nightbox.night()
    assert ok.returncode == 0, ok.stdout + ok.stderr
    good = rep["hosts"]["gpu"]["build"]
    good_argv = cmdline(box.server_pid())

    bad, data = nightbox.night("--var", "crash=1")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    host = data["hosts"]["gpu"]
    assert host["outcome"] == "rolled_back" and "server exited during start (code 1)" in host["error"]
    assert "STANDIN_CRASH_AT_START=1: the server fails at start" in bad.stderr  # its log, shown
    assert nightbox.current() == good
    assert health_status(box.port) == 200
    pid = box.server_pid()
    assert cmdline(pid) == good_argv
    assert Path(f"/proc/{pid}/environ").read_bytes().count(b"STANDIN_CRASH_AT_START=0") == 1
    # the restore machine ran the night's own plan, written before the switch
    release = box.state_dir / "releases" / host["build"]
    plan = json.loads((release / "restore.json").read_text())["plan"]
    assert plan["links"] == [{"path": str(nightbox.builds / "current"), "target": good, "expect": host["build"]}]
    assert plan["server"]["start"]["argv"] == good_argv
    record = json.loads((release / "restored.json").read_text())
    assert record["by"] == "runner" and record["ok"] and record["links"][0]["action"] == "restored"
    assert host["restore"]["links"][0] == record["links"][0]  # the host's record, as fields
    # what the console said, as fields (``core.events``): the failure, then the switch back
    said = {e["event"]: e for e in host["events"]}
    assert said["night_failed"]["switching_back"] is True and said["night_failed"]["level"] == "warning"
    assert said["switched_back"]["by"] == "runner" and said["switched_back"]["done"] == host["restore"]
    assert box.journal()["finished"] is True and box.journal()["step"] == "rolled_back"
    assert not (nightbox.builds / host["build"] / "manifest.json").exists()  # never a good night
    rows = json.loads(box.orch("history", "--host", "gpu", "--json").stdout)["hosts"]["gpu"]
    assert [r["outcome"] for r in rows] == ["current", "switched back"]


def server_build(box: Sandbox, builds: Path) -> tuple[list[str], str]:
    """The running server's argv, and the build its working directory is."""
    pid = box.server_pid()
    assert pid is not None
    return cmdline(pid), Path(f"/proc/{pid}/cwd").resolve().name


def test_orch_rollback_switches_a_night_back_then_one_further_and_never_to_a_pruned_build(
    nightbox: NightBox,
) -> None:
    box = nightbox.box
    nightbox.write_spec(keep_builds=3)
    builds: list[str] = []
    argvs: list[list[str]] = []
    flag = "--speculative-disable-batch-threshold"
    for threshold in (16, 24, 32, 40):  # each night its own flag: which one serves is plain to see
        proc, data = nightbox.night("--var", f"threshold={threshold}")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        night = data["hosts"]["gpu"]
        # --json's fields: the flag against the last good night's, and each step the night took
        assert night["flag_changes"] == ([{"flag": flag, "from": str(threshold - 8), "to": str(threshold)}]
                                         if builds else [])
        steps = [s["step"] for s in night["steps"]]
        assert steps == ["connect", "lock", "plan", "build", "patch", "backup", "restart", "health", "probe",
                         "confirm"]
        began = [(s["at"], s["seconds"]) for s in night["steps"]]
        assert all(at + took <= after + 0.01 for (at, took), (after, _) in zip(began, began[1:], strict=False))
        builds.append(night["build"])
        argvs.append(cmdline(box.server_pid()))
    assert not (nightbox.builds / builds[0]).exists()  # keep_builds: 3

    for back, threshold in ((2, 32), (1, 24)):
        proc = box.orch("rollback", "--host", "gpu", "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        host = json.loads(proc.stdout)["hosts"]["gpu"]
        assert host["outcome"] == "rolled_back" and host["current"] == builds[back]
        assert host["flag_changes"] == [{"flag": flag, "from": str(threshold + 8), "to": str(threshold)}]
        assert nightbox.current() == builds[back]
        wait_healthy(box.port, 60)
        argv, cwd = server_build(box, nightbox.builds)
        assert argv == argvs[back] and cwd == builds[back]
        assert get_json(box.port, "/get_server_info")["speculative_disable_batch_threshold"] == threshold
        link = host["restore"]["links"][0]
        assert (link["path"], link["target"], link["action"]) == (str(nightbox.builds / "current"), builds[back],
                                                                  "restored")

    # one further back is the first night, whose build keep_builds removed: refused, nothing touched
    pid = box.server_pid()
    refused = box.orch("rollback", "--host", "gpu", "--json")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    error = json.loads(refused.stdout)["hosts"]["gpu"]["error"]
    assert f"build {builds[0]} is no longer in {nightbox.builds}" in error
    assert nightbox.current() == builds[1] and box.server_pid() == pid and health_status(box.port) == 200
    rows = json.loads(box.orch("history", "--host", "gpu", "--json").stdout)["hosts"]["gpu"]
    assert [r["outcome"] for r in rows[:4]] == ["good; build pruned", "current", f"undone by {rows[5]['id']}",
                                                 f"undone by {rows[4]['id']}"]
    assert [r["kind"] for r in rows] == ["night"] * 4 + ["rollback"] * 2
    source = f"git {nightbox.commit[:12]}"
    assert all(r["source"] == source and r["tokens_per_s"] > 0 for r in rows[:4])

    # off a terminal: one line per release, kind after the outcome, then source and tok/s
    lines = box.orch("history", "--host", "gpu").stdout.splitlines()
    assert lines[0] == "history of gpu (6 releases)"
    assert lines[2].split()[5:7] == ["current", "night"] and f"source: {source}  tok/s: " in lines[2]
    # on an 80-column terminal: nothing wider, and no word broken
    code, text = run_in_pty(box, "history", "--host", "gpu")
    assert code == 0, text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    whole = [r["id"] for r in rows] + ["test-nightly", source, f"undone by {rows[4]['id']}",
                                       f"{rows[1]['tokens_per_s']:.1f} tok/s", f"undid {builds[3]}"]
    for words in whole:
        assert words in text, f"{words!r} is broken or missing in:\n{text}"


def test_a_build_killed_half_way_is_removed_when_its_night_is_closed_and_never_counts(
    nightbox: NightBox,
) -> None:
    """Issue 16.8: a good build was pruned in the place of one a killed night left half-made."""
    box = nightbox.box
    nightbox.write_spec(keep_builds=3, probe=False)
    good = []
    for _ in range(2):
        proc, data = nightbox.night()
        assert proc.returncode == 0, proc.stdout + proc.stderr
        good.append(data["hosts"]["gpu"]["build"])
    held, go = box.root / "installing", box.root / "go"
    nightbox.write_spec(keep_builds=3, probe=False,
                        install=f"sh -c 'touch {held}; while [ ! -e {go} ]; do sleep 0.05; done'")
    proc = box.start_orch("nightly", str(nightbox.spec), "--host", "gpu", "--json")
    wait_until(held.exists, "the night's install, held")  # the source is checked out, the install runs
    half = box.journal()["release"]
    assert box.journal()["step"] == "building" and (nightbox.builds / half / "python").is_dir()
    proc.send_signal(signal.SIGKILL)  # the controller dies half-way through the build
    proc.wait()
    wait_until(lambda: not (box.state_dir / "lock.json").exists(), "the helper to give the lock back", 120)
    refused, _ = nightbox.night()
    assert refused.returncode == 2 and "never finished" in refused.stdout  # the night is not closed yet
    closed = box.orch("rollback", "--host", "gpu", "--json")
    assert closed.returncode == 0, closed.stdout + closed.stderr
    assert not (nightbox.builds / half).exists()  # closed: the half-made build is gone
    assert (nightbox.builds / "logs" / f"{half}.log").exists()  # its log is kept
    nightbox.write_spec(keep_builds=3, probe=False)
    proc, data = nightbox.night()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # three good builds, keep_builds 3: none pruned
    assert sorted(p.name for p in nightbox.builds.iterdir() if p.name not in ("current", "logs", ".cache")) \
        == sorted([*good, data["hosts"]["gpu"]["build"]])


def test_a_half_made_build_left_behind_never_takes_a_good_builds_place(nightbox: NightBox) -> None:
    """Issue 16.8: a build left half-made (by a night killed before this was fixed, or whose
    closing could not remove it) is not counted by keep_builds, and goes at the next good night."""
    nightbox.write_spec(keep_builds=3, probe=False)
    good = []
    for _ in range(2):
        proc, data = nightbox.night()
        assert proc.returncode == 0, proc.stdout + proc.stderr
        good.append(data["hosts"]["gpu"]["build"])
    half = nightbox.builds / (good[-1][:-8] + "5-abcdef0")  # sorts after the good builds: newer
    (half / "python").mkdir(parents=True)
    proc, data = nightbox.night()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    good.append(data["hosts"]["gpu"]["build"])
    assert not half.exists()  # it went, and the oldest good build stayed in its place
    assert all((nightbox.builds / b).is_dir() for b in good)
    assert "pruned 1 old build(s)" in proc.stderr and half.name in proc.stderr


def test_ctrl_c_while_a_night_arms_closes_it_at_once(nightbox: NightBox) -> None:
    """Issue 16.6 for a night: a Ctrl-C while the watchdog is being armed closes the night at
    once (journal, watchdog, build), never leaving it to the watchdog's deadline.

    Held from outside: a link slow enough (0.5 s each way) that the proxy is stalled
    while the arming's answer is on its way; the link comes back once orch's cancel
    has been written into it. The link turns slow while the night's build is held at
    its install (before that it has the fault suite's 20 ms): from there to the arming
    every answer crosses the slow link."""
    box = nightbox.box
    nightbox.write_spec(keep_builds=3, probe=False)
    ok, data = nightbox.night()
    assert ok.returncode == 0, ok.stdout + ok.stderr
    good = data["hosts"]["gpu"]["build"]
    pid = box.server_pid()
    held, go = box.root / "installing", box.root / "go"
    nightbox.write_spec(keep_builds=3, probe=False,
                        install=f"sh -c 'touch {held}; while [ ! -e {go} ]; do sleep 0.05; done'")
    proxy = TcpProxy(box.sshd.port, delay=0.02)
    try:
        known = box.root / "known_hosts_proxy"
        known.write_text(f"[127.0.0.1]:{proxy.port} {box.sshd.host_key_pub}\n")
        box.write_inventory(port=proxy.port, known_hosts=str(known), vars={
            "model": "/models/standin", "port": box.port, "source_repo": str(nightbox.src),
            "builds_root": str(nightbox.builds)})
        proc = box.start_orch("nightly", str(nightbox.spec), "--host", "gpu", "--json")
        wait_until(held.exists, "the night's install, held", 240)
        assert box.journal().get("step") == "building"  # nothing armed yet
        proxy.set_delay(0.5)
        go.write_text("")
        wait_until(lambda: box.journal().get("step") == "armed", "the night armed on the host", 240)
        proxy.stall()
        night = box.journal()["release"]
        pid_file = box.state_dir / "releases" / night / "watchdog.pid"
        # the journal says armed a moment before the same batch starts the watchdog
        wait_until(lambda: pid_file.read_text().strip() if pid_file.exists() else None, "the watchdog", 60)
        watchdog = int(pid_file.read_text())
        sent = proxy.client_bytes()
        proc.send_signal(signal.SIGINT)
        wait_until(lambda: proxy.client_bytes() > sent, "orch's cancel, written into the held link")
        proxy.unstall()
        proxy.set_delay(0.02)  # the route is back, as fast as before the fault
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 1, out + err
        rep = json.loads(out)["hosts"]["gpu"]
        assert rep["outcome"] == "failed" and "nothing live was touched" in rep["error"], rep
        journal = box.journal()
        assert journal["release"] == night and journal["finished"] is True, journal

        def watchdog_gone() -> bool:
            try:
                return "orch-watchdog" not in Path(f"/proc/{watchdog}/comm").read_text()
            except OSError:
                return True

        wait_until(watchdog_gone, "the watchdog to leave", 30)
        assert nightbox.current() == good and box.server_pid() == pid
        assert not (nightbox.builds / night).exists()
        record = json.loads((box.state_dir / "releases" / night / "manifest.json").read_text())
        assert record["outcome"] == "failed"
        status = box.orch("status", "--host", "gpu")
        assert status.returncode == 0, status.stdout + status.stderr
    finally:
        proxy.close()


def test_the_runner_switches_a_night_back_when_the_controller_dies(nightbox: NightBox) -> None:
    """kill -9 of the controller after the switch, its new server held unhealthy: the host's
    runner points ``current`` back and restarts the previous command line by itself."""
    box = nightbox.box
    proxy = TcpProxy(box.sshd.port, delay=0.02)  # a link with real latency, as the fault suite's
    try:
        known = box.root / "known_hosts_proxy"
        known.write_text(f"[127.0.0.1]:{proxy.port} {box.sshd.host_key_pub}\n")
        box.write_inventory(port=proxy.port, known_hosts=str(known), vars={
            "model": "/models/standin", "port": box.port, "source_repo": str(nightbox.src),
            "builds_root": str(nightbox.builds)})
        nightbox.write_spec(health_timeout="20s", server_timeouts="stop_timeout: 5s\n  free_timeout: 5s",
                            probe=False)
        ok, rep = nightbox.night()
        assert ok.returncode == 0, ok.stdout + ok.stderr
        good = rep["hosts"]["gpu"]["build"]
        good_argv, _ = server_build(box, nightbox.builds)

        # the night that never gets healthy: its timeout only needs to outlast the test's
        # sight of the new server held unhealthy and the kill (a few polls), not 20 s
        nightbox.write_spec(health_timeout="8s", server_timeouts="stop_timeout: 5s\n  free_timeout: 5s",
                            probe=False)
        proc = box.start_orch("nightly", str(nightbox.spec), "--host", "gpu", "--json", "--var", "never_ready=1")

        def switched_and_held() -> bool:
            return (box.journal().get("step") == "switching" and nightbox.current() != good
                    and health_status(box.port) == 503)

        wait_until(switched_and_held, "the new server up and held unhealthy")
        proc.send_signal(signal.SIGKILL)  # the controller dies: nobody but the host can switch back
        proc.wait()
        bad = box.journal()["release"]
        assert nightbox.current() == bad
        wait_until(lambda: box.journal().get("finished") is True, "the runner to switch back", 240)

        assert nightbox.current() == good
        wait_healthy(box.port, 60)
        argv, cwd = server_build(box, nightbox.builds)
        assert argv == good_argv and cwd == good
        assert Path(f"/proc/{box.server_pid()}/environ").read_bytes().count(b"STANDIN_NEVER_READY=0") == 1
        record = json.loads((box.state_dir / "releases" / bad / "restored.json").read_text())
        assert record["by"] == "runner" and record["ok"] is True
        assert record["links"][0]["action"] == "restored" and record["server"]["action"] == "restarted"
        assert box.journal()["finished"] is True
        rows = json.loads(box.orch("history", "--host", "gpu", "--json").stdout)["hosts"]["gpu"]
        assert [r["outcome"] for r in rows] == ["current", "switched back"]
    finally:
        proxy.close()


def make_wheel(folder: Path, tree: Path, name: str, version: str) -> Path:
    """A pure-Python wheel of ``tree/sglang`` (the stand-in package), by hand."""
    stem = name.replace("-", "_")  # a wheel's file and dist-info names use underscores
    dist = f"{stem}-{version}.dist-info"
    files: dict[str, bytes] = {}
    for path in sorted((tree / "sglang").rglob("*.py")):
        files[path.relative_to(tree).as_posix()] = path.read_bytes()
    files[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: orch-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for rel, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{rel},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = folder / f"{stem}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for rel, data in files.items():
            info = zipfile.ZipInfo(rel, date_time=(2026, 1, 1, 0, 0, 0))
            archive.writestr(info, data)
    return wheel


def test_pip_source_pinned_with_hashes_installs_without_an_index(nightbox: NightBox) -> None:
    box = nightbox.box
    wheels = box.root / "wheels"
    wheels.mkdir()
    wheel = make_wheel(wheels, nightbox.src / "python", "standin-sglang", "0.0.1")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (nightbox.spec.parent / "requirements.lock.txt").write_text(
        f"# the stand-in, as a wheel\nstandin-sglang==0.0.1 \\\n    --hash=sha256:{digest}\n")
    site = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    nightbox.write_spec(
        source=("pip: {requirements: requirements.lock.txt, no_index: true, "
                f"find_links: [{wheels}], python: {sys.executable}}}"),
        sglang_root=f"{{{{ build }}}}/.venv/{site}/sglang",
        python="{{ builds_dir }}/current/.venv/bin/python",
    )
    proc, data = nightbox.night()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    host = data["hosts"]["gpu"]
    manifest = nightbox.manifest(host)
    assert manifest.source.kind == "pip"
    assert [(p.name, p.version, p.hashes) for p in manifest.source.packages] == [
        ("standin-sglang", "0.0.1", [digest])]
    assert [f.path for f in manifest.files] == [f".venv/{site}/sglang/srt/server_args.py",
                                                f".venv/{site}/sglang/launch_server.py"]
    pid = box.server_pid()
    assert cmdline(pid)[0] == str(nightbox.builds / "current" / ".venv" / "bin" / "python")
    assert get_json(box.port, "/get_server_info")["speculative_disable_batch_threshold"] == 16
    assert (nightbox.builds / host["build"] / "requirements.lock.txt").read_text().count(digest) == 1


def test_drift_is_named_and_blocks_the_next_night_and_frozen_names_a_template(nightbox: NightBox) -> None:
    box = nightbox.box
    ok, rep = nightbox.night()
    assert ok.returncode == 0, ok.stdout + ok.stderr
    frozen, _ = nightbox.night("--frozen")
    assert frozen.returncode == 0, frozen.stdout + frozen.stderr  # nothing differs: --frozen builds

    patched = nightbox.builds / "current" / "python" / "sglang" / "launch_server.py"
    patched.write_text(patched.read_text() + "# a hand edit on the box\n")
    status = box.orch("status", "--host", "gpu", "--json")
    drift = json.loads(status.stdout)["hosts"]["gpu"]["drift"]
    assert drift == [f"{nightbox.builds}/current/python/sglang/launch_server.py"]

    before = nightbox.current()
    blocked, data = nightbox.night()
    assert blocked.returncode == 2, blocked.stdout + blocked.stderr
    assert "python/sglang/launch_server.py" in data["hosts"]["gpu"]["error"]
    assert "--force" in data["hosts"]["gpu"]["error"] and nightbox.current() == before
    forced, _ = nightbox.night("--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert nightbox.current() != before

    flags, data = nightbox.night("--frozen", "--var", "threshold=24")
    assert flags.returncode == 2, flags.stdout + flags.stderr
    assert "flag --speculative-disable-batch-threshold: 16 -> 24" in data["hosts"]["gpu"]["error"]
    template = box.root / "templates" / "flags" / "field.py.j2"  # what add_flag renders the field from
    template.write_text(template.read_text().rstrip("\n") + "  # changed\n")
    refused, data = nightbox.night("--frozen")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "template flags/field.py.j2 changed" in data["hosts"]["gpu"]["error"]


def test_bad_spec_is_refused_before_any_host_is_touched(nightbox: NightBox) -> None:
    nightbox.spec.write_text(spec_text("main"))
    proc, data = nightbox.night()
    assert proc.returncode == 2
    assert data["exit_code"] == 2 and data["hosts"] == {}
    assert "nightly.yaml:3: source.git.commit: a full 40-hex commit id (got: 'main')" in data["error"]
    assert not nightbox.builds.exists() and not nightbox.box.state_dir.exists()


@pytest.fixture
def saved_crontab() -> Iterator[bytes | None]:
    got = subprocess.run(["crontab", "-l"], capture_output=True)
    original = got.stdout if got.returncode == 0 else None
    try:
        yield original
    finally:
        if original is None:
            subprocess.run(["crontab", "-r"], capture_output=True)
        else:
            subprocess.run(["crontab", "-"], input=original, check=True)


def test_schedule_runs_under_cron_bare_env_and_unschedule_restores_the_crontab(
    nightbox: NightBox, saved_crontab: bytes | None
) -> None:
    box = nightbox.box
    mine = b"# someone's own lines, kept byte for byte\nMAILTO=\"\"\n0  4 * * *   /bin/true  # odd  spacing\n"
    subprocess.run(["crontab", "-"], input=mine, check=True)
    inventory = box.root / "inventory.yaml"
    sched = box.orch("nightly", "--schedule", "0 3 31 2 *", str(nightbox.spec), "--host", "gpu",
                     "-i", str(inventory), "--ssh-config", str(box.sshd.ssh_config), "--json")
    assert sched.returncode == 0, sched.stdout + sched.stderr
    installed = subprocess.run(["crontab", "-l"], capture_output=True, check=True).stdout
    assert installed.startswith(mine)
    listed = json.loads(box.orch("nightly", "--list-schedules", "--json").stdout)["schedules"]
    assert len(listed) == 1 and listed[0]["schedule"] == "0 3 31 2 *"
    command = listed[0]["command"]
    assert command.split()[0] == "cd" and sys.executable in command

    home = os.environ.get("HOME", "/root")
    ran = subprocess.run(["env", "-i", f"HOME={home}", "PATH=/usr/bin:/bin", "sh", "-c", command],
                         cwd="/", capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr + (box.root / "reports" / "cron.log").read_text()
    nights = list(nightbox.reports.glob("*.json"))
    assert len(nights) == 1 and json.loads(nights[0].read_text())["outcome"] == "changed"
    assert health_status(box.port) == 200

    unsched = box.orch("nightly", "--unschedule", str(nightbox.spec), "--host", "gpu")
    assert unsched.returncode == 0, unsched.stdout + unsched.stderr
    assert subprocess.run(["crontab", "-l"], capture_output=True, check=True).stdout == mine
    assert shlex.split(command)  # the entry was one shell line


def demo_servers(where: Path | None = None) -> set[int]:
    """Stand-in servers whose environment names a nightly demo's sandbox (under ``where``: a
    demo run with ``TMPDIR=where``, so that demos other tests run at the same time don't count)."""
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes()
            env = Path(f"/proc/{name}/environ").read_bytes()
        except OSError:
            continue
        if b"sglang.launch_server" in argv and b"orch-nightly-demo-" in env and str(where or "").encode() in env:
            found.add(int(name))
    return found


def test_orch_demo_nightly_runs_its_nights_and_stops_everything(tmp_path: Path) -> None:
    """The plain (not --keep) demo: its nights, everything stopped, and no file it deletes named.
    The suite's one plain `orch demo nightly` run (test_nightly_report.py's tests use a kept one)."""
    before = demo_servers(tmp_path)
    proc = run_orch(["demo", "nightly", "--json"], cwd=tmp_path, timeout=600,
                          env=dict(os.environ, COLUMNS="120", NO_COLOR="1", TMPDIR=str(tmp_path)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    steps = report["steps"]
    assert [steps[k]["outcome"] for k in ("night 1", "night 2", "night 3", "night 4", "rollback")] == [
        "changed", "changed", "changed", "rolled_back", "rolled_back"]
    assert steps["night 4"]["exit_code"] == 1 and "server exited during start" in steps["night 4"]["error"]
    err = proc.stderr
    assert "the two manifests are identical but for times, build name and probe: True" in err
    assert "changed since the last good night: commit " in err
    assert f"current -> {steps['night 2']['build']} (night 2)" in err
    assert "demo finished as expected" in err
    assert demo_servers(tmp_path) - before == set(), "the demo left a server running"
    # without --keep the sandbox is deleted: no path into it is named, nor the page or chart
    out = proc.stdout + proc.stderr
    assert "<sandbox>/builds/" in out
    named = re.findall(r"(/\S*orch-nightly-demo-\S*)", out)
    assert named == [], named
    assert "trend.svg" not in out and "index.html" not in out
    assert report["sandbox"] is None
