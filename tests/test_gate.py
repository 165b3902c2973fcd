"""The performance gate's pure parts: the spec, the noise-aware comparison, the
re-probe decision, the table, the budget — no host.

(Over real sshd against the stand-in: tests/test_gate_deploy.py.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.budget import deploy_budget, gate_items, probe_seconds, total
from orchestrator.core.gate import (
    COLUMNS,
    GateOutcome,
    Measured,
    RuleCheck,
    check_probe,
    judge_bound,
    next_step,
    plain_table,
)
from orchestrator.core.models import GateRules, parse_playbook
from orchestrator.core.probe import ProbeFigures, ProbeResult
from orchestrator.core.rendering import render_playbook
from orchestrator.core.templating import Renderer
from orchestrator.errors import ConfigError
from orchestrator.host.records import Manifest
from orchestrator.pipeline.gate import GateRun, gate_from_spec_record, recorded_results
from orchestrator.shell.ops import BatchResults
from tests.fixtures.forkrun import run_orch

HEAD = """\
name: gated
vars: {port: 30000, tokens: 8}
server: {manager: process}
health:
  base_url: "http://127.0.0.1:{{ port }}"
  checks: [{get: /health}]
"""

GATE = """\
gate:
  probes:
    - post: /generate
      json: {text: "p", sampling_params: {max_new_tokens: "{{ tokens }}"}}
      headers: {Authorization: "Bearer {{ port }}"}
      requests: 32
      concurrency: 16
      timeout: 30s
  rules:
    tokens_per_s: {min_ratio: 0.95, min: 100}
    p99_ms: {max_ratio: 1.10}
    errors: 0
    greedy: same
