"""Starts coverage in orch's host helper, and in no other process of the suite.

Python imports ``sitecustomize`` at start-up from the first ``sys.path`` entry
that has one; under ``pytest --cov`` the suite puts this directory first on
``PYTHONPATH`` and the measured run's coverage settings in ``ORCH_TEST_COVERAGE``
(``tests/conftest.py``; sshd's sessions get both from ``tests/fixtures/sshd.py``).

Why not coverage's own ``patch = ["subprocess"]``: it starts coverage in every
Python child (each ``orch`` the tests run, the stand-in servers, every validator),
about 0.15 s of CPU each just to import coverage, to measure nothing: only the
helper is measured. Here the helper is told apart by its command line (the
bootstrap in ``agent_client`` imports ``orchestrator.host``; an older helper's
copy was named ``orch_helper_<id>``). The watchdog is a fork of
the helper and keeps its coverage. ``COVERAGE_PROCESS_CONFIG`` is set only while
coverage starts, so the helper's own children (servers, validators) are not
measured either.
"""

import os
import sys

HELPER_MARKS = ("orch_helper_", "orchestrator.host", "orchestrator/host")


def _is_helper():
    argv = getattr(sys, "orig_argv", None) or sys.argv
    return any(mark in arg for arg in argv for mark in HELPER_MARKS)


def _start():
    settings = os.environ.get("ORCH_TEST_COVERAGE")
    if not settings or not _is_helper():
        return
    try:
        import coverage
    except ImportError:  # an interpreter without coverage (the tests' older Pythons): unmeasured
        return
    os.environ["COVERAGE_PROCESS_CONFIG"] = settings
    try:
        coverage.process_startup()
    finally:
        del os.environ["COVERAGE_PROCESS_CONFIG"]


_start()
