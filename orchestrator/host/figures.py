"""A probe's figures: what the answers to its requests add up to (both sides need them).

The helper on the host sends a probe's requests (``probe_http`` in
``host/probe.py``) and answers one raw sample per request; these types turn
the samples into figures a person and a performance gate can compare from
one night (or one release) to the next:

- requests/s and output tokens/s over the run's wall-clock time (tokens from
  the OpenAI-style ``usage.completion_tokens`` or SGLang's
  ``meta_info.completion_tokens``);
- latency p50 and p99 (linear interpolation between ranks, as numpy does);
- errors (transport failures and non-2xx answers), with the first one named;
- the **greedy fingerprint**: the sha256 of the text of one separate request,
  sent alone, with the temperature set to 0 in the form of the API it talks
  to (SGLang ``sampling_params.temperature``, OpenAI ``temperature``). Two
  servers that decode greedily the same way give the same fingerprint; a
  patch that changes the model's output changes it.

Figures are measured, so they carry noise: ``ProbeResult`` keeps several
rounds and gives each figure's median and spread, which is what a gate
(``host/gate.py``) compares. They live in the host package so that the host
can judge a release it runs itself; the controller imports them from here
(``core.probe`` re-exports them). Pure, standard library only, Python 3.8
syntax (annotations are never evaluated): wire records in, dataclasses out.
"""

from __future__ import annotations

import copy
import hashlib
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Api = Literal["sglang", "openai"]

FIGURES = ("requests_per_s", "output_tokens_per_s", "p50_ms", "p99_ms")
"""The measured figures a ``ProbeResult`` has a median and a spread for."""


# ------------------------------------------------------------ the two APIs


def api_of(path: str) -> Api:
    """``/v1/...`` routes speak the OpenAI API; everything else SGLang's native one."""
    return "openai" if path.startswith("/v1/") else "sglang"


def greedy_body(path: str, body: Mapping[str, Any] | None) -> dict[str, Any]:
    """``body`` with the temperature set to 0 in the form of the API at ``path``."""
    out: dict[str, Any] = copy.deepcopy(dict(body or {}))
    if api_of(path) == "openai":
        out["temperature"] = 0
    else:
        params = out.get("sampling_params")
        params = dict(params) if isinstance(params, dict) else {}
        params["temperature"] = 0
        out["sampling_params"] = params
    return out


def response_text(path: str, doc: Any) -> str | None:
    """The generated text of one answer (the first of a batch), or None if it has none."""
    if isinstance(doc, list):
        doc = doc[0] if doc else None
    if not isinstance(doc, dict):
        return None
    if api_of(path) == "openai":
        choices = doc.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return None
        choice = choices[0]
        if isinstance(choice.get("text"), str):
            return str(choice["text"])
        message = choice.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        return content if isinstance(content, str) else None
    text = doc.get("text")
    return text if isinstance(text, str) else None


def fingerprint(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def output_tokens(tokens: Mapping[str, Any] | None) -> int | None:
    """Output tokens of one answer from what the helper kept of it.

    ``tokens`` is ``{"usage": {...}}`` (OpenAI) or ``{"meta_info": [{...}, …]}``
    (SGLang; one per prompt of a batch). None when the server says nothing.
    """
    if not tokens:
        return None
    usage = tokens.get("usage")
    if isinstance(usage, dict) and _count(usage.get("completion_tokens")) is not None:
        return _count(usage.get("completion_tokens"))
    metas = tokens.get("meta_info")
    if isinstance(metas, list):
        counts = [_count(m.get("completion_tokens")) for m in metas if isinstance(m, dict)]
        known = [c for c in counts if c is not None]
        return sum(known) if known else None
    return None


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return int(value)


# --------------------------------------------------------------- samples


@dataclass(frozen=True)
class Sample:
    """One request as the helper saw it."""

    latency_s: float
    status: int | None
    error: str | None = None
    output_tokens: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status is not None and 200 <= self.status < 300

    @classmethod
    def from_wire(cls, record: Mapping[str, Any]) -> Sample:
        status = record.get("status")
        return cls(
            latency_s=float(record.get("latency") or 0.0),
            status=int(status) if isinstance(status, int) else None,
            error=record.get("error"),
            output_tokens=output_tokens(record.get("tokens")),
        )


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) by linear interpolation between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * min(max(q, 0.0), 100.0) / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# --------------------------------------------------------------- figures


@dataclass(frozen=True)
class ProbeFigures:
    """One round of a probe, summed up.

    Latencies count successful requests only; ``output_tokens_per_s`` is
    None when no answer said how many tokens it produced.
    """

    requests: int
    concurrency: int
    ok: int
    errors: int
    duration_s: float
    requests_per_s: float
    output_tokens_per_s: float | None
    p50_ms: float | None
    p99_ms: float | None
    first_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProbeFigures:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})


