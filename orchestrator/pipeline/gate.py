"""The performance gate on a host: the baseline, the probes, the re-probes, the records.

The judgement itself is pure (``core.gate``); this module decides where the
baseline comes from, builds the probe ops that ride in the deploy's own
round trips, re-probes while a verdict is inconclusive, and writes what a
later deploy and ``orch status --probe`` read back:

- the **baseline**: the current release's recorded probe when it measured
  the server that runs now with the same probe (same route, body, requests
  and concurrency: ``RenderedProbe.key``); else the running server is
  probed before it is stopped (``--baseline`` forces that);
- the manifest's ``probe`` record: the new server's figures, probe by
  probe (its ``summary`` is the first probe's, which ``orch history``
  shows as tokens/s), and ``gate``: the verdicts;
- ``probe.json`` beside the manifest: the rendered probes and rules with
  their headers unmasked (0600, like ``restore.json``), so ``status
  --probe`` sends exactly what the gate sent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.gate import GateOutcome
from orchestrator.core.models import GateProbe, GateRules
from orchestrator.core.probe import ProbeResult
from orchestrator.core.rendering import RenderedGate, RenderedProbe

# which recorded figures stand for the running server: the host's to decide too (``host.gate``)
from orchestrator.host.gate import recorded_results as recorded_results
from orchestrator.host.gate_step import ProbeSpec, judge_with_reprobes
from orchestrator.host.records import Manifest
from orchestrator.pipeline.probe import probe_ops, read_probe
from orchestrator.pipeline.session import HostSession
from orchestrator.shell import ops

SPEC_FILE = "probe.json"
"""In a release's directory: the gate's probes as sent (headers unmasked) and its rules."""

PROBED_BEFORE_STOP = "probed before the stop"


@dataclass
class GateRun:
    """One gate on one host, from the baseline to the outcome."""

    spec: RenderedGate
    before: dict[str, ProbeResult] = field(default_factory=dict)
    recorded_in: str | None = None  # the release whose record gave (part of) the baseline
    to_probe: list[RenderedProbe] = field(default_factory=list)  # baseline probes run before the stop
    after: dict[str, ProbeResult] = field(default_factory=dict)
    outcome: GateOutcome | None = None
    nothing_running: bool = False  # no server ran before the deploy: no baseline but a record's

    @classmethod
    def for_deploy(cls, spec: RenderedGate, current: Manifest | None, running_argv: list[str] | None,
                   *, running: bool = True, force_baseline: bool = False) -> GateRun:
        """The baseline from ``current`` (the current release's manifest) where it holds a
        probe of the server running now (``running_argv``, as manifests show it) with the
        same probe; every other probe is measured before the stop. When no server runs
        (``running`` false: it died, the deploy starts one), the record stands for the
        server the current release started, and a probe without one has no baseline."""
        run = cls(spec, nothing_running=not running)
        if not running:  # the current release's own server is the one that is gone
            running_argv = current.server_after.argv if current and current.server_after else None
        recorded = {} if force_baseline else recorded_results(current, running_argv)
        for probe in spec.probes:
            if probe.key in recorded:
                run.before[probe.label] = recorded[probe.key]
                run.recorded_in = str(current.id if current else None)
            elif running:
                run.to_probe.append(probe)
        return run

    @property
    def baseline(self) -> str:
        """Where the before figures come from, in words."""
        parts = []
        if self.recorded_in:
            parts.append(f"release {self.recorded_in}'s record")
        if self.to_probe:
            parts.append(PROBED_BEFORE_STOP)
        if self.nothing_running and not self.recorded_in:
            parts.append("none: no server was running")
        return " and ".join(parts) or "none"

    # ---------------------------------------------------------------- probes as ops

    def baseline_ops(self) -> list[ops.Op]:
        return _ops(self.spec.base_url, self.to_probe)

    def take_baseline(self, answers: Sequence[Any]) -> None:
        self.before.update(_read(self.to_probe, answers))

    def after_ops(self, probes: Sequence[RenderedProbe] | None = None) -> list[ops.Op]:
        return _ops(self.spec.base_url, self.spec.probes if probes is None else probes)

    def take_after(self, answers: Sequence[Any], probes: Sequence[RenderedProbe] | None = None) -> None:
        self.after.update(_read(self.spec.probes if probes is None else probes, answers))

    # ---------------------------------------------------------------- the judgement

    def judge(self, session: HostSession, on_event: Callable[[dict[str, Any]], None] | None = None,
              on_reprobe: Callable[[list[str]], None] | None = None, *, decide: bool = True) -> GateOutcome:
        """Compare; while a verdict is inconclusive and re-probes are left, probe the
        new server again (only the probes concerned, one round trip each time: a fresh
        measurement replaces the last) and compare again — the host's own loop
        (``host.gate_step.judge_with_reprobes``), which a deploy's gate step runs on the
        host. ``decide`` false (``status --probe``: nothing is kept or rolled back) leaves
        a verdict still inconclusive as ``inconclusive`` instead of counting it as
        ``on_inconclusive``."""
        def probe_again(labels: list[str]) -> dict[str, ProbeResult]:
            if on_reprobe is not None:
                on_reprobe(labels)
            again = [p for p in self.spec.probes if p.label in labels]
            reprobe = self.after_ops(again)
            return _read(again, session.batch(reprobe, on_event=on_event).each(reprobe))

        on_inconclusive = self.spec.on_inconclusive if decide else None
        self.outcome = judge_with_reprobes(self.probe_specs(), self.before, self.after, self.spec.reprobes,
                                           on_inconclusive, self.baseline, probe_again)
        return self.outcome

    def probe_specs(self, probes: Sequence[RenderedProbe] | None = None, *, rules: bool = True) -> list[ProbeSpec]:
        """The probes as the host judges them (``host.gate_step.ProbeSpec``)."""
        return [ProbeSpec(p.label, p.config.post, p.config.concurrency, p.config.rounds,
                          p.rules.to_host() if rules else None)
                for p in (self.spec.probes if probes is None else probes)]

    def judge_spec(self) -> dict[str, Any]:
        """What the program's gate step expects (``expect["gate"]``): everything the host
        needs to judge the new server's figures itself, re-probes included."""
        def wire(p: ProbeSpec) -> dict[str, Any]:
            return {"label": p.label, "post": p.post, "concurrency": p.concurrency, "rounds": p.rounds,
                    **({"rules": p.rules.to_wire()} if p.rules is not None else {})}

        return {"probes": [wire(p) for p in self.probe_specs()],
                "before": {label: r.to_json() for label, r in self.before.items()},
                "baseline_step": [wire(p) for p in self.probe_specs(self.to_probe, rules=False)],
                "reprobes": self.spec.reprobes, "on_inconclusive": self.spec.on_inconclusive,
                "baseline": self.baseline}

    def take_judged(self, judged: Mapping[str, Any]) -> GateOutcome:
        """The outcome the host's gate step decided, and the figures it decided on."""
        self.after.update({str(k): ProbeResult.from_json(v) for k, v in (judged.get("after") or {}).items()})
        self.outcome = GateOutcome.from_json(judged.get("outcome") or {})
        return self.outcome

    # ---------------------------------------------------------------- records

    def record(self) -> dict[str, Any]:
        """The manifest's ``probe`` record: the new server's figures, probe by probe."""
        probes: list[dict[str, Any]] = [{"label": p.label, "key": p.key, "post": p.config.post, "requests": p.config.requests,
                   "concurrency": p.config.concurrency, "result": self.after[p.label].to_json()}
                  for p in self.spec.probes if p.label in self.after]
        summary = probes[0]["result"]["summary"] if probes else None
        return {"base_url": self.spec.base_url, "summary": summary, "probes": probes}

    def stamp_template(self) -> dict[str, Any]:
        """What the host's ``release_stamp`` needs to write ``record()`` from the figures its
        gate step judged (``gate_judged.json``): every probe's settings, its result left out."""
        return {"base_url": self.spec.base_url,
                "probes": [{"label": p.label, "key": p.key, "post": p.config.post, "requests": p.config.requests,
                            "concurrency": p.config.concurrency} for p in self.spec.probes]}

    def spec_record(self) -> dict[str, Any]:
        """``probe.json``: what ``status --probe`` sends again, and the rules it judges by."""
        return {
            "base_url": self.spec.base_url,
            "reprobes": self.spec.reprobes,
            "on_inconclusive": self.spec.on_inconclusive,
            "probes": [{"label": p.label, "config": p.config.model_dump(mode="json", by_alias=True),
                        "body": p.body, "headers": p.headers,
                        "rules": p.rules.model_dump(mode="json", exclude_none=True)}
                       for p in self.spec.probes],
        }


def gate_from_spec_record(data: Mapping[str, Any]) -> RenderedGate:
    """``probe.json`` back into the gate it was written from."""
    probes = tuple(
        RenderedProbe(label=str(p["label"]), config=GateProbe.model_validate(p["config"]), body=p.get("body"),
                      headers={str(k): str(v) for k, v in (p.get("headers") or {}).items()},
                      rules=GateRules.model_validate(p.get("rules") or {}))
        for p in data.get("probes") or []
    )
    return RenderedGate(str(data["base_url"]), probes, int(data.get("reprobes") or 0),
                        "pass" if data.get("on_inconclusive") == "pass" else "fail")


def probe_now(session: HostSession, release_dir: str, manifest: Manifest,
              on_event: Callable[[dict[str, Any]], None] | None = None) -> GateOutcome | str:
    """``orch status --probe``: probe the server now and judge it against the release's
    record, by the release's own rules, re-probing ``reprobes`` times as the deploy's gate
    does; a verdict still inconclusive stays one (status decides nothing, so
    ``on_inconclusive`` does not apply). Returns the outcome, or why there is none."""
    if manifest.probe is None:
        return f"release {manifest.id} has no recorded probe (its playbook has no gate:)"
    data = session.run(ops.get_json(f"{release_dir}/{SPEC_FILE}"))
    if not isinstance(data, dict):
        return f"release {manifest.id} has no {SPEC_FILE}: nothing says what to send"
    spec = gate_from_spec_record(data)
    recorded = {p.label: ProbeResult.from_json(p.result) for p in manifest.recorded_probes}
    run = GateRun(spec, before=recorded, recorded_in=manifest.id)
    probes = run.after_ops()
    run.take_after(session.batch(probes, on_event=on_event).each(probes))
    return run.judge(session, on_event, decide=False)


def _ops(base_url: str, probes: Sequence[RenderedProbe]) -> list[ops.Op]:
    return [op for p in probes for op in probe_ops(base_url, p.config, p.body, p.headers)]


def _read(probes: Sequence[RenderedProbe], answers: Sequence[Any]) -> dict[str, ProbeResult]:
    """Split the answers of ``_ops(…, probes)`` probe by probe (each has ``rounds`` ops)."""
    out: dict[str, ProbeResult] = {}
    at = 0
    for p in probes:
        out[p.label] = read_probe(p.config, answers[at:at + p.config.rounds])
        at += p.config.rounds
    return out
