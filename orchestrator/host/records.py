"""The host's records, typed: what the state dir holds and what ``state_read`` answers.

The helper on the host writes these records (``lock.json``, ``journal.json``, ``state.json``,
a release's ``manifest.json``, ``restore.json`` and ``restored.json``, the watchdog's view)
and the controller reads them. Both sides use these types and their words (``JournalStep``,
``RecordedOutcome``), so the shape of a record and its vocabulary are written once.

Rules every ``from_wire`` follows, so that a state dir written by an older orch still reads,
and one written by a newer orch is read or refused, never misread:

- a field the record lacks takes the default its class documents (records
  written before the field existed);
- a field the reader does not know is ignored (a ``Manifest`` keeps it in
  ``extra`` so that rewriting the record loses nothing);
- ``format`` is the record's version: absent means 1. It changes only when an
  existing field changes meaning (adding a field does not change it), and a
  version the reader does not know is refused with ``UnknownRecordFormat``,
  one line naming the record and the version.

Standard library only, Python 3.8 syntax (annotations are never evaluated).
"""

from __future__ import annotations

import posixpath
from enum import Enum

from .record_words import RecordedOutcome, recorded_outcome
from .values import _dict, _opt_float, _opt_int, field, value

TYPE_CHECKING = False  # ``typing.TYPE_CHECKING``, without importing typing on the host
if TYPE_CHECKING:
    from typing import Any

FORMAT = 1
"""The format every record here is written in (and the only one read)."""


class UnknownRecordFormat(Exception):
    """A record written in a format this version of orch does not know (a newer orch wrote it)."""

    def __init__(self, record: str, version: object) -> None:
        self.record = record
        self.version = version
        super().__init__(f"{record}: record format {version!r} is not one this orch reads "
                         f"(it reads format {FORMAT}); a newer orch wrote it: upgrade orch")


def check_format(record: str, data: dict[str, Any]) -> None:
    """Refuse a record whose ``format`` is not one this reader knows (absent: 1)."""
    version = data.get("format", 1)
    if version != FORMAT or isinstance(version, bool):
        raise UnknownRecordFormat(record, version)


# ---------------------------------------------------------------- the state dir's paths


@value(frozen=True)
class StatePaths:
    """Every path of the state dir (POSIX: the host's), built in one place."""

    root: str

    @property
    def lock(self) -> str:
        return posixpath.join(self.root, "lock.json")

    @property
    def journal(self) -> str:
        return posixpath.join(self.root, "journal.json")

    @property
    def state(self) -> str:
        return posixpath.join(self.root, "state.json")

    @property
    def releases(self) -> str:
        return posixpath.join(self.root, "releases")

    def release(self, rid: str) -> str:
        return posixpath.join(self.releases, rid)

    def manifest(self, rid: str) -> str:
        return posixpath.join(self.release(rid), "manifest.json")

    def restore(self, rid: str) -> str:
        return posixpath.join(self.release(rid), "restore.json")

    def restored(self, rid: str) -> str:
        return posixpath.join(self.release(rid), "restored.json")

    def watchdog(self, rid: str) -> str:
        return posixpath.join(self.release(rid), "watchdog.json")

    def server_touched(self, rid: str) -> str:
        return posixpath.join(self.release(rid), "server.touched")

    def files(self, rid: str) -> str:
        return posixpath.join(self.release(rid), "files")

    def copy(self, rid: str, n: int | str, side: str) -> str:
        """A file's ``before``/``after`` copy in its release (``n``: its number there)."""
        return posixpath.join(self.files(rid), f"{n}.{side}")


# ---------------------------------------------------------------- journal, lock, state


