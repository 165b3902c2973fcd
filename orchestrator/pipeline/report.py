"""What a run ends with, per host and for the whole run (the ``--json`` report).

The outcome words are DESIGN.md's, and they are the same everywhere: the
summary line a person reads (``gpu: rolled_back``), the ``outcome`` field
of ``--json``, and the README. ``core.outcomes`` names them (``Outcome``),
says what each one means (``MEANING``) and decides them with the exit codes.
"refused" is not an outcome: it is what exit code 2 means, and a refused
host's outcome is ``failed`` (nothing was touched) or ``unreachable``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.core.outcomes import NOT_STARTED, Outcome, Verdict, worst


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

    @classmethod
    def ended(cls, host: str, verdict: Verdict, **fields: Any) -> HostReport:
        """The report of a host whose run ended with ``verdict`` (from ``core.outcomes``)."""
        return cls(host, verdict.outcome, verdict.exit_code, **fields)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("host")
        extra = data.pop("extra")
        data.update(extra)
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


def not_started(host: str, why: str) -> HostReport:
    """The report of a host a fleet run never reached (never connected, nothing changed)."""
    return HostReport.ended(host, NOT_STARTED, error=f"not started: {why}")


def error_report(message: str, exit_code: int) -> dict[str, Any]:
    """The ``--json`` report of a run that stopped before any host: bad input, usage, Ctrl-C."""
    return {"exit_code": exit_code, "error": message, "hosts": {}}
