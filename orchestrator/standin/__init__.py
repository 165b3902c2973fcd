"""The stand-in server: a miniature SGLang-like tree that orch can patch and run without GPUs.

The real ``server_args.py`` imports torch and half of SGLang, so ``orch demo``
and the tests patch and run this small tree instead. It keeps what orch can
see of SGLang (``server_args.py`` in one of SGLang's three flag layouts;
``python -m sglang.launch_server``; ``/health``, ``/get_server_info``,
``/generate``), so a broken patch crashes it at start exactly as it crashes
SGLang, an unknown flag ends it with argparse's exit 2, and a new field shows
up in ``/get_server_info`` by itself. It is never presented as SGLang.

The layouts (``make_tree(dest, layout=…)``; see ``core.layouts``):

- ``classic`` (the default; SGLang ≤ 0.5.13): a dataclass field *and* a
  hand-written ``parser.add_argument`` per flag;
- ``annotated`` (0.5.14–0.5.19): one ``A[type, "help", NS(...)]`` field per
  flag, the parser derived from the dataclass — a plain field is not a flag;
- ``spec`` (≥ 0.5.20): the ``A[...]`` fields in namespace classes under
  ``sglang/srt/arg_groups/fields/`` (stdlib dataclasses standing in for
  ``msgspec.Struct``), assembled into ``ServerArgs`` by ``server_args.py``.

In every layout ``ServerArgs.add_cli_args(parser)`` builds the parser, as in
SGLang, so orch's default pre-flight runs here unchanged.

The tree under ``tree/`` (plus, for a layout, the overlays under
``layouts/``) is copied to a directory (here or on a test host) and run from
there with ``PYTHONPATH=<copy>/python``; it is stdlib-only and runs on
Python >= 3.8 (>= 3.9 for the annotated and spec layouts: ``typing.Annotated``).
Its behaviour is tuned with environment variables (see the ``ENV_*`` names
below).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

TREE: Path = Path(__file__).resolve().parent / "tree"
"""The packaged tree root: ``TREE / "python" / "sglang" / ...``."""

OVERLAYS: Path = Path(__file__).resolve().parent / "layouts"
"""Files each layout puts over the classic tree (same relative paths)."""

LAYOUTS: dict[str, tuple[str, ...]] = {
    "classic": (),
    "annotated": ("arg_utils", "annotated"),
    "spec": ("arg_utils", "spec"),
}
"""Layout name -> the overlays (folders of ``OVERLAYS``) copied over ``TREE``, in order."""

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


def _roots(layout: str) -> list[Path]:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown stand-in layout {layout!r} (one of: {', '.join(LAYOUTS)})")
    return [TREE, *(OVERLAYS / name for name in LAYOUTS[layout])]


def tree_files(layout: str = "classic") -> Iterator[tuple[str, bytes]]:
    """Yield ``(relative posix path, content)`` for every file of the tree in ``layout``.

    For copying the tree to a remote host file by file (SFTP) with the same
    filtering as :func:`make_tree`: no bytecode ever travels.
    """
    files: dict[str, Path] = {}
    for root in _roots(layout):
        for found in sorted(root.rglob("*")):
            rel = found.relative_to(root)
            if (
                found.is_file()
                and "__pycache__" not in rel.parts
                and found.suffix not in {".pyc", ".pyo"}
            ):
                files[rel.as_posix()] = found
    for name in sorted(files):
        yield name, files[name].read_bytes()


def make_tree(dest: Path, layout: str = "classic") -> Path:
    """Copy the miniature tree in ``layout`` to ``dest``; return its sglang_root, ``dest/python/sglang``.

    ``dest`` may exist (its other content is kept); files of the tree are
    overwritten, so a fresh copy is a clean, unpatched server.
    """
    dest = Path(dest)
    for root in _roots(layout):
        shutil.copytree(root, dest, ignore=_SKIP, dirs_exist_ok=True)
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
    "LAYOUTS",
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
