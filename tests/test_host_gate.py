"""The gate's judgement and retention in the host package (``host/gate.py``,
``host/figures.py``, ``host/retention.py``): their types round-trip their wire form,
a rule the host cannot judge by is refused in one line, and the host's judgement is
the controller's — in this interpreter and on the hosts' oldest Python, from the very
archive the helper ships.

(The judgement's behaviour itself: tests/test_gate.py and tests/test_status_probe.py;
retention over real releases: tests/test_releases.py and tests/test_clock.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from orchestrator.core import gate as controller_gate
from orchestrator.core import releases as controller_releases
from orchestrator.core.models import GateRules as PlaybookRules
from orchestrator.host import gate as host_gate
from orchestrator.host import retention
from orchestrator.host.figures import ProbeFigures, ProbeResult
from orchestrator.host.records import Manifest
from orchestrator.shell.agent_client import helper_archive
from tests.test_agent import INTERPRETERS

# ------------------------------------------------------------------ wire forms

BOUNDS = st.fixed_dictionaries({}, optional={
    "min_ratio": st.floats(0.01, 10), "max_ratio": st.floats(0.01, 10),
    "min": st.floats(0, 1e6), "max": st.floats(0, 1e6),
}).filter(bool)
RULES = st.fixed_dictionaries({}, optional={
    "tokens_per_s": BOUNDS, "requests_per_s": BOUNDS, "p50_ms": BOUNDS, "p99_ms": BOUNDS,
    "errors": st.integers(0, 100), "greedy": st.just("same"),
})


@settings(max_examples=200, deadline=None)
@given(RULES)
def test_gate_rules_round_trip_their_wire_form_and_match_the_playbook_s_model(wire: dict[str, Any]) -> None:
    rules = host_gate.GateRules.from_wire(wire)
    assert rules.to_wire() == wire
    assert host_gate.GateRules.from_wire(json.loads(json.dumps(rules.to_wire()))) == rules
    assert rules.empty == (not wire)
    playbook = PlaybookRules.model_validate(wire)  # the controller's validation of the same mapping
    assert playbook.to_wire() == wire
    assert playbook.to_host() == rules


def test_an_absent_rules_mapping_is_no_rule_and_ints_are_read_as_floats() -> None:
    assert host_gate.GateRules.from_wire(None) == host_gate.GateRules() and host_gate.GateRules().empty
    rules = host_gate.GateRules.from_wire({"p99_ms": {"max_ratio": 1, "max": 400}, "errors": 0})
    assert rules.p99_ms == host_gate.Bounds(max_ratio=1.0, max=400.0)
    assert rules.p99_ms.limits() == [("max_ratio", 1.0), ("max", 400.0)]  # BOUND_KINDS order
    assert rules.errors == 0 and rules.tokens_per_s is None


@pytest.mark.parametrize(("wire", "line"), [
    ({"tokens_per_sec": {"min": 1}}, "rules.tokens_per_sec: not a gate rule"),
    ({"tokens_per_s": {"min_ration": 1}}, "rules.tokens_per_s.min_ration: not a bound"),
    ({"tokens_per_s": {}}, "rules.tokens_per_s: expected at least one of min_ratio, max_ratio, min, max"),
    ({"tokens_per_s": 0.95}, "rules.tokens_per_s: expected a mapping"),
    ({"p99_ms": {"max_ratio": 0}}, "rules.p99_ms.max_ratio: must be more than 0"),
    ({"p50_ms": {"min": -1}}, "rules.p50_ms.min: must be 0 or more"),
    ({"errors": -1}, "rules.errors: expected a count (0 or more), got -1"),
    ({"greedy": "similar"}, "rules.greedy: expected same, got 'similar'"),
    (["tokens_per_s"], "rules: expected a mapping of rules"),
])
def test_rules_the_host_cannot_judge_by_are_refused_in_one_line_naming_the_key(wire: Any, line: str) -> None:
    """Never a rule dropped and the rest judged: a dropped bound would pass what it should fail.
    The playbook's model refuses each of them too, so none reaches a host from a playbook."""
    with pytest.raises(host_gate.BadRules) as refused:
        host_gate.GateRules.from_wire(wire)
    assert str(refused.value).startswith(line) and "\n" not in str(refused.value)
    with pytest.raises(ValidationError):
        PlaybookRules.model_validate(wire)


@pytest.mark.parametrize(("wire", "line", "handed"), [
    ({"p99_ms": {"max_ratio": "1.1"}}, "rules.p99_ms.max_ratio: expected a number, got '1.1'",
     {"p99_ms": {"max_ratio": 1.1}}),
    ({"p99_ms": {"max": True}}, "rules.p99_ms.max: expected a number, got True", {"p99_ms": {"max": 1.0}}),
    ({"errors": False}, "rules.errors: expected a count (0 or more), got False", {"errors": 0}),
])
def test_the_host_reads_numbers_only_and_the_playbook_s_model_hands_it_numbers(
        wire: dict[str, Any], line: str, handed: dict[str, Any]) -> None:
    """The playbook's model coerces (pydantic's lax mode); what reaches the host is its
    ``to_wire()``, numbers, so the host's reader need not guess what a string meant."""
    with pytest.raises(host_gate.BadRules, match=f"^{line.replace('(', '[(]').replace(')', '[)]')}$"):
        host_gate.GateRules.from_wire(wire)
    model = PlaybookRules.model_validate(wire)
    assert model.to_wire() == handed
    assert model.to_host() == host_gate.GateRules.from_wire(handed)


