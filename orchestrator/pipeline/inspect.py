"""``orch history`` and ``orch status``: read the host's records, change nothing.

Both read the state dir with one ``state_read`` request, which creates
nothing: on a host orch never deployed to, they say so and leave no trace.
``status`` also says what its exit code means: 0 when nothing is wrong
that it can see (drift is reported, not an error), 3 when the server is
not healthy (or not running) or a run was left half-done (its controller
gone, or nothing finishing it); a run in progress is reported as such
(``core.progress``) and exits by health now; with ``--probe``,
1 when the server, probed now, fails the current release's gate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.cmdline import flag_change_from_line
from orchestrator.core.gate import GateOutcome
from orchestrator.core.nightly import record_source, record_tokens_per_s
from orchestrator.core.outcomes import status_exit_code
from orchestrator.core.predates import (
    commit_time,
    predates_note,
    server_predates,
    server_whereabouts,
)
from orchestrator.core.progress import HostView, view_of_state
from orchestrator.core.releases import describe_release, release_order
from orchestrator.core.secrets import redact_argv
from orchestrator.core.target import HostTarget
from orchestrator.host.records import (
    HostRecords,
    Journal,
    Lock,
    Manifest,
    RecordedOutcome,
    ServerProcess,
    StatePaths,
)
from orchestrator.host.restore_plan import RestoreSpec
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
    drift_kept: list[str] = field(default_factory=list)  # files whose drift copy this release still keeps
    build_pruned: bool = False  # a night whose build is no longer in its builds_dir (keep_builds removed it)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def history_rows(state: HostRecords, pruned_builds: frozenset[str] = frozenset()) -> list[HistoryRow]:
    """One row per release; ``pruned_builds``: the nights whose build is gone (``nights_without_build``)."""
    applied = state.applied
    rows = []
    for m in sorted(state.releases, key=release_order):  # the host's order, not the time stamps
        kept = m.drift_kept_paths
        outcome = describe_release(m, applied)
        if kept:  # the only copy of what a person wrote: this release is not pruned while it holds it
            outcome += f"; drift kept: {', '.join(kept)}"
        if m.id in pruned_builds:  # never "good" alone: `orch rollback` cannot switch back to it
            outcome += "; build pruned"
        rows.append(
            HistoryRow(
                id=m.id,
                when=m.created,
                kind=m.kind,
                playbook=m.playbook_name or "?",
                files=[f.path for f in m.files],
                flag_changes=list(m.flag_changes),
                outcome=outcome,
                duration=m.duration,
                current=bool(applied and m.id == applied[-1]),
                error=m.error,
                source=record_source(m),
                tokens_per_s=record_tokens_per_s(m),
                drift_kept=kept,
                build_pruned=m.id in pruned_builds,
            )
        )
    return rows


def read_state(target: HostTarget, options: ConnectOptions) -> HostRecords:
    """The host's records (``state_read``: reads only, never creates the state dir)."""
    with HostSession(target, options) as session:
        return records_of(session, target, options)


def records_of(session: HostSession, target: HostTarget, options: ConnectOptions) -> HostRecords:
    """``read_state`` on an open session; the records' secrets declared to the run's masker."""
    state: HostRecords = session.run(ops.state_read(target.state_dir))
    options.masker.declare_recorded(m.to_wire() for m in state.releases)
    return state


def nights_without_build(session: HostSession, state: HostRecords) -> frozenset[str]:
    """The confirmed nights (current, good, undone) whose build is no longer in their
    ``builds_dir``: ``keep_builds`` pruned it, and ``orch rollback`` cannot switch back to it.
    One read-only listing per builds_dir, none without such nights. A night that failed or
    was switched back is left out: its build never served, and always goes."""
    nights = [m for m in state.releases if m.kind == "night" and m.outcome == RecordedOutcome.DEPLOYED
              and m.builds_dir and m.link and m.link.get("after")]
    gone: set[str] = set()
    for builds_dir in sorted({str(m.builds_dir) for m in nights}):
        listed = set(session.run(ops.nightly_builds(builds_dir)).builds)
        gone |= {m.id for m in nights if m.builds_dir == builds_dir and m.link and m.link["after"] not in listed}
    return frozenset(gone)


