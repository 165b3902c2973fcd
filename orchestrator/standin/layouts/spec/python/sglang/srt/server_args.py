# Stand-in server: a miniature of SGLang's spec-layout (>= 0.5.20) server_args.py.
# There the fields live in namespaces (msgspec.Struct classes in
# sglang/srt/arg_groups/fields/*.py, the speculative ones in spec.py) and this
# module assembles ServerArgs from them; adding a flag means one A[...] field in
# the namespace. This copy keeps that layout with standard-library dataclasses.
# ruff: noqa: UP006, UP007, UP035, UP045
# ==============================================================================
"""The arguments of the server."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import random
from typing import List

from sglang.srt.arg_groups.arg_utils import add_cli_args_from_dataclass
from sglang.srt.arg_groups.fields import collect_input_fields
from sglang.srt.arg_groups.fields.exec_ import Exec
from sglang.srt.arg_groups.fields.model import Model
from sglang.srt.arg_groups.fields.serving import Serving
from sglang.srt.arg_groups.fields.spec import Spec

logger = logging.getLogger(__name__)

_INPUT_NAMESPACES = [Model, Serving, Exec, Spec]


class ServerArgs:
    """Raw server configuration.

    Add fields to the matching namespace in ``arg_groups/fields/`` using
    ``A[T, help]`` or ``A[T, Arg(...)]``; ``add_cli_args`` derives the flags.
    """

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


# The record: the namespaces' fields, with the methods above (msgspec.defstruct in SGLang).
ServerArgs = dataclasses.make_dataclass(
    "ServerArgs",
    collect_input_fields(_INPUT_NAMESPACES),
    namespace={
        _k: _v
        for _k, _v in vars(ServerArgs).items()
        if _k not in ("__dict__", "__weakref__", "__annotations__")
    },
)
ServerArgs.__module__ = __name__


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