class JournalStep(str, Enum):
    """Every step the journal records (what the controller and the helper write)."""

    BACKED_UP = "backed_up"  # deploy: the release and its backups exist
    COMMITTED = "committed"  # deploy: the new files are in place
    RESTARTING = "restarting"  # deploy: the server is being restarted
    BUILDING = "building"  # night: the new build is being made
    ARMED = "armed"  # night: the restore plan and the watchdog are in place
    SWITCHING = "switching"  # night: ``current`` and the server are switched
    PROBING = "probing"  # night: the new server is probed
    ROLLING_BACK = "rolling_back"  # rollback: the restore runs
    CONFIRMED = "confirmed"  # finished: the release is in effect
    FAILED = "failed"  # night: the build failed before anything switched
    ABANDONED = "abandoned"  # finished by ``orch rollback``: nothing had changed
    DONE = "done"  # a rollback's restore succeeded
    ROLLED_BACK = "rolled_back"  # the controller (or a rollback) restored the release
    RESTORED_BY_WATCHDOG = "restored_by_watchdog"
    RESTORE_FAILED = "restore_failed"  # not finished: a person must act
    RESTORE_INTERRUPTED = "restore_interrupted"  # not finished: the restore stopped half-way

    def __str__(self) -> str:
        return str(self.value)  # the word, in f-strings too (a str Enum's own str is its name since 3.12)


def _step(value: Any) -> JournalStep | str | None:
    """A known step as the enum; a step a newer orch wrote, as its word (shown, never acted on)."""
    if value is None:
        return None
    try:
        return JournalStep(value)
    except ValueError:
        return str(value)


@value(frozen=True)
class Journal:
    """``journal.json``: the last run's release, kind and step.

    Defaults of older records: ``kind`` "deploy", ``step``/``since`` None,
    ``finished`` False, no ``playbook``/``builds_dir``/``previous_build``/``drift``.
    ``since`` is the wire's ``time`` (the host's clock since 0.9; the
    controller's before).
    """

    release: str | None
    kind: str = "deploy"
    step: JournalStep | str | None = None
    since: float | None = None
    finished: bool = False
    playbook: str | None = None
    controller: dict[str, Any] | None = None
    builds_dir: str | None = None  # a night's
    previous_build: str | None = None  # a night's
    drift: list[str] | None = None  # written by the helper's restore

    @classmethod
    def from_wire(cls, data: dict[str, Any] | None) -> Journal | None:
        if not data:
            return None
        check_format("journal.json", data)
        drift = data.get("drift")
        return cls(release=data.get("release"), kind=str(data.get("kind") or "deploy"), step=_step(data.get("step")),
                   since=_opt_float(data.get("time")), finished=bool(data.get("finished")),
                   playbook=data.get("playbook"), controller=data.get("controller"),
                   builds_dir=data.get("builds_dir"), previous_build=data.get("previous_build"),
                   drift=[str(d) for d in drift] if isinstance(drift, list) else None)

    def to_wire(self) -> dict[str, Any]:
        step = self.step.value if isinstance(self.step, JournalStep) else self.step
        wire: dict[str, Any] = {"format": FORMAT, "release": self.release, "kind": self.kind, "step": step,
                                "finished": self.finished, "time": self.since, "controller": self.controller}
        optional = {"playbook": self.playbook, "builds_dir": self.builds_dir, "previous_build": self.previous_build,
                    "drift": list(self.drift) if self.drift is not None else None}
        if self.kind == "night":  # a night's journal says where its builds are, even before there is one
            wire.update(builds_dir=self.builds_dir, previous_build=self.previous_build)
        wire.update((k, v) for k, v in optional.items() if v is not None)
        return wire

    def moved_to(self, step: JournalStep, *, finished: bool = False, since: float | None = None) -> Journal:
        """This journal at a later step (what ``orch rollback`` writes when it finishes a run)."""
        return Journal(self.release, self.kind, step, self.since if since is None else since, finished,
                       self.playbook, self.controller, self.builds_dir, self.previous_build, self.drift)


FRESH_HEARTBEAT_SECONDS = 20.0
"""The helper renews its lock's heartbeat every 5 s, and only while it heard its controller
within the last 12 s: a heartbeat older than this means nobody steers it."""


