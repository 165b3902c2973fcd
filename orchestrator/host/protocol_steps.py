"""The events of a release's program (``executor.py``), as types light enough for the host.

Every step that begins, ends or fails is a ``StepEvent``; a gate that
measures again is a ``ReprobeEvent``. They are built with ``protocol``'s
``message`` (a frozen value class, not a dataclass): importing
``dataclasses`` would cost every deploy's helper about 17 ms of host CPU,
measured with ``bench/bench_fleet.py --baseline``. The controller reads
them through ``protocol_events.event_from_wire`` like every other event.

Standard library only, Python 3.8 syntax: this module is shipped to the host.
"""

from __future__ import annotations

from .protocol import Message, fields_of, message

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, ClassVar

    from .protocol import Wire


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class ProgramEvent(Message):
    """An event of a program: ``{"event": KIND, …its fields}``."""

    KIND: ClassVar[str] = ""

    def to_wire(self) -> Wire:
        wire: Wire = {"event": self.KIND}
        for f in fields_of(self):
            value = getattr(self, f.name)
            if value is not None:
                wire[f.name] = list(value) if isinstance(value, tuple) else value
        return wire


@message(frozen=True)
class StepEvent(ProgramEvent):
    """A step of a release's program (``program.StepName``) began, ended or failed, on the
    host's clock: what the release's event log (``events.jsonl``) holds, line for line."""

    KIND: ClassVar[str] = "step"
    BEGAN: ClassVar[str] = "began"
    ENDED: ClassVar[str] = "ended"
    FAILED: ClassVar[str] = "failed"
    step: str = ""
    state: str = ""  # BEGAN, ENDED or FAILED
    at: float = 0.0  # the host's wall time
    seconds: float | None = None  # how long the step took (ended and failed)

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> StepEvent:
        return cls(str(wire.get("step", "")), str(wire.get("state", "")), _number(wire.get("at")) or 0.0,
                   _number(wire.get("seconds")))


@message(frozen=True)
class ReprobeEvent(ProgramEvent):
    """The gate's verdicts are inconclusive (within the spread): these probes are measured again."""

    KIND: ClassVar[str] = "reprobe"
    probes: tuple[str, ...] = ()

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> ReprobeEvent:
        probes = wire.get("probes")
        return cls(tuple(str(p) for p in probes) if isinstance(probes, list) else ())
