"""The performance gate's judgement: figures before and after → a verdict per rule.

A deploy with a ``gate:`` probes the server before it is stopped (or takes
the current release's recorded probe) and again once the new server is
healthy; this module compares the two. Each bound of each rule gets a
verdict:

- ``pass`` / ``fail`` when the medians are clearly on one side of the bound;
- ``inconclusive`` when the difference between the median and the bound is
  within the measured noise: half the range of the rounds on each side
  (the before figure's range scales with a ratio bound; an absolute bound
  has none). With one round there is no range, so no verdict is
  inconclusive.

``next_step`` says what the deploy does with a set of verdicts: ``pass``,
``fail``, or ``reprobe`` (measure the new server again — a clear fail is
never re-probed); a verdict still inconclusive when the re-probes are used
up counts as ``on_inconclusive`` — or, for ``orch status --probe``, which
decides nothing, stays ``inconclusive`` (exit 0: a change within the noise
is no regression shown). ``GateOutcome`` is what is shown (the
before/after table), recorded in the release's manifest and put in
``--json``.

Both sides judge: the controller today, the host when it runs a release's
program itself. So the judgement lives in the host package (standard
library only, Python 3.8 syntax, annotations never evaluated) and reads the
gate's rules as plain dataclasses parsed once from their wire form (the
``rules:`` mapping as a playbook writes it and ``probe.json`` keeps it);
the controller's pydantic models validate playbooks and hand their rules
over with ``to_host()``, and ``core.gate`` re-exports these names. Pure:
``ProbeResult`` in, dataclasses out.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any, Literal

from .figures import ProbeResult
from .records import Manifest

# --------------------------------------------------------------- the rules

BOUND_KINDS = ("min_ratio", "max_ratio", "min", "max")
"""A figure's bounds, in the order they are checked (and the table's rows)."""

FIGURE_RULES: Mapping[str, str] = MappingProxyType({
    "tokens_per_s": "output_tokens_per_s",
    "requests_per_s": "requests_per_s",
    "p50_ms": "p50_ms",
    "p99_ms": "p99_ms",
})
"""A gate rule's name -> the probe figure it bounds (``host.figures.FIGURES``), in check order."""

RULE_KEYS = (*FIGURE_RULES, "errors", "greedy")
"""Every key of a gate's ``rules:`` mapping."""


class BadRules(ValueError):
    """Rules whose wire form no gate can judge by; one line naming the key.

    The controller's models refuse these in a playbook already: this is the
    host's own check of what reaches it, so that nothing is judged by rules
    it read wrong (a bound silently dropped would pass what it should fail).
    """


@dataclass(frozen=True)
class Bounds:
    """The bounds one figure must keep: against the baseline (``min_ratio``,
    ``max_ratio``) or absolute (``min``, ``max``, in the figure's own unit)."""

    min_ratio: float | None = None
    max_ratio: float | None = None
    min: float | None = None
    max: float | None = None

    @classmethod
    def from_wire(cls, data: Any, where: str) -> Bounds:
        """``{"min_ratio": 0.95, …}`` as a ``Bounds``; ``BadRules`` naming ``where.key`` otherwise."""
        if not isinstance(data, dict):
            raise BadRules(f"{where}: expected a mapping of {', '.join(BOUND_KINDS)}, got {data!r}")
        unknown = sorted(str(k) for k in data if k not in BOUND_KINDS)
        if unknown:
            raise BadRules(f"{where}.{unknown[0]}: not a bound (known: {', '.join(BOUND_KINDS)})")
        limits = {kind: _limit(data[kind], kind, f"{where}.{kind}")
                  for kind in BOUND_KINDS if data.get(kind) is not None}
        if not limits:
            raise BadRules(f"{where}: expected at least one of {', '.join(BOUND_KINDS)}")
        return cls(**limits)

    def to_wire(self) -> dict[str, float]:
        return {kind: limit for kind, limit in self.limits()}

    def limits(self) -> list[tuple[str, float]]:
        """The bounds set, in ``BOUND_KINDS`` order."""
        found = ((kind, getattr(self, kind)) for kind in BOUND_KINDS)
        return [(kind, float(limit)) for kind, limit in found if limit is not None]


