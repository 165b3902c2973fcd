"""The performance gate over real sshd, against the stand-in server, with the real CLI.

The stand-in decodes on a modelled clock (``sglang/srt/standin_speed.py``):
speculation is slower than plain decoding at high concurrency, the
speculation patch's threshold turns it off above N, ``STANDIN_SLOWDOWN=F``
makes every step F times slower and ``STANDIN_GREEDY_SALT`` changes greedy
text. So these tests assert verdicts and outcomes — never a figure or a
duration. Switches reach only the NEW server (``server.env``); a rollback
restarts the hand-started command line with its own environment.

Every verdict asserted here is far from its threshold: on a busy 2-core
machine (the suite runs in 4 workers) the stand-in's rounds spread by ±10%
and more, and a difference within the spread is inconclusive (then a fail,
by default) — which is what docs/GATE.md says about choosing thresholds.
Speculation at concurrency 32 costs the stand-in about 40% of its
throughput; a slowdown of 2, 50%; both, 70%. A comparison of a server with
itself passes only rules much wider than the noise (``WIDE``), and a
regression asserted against ``WIDE`` is both.

Deploys that fail the gate are faults: they reach sshd through the TCP proxy
that adds 20 ms each way, as tests/test_faults.py does.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.core.budget import probe_seconds
from orchestrator.core.models import GateProbe
from tests.fixtures.proxy import TcpProxy
from tests.fixtures.sandbox import SHIPPED_SPEC, Sandbox, cmdline, sha256, wait_healthy

PROBE = {"post": "/generate", "json": {"text": "the gate's prompt", "sampling_params": {"max_new_tokens": 8}},
         "requests": 64, "concurrency": 32, "warmup": 32, "rounds": 3, "timeout": "30s"}
"""Concurrency 32: with speculation on, the stand-in is far slower there than without."""
LABEL = "/generate@32"
SPECULATION = ("--speculative-algorithm", "EAGLE")

RULES = {"tokens_per_s": {"min_ratio": 0.95}, "p99_ms": {"max_ratio": 1.10}, "errors": 0, "greedy": "same"}
WIDE = {"tokens_per_s": {"min_ratio": 0.6}, "p99_ms": {"max_ratio": 1.8}, "errors": 0, "greedy": "same"}
"""Wide enough that the same server passes against itself on a busy machine."""


def gated(box: Sandbox, *, threshold: int = 8, env: dict[str, str] | None = None,
          rules: dict[str, Any] | None = None, name: str = "gated.yaml", router: Path | None = None) -> Path:
    """The story's playbook with a gate, short timeouts, and switches for the NEW server only.

    ``router``: hooks drain the host from a "router" (a file, a line per call) before
    the stop and put it back once healthy, naming the command line they put back.
    """
    spec = yaml.safe_load(SHIPPED_SPEC)
    spec["vars"]["threshold"] = threshold
    spec["server"].update(stop_timeout="5s", free_timeout="10s", env=env or {})
    if router is not None:
        spec["server"].update(before_stop=f"sh -c 'echo drain >> {router}'",
                              after_healthy=f"sh -c 'echo \"serve $0\" >> {router}' {{{{ command }}}}")
    spec["health"].update(timeout="60s", stable_for="1s", interval="0.2s")
    spec["gate"] = {"probes": [PROBE], "rules": rules or RULES}
    path = box.root / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def host_of(proc: Any) -> dict[str, Any]:
    return dict(json.loads(proc.stdout)["hosts"]["gpu"])


def manifest(box: Sandbox, release: str) -> dict[str, Any]:
    return dict(json.loads((box.state_dir / "releases" / release / "manifest.json").read_text()))


def row(gate: dict[str, Any], rule: str) -> dict[str, Any]:
    return next(c for c in gate["checks"] if c["rule"] == rule)


def table_row(text: str, rule: str) -> list[str]:
    """The words of the before/after table's row for ``rule`` (plain output: aligned lines)."""
    line = next(line for line in text.splitlines() if line.startswith(f"  {LABEL}") and f" {rule} " in line)
    return line.split()