@dataclass
class HostHistory:
    """One host's history, and whether orch ever kept a state dir there."""

    host: str
    state_dir: str
    exists: bool
    rows: list[HistoryRow]
    pruned: int | None = None  # releases keep_releases removed (None: unknown, an older state dir)
    keep_releases: int | None = None  # the keep_releases of the last prune

    @property
    def pruned_line(self) -> str | None:
        """"N older records pruned (keep_releases K)" after the list; None when none were
        (or how many is unknown), so nothing is printed."""
        if not self.pruned:
            return None
        keep = f" (keep_releases {self.keep_releases})" if self.keep_releases is not None else ""
        return f"{self.pruned} older record{'s' if self.pruned != 1 else ''} pruned{keep}"

    @property
    def empty_reason(self) -> str:
        """What an empty history means, in a sentence."""
        if not self.exists:
            return f"no releases: orch has never deployed to {self.host} (no {self.state_dir})"
        return f"no releases recorded in {self.state_dir} on {self.host}"


def host_history(target: HostTarget, options: ConnectOptions) -> HostHistory:
    with HostSession(target, options) as session:
        state = records_of(session, target, options)
        without_build = nights_without_build(session, state)
    pruned = state.pruned or {}  # pruned.json; absent: an older state dir, how many were pruned unknown
    count, keep = pruned.get("count"), pruned.get("keep_releases")
    return HostHistory(target.name, state.root or target.state_dir, state.exists, history_rows(state, without_build),
                       count if type(count) is int else None, keep if type(keep) is int else None)


@dataclass
class HostStatus:
    host: str
    current: str | None
    playbook: str | None
    server: ServerProcess | None
    health: str
    healthy: bool | None
    drift: list[str] = field(default_factory=list)
    journal: Journal | None = None
    lock: Lock | None = None
    server_expected: bool = False  # a release recorded a process server to look for
    state_dir_exists: bool = True
    gate: GateOutcome | None = None  # --probe: the server now against the release's recorded probe
    gate_note: str | None = None  # --probe: why there is no gate outcome
    view: HostView | None = None  # in progress / controller gone / unfinished (``core.progress``)
    flag_changes: list[dict[str, Any]] = field(default_factory=list)  # the current release's, as fields
    steps: list[dict[str, Any]] = field(default_factory=list)  # the current release's, as fields
    # the server started before the current release's commit (None: no files, or cannot be told)
    server_predates_release: bool | None = None
    predates_text: str | None = None  # the line that says so

    @property
    def regressed(self) -> bool:
        """``--probe``: the server, probed now, fails a rule of the current release's gate."""
        return self.gate is not None and self.gate.verdict == "fail"

    @property
    def problems(self) -> list[str]:
        """What makes this status exit 3, in words (empty: exit 0)."""
        found = []
        # a run in progress is no problem by itself: health now decides the exit code
        problem = self.view.problem() if self.view is not None else None
        if problem:
            found.append(problem)
        if self.healthy is False:
            found.append("server not healthy")
        elif self.server is None and self.server_expected:
            found.append("server not running")
        return found

    @property
    def exit_code(self) -> int:
        return status_exit_code(self.problems, self.regressed)

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["gate"] = self.gate.to_json() if self.gate else None
        data.pop("view", None)
        data["in_progress"] = self.view.to_json() if self.view is not None else None
        data["state_words"] = self.view.words() if self.view is not None and self.view.busy else None
        data["journal"] = self.journal.to_wire() if self.journal else None
        data["lock"] = self.lock.to_wire() if self.lock else None
        if self.server:
            data["server"] = {k: v for k, v in self.server.to_wire().items() if k != "env"}
            data["server"]["argv"] = redact_argv(self.server.argv or [])
        data["problems"] = self.problems
        data["exit_code"] = self.exit_code
        return data