def _limit(value: Any, kind: str, where: str) -> float:
    """One bound's number: a ratio more than 0, an absolute bound 0 or more (as the playbook's)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRules(f"{where}: expected a number, got {value!r}")
    if kind.endswith("_ratio") and not value > 0:
        raise BadRules(f"{where}: must be more than 0, got {value!r}")
    if not kind.endswith("_ratio") and not value >= 0:
        raise BadRules(f"{where}: must be 0 or more, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class GateRules:
    """What must hold after the deploy, figure by figure.

    ``errors``: at most this many failed requests over all rounds of the new
    server's probe; ``greedy: same``: the greedy fingerprint (one request at
    temperature 0) equals the baseline's.
    """

    tokens_per_s: Bounds | None = None
    requests_per_s: Bounds | None = None
    p50_ms: Bounds | None = None
    p99_ms: Bounds | None = None
    errors: int | None = None
    greedy: Literal["same"] | None = None

    @property
    def empty(self) -> bool:
        return all(getattr(self, key) is None for key in RULE_KEYS)

    def bounds(self, rule: str) -> Bounds | None:
        """The bounds of ``rule`` (a ``FIGURE_RULES`` name), None where it has none."""
        found: Bounds | None = getattr(self, rule)
        return found

    @classmethod
    def from_wire(cls, data: Any, where: str = "rules") -> GateRules:
        """The ``rules:`` mapping (as a playbook writes it; absent keys: no rule) as
        ``GateRules``; ``BadRules`` naming the key otherwise."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise BadRules(f"{where}: expected a mapping of rules, got {data!r}")
        unknown = sorted(str(k) for k in data if k not in RULE_KEYS)
        if unknown:
            raise BadRules(f"{where}.{unknown[0]}: not a gate rule (known: {', '.join(RULE_KEYS)})")
        bounds = {rule: Bounds.from_wire(data[rule], f"{where}.{rule}")
                  for rule in FIGURE_RULES if data.get(rule) is not None}
        errors = data.get("errors")
        if errors is not None and (isinstance(errors, bool) or not isinstance(errors, int) or errors < 0):
            raise BadRules(f"{where}.errors: expected a count (0 or more), got {errors!r}")
        greedy = data.get("greedy")
        if greedy not in (None, "same"):
            raise BadRules(f"{where}.greedy: expected same, got {greedy!r}")
        return cls(errors=errors, greedy="same" if greedy else None, **bounds)

    def to_wire(self) -> dict[str, Any]:
        """The ``rules:`` mapping: only the rules set (``from_wire`` reads it back equal)."""
        out: dict[str, Any] = {}
        for rule in FIGURE_RULES:
            bounds = self.bounds(rule)
            if bounds is not None:
                out[rule] = bounds.to_wire()
        if self.errors is not None:
            out["errors"] = self.errors
        if self.greedy is not None:
            out["greedy"] = self.greedy
        return out


Verdict = Literal["pass", "fail", "inconclusive"]
Final = Literal["pass", "fail"]

COLUMNS = ("probe", "figure", "before", "after", "change", "rule", "verdict")
"""The before/after table's columns, in order (terminal, plain text and ``--json`` rows)."""


# --------------------------------------------------------------- one figure


@dataclass(frozen=True)
class Measured:
    """One figure over a probe's rounds: the median and the rounds' range."""

    median: float
    low: float
    high: float

    @classmethod
    def exact(cls, value: float) -> Measured:
        return cls(value, value, value)

    @classmethod
    def of(cls, result: ProbeResult | None, figure: str) -> Measured | None:
        """``figure`` (a ``core.probe.FIGURES`` name) of ``result``; None where it has none."""
        values = result.values(figure) if result is not None else []
        if not values:
            return None
        return cls(float(statistics.median(values)), min(values), max(values))

    @property
    def half_range(self) -> float:
        return (self.high - self.low) / 2.0

    @property
    def spread(self) -> float:
        """The range relative to the median, as ``ProbeResult.spread`` gives it."""
        return (self.high - self.low) / self.median if self.median else 0.0

    def scaled(self, factor: float) -> Measured:
        return Measured(self.median * factor, self.low * factor, self.high * factor)


