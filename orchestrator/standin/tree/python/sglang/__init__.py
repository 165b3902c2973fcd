"""Stand-in server: a miniature, stdlib-only SGLang-like package.

It mirrors only what orch can see of SGLang (the classic ``server_args.py``
layout, ``python -m sglang.launch_server``, the native HTTP endpoints) so that
orch's deploys, health checks and rollbacks can be exercised without GPUs.
It is not SGLang.
"""

from sglang.version import __version__

__all__ = ["__version__"]