@value(frozen=True)
class Lock:
    """``lock.json`` as another run sees it (``lock_view``): who holds it, whether its helper
    lives, the heartbeat's age.

    Defaults of older records: ``user``/``controller`` "?", ``command`` "a run",
    ``heartbeat_age`` 0, ``helper_alive`` False, the rest None. On the wire
    ``helper_pid`` is ``agent_pid`` and ``helper_alive`` is ``agent_alive``.
    """

    user: str = "?"
    controller: str = "?"
    controller_id: str | None = None
    pid: int | None = None
    command: str = "a run"
    started: float | None = None  # the holder's controller's clock
    token: str | None = None
    helper_pid: int | None = None
    helper_alive: bool = False
    heartbeat_age: float = 0.0
    taken: float | None = None  # the host's clock (older helpers: absent)

    @classmethod
    def from_wire(cls, data: dict[str, Any] | None) -> Lock | None:
        if not data:
            return None
        check_format("lock.json", data)
        pid, helper = data.get("pid"), data.get("agent_pid")
        return cls(user=str(data.get("user", "?")), controller=str(data.get("controller", "?")),
                   controller_id=data.get("controller_id"), pid=int(pid) if pid else None,
                   command=str(data.get("command") or "a run"), started=_opt_float(data.get("started")),
                   token=data.get("token"), helper_pid=int(helper) if helper else None,
                   helper_alive=bool(data.get("agent_alive")),
                   heartbeat_age=float(data.get("heartbeat_age") or 0.0), taken=_opt_float(data.get("taken")))

    def to_wire(self) -> dict[str, Any]:
        return {"format": FORMAT, "user": self.user, "controller": self.controller,
                "controller_id": self.controller_id, "pid": self.pid, "command": self.command,
                "started": self.started, "token": self.token, "agent_pid": self.helper_pid,
                "agent_alive": self.helper_alive, "heartbeat_age": self.heartbeat_age, "taken": self.taken}

    @property
    def hears_controller(self) -> bool:
        """The helper lives and its heartbeat is fresh: its controller still steers it."""
        return self.helper_alive and self.heartbeat_age <= FRESH_HEARTBEAT_SECONDS

    @property
    def who(self) -> str:
        return f"{self.user}@{self.controller}"

    @property
    def since(self) -> float:
        """When it was taken: the host's clock, or (an older helper's lock) its controller's."""
        return self.taken or self.started or 0.0


@value(frozen=True)
class AppliedState:
    """``state.json``: the stack of releases in effect, oldest first (absent file: empty)."""

    applied: list[str] = field(default_factory=list)

    @classmethod
    def from_wire(cls, data: dict[str, Any] | None) -> AppliedState:
        data = _dict(data)
        check_format("state.json", data)
        return cls([str(r) for r in data.get("applied") or []])

    def to_wire(self) -> dict[str, Any]:
        return {"format": FORMAT, "applied": list(self.applied)}

    @property
    def current(self) -> str | None:
        return self.applied[-1] if self.applied else None


@value(frozen=True)
class WatchdogRecord:
    """The journal's release's watchdog (``watchdog_view``): alive (pid + start time), and
    when it acts (host clock). Defaults: ``alive``/``armed``/``restored`` False, no pid."""

    release: str
    alive: bool = False
    acts_at: float | None = None
    pid: int | None = None
    armed: bool = False
    restored: bool = False

    @classmethod
    def from_wire(cls, data: dict[str, Any] | None) -> WatchdogRecord | None:
        if not data or not data.get("release"):
            return None
        check_format("watchdog", data)
        return cls(release=str(data["release"]), alive=bool(data.get("alive")),
                   acts_at=_opt_float(data.get("acts_at")), pid=_opt_int(data.get("pid")),
                   armed=bool(data.get("armed")), restored=bool(data.get("restored")))

    def to_wire(self) -> dict[str, Any]:
        return {"format": FORMAT, "release": self.release, "alive": self.alive, "acts_at": self.acts_at,
                "pid": self.pid, "armed": self.armed, "restored": self.restored}


# ---------------------------------------------------------------- server processes


