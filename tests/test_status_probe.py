"""``orch status --probe`` re-probes before it calls a change a regression (issue 21,
table row "status --probe on an unchanged server").

Status decides nothing, so a verdict still inconclusive after ``gate.reprobes``
re-probes is not counted as ``on_inconclusive``: it stays ``inconclusive``, exit 0,
with one line giving the margin and the noise. Exit 1 only beyond the noise.

The decision is tested with recorded figures (no host); the CLI test runs over real
sshd against the stand-in, whose decode speed is modelled (deterministic):
the noise is made large by widening the release's recorded rounds on the host
(from outside, as a file edit), the regression by ``STANDIN_SLOWDOWN=5``.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.cli.tables import status_lines
from orchestrator.core.gate import GateOutcome, RuleCheck, next_step
from orchestrator.pipeline.inspect import HostStatus
from tests.fixtures.sandbox import Sandbox, cmdline
from tests.test_gate import NOISY, Answers, gate_run, wire_round
from tests.test_gate_deploy import LABEL, SPECULATION, WIDE, gated, host_of, stop_server, table_row

# ------------------------------------------------------------------ the decision, from recorded figures


def test_status_probe_row_next_step_without_on_inconclusive_leaves_inconclusive_after_the_reprobes() -> None:
    def rows(*verdicts: str) -> list[RuleCheck]:
        return [RuleCheck("p", "tokens_per_s", "min_ratio", "", v, "") for v in verdicts]  # type: ignore[arg-type]

    assert next_step(rows("pass", "inconclusive"), 0, 2, None) == "reprobe"
    assert next_step(rows("pass", "inconclusive"), 2, 2, None) == "inconclusive"
    assert next_step(rows("inconclusive", "fail"), 0, 2, None) == "fail"  # a clear fail is never re-probed
    assert next_step(rows("pass"), 0, 2, None) == "pass"


def test_status_probe_row_judge_without_deciding_reprobes_then_says_inconclusive_with_margin_and_noise() -> None:
    run = gate_run(reprobes=2, on_inconclusive="fail")  # on_inconclusive: fail must not apply
    run.take_baseline([wire_round(500)] * 3)
    run.take_after(NOISY)  # median 500 against 0.95 × 500 = 475; rounds 430..560: half range 65
    session = Answers(NOISY, NOISY)
    outcome = run.judge(session, decide=False)  # type: ignore[arg-type]
    assert session.sent == [3, 3]  # re-probed gate.reprobes times, as the deploy's gate does
    assert outcome.verdict == "inconclusive" and outcome.reprobes == 2 and outcome.inconclusive_as is None
    assert outcome.failing == []
    tokens = next(c for c in outcome.checks if c.rule == "tokens_per_s")
    assert (tokens.margin, tokens.noise) == (25.0, 65.0)
    assert outcome.inconclusive_line() == ("inconclusive: margin 25.0 within noise 65.0 "
                                           "(tokens_per_s.min_ratio on /generate@16), after 2 re-probe(s)")
    data = json.loads(json.dumps(outcome.to_json()))
    assert data["verdict"] == "inconclusive" and data["failed"] == [] and data["inconclusive_as"] is None
    assert GateOutcome.from_json(data) == outcome


def test_status_probe_row_a_change_beyond_the_noise_still_fails_and_a_fresh_measurement_can_pass() -> None:
    run = gate_run(reprobes=1)
    run.take_baseline([wire_round(500)] * 3)
    run.take_after([wire_round(200), wire_round(210), wire_round(220)])  # margin 265, noise 10
    session = Answers()
    failed = run.judge(session, decide=False)  # type: ignore[arg-type]
    assert failed.verdict == "fail" and session.sent == []  # a clear fail: no re-probe
    again = gate_run(reprobes=1)
    again.take_baseline([wire_round(500)] * 3)
    again.take_after(NOISY)
    clear = [wire_round(560), wire_round(561), wire_round(562)]
    assert again.judge(Answers(clear), decide=False).verdict == "pass"  # type: ignore[arg-type]


def test_status_probe_row_an_inconclusive_gate_exits_0_and_says_so_in_the_status_line() -> None:
    run = gate_run(reprobes=0)
    run.take_baseline([wire_round(500)] * 3)
    run.take_after(NOISY)
    outcome = run.judge(Answers(), decide=False)  # type: ignore[arg-type]
    status = HostStatus(host="gpu", current="r1", playbook="gated", server=None, health="healthy (200)",
                        healthy=True, gate=outcome)
    assert not status.regressed and status.exit_code == 0
    assert dict(status_lines(status))["status"] == outcome.inconclusive_line()
    assert status.to_json()["gate"]["verdict"] == "inconclusive"


# ------------------------------------------------------------------ through the real CLI, over sshd


def widen_recorded_rounds(box: Sandbox, release: str) -> str:
    """Spread the release's recorded rounds to 0.2×, 1× and 5× their median (the median
    kept): a noise no machine's own spread comes near. Returns the manifest as it was."""
    path = box.state_dir / "releases" / release / "manifest.json"
    original = path.read_text()
    data: dict[str, Any] = json.loads(original)
    for probe in data["probe"]["probes"]:
        rounds = probe["result"]["rounds"]
        for figure in ("output_tokens_per_s", "p99_ms"):
            median = sorted(r[figure] for r in rounds)[len(rounds) // 2]
            for r, factor in zip(rounds, (0.2, 1.0, 5.0), strict=True):
                r[figure] = median * factor
    path.write_text(json.dumps(data))
    return original


def test_status_probe_row_unchanged_server_within_the_noise_exits_0_and_a_real_regression_exits_1(
        sandbox: Sandbox) -> None:
    box = sandbox
    box.start_by_hand(*SPECULATION)
    deploy = box.orch("deploy", "--host", "gpu", "--json", str(gated(box, threshold=8, rules=WIDE)))
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    release = host_of(deploy)["release"]
    original = widen_recorded_rounds(box, release)

    # the same server, the record's noise far larger than any margin: inconclusive, exit 0.
    # One probing run: under --json its human output (the same lines) goes to stderr
    unchanged = box.orch("status", "--host", "gpu", "--probe", "--json")
    assert unchanged.returncode == 0, unchanged.stdout + unchanged.stderr
    status_line = next(line for line in unchanged.stderr.splitlines() if line.startswith("gpu status: "))
    assert status_line.startswith("gpu status: inconclusive: margin ")
    assert "within noise " in status_line and f"(tokens_per_s.min_ratio on {LABEL})" in status_line
    assert status_line.endswith("after 1 re-probe(s)")  # gate.reprobes' default, then nothing decided
    assert "regressed" not in unchanged.stdout + unchanged.stderr
    assert table_row(unchanged.stderr, "tokens_per_s")[-1] == "inconclusive"
    gate = json.loads(unchanged.stdout)["hosts"]["gpu"]["gate"]
    assert gate["verdict"] == "inconclusive" and gate["reprobes"] == 1 and gate["inconclusive_as"] is None
    assert gate["failed"] == []

    # the record back as measured; the same command line restarted by hand five times slower: exit 1
    (box.state_dir / "releases" / release / "manifest.json").write_text(original)
    after_argv = cmdline(box.server_pid())
    stop_server(box)
    launcher = len(box.hand_argv) - len(SPECULATION)
    box.start_by_hand(*after_argv[launcher:], env={"STANDIN_SLOWDOWN": "5"})
    slow = box.orch("status", "--host", "gpu", "--probe")
    assert slow.returncode == 1, slow.stdout + slow.stderr
    assert f"gpu status: performance regressed: tokens_per_s.min_ratio on {LABEL}" in slow.stdout
    assert table_row(slow.stdout, "tokens_per_s")[-1] == "fail"
