"""How the pipeline tells the interface what is happening, without importing it.

The pipeline calls a ``Reporter``; the CLI passes one that draws with Rich:
``step``, ``note``, ``plan`` and the views on stdout, ``warn`` and
``server_log`` (a host's warnings, and the log that explains a failure) on
stderr, everything on stderr when ``--json`` owns stdout. So the pipeline
says a problem at the warning level, never as a step. Tests pass
``Recorder`` and read what was said.

What happened is reported as a typed event (``Reporter.event``, the types in
``core.events``); the words are the CLI's (``cli.words.line``), so the pipeline
never composes a step's English. ``step``/``note``/``warn`` with text stay for
lines the CLI itself writes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.core.events import Event, plain
from orchestrator.core.gate import GateOutcome, plain_table
from orchestrator.core.safetext import printable
from orchestrator.core.secrets import Masker

if TYPE_CHECKING:
    from orchestrator.pipeline.plan import HostPlan


Words = Callable[[Event], str]
"""How an event reads: the CLI's ``cli.words.line``, or ``core.events.plain`` without a CLI."""


class Reporter(Protocol):
    def event(self, host: str, ev: Event) -> None: ...
    def step(self, host: str, text: str) -> None: ...
    def note(self, host: str, text: str) -> None: ...
    def warn(self, host: str, text: str) -> None: ...
    def plan(self, host: str, plan: HostPlan) -> None: ...
    def readback(self, host: str, path: str, text: str, ranges: Sequence[Any]) -> None: ...
    def server_log(self, host: str, title: str, lines: Sequence[str]) -> None: ...
    def progress(self, host: str, event: dict[str, Any]) -> None: ...
    def gate(self, host: str, outcome: GateOutcome) -> None: ...
    def phase(self, host: str, step: str) -> None: ...


@dataclass
class Recorder:
    """A Reporter that keeps everything, for tests and for ``--json`` runs."""

    lines: list[tuple[str, str, str]] = field(default_factory=list)
    events: list[tuple[str, Event]] = field(default_factory=list)
    words: Words = plain
    plans: list[HostPlan] = field(default_factory=list)
    readbacks: list[tuple[str, str, str, list[Any]]] = field(default_factory=list)
    logs: list[tuple[str, str, list[str]]] = field(default_factory=list)
    gates: list[tuple[str, GateOutcome]] = field(default_factory=list)

    def event(self, host: str, ev: Event) -> None:
        """Kept as the event (tests assert on its fields) and as its line (``text``)."""
        self.events.append((host, ev))
        self.lines.append(("warn" if ev.level == "warning" else ev.level, host, self.words(ev)))

    def step(self, host: str, text: str) -> None:
        self.lines.append(("step", host, text))

    def note(self, host: str, text: str) -> None:
        self.lines.append(("note", host, text))

    def warn(self, host: str, text: str) -> None:
        self.lines.append(("warn", host, text))

    def plan(self, host: str, plan: HostPlan) -> None:
        self.plans.append(plan)

    def readback(self, host: str, path: str, text: str, ranges: Sequence[Any]) -> None:
        self.readbacks.append((host, path, text, list(ranges)))

    def server_log(self, host: str, title: str, lines: Sequence[str]) -> None:
        self.logs.append((host, title, list(lines)))

    def progress(self, host: str, event: dict[str, Any]) -> None:
        self.lines.append(("progress", host, str(event.get("msg", ""))))

    def gate(self, host: str, outcome: GateOutcome) -> None:
        self.gates.append((host, outcome))

    def phase(self, host: str, step: str) -> None:
        self.lines.append(("phase", host, step))

    def text(self) -> str:
        return "\n".join(t for kind, _, t in self.lines if kind != "phase")


@dataclass
class RunLog:
    """Forwards to a Reporter and keeps a plain-text copy: the release's ``run.log``.

    ``text`` is the one place that copy is made fit for a file people read:
    the run's secrets masked (``masker``), control characters from the host
    escaped (a log tail's ``\\x1b[2J`` stays text in ``less`` and in CI).
    ``words``: how an event reads, given by the CLI (``cli.words.line``) so the
    log says what the console says; ``core.events.plain`` without one.
    """

    inner: Reporter
    masker: Masker = field(default_factory=Masker)
    words: Words = plain
    lines: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    def _keep(self, kind: str, text: str) -> None:
        self.lines.append(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {kind:8} {text}")

    def event(self, host: str, ev: Event) -> None:
        self.events.append(ev)
        self._keep(ev.level, self.words(ev))  # the column step/note/warn wrote: step, note, warning
        self.inner.event(host, ev)

    def step(self, host: str, text: str) -> None:
        self._keep("step", text)
        self.inner.step(host, text)

    def note(self, host: str, text: str) -> None:
        self._keep("note", text)
        self.inner.note(host, text)

    def warn(self, host: str, text: str) -> None:
        self._keep("warning", text)
        self.inner.warn(host, text)

    def plan(self, host: str, plan: HostPlan) -> None:
        for f in plan.changed_files:
            self._keep("plan", f"{f.path}: sha256 {f.remote.sha256} -> {f.new_sha256}")
        self.inner.plan(host, plan)

    def readback(self, host: str, path: str, text: str, ranges: Sequence[Any]) -> None:
        lines = text.splitlines()
        for r in ranges:
            self._keep("readback", f"sed -n {r.start},{r.end}p {path}")
            self.lines.extend(f"{n:>8}  {lines[n - 1]}" for n in range(r.start, r.end + 1))
        self.inner.readback(host, path, text, ranges)

    def server_log(self, host: str, title: str, lines: Sequence[str]) -> None:
        self._keep("log", title)
        self.lines.extend(f"    | {line}" for line in lines)
        self.inner.server_log(host, title, lines)

    def progress(self, host: str, event: dict[str, Any]) -> None:
        if event.get("msg"):
            self._keep("progress", str(event["msg"]))
        self.inner.progress(host, event)

    def gate(self, host: str, outcome: GateOutcome) -> None:
        table = plain_table(outcome)
        self._keep("gate", table[0])
        self.lines.extend(table[1:])
        self.inner.gate(host, outcome)

    def phase(self, host: str, step: str) -> None:
        self.inner.phase(host, step)

    def text(self, end: str | Event | None = None) -> str:
        """The log so far, with ``end`` (words, or an ending said in the CLI's) as its last line
        if given; secrets masked, controls escaped."""
        if isinstance(end, Event):
            end = self.words(end)
        lines = self.lines + ([f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {'end':8} {end}"] if end else [])
        return printable(self.masker.text("\n".join(lines) + "\n"))
