"""``orch history`` and ``orch status``: read the host's records, change nothing.

Both read the state dir with one ``state_read`` request, which creates
nothing: on a host orch never deployed to, they say so and leave no trace.
``status`` also says what its exit code means: 0 when nothing is wrong
that it can see (drift is reported, not an error), 3 when the server is
not healthy (or not running) or a deploy never finished; with ``--probe``,
1 when the server, probed now, fails the current release's gate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.gate import GateOutcome
from orchestrator.core.nightly import record_source, record_tokens_per_s
from orchestrator.core.releases import describe_release, release_order
from orchestrator.core.secrets import redact_argv
from orchestrator.core.target import HostTarget
from orchestrator.pipeline.gate import probe_now
from orchestrator.pipeline.nightly_drift import night_drift
from orchestrator.pipeline.session import ConnectOptions, HostSession
from orchestrator.shell import ops
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


def history_rows(state: dict[str, Any]) -> list[HistoryRow]:
    applied = list(state["state"].get("applied", []))
    rows = []
    for m in sorted(state["releases"], key=release_order):  # the host's order, not the time stamps
        rows.append(
            HistoryRow(
                id=m["id"],
                when=float(m.get("created", 0)),
                kind=m.get("kind", "deploy"),
                playbook=(m.get("playbook") or {}).get("name", "?"),
                files=[f["path"] for f in m.get("files", [])],
                flag_changes=list(m.get("flag_changes", [])),
                outcome=describe_release(m, applied),
                duration=m.get("duration"),
                current=bool(applied and m["id"] == applied[-1]),
                error=m.get("error"),
                source=record_source(m),
                tokens_per_s=record_tokens_per_s(m),
            )
        )
    return rows


def read_state(target: HostTarget, options: ConnectOptions) -> dict[str, Any]:
    """The host's records (``state_read``: reads only, never creates the state dir)."""
    with HostSession(target, options) as session:
        return dict(session.run(ops.state_read(target.state_dir)))


@dataclass
class HostHistory:
    """One host's history, and whether orch ever kept a state dir there."""

    host: str
    state_dir: str
    exists: bool
    rows: list[HistoryRow]

    @property
    def empty_reason(self) -> str:
        """What an empty history means, in a sentence."""
        if not self.exists:
            return f"no releases: orch has never deployed to {self.host} (no {self.state_dir})"
        return f"no releases recorded in {self.state_dir} on {self.host}"


def host_history(target: HostTarget, options: ConnectOptions) -> HostHistory:
    state = read_state(target, options)
    return HostHistory(target.name, str(state.get("root") or target.state_dir),
                       bool(state.get("exists", True)), history_rows(state))


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
    server_expected: bool = False  # a release recorded a process server to look for
    state_dir_exists: bool = True
    gate: GateOutcome | None = None  # --probe: the server now against the release's recorded probe
    gate_note: str | None = None  # --probe: why there is no gate outcome

    @property
    def regressed(self) -> bool:
        """``--probe``: the server, probed now, fails a rule of the current release's gate."""
        return self.gate is not None and self.gate.verdict == "fail"

    @property
    def problems(self) -> list[str]:
        """What makes this status exit 3, in words (empty: exit 0)."""
        found = []
        if self.journal:
            found.append(f"deploy {self.journal.get('release')} unfinished")
        if self.healthy is False:
            found.append("server not healthy")
        elif self.server is None and self.server_expected:
            found.append("server not running")
        return found

    @property
    def exit_code(self) -> int:
        return 3 if self.problems else (1 if self.regressed else 0)

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["gate"] = self.gate.to_json() if self.gate else None
        if self.server:
            data["server"] = {k: v for k, v in self.server.items() if k != "env"}
            data["server"]["argv"] = redact_argv(self.server.get("argv") or [])
        data["problems"] = self.problems
        data["exit_code"] = self.exit_code
        return data


def host_status(target: HostTarget, options: ConnectOptions, *, probe: bool = False,
                reporter: Any = None) -> HostStatus:
    """Current release, server process, health now, and drift since the release.

    ``probe``: also probe the server now with the current release's gate
    probes, and judge it against that release's recorded figures and rules
    (``reporter``, if given, shows the probe's progress).
    """
    with HostSession(target, options) as session:
        state = session.run(ops.state_read(target.state_dir))
        applied = list(state["state"].get("applied", []))
        releases = {m["id"]: m for m in state["releases"]}
        current = releases.get(applied[-1]) if applied else None
        # the newest release that knew the server says where to look for it
        spec = next(
            (m.get("server_spec") for m in sorted(releases.values(), key=release_order, reverse=True)
             if m.get("server_spec")),
            None,
        )
        health_spec = next(
            (m.get("health") for m in sorted(releases.values(), key=release_order, reverse=True)
             if m.get("health")),
            None,
        )
        server = None
        if spec and spec.get("manager", "process") == "process":
            server = session.run(ops.server_find(spec.get("pidfile"), spec.get("port")))
        health, healthy = "unknown (no health checks recorded)", None
        if health_spec:
            try:
                got = session.run(ops.health_wait(dict(health_spec, timeout=0.0, interval=0.0)))
                health, healthy = f"healthy ({got['last']})", True
            except RemoteStepError as e:
                health, healthy = f"NOT healthy: {e.message}", False
        drift: list[str] = []
        if current:
            files = current.get("files", [])
            shas = session.run(ops.sha256([f["path"] for f in files]))
            drift = [f["path"] for f in files if shas.get(f["path"]) != f["sha256_after"]]
        drift += night_drift(session, state)
        gate: GateOutcome | None = None
        gate_note = None
        if probe:
            if current is None:
                gate_note = "not probed: no current release to compare with"
            elif healthy is False:
                gate_note = "not probed: the server is not healthy"
            else:
                release_dir = f"{state.get('root') or target.state_dir}/releases/{current['id']}"
                events = (lambda ev: reporter.progress(target.name, ev)) if reporter is not None else None
                found = probe_now(session, release_dir, current, events)
                gate, gate_note = (found, None) if isinstance(found, GateOutcome) else (None, found)
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
            server_expected=bool(spec and spec.get("manager", "process") == "process"),
            state_dir_exists=bool(state.get("exists", True)),
            gate=gate,
            gate_note=gate_note,
        )
