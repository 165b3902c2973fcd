"""``orch history`` and ``orch status``: read the host's records, change nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.nightly import record_source, record_tokens_per_s
from orchestrator.core.secrets import redact_argv
from orchestrator.core.target import HostTarget
from orchestrator.pipeline.nightly_drift import night_drift
from orchestrator.pipeline.session import ConnectOptions, HostSession
from orchestrator.shell.agent_client import RemoteStepError


@dataclass
class HistoryRow:
    id: str
    when: float
    kind: str
    playbook: str
    files: list[str]
    flag_changes: list[str]
    outcome: str
    duration: float | None
    current: bool
    error: str | None = None
    source: str | None = None  # nights: git <commit> / pip <n> packages
    tokens_per_s: float | None = None  # where the record has a probe

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def describe_outcome(manifest: dict[str, Any], applied: list[str]) -> str:
    """One word or two for a person: what became of this release."""
    outcome = manifest.get("outcome", "?")
    if manifest.get("kind") == "rollback":
        if outcome == "done":
            return "undid " + ", ".join(manifest.get("undid", []))
        return outcome.replace("_", " ")
    if outcome == "deployed":
        if applied and manifest["id"] == applied[-1]:
            return "current"
        if manifest.get("undone_by"):
            return f"undone by {manifest['undone_by']}"
        return "deployed"
    if outcome == "rolled_back":
        return "rolled back (watchdog)" if manifest.get("restored_by") == "watchdog" else "rolled back"
    return outcome.replace("_", " ")


def history_rows(state: dict[str, Any]) -> list[HistoryRow]:
    applied = list(state["state"].get("applied", []))
    rows = []
    for m in sorted(state["releases"], key=lambda m: m["id"]):
        rows.append(
            HistoryRow(
                id=m["id"],
                when=float(m.get("created", 0)),
                kind=m.get("kind", "deploy"),
                playbook=(m.get("playbook") or {}).get("name", "?"),
                files=[f["path"] for f in m.get("files", [])],
                flag_changes=list(m.get("flag_changes", [])),
                outcome=describe_outcome(m, applied),
                duration=m.get("duration"),
                current=bool(applied and m["id"] == applied[-1]),
                error=m.get("error"),
                source=record_source(m),
                tokens_per_s=record_tokens_per_s(m),
            )
        )
    return rows


def read_state(target: HostTarget, options: ConnectOptions) -> dict[str, Any]:
    with HostSession(target, options) as session:
        return dict(session.call("state_read", state_dir=target.state_dir))


@dataclass
class HostStatus:
    host: str
    current: str | None
    playbook: str | None
    server: dict[str, Any] | None
    health: str
    healthy: bool | None
    drift: list[str] = field(default_factory=list)
    journal: dict[str, Any] | None = None
    lock: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        if self.server:
            data["server"] = {k: v for k, v in self.server.items() if k != "env"}
            data["server"]["argv"] = redact_argv(self.server.get("argv") or [])
        return data


def host_status(target: HostTarget, options: ConnectOptions) -> HostStatus:
    """Current release, server process, health now, and drift since the release."""
    with HostSession(target, options) as session:
        state = session.call("state_read", state_dir=target.state_dir)
        applied = list(state["state"].get("applied", []))
        releases = {m["id"]: m for m in state["releases"]}
        current = releases.get(applied[-1]) if applied else None
        # the newest release that knew the server says where to look for it
        spec = next(
            (m.get("server_spec") for m in sorted(releases.values(), key=lambda m: m["id"], reverse=True)
             if m.get("server_spec")),
            None,
        )
        health_spec = next(
            (m.get("health") for m in sorted(releases.values(), key=lambda m: m["id"], reverse=True)
             if m.get("health")),
            None,
        )
        server = None
        if spec and spec.get("manager", "process") == "process":
            server = session.call("server_find", pidfile=spec.get("pidfile"), port=spec.get("port"))
        health, healthy = "unknown (no health checks recorded)", None
        if health_spec:
            try:
                got = session.call("health_wait", **dict(health_spec, timeout=0.0, interval=0.0))
                health, healthy = f"healthy ({got['last']})", True
            except RemoteStepError as e:
                health, healthy = f"NOT healthy: {e.message}", False
        drift: list[str] = []
        if current:
            files = current.get("files", [])
            shas = session.call("sha256", paths=[f["path"] for f in files])
            drift = [f["path"] for f in files if shas.get(f["path"]) != f["sha256_after"]]
        drift += night_drift(session, target.state_dir)
        return HostStatus(
            host=target.name,
            current=current["id"] if current else None,
            playbook=(current.get("playbook") or {}).get("name") if current else None,
            server=server,
            health=health,
            healthy=healthy,
            drift=drift,
            journal=state["journal"] if state["journal"] and not state["journal"].get("finished") else None,
            lock=state["lock"],
        )
