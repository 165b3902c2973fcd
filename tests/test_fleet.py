"""Fleets over several REAL sshd hosts on loopback (tests/fixtures/fleet.py).

Each host is its own sshd on its own 127.0.40.x address with its own tree,
state dir and stand-in server, so "never connected" is read from that
host's own sshd log, "byte-identical" from its own files, and "in flight"
from its own release records. The real ``orch`` CLI runs in a subprocess.
No test asserts a duration; order is read from the output and the records.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.fleet import Fleet, FleetHost, in_parallel
from tests.fixtures.sandbox import SHIPPED_SPEC, quick_stability, wait_healthy

ORIGINAL_FLAG = None  # the hand-started servers run without the flag

STORY = quick_stability(SHIPPED_SPEC, "1s").replace(
    "vars:\n  threshold: 32\n  port: 30000\n",
    'vars:\n  threshold: 32\n  port: 30000\n  exit_after: 0\n  crash: 0\n',
).replace(
    "server:\n  manager: process\n",
    'server:\n  manager: process\n  env: {STANDIN_EXIT_AFTER_ANSWERED: "{{ exit_after }}", '
    'STANDIN_CRASH_AT_START: "{{ crash }}"}\n',
).replace("  interval: 1s\n", "  interval: 0.2s\n")
"""The story's playbook; a host var ``exit_after: S`` makes that host's new server die S
seconds after it first answered a full health poll, ``crash: 1`` makes it fail at start."""


def write_story(fleet: Fleet, stable_for: str = "1s") -> Path:
    """The story in the test's directory; ``stable_for``: its health's stability window."""
    assert "STANDIN_EXIT_AFTER_ANSWERED" in STORY and "exit_after: 0" in STORY and "interval: 0.2s" in STORY
    assert "  stable_for: 1s\n" in STORY
    path = fleet.root / "story.yaml"
    path.write_text(STORY.replace("  stable_for: 1s\n", f"  stable_for: {stable_for}\n"))
    return path


def as_json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        return dict(json.loads(proc.stdout))
    except ValueError:
        raise AssertionError(f"no JSON report:\n{proc.stdout}\n{proc.stderr}") from None


def deployed(host: FleetHost) -> bool:
    """The host runs the new release: the flag in the file, and the server reports it."""
    return "speculative_disable_batch_threshold" in host.target_file.read_text() and host.current_flag() == 32


# ------------------------------------------------------------------ a group deploy


def test_a_group_deploy_rolls_back_only_the_host_whose_server_dies(fleet: Fleet) -> None:
    hosts = fleet.new_boxes(fleet.root, count=3)
    fleet.write_inventory(hosts, extra={"gpu02": {"vars": {"exit_after": 0.5}}})
    before = {h.name: h.file_sha() for h in hosts}
    story = write_story(fleet, "2s")  # gpu02's server dies 0.5 s in: well inside the window

    proc = fleet.orch("deploy", "--host", "fleet", "--json", "--stats", str(story))

    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = as_json(proc)
    outcomes = {name: h["outcome"] for name, h in report["hosts"].items()}
    assert outcomes == {"gpu01": "changed", "gpu02": "rolled_back", "gpu03": "changed"}
    bad = report["hosts"]["gpu02"]
    # the helper sees the death at its next check: by the process's exit or by a failed request
    assert bad["exit_code"] == 1
    assert re.search(r"exited .* after it became healthy|became unhealthy .* after it first passed", bad["error"])
    # the one that died is back as it was; the others are on the new release
    assert hosts[1].file_sha() == before["gpu02"] and hosts[1].current_flag() is ORIGINAL_FLAG
    assert deployed(hosts[0]) and deployed(hosts[2])
    # the summary names it, with its error on one line
    lines = proc.stderr.splitlines()
    assert "gpu02: rolled_back release " + bad["release"] in lines
    assert "gpu01: changed release " + report["hosts"]["gpu01"]["release"] in lines
    # per-step timings, under the output's and the journal's step names
    good = report["hosts"]["gpu01"]["timings"]
    assert set(good) == {"connect", "lock", "plan", "stage", "backup", "commit", "restart", "health", "confirm"}
    assert "rollback" in bad["timings"] and "confirm" not in bad["timings"]
    assert all(isinstance(v, float) and v >= 0 for v in good.values())
    assert any(line.startswith("gpu03 stats: connect ") for line in lines)  # --stats off a terminal
    # the host to rerun is in the retry file
    assert report["retry_file"] == "orch.retry"
    assert (fleet.root / "orch.retry").read_text() == "gpu02\n"
    assert any("--limit @orch.retry" in line for line in lines)


# ------------------------------------------------------------------ canary


def test_a_failing_canary_stops_the_run_and_the_other_hosts_are_never_connected(fleet: Fleet) -> None:
    hosts = fleet.new_boxes(fleet.root, count=4)
    fleet.write_inventory(hosts, extra={"gpu01": {"vars": {"crash": 1}}})
    untouched = {h.name: h.tree_digest() for h in hosts[1:]}
    story = write_story(fleet)

    proc = fleet.orch("deploy", "--host", "fleet", "--serial", "1,100%", "--max-fail-percent", "0",
                      "--json", str(story))

    report = as_json(proc)
    assert proc.returncode == 2, proc.stdout + proc.stderr  # hosts left not started, none worse
    assert report["exit_code"] == 2
    canary = report["hosts"]["gpu01"]
    assert canary["outcome"] == "rolled_back" and "server exited during start" in canary["error"]
    for h in hosts[1:]:
        entry = report["hosts"][h.name]
        assert entry["outcome"] == "not_started" and entry["exit_code"] == 2
        assert h.tree_digest() == untouched[h.name]  # every byte of tree and state as it was
        assert h.logins() == 0, h.sshd.log_text()[-2000:]  # never connected: its own sshd says so
    assert hosts[0].logins() == 1
    assert report["stopped"].startswith("batch 1 of 2 failed")
    lines = proc.stderr.splitlines()
    assert "gpu02: not_started" in lines and "stopped: " + report["stopped"] in lines
    assert (fleet.root / "orch.retry").read_text() == "gpu01\ngpu02\ngpu03\ngpu04\n"

    # The cause fixed, --limit @orch.retry resumes exactly those hosts.
    fleet.write_inventory(hosts)
    again = fleet.orch("deploy", "--host", "fleet", "--limit", "@orch.retry", "--serial", "1,100%",
                       "--max-fail-percent", "0", "--json", str(story))
    assert again.returncode == 0, again.stdout + again.stderr
    assert {n: h["outcome"] for n, h in as_json(again)["hosts"].items()} == dict.fromkeys(
        ["gpu01", "gpu02", "gpu03", "gpu04"], "changed")
    assert all(deployed(h) for h in hosts)


# ------------------------------------------------------------------ --limit


def test_limit_narrows_with_globs_exclusion_and_intersection_and_a_typo_touches_nothing(fleet: Fleet) -> None:
    hosts = fleet.new_boxes(fleet.root, count=4, servers=False)
    fleet.write_inventory(hosts, groups={"fleet": [h.name for h in hosts], "rack2": ["gpu03", "gpu04"]})

    def selected(limit: str) -> list[str]:
        proc = fleet.orch("history", "--host", "all", "--limit", limit, "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return sorted(as_json(proc)["hosts"])

    (fleet.root / "two.txt").write_text("# hosts to redo\ngpu04\n\ngpu01\n")
    # four read-only runs, side by side
    assert in_parallel(selected, ["gpu0*:!gpu02", "fleet:&rack2", "gpu0[1:2],rack2,!gpu04", "@two.txt"]) == [
        ["gpu01", "gpu03", "gpu04"], ["gpu03", "gpu04"], ["gpu01", "gpu02", "gpu03"], ["gpu01", "gpu04"]]
    for h in hosts:
        h.log_mark = h.sshd.log.stat().st_size

    typo = fleet.orch("deploy", "--host", "fleet", "--limit", "!gpu1O", "--json")
    assert typo.returncode == 2
    err = typo.stderr.splitlines()
    assert len(err) == 1 and err[0].startswith("orch: error: --limit: 'gpu1O' matches no host or group; "
                                               "did you mean: gpu01"), err
    assert as_json(typo)["hosts"] == {} and as_json(typo)["exit_code"] == 2
    assert all(h.logins() == 0 for h in hosts)  # refused before any host was contacted
    missing = fleet.orch("status", "--host", "fleet", "--limit", "@nowhere.retry")
    assert missing.returncode == 2 and missing.stderr.startswith("orch: error: --limit: cannot read retry file")


# ------------------------------------------------------------------ unreachable


@contextlib.contextmanager
def black_hole() -> Iterator[str]:
    """An address (198.18.0.0/15) inside a network namespace of this test whose packets vanish.

    A veth pair whose namespace side stays down, and a permanent neighbour
    entry so no ARP is asked: a SYN to the address is dropped without a reset
    or an ICMP error, as on a real link that went dark. Removed even on failure.
    """
    tag = os.getpid() % 100000
    ns, near, far = f"orchbh{tag}", f"obh{tag}a", f"obh{tag}b"
    third = tag % 250
    address = f"198.18.{third}.2"

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)

    try:
        ip("netns", "add", ns)
        ip("link", "add", near, "type", "veth", "peer", "name", far)
        ip("link", "set", far, "netns", ns)
        ip("addr", "add", f"198.18.{third}.1/30", "dev", near)
        ip("link", "set", near, "up")
        ip("netns", "exec", ns, "ip", "addr", "add", f"{address}/30", "dev", far)  # and left down
        ip("neigh", "replace", address, "lladdr", "02:00:00:00:00:02", "dev", near, "nud", "permanent")
        yield address
    finally:
        for args in (("netns", "del", ns), ("link", "del", near)):
            with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
                ip(*args)


def test_an_unreachable_host_does_not_hold_the_others_back(fleet: Fleet) -> None:
    hosts = fleet.new_boxes(fleet.root, count=3)
    story = write_story(fleet)
    with black_hole() as dark:
        dead = {"address": dark, "port": 22, "user": "root", "identity_file": str(fleet.client_key),
                "known_hosts": str(fleet.known_hosts)}
        # the dark host comes first: one after another, it would hold up every other host
        fleet.write_inventory(hosts, more={"gpu00": dead},
                              groups={"fleet": ["gpu00", *(h.name for h in hosts)]})
        proc = fleet.orch("deploy", "--host", "fleet", "--connect-timeout", "20", "--json", str(story))
    report = as_json(proc)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert report["hosts"]["gpu00"]["outcome"] == "unreachable"
    assert "timed out" in report["hosts"]["gpu00"]["error"] or "no SSH server" in report["hosts"]["gpu00"]["error"]
    assert all(report["hosts"][h.name]["outcome"] == "changed" for h in hosts)
    lines = proc.stderr.splitlines()
    done = [i for i, line in enumerate(lines) if " finished: " in line]
    order = [lines[i].split()[0] for i in done]
    assert order[-1] == "gpu00" and sorted(order[:-1]) == ["gpu01", "gpu02", "gpu03"], order
    assert all(deployed(h) for h in hosts)


# ------------------------------------------------------------------ forks, live view


def run_in_pty(cwd: Path, args: list[str], columns: int = 160) -> tuple[int, str]:
    """``orch ARGS`` on a pseudo-terminal (stdin, stdout, stderr); its exit code and text."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", *args], cwd=cwd, env=env,
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    code = proc.wait(240)
    text = b"".join(chunks).decode("utf-8", "replace").replace("\r", "")
    return code, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07", "", text)


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals that hold at one instant."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def test_forks_2_on_5_hosts_never_has_more_than_2_deploys_in_flight_and_a_terminal_sees_it_live(
        fleet: Fleet) -> None:
    hosts = fleet.new_boxes(fleet.root, count=5)
    fleet.write_inventory(hosts)
    story = write_story(fleet)

    code, text = run_in_pty(fleet.root, ["deploy", "--host", "fleet", "--forks", "2", "--stats", str(story),
                                         "--ssh-config", str(fleet.ssh_config)])

    assert code == 0, text
    # each host's own records: its release from the backup to the confirm
    spans = []
    for h in hosts:
        (release,) = h.releases()
        assert release["outcome"] == "deployed"
        spans.append((float(release["created"]), float(release["finished"])))
        assert h.logins() == 1  # one connection for the whole run
    assert most_at_once(spans) <= 2, spans
    assert all(deployed(h) for h in hosts)
    # the live board (one row per host: step, elapsed, last event), then the summary table
    assert "last event" in text and "orch deploy: " in text
    summary = text[text.index("summary"):]
    for h in hosts:
        assert re.search(rf"│ {h.name}\s+│ changed\s+│ \d{{8}}T", summary), summary
    assert "seconds per step" in text and "confirm" in text  # --stats on a terminal