@value(frozen=True)
class ServerProcess:
    """A server process as the helper read it (``process_record``), or as a release
    recorded it (``server_before``/``server_after``: argv, cwd, env; masked there).

    Every field may be absent in a record (None; ``env`` empty).
    """

    pid: int | None = None
    argv: list[str] | None = None
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    pgid: int | None = None
    sid: int | None = None
    starttime: float | None = None
    found_by: str | None = None  # "pidfile" or "port"
    started_at: float | None = None  # the start as a Unix time on the host's clock (None from older helpers)
    replace_env: bool | None = None  # a started command line's: whether env replaced the helper's

    @classmethod
    def from_wire(cls, data: dict[str, Any] | None) -> ServerProcess | None:
        if not isinstance(data, dict):
            return None
        check_format("server process", data)
        argv, replace = data.get("argv"), data.get("replace_env")
        return cls(pid=_opt_int(data.get("pid")), argv=[str(a) for a in argv] if isinstance(argv, list) else None,
                   cwd=data.get("cwd"), env={str(k): str(v) for k, v in _dict(data.get("env")).items()},
                   pgid=_opt_int(data.get("pgid")), sid=_opt_int(data.get("sid")),
                   starttime=_opt_float(data.get("starttime")), found_by=data.get("found_by"),
                   replace_env=replace if isinstance(replace, bool) else None, started_at=_opt_float(data.get("started_at")))

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"argv": self.argv, "cwd": self.cwd, "env": dict(self.env)}
        extra = {"pid": self.pid, "pgid": self.pgid, "sid": self.sid, "starttime": self.starttime,
                 "found_by": self.found_by, "replace_env": self.replace_env, "started_at": self.started_at}
        wire.update((k, v) for k, v in extra.items() if v is not None)
        return wire


# ---------------------------------------------------------------- releases


@value(frozen=True)
class ReleaseFile:
    """One file of a release's manifest: its copies are ``files/<n>.before|after``.

    Defaults of older records: ``existed`` True; mode, owner and hashes None.
    """

    path: str
    n: int | None = None
    existed: bool = True
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    sha256_before: str | None = None
    sha256_after: str | None = None

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ReleaseFile:
        return cls(str(data["path"]), _opt_int(data.get("n")), bool(data.get("existed", True)),
                   _opt_int(data.get("mode")), _opt_int(data.get("uid")), _opt_int(data.get("gid")),
                   data.get("sha256_before"), data.get("sha256_after"))

    def to_wire(self) -> dict[str, Any]:
        return {"path": self.path, "n": self.n, "existed": self.existed, "mode": self.mode, "uid": self.uid,
                "gid": self.gid, "sha256_before": self.sha256_before, "sha256_after": self.sha256_after}


