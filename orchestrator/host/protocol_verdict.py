"""The runner's own events, as types both sides read by field: a step's answers, the restore
beginning after a failed step, and the verdict that ends a release's event log.

The runner (``runner.py``) writes them to the release's ``events.jsonl``; every follower (the
deploy's own controller, ``orch status --follow``, a fleet following a lost host) reads them
back through ``runner_event_of``. They outlive the run that wrote them, so readers take the
documented default for a field an older runner did not write and ignore one a newer runner
adds.

Standard library only, Python 3.8 syntax: this module is shipped to the host.
"""

from __future__ import annotations

from .protocol import Message, message
from .protocol_steps import ProgramEvent

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, ClassVar, Union

    from .protocol import Wire


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _wire(value: Any) -> Wire | None:
    return value if isinstance(value, dict) else None


def _dropping_none(fields: Mapping[str, Any]) -> Wire:
    return {k: v for k, v in fields.items() if v is not None}


@message(frozen=True)
class StepFailure(Message):
    """Why the runner stopped: the program step that failed, the error's kind (``health``,
    ``gate``, ``cancelled`` for an abort, ``runner`` for a runner that died …), its one-line
    message, and what the step knew (``details``: a server's ``log_tail``, the gate's
    figures, a rollback's restore ``record``)."""

    kind: str = "runner"
    message: str = ""
    step: str | None = None  # None: no step failed (the runner died; the backstop's deadline)
    details: Wire | None = None

    CANCELLED: ClassVar[str] = "cancelled"  # an abort (Ctrl-C on the controller, ``rollback --abort``)

    def to_wire(self) -> Wire:
        return _dropping_none({"kind": self.kind, "message": self.message, "step": self.step,
                               "details": self.details})

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> StepFailure:
        return cls(_text(wire.get("kind")) or "runner", _text(wire.get("message")) or "",
                   _text(wire.get("step")), _wire(wire.get("details")))

    @property
    def aborted(self) -> bool:
        return self.kind == self.CANCELLED

    def detail(self, name: str) -> Any:
        return (self.details or {}).get(name)


@message(frozen=True)
class AnswersEvent(ProgramEvent):
    """A step ended: what its ops answered (``answers``, by op, in the program's order) and,
    for a gate, what it judged; a controller that planned the step reads them by op."""

    KIND: ClassVar[str] = "answers"
    step: str = ""
    answers: Any = None
    judged: Wire | None = None

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> AnswersEvent:
        return cls(str(wire.get("step") or ""), wire.get("answers"), _wire(wire.get("judged")))


@message(frozen=True)
class RestoringEvent(ProgramEvent):
    """A step failed (or the runner was aborted): the restore begins now, and a follower says
    why at once rather than after it."""

    KIND: ClassVar[str] = "restoring"
    failed: StepFailure | None = None
    by: str = "runner"

    def to_wire(self) -> Wire:
        return _dropping_none({"event": self.KIND, "by": self.by,
                               "failed": self.failed.to_wire() if self.failed is not None else None})

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> RestoringEvent:
        failed = _wire(wire.get("failed"))
        return cls(StepFailure.from_wire(failed) if failed is not None else None,
                   _text(wire.get("by")) or "runner")


@message(frozen=True)
class VerdictEvent(ProgramEvent):
    """How the runner (or its guard) ended a release: the last line of its event log."""

    KIND: ClassVar[str] = "verdict"
    CONFIRMED: ClassVar[str] = "confirmed"
    RESTORED: ClassVar[str] = "restored"
    RESTORE_FAILED: ClassVar[str] = "restore_failed"
    NOT_CONFIRMED: ClassVar[str] = "not_confirmed"  # someone else restored it first (`orch rollback`, the guard)
    ROLLBACK_FAILED: ClassVar[str] = "rollback_failed"  # a rollback's runner: never a second restore

    verdict: str = ""
    failed: StepFailure | None = None  # the step that failed (restored, restore_failed, rollback_failed)
    results: Wire | None = None  # every step's answers, by step name
    judged: Wire | None = None  # what the gate judged
    restore: Wire | None = None  # the restore's record (``restored.json``), where one ran
    reason: str | None = None  # why it restored, as the restore recorded it
    by: str | None = None  # who restored: runner, guard, rollback
    error: Wire | None = None  # the restore that could not run: its ``kind`` and ``message``
    note: str | None = None  # a confirmed release the guard found claimed: what it found
    claim: Wire | None = None  # not confirmed: whose claim came first
    at: float | None = None  # the host's wall time of the verdict

    def to_wire(self) -> Wire:
        fields = {name: getattr(self, name) for name in (
            "verdict", "results", "judged", "restore", "reason", "by", "error", "note", "claim", "at")}
        fields["failed"] = self.failed.to_wire() if self.failed is not None else None
        return dict(_dropping_none(fields), event=self.KIND)

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> VerdictEvent:
        failed = _wire(wire.get("failed"))
        at = wire.get("at")
        return cls(str(wire.get("verdict") or ""), StepFailure.from_wire(failed) if failed is not None else None,
                   _wire(wire.get("results")), _wire(wire.get("judged")), _wire(wire.get("restore")),
                   _text(wire.get("reason")), _text(wire.get("by")), _wire(wire.get("error")),
                   _text(wire.get("note")), _wire(wire.get("claim")),
                   float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None)


if TYPE_CHECKING:
    RunnerEvent = Union[AnswersEvent, RestoringEvent, VerdictEvent]

RUNNER_EVENTS = {kind.KIND: kind for kind in (AnswersEvent, RestoringEvent, VerdictEvent)}


def runner_event_of(wire: Mapping[str, Any]) -> RunnerEvent | None:
    """The typed runner event a line carries; None for any other kind."""
    kind = RUNNER_EVENTS.get(str(wire.get("event")))
    return kind.from_wire(wire) if kind is not None else None
