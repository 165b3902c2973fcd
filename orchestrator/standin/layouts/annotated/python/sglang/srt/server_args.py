# Stand-in server: a miniature of SGLang's annotated (0.5.14-0.5.19) server_args.py.
# There each flag is one dataclass field written `name: A[type, "help", NS("group")]`,
# and the parser is built from the dataclass (add_cli_args_from_dataclass); only
# fields written with A[...] become flags. This copy keeps that layout (with the
# NS(...) markers of 0.5.18) and imports nothing outside the standard library.
# ruff: noqa: UP006, UP007, UP035, UP045
# ==============================================================================
"""The arguments of the server."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import random
from typing import List, Optional

from sglang.srt.arg_groups.arg_utils import NS, A, Arg, add_cli_args_from_dataclass

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ServerArgs:
    """
    The arguments of the server.

    Adding new arguments: declare a field as ``A[type, "help"]`` (or
    ``A[type, Arg(...)]``) in the matching section; add_cli_args derives the
    flag from it. A field without A[...] is not a flag.
    """

    # Model and tokenizer
    model_path: A[
        str,
        Arg(
            help="The path of the model weights. This can be a local folder or a Hugging Face repo ID.",
            aliases=["--model"],
        ),
        NS("model"),
    ]
    tokenizer_path: A[Optional[str], "The path of the tokenizer.", NS("model")] = None
    tokenizer_mode: A[
        str,
        Arg(
            help="Tokenizer mode. 'auto' will use the fast tokenizer if available, and 'slow' will always use the slow tokenizer.",
            choices=["auto", "slow"],
        ),
        NS("model"),
    ] = "auto"
    trust_remote_code: A[
        bool,
        "Whether or not to allow for custom models defined on the Hub in their own modeling files.",
        NS("model"),
    ] = False
    context_length: A[
        Optional[int],
        "The model's maximum context length. Defaults to None (will use the value from the model's config.json instead).",
        NS("model"),
    ] = None
    revision: A[
        Optional[str],
        "The specific model version to use. It can be a branch name, a tag name, or a commit id.",
        NS("model"),
    ] = None

    # HTTP server
    host: A[str, "The host of the HTTP server.", NS("serving")] = "127.0.0.1"
    port: A[int, "The port of the HTTP server.", NS("serving")] = 30000
    skip_server_warmup: A[bool, "If set, skip warmup.", NS("serving")] = False

    # Quantization and data type
    dtype: A[
        str,
        Arg(
            help="Data type for model weights and activations.",
            choices=["auto", "half", "float16", "bfloat16", "float", "float32"],
        ),
        NS("model"),
    ] = "auto"
    quantization: A[Optional[str], "The quantization method.", NS("model")] = None
    kv_cache_dtype: A[
        str,
        Arg(
            help='Data type for kv cache storage. "auto" will use model data type.',
            choices=["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"],
        ),
        NS("memory"),
    ] = "auto"

    # Memory and scheduling
    mem_fraction_static: A[
        Optional[float],
        "The fraction of the memory used for static allocation (model weights and KV cache memory pool).",
        NS("memory"),
    ] = None
    max_running_requests: A[
        Optional[int], "The maximum number of running requests.", NS("schedule")
    ] = None
    chunked_prefill_size: A[
        Optional[int],
        "The maximum number of tokens in a chunk for the chunked prefill.",
        NS("schedule"),
    ] = None

    # Runtime options
    device: A[
        Optional[str],
        "The device to use ('cuda', 'xpu', 'hpu', 'npu', 'cpu', 'musa').",
        NS("device"),
    ] = None
    tp_size: A[
        int,
        Arg(
            help="The tensor parallelism size.",
            cli_name="--tensor-parallel-size",
            aliases=["--tp-size"],
        ),
        NS("parallel"),
    ] = 1
    random_seed: A[Optional[int], "The random seed.", NS("exec")] = None

    # Logging
    log_level: A[str, "The logging level of all loggers.", NS("observability")] = "info"
    log_level_http: A[
        Optional[str],
        "The logging level of HTTP server. If not set, reuse --log-level by default.",
        NS("observability"),
    ] = None
    log_requests: A[
        bool, "Log metadata, inputs, outputs of all requests.", NS("observability")
    ] = False

    # API related
    api_key: A[
        Optional[str],
        "Set API key of the server. It is also used in the OpenAI API compatible server.",
        NS("serving"),
    ] = None
    served_model_name: A[
        Optional[str],
        "Override the model name returned by the v1/models endpoint in OpenAI API server.",
        NS("serving"),
    ] = None

    # Kernel backend
    attention_backend: A[
        Optional[str], "Choose the kernels for attention layers.", NS("exec")
    ] = None

    # -------------------------------------------------------------------------
    # Speculative decoding
    # -------------------------------------------------------------------------
    speculative_algorithm: A[
        Optional[str],
        "Speculative algorithm. Builtins: EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM, DFLASH.",
        NS("spec"),
    ] = None
    speculative_draft_model_path: A[
        Optional[str],
        Arg(
            help="The path of the draft model weights. This can be a local folder or a Hugging Face repo ID.",
            aliases=["--speculative-draft-model"],
        ),
        NS("spec"),
    ] = None
    speculative_draft_model_revision: A[
        Optional[str],
        "The specific draft model version to use. It can be a branch name, a tag name, or a commit id.",
        NS("spec"),
    ] = None
    speculative_num_steps: A[
        Optional[int],
        "The number of steps sampled from draft model in Speculative Decoding.",
        NS("spec"),
    ] = None
    speculative_eagle_topk: A[
        Optional[int],
        "The number of tokens sampled from the draft model in eagle2 each step.",
        NS("spec"),
    ] = None
    speculative_num_draft_tokens: A[
        Optional[int],
        "The number of tokens sampled from the draft model in Speculative Decoding.",
        NS("spec"),
    ] = None
    speculative_accept_threshold_single: A[
        float,
        "Accept a draft token if its probability in the target model is greater than this threshold.",
        NS("spec"),
    ] = 1.0
    speculative_accept_threshold_acc: A[
        float,
        "The accept probability of a draft token is raised from its target probability p to min(1, p / threshold_acc).",
        NS("spec"),
    ] = 1.0
    speculative_token_map: A[
        Optional[str],
        "The path of the draft model's small vocab table.",
        NS("spec"),
    ] = None
    speculative_attention_mode: A[
        str,
        Arg(
            help="Attention backend for speculative decoding operations (both target verify and draft extend).",
            choices=["prefill", "decode"],
        ),
        NS("spec"),
    ] = "prefill"
    speculative_draft_attention_backend: A[
        Optional[str],
        "Attention backend for speculative decoding drafting.",
        NS("spec"),
    ] = None

    # Optimization/debug options
    disable_radix_cache: A[bool, "Disable RadixAttention for prefix caching.", NS("exec")] = False
    disable_cuda_graph: A[bool, "Disable cuda graph.", NS("exec")] = False
    cuda_graph_max_bs: A[
        Optional[int],
        "Set the maximum batch size for cuda graph.",
        NS("exec"),
    ] = None
    enable_torch_compile: A[
        bool, "Optimize the model with torch.compile. Experimental feature.", NS("exec")
    ] = False

    def __post_init__(self):
        # Set missing default values
        if self.tokenizer_path is None:
            self.tokenizer_path = self.model_path

        if self.served_model_name is None:
            self.served_model_name = self.model_path

        if self.random_seed is None:
            self.random_seed = random.randint(0, 1 << 30)

        if self.device is None:
            self.device = "cpu"

        if self.speculative_algorithm is not None:
            self._handle_speculative_decoding()

    def _handle_speculative_decoding(self):
        if self.speculative_algorithm == "NEXTN":
            self.speculative_algorithm = "EAGLE"

        if self.speculative_num_steps is None:
            self.speculative_num_steps = 3
        if self.speculative_eagle_topk is None:
            self.speculative_eagle_topk = 1
        if self.speculative_num_draft_tokens is None:
            self.speculative_num_draft_tokens = self.speculative_num_steps + 1

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):

        # Auto-derived from Annotated[..., Arg(...)] field metadata.
        add_cli_args_from_dataclass(parser, ServerArgs)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace):
        attrs = [
            attr.name for attr in dataclasses.fields(cls) if hasattr(args, attr.name)
        ]
        return cls(**{attr: getattr(args, attr) for attr in attrs})

    def url(self):
        host = self.host
        if not host or host == "0.0.0.0":
            host = "127.0.0.1"
        elif host == "::":
            host = "[::1]"
        return f"http://{host}:{self.port}"


def prepare_server_args(argv: List[str]) -> ServerArgs:
    """
    Prepare the server arguments from the command line arguments.

    Args:
        args: The command line arguments. Typically, it should be `sys.argv[1:]`
            to ensure compatibility with `parse_args` when no arguments are passed.

    Returns:
        The server arguments.
    """
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    raw_args = parser.parse_args(argv)

    # Set up basic logging before ServerArgs.__post_init__ so that
    # logger.info / logger.warning calls there are properly formatted.
    logging.basicConfig(
        level=getattr(logging, raw_args.log_level.upper()),
        format="[%(asctime)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        force=True,
    )

    return ServerArgs.from_cli_args(raw_args)
