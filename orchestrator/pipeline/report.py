"""What a run ends with, per host and for the whole run (the ``--json`` report).

The outcome words are DESIGN.md's, and they are the same everywhere: the
summary line a person reads (``gpu: rolled_back``), the ``outcome`` field
of ``--json``, and the README. ``core.outcomes`` names them (``Outcome``),
says what each one means (``MEANING``) and decides them with the exit codes.
"refused" is not an outcome: it is what exit code 2 means, and a refused
host's outcome is ``failed`` (nothing was touched) or ``unreachable``.

How a run that did not end as asked ended is ``ending`` (``core.endings``):
fields for scripts. ``error`` stays the sentence a person reads, made from
the ending by the words the CLI gave (``ConnectOptions.words``), so every
printer of ``error`` is unchanged; without a CLI (``events.plain``) it says
the ending's fields.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.core.endings import Ending, NotStarted
from orchestrator.core.events import as_json, plain
from orchestrator.core.outcomes import NOT_STARTED, Outcome, Verdict, worst
from orchestrator.pipeline.events import Words


@dataclass(frozen=True)
class Named:
    """A release as a rollback's summary names it: its id and the playbook that made it."""

    release: str
    playbook: str | None = None


@dataclass(frozen=True)
class RollbackSummary:
    """What a rollback undid and what is current now (None: the state before any release), each
    with its playbook: the summary line's facts (its words: ``cli.words.rollback_summary``)."""

    undid: tuple[Named, ...]
    current: Named | None

    def to_json(self) -> dict[str, Any]:
        return {"undid": [asdict(n) for n in self.undid], "current": asdict(self.current) if self.current else None}


@dataclass
class HostReport:
    host: str
    outcome: Outcome
    exit_code: int
    release: str | None = None
    files: list[str] = field(default_factory=list)
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    ending: Ending | None = None  # how it ended, as fields (``error`` is its words); None: as asked, or a cause's own message

    @classmethod
    def ended(cls, host: str, verdict: Verdict, **fields: Any) -> HostReport:
        """The report of a host whose run ended with ``verdict`` (from ``core.outcomes``)."""
        return cls(host, verdict.outcome, verdict.exit_code, **fields)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("host")
        data["ending"] = self.ending.to_json() if self.ending is not None else None
        data.pop("extra")
        data.update({k: as_json(v) for k, v in self.extra.items()})  # a value with fields: its own
        return data


@dataclass
class RunReport:
    """Every host's report, in the order the hosts were selected.

    A fleet run that stopped before its last batch says why in ``stopped``
    and names the file its failed and not-started hosts were written to in
    ``retry_file`` (``--limit @FILE`` reruns them).
    """

    hosts: dict[str, HostReport] = field(default_factory=dict)
    stopped: str | None = None
    retry_file: str | None = None

    @property
    def exit_code(self) -> int:
        """The worst host's (``core.outcomes.worst``)."""
        return worst(r.exit_code for r in self.hosts.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "error": None,
            "hosts": {name: r.to_json() for name, r in self.hosts.items()},
            "stopped": self.stopped,
            "retry_file": self.retry_file,
        }


def not_started(host: str, why: str, words: Words = plain) -> HostReport:
    """The report of a host a fleet run never reached (never connected, nothing changed)."""
    ending = NotStarted(why)
    return HostReport.ended(host, NOT_STARTED, ending=ending, error=words(ending))


def error_report(message: str, exit_code: int) -> dict[str, Any]:
    """The ``--json`` report of a run that stopped before any host: bad input, usage, Ctrl-C."""
    return {"exit_code": exit_code, "error": message, "hosts": {}}