# ------------------------------------------------------------------ rollback, history, status


def test_rollback_history_and_status_give_every_host_its_entry_with_one_unreachable(fleet: Fleet) -> None:
    hosts = fleet.new_boxes(fleet.root, count=3)
    story = write_story(fleet)
    fleet.write_inventory(hosts)
    before = {h.name: h.file_sha() for h in hosts}
    first = fleet.orch("deploy", "--host", "fleet", "--json", str(story))
    assert first.returncode == 0, first.stdout + first.stderr
    # a fourth host whose sshd is gone: its address refuses connections
    closed = {"address": "127.0.40.9", "port": fleet.hosts[0].sshd.port, "user": "root",
              "identity_file": str(fleet.client_key), "known_hosts": str(fleet.known_hosts)}
    fleet.write_inventory(hosts, more={"gpu09": closed}, groups={"fleet": ["gpu09", *(h.name for h in hosts)]})

    # status and history only read the hosts: side by side
    status, history = in_parallel(lambda args: fleet.orch(*args, "--host", "fleet", "--json"),
                                  [["status"], ["history"]])
    got = as_json(status)
    assert status.returncode == 2 and got["exit_code"] == 2  # the worst host's
    assert got["hosts"]["gpu09"]["outcome"] == "unreachable"
    for h in hosts:
        assert got["hosts"][h.name]["exit_code"] == 0 and got["hosts"][h.name]["healthy"] is True
        assert got["hosts"][h.name]["current"] == h.releases()[-1]["id"]
    assert "gpu02 status: ok" in status.stderr.splitlines()

    got = as_json(history)
    assert history.returncode == 2
    assert sorted(got["hosts"]) == ["gpu01", "gpu02", "gpu03"] and list(got["failed"]) == ["gpu09"]
    assert all(len(rows) == 1 and rows[0]["current"] for rows in got["hosts"].values())

    back = fleet.orch("rollback", "--host", "fleet", "--json")
    got = as_json(back)
    assert back.returncode == 2, back.stdout + back.stderr
    assert got["hosts"]["gpu09"]["outcome"] == "unreachable"
    for h in hosts:
        assert got["hosts"][h.name]["outcome"] == "rolled_back" and got["hosts"][h.name]["exit_code"] == 0
        assert h.file_sha() == before[h.name]
        assert h.box is not None
        wait_healthy(h.box.port)
        assert h.current_flag() is ORIGINAL_FLAG
    assert (fleet.root / "orch.retry").read_text() == "gpu09\n"