def generate(port: int) -> dict[str, Any]:
    body = json.dumps({"text": "still serving?", "sampling_params": {"max_new_tokens": 4}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return dict(json.load(r))


def stop_server(box: Sandbox) -> None:
    """Stop the server orch started (its pidfile's group) and wait until the port is free."""
    pid = int((box.state_dir / "server.pid").read_text().strip())
    os.killpg(pid, signal.SIGTERM)
    deadline = time.time() + 60
    while box.server_pid() is not None:
        assert time.time() < deadline, "the server did not stop"
        time.sleep(0.05)


# ---------------------------------------------------------------- passing, and the record as baseline


def test_the_speculation_patch_passes_the_gate_and_its_record_is_the_next_baseline(sandbox: Sandbox) -> None:
    box = sandbox
    box.start_by_hand(*SPECULATION)  # slow at concurrency 32: the story's box
    router = box.root / "router.log"
    deploy = box.orch("deploy", "--host", "gpu", "--json", str(gated(box, threshold=8, rules=WIDE, router=router)))
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    host = host_of(deploy)
    assert host["outcome"] == "changed" and host["gate"]["verdict"] == "pass", host
    assert host["gate"]["baseline"] == "probed before the stop" and host["gate"]["failed"] == []
    # the probes, the re-probes and putting the host back behind its router once the gate
    # passed are all the host's runner's: as many round trips as a deploy without a gate (5)
    assert host["round_trips"] == 5, host
    assert router.read_text().splitlines() == ["drain", f"serve {' '.join(cmdline(box.server_pid()))}"]
    assert cmdline(box.server_pid())[-2:] == ["--speculative-disable-batch-threshold", "8"]
    # the table, as a person sees it off a terminal
    assert "gpu performance gate: pass (baseline: probed before the stop)" in deploy.stderr
    assert table_row(deploy.stderr, "tokens_per_s")[-1] == "pass"
    assert table_row(deploy.stderr, "greedy")[-1] == "pass"

    # recorded in the release: more tokens/s at high concurrency than before, and the figures themselves
    release = manifest(box, host["release"])
    tokens = row(release["gate"], "tokens_per_s")
    assert tokens["after"] > tokens["before"] and tokens["change_pct"] > 0
    assert release["probe"]["summary"]["output_tokens_per_s"] == tokens["after"]
    assert release["probe"]["probes"][0]["concurrency"] == 32
    # the watchdog's deadline covers the gate: the new server's probe, a re-probe and the baseline
    gate_seconds = 3 * probe_seconds(GateProbe.model_validate(PROBE))
    assert release["watchdog_deadline"] - release["created"] > gate_seconds
    spec_file = box.state_dir / "releases" / host["release"] / "probe.json"
    assert stat.S_IMODE(spec_file.stat().st_mode) == 0o600  # headers may hold a key, like restore.json

    # status --probe: the server now against that record
    status = box.orch("status", "--host", "gpu", "--probe", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    now = json.loads(status.stdout)["hosts"]["gpu"]["gate"]
    assert now["verdict"] == "pass" and now["baseline"] == f"release {host['release']}'s record"

    # the next deploy takes its baseline from that record; threshold 64 keeps speculation on at 32,
    # and a slowdown of 2 on top
    worse = box.orch("deploy", "--host", "gpu", "--json", str(gated(
        box, threshold=64, env={"STANDIN_SLOWDOWN": "2"}, rules=WIDE, name="worse.yaml")))
    assert worse.returncode == 1, worse.stdout + worse.stderr
    second = host_of(worse)
    assert second["outcome"] == "rolled_back"
    assert second["gate"]["baseline"] == f"release {host['release']}'s record"
    assert f"tokens_per_s.min_ratio on {LABEL}" in second["gate"]["failed"]
    assert "gate: probing the running server" not in worse.stderr  # no baseline probe was needed
    assert json.loads(box.orch("status", "--host", "gpu", "--json").stdout)["hosts"]["gpu"]["current"] == host["release"]
    with urllib.request.urlopen(f"http://127.0.0.1:{box.port}/get_server_info", timeout=5) as r:
        assert json.load(r)["speculative_disable_batch_threshold"] == 8

    # the same command line, restarted by hand five times slower: status --probe says so, exit 1
    # (beyond any noise: a verdict within it would be inconclusive, exit 0, for status decides nothing)
    after_argv = cmdline(box.server_pid())
    stop_server(box)
    launcher = len(box.hand_argv) - len(SPECULATION)  # python -m sglang.launch_server --model-path … --port …
    box.start_by_hand(*after_argv[launcher:], env={"STANDIN_SLOWDOWN": "5"})
    assert cmdline(box.server_pid()) == after_argv
    slow = box.orch("status", "--host", "gpu", "--probe")
    assert slow.returncode == 1, slow.stdout + slow.stderr
    assert f"gpu status: performance regressed: tokens_per_s.min_ratio on {LABEL}" in slow.stdout
    assert table_row(slow.stdout, "tokens_per_s")[-1] == "fail"


# ---------------------------------------------------------------- failing: faults, over a slow link


@pytest.fixture
def link(sandbox: Sandbox) -> Iterator[Sandbox]:
    """The sandbox host, reached through a proxy that adds 20 ms each way."""
    proxy = TcpProxy(sandbox.sshd.port, delay=0.02)
    known = sandbox.root / "known_hosts_proxy"
    known.write_text(f"[127.0.0.1]:{proxy.port} {sandbox.sshd.host_key_pub}\n")
    sandbox.write_inventory(port=proxy.port, known_hosts=str(known))
    try:
        yield sandbox
    finally:
        proxy.close()


def assert_back_and_serving(box: Sandbox, original: str) -> None:
    """Files, the hand-started command line and health as before the deploy; and it answers."""
    assert sha256(box.server_args) == original
    wait_healthy(box.port, 60)
    assert cmdline(box.server_pid()) == box.hand_argv
    assert generate(box.port)["meta_info"]["completion_tokens"] == 4


def test_a_deploy_that_halves_throughput_is_rolled_back_by_the_gate(link: Sandbox) -> None:
    box = link
    box.start_by_hand()
    original = sha256(box.server_args)
    run = box.orch("deploy", "--host", "gpu", "--json", str(gated(box, env={"STANDIN_SLOWDOWN": "2"})))
    assert run.returncode == 1, run.stdout + run.stderr
    host = host_of(run)
    assert host["outcome"] == "rolled_back"
    assert host["error"].startswith(f"performance gate failed: tokens_per_s.min_ratio on {LABEL}: ")
    assert host["gate"]["verdict"] == "fail"
    assert f"tokens_per_s.min_ratio on {LABEL}" in host["gate"]["failed"]
    assert row(host["gate"], "tokens_per_s")["verdict"] == "fail"
    assert row(host["gate"], "greedy")["verdict"] == "pass"  # slower, not different
    # the table and the failing rule, in the output a person reads
    assert "gpu performance gate: fail (baseline: probed before the stop)" in run.stderr
    assert table_row(run.stderr, "tokens_per_s")[-1] == "fail"
    assert "gpu: rolled_back" in run.stderr and "performance gate failed: tokens_per_s.min_ratio" in run.stderr
    assert_back_and_serving(box, original)
    release = manifest(box, host["release"])
    assert release["gate"]["verdict"] == "fail"
    rows = json.loads(box.orch("history", "--host", "gpu", "--json").stdout)["hosts"]["gpu"]
    assert rows[-1]["outcome"] == "rolled back" and "tokens_per_s.min_ratio" in rows[-1]["error"]


def test_a_changed_greedy_output_is_rolled_back_with_greedy_same(link: Sandbox) -> None:
    """…and the new server, drained from its router before the stop, never goes back behind it."""
    box = link
    box.start_by_hand()
    original = sha256(box.server_args)
    rules = {"greedy": "same", "errors": 0}
    router = box.root / "router.log"
    run = box.orch("deploy", "--host", "gpu", "--json",
                   str(gated(box, env={"STANDIN_GREEDY_SALT": "a patch that changes the output"}, rules=rules,
                             router=router)))
    assert run.returncode == 1, run.stdout + run.stderr
    host = host_of(run)
    assert host["outcome"] == "rolled_back"
    assert host["gate"]["failed"] == [f"greedy on {LABEL}"]
    assert f"performance gate failed: greedy on {LABEL}: the greedy output changed" in host["error"]
    assert table_row(run.stderr, "greedy")[-1] == "fail"
    assert_back_and_serving(box, original)
    drain, *put_back = router.read_text().splitlines()
    assert drain == "drain" and len(put_back) == 1  # put back once: by the restore, with the previous server
    assert put_back[0].startswith("serve ") and "--speculative-disable-batch-threshold" not in put_back[0]