def health_as_sent(session: HostSession, root: str, manifest: Manifest) -> dict[str, Any]:
    """A release's health checks with their headers as the deploy sent them.

    The manifest is a record for people: its headers are masked. Where a check
    has headers, the release's ``restore.json`` (0600, unmasked because a
    restore sends them) has the same checks in the same order; without one, the
    masked record is all there is.
    """
    health = dict(manifest.health or {})
    checks = manifest.health_checks
    if not any(c.get("headers") for c in checks):
        return health
    spec = session.run(ops.get_json(StatePaths(root).restore(manifest.id)))
    session.options.masker.learn(spec)  # the real values: masked wherever they show from now on
    sent = RestoreSpec.from_wire(spec).plan.health_checks if spec else []
    if len(sent) == len(checks):
        for check, real in zip(checks, sent, strict=True):
            if (real.get("method"), real.get("path")) == (check.get("method"), check.get("path")):
                check["headers"] = real.get("headers") or {}
    health["checks"] = checks
    return health


def host_status(target: HostTarget, options: ConnectOptions, *, probe: bool = False,
                reporter: Any = None) -> HostStatus:
    """Current release, server process, health now, and drift since the release.

    ``probe``: also probe the server now with the current release's gate
    probes, and judge it against that release's recorded figures and rules
    (``reporter``, if given, shows the probe's progress).
    """
    with HostSession(target, options) as session:
        state: HostRecords = session.run(ops.state_read(target.state_dir))
        options.masker.declare_recorded(m.to_wire() for m in state.releases)
        current = state.current
        # the newest release that knew the server says where to look for it
        spec = next((m for m in state.newest_first() if m.server_spec), None)
        health_from = next((m for m in state.newest_first() if m.health), None)
        health_spec = health_as_sent(session, state.root, health_from) if health_from else None
        server: ServerProcess | None = None
        process_server = spec.process_server if spec else None
        if process_server is not None:
            server = ServerProcess.from_wire(session.run(ops.server_find(process_server.pidfile, process_server.port)))
        health, healthy = "unknown (no health checks recorded)", None
        if health_spec:
            try:
                got = session.run(ops.health_wait(dict(health_spec, timeout=0.0, interval=0.0)))
                health, healthy = f"healthy ({got['last']})", True
            except RemoteStepError as e:
                reason = e.message.removeprefix("not healthy: ")  # said once, not "not healthy: not healthy"
                health, healthy = f"NOT healthy: {reason}", False
        drift: list[str] = []
        if current:
            shas = session.run(ops.sha256([f.path for f in current.files]))
            drift = [f.path for f in current.files if shas.get(f.path) != f.sha256_after]
        drift += night_drift(session, state)
        predates, predates_text = current_predates(session, state, target, server)
        gate: GateOutcome | None = None
        gate_note = None
        if probe:
            if current is None:
                gate_note = "not probed: no current release to compare with"
            elif healthy is False:
                gate_note = "not probed: the server is not healthy"
            else:
                release_dir = state.paths.release(current.id)
                events = (lambda ev: reporter.progress(target.name, ev)) if reporter is not None else None
                found = probe_now(session, release_dir, current, events)
                gate, gate_note = (found, None) if isinstance(found, GateOutcome) else (None, found)
        return HostStatus(
            host=target.name,
            current=current.id if current else None,
            playbook=current.playbook_name if current else None,
            server=server,
            health=health,
            healthy=healthy,
            drift=drift,
            journal=state.open_journal,
            lock=state.lock,
            server_expected=process_server is not None,
            state_dir_exists=state.exists,
            gate=gate,
            gate_note=gate_note,
            view=view_of_state(target.name, state),
            flag_changes=release_flag_changes(current) if current else [],
            steps=release_steps(current) if current else [],
            server_predates_release=predates,
            predates_text=predates_text,
        )


def current_predates(session: HostSession, state: HostRecords, target: HostTarget,
                     server: ServerProcess | None) -> tuple[bool | None, str | None]:
    """Whether the server running now started before the current release's commit, and the
    note that says so (``core.predates``). A release that changed no file: None. The server
    is the one found above; where no release knew it, looked for as a files-only deploy does
    (one more read-only round trip). Unreadable: None, the status stands."""
    current = state.current
    if current is None or not current.files:
        return None, None
    if server is None and not next((m for m in state.newest_first() if m.process_server), None):
        pidfile, port = server_whereabouts(state, target)
        try:
            server = ServerProcess.from_wire(session.run(ops.server_find(pidfile, port)))
        except RemoteStepError:
            return None, None
    predates = server_predates(server, commit_time(release_steps(current)))
    return predates, predates_note(server) if predates and server is not None else None


