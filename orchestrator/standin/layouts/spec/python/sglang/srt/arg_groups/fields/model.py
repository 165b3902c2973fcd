# Stand-in server: fields of the ``model`` namespace.
# ruff: noqa: UP006, UP007, UP035, UP045
"""Config fields of the ``model`` namespace."""

from __future__ import annotations

from typing import Optional

from sglang.srt.arg_groups.arg_utils import A, Arg
from sglang.srt.arg_groups.struct import Struct


class Model(Struct):
    """Namespace ``model``."""

    _NS_PATH = "model"
    model_path: A[
        str,
        Arg(
            help="The path of the model weights. This can be a local folder or a Hugging Face repo ID.",
            aliases=["--model"],
        ),
    ]
    tokenizer_path: A[Optional[str], "The path of the tokenizer."] = None
    tokenizer_mode: A[
        str,
        Arg(
            help="Tokenizer mode. 'auto' will use the fast tokenizer if available, and 'slow' will always use the slow tokenizer.",
            choices=["auto", "slow"],
        ),
    ] = "auto"
    trust_remote_code: A[
        bool,
        "Whether or not to allow for custom models defined on the Hub in their own modeling files.",
    ] = False
    context_length: A[
        Optional[int],
        "The model's maximum context length. Defaults to None (will use the value from the model's config.json instead).",
    ] = None
    revision: A[
        Optional[str],
        "The specific model version to use. It can be a branch name, a tag name, or a commit id.",
    ] = None
    dtype: A[
        str,
        Arg(
            help="Data type for model weights and activations.",
            choices=["auto", "half", "float16", "bfloat16", "float", "float32"],
        ),
    ] = "auto"
    quantization: A[Optional[str], "The quantization method."] = None
    kv_cache_dtype: A[
        str,
        Arg(
            help='Data type for kv cache storage. "auto" will use model data type.',
            choices=["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"],
        ),
    ] = "auto"