def margin_and_noise(kind: str, limit: float, before: Measured | None,
                     after: Measured | None) -> tuple[float, float] | None:
    """How far the median is from the bound (``margin``, always ≥ 0) and the rounds'
    spread it is compared with (``noise``); None where the bound has no threshold
    (no figure after, or no baseline for a ratio bound)."""
    if after is None:
        return None
    if kind.endswith("_ratio"):
        if before is None or before.median == 0:
            return None
        threshold = before.scaled(limit)
    else:
        threshold = Measured.exact(limit)
    return abs(after.median - threshold.median), after.half_range + threshold.half_range


def judge_bound(kind: str, limit: float, before: Measured | None, after: Measured | None) -> tuple[Verdict, str]:
    """The verdict of one bound (``min_ratio`` 0.95 …) and why, in a phrase.

    A ratio bound's threshold is ``limit × before``; an absolute one is
    ``limit``. No figure after the deploy fails (no request succeeded, or
    the answers do not say how many tokens they carry); no figure before
    passes a ratio bound (there is nothing to compare with: a baseline that
    failed every request cannot be regressed from), and says so.
    """
    if after is None:
        return "fail", "no figure after the deploy (no request succeeded, or the answers carry no token counts)"
    if kind.endswith("_ratio"):
        if before is None or before.median == 0:
            return "pass", "no baseline figure to compare with"
        threshold = before.scaled(limit)
        shown = f"{limit:g} × before ({_num(before.median)})"
    else:
        threshold = Measured.exact(limit)
        shown = f"{limit:g}"
    difference = after.median - threshold.median
    noise = after.half_range + threshold.half_range
    wanted = "≥" if kind.startswith("min") else "≤"
    good = difference >= 0 if kind.startswith("min") else difference <= 0
    if noise > 0 and abs(difference) <= noise:
        return "inconclusive", (f"{_num(after.median)} against {wanted} {shown}: the difference "
                                f"({_num(abs(difference))}) is within the rounds' spread ({_num(noise)})")
    if good:
        return "pass", f"{_num(after.median)} {wanted} {shown}"
    return "fail", f"{_num(after.median)}, needs {wanted} {shown}"


# --------------------------------------------------------------- one probe


@dataclass(frozen=True)
class RuleCheck:
    """One row of the table: one bound of one rule on one probe, and its verdict.

    ``rule`` is the rule's key as written in the gate (``tokens_per_s``,
    ``errors``, ``greedy``), ``bound`` the bound within it (``min_ratio``;
    empty for ``errors`` and ``greedy``), ``shown`` the bound for people
    (``≥ 0.95 × before``). Figures are medians; spreads are relative
    (``(max - min) / median`` of the rounds).
    """

    probe: str
    rule: str
    bound: str
    shown: str
    verdict: Verdict
    why: str
    before: float | int | str | None = None
    after: float | int | str | None = None
    before_spread: float | None = None
    after_spread: float | None = None
    change_pct: float | None = None
    margin: float | None = None  # |median - threshold|, in the figure's unit (``margin_and_noise``)
    noise: float | None = None  # the rounds' spread the margin is compared with

    @property
    def name(self) -> str:
        """``tokens_per_s.min_ratio``: the rule as a path into the gate spec."""
        return f"{self.rule}.{self.bound}" if self.bound else self.rule

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RuleCheck:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})


def bound_text(kind: str, limit: float) -> str:
    wanted = "≥" if kind.startswith("min") else "≤"
    return f"{wanted} {limit:g} × before" if kind.endswith("_ratio") else f"{wanted} {limit:g}"


