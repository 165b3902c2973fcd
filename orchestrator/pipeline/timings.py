"""How long each step of one host's run took, under the names people read.

A deploy's steps are named once, here, and the same names appear in the
``timings`` of ``--json`` (and of the release record on the host), in
``--stats``, and as the "step" column of the live view of a fleet run. They
follow the contract's steps and the journal's words:

``connect`` (SSH and orch's helper) · ``lock`` (lock and records) · ``plan``
(read, render, edit in memory) · ``stage`` (staged beside the targets and
validated) · ``backup`` (the release, the journal, the watchdog) · ``commit``
(compare-and-swap, read back, pre-flight) · ``restart`` (hooks, stop, start) ·
``health`` (health checks and the stability window) · ``gate`` (the
performance gate's probes and verdicts) · ``confirm`` (the
release made current) · ``rollback`` (a failed deploy's restore).

A step that did not happen has no entry: an unchanged host has
``connect``, ``lock`` and ``plan`` only.

``--json`` also has ``steps``: the same steps as fields, in the order they
began, each with ``at`` (when it began, epoch seconds on the host's clock
where the run reached the host; the controller's otherwise) and
``seconds``. A night's steps (``pipeline.nightly``) add ``build``,
``patch`` and ``probe``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from orchestrator.pipeline.events import Reporter

STEPS = ("connect", "lock", "plan", "stage", "backup", "commit", "restart", "health", "gate", "confirm",
         "rollback")
"""Every step name, in the order a deploy goes through them (for tables)."""


@dataclass
class StepClock:
    """Times one host's steps and tells the reporter which step it is in."""

    host: str
    reporter: Reporter
    timings: dict[str, float] = field(default_factory=dict)
    _started: dict[str, float] = field(default_factory=dict)
    _began: dict[str, float] = field(default_factory=dict)  # when each step last began (monotonic)
    _recorded_at: dict[str, float] = field(default_factory=dict)  # steps the host timed: when they began (its clock)

    def start(self, name: str) -> None:
        """Step ``name`` begins now (the live view shows it)."""
        self._started[name] = self._began[name] = time.monotonic()
        self.reporter.phase(self.host, name)

    def stop(self, name: str) -> None:
        """Step ``name`` ended now: its duration goes into ``timings``."""
        began = self._started.pop(name, None)
        if began is not None:
            self.timings[name] = round(time.monotonic() - began, 3)

    @property
    def begun(self) -> set[str]:
        """The steps that have started (running or done)."""
        return set(self._started) | set(self.timings)

    def steps(self, wall: Callable[[], float] = time.time) -> list[dict[str, float | str]]:
        """The finished steps as ``--json``'s fields, in the order they began:
        ``{"step", "at", "seconds"}``.

        ``wall``: the clock ``at`` is on, read once now (``HostSession.host_time``:
        the host's, where its helper said hello); each step's start is placed on it
        by the monotonic time elapsed since, so a controller clock that is hours
        off the host's never mixes into the host's times.
        """
        now, mono = wall(), time.monotonic()

        def began_at(name: str) -> float:
            if name in self._recorded_at:
                return self._recorded_at[name]
            return round(now - (mono - self._began.get(name, mono)), 3)

        ordered = sorted(self.timings, key=began_at)
        return [{"step": name, "at": began_at(name), "seconds": self.timings[name]} for name in ordered]

    def adopt(self, recorded: list[dict[str, object]]) -> None:
        """The steps the host's runner timed (``host/stamp.py``), as it recorded them: what
        ``--json`` and ``orch status`` say of one run are then the same figures."""
        for entry in recorded:
            name, at, seconds = entry.get("step"), entry.get("at"), entry.get("seconds")
            if isinstance(name, str) and isinstance(at, int | float) and isinstance(seconds, int | float):
                self._started.pop(name, None)
                self.timings[name] = float(seconds)
                self._recorded_at[name] = float(at)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """``with clock.step("plan"): …``: timed whether it succeeds or fails."""
        self.start(name)
        try:
            yield
        finally:
            self.stop(name)
