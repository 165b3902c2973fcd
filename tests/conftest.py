"""Shared pytest plugins for the suite: the real sshd, the sandbox host, the fleet of sshd hosts."""

import os
import signal
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.fixtures.coverage_env import helper_coverage_env

# The property tests must pass on a busy machine: no deadline per example, and a slow draw of
# inputs is no failure (the suite runs beside sshd, servers and a busy loop on each core).
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

pytest_plugins = ["tests.fixtures.sshd", "tests.fixtures.sandbox", "tests.fixtures.fleet", "tests.fixtures.local_helper"]


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C works in the suite however it was started.

    A suite started in the background by a non-interactive shell (``cmd &``,
    ``nohup``) inherits SIGINT *ignored*; Python then installs no
    KeyboardInterrupt handler, and every process it starts inherits the
    ignoring too: the Ctrl-C tests' SIGINT would be lost. With a handler
    here, each worker raises KeyboardInterrupt, and every child (orch under
    test, helpers, servers) starts with SIGINT at its default, as from a
    terminal. Likewise SIGHUP, which ``nohup`` leaves ignored: orch keeps an
    ignored SIGHUP ignored (nohup's wish), so the SIGHUP tests' signal would
    be lost; every child starts with it at its default, as from a terminal.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    # Every ``orch`` the suite runs (a few thousand) imports orch as a user's would: from
    # bytecode. A machine that sets PYTHONDONTWRITEBYTECODE made each one compile ~90 modules
    # from source again, about 0.2 s of CPU per run, a quarter of the suite's time. The
    # servers' trees under test set it themselves (their tests look for no bytecode there).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


@pytest.fixture(scope="session", autouse=True)
def measured_helpers() -> Iterator[None]:
    """Under ``pytest --cov``, every helper this worker's tests start (directly, or
    through the ``orch`` they run) measures itself (``fixtures.coverage_env``)."""
    extra = helper_coverage_env(os.environ.get("PYTHONPATH", ""))
    saved = {name: os.environ.get(name) for name in extra}
    os.environ.update(extra)
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


# The suite's longest files, longest first (their summed durations in two whole runs of the
# README's test command, 2026-12-04: test_faults 272 s down to test_signals_read_only 43 s).
# Under ``--dist loadfile`` a worker takes the next file when it is free, in collection
# order; alphabetically, a long file can come last and keep one worker busy while the other
# three are done. Longest first (what a scheduler calls LPT), the short files fill the end.
# A stale entry costs nothing but that order: every file still runs.
LONGEST_FIRST = (
    "test_faults.py", "test_nightly.py", "test_demo.py", "test_clock.py", "test_runner_held.py",
    "test_layouts_real.py", "test_fleet.py", "test_gate_deploy.py", "test_deploy.py",
    "test_progress.py", "test_nightly_report.py", "test_bigfile.py", "test_deploy_layouts.py",
    "test_bench_quick.py", "test_runner.py", "test_deploy_more.py", "test_cli.py",
    "test_nightly_runner.py", "test_words_streams_live_line.py", "test_status_probe.py",
    "test_words_rows21.py", "test_records.py", "test_nightly_keep_builds.py", "test_security.py",
    "test_signals_read_only.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files in ``LONGEST_FIRST``'s order, then the rest as collected; each file's tests
    keep their own order (a stable sort), so every worker collects the same list."""
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The descriptors ``os.fsync`` is called on during the test, in order (each still synced)."""
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced
