"""A fleet follows again a host whose link was lost after its commit before it decides its
next batch (issue 19, item 5). REAL sshd hosts (tests/fixtures/fleet.py); the first is
reached through the latency proxy, whose route is refused once that host's runner waits in
its ``before_stop`` hook (a hook that waits for a file: the step is held from outside).

The controller's own reconnect window for that host runs out (its connections are
refused); the fleet's pass then connects once more: when the route has come back it
follows the release to its verdict and the next batch runs; when it has not, the host is
``unreachable`` and ``--max-fail-percent 0`` stops the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.fixtures.fleet import Fleet, FleetHost
from tests.fixtures.proxy import TcpProxy
from tests.fixtures.sandbox import wait_until
from tests.test_fleet import STORY, deployed
from tests.test_runner import held_at_before_stop, outcome

CONNECT_TIMEOUT = "2.4"  # the controller's own window for a lost host: 6 × 2.4 s (tries at 0, 5, 10 s)


def held_story(fleet: Fleet) -> Path:
    """The fleet's story, with a ``before_stop`` hook that waits until the host's ``hold`` file exists."""
    spec = yaml.safe_load(STORY)
    spec["vars"]["hold"] = "/nonexistent"
    spec["server"]["before_stop"] = "sh -c 'while [ ! -e {{ hold }} ]; do sleep 0.1; done'"
    path = fleet.root / "held.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def behind_proxy(fleet: Fleet, a: FleetHost, others: list[FleetHost], go: Path,
                 holds: dict[str, Path] | None = None) -> TcpProxy:
    """``a`` reached through a proxy (its hook held by ``go``), the ``others`` straight (each hook
    held by its file in ``holds``, else let go at once)."""
    proxy = TcpProxy(a.sshd.port, upstream_host=a.address, delay=0.02)
    known = fleet.root / "known_hosts_proxy"
    known.write_text(f"[127.0.0.1]:{proxy.port} {a.sshd.host_key_pub}")
    free = fleet.root / "free"
    free.write_text("")
    extra: dict[str, dict[str, Any]] = {
        a.name: {"address": "127.0.0.1", "port": proxy.port, "known_hosts": str(known), "vars": {"hold": str(go)}}}
    for other in others:
        extra[other.name] = {"vars": {"hold": str((holds or {}).get(other.name, free))}}
    fleet.write_inventory([a, *others], extra=extra)
    return proxy


def start_deploy(fleet: Fleet, story: Path, *args: str, serial: str = "1") -> tuple[subprocess.Popen[str], Path]:
    """``orch deploy --json`` in the background: its human lines on a pipe (read as they come),
    the JSON report into a file (so a long report never fills a pipe nobody reads yet)."""
    env = dict(os.environ, COLUMNS="200", NO_COLOR="1", **fleet.extra_env)
    out = fleet.root / "report.json"
    cmd = [sys.executable, "-m", "orchestrator", "deploy", "--host", "fleet", "--serial", serial, "--json",
           "--connect-timeout", CONNECT_TIMEOUT, *args, str(story), "--ssh-config", str(fleet.ssh_config)]
    with out.open("w") as sink:
        proc = subprocess.Popen(cmd, cwd=fleet.root, env=env, stdout=sink, stderr=subprocess.PIPE, text=True)
    return proc, out


def read_until(proc: subprocess.Popen[str], needle: str, seen: list[str]) -> bool:
    """The controller's lines into ``seen`` until one holds ``needle`` (True) or they end (False)."""
    assert proc.stderr is not None
    for line in proc.stderr:
        seen.append(line.rstrip("\n"))
        if needle in line:
            return True
    return False


def finish(proc: subprocess.Popen[str], out: Path, seen: list[str]) -> dict[str, Any]:
    assert proc.stderr is not None
    seen += proc.stderr.read().splitlines()
    proc.wait(timeout=240)
    try:
        return dict(json.loads(out.read_text()))
    except ValueError:
        raise AssertionError("no JSON report:\n" + "\n".join(seen)) from None


def index_of(lines: list[str], needle: str) -> int:
    return next(i for i, line in enumerate(lines) if needle in line)


