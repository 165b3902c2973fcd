# Stand-in server: the modelled speed of decoding (not part of SGLang).
# ruff: noqa: UP006, UP007, UP035, UP045
"""How fast the stand-in decodes: a model, computed from the batch in flight.

The stand-in has no GPU and no model, yet orch's probe (and a performance
gate built on it) must have something real to measure. So the stand-in
decodes on a *modelled* clock: every decode step takes the time this model
computes from the number of requests in the batch and from whether the step
speculates, and the server sleeps exactly that long. The figures a probe
measures follow from the model, not from this machine's CPU, so the
*verdicts* (faster, slower, same) are the same on every machine.

The model is the story behind orch, an EAGLE-3 setup that saturated at about
354 tok/s where the plain server reached about 773 tok/s:

- **plain** (target model only): a step costs ``PLAIN_BASE_MS`` (reading the
  weights once) plus ``PLAIN_PER_SEQ_MS`` per sequence in the batch, and
  gives every sequence one token. Throughput ``b / (20 + 1.0 b) ms``:
  about 48 tok/s at batch 1, 615 at 32, 762 at 64.
- **speculative** (draft, then verify ``speculative_num_draft_tokens`` per
  sequence): a step costs ``SPEC_BASE_MS`` plus ``SPEC_PER_DRAFT_TOKEN_MS``
  per draft token per sequence, and gives every sequence
  ``speculative_num_steps + 1`` tokens (the worker's ``verify``). With the
  defaults (3 steps, 4 draft tokens): ``4b / (31.2 + 10.8 b) ms``: about
  95 tok/s at batch 1 (twice plain), 339 at 32 and 354 at 64 (half of plain).
  Speculation wins below a batch of about 7 and loses above it.
- ``--speculative-disable-batch-threshold N`` (once a patch adds it): the
  worker drafts only while the batch is at most N, so above N a step is a
  plain step and the plain throughput comes back.
- a request joining the batch adds ``PREFILL_MS`` to the step it joins.

Switches (environment variables, read at start): ``STANDIN_SLOWDOWN=F``
multiplies every step's time by F (a regression a gate must catch);
``STANDIN_GREEDY_SALT=S`` changes the text of greedy (temperature 0)
answers (an output change a greedy fingerprint must catch).

Pure and stdlib-only (Python >= 3.8): the tests assert verdicts from these
numbers, never from a clock.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

PLAIN_BASE_MS = 20.0
PLAIN_PER_SEQ_MS = 1.0
SPEC_BASE_MS = 31.2
SPEC_PER_DRAFT_TOKEN_MS = 2.7
PREFILL_MS = 2.0

ENV_SLOWDOWN = "STANDIN_SLOWDOWN"
ENV_GREEDY_SALT = "STANDIN_GREEDY_SALT"


@dataclasses.dataclass(frozen=True)
class SpeedModel:
    """The model for one server's settings (see the module's docstring)."""

    num_steps: int = 3
    num_draft_tokens: int = 4
    slowdown: float = 1.0

    @classmethod
    def for_server(cls, server_args, environ=None) -> SpeedModel:
        environ = os.environ if environ is None else environ
        return cls(
            num_steps=server_args.speculative_num_steps or 3,
            num_draft_tokens=server_args.speculative_num_draft_tokens or 4,
            slowdown=slowdown_factor(environ),
        )

    def tokens_per_step(self, speculative: bool) -> int:
        """Tokens each sequence gets from one step."""
        return self.num_steps + 1 if speculative else 1

    def step_seconds(self, batch: int, speculative: bool, joined: int = 0) -> float:
        """The modelled time of one decode step over ``batch`` sequences."""
        batch = max(1, batch)
        if speculative:
            ms = SPEC_BASE_MS + SPEC_PER_DRAFT_TOKEN_MS * self.num_draft_tokens * batch
        else:
            ms = PLAIN_BASE_MS + PLAIN_PER_SEQ_MS * batch
        return (ms + PREFILL_MS * joined) * self.slowdown / 1000.0

    def tokens_per_s(self, batch: int, speculative: bool) -> float:
        """Output tokens per second while ``batch`` sequences decode together."""
        batch = max(1, batch)
        return batch * self.tokens_per_step(speculative) / self.step_seconds(batch, speculative)

    def steady_tokens_per_s(
        self, concurrency: int, speculation: bool, threshold: Optional[int] = None
    ) -> float:
        """Throughput with ``concurrency`` clients always waiting (the batch is full)."""
        return self.tokens_per_s(concurrency, drafts(speculation, threshold, concurrency))


def drafts(speculation: bool, threshold: Optional[int], batch: int) -> bool:
    """Whether a decode step over ``batch`` sequences speculates."""
    return speculation and (threshold is None or batch <= threshold)


def slowdown_factor(environ) -> float:
    raw = (environ.get(ENV_SLOWDOWN) or "").strip()
    try:
        value = float(raw) if raw else 1.0
    except ValueError:
        return 1.0
    return value if value > 0 else 1.0


def greedy_salt(environ=None) -> str:
    environ = os.environ if environ is None else environ
    return environ.get(ENV_GREEDY_SALT) or ""