def figures(tokens: float | None, p99: float, errors: int = 0) -> ProbeFigures:
    return ProbeFigures(requests=16, concurrency=4, ok=16 - errors, errors=errors, duration_s=2.0,
                        requests_per_s=8.0, output_tokens_per_s=tokens, p50_ms=p99 / 2, p99_ms=p99,
                        first_error="HTTP 500" if errors else None)


def result(tokens: list[float | None], p99: list[float], greedy: str | None = "aa" * 32,
           errors: int = 0) -> ProbeResult:
    rounds = tuple(figures(t, p, errors if i == 0 else 0) for i, (t, p) in enumerate(zip(tokens, p99, strict=True)))
    return ProbeResult("/generate", rounds, greedy, None if greedy else "HTTP 500")


def test_probe_results_rule_checks_and_outcomes_round_trip_their_json() -> None:
    before = result([540, 542, 545], [300, 310, 305])
    assert ProbeResult.from_json(json.loads(json.dumps(before.to_json()))) == before
    rules = host_gate.GateRules.from_wire({"tokens_per_s": {"min_ratio": 0.95}, "errors": 0, "greedy": "same"})
    checks = host_gate.check_probe("/generate@4", rules, before, result([520, 530, 600], [300] * 3, "bb" * 32))
    assert [c.verdict for c in checks] == ["inconclusive", "pass", "fail"]
    outcome = host_gate.GateOutcome("fail", tuple(checks), "probed before the stop", 1, "fail")
    back = host_gate.GateOutcome.from_json(json.loads(json.dumps(outcome.to_json())))
    assert back == outcome
    assert back.to_json()["failed"] == ["tokens_per_s.min_ratio on /generate@4", "greedy on /generate@4"]


# ------------------------------------------------------------------ one judgement

RULE_SETS = [
    {"tokens_per_s": {"min_ratio": 0.95, "min": 100}, "p99_ms": {"max_ratio": 1.10}, "errors": 0},
    {"requests_per_s": {"min": 5}, "p50_ms": {"max": 200}, "greedy": "same"},
    {"tokens_per_s": {"max_ratio": 2, "min_ratio": 0.5}, "p99_ms": {"min": 0, "max": 1000}, "errors": 3},
    {"greedy": "same"},
]
PAIRS = [
    (result([540, 542, 545], [300, 310, 305]), result([270, 272, 275], [400] * 3)),  # clear regression
    (result([540, 542, 545], [300, 310, 305]), result([500, 540, 560], [300, 340, 320])),  # within the noise
    (None, result([540], [300], greedy=None, errors=2)),  # no baseline; the greedy request failed
    (result([None, None], [300, 300]), result([None, None], [300, 300], greedy="cc" * 32)),  # no token counts
]


@pytest.mark.parametrize("wire", RULE_SETS)
def test_the_host_s_judgement_is_the_controller_s_on_each_rule_set(wire: dict[str, Any]) -> None:
    """The controller judges with the playbook's model, the host with its dataclass read from the
    same mapping: every row, verdict, figure and the deploy's next step are equal."""
    playbook, host = PlaybookRules.model_validate(wire), host_gate.GateRules.from_wire(wire)
    for before, after in PAIRS:
        ours = controller_gate.check_probe("/generate@4", playbook, before, after)
        theirs = host_gate.check_probe("/generate@4", host, before, after)
        assert [c.to_json() for c in ours] == [c.to_json() for c in theirs] and ours
        for done in (0, 1):
            for on_inconclusive in ("fail", "pass", None):
                assert (controller_gate.next_step(ours, done, 1, on_inconclusive)
                        == host_gate.next_step(theirs, done, 1, on_inconclusive))


