# Stand-in server: a skeleton of SGLang's EAGLE v2 worker.
# ruff: noqa: UP006, UP007, UP035, UP045
"""The EAGLE v2 speculative worker, as a skeleton without models.

Real SGLang drafts tokens with a small model and verifies them on the target
model. Here a "batch" is the set of ``/generate`` requests in flight and the
worker only counts what it would have done: a verify step yields
``speculative_num_steps + 1`` tokens, a target-only step one token. The shape
of ``EAGLEWorkerV2.forward_batch_generation`` (extend branch, then a decode
branch that starts with ``self.activate_step_by_batch(batch.seq_lens.shape[0])``)
follows SGLang's, so a per-batch gate patched in here changes numbers visible
in ``/generate``'s ``meta_info`` (``spec_verify_ct``), and a patch that breaks
this file crashes the stand-in server at start as it would crash SGLang.

The server's decode loop calls ``forward_batch_generation`` once per step with
the whole batch in flight, and the step's modelled time depends on whether it
verified (``sglang.srt.standin_speed``): that is where
``--speculative-disable-batch-threshold`` shows as throughput.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from typing import Optional, Tuple

logger = logging.getLogger(__name__)


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2

    def is_extend(self):
        return self == ForwardMode.EXTEND

    def is_decode(self):
        return self == ForwardMode.DECODE


class SeqLens:
    """Stands for the 1-D tensor of sequence lengths: only ``.shape`` is used."""

    def __init__(self, batch_size: int):
        self.shape: Tuple[int] = (batch_size,)


@dataclasses.dataclass
class ScheduleBatch:
    forward_mode: ForwardMode
    seq_lens: SeqLens
    is_extend_in_batch: bool = False
    spec_info: Optional[object] = None

    @classmethod
    def of(cls, forward_mode: ForwardMode, batch_size: int) -> ScheduleBatch:
        return cls(forward_mode=forward_mode, seq_lens=SeqLens(max(1, batch_size)))

    def batch_size(self) -> int:
        return self.seq_lens.shape[0]


@dataclasses.dataclass
class GenerationBatchResult:
    num_new_tokens: int
    verified: bool = False


class TpModelWorker:
    """The target model: one token per sequence per step."""

    def forward_batch_generation(self, batch: ScheduleBatch) -> GenerationBatchResult:
        return GenerationBatchResult(num_new_tokens=1, verified=False)


class EAGLEWorkerV2:
    def __init__(self, server_args, target_worker: Optional[TpModelWorker] = None):
        # Parse arguments
        self.server_args = server_args
        self.topk = server_args.speculative_eagle_topk
        self.speculative_num_steps = server_args.speculative_num_steps
        self.speculative_num_draft_tokens = server_args.speculative_num_draft_tokens
        self._target_worker = target_worker or TpModelWorker()
        self.enable_drafting = True

    @property
    def target_worker(self):
        return self._target_worker

    def forward_batch_generation(self, batch: ScheduleBatch, on_publish=None):
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            # Target prefill
            batch_output = self.target_worker.forward_batch_generation(batch)
            if on_publish is not None:
                on_publish(batch_output)
            return batch_output
        else:
            self.activate_step_by_batch(batch.seq_lens.shape[0])

            if not self.enable_drafting:
                return self.target_worker.forward_batch_generation(batch)

            batch.spec_info = self.draft(batch)
            batch_output = self.verify(batch)
            if on_publish is not None:
                on_publish(batch_output)
            return batch_output

    def activate_step_by_batch(self, batch_size: int) -> None:
        # The per-batch gate: once a patch adds --speculative-disable-batch-threshold
        # to server_args.py, drafting stops while the batch is above it (as
        # 0.5.23's adaptive table turns it off at large batches).
        threshold = getattr(self.server_args, "speculative_disable_batch_threshold", None)
        self.enable_drafting = threshold is None or batch_size <= threshold

    def draft(self, batch: ScheduleBatch):
        return {"num_draft_tokens": self.speculative_num_draft_tokens}

    def verify(self, batch: ScheduleBatch) -> GenerationBatchResult:
        return GenerationBatchResult(
            num_new_tokens=self.speculative_num_steps + 1, verified=True
        )
