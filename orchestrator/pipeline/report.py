"""What a run ends with, per host and for the whole run (the ``--json`` report)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Outcome = Literal[
    "changed", "unchanged", "planned", "failed", "rolled_back", "rollback_failed", "unreachable"
]

EXIT_BY_OUTCOME: dict[str, int] = {
    "changed": 0,
    "unchanged": 0,
    "planned": 0,
    "failed": 2,
    "rolled_back": 1,
    "rollback_failed": 3,
    "unreachable": 2,
}


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
    hosts: dict[str, HostReport] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """The worst host's, i.e. the highest code (3 unsafe, 2 refused, 1 failed)."""
        return max((r.exit_code for r in self.hosts.values()), default=0)

    def to_json(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "hosts": {name: r.to_json() for name, r in self.hosts.items()},
        }