def release_flag_changes(manifest: Manifest) -> list[dict[str, Any]]:
    """A release's flag changes as ``--json``'s fields, read back from the lines it recorded."""
    return [flag_change_from_line(str(line)) for line in manifest.flag_changes]


def release_steps(manifest: Manifest) -> list[dict[str, Any]]:
    """A release's steps as ``--json``'s fields: as recorded (``steps``), or from the ``timings``
    of a release recorded before steps were (when each began unknown: ``at`` null)."""
    steps = manifest.extra.get("steps")
    if isinstance(steps, list):
        return [dict(s) for s in steps if isinstance(s, dict)]
    timings = manifest.timings or {}
    return [{"step": name, "at": None, "seconds": seconds} for name, seconds in timings.items()]


# ------------------------------------------------------------ one release in full


@dataclass
class FileBackups:
    """One file of a release: its record, and the text of its before and after copies."""

    path: str
    sha256_before: str | None
    sha256_after: str | None
    before: str | None
    after: str | None


@dataclass
class ReleaseView:
    """``orch history --release R`` on one host: the release's record and its files' copies.

    ``manifest`` is the host's record (``host.records.Manifest``).
    """

    host: str
    release: str
    manifest: Manifest
    files: list[FileBackups]
    current: bool
    outcome: str  # in history's words (describe_release)

    def to_json(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "id": self.release, "kind": m.kind, "current": self.current, "playbook": m.playbook_name,
            "outcome": self.outcome, "error": m.error, "created": m.created, "restored_by": m.restored_by,
            "files": [{"path": f.path, "sha256_before": f.sha256_before, "sha256_after": f.sha256_after}
                      for f in self.files],
            "argv_before": redact_argv((m.server_before.argv if m.server_before else None) or []),
            "argv_after": redact_argv((m.server_after.argv if m.server_after else None) or []),
            "flag_changes": list(m.flag_changes),
            "timings": m.timings, "gate": m.gate,
        }


@dataclass(frozen=True)
class NoRelease:
    """This host has no release that ``ref`` names (another host of the selection may)."""

    host: str
    ref: str


def host_release(target: HostTarget, options: ConnectOptions, ref: str) -> ReleaseView | NoRelease:
    """The release ``ref`` names on this host (full id, unique prefix or suffix), or ``NoRelease``.

    Three round trips: the state read, the release's restore plan (what to mask),
    then its backup copies.
    """
    from orchestrator.core.releases import resolve_release
    from orchestrator.errors import ConfigError

    with HostSession(target, options) as session:
        state: HostRecords = session.run(ops.state_read(target.state_dir))
        releases = state.by_id
        applied = state.applied
        try:
            rid = resolve_release(ref, applied, releases)
        except ConfigError:
            return NoRelease(target.name, ref)
        manifest = releases[rid]
        options.masker.declare_recorded([manifest.to_wire()])
        spec = session.run(ops.get_json(state.paths.restore(rid)))
        options.masker.learn(spec)  # its env, argv, headers and secret values: masked in what follows
        entries = manifest.files
        paths = [state.paths.copy(rid, f.n if f.n is not None else "None", side)
                 for f in entries for side in ("before", "after")]
        infos = session.run(ops.read(paths)) if paths else []
    texts = [_text_of(info) for info in infos]
    files = [FileBackups(f.path, f.sha256_before, f.sha256_after, texts[2 * i], texts[2 * i + 1])
             for i, f in enumerate(entries)]
    return ReleaseView(target.name, rid, manifest, files, bool(applied) and applied[-1] == rid,
                       describe_release(manifest, applied))


def _text_of(info: Any) -> str | None:
    from orchestrator.shell.agent_client import wire_bytes

    if not isinstance(info, dict) or not info.get("exists"):
        return None
    return wire_bytes(info.get("data")).decode("utf-8", "replace")