def test_the_route_back_after_the_hosts_own_window_the_fleet_follows_it_to_changed_then_batch_2(
        fleet: Fleet) -> None:
    """Batch 1 is gpu01 and gpu02, batch 2 gpu03. gpu01 loses its route once its runner waits
    in its hook and its controller's own window runs out (``finished: unreachable``) while
    gpu02 is still held in its own hook; only then does the route come back, gpu02 is let go,
    and when batch 1 has ended the fleet follows gpu01 again: every step of it waits for
    something the test saw, never for a time."""
    a, b, c = fleet.new_boxes(fleet.root, count=3)
    go, go_b = fleet.root / "go", fleet.root / "go_b"
    proxy = behind_proxy(fleet, a, [b, c], go, holds={b.name: go_b})
    try:
        proc, out = start_deploy(fleet, held_story(fleet), serial="2")
        assert a.box is not None and b.box is not None
        release = held_at_before_stop(a.box)
        proxy.refuse()  # the controller's link to gpu01 dies, and every reconnect is refused
        seen: list[str] = []
        own_window_over = read_until(proc, "gpu01 finished: unreachable", seen)
        held_at_before_stop(b.box)  # batch 1 is not over: gpu02 still waits in its hook
        proxy.reopen()  # the route is back, after gpu01's own window
        go.write_text("")  # gpu01's runner goes on (no controller follows it now)
        go_b.write_text("")  # gpu02 finishes: batch 1 has ended, the fleet follows gpu01 again
        report = finish(proc, out, seen)
    finally:
        proxy.close()
    text = "\n".join(seen)
    assert own_window_over, text
    assert proc.returncode == 0, text
    hosts = report["hosts"]
    assert {n: h["outcome"] for n, h in hosts.items()} == {
        "gpu01": "changed", "gpu02": "changed", "gpu03": "changed"}, text
    assert hosts["gpu01"]["release"] == release.name and hosts["gpu01"]["followed_again"] == "before batch 2"
    assert hosts["gpu01"]["verdict"] == "confirmed" and "lost_after_commit" not in hosts["gpu01"]
    # the controller's own window ran out first, then the pass, then batch 2
    again = f"gpu01 following release {release.name} again before batch 2"
    lost = index_of(seen, "gpu01 finished: unreachable")
    assert "`orch status --follow --host gpu01` gives the verdict" in seen[lost]
    assert lost < index_of(seen, again) < index_of(seen, "gpu01 finished: changed") < index_of(seen, "gpu03 ")
    assert index_of(seen, "gpu02 finished: changed") < index_of(seen, again)
    assert outcome(release) == "deployed"
    assert json.loads((release / "reported.json").read_text())["by"]["command"] == "deploy"
    assert deployed(a) and deployed(b) and deployed(c)


def test_a_host_still_unreachable_counts_as_failed_and_batch_2_never_starts(fleet: Fleet) -> None:
    a, b = fleet.new_boxes(fleet.root, count=2)
    go = fleet.root / "go"
    proxy = behind_proxy(fleet, a, [b], go)
    untouched = b.tree_digest()
    try:
        proc, out = start_deploy(fleet, held_story(fleet), "--max-fail-percent", "0")
        assert a.box is not None
        release = held_at_before_stop(a.box)
        proxy.refuse()  # for good: the controller's reconnects and the pass's connection are refused
        seen: list[str] = []
        report = finish(proc, out, seen)
    finally:
        proxy.close()
    text = "\n".join(seen)
    assert proc.returncode == 3, text
    hosts = report["hosts"]
    assert hosts["gpu01"]["outcome"] == "unreachable" and hosts["gpu01"]["exit_code"] == 3, text
    assert hosts["gpu01"]["release"] == release.name
    assert "followed again before batch 2, in vain" in hosts["gpu01"]["error"]
    assert hosts["gpu02"]["outcome"] == "not_started"
    assert report["stopped"].startswith("batch 1 of 2 failed"), report["stopped"]
    # the same as fields: the second try's ending holds the first one's, and gpu02's why
    ending = hosts["gpu01"]["ending"]
    assert ending["kind"] == "followed_again_in_vain" and ending["when"] == "before batch 2", ending
    assert ending["lost"]["kind"] == "lost_after_commit" and ending["lost"]["release"] == release.name, ending
    assert hosts["gpu02"]["ending"] == {"kind": "not_started", "why": report["stopped"]}
    assert index_of(seen, "gpu01 finished: unreachable") < index_of(
        seen, f"gpu01 following release {release.name} again before batch 2")
    assert f"gpu01 warning: release {release.name} could not be followed again" in text
    assert b.logins() == 0 and b.tree_digest() == untouched  # batch 2 never started, not even connected
    # nothing was aborted: the runner still holds the release, and finishes it by itself
    assert outcome(release) == "in_progress" and not (release / "restored.json").exists()
    go.write_text("")
    wait_until(lambda: outcome(release) == "deployed", timeout=180, what="the runner to confirm alone")
    assert deployed(a)
