"""The stand-in server: a miniature SGLang-like tree that orch can patch and run without GPUs.

The real ``server_args.py`` imports torch and half of SGLang, so ``orch demo``
and the tests patch and run this small tree instead. It keeps what orch can
see of SGLang (the classic 0.5.13 ``server_args.py`` layout with a dataclass
field *and* a hand-written ``parser.add_argument`` per flag; ``python -m
sglang.launch_server``; ``/health``, ``/get_server_info``, ``/generate``), so a
broken patch crashes it at start exactly as it crashes SGLang, an unknown flag
ends it with argparse's exit 2, and a new field shows up in
``/get_server_info`` by itself. It is never presented as SGLang.

The tree under ``tree/`` is copied to a directory (here or on a test host) and
run from there with ``PYTHONPATH=<copy>/python``; it is stdlib-only and runs on
Python >= 3.8. Its behaviour is tuned with environment variables (see the
``ENV_*`` names below).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

TREE: Path = Path(__file__).resolve().parent / "tree"
"""The packaged tree root: ``TREE / "python" / "sglang" / ...``."""

READY_LINE = "The server is fired up and ready to roll!"
"""Printed (after a ``[date time] `` prefix, as in SGLang's log) once /health turns 200."""

ENV_STARTUP_DELAY = "STANDIN_STARTUP_DELAY"
"""Seconds during which the health paths answer 503 (default 0.5)."""
ENV_NEVER_READY = "STANDIN_NEVER_READY"
"""``1``: the health paths answer 503 forever (a server that never becomes healthy)."""
ENV_IGNORE_SIGTERM = "STANDIN_IGNORE_SIGTERM"
"""``1``: SIGTERM is ignored, so a manager has to SIGKILL after its stop_timeout."""
ENV_SLOWDOWN = "STANDIN_SLOWDOWN"
"""A factor (default 1): every modelled decode step takes this many times longer."""
ENV_GREEDY_SALT = "STANDIN_GREEDY_SALT"
"""Any text: changes what greedy (temperature 0) requests generate."""
ENV_CRASH_AT_START = "STANDIN_CRASH_AT_START"
"""``1``: the server fails at start (exit 1), after parsing its arguments."""

_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")


def tree_files() -> Iterator[tuple[str, bytes]]:
    """Yield ``(relative posix path, content)`` for every file of the tree.

    For copying the tree to a remote host file by file (SFTP) with the same
    filtering as :func:`make_tree`: no bytecode ever travels.
    """
    for path in sorted(TREE.rglob("*")):
        rel = path.relative_to(TREE)
        if (
            path.is_file()
            and "__pycache__" not in rel.parts
            and path.suffix not in {".pyc", ".pyo"}
        ):
            yield rel.as_posix(), path.read_bytes()


def make_tree(dest: Path) -> Path:
    """Copy the miniature tree to ``dest`` and return its sglang_root, ``dest/python/sglang``.

    ``dest`` may exist (its other content is kept); files of the tree are
    overwritten, so a fresh copy is a clean, unpatched server.
    """
    dest = Path(dest)
    shutil.copytree(TREE, dest, ignore=_SKIP, dirs_exist_ok=True)
    return dest / "python" / "sglang"


def launch_env(tree_dest: Path) -> dict[str, str]:
    """The environment variables to *add* for running a copy made by :func:`make_tree`.

    ``PYTHONPATH`` points at the copy; ``PYTHONDONTWRITEBYTECODE`` keeps the
    copy byte-identical to what orch wrote (no ``__pycache__`` beside the
    patched files). Merge with the caller's environment: ``{**os.environ, **launch_env(d)}``.
    """
    return {"PYTHONPATH": str(Path(tree_dest) / "python"), "PYTHONDONTWRITEBYTECODE": "1"}


def launch_argv(
    python: str,
    tree_dest: Path,
    *,
    port: int,
    model: str = "/models/standin",
    extra: Sequence[str] = (),
) -> list[str]:
    """The argv ``python -m sglang.launch_server --model-path MODEL --port PORT *extra``.

    It is the same command line a real SGLang server runs, so orch's flag
    editing sees nothing special. The tree is found through ``PYTHONPATH``
    (:func:`launch_env`), not the argv; ``tree_dest`` is taken so both calls
    name the same copy.
    """
    del tree_dest  # located through PYTHONPATH, see launch_env
    return [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        model,
        "--port",
        str(port),
        *extra,
    ]


__all__ = [
    "ENV_CRASH_AT_START",
    "ENV_GREEDY_SALT",
    "ENV_IGNORE_SIGTERM",
    "ENV_SLOWDOWN",
    "ENV_NEVER_READY",
    "ENV_STARTUP_DELAY",
    "READY_LINE",
    "TREE",
    "launch_argv",
    "launch_env",
    "make_tree",
    "tree_files",
]
