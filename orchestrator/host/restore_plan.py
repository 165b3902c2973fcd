"""What a restore must do, and what it did: ``restore.json`` and ``restored.json``, typed.

Every change orch makes on a host is a release whose directory holds a
durable restore plan (``restore.json``, ``RestoreSpec``). One host-side
function executes it for whoever acts (the controller's automatic rollback,
the watchdog, or ``orch rollback``) and records what it did
(``restored.json``, ``RestoreRecord``). The rules of ``host.records`` hold
here too: documented defaults, unknown fields ignored, ``format`` checked.
Standard library only, Python 3.8 syntax.
"""

from __future__ import annotations

from .records import FORMAT, check_format
from .values import _dict, _opt_float, _opt_int, field, value

TYPE_CHECKING = False  # ``typing.TYPE_CHECKING``, without importing typing on the host
if TYPE_CHECKING:
    from typing import Any

# ---------------------------------------------------------------- the restore plan (restore.json)


@value(frozen=True)
class FileState:
    """One file as a restore should leave it: ``source`` None means absent.

    ``expect`` is the content orch left there (the sha256 the release
    wrote): anything else found at restore time is drift, saved before it
    is replaced. ``n`` numbers the file's copies in its release.
    """

    path: str
    source: str | None
    sha256: str | None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    expect: str | None = None
    n: int | None = None

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> FileState:
        return cls(str(data["path"]), data.get("source"), data.get("sha256"), _opt_int(data.get("mode")),
                   _opt_int(data.get("uid")), _opt_int(data.get("gid")), data.get("expect"), _opt_int(data.get("n")))

    def to_wire(self) -> dict[str, Any]:
        return {"path": self.path, "source": self.source, "sha256": self.sha256, "mode": self.mode,
                "uid": self.uid, "gid": self.gid, "expect": self.expect, "n": self.n}


@value(frozen=True)
class LinkState:
    """A symlink as a restore should leave it (a night's ``current``):
    pointing at ``target``, or absent when ``target`` is None."""

    path: str
    target: str | None
    expect: str | None  # where orch pointed it

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> LinkState:
        return cls(str(data["path"]), data.get("target"), data.get("expect"))

    def to_wire(self) -> dict[str, Any]:
        return {"path": self.path, "target": self.target, "expect": self.expect}


@value(frozen=True)
class ServerStart:
    """A command line to start, exactly: argv, working directory, environment."""

    argv: list[str]
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    replace_env: bool = True

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ServerStart:
        return cls([str(a) for a in data["argv"]], data.get("cwd"), dict(data.get("env") or {}),
                   bool(data.get("replace_env", True)))

    def to_wire(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "cwd": self.cwd, "env": dict(self.env), "replace_env": self.replace_env}


@value(frozen=True)
class ServerTarget:
    """The server as a restore should leave it.

    ``before_pid``/``before_starttime`` name the process that ran when the
    release began: if it never stopped, the restore leaves it running
    (its code is already the old one). ``start`` None: nothing should run.
    The ``*_cmd`` fields are the ``commands`` manager's rendered commands.
    Defaults of older records: manager "process", timeouts 30/120/300 s.
    """

    manager: str
    start: ServerStart | None
    pidfile: str | None = None
    log: str | None = None
    port: int | None = None
    stop_timeout: float = 30.0
    free_timeout: float = 120.0
    before_pid: int | None = None
    before_starttime: float | None = None
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
        before = _dict(data.get("before")) if keep_before else {}
        return cls(
            manager=data.get("manager", "process"),
            start=None if commands or not start else ServerStart.from_wire(start),
            pidfile=data.get("pidfile"), log=data.get("log"), port=data.get("port"),
            stop_timeout=float(data.get("stop_timeout", 30.0)), free_timeout=float(data.get("free_timeout", 120.0)),
            before_pid=before.get("pid"), before_starttime=before.get("starttime"),
            stop_cmd=data.get("stop") if commands else None, start_cmd=start if commands else None,
            pid_cmd=data.get("pid_cmd") if commands else None,
            after_healthy=data.get("after_healthy"), hook_timeout=float(data.get("hook_timeout", 300.0)),
        )

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "manager": self.manager, "pidfile": self.pidfile, "log": self.log, "port": self.port,
            "stop_timeout": self.stop_timeout, "free_timeout": self.free_timeout,
            "before": {"pid": self.before_pid, "starttime": self.before_starttime} if self.before_pid else None,
            "start": self.start.to_wire() if self.start else None,
            "after_healthy": self.after_healthy, "hook_timeout": self.hook_timeout,
        }
        if self.manager == "commands":
            wire.update(stop=self.stop_cmd, start=self.start_cmd, pid_cmd=self.pid_cmd)
        return wire


