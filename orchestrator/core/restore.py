"""What a restore must do, and what it did: the plan and the record.

Every change orch makes on a host is a release whose directory holds a
durable restore plan (``restore.json``). One host-side function executes it
for whoever acts — the controller's automatic rollback, the watchdog, or
``orch rollback`` — re-reading it from disk at that moment (see the restore
machine in ``host/restore.py``). This module holds the two shapes that cross
the wire: the plan the controller writes, and the record of what the
restore actually did, from which every message about a restore is built.
Pure: values in, values and text out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.releases import FileState, LinkState


@dataclass(frozen=True)
class ServerStart:
    """A command line to start, exactly: argv, working directory, environment."""

    argv: list[str]
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    replace_env: bool = True

    def to_wire(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "cwd": self.cwd, "env": dict(self.env),
                "replace_env": self.replace_env}


@dataclass(frozen=True)
class ServerTarget:
    """The server as a restore should leave it.

    ``before_pid``/``before_starttime`` name the process that ran when the
    release began: if it never stopped, the restore leaves it running
    (its code is already the old one). ``start`` None: nothing should run.
    The ``*_cmd`` fields are the ``commands`` manager's rendered commands.
    """

    manager: str
    start: ServerStart | None
    pidfile: str | None = None
    log: str | None = None
    port: int | None = None
    stop_timeout: float = 30.0
    free_timeout: float = 120.0
    before_pid: int | None = None
    before_starttime: int | None = None
    stop_cmd: list[str] | None = None
    start_cmd: list[str] | None = None
    pid_cmd: list[str] | None = None
    after_healthy: list[str] | None = None  # run once the restored server is healthy, if the host was drained
    hook_timeout: float = 300.0

    @classmethod
    def from_wire(cls, data: dict[str, Any], *, keep_before: bool = True) -> ServerTarget:
        """Read a recorded target back; ``keep_before`` False forgets the
        process that ran back then (a later rollback restarts in any case)."""
        commands = data.get("manager") == "commands"
        start = data.get("start")
        before = (data.get("before") or {}) if keep_before else {}
        return cls(
            manager=data.get("manager", "process"),
            start=None if commands or not start else ServerStart(
                list(start["argv"]), start.get("cwd"), dict(start.get("env") or {}), bool(start.get("replace_env", True))),
            pidfile=data.get("pidfile"),
            log=data.get("log"),
            port=data.get("port"),
            stop_timeout=float(data.get("stop_timeout", 30.0)),
            free_timeout=float(data.get("free_timeout", 120.0)),
            before_pid=before.get("pid"),
            before_starttime=before.get("starttime"),
            stop_cmd=data.get("stop") if commands else None,
            start_cmd=start if commands else None,
            pid_cmd=data.get("pid_cmd") if commands else None,
            after_healthy=data.get("after_healthy"),
            hook_timeout=float(data.get("hook_timeout", 300.0)),
        )

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "manager": self.manager,
            "pidfile": self.pidfile,
            "log": self.log,
            "port": self.port,
            "stop_timeout": self.stop_timeout,
            "free_timeout": self.free_timeout,
            "before": {"pid": self.before_pid, "starttime": self.before_starttime} if self.before_pid else None,
            "start": self.start.to_wire() if self.start else None,
            "after_healthy": self.after_healthy,
            "hook_timeout": self.hook_timeout,
        }
        if self.manager == "commands":
            wire.update(stop=self.stop_cmd, start=self.start_cmd, pid_cmd=self.pid_cmd)
        return wire


@dataclass(frozen=True)
class RestorePlan:
    """Files, links and server as the restore leaves them, and the health check after.

    ``always``: restore files even without ``commit.started`` (``orch
    rollback`` always writes); a deploy's plan leaves alone a target that
    orch never wrote. ``on_success``: helper steps run once the state is
    reached (a rollback's new stack of releases).
    """

    files: Sequence[FileState] = ()
    links: Sequence[LinkState] = ()
    server: ServerTarget | None = None
    health: dict[str, Any] | None = None
    always: bool = False
    on_success: Sequence[dict[str, Any]] = ()

    def to_wire(self) -> dict[str, Any]:
        return {
            "files": [f.to_wire() for f in self.files],
            "links": [link.to_wire() for link in self.links],
            "server": self.server.to_wire() if self.server else None,
            "health": self.health,
            "always": self.always,
            "on_success": list(self.on_success),
        }


def restore_spec(
    release_id: str,
    kind: str,
    plan: RestorePlan,
    *,
    budget: float | None = None,
    started: dict[str, Any] | None = None,
    mask: list[str] | None = None,
) -> dict[str, Any]:
    """``restore.json``: the plan, the watchdog's budget, and what the release starts.

    ``budget`` is a duration (seconds from the arming), counted by the
    watchdog on the host's monotonic clock: an absolute deadline computed on
    the controller would be off by however far its clock is from the host's
    (an hour behind, and the watchdog restored every good deploy at once).
    ``mask``: the release's secret var values (the file is 0600, and holds the
    server's real environment already): a later ``orch history --release`` or
    ``status`` without the playbook masks them in what it shows of the
    release's files.
    """
    spec = {"version": 3, "release": release_id, "kind": kind, "budget": budget,
            "plan": plan.to_wire(), "started": started}
    if mask:
        spec["mask"] = sorted(set(mask))
    return spec


# ---------------------------------------------------------------- the record


@dataclass(frozen=True)
class FileOutcome:
    path: str
    action: str  # unchanged | restored | removed | left
    drift: str | None = None  # where the content orch did not write was saved
    earlier: str | None = None  # restored by an earlier, unfinished restore of the release (its ``by``)
    refused: tuple[str, ...] = ()  # links/files another user planted at names orch writes: never followed

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> FileOutcome:
        return cls(data["path"], data.get("action", "?"), data.get("drift"), data.get("earlier"),
                   tuple(data.get("refused") or ()))

    @property
    def shown(self) -> str:
        return f"{self.path} (by the {self.earlier}'s earlier restore)" if self.earlier else self.path


@dataclass(frozen=True)
class RestoreRecord:
    """What one restore did, as the host recorded it (``restored.json``)."""

    by: str
    ok: bool
    completed: bool
    error: str | None
    error_kind: str | None
    files: list[FileOutcome]
    links: list[dict[str, Any]]
    server: dict[str, Any] | None
    health: dict[str, Any] | None
    record_errors: list[str]
    already: bool
    log_tail: list[str]
    listening: dict[str, Any] | None = None  # a failed restore: who listens on the health port now
    committed: bool | None = None  # whether the commit had begun (None: a record from before this was kept)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> RestoreRecord:
        return cls(
            by=data.get("by", "?"),
            ok=bool(data.get("ok")),
            completed=bool(data.get("completed")),
            error=data.get("error"),
            error_kind=data.get("error_kind"),
            files=[FileOutcome.from_wire(f) for f in data.get("files") or []],
            links=list(data.get("links") or []),
            server=data.get("server"),
            health=data.get("health"),
            record_errors=list(data.get("record_errors") or []),
            already=bool(data.get("already")),
            log_tail=list(data.get("log_tail") or []),
            listening=data.get("listening") if isinstance(data.get("listening"), dict) else None,
            committed=data.get("committed") if isinstance(data.get("committed"), bool) else None,
        )

    @property
    def drift(self) -> list[FileOutcome]:
        return [f for f in self.files if f.drift]

    @property
    def wrote_files(self) -> bool:
        """Whether the restore put a file back: orch's content was there, so the run had written it."""
        return any(f.action in ("restored", "removed") for f in self.files)

    @property
    def changed_anything(self) -> bool:
        """Whether the restore had to write or restart anything at all."""
        wrote = any(f.action in ("restored", "removed") for f in self.files)
        relinked = any(link.get("action") in ("restored", "removed") for link in self.links)
        restarted = bool(self.server and self.server.get("action") in ("restarted", "stopped"))
        return wrote or relinked or restarted

    def describe(self, planned: Sequence[str] = ()) -> str:
        """One line for a person: exactly what was restored and what was not.

        ``planned``: every path the plan covers, so that files the restore
        never reached (it stopped on an earlier one) are named too.
        """
        parts: list[str] = []
        by_action: dict[str, list[str]] = {}
        for f in self.files:
            by_action.setdefault(f.action, []).append(f.shown)
        if by_action.get("restored") or by_action.get("removed"):
            parts.append("files restored: " + ", ".join(by_action.get("restored", []) + by_action.get("removed", [])))
        if by_action.get("unchanged"):
            # "never written" only where the commit provably never began
            said = "untouched (never written)" if self.committed is False else "already as before (not rewritten)"
            parts.append(f"{said}: " + ", ".join(by_action["unchanged"]))
        if by_action.get("left"):
            parts.append("changed by someone else, left as is: " + ", ".join(by_action["left"]))
        if not self.files and not planned and not self.links:
            parts.append("no file to restore")
        reached = {f.path for f in self.files}
        missed = [p for p in planned if p not in reached]
        if missed:
            parts.append("NOT restored: " + ", ".join(missed))
        for f in self.drift:
            parts.append(f"drift: {f.path} held content orch did not write; kept in {f.drift}")
        for f in self.files:
            # a security event, named even when the restore succeeded
            parts.extend(f"REFUSED a planted file or link: {why}" for why in f.refused)
        for link in self.links:
            if link.get("action") == "restored":
                parts.append(f"{link['path']} points at {link['target']} again")
            elif link.get("action") == "removed":
                parts.append(f"{link['path']} removed (there was none before)")
            if link.get("drift"):
                parts.append(f"drift: {link['path']} pointed at {link['drift']}, not where orch had pointed it")
        if self.server:
            parts.append(_describe_server(self.server, self.health))
        if self.error:
            parts.append(f"FAILED: {self.error}")
            if self.listening:
                parts.append(_describe_listening(self.listening))
        return "; ".join(parts) or "nothing needed restoring"


def _describe_listening(listening: dict[str, Any]) -> str:
    """Whether the host still serves after a failed restore: said, never left to guess."""
    port = listening.get("port")
    if listening.get("listening") is None:
        return f"whether a server listens on port {port} is not known"
    if not listening.get("listening"):
        return f"nothing is listening on port {port}: the server is down"
    pid = listening.get("pid")
    return f"a server is listening on port {port}" + (f" (pid {pid})" if pid else " (pid not visible)")


def _describe_server(server: dict[str, Any], health: dict[str, Any] | None) -> str:
    action = server.get("action")
    pid = server.get("pid")
    if action == "untouched":
        return f"the running server (pid {pid}) was never stopped" if pid else "the server was not touched"
    if action == "already running":
        return "the previous server command line already runs"
    if action == "stopped":
        return "the server started by the deploy is stopped (none ran before)"
    if action == "restarted":
        where = f" (pid {pid})" if pid else ""
        return f"the previous server was restarted{where}" + (" and is healthy" if health else "")
    return f"server: {action}"