@pytest.mark.parametrize(("args", "needle"), [
    (["--serial", "0"], "--serial: '0': a batch size must be at least 1"),
    (["--serial", "1,abc"], "--serial: 'abc' is not a whole number or a percentage"),
    (["--max-fail-percent", "120"], "--max-fail-percent: '120' must be between 0 and 100"),
])
def test_bad_batch_options_are_one_line_and_touch_no_host(fleet: Fleet, args: list[str], needle: str) -> None:
    hosts = fleet.new_boxes(fleet.root, count=2, servers=False)
    fleet.write_inventory(hosts)
    proc = fleet.orch("deploy", "--host", "fleet", *args, "--json", str(write_story(fleet)))
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"orch: error: {needle}"]
    assert as_json(proc) == {"exit_code": 2, "error": needle, "hosts": {}}
    assert all(h.logins() == 0 for h in hosts)


# ------------------------------------------------------------------ the gate promotes (issue 11)

GATED = STORY.replace("  crash: 0\n", "  crash: 0\n  slow: 1\n").replace(
    'STANDIN_CRASH_AT_START: "{{ crash }}"}', 'STANDIN_CRASH_AT_START: "{{ crash }}", STANDIN_SLOWDOWN: "{{ slow }}"}'
) + """\
gate:
  probes:
    - {post: /generate, json: {text: "the gate's prompt", sampling_params: {max_new_tokens: 8}},
       requests: 32, concurrency: 16, warmup: 16, rounds: 3, timeout: 30s}
  rules: {tokens_per_s: {min_ratio: 0.75}, errors: 0}
"""
"""The story with a performance gate; a host var ``slow: F`` makes that host's new server F times slower
(``slow: 2`` halves its throughput: 0.5 of before, a quarter below the rule's 0.75, so a busy
machine's noise cannot carry it over the line; at 0.6 it once came near)."""


def test_a_canary_that_fails_the_gate_leaves_every_other_host_untouched(fleet: Fleet) -> None:
    hosts = fleet.new_boxes(fleet.root, count=3)
    fleet.write_inventory(hosts, extra={"gpu01": {"vars": {"slow": 2}}})  # the canary halves its throughput
    untouched = {h.name: h.tree_digest() for h in hosts[1:]}
    story = fleet.root / "gated.yaml"
    story.write_text(GATED)

    proc = fleet.orch("deploy", "--host", "fleet", "--serial", "1,100%", "--max-fail-percent", "0",
                      "--json", str(story))

    report = as_json(proc)
    assert proc.returncode == 2, proc.stdout + proc.stderr  # the rest not started; the canary rolled back
    canary = report["hosts"]["gpu01"]
    assert canary["outcome"] == "rolled_back" and "tokens_per_s" in canary["error"], canary
    assert canary["gate"]["verdict"] == "fail"
    assert hosts[0].current_flag() == ORIGINAL_FLAG  # the canary serves its previous command line again
    for h in hosts[1:]:
        assert report["hosts"][h.name]["outcome"] == "not_started"
        assert h.tree_digest() == untouched[h.name] and h.logins() == 0