@value(frozen=True)
class RestorePlan:
    """Files, links and server as the restore leaves them, and the health check after.

    ``always``: restore files even without ``commit.started`` (``orch
    rollback`` always writes); a deploy's plan leaves alone a target that
    orch never wrote. ``on_success``: helper steps run once the state is
    reached (a rollback's new stack of releases). All default to empty.
    """

    files: tuple[FileState, ...] | list[FileState] = ()
    links: tuple[LinkState, ...] | list[LinkState] = ()
    server: ServerTarget | None = None
    health: dict[str, Any] | None = None
    always: bool = False
    on_success: tuple[dict[str, Any], ...] | list[dict[str, Any]] = ()

    @classmethod
    def from_wire(cls, data: dict[str, Any] | None) -> RestorePlan:
        data = _dict(data)
        server = data.get("server")
        return cls(files=[FileState.from_wire(f) for f in data.get("files") or []],
                   links=[LinkState.from_wire(link) for link in data.get("links") or []],
                   server=ServerTarget.from_wire(server) if isinstance(server, dict) else None,
                   health=data.get("health") if isinstance(data.get("health"), dict) else None,
                   always=bool(data.get("always")), on_success=list(data.get("on_success") or []))

    @property
    def health_checks(self) -> list[dict[str, Any]]:
        """The health checks a restore sends (headers unmasked), each a copy; none: empty."""
        return [dict(c) for c in (self.health or {}).get("checks") or [] if isinstance(c, dict)]

    def to_wire(self) -> dict[str, Any]:
        return {"files": [f.to_wire() for f in self.files], "links": [link.to_wire() for link in self.links],
                "server": self.server.to_wire() if self.server else None, "health": self.health,
                "always": self.always, "on_success": list(self.on_success)}


@value(frozen=True)
class RestoreSpec:
    """``restore.json``: the plan, the watchdog's budget (seconds from the arming, counted
    on the host's monotonic clock), what the release starts, and the secret values to mask.

    ``version`` is this file's historic generation (3), written and not read;
    ``format`` is checked like every record's. Defaults: no budget, nothing started, no mask.
    """

    release: str
    kind: str
    plan: RestorePlan
    budget: float | None = None
    started: dict[str, Any] | None = None
    mask: list[str] = field(default_factory=list)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> RestoreSpec:
        check_format("restore.json", data)
        return cls(str(data.get("release") or ""), str(data.get("kind") or "deploy"),
                   RestorePlan.from_wire(data.get("plan")), _opt_float(data.get("budget")),
                   data.get("started") if isinstance(data.get("started"), dict) else None,
                   [str(m) for m in data.get("mask") or []])

    def to_wire(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"format": FORMAT, "version": 3, "release": self.release, "kind": self.kind,
                                "budget": self.budget, "plan": self.plan.to_wire(), "started": self.started}
        if self.mask:
            spec["mask"] = sorted(set(self.mask))
        return spec


# ---------------------------------------------------------------- what a restore did (restored.json)


@value(frozen=True)
class FileOutcome:
    """One file of a restore: ``action`` unchanged | restored | removed | left ("?" if absent)."""

    path: str
    action: str
    drift: str | None = None  # where the content orch did not write was saved
    earlier: str | None = None  # restored by an earlier, unfinished restore of the release (its ``by``)
    refused: tuple[str, ...] = ()  # links/files another user planted at names orch writes: never followed

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> FileOutcome:
        return cls(data["path"], data.get("action", "?"), data.get("drift"), data.get("earlier"),
                   tuple(data.get("refused") or ()))

    def to_wire(self) -> dict[str, Any]:
        return {"path": self.path, "action": self.action, "drift": self.drift, "earlier": self.earlier,
                "refused": list(self.refused)}

    @property
    def shown(self) -> str:
        return f"{self.path} (by the {self.earlier}'s earlier restore)" if self.earlier else self.path


@value(frozen=True)
class RestoreRecord:
    """What one restore did, as the host recorded it (``restored.json``).

    Defaults of older records: ``by`` "?", flags False, lists empty, ``listening``
    None, ``committed`` None (a record from before it was kept). The words that
    describe it are the controller's (``cli.restore_words.describe_restore``).
    """

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
    committed: bool | None = None  # whether the commit had begun

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> RestoreRecord:
        check_format("restored.json", data)
        return cls(
            by=data.get("by", "?"), ok=bool(data.get("ok")), completed=bool(data.get("completed")),
            error=data.get("error"), error_kind=data.get("error_kind"),
            files=[FileOutcome.from_wire(f) for f in data.get("files") or []],
            links=list(data.get("links") or []), server=data.get("server"), health=data.get("health"),
            record_errors=list(data.get("record_errors") or []), already=bool(data.get("already")),
            log_tail=list(data.get("log_tail") or []),
            listening=data.get("listening") if isinstance(data.get("listening"), dict) else None,
            committed=data.get("committed") if isinstance(data.get("committed"), bool) else None,
        )

    def to_wire(self) -> dict[str, Any]:
        return {"format": FORMAT, "by": self.by, "ok": self.ok, "completed": self.completed, "error": self.error,
                "error_kind": self.error_kind, "files": [f.to_wire() for f in self.files],
                "links": list(self.links), "server": self.server, "health": self.health,
                "record_errors": list(self.record_errors), "already": self.already,
                "log_tail": list(self.log_tail), "listening": self.listening, "committed": self.committed}

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
        relinked = any(link.get("action") in ("restored", "removed") for link in self.links)
        restarted = bool(self.server and self.server.get("action") in ("restarted", "stopped"))
        return self.wrote_files or relinked or restarted