def check_probe(label: str, rules: GateRules, before: ProbeResult | None, after: ProbeResult) -> list[RuleCheck]:
    """Every bound of ``rules`` on one probe, in the order of the rules' fields.

    ``rules`` is this module's ``GateRules`` (the controller's playbook model
    gives one with ``to_host()``; ``core.gate.check_probe`` takes either).
    """
    checks: list[RuleCheck] = []
    for rule, figure in FIGURE_RULES.items():
        bounds = rules.bounds(rule)
        if bounds is None:
            continue
        old, new = Measured.of(before, figure), Measured.of(after, figure)
        change = None
        if old is not None and new is not None and old.median:
            change = round((new.median - old.median) / old.median * 100.0, 1)
        for kind, limit in bounds.limits():
            verdict, why = judge_bound(kind, limit, old, new)
            gap = margin_and_noise(kind, limit, old, new)
            checks.append(RuleCheck(
                label, rule, kind, bound_text(kind, limit), verdict, why,
                before=_r(old.median) if old else None, after=_r(new.median) if new else None,
                before_spread=round(old.spread, 4) if old else None,
                after_spread=round(new.spread, 4) if new else None,
                change_pct=change,
                margin=_r(gap[0]) if gap else None, noise=_r(gap[1]) if gap else None,
            ))
    if rules.errors is not None:
        errors = after.errors
        first = next((r.first_error for r in after.rounds if r.first_error), None)
        ok = errors <= rules.errors
        why = f"{errors} failed request(s)" + (f" (first: {first})" if first else "")
        checks.append(RuleCheck(label, "errors", "", f"≤ {rules.errors}", "pass" if ok else "fail",
                                why if not ok else f"{errors} failed request(s)",
                                before=before.errors if before is not None else None, after=errors))
    if rules.greedy == "same":
        old_sha = before.greedy_sha256 if before is not None else None
        new_sha = after.greedy_sha256
        if new_sha is None:
            verdict, why = "fail", f"the greedy request failed: {after.greedy_error or 'no answer'}"
        elif old_sha is None:
            verdict, why = "pass", "no baseline fingerprint to compare with"
        elif old_sha == new_sha:
            verdict, why = "pass", "the greedy output is the same"
        else:
            verdict, why = "fail", f"the greedy output changed (sha256 {old_sha[:12]} -> {new_sha[:12]})"
        checks.append(RuleCheck(label, "greedy", "", "same", verdict, why, before=old_sha, after=new_sha))
    return checks


# --------------------------------------------------------------- the gate


def next_step(checks: Sequence[RuleCheck], reprobes_done: int, reprobes: int,
              on_inconclusive: Final | None) -> Literal["pass", "fail", "reprobe", "inconclusive"]:
    """What the deploy (or ``status --probe``) does with these verdicts.

    Any ``fail`` fails at once. Else any ``inconclusive`` re-probes while
    re-probes are left, and then counts as ``on_inconclusive``; None (status,
    which decides nothing) leaves it ``inconclusive``. Else pass.
    """
    verdicts = {c.verdict for c in checks}
    if "fail" in verdicts:
        return "fail"
    if "inconclusive" in verdicts:
        if reprobes_done < reprobes:
            return "reprobe"
        return on_inconclusive or "inconclusive"
    return "pass"


def inconclusive_probes(checks: Iterable[RuleCheck]) -> list[str]:
    """The probes (labels, in order) with an inconclusive verdict: those a re-probe measures again."""
    seen: list[str] = []
    for c in checks:
        if c.verdict == "inconclusive" and c.probe not in seen:
            seen.append(c.probe)
    return seen


