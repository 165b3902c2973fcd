"""The probe's pure half: what to send, and what the answers add up to.

A probe sends ``requests`` POSTs to one route at ``concurrency`` (the
host-side helper does the sending, ``probe_http`` in ``host/probe.py``) and
returns one raw sample per request; ``host/figures.py`` turns those samples
into figures (requests/s, output tokens/s, p50/p99, errors, the greedy
fingerprint), each with its median and spread over the rounds. The figures
are defined there, in the host package, because the host judges a release
it runs itself as the controller does; this module keeps the names the
controller has always imported them by. Pure: wire records in, dataclasses
out.
"""

from __future__ import annotations

# ``probe:`` in a nightly spec and each of a gate's probes: a configuration model, so it
# lives in ``core.models`` with the others; re-exported here, where the nightly finds it.
from orchestrator.core.models import ProbeConfig as ProbeConfig
from orchestrator.host.figures import FIGURES as FIGURES
from orchestrator.host.figures import Api as Api
from orchestrator.host.figures import ProbeFigures as ProbeFigures
from orchestrator.host.figures import ProbeResult as ProbeResult
from orchestrator.host.figures import Sample as Sample
from orchestrator.host.figures import api_of as api_of
from orchestrator.host.figures import figures as figures
from orchestrator.host.figures import fingerprint as fingerprint
from orchestrator.host.figures import greedy_body as greedy_body
from orchestrator.host.figures import output_tokens as output_tokens
from orchestrator.host.figures import percentile as percentile
from orchestrator.host.figures import probe_result as probe_result
from orchestrator.host.figures import response_text as response_text
from orchestrator.host.figures import round_from_wire as round_from_wire