"""


def playbook(gate: str = GATE) -> Any:
    return parse_playbook(HEAD + gate, "gated.yaml")


# ------------------------------------------------------------------ the spec


def test_a_gate_parses_with_three_rounds_by_default_and_renders_its_body() -> None:
    pb = playbook()
    assert pb.gate is not None and pb.gate.probes[0].rounds == 3 and pb.gate.reprobes == 1
    assert pb.gate.on_inconclusive == "fail"
    rendered = render_playbook(pb, None, {**pb.vars, "tokens": 16}, Renderer([]))
    gate = rendered.gate
    assert gate is not None and gate.base_url == "http://127.0.0.1:30000"
    probe = gate.probes[0]
    assert probe.label == "/generate@16"
    assert probe.body == {"text": "p", "sampling_params": {"max_new_tokens": "16"}}
    assert probe.headers == {"Authorization": "Bearer 30000"}
    # the key names what is measured: the same probe keeps it, another body or concurrency changes it
    again = render_playbook(pb, None, {**pb.vars, "tokens": 16}, Renderer([])).gate
    other = render_playbook(pb, None, {**pb.vars, "tokens": 32}, Renderer([])).gate
    assert again is not None and other is not None
    assert again.probes[0].key == probe.key != other.probes[0].key


BAD_GATES = [
    ("gate:\n  probes:\n    - post: /generate\n",
     "gated.yaml:7: gate: no rules for probe /generate@8: nothing would be checked"),
    ("gate:\n  probes:\n    - post: /generate\n  rules:\n    tokens_per_s: {min_ratio: 0}\n",
     "gated.yaml:11: gate.rules.tokens_per_s.min_ratio: must be > 0.0 (got: 0)"),
    ("gate:\n  probes:\n    - post: /generate\n  rules:\n    tokens_per_s: {}\n",
     "gated.yaml:11: gate.rules.tokens_per_s: expected at least one of min_ratio, max_ratio, min, max"),
    ("gate:\n  probes:\n    - post: /generate\n  rules:\n    tokens_per_sec: {min: 1}\n",
     "gated.yaml:11: gate.rules.tokens_per_sec: extra key not permitted (did you mean 'tokens_per_s'?)"),
    ("gate:\n  probes:\n    - post: /generate\n  rules:\n    greedy: different\n",
     "gated.yaml:11: gate.rules.greedy: expected one of same (got: different)"),
    ("gate:\n  probes:\n    - post: /generate\n      greedy: false\n  rules:\n    greedy: same\n",
     "gated.yaml:10: gate.probes[0].greedy: greedy: same needs the probe's greedy request (greedy: true)"),
    ("gate:\n  probes:\n    - post: /generate\n    - post: /generate\n  rules: {errors: 0}\n",
     "gated.yaml:10: gate.probes[1]: two probes are named /generate@8: give each its own name:"),
    ("gate:\n  probes:\n    - post: /generate\n  rules: {errors: -1}\n",
     "gated.yaml:10: gate.rules.errors: must be >= 0 (got: -1)"),
    ("gate:\n  probes:\n    - post: /generate\n  rules: {errors: 0}\n  on_inconclusive: maybe\n",
     "gated.yaml:11: gate.on_inconclusive: expected one of fail, pass (got: maybe)"),
    ("gate:\n  probes:\n    - post: /generate\n      rounds: 0\n  rules: {errors: 0}\n",
     "gated.yaml:10: gate.probes[0].rounds: must be >= 1 (got: 0)"),
]


@pytest.mark.parametrize(("gate", "expected"), BAD_GATES)
def test_a_bad_gate_is_one_line_naming_file_line_and_key(gate: str, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        playbook(gate)
    assert str(err.value) == expected


def test_a_gate_needs_health_and_a_server() -> None:
    with pytest.raises(ConfigError) as err:
        parse_playbook("name: x\ngate:\n  probes: [{post: /g}]\n  rules: {errors: 0}\n", "x.yaml")
    assert str(err.value) == ("x.yaml:2: gate: a gate needs server and health: (it probes the restarted "
                              "server at health.base_url)")


def test_a_bad_gate_is_refused_by_the_cli_with_exit_2_and_nothing_touched(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (tmp_path / "inventory.yaml").write_text(json.dumps(
        {"hosts": {"box": {"connection": "local", "state_dir": str(state), "vars": {"sglang_root": "/x"}}}}))
    (tmp_path / "bad.yaml").write_text(HEAD + BAD_GATES[1][0])
    proc = run_orch(["deploy", "--host", "box", "--json", "bad.yaml"], cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["error"].endswith(
        "bad.yaml:11: gate.rules.tokens_per_s.min_ratio: must be > 0.0 (got: 0)")
    assert not state.exists()  # the host was never opened


# ------------------------------------------------------------------ one bound


def m(median: float, spread: float = 0.0) -> Measured:
    """A figure with ``median`` and a range of ``spread`` (relative) around it."""
    return Measured(median, median * (1 - spread / 2), median * (1 + spread / 2))


def test_bounds_pass_fail_and_the_spread_makes_inconclusive() -> None:
    assert judge_bound("min_ratio", 0.95, m(500), m(480))[0] == "pass"  # 480 >= 475
    assert judge_bound("min_ratio", 0.95, m(500), m(250))[0] == "fail"
    assert judge_bound("min_ratio", 0.95, m(500, 0.04), m(470, 0.04))[0] == "inconclusive"  # 470 vs 475 ± 19
    assert judge_bound("max_ratio", 1.10, m(100), m(105))[0] == "pass"
    assert judge_bound("max_ratio", 1.10, m(100), m(120))[0] == "fail"
    assert judge_bound("min", 700, None, m(650))[0] == "fail"
    assert judge_bound("min", 700, None, m(690, 0.1))[0] == "inconclusive"
    assert judge_bound("max", 0, None, m(0))[0] == "pass"
    verdict, why = judge_bound("min_ratio", 0.95, m(500), None)
    assert verdict == "fail" and "no figure after the deploy" in why
    verdict, why = judge_bound("min_ratio", 0.95, None, m(10))
    assert verdict == "pass" and "no baseline figure" in why
    assert judge_bound("min_ratio", 0.95, m(500), m(250))[1] == "250.0, needs ≥ 0.95 × before (500.0)"


values = st.floats(min_value=1.0, max_value=1e5, allow_nan=False)
spreads = st.floats(min_value=0.0, max_value=0.5, allow_nan=False)
ratios = st.floats(min_value=0.1, max_value=3.0, allow_nan=False)
kinds = st.sampled_from(["min_ratio", "max_ratio"])
ORDER = {"fail": 0, "inconclusive": 1, "pass": 2}


@settings(max_examples=300, deadline=None)
@given(kinds, ratios, values, values)
def test_without_spread_no_verdict_is_inconclusive_and_the_medians_decide(
        kind: str, ratio: float, before: float, after: float) -> None:
    verdict, _ = judge_bound(kind, ratio, m(before), m(after))
    threshold = ratio * before
    expected = (after >= threshold) if kind == "min_ratio" else (after <= threshold)
    assert verdict == ("pass" if expected else "fail")


@settings(max_examples=300, deadline=None)
@given(kinds, ratios, values, values, spreads, spreads, st.floats(min_value=0.01, max_value=100.0))
def test_a_ratio_verdict_does_not_depend_on_the_unit(
        kind: str, ratio: float, before: float, after: float, sb: float, sa: float, scale: float) -> None:
    one = judge_bound(kind, ratio, m(before, sb), m(after, sa))[0]
    scaled = judge_bound(kind, ratio, m(before, sb).scaled(scale), m(after, sa).scaled(scale))[0]
    # equal up to float rounding at the exact edge of the noise band
    if one != scaled:
        threshold = ratio * before
        edge = abs(abs(after - threshold) - (m(after, sa).half_range + m(threshold, sb).half_range))
        assert edge <= 1e-6 * max(after, threshold)


@settings(max_examples=300, deadline=None)
@given(ratios, values, values, values, spreads, spreads)
def test_more_throughput_never_makes_a_min_verdict_worse(
        ratio: float, before: float, a: float, b: float, sb: float, sa: float) -> None:
    low, high = sorted((a, b))
    worse = judge_bound("min_ratio", ratio, m(before, sb), m(low, sa))[0]
    better = judge_bound("min_ratio", ratio, m(before, sb), m(high, sa))[0]
    assert ORDER[better] >= ORDER[worse]


@settings(max_examples=300, deadline=None)
@given(kinds, ratios, values, values, spreads, spreads)
def test_inconclusive_exactly_when_the_difference_is_within_the_spread(
        kind: str, ratio: float, before: float, after: float, sb: float, sa: float) -> None:
    old, new = m(before, sb), m(after, sa)
    verdict, _ = judge_bound(kind, ratio, old, new)
    threshold = old.scaled(ratio)
    noise = new.half_range + threshold.half_range
    within = noise > 0 and abs(new.median - threshold.median) <= noise
    assert (verdict == "inconclusive") == within


# ------------------------------------------------------------------ a probe's rules


def result(tokens_per_s: list[float], p99: list[float] | None = None, errors: int = 0,
           greedy: str | None = "aa" * 32) -> ProbeResult:
    rounds = tuple(
        ProbeFigures(requests=32, concurrency=16, ok=32 - errors, errors=errors, duration_s=1.0,
                     requests_per_s=t / 8, output_tokens_per_s=t, p50_ms=100.0,
                     p99_ms=(p99 or [200.0] * len(tokens_per_s))[i],
                     first_error="HTTP 500" if errors else None)
        for i, t in enumerate(tokens_per_s))
    return ProbeResult("/generate", rounds, greedy, None if greedy else "connection refused")


RULES = GateRules.model_validate({"tokens_per_s": {"min_ratio": 0.95}, "p99_ms": {"max_ratio": 1.10},
                                  "errors": 0, "greedy": "same"})


def test_check_probe_gives_a_row_per_bound_with_medians_spreads_and_change() -> None:
    before, after = result([540, 542, 545]), result([610, 612, 615], [180.0, 181.0, 190.0])
    checks = check_probe("/generate@16", RULES, before, after)
    assert [(c.name, c.verdict) for c in checks] == [
        ("tokens_per_s.min_ratio", "pass"), ("p99_ms.max_ratio", "pass"), ("errors", "pass"), ("greedy", "pass")]
    tokens = checks[0]
    assert tokens.before == 542.0 and tokens.after == 612.0 and tokens.change_pct == 12.9
    assert tokens.after_spread == round(5 / 612, 4)


def test_errors_and_a_changed_or_missing_fingerprint_fail() -> None:
    before = result([500, 500, 500])
    checks = {c.rule: c for c in check_probe("p", RULES, before, result([500, 500, 500], errors=2, greedy="bb" * 32))}
    assert checks["errors"].verdict == "fail" and checks["errors"].why == "6 failed request(s) (first: HTTP 500)"
    assert checks["greedy"].verdict == "fail" and "the greedy output changed" in checks["greedy"].why
    missing = {c.rule: c for c in check_probe("p", RULES, before, result([500, 500, 500], greedy=None))}
    assert missing["greedy"].verdict == "fail" and "connection refused" in missing["greedy"].why


def test_next_step_fails_at_once_reprobes_while_allowed_then_counts_inconclusive() -> None:
    def rows(*verdicts: str) -> list[RuleCheck]:
        return [RuleCheck("p", "tokens_per_s", "min_ratio", "", v, "") for v in verdicts]  # type: ignore[arg-type]

    assert next_step(rows("pass", "fail", "inconclusive"), 0, 3, "pass") == "fail"
    assert next_step(rows("pass", "inconclusive"), 0, 1, "fail") == "reprobe"
    assert next_step(rows("pass", "inconclusive"), 1, 1, "fail") == "fail"
    assert next_step(rows("pass", "inconclusive"), 1, 1, "pass") == "pass"
    assert next_step(rows("pass", "pass"), 0, 0, "fail") == "pass"
    assert next_step([], 0, 0, "fail") == "pass"


def test_the_table_aligns_its_columns_and_the_message_names_every_failing_rule() -> None:
    checks = check_probe("/generate@16", RULES, result([540, 542, 545]), result([270, 272, 275], [400.0] * 3))
    outcome = GateOutcome("fail", tuple(checks), "probed before the stop")
    lines = plain_table(outcome)
    assert lines[0] == "performance gate: fail (baseline: probed before the stop)"
    header, *rows = lines[1:]
    assert header.split() == list(COLUMNS)
    starts = [header.index(name) for name in COLUMNS]
    for row in rows:
        assert all(row[s - 1] == " " for s in starts[1:])  # every column starts where its header does
    assert "  /generate@16  tokens_per_s  542.0 ±0.5%" in lines[2]
    assert " ".join(lines[2].split()).endswith("-49.8% ≥ 0.95 × before fail")
    message = outcome.message()
    assert message.startswith("performance gate failed: tokens_per_s.min_ratio on /generate@16: 272.0, needs")
    assert "p99_ms.max_ratio on /generate@16" in message and "errors" not in message
    assert GateOutcome.from_json(json.loads(json.dumps(outcome.to_json()))) == outcome


# ------------------------------------------------------------------ baseline and re-probes


def wire_round(tokens_per_s: float, requests: int = 32, new_tokens: int = 8, greedy: str = "same text") -> dict[str, Any]:
    """A ``probe_http`` answer whose round gives ``tokens_per_s``."""
    duration = requests * new_tokens / tokens_per_s
    sample = {"latency": 0.1, "status": 200, "error": None, "tokens": {"meta_info": [{"completion_tokens": new_tokens}]}}
    return {"samples": [sample] * requests, "duration": duration,
            "greedy": {"doc": {"text": greedy}, "status": 200, "error": None}}


class Answers:
    """Stands in for the host session: hands out prepared probe answers, one batch at a time."""

    def __init__(self, *batches: list[dict[str, Any]]) -> None:
        self.batches = list(batches)
        self.sent: list[int] = []

    def batch(self, steps: list[Any], on_event: Any = None) -> BatchResults:
        assert all(s.name == "probe_http" for s in steps)
        self.sent.append(len(steps))
        return BatchResults(steps, self.batches.pop(0))


def gate_run(reprobes: int = 1, on_inconclusive: str = "fail") -> GateRun:
    text = GATE.replace("    tokens_per_s: {min_ratio: 0.95, min: 100}\n", "    tokens_per_s: {min_ratio: 0.95}\n")
    text += f"  reprobes: {reprobes}\n  on_inconclusive: {on_inconclusive}\n"
    pb = playbook(text)
    gate = render_playbook(pb, None, pb.vars, Renderer([])).gate
    assert gate is not None
    return GateRun(gate, to_probe=list(gate.probes))


NOISY = [wire_round(430), wire_round(500), wire_round(560)]  # median 500, range 130 around 475
CLEAR = [wire_round(560), wire_round(561), wire_round(562)]


def test_an_inconclusive_verdict_is_probed_again_and_a_fresh_measurement_decides() -> None:
    run = gate_run()
    run.take_baseline([wire_round(500)] * 3)
    run.take_after(NOISY)
    session = Answers(CLEAR)
    outcome = run.judge(session)  # type: ignore[arg-type]
    assert session.sent == [3]  # one round trip, the three rounds of the one probe concerned
    assert outcome.verdict == "pass" and outcome.reprobes == 1 and outcome.inconclusive_as is None


@pytest.mark.parametrize(("on_inconclusive", "verdict"), [("fail", "fail"), ("pass", "pass")])
def test_a_verdict_still_inconclusive_counts_as_on_inconclusive(on_inconclusive: str, verdict: str) -> None:
    run = gate_run(reprobes=2, on_inconclusive=on_inconclusive)
    run.take_baseline([wire_round(500)] * 3)
    run.take_after(NOISY)
    outcome = run.judge(Answers(NOISY, NOISY))  # type: ignore[arg-type]
    assert outcome.verdict == verdict and outcome.reprobes == 2 and outcome.inconclusive_as == on_inconclusive
    assert plain_table(outcome)[2].endswith(f"inconclusive → {on_inconclusive}")
    if verdict == "fail":
        assert "stayed inconclusive after 2 re-probe(s)" in outcome.message()


def test_the_baseline_comes_from_the_record_only_for_the_server_it_measured() -> None:
    run = gate_run()
    run.take_after(CLEAR)
    probe = run.spec.probes[0]
    manifest = Manifest.from_wire({"id": "R1", "server_after": {"argv": ["python", "-m", "x"]}, **_record_of(run)})
    assert set(recorded_results(manifest, ["python", "-m", "x"])) == {probe.key}
    assert recorded_results(manifest, ["python", "-m", "x", "--other"]) == {}  # restarted by hand since
    recorded = GateRun.for_deploy(run.spec, manifest, ["python", "-m", "x"], force_baseline=False)
    assert recorded.to_probe == [] and recorded.baseline == "release R1's record"
    forced = GateRun.for_deploy(run.spec, manifest, ["python", "-m", "x"], force_baseline=True)
    assert forced.to_probe == [probe] and forced.baseline == "probed before the stop"
    # a server that died since: the record stands for it; without one there is no baseline at all
    gone = GateRun.for_deploy(run.spec, manifest, None, running=False)
    assert gone.to_probe == [] and gone.baseline == "release R1's record"
    nothing = GateRun.for_deploy(run.spec, None, None, running=False)
    assert nothing.to_probe == [] and nothing.baseline == "none: no server was running"
    # status --probe sends again exactly what the gate sent
    again = gate_from_spec_record(json.loads(json.dumps(run.spec_record())))
    assert again == run.spec


def _record_of(run: GateRun) -> dict[str, Any]:
    return {"probe": json.loads(json.dumps(run.record()))}


# ------------------------------------------------------------------ the watchdog's budget


def test_the_watchdog_deadline_covers_every_round_the_reprobes_and_the_baseline() -> None:
    pb = playbook()
    assert pb.gate is not None
    probe = pb.gate.probes[0]
    # three rounds of 32 requests at 16, each bounded by the helper at 30 s × (32 // 16 + 2), and the greedy one
    assert probe_seconds(probe) == 3 * 30 * 4 + 30
    plain = total(deploy_budget(pb.server, pb.health))
    with_record = total(deploy_budget(pb.server, pb.health, gate_items(pb.gate, baseline=False)))
    with_baseline = total(deploy_budget(pb.server, pb.health, gate_items(pb.gate, baseline=True)))
    assert with_record == plain + 2 * probe_seconds(probe)  # the probe and one re-probe
    assert with_baseline == with_record + probe_seconds(probe)


# ------------------------------------------------------------------ the table as a person sees it


def drawn(width: int | None) -> list[str]:
    """The table of a failed gate, drawn off a terminal (``None``) or on one ``width`` wide."""
    import io

    from orchestrator.cli.output import make_output
    from orchestrator.cli.views import draw_gate

    stream = io.StringIO()
    out = make_output(stream=stream, color=False)
    if width is not None:
        out.terminal = True
        out.console.width = width
        out.console.soft_wrap = False
    checks = check_probe("/generate@16", RULES, result([540, 542, 545]), result([270, 272, 275], [400.0] * 3))
    draw_gate(out, "gpu", GateOutcome("fail", tuple(checks), "probed before the stop"))
    return stream.getvalue().splitlines()


def test_the_table_fits_the_medium_and_never_cuts_a_cell() -> None:
    plain = drawn(None)
    assert plain[0] == "gpu performance gate: fail (baseline: probed before the stop)"
    assert plain[1].split() == list(COLUMNS) and len(plain) == 6
    wide = drawn(120)
    assert any(line.startswith("┏") for line in wide)  # a Rich table
    assert any("tokens_per_s" in line and "542.0 ±0.5%" in line and "fail" in line for line in wide)
    narrow = drawn(60)
    assert all(len(line) <= 60 for line in narrow) and not any("…" in line for line in narrow)
    words = " ".join(narrow).split()
    for cell in ("/generate@16", "tokens_per_s:", "542.0", "272.0", "(-49.8%),", "before:"):
        assert cell in words
