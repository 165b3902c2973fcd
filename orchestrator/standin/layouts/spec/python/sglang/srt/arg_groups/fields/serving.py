# Stand-in server: fields of the ``serving`` namespace.
# ruff: noqa: UP006, UP007, UP035, UP045
"""Config fields of the ``serving`` namespace."""

from __future__ import annotations

from typing import Optional

from sglang.srt.arg_groups.arg_utils import A
from sglang.srt.arg_groups.struct import Struct


class Serving(Struct):
    """Namespace ``serving``."""

    _NS_PATH = "serving"
    host: A[str, "The host of the HTTP server."] = "127.0.0.1"
    port: A[int, "The port of the HTTP server."] = 30000
    skip_server_warmup: A[bool, "If set, skip warmup."] = False
    log_level: A[str, "The logging level of all loggers."] = "info"
    log_level_http: A[
        Optional[str],
        "The logging level of HTTP server. If not set, reuse --log-level by default.",
    ] = None
    log_requests: A[bool, "Log metadata, inputs, outputs of all requests."] = False
    api_key: A[
        Optional[str],
        "Set API key of the server. It is also used in the OpenAI API compatible server.",
    ] = None
    served_model_name: A[
        Optional[str],
        "Override the model name returned by the v1/models endpoint in OpenAI API server.",
    ] = None