def test_the_judgement_runs_from_the_helper_s_archive_on_the_hosts_pythons(tmp_path: Path) -> None:
    """The host imports the judgement from the archive it is sent (nothing else of orch) on
    its own Python, 3.8 and newer, and reaches the verdicts the controller reaches."""
    archive = tmp_path / "helper.zip"
    archive.write_bytes(helper_archive())
    before, after = PAIRS[0]
    wire = RULE_SETS[0]
    program = (
        "import json, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from orchestrator.host import gate, figures\n"
        "data = json.loads(sys.stdin.read())\n"
        "rules = gate.GateRules.from_wire(data['rules'])\n"
        "before, after = (figures.ProbeResult.from_json(data[k]) for k in ('before', 'after'))\n"
        "checks = gate.check_probe('p', rules, before, after)\n"
        "step = gate.next_step(checks, 0, 1, 'fail')\n"
        "print(json.dumps({'checks': [c.to_json() for c in checks], 'step': step,\n"
        "                  'table': gate.plain_table(gate.GateOutcome(step, tuple(checks), 'b'))}))\n"
    )
    expected = controller_gate.check_probe("p", PlaybookRules.model_validate(wire), before, after)
    step = controller_gate.next_step(expected, 0, 1, "fail")
    table = controller_gate.plain_table(controller_gate.GateOutcome(step, tuple(expected), "b"))
    stdin = json.dumps({"rules": wire, "before": before.to_json(), "after": after.to_json()})
    assert any("3.8" in p for p in INTERPRETERS) or sys.version_info[:2] == (3, 8), INTERPRETERS
    for python in INTERPRETERS:
        run = subprocess.run([python, "-I", "-c", program, str(archive)], input=stdin,
                             capture_output=True, text=True, timeout=60, check=False)
        assert run.returncode == 0, (python, run.stderr)
        answer = json.loads(run.stdout)
        assert answer == {"checks": [c.to_json() for c in expected], "step": step, "table": table}, python
        assert step == "fail"


# ------------------------------------------------------------------ retention


def manifest(rid: str, seq: int | None, drift: list[str] | None = None) -> Manifest:
    wire: dict[str, Any] = {"id": rid, "kind": "deploy", "outcome": "deployed", "files": []}
    if seq is not None:
        wire["seq"] = seq
    if drift:
        wire["drift_kept"] = [{"path": p} for p in drift]
    return Manifest.from_wire(wire)


def test_retention_orders_by_the_host_s_seq_and_keeps_what_is_in_effect_or_holds_drift() -> None:
    """A stepped clock stamps the newest release earliest: the order is ``seq``'s; releases
    from before ``seq`` first. In effect and drift-holding releases are never removed."""
    found = [manifest("20260105T000000000-dddd", 4), manifest("20260101T000000000-aaaa", None),
             manifest("20260103T000000000-cccc", 3, drift=["/srv/app.py"]),
             manifest("20260102T000000000-bbbb", 2), manifest("20260100T000000000-eeee", 5)]
    ids = retention.ordered_ids(found)
    assert ids == ["20260101T000000000-aaaa", "20260102T000000000-bbbb", "20260103T000000000-cccc",
                   "20260105T000000000-dddd", "20260100T000000000-eeee"]
    holding = retention.drift_kept(found)
    assert holding == {"20260103T000000000-cccc": ["/srv/app.py"]}
    plan = retention.prune_plan(ids, ["20260101T000000000-aaaa", "20260100T000000000-eeee"], 2, holding)
    assert plan.remove == ["20260102T000000000-bbbb", "20260105T000000000-dddd"]
    assert plan.held == holding
    assert "20260103T000000000-cccc/files/<n>.drift" in retention.held_note("20260103T000000000-cccc", ["/srv/app.py"])
    # the controller's names are these very functions: one retention
    assert controller_releases.prune_plan is retention.prune_plan
    assert controller_releases.ordered_ids is retention.ordered_ids


def test_builds_are_pruned_by_their_night_s_seq_never_current_nor_previous() -> None:
    builds = ["n1", "n2", "n3", "n4", "n5"]
    seqs = {"n1": 5, "n2": 1, "n3": 2, "n4": 3, "n5": 4}  # n1 named first, made last
    assert retention.builds_to_prune(builds, "n1", "n5", keep=3, seqs=seqs) == ["n2", "n3"]
    assert retention.builds_to_prune(builds, "n1", "n2", keep=2, complete=["n1", "n2", "n4"], seqs=seqs) == [
        "n3", "n5", "n4"]  # half-built ones first, and never counted toward keep


def test_a_decided_outcome_says_what_inconclusive_verdicts_counted_as_only_where_some_were_left() -> None:
    rules = host_gate.GateRules.from_wire({"tokens_per_s": {"min_ratio": 0.95}, "errors": 0})
    before = result([540, 542, 545], [300] * 3)
    left = host_gate.check_probe("p", rules, before, result([520, 530, 600], [300] * 3))
    clear = host_gate.check_probe("p", rules, before, result([541, 542, 543], [300] * 3))
    step = host_gate.next_step(left, 1, 1, "pass")
    assert step == "pass"
    outcome = host_gate.GateOutcome.decided(step, left, "b", 1, "pass")
    assert outcome.inconclusive_as == "pass" and outcome.checks == tuple(left)
    assert outcome.verdict_cell(left[0]) == "inconclusive → pass"
    assert host_gate.GateOutcome.decided("pass", clear, "b", 0, "fail").inconclusive_as is None
    assert host_gate.GateOutcome.decided("fail", left, "b", 1, "fail").failing == [left[0]]
