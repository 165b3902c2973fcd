"""Every reporter implements the whole Reporter protocol (a missing method fails a
host's run half-way, as a fleet's reporter once did when the gate came)."""

from __future__ import annotations

import inspect

import pytest

from orchestrator.cli.live import FleetReporter
from orchestrator.cli.views import ConsoleReporter
from orchestrator.pipeline.events import Recorder, Reporter, RunLog

METHODS = sorted(name for name, _ in inspect.getmembers(Reporter, inspect.isfunction) if not name.startswith("_"))


@pytest.mark.parametrize("cls", [ConsoleReporter, FleetReporter, Recorder, RunLog], ids=lambda c: c.__name__)
def test_the_reporter_implements_every_method(cls: type) -> None:
    assert METHODS, "the protocol lists no method"
    missing = [m for m in METHODS if not callable(getattr(cls, m, None))]
    assert missing == [], f"{cls.__name__} lacks {missing}"
    for name in METHODS:
        want = list(inspect.signature(getattr(Reporter, name)).parameters)
        got = list(inspect.signature(getattr(cls, name)).parameters)
        assert got[: len(want)] == want, (cls.__name__, name, got, want)
