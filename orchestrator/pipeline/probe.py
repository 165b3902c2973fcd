"""Running a probe on a host: the helper sends the requests, ``core.probe`` sums up.

The requests leave from the host itself (``probe_http`` in the helper), so
what is measured is the server, not the SSH link. A probe is one op per
round (``probe_ops``); a deploy's gate and a night's probe put them in their
release's program, run in the round trips they make anyway (``read_probe``
reads a probe's share of the answers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.core.probe import ProbeConfig, ProbeResult, greedy_body, probe_result
from orchestrator.shell import ops


def probe_ops(base_url: str, config: ProbeConfig, body: Any = None,
              headers: dict[str, str] | None = None) -> list[ops.Op]:
    """One ``probe_http`` per round; ``body``/``headers`` are the rendered ones.

    The warm-up requests and the greedy request (temperature 0 in the API's
    own form) go with the first round only.
    """
    sent = config.json_ if body is None else body
    rendered_headers = dict(config.headers if headers is None else headers)
    return [
        ops.probe_http(base_url, config.post, sent, requests=config.requests, concurrency=config.concurrency,
                       timeout=config.timeout, headers=rendered_headers,
                       warmup=config.warmup if n == 0 else 0,
                       greedy_body=greedy_body(config.post, sent) if (config.greedy and n == 0) else None)
        for n in range(config.rounds)
    ]


def read_probe(config: ProbeConfig, answers: Sequence[Any]) -> ProbeResult:
    """The answers of ``probe_ops(…, config, …)`` as one result."""
    return probe_result(config.post, config.concurrency, answers)

