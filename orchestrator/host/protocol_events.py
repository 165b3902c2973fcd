"""The events the helper sends while an op runs, as types.

An event is a line ``{"id", "event": KIND, …}`` between a request and its
answer: a ``tick`` (the link is alive), a ``progress`` line for the operator,
what a ``health`` wait is waiting for. Where the controller acts on one it
reads a typed field (``ProgressEvent.step``), never the helper's words.

Standard library only, Python 3.8 syntax: this module is shipped to the host.
"""

from __future__ import annotations

import enum

from .protocol import ProtocolError
from .protocol_steps import ReprobeEvent, StepEvent
from .values import TYPE_CHECKING, fields_of, value

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, ClassVar, TypeVar

    from .protocol import Wire

    E = TypeVar("E", bound="Event")


class ProgressStep(str, enum.Enum):
    """A progress event the controller acts on, named rather than told in words."""

    HEALTH_WAIT = "health_wait"  # the health wait has begun (the server is started)



class Event:
    """Something the helper says while an op runs: ``{"id", "event": KIND, …}``."""

    KIND: ClassVar[str] = ""

    @classmethod
    def from_wire(cls: type[E], wire: Mapping[str, Any]) -> E:
        """The event a line carries; ``ProtocolError`` if it is not one of this kind."""
        event = event_from_wire(wire)
        if not isinstance(event, cls):
            raise ProtocolError("event %r: expected %r" % (wire.get("event"), cls.KIND))
        return event

    def to_wire(self) -> Wire:
        wire: Wire = {"event": self.KIND}
        for f in fields_of(self):
            value = getattr(self, f.name)
            if value is not None:
                wire[f.name] = value.value if isinstance(value, enum.Enum) else value
        return wire


@value(frozen=True)
class TickEvent(Event):
    """Sent every few seconds while an op runs: the link is alive."""

    KIND: ClassVar[str] = "tick"
    t: float = 0.0


@value(frozen=True)
class ProgressEvent(Event):
    """A line for the operator; ``step`` where the controller acts on it."""

    KIND: ClassVar[str] = "progress"
    msg: str = ""
    step: ProgressStep | None = None
    stream: str | None = None  # "build": a line of a build's own output


@value(frozen=True)
class HealthEvent(Event):
    """What the health wait is waiting for (said when it changes, and every 10 s)."""

    KIND: ClassVar[str] = "health"
    msg: str = ""
    elapsed: float = 0.0
    polls: int = 0


def _progress_step(wire: Mapping[str, Any]) -> ProgressStep | None:
    step = wire.get("step")
    if step is None and str(wire.get("msg", "")).startswith("waiting up to"):
        # Helpers before the typed step said it only in words. Remove once every
        # helper in use sends ``step`` (a kept helper is replaced when orch changes).
        return ProgressStep.HEALTH_WAIT
    try:
        return ProgressStep(step) if step is not None else None
    except ValueError:
        return None  # a step a newer helper names: shown, not acted on


def event_from_wire(wire: Mapping[str, Any]) -> Event | StepEvent | ReprobeEvent | None:
    """The typed event of a wire event; None for a kind this controller does not know."""
    kind = wire.get("event")
    if kind == TickEvent.KIND:
        t = wire.get("t")
        return TickEvent(float(t) if isinstance(t, (int, float)) else 0.0)
    if kind == ProgressEvent.KIND:
        stream = wire.get("stream")
        return ProgressEvent(str(wire.get("msg", "")), _progress_step(wire),
                             stream if isinstance(stream, str) else None)
    if kind == HealthEvent.KIND:
        elapsed, polls = wire.get("elapsed"), wire.get("polls")
        return HealthEvent(str(wire.get("msg", "")), float(elapsed) if isinstance(elapsed, (int, float)) else 0.0,
                           polls if isinstance(polls, int) else 0)
    if kind == ReprobeEvent.KIND:
        return ReprobeEvent.from_wire(wire)
    if kind == StepEvent.KIND:
        return StepEvent.from_wire(wire)
    return None


def health_began(wire: Mapping[str, Any]) -> bool:
    """The helper's health wait has begun: its first event says so."""
    event = event_from_wire(wire)
    return isinstance(event, HealthEvent) or (
        isinstance(event, ProgressEvent) and event.step is ProgressStep.HEALTH_WAIT)
