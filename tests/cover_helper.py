"""A coverage.py plug-in: the host helper's copies are measured as the source file.

orch's helper never runs from ``orchestrator/shell/agent.py``. The bootstrap
(``agent_client.BOOTSTRAP``) either execs the source it was sent, compiled
under the name ``orch-agent``, or loads the copy a host keeps at
``<state dir>/helper/orch_helper_<id>.py``. Both are byte for byte
``agent.py`` (``<id>`` is its hash), so every line number is the source's;
only the file name differs, and a ``[paths]`` entry cannot rename a file
(it maps directory prefixes). This plug-in tells coverage, as each such code
object is first seen, that its lines are ``agent.py``'s.

It also claims ``agent.py`` itself: coverage refuses to combine one file's
data recorded by a plug-in with data recorded without it (tests that import
the helper's functions in-process would otherwise clash with its processes).

The package the helper is becoming (``orchestrator/host/``) keeps its file
names, so it needs no plug-in: ``[tool.coverage.paths]`` maps its kept copy
(``<state dir>/helper/<id>/orchestrator/host/``) back to the source tree.

Every measured process imports this module (coverage's ``plugins`` setting
travels to subprocesses): keep it small and stdlib + coverage only.
"""

from __future__ import annotations

import os
from typing import Any

from coverage import CoveragePlugin, FileReporter, FileTracer

HELPER_SOURCE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "orchestrator", "shell", "agent.py"
)
SENT_NAME = "orch-agent"  # the name the bootstrap compiles the sent source under
KEPT_PREFIX = "orch_helper_"  # <state dir>/helper/orch_helper_<id>.py


def is_helper_copy(filename: str) -> bool:
    """True for a file name under which the helper's code runs on a host."""
    base = os.path.basename(filename)
    if base == SENT_NAME:
        return True
    if base.startswith(KEPT_PREFIX) and base.endswith(".py"):
        return os.path.basename(os.path.dirname(filename)) == "helper"
    # realpath only for the one name that can match: coverage asks about every file a process runs
    return base == "agent.py" and os.path.realpath(filename) == os.path.realpath(HELPER_SOURCE)


class HelperTracer(FileTracer):
    """Lines of a helper copy are lines of ``agent.py`` (same bytes, same numbers)."""

    def source_filename(self) -> str:
        return HELPER_SOURCE


class HelperCopies(CoveragePlugin):
    """Claims the helper's copies for tracing and reports them as Python source."""

    def file_tracer(self, filename: str) -> FileTracer | None:
        return HelperTracer() if is_helper_copy(filename) else None

    def file_reporter(self, filename: str) -> FileReporter | str:
        return "python"  # coverage's own reporter for Python source


def coverage_init(reg: Any, options: dict[str, Any]) -> None:
    """coverage.py's entry point for plug-ins named in ``[tool.coverage.run] plugins``."""
    reg.add_file_tracer(HelperCopies())
