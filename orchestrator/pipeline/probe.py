"""Running a probe on a host: the helper sends the requests, ``core.probe`` sums up.

The requests leave from the host itself (``probe_http`` in the helper), so
what is measured is the server, not the SSH link; all rounds go in one round
trip.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.core.probe import ProbeConfig, ProbeResult, greedy_body, probe_result
from orchestrator.pipeline.session import HostSession
from orchestrator.shell import ops


def run_probe(
    session: HostSession,
    base_url: str,
    config: ProbeConfig,
    body: Any = None,
    headers: dict[str, str] | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> ProbeResult:
    """Probe ``base_url`` as ``config`` says; ``body``/``headers`` are the rendered ones.

    The greedy request (temperature 0 in the API's own form) is sent alone,
    once, in the first round.
    """
    sent = config.json_ if body is None else body
    rendered_headers = dict(config.headers if headers is None else headers)
    steps = [
        ops.probe_http(base_url, config.post, sent, requests=config.requests, concurrency=config.concurrency,
                       timeout=config.timeout, headers=rendered_headers,
                       warmup=config.warmup if n == 0 else 0,
                       greedy_body=greedy_body(config.post, sent) if (config.greedy and n == 0) else None)
        for n in range(config.rounds)
    ]
    answers = session.batch(steps, on_event=on_event)
    return probe_result(config.post, config.concurrency, answers)