def figures(samples: Sequence[Sample], concurrency: int, duration_s: float) -> ProbeFigures:
    """Sum up one round: ``duration_s`` is the wall-clock time of the whole round."""
    ok = [s for s in samples if s.ok]
    failed = [s for s in samples if not s.ok]
    duration = max(duration_s, 1e-9)
    tokens = [s.output_tokens for s in ok if s.output_tokens is not None]
    latencies = [s.latency_s * 1000.0 for s in ok]
    first = failed[0] if failed else None
    first_error = None
    if first is not None:
        first_error = first.error or f"HTTP {first.status}"
    return ProbeFigures(
        requests=len(samples),
        concurrency=concurrency,
        ok=len(ok),
        errors=len(failed),
        duration_s=round(duration_s, 6),
        requests_per_s=_r(len(ok) / duration),
        output_tokens_per_s=_r(sum(tokens) / duration) if tokens else None,
        p50_ms=_r(percentile(latencies, 50)) if latencies else None,
        p99_ms=_r(percentile(latencies, 99)) if latencies else None,
        first_error=first_error,
    )


def _r(value: float) -> float:
    return round(value, 3)


def round_from_wire(wire: Mapping[str, Any], concurrency: int) -> ProbeFigures:
    """A ``probe_http`` answer (``samples``, ``duration``) as figures."""
    samples = [Sample.from_wire(r) for r in wire.get("samples") or []]
    return figures(samples, concurrency, float(wire.get("duration") or 0.0))


@dataclass(frozen=True)
class ProbeResult:
    """Every round of one probe, and the greedy fingerprint.

    A gate compares ``median(figure)`` of two results and treats a
    difference smaller than ``spread(figure)`` as inconclusive.
    ``greedy_sha256`` is None when the fingerprint was not taken or its
    request failed (``greedy_error`` says why).
    """

    path: str
    rounds: tuple[ProbeFigures, ...]
    greedy_sha256: str | None = None
    greedy_error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def errors(self) -> int:
        return sum(r.errors for r in self.rounds)

    def values(self, name: str) -> list[float]:
        if name not in FIGURES:
            raise KeyError(f"unknown probe figure {name!r} (known: {', '.join(FIGURES)})")
        found = (getattr(r, name) for r in self.rounds)
        return [float(v) for v in found if v is not None]

    def median(self, name: str) -> float | None:
        values = self.values(name)
        return _r(statistics.median(values)) if values else None

    def spread(self, name: str) -> float | None:
        """(max - min) / median over the rounds: 0.0 with one round."""
        values = self.values(name)
        if not values:
            return None
        middle = statistics.median(values)
        return _r((max(values) - min(values)) / middle) if middle else 0.0

    def summary(self) -> dict[str, Any]:
        """The figures people read and reports chart: medians, spreads, errors, fingerprint."""
        out: dict[str, Any] = {name: self.median(name) for name in FIGURES}
        out["spread"] = {name: self.spread(name) for name in FIGURES}
        out["errors"] = self.errors
        out["requests"] = sum(r.requests for r in self.rounds)
        out["concurrency"] = self.rounds[0].concurrency if self.rounds else None
        out["rounds"] = len(self.rounds)
        out["greedy_sha256"] = self.greedy_sha256
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "summary": self.summary(),
            "rounds": [r.to_json() for r in self.rounds],
            "greedy_sha256": self.greedy_sha256,
            "greedy_error": self.greedy_error,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProbeResult:
        return cls(
            path=str(data.get("path", "")),
            rounds=tuple(ProbeFigures.from_json(r) for r in data.get("rounds") or []),
            greedy_sha256=data.get("greedy_sha256"),
            greedy_error=data.get("greedy_error"),
        )


def probe_result(path: str, concurrency: int, answers: Iterable[Mapping[str, Any]]) -> ProbeResult:
    """The rounds the helper answered (each ``probe_http``'s result) as one result.

    The greedy request is sent once, in the first round; its fingerprint is
    the sha256 of the text the server generated.
    """
    rounds: list[ProbeFigures] = []
    greedy_sha = greedy_error = None
    for answer in answers:
        rounds.append(round_from_wire(answer, concurrency))
        greedy = answer.get("greedy")
        if greedy is None:
            continue
        text = response_text(path, greedy.get("doc"))
        if greedy.get("error") or text is None:
            greedy_error = greedy.get("error") or "the greedy answer has no text"
        else:
            greedy_sha = fingerprint(text)
    return ProbeResult(path, tuple(rounds), greedy_sha, greedy_error)
