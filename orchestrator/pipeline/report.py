"""What a run ends with, per host and for the whole run (the ``--json`` report).

The outcome words are DESIGN.md's, and they are the same everywhere: the
summary line a person reads (``gpu: rolled_back``), the ``outcome`` field
of ``--json``, and the README. ``OUTCOMES`` says what each one means.
"refused" is not an outcome: it is what exit code 2 means, and a refused
host's outcome is ``failed`` (nothing was touched) or ``unreachable``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Outcome = Literal[
    "changed", "unchanged", "planned", "failed", "rolled_back", "rollback_failed", "unreachable",
    "not_started",
]

OUTCOMES: dict[str, str] = {
    "changed": "the release is deployed and current (exit 0)",
    "unchanged": "nothing to do: files and server already as planned (exit 0)",
    "planned": "--check: planned, rendered, staged and validated; nothing changed (exit 0)",
    "failed": "refused or stopped before anything on the host changed (exit 2; 1 for Ctrl-C)",
    "rolled_back": "the deploy failed and the host is back as it was (exit 1); "
                   "for `orch rollback`, the rollback succeeded (exit 0)",
    "rollback_failed": "the host is not known to be healthy: a person or `orch rollback` "
                       "must act (exit 3)",
    "unreachable": "the host could not be reached or logged into; nothing changed (exit 2)",
    "not_started": "a fleet run stopped before this host's turn (a batch failed, or Ctrl-C): "
                   "never connected, nothing changed (exit 2)",
}
"""Each outcome word and what it means, for ``--help`` and docs/CLI.md."""

EXIT_BY_OUTCOME: dict[str, int] = {
    "changed": 0,
    "unchanged": 0,
    "planned": 0,
    "failed": 2,
    "rolled_back": 1,
    "rollback_failed": 3,
    "unreachable": 2,
    "not_started": 2,
}

UNREACHABLE_ERRORS = ("UnreachableError", "HostKeyError", "LinkLostError")
"""Errors that mean the host was never (or no longer) talked to."""


def error_outcome(exc: BaseException) -> tuple[Outcome, int]:
    """The outcome and exit code of a host whose read-only command (history, status) raised.

    Nothing changes in those, so a lost link is ``unreachable`` (2) too.
    """
    if type(exc).__name__ in UNREACHABLE_ERRORS:
        return "unreachable", 2
    return "failed", int(getattr(exc, "exit_code", 2))


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
        """The worst host's, i.e. the highest code (3 unsafe, 2 refused, 1 failed)."""
        return max((r.exit_code for r in self.hosts.values()), default=0)

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
    return HostReport(host, "not_started", EXIT_BY_OUTCOME["not_started"], error=f"not started: {why}")


def error_report(message: str, exit_code: int) -> dict[str, Any]:
    """The ``--json`` report of a run that stopped before any host: bad input, usage, Ctrl-C."""
    return {"exit_code": exit_code, "error": message, "hosts": {}}