@dataclass(frozen=True)
class GateOutcome:
    """The gate's end: its verdict, every row, and where the baseline came from.

    ``inconclusive_as`` is set when inconclusive verdicts were left after the
    re-probes and counted as ``fail`` or ``pass`` (``on_inconclusive``). A
    ``verdict`` of ``inconclusive`` is ``status --probe``'s only: verdicts left
    inconclusive, counted as nothing.
    """

    verdict: Verdict
    checks: tuple[RuleCheck, ...]
    baseline: str
    reprobes: int = 0
    inconclusive_as: Final | None = None

    @classmethod
    def decided(cls, step: Verdict, checks: Sequence[RuleCheck], baseline: str, reprobes: int,
                on_inconclusive: Final | None) -> GateOutcome:
        """The outcome once ``next_step`` gave ``step`` (anything but ``reprobe``) after
        ``reprobes`` re-probes: ``inconclusive_as`` is ``on_inconclusive`` only where
        verdicts were left inconclusive, so the table says what they counted as."""
        left = any(c.verdict == "inconclusive" for c in checks)
        return cls(step, tuple(checks), baseline, reprobes, on_inconclusive if left else None)

    @property
    def failing(self) -> list[RuleCheck]:
        """The rows that made the gate fail."""
        if self.verdict == "pass":
            return []
        return [c for c in self.checks
                if c.verdict == "fail" or (c.verdict == "inconclusive" and self.inconclusive_as == "fail")]

    def message(self) -> str:
        """The deploy's error when the gate fails: every failing rule named, in one line."""
        parts = []
        for c in self.failing:
            if c.verdict == "inconclusive":
                parts.append(f"{c.name} on {c.probe} stayed inconclusive after {self.reprobes} re-probe(s) "
                             f"({c.why}; on_inconclusive: fail)")
            else:
                parts.append(f"{c.name} on {c.probe}: {c.why}")
        return "performance gate failed: " + "; ".join(parts)

    def inconclusive_line(self) -> str:
        """``inconclusive: margin M within noise N`` for each bound left inconclusive
        (named when there are several, or always after the figures), with the re-probes."""
        left = [c for c in self.checks if c.verdict == "inconclusive"]
        parts = []
        for c in left:
            figures = (f"margin {_num(c.margin)} within noise {_num(c.noise)}"
                       if c.margin is not None and c.noise is not None else c.why)
            parts.append(f"{figures} ({c.name} on {c.probe})")
        return f"inconclusive: {'; '.join(parts)}, after {self.reprobes} re-probe(s)"

    def verdict_cell(self, check: RuleCheck) -> str:
        if check.verdict == "inconclusive" and self.inconclusive_as:
            return f"inconclusive → {self.inconclusive_as}"
        return check.verdict

    def rows(self) -> list[tuple[str, ...]]:
        """The table's rows as text, in ``COLUMNS`` order (header not included)."""
        return [(c.probe, c.rule, _cell(c.before, c.before_spread), _cell(c.after, c.after_spread),
                 f"{c.change_pct:+.1f}%" if c.change_pct is not None else "", c.shown, self.verdict_cell(c))
                for c in self.checks]

    def title(self) -> str:
        again = f", {self.reprobes} re-probe(s)" if self.reprobes else ""
        return f"performance gate: {self.verdict} (baseline: {self.baseline}{again})"

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "baseline": self.baseline, "reprobes": self.reprobes,
                "inconclusive_as": self.inconclusive_as, "failed": [c.name + " on " + c.probe for c in self.failing],
                "checks": [c.to_json() for c in self.checks]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GateOutcome:
        return cls(verdict=data.get("verdict", "fail"),
                   checks=tuple(RuleCheck.from_json(c) for c in data.get("checks") or []),
                   baseline=str(data.get("baseline", "")), reprobes=int(data.get("reprobes") or 0),
                   inconclusive_as=data.get("inconclusive_as"))


def recorded_results(manifest: Manifest | None, running_argv: list[str] | None) -> dict[str, ProbeResult]:
    """A release's recorded probe results by probe key — only if that release started
    the server that runs now (a server restarted by hand since is another server)."""
    if manifest is None or manifest.probe is None:
        return {}
    started = manifest.server_after.argv if manifest.server_after else None
    if running_argv is None or started != running_argv:
        return {}
    return {p.key: ProbeResult.from_json(p.result) for p in manifest.recorded_probes if p.key}


def plain_table(outcome: GateOutcome) -> list[str]:
    """The table as aligned plain lines: for logs, pipes and the release's run.log."""
    rows = [COLUMNS, *outcome.rows()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = [outcome.title()]
    for r in rows:
        lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
    return lines


# --------------------------------------------------------------- formatting


def _num(value: float) -> str:
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"


def _cell(value: float | int | str | None, spread: float | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value[:12]  # a greedy fingerprint: its start is enough to see same or not
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    text = _num(float(value))
    if spread:
        text += f" ±{spread * 50:.1f}%"  # half the rounds' range, relative to the median
    return text


def _r(value: float) -> float:
    return round(value, 3)
