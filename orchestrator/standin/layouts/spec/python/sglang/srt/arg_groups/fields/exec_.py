# Stand-in server: fields of the ``exec`` namespace.
# ruff: noqa: UP006, UP007, UP035, UP045
"""Config fields of the ``exec`` namespace."""

from __future__ import annotations

from typing import Optional

from sglang.srt.arg_groups.arg_utils import A, Arg
from sglang.srt.arg_groups.struct import Struct


class Exec(Struct):
    """Namespace ``exec``."""

    _NS_PATH = "exec"
    mem_fraction_static: A[
        Optional[float],
        "The fraction of the memory used for static allocation (model weights and KV cache memory pool).",
    ] = None
    max_running_requests: A[Optional[int], "The maximum number of running requests."] = None
    chunked_prefill_size: A[
        Optional[int], "The maximum number of tokens in a chunk for the chunked prefill."
    ] = None
    device: A[Optional[str], "The device to use ('cuda', 'xpu', 'hpu', 'npu', 'cpu', 'musa')."] = None
    tp_size: A[
        int,
        Arg(
            help="The tensor parallelism size.",
            cli_name="--tensor-parallel-size",
            aliases=["--tp-size"],
        ),
    ] = 1
    random_seed: A[Optional[int], "The random seed."] = None
    attention_backend: A[Optional[str], "Choose the kernels for attention layers."] = None
    disable_radix_cache: A[bool, "Disable RadixAttention for prefix caching."] = False
    disable_cuda_graph: A[bool, "Disable cuda graph."] = False
    cuda_graph_max_bs: A[Optional[int], "Set the maximum batch size for cuda graph."] = None
    enable_torch_compile: A[bool, "Optimize the model with torch.compile. Experimental feature."] = False