def _checks(health: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [dict(c) for c in (health or {}).get("checks") or [] if isinstance(c, dict)]


@value(frozen=True)
class ServerSpec:
    """A release's ``server_spec``: how its server is managed and found (manager default
    "process"; the rest None when absent)."""

    manager: str = "process"
    pidfile: str | None = None
    log: str | None = None
    port: int | None = None
    stop_timeout: float | None = None

    @classmethod
    def from_wire(cls, data: dict[str, Any] | None) -> ServerSpec | None:
        if not isinstance(data, dict):
            return None
        return cls(str(data.get("manager") or "process"), data.get("pidfile"), data.get("log"),
                   _opt_int(data.get("port")), _opt_float(data.get("stop_timeout")))

    def to_wire(self) -> dict[str, Any]:
        return {"manager": self.manager, "pidfile": self.pidfile, "log": self.log, "port": self.port,
                "stop_timeout": self.stop_timeout}


@value(frozen=True)
class RecordedProbe:
    """One probe's figures in a release's ``probe`` record: its key (what it sent), label, result."""

    key: str  # "" in a record that has none: never matched as a baseline
    label: str
    result: dict[str, Any]


_MANIFEST_TYPED = ("id", "kind", "seq", "created", "finished", "duration", "outcome", "error", "restored_by",
                   "playbook", "files", "flag_changes", "server_spec", "health", "server_before", "server_after",
                   "drift_kept", "probe", "builds_dir", "format", "restarted", "link", "undid", "undone_by", "source", "timings", "gate")


@value(frozen=True)
class Manifest:
    """A release's record (``manifest.json``): written by the run, finished by the helper.

    Defaults of older records: ``kind`` "deploy", ``seq`` None (ordered before every numbered
    release, by id), ``created`` 0, no files, no flag changes, ``outcome`` None (else a
    ``RecordedOutcome``). ``drift_kept`` is added by ``state_read`` (the drift copies the release
    still keeps). Fields this version does not read (``drift``, ``restore_error``, ``vars`` …)
    are kept in ``extra`` and written back by ``to_wire``.
    """

    id: str
    kind: str = "deploy"
    seq: int | None = None
    created: float = 0.0
    finished: float | None = None
    duration: float | None = None
    outcome: RecordedOutcome | str | None = None  # a word a newer orch wrote: its ``str``
    error: str | None = None
    restored_by: str | None = None
    playbook: dict[str, Any] = field(default_factory=dict)
    files: list[ReleaseFile] = field(default_factory=list)
    flag_changes: list[Any] = field(default_factory=list)
    server_spec: dict[str, Any] | None = None
    health: dict[str, Any] | None = None
    server_before: ServerProcess | None = None
    server_after: ServerProcess | None = None
    drift_kept: list[dict[str, Any]] = field(default_factory=list)
    probe: dict[str, Any] | None = None
    builds_dir: str | None = None
    restarted: bool = False  # the release restarted the server (``server_before`` is what ran)
    link: dict[str, Any] | None = None  # a night's ``builds_dir/current``: path, before, after
    undid: list[str] = field(default_factory=list)  # a rollback's: the releases it undid
    undone_by: str | None = None  # a release a later rollback undid: that rollback
    source: dict[str, Any] | None = None  # a night's: the git commit or pip set it built
    timings: dict[str, float] | None = None  # seconds per step of the run
    gate: dict[str, Any] | None = None  # the performance gate's verdicts (``core.gate.GateOutcome``)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Manifest:
        check_format("manifest.json", data)
        playbook = data.get("playbook")
        return cls(
            id=str(data["id"]), kind=str(data.get("kind") or "deploy"), seq=_opt_int(data.get("seq")),
            created=_opt_float(data.get("created")) or 0.0, finished=_opt_float(data.get("finished")),
            duration=_opt_float(data.get("duration")), outcome=recorded_outcome(data.get("outcome")), error=data.get("error"),
            restored_by=data.get("restored_by"),
            playbook=dict(playbook) if isinstance(playbook, dict) else ({"name": playbook} if playbook else {}),
            files=[ReleaseFile.from_wire(f) for f in data.get("files") or [] if isinstance(f, dict)],
            flag_changes=list(data.get("flag_changes") or []),
            server_spec=data.get("server_spec") if isinstance(data.get("server_spec"), dict) else None,
            health=data.get("health") if isinstance(data.get("health"), dict) else None,
            server_before=ServerProcess.from_wire(data.get("server_before")),
            server_after=ServerProcess.from_wire(data.get("server_after")),
            drift_kept=[d for d in data.get("drift_kept") or [] if isinstance(d, dict)],
            probe=data.get("probe") if isinstance(data.get("probe"), dict) else None,
            builds_dir=data.get("builds_dir"), restarted=bool(data.get("restarted")),
            link=data.get("link") if isinstance(data.get("link"), dict) else None,
            undid=[str(r) for r in data.get("undid") or []], undone_by=data.get("undone_by"),
            source=data.get("source") if isinstance(data.get("source"), dict) else None,
            timings=data.get("timings") if isinstance(data.get("timings"), dict) else None,
            gate=data.get("gate") if isinstance(data.get("gate"), dict) else None,
            extra={k: v for k, v in data.items() if k not in _MANIFEST_TYPED},
        )

    def to_wire(self) -> dict[str, Any]:
        wire = dict(self.extra)
        wire.update({
            "format": FORMAT, "id": self.id, "kind": self.kind, "seq": self.seq, "created": self.created,
            "finished": self.finished, "duration": self.duration, "outcome": self.outcome and str(self.outcome),
            "error": self.error, "restored_by": self.restored_by, "playbook": dict(self.playbook),
            "files": [f.to_wire() for f in self.files], "flag_changes": list(self.flag_changes),
            "server_spec": self.server_spec, "health": self.health,
            "server_before": self.server_before.to_wire() if self.server_before else None,
            "server_after": self.server_after.to_wire() if self.server_after else None,
            "drift_kept": list(self.drift_kept), "probe": self.probe, "builds_dir": self.builds_dir,
            "restarted": self.restarted, "link": self.link, "undid": list(self.undid), "undone_by": self.undone_by,
            "source": self.source, "timings": self.timings, "gate": self.gate,
        })
        return wire

    @property
    def playbook_name(self) -> str | None:
        name = self.playbook.get("name")
        return str(name) if name is not None else None

    @property
    def order(self) -> tuple[int, int, str]:
        """Sort key: the host's ``seq`` (the order it made releases in), never a clock;
        releases recorded before ``seq`` existed come first, by id."""
        return (1, self.seq, self.id) if self.seq is not None else (0, 0, self.id)

    @property
    def health_checks(self) -> list[dict[str, Any]]:
        """The release's health checks (``health.checks``), each a copy; none: empty."""
        return _checks(self.health)

    @property
    def process_server(self) -> ServerSpec | None:
        """Where the release's ``process`` server is looked for (None: another manager, or none)."""
        spec = ServerSpec.from_wire(self.server_spec)
        return spec if spec is not None and spec.manager == "process" else None

    @property
    def recorded_probes(self) -> list[RecordedProbe]:
        """The gate's figures this release recorded of the server it started (``probe``)."""
        entries = (self.probe or {}).get("probes") or []
        return [RecordedProbe(str(e.get("key") or ""), str(e.get("label")), e["result"])
                for e in entries if isinstance(e, dict) and isinstance(e.get("result"), dict)]

    @property
    def drift_kept_paths(self) -> list[str]:
        return [str(d.get("path")) for d in self.drift_kept]


@value(frozen=True)
class HostRecords:
    """The answer of ``state_read``: the whole state dir, read in one round trip.

    Defaults of older helpers: ``exists`` True, no journal, lock or watchdog,
    ``host_time`` None, ``pruned`` (``pruned.json``: ``{"count", "keep_releases"}``) None.
    """

    root: str
    exists: bool = True
    journal: Journal | None = None
    state: AppliedState = field(default_factory=AppliedState)
    lock: Lock | None = None
    releases: list[Manifest] = field(default_factory=list)
    watchdog: WatchdogRecord | None = None
    host_time: float | None = None
    pruned: dict[str, Any] | None = None

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> HostRecords:
        return cls(root=str(data["root"]), exists=bool(data.get("exists", True)),
                   journal=Journal.from_wire(data.get("journal")), state=AppliedState.from_wire(data.get("state")),
                   lock=Lock.from_wire(data.get("lock")), pruned=_dict(data.get("pruned")) or None,
                   releases=[Manifest.from_wire(m) for m in data.get("releases") or []
                             if isinstance(m, dict) and "id" in m],
                   watchdog=WatchdogRecord.from_wire(data.get("watchdog")),
                   host_time=_opt_float(data.get("host_time")))

    def to_wire(self) -> dict[str, Any]:
        return {"root": self.root, "exists": self.exists,
                "journal": self.journal.to_wire() if self.journal else None, "state": self.state.to_wire(),
                "lock": self.lock.to_wire() if self.lock else None,
                "releases": [m.to_wire() for m in self.releases], "pruned": self.pruned,
                "watchdog": self.watchdog.to_wire() if self.watchdog else None, "host_time": self.host_time}

    @property
    def paths(self) -> StatePaths:
        return StatePaths(self.root)

    @property
    def applied(self) -> list[str]:
        return list(self.state.applied)

    @property
    def by_id(self) -> dict[str, Manifest]:
        return {m.id: m for m in self.releases}

    @property
    def current(self) -> Manifest | None:
        """The release on top of ``applied`` (None: no release in effect, or its record is gone)."""
        return self.by_id.get(self.state.current) if self.state.current else None

    def newest_first(self) -> list[Manifest]:
        return sorted(self.releases, key=lambda m: m.order, reverse=True)

    @property
    def open_journal(self) -> Journal | None:
        """The journal of a run that did not finish (None: none, or it finished)."""
        return self.journal if self.journal is not None and not self.journal.finished else None
