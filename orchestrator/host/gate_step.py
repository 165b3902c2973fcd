"""The gate's step of a release's program, decided on the host.

The program's ``gate`` step runs the probes of the new server; what it
``expect``s (``GateSpec``) says how to judge them: each probe's rules and
rounds, the recorded baseline, the probes measured before the stop (the
``baseline`` step's answers), the re-probes allowed and what a verdict left
inconclusive counts as. ``judge_gate`` compares, re-probes the new server
while a verdict is inconclusive (only the probes concerned), and returns
the ``GateOutcome`` with the figures it was decided on. The executor fails
the step when the gate does, so a release run with no controller is judged
exactly as one watched from a laptop.

Standard library only, Python 3.8 syntax: this module is shipped to the host.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .figures import ProbeResult, probe_result
from .gate import GateOutcome, GateRules, check_probe, inconclusive_probes, next_step


class ProbeSpec:
    """One probe as the gate step judges it: its label, route, concurrency, rounds, rules."""

    __slots__ = ("label", "post", "concurrency", "rounds", "rules")

    def __init__(self, label: str, post: str, concurrency: int, rounds: int, rules: GateRules | None) -> None:
        self.label, self.post, self.concurrency, self.rounds, self.rules = label, post, concurrency, rounds, rules

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> ProbeSpec:
        rules = wire.get("rules")
        return cls(str(wire["label"]), str(wire["post"]), int(wire["concurrency"]), int(wire["rounds"]),
                   GateRules.from_wire(rules) if rules is not None else None)

    def read(self, answers: Sequence[Any]) -> ProbeResult:
        return probe_result(self.post, self.concurrency, answers)


def split(probes: Sequence[ProbeSpec], answers: Sequence[Any]) -> dict[str, ProbeResult]:
    """The answers of the probes' rounds, in order, as one result per probe."""
    out = {}
    at = 0
    for p in probes:
        out[p.label] = p.read(answers[at:at + p.rounds])
        at += p.rounds
    return out


def judge_with_reprobes(probes: Sequence[ProbeSpec], before: Mapping[str, ProbeResult],
                        after: dict[str, ProbeResult], reprobes: int, on_inconclusive: Any, baseline: str,
                        probe_again: Callable[[list[str]], Mapping[str, ProbeResult]]) -> GateOutcome:
    """Compare; while a verdict is inconclusive and re-probes are left, measure the probes
    concerned again (``probe_again``: a fresh measurement replaces the last) and compare
    again. ``on_inconclusive`` None (``status --probe``, which decides nothing) leaves a
    verdict still inconclusive as ``inconclusive``. ``after`` ends as the figures judged."""
    done = 0
    while True:
        checks = []
        for p in probes:
            if p.rules is not None:
                checks += check_probe(p.label, p.rules, before.get(p.label), after[p.label])
        step = next_step(checks, done, reprobes, on_inconclusive)
        if step != "reprobe":
            return GateOutcome.decided(step, checks, baseline, done, on_inconclusive)
        after.update(probe_again(inconclusive_probes(checks)))
        done += 1


def judge_gate(spec: Mapping[str, Any], after_answers: Sequence[Any], baseline_answers: Sequence[Any],
               run_again: Callable[[list[str], list[int]], list[Any]]) -> tuple[GateOutcome, dict[str, ProbeResult]]:
    """The gate step's verdict (``spec``: its ``expect["gate"]``). ``run_again(labels,
    indexes)`` measures the probes ``labels`` again: it runs the step's requests at
    ``indexes`` again and answers them in order."""
    probes = [ProbeSpec.from_wire(p) for p in spec.get("probes") or []]
    before = {str(k): ProbeResult.from_json(v) for k, v in (spec.get("before") or {}).items()}
    before.update(split([ProbeSpec.from_wire(p) for p in spec.get("baseline_step") or []], baseline_answers))
    after = split(probes, after_answers)
    first = {}
    at = 0
    for p in probes:
        first[p.label] = at
        at += p.rounds

    def probe_again(labels: list[str]) -> dict[str, ProbeResult]:
        again = [p for p in probes if p.label in labels]
        indexes = [first[p.label] + n for p in again for n in range(p.rounds)]
        return split(again, run_again([p.label for p in again], indexes))

    outcome = judge_with_reprobes(probes, before, after, int(spec.get("reprobes") or 0),
                                  spec.get("on_inconclusive") or "fail", str(spec.get("baseline") or "none"),
                                  probe_again)
    return outcome, after
