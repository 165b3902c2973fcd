"""``orch nightly``: rebuild one server from a pinned spec, switch once, probe, prove it.

One night on one host, as steps:

1. **lock and journal** as a deploy does (``open_state``, ``refuse_busy``);
   read the last good night's manifest (nothing written); refuse over drift
   in the current build (unless ``--force``) and, with ``--frozen``, over any
   input that differs from the last good night;
2. **build** into a fresh ``builds_dir/<UTC stamp>-<short id>/`` while the old
   night keeps serving: the pinned source (git: a mirror cache on the host,
   then exactly the commit, ``HEAD`` read back; pip: a fresh venv and
   ``pip install --require-hashes``), then the ``install`` commands; their
   output streams to the terminal and into ``builds_dir/logs/<build>.log``;
3. **patch** the build with the stack, in order, with deploy's own planning,
   staged validation and structural check (``make_plan``,
   ``stage_and_validate``); each playbook is committed into the build (which
   nothing runs from) before the next one is planned, so it sees its result;
4. **arm**: the night's ``restore.json`` — ``builds_dir/current`` back to the
   previous build, the previous command line started again and health-checked
   — and its program (every step after the switch, the confirm with all the
   records it writes) are written whole, and the guard forked on the host,
   before anything live is touched (the restore machine of
   ``host/restore.py`` and the runner of ``host/runner.py``, as for a deploy);
5. **switch**, one round trip: the journal, then the host's runner takes the
   night: it marks ``server.touched``, stops the old server, points
   ``current`` at the new build (compare-and-swap on the link), starts the
   server once from ``current/``, health and stability with crash detection;
   **probe**; then **confirm** (the night is pushed on the host's ``applied``
   stack, so ``orch rollback`` switches it back). The controller follows its
   events and prints them; a dead controller changes nothing, and the next
   controller that learns the verdict writes the night's report
   (``pipeline/nightly_late.py``);
6. any failure before the switch: nothing running was touched, the build is
   removed (its log kept), exit 2. After it: the runner switches back through
   the night's ``restore.json`` (never a second restore from the controller),
   and ``core.outcomes.verdict`` turns the cause, the step reached and the
   restore's record into the outcome (exit 1, or 3 when the host is not known
   to be healthy).

The manifest (``core.nightly.NightManifest``) goes into the build and into
the controller's report; the host's record of the night (``kind: night``)
is what ``orch history``, ``orch status`` and ``orch rollback`` read.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from orchestrator import __version__
from orchestrator.core import endings, events
from orchestrator.core.budget import BudgetItem, deploy_budget, probe_seconds, restore_budget, total
from orchestrator.core.cmdline import flag_change_fields, flag_changes, render_words
from orchestrator.core.endings import Ending
from orchestrator.core.models import Playbook
from orchestrator.core.nightly import (
    Change,
    FileRecord,
    NightManifest,
    PackageRecord,
    ServerRecord,
    SourceRecord,
    StackRecord,
    build_relative,
    builds_to_prune,
    canonical_name,
    input_changes,
    relative_to_build,
    source_changes,
)
from orchestrator.core.outcomes import (
    CHANGED,
    STOPPED_FOLLOWING,
    Outcome,
    Step,
    Verdict,
    verdict,
)
from orchestrator.core.probe import ProbeResult
from orchestrator.core.releases import (
    LinkState,
    PrunePlan,
    drift_kept,
    new_release_id,
    ordered_ids,
    prune_plan,
)
from orchestrator.core.rendering import (
    RenderedHealth,
    RenderedPlaybook,
    RenderedServer,
    merge_vars,
    render_playbook,
)
from orchestrator.core.restore import (
    RestorePlan,
    RestoreRecord,
    ServerStart,
    ServerTarget,
    restore_spec,
)
from orchestrator.core.secrets import (
    redact_argv,
    redact_env,
    redact_text,
    secret_names,
    secret_values,
)
from orchestrator.core.target import HostTarget
from orchestrator.core.templating import Renderer
from orchestrator.errors import (
    AnchorError,
    ConfigError,
    LinkLostError,
    OrchError,
    RefusedError,
    RemoteError,
    interruption,
    signal_name,
)
from orchestrator.host.program import StepName
from orchestrator.host.protocol_events import StepEvent, TickEvent, event_from_wire
from orchestrator.host.protocol_verdict import (
    AnswersEvent,
    RestoringEvent,
    StepFailure,
    runner_event_of,
)
from orchestrator.host.records import (
    AppliedState,
    HostRecords,
    Journal,
    JournalStep,
    RecordedOutcome,
    ServerProcess,
    StatePaths,
)
from orchestrator.host.restore_plan import RestoreSpec
from orchestrator.pipeline.events import Reporter, RunLog
from orchestrator.pipeline.failure import Ended, FailedRelease
from orchestrator.pipeline.follow import RunnerFollow, StoppedFollowing
from orchestrator.pipeline.locking import (
    current_release_dir,
    open_state,
    refuse_busy,
    release_lock,
)
from orchestrator.pipeline.plan import (
    health_port,
    make_plan,
    server_log,
    server_pidfile,
    stage_and_validate,
)
from orchestrator.pipeline.probe import probe_ops, read_probe
from orchestrator.pipeline.release import Handover, RestoreCut, restore_here
from orchestrator.pipeline.report import HostReport
from orchestrator.pipeline.session import ConnectOptions, HostSession, lock_holder
from orchestrator.pipeline.timings import StepClock
from orchestrator.shell import ops
from orchestrator.shell.agent_client import RemoteStepError, wire_bytes
from orchestrator.shell.config_files import (
    LoadedPlaybook,
    display_path,
    template_dirs_for,
    template_lookup,
)
from orchestrator.shell.nightly_files import LoadedNightly
from orchestrator.shell.program import (
    ReleaseProgram,
    RunVerdict,
    read_steps,
    release_stamp,
)
from orchestrator.shell.replies import Malformed

if TYPE_CHECKING:  # it imports this module (``NightResult``)
    from orchestrator.pipeline.nightly_late import LateNight

@dataclass(frozen=True)
class NightOptions:
    frozen: bool = False
    force: bool = False


@dataclass
class NightResult:
    """What the controller keeps of one night: for the report, the notification, the exit code."""

    host: str
    name: str
    outcome: str
    exit_code: int
    started: float
    finished: float = 0.0
    error: str | None = None  # the words of ``ending`` where there is one (``ConnectOptions.words``)
    manifest: NightManifest | None = None
    last_good: NightManifest | None = None
    build_log: str = ""
    restore: events.RestoreAccount | None = None  # what the switch back did: the host's record
    notes: list[str] = field(default_factory=list)
    seq: int | None = None  # the host's sequence number of the night's release, once it was made
    steps: list[dict[str, Any]] = field(default_factory=list)  # ``StepClock.steps``: what ``--json`` shows
    events: list[dict[str, Any]] = field(default_factory=list)  # what was said, as fields (``core.events``)
    late: LateNight | None = None  # an earlier night owed its report, which this run writes
    ending: Ending | None = None  # how it ended, as fields (``core.endings``)

    @property
    def probe(self) -> ProbeResult | None:
        data = self.manifest.probe if self.manifest else None
        return ProbeResult.from_json(data) if data else None

    def host_report(self) -> HostReport:
        extra: dict[str, Any] = {"build": self.name}
        if self.manifest is not None and self.manifest.probe:
            extra["probe"] = self.manifest.probe.get("summary")
        if self.manifest is not None:
            extra["source"] = self.manifest.source.label
        if self.restore is not None:
            extra["restore"] = self.restore
        extra["flag_changes"] = self.flag_changes()
        extra["steps"] = list(self.steps)
        extra["events"] = list(self.events)
        return HostReport(self.host, self.outcome, self.exit_code, release=self.name,  # type: ignore[arg-type]
                          files=[f.path for f in self.manifest.files] if self.manifest else [],
                          error=self.error, notes=list(self.notes), extra=extra, ending=self.ending)


    def flag_changes(self) -> list[dict[str, Any]]:
        """The flags this night changed against the last good night's command line (both as
        recorded, masked), as ``--json``'s fields; none known without both."""
        if self.manifest is None or self.last_good is None:
            return []
        return flag_change_fields(self.last_good.server.argv, self.manifest.server.argv)


def night_name(loaded: LoadedNightly, now: datetime) -> str:
    """``<UTC stamp>-<short id>``: the short commit, or a short digest of the requirements.

    ``now`` is the host's time; the stamp is for people, the host's ``seq`` orders nights."""
    source = loaded.model.source
    short = source.git.commit[:7] if source.git else (loaded.requirements.sha256[:7] if loaded.requirements else "pip")
    return new_release_id(now, short)


def health_wire(health: RenderedHealth, *, for_restore: bool) -> dict[str, Any]:
    """``health_wait``'s arguments; a restore checks the previous server without the
    new night's expectations (it need not know the new flag)."""
    checks = []
    for c in health.checks:
        check: dict[str, Any] = {"method": c.method, "path": c.path, "json": c.json, "status": c.status,
                                 "headers": dict(c.headers)}
        if not for_restore:
            check["expect"] = dict(c.expect)
            check["body"] = c.body
        checks.append(check)
    return {"base_url": health.base_url, "checks": checks, "timeout": health.timeout,
            "interval": health.interval, "stable_for": health.stable_for}


def _anchor_named(error: ConfigError, loaded: LoadedPlaybook) -> ConfigError:
    """An anchor error with the anchor's own text added, so the message names it."""
    found = re.fullmatch(r"files\[(\d+)\]\.edits\[(\d+)\]\.(\w+)", error.key or "")
    if not found or not isinstance(error, AnchorError):
        return error
    try:
        edit = loaded.model.files[int(found.group(1))].edits[int(found.group(2))]
        text = getattr(edit, found.group(3))
    except (IndexError, AttributeError):
        return error
    if not isinstance(text, str) or text in error.message:
        return error
    return type(error)(f"{error.message} (anchor: {text!r})", file=error.file, line=error.line, key=error.key)


@dataclass
class Night:
    """One night on one connected host; ``run`` returns its ``NightResult``."""

    session: HostSession
    loaded: LoadedNightly
    cli_vars: dict[str, Any]
    reporter: RunLog
    options: NightOptions
    name: str
    started: float
    break_lock: bool = False
    clock: StepClock | None = None  # times the night's steps (``pipeline.timings``)
    reached: Step = Step.PLANNING
    state_dir: str = ""
    state: HostRecords = field(default_factory=lambda: HostRecords(""))
    builds_dir: str = ""
    build_dir: str = ""
    log_path: str = ""
    repo: str = ""
    variables: dict[str, Any] = field(default_factory=dict)
    stack_vars: dict[str, Any] = field(default_factory=dict)
    secret_list: list[str] = field(default_factory=list)
    rendered: RenderedPlaybook | None = None
    last_good: NightManifest | None = None
    manifest: NightManifest | None = None
    deadline: float = 0.0  # the backstop's deadline unless confirmed: the host's wall time (host clock)
    seq: int | None = None  # the host's sequence number of this night's release
    build_seqs: dict[str, int] = field(default_factory=dict)  # the builds already there, by their ``seq``
    running: ServerProcess | None = None  # the server found just before arming
    last_started: ServerProcess | None = None  # the command line the current release started
    # filled by build() and patch(), read by make_manifest()
    prepared: bool = False
    arm_sent: bool = False  # the guard was asked for: it may be armed even if no answer came
    program: ReleaseProgram | None = None  # every step after the arm, kept in the release with it
    healthy: ops.Op | None = None  # the program's health wait, whose answer the night reads
    probe_rounds: list[ops.Op] = field(default_factory=list)  # the program's probe, one op per round
    pruning: PrunePlan | None = None  # what the confirm prunes of the releases (decided at arm)
    prune: ops.Op | None = None  # the confirm's pruning of the builds (decided at arm)
    stamp: ops.Op | None = None  # the confirm's record of what only the host knows at the end
    claim: ops.Op | None = None  # the confirm itself: the claim and its records
    probed: ProbeResult | None = None  # the probe step's answers, read as the runner's events come
    failure_shown: bool = False  # the runner's "restoring" said why the night failed, as it happened
    late: LateNight | None = None  # the night before, ended without its controller: reported here
    previous_build: str | None = None
    existing_builds: list[str] = field(default_factory=list)
    complete_builds: list[str] | None = None  # of those, the ones a night confirmed (None: unknown)
    resolved_source: SourceRecord | None = None
    install_argvs: list[list[str]] = field(default_factory=list)
    stack_records: list[StackRecord] = field(default_factory=list)
    file_records: list[FileRecord] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.session.target.name

    @property
    def target(self) -> HostTarget:
        return self.session.target

    @property
    def spec(self) -> Any:
        return self.loaded.model

    @property
    def release_dir(self) -> str:
        return StatePaths(self.state_dir).release(self.name)

    @property
    def link(self) -> str:
        return f"{self.builds_dir}/current"

    @property
    def server(self) -> RenderedServer:
        assert self.rendered is not None and self.rendered.server is not None
        return self.rendered.server

    @property
    def health(self) -> RenderedHealth:
        assert self.rendered is not None and self.rendered.health is not None
        return self.rendered.health

    @property
    def pidfile(self) -> str:
        assert self.rendered is not None
        return server_pidfile(self.target, self.rendered)

    @property
    def server_log(self) -> str:
        assert self.rendered is not None
        return server_log(self.target, self.rendered)

    @property
    def port(self) -> int | None:
        return health_port(self.health.base_url)

    def _redact(self, text: str) -> str:
        return redact_text(text, self.secret_list)

    def _events(self) -> Any:
        return lambda ev: self.reporter.progress(self.label, ev)

    def result(self, outcome: str, code: int, error: str | None = None, ending: Ending | None = None) -> NightResult:
        """The night's result; ``ending``: how it ended, its words the error (``ConnectOptions.words``)."""
        if ending is not None:
            error = self.session.options.words(ending)
        return NightResult(self.label, self.name, outcome, code, self.started, self.session.host_time(),
                           error=self._redact(error) if error else None, manifest=self.manifest,
                           last_good=self.last_good, seq=self.seq, ending=ending)

    # -------------------------------------------------------------- rendering

    def renderer(self) -> Renderer:
        dirs = template_dirs_for(self.loaded.path)
        return Renderer(template_lookup(dirs), searched=[display_path(d) for d in dirs])

    def render_value(self, value: Any, loc: tuple[Any, ...], variables: dict[str, Any]) -> Any:
        where = self.spec.locations.where(loc)
        if isinstance(value, str):
            return self.renderer().render_string(value, variables, **where,
                                                 source_line=self.spec.locations.content_line(loc))
        if isinstance(value, list):
            return [self.render_value(v, (*loc, i), variables) for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {k: self.render_value(v, (*loc, k), variables) for k, v in value.items()}
        return value

    def resolve_vars(self) -> None:
        """``builds_dir``, ``build`` and the spec's vars, rendered for this host; then the server."""
        spec = self.spec
        builtins = {"python": spec.server.python or "python3"}
        base = merge_vars({}, self.target.vars, self.cli_vars, builtins)
        builds_dir = str(self.render_value(spec.builds_dir, ("builds_dir",), base)).rstrip("/")
        if builds_dir.startswith("~") and self.session.agent is not None:
            builds_dir = str(self.session.agent.info.get("home", "~")) + builds_dir[1:]
        if not builds_dir.startswith("/"):
            raise ConfigError(f"renders to {builds_dir!r}, not an absolute path",
                              **spec.locations.where(("builds_dir",)))
        self.builds_dir = builds_dir
        self.build_dir = f"{builds_dir}/{self.name}"
        self.log_path = f"{builds_dir}/logs/{self.name}.log"
        own = {"build": self.build_dir, "builds_dir": builds_dir}
        spec_vars = {k: self.render_value(v, ("vars", k), {**base, **own}) for k, v in spec.vars.items()}
        self.stack_vars = {**spec_vars, **own, **self.cli_vars}
        self.variables = merge_vars({}, self.target.vars, self.stack_vars, builtins)
        if spec.source.git is not None:
            self.repo = str(self.render_value(spec.source.git.repo, ("source", "git", "repo"), self.variables))
        names = secret_names(self.variables, spec.secrets)
        self.secret_list = [str(v) for v in secret_values(self.variables, names)]
        self.reporter.masker.hide(self.secret_list)  # the console and run.log mask them too
        self.reporter.masker.declare(spec.secrets)
        pb = Playbook(name=spec.name, secrets=spec.secrets, server=spec.server, health=spec.health)
        self.rendered = render_playbook(pb, spec.locations, self.variables, self.renderer())

    # --------------------------------------------------------------- the steps

    def run(self) -> NightResult:
        clock = self.clock = self.clock or StepClock(self.label, self.reporter)
        with clock.step("lock"):
            self.state_dir, self.state = open_state(self.session, f"nightly {self.loaded.display}",
                                                    self.break_lock, self.reporter)
        try:
            refuse_busy(self.label, self.state)
            with clock.step("plan"):
                self.resolve_vars()
                self.read_host()
            try:
                with clock.step("build"):
                    self.build()
                with clock.step("patch"):
                    self.patch()
                with clock.step("backup"):
                    previous = self.previous_server()
                    self.arm(previous)
            except (OrchError, KeyboardInterrupt) as cause:
                with clock.step("rollback"):
                    return self.abandon(cause)
            try:
                return self.switch_and_follow()
            except (OrchError, KeyboardInterrupt) as cause:
                with clock.step("rollback"):
                    return self.fail(cause)
        finally:
            release_lock(self.session, self.state_dir)

    def read_host(self) -> None:
        """The last good night, drift and ``--frozen``: read only, nothing written."""
        from orchestrator.pipeline import nightly_late

        last = ops.get_json(f"{self.link}/manifest.json")
        night = nightly_late.unreported_night(self.state)
        if night is None:
            data = self.session.run(last)
        else:
            runner, reported = nightly_late.unreported_reads(self.state, night)
            got = self.session.batch([last, runner, reported])  # one round trip, as the read of `last` alone
            data = got[last]
            if nightly_late.owed(got[runner], got[reported]):
                # the night before ended without its controller (after its switch): its report is ours to write
                self.late = nightly_late.follow_unreported(self.session, self.state, night, "nightly")
        if data:
            self.last_good = NightManifest.model_validate(data)
        if self.last_good and self.last_good.files:
            paths = [f"{self.link}/{f.path}" for f in self.last_good.files]
            shas = self.session.run(ops.sha256(paths))
            drift = [f.path for f, p in zip(self.last_good.files, paths, strict=True)
                     if shas.get(p) != f.sha256_after]
            if drift and not self.options.force:
                raise RefusedError(
                    f"{self.label}: files of the current build changed on the host since night "
                    f"{self.last_good.build}: {', '.join(drift)}; a new night would drop those edits. "
                    "Look at them (`orch status`), then pass --force to build anyway"
                )
            for path in drift:
                self.reporter.event(self.label, events.BuildDrift(path))
        if self.options.frozen:
            self.refuse_unless_frozen()

    def refuse_unless_frozen(self) -> None:
        """Inputs, source and the server's command line as the last good night had them, or refuse."""
        if self.last_good is None:
            raise RefusedError(f"{self.label}: --frozen: no last good night on this host to compare with")
        changes = input_changes(self.last_good.inputs, self.loaded.inputs)
        changes += source_changes(self.last_good.source, self.source_record())
        argv = redact_argv(relative_to_build(self.server.desired_argv() or [], self.build_dir), self.secret_list)
        changes += [Change("server", f"flag {c}") for c in flag_changes(self.last_good.server.argv, argv)]
        if changes:
            raise RefusedError(f"{self.label}: --frozen: inputs differ from night {self.last_good.build}: "
                               + "; ".join(c.text for c in changes))

    def source_record(self, packages: list[PackageRecord] | None = None) -> SourceRecord:
        source = self.spec.source
        if source.git is not None:
            return SourceRecord(kind="git", repo=self.repo or source.git.repo, commit=source.git.commit)
        pins = self.loaded.requirements.pins if self.loaded.requirements else ()
        return SourceRecord(kind="pip", packages=packages or [
            PackageRecord(name=p.name, version=p.version, hashes=list(p.hashes)) for p in pins])

    # ------------------------------------------------ build and patch: nothing live

    def build(self) -> None:
        prepare = ops.nightly_prepare(self.builds_dir, self.name)
        create = ops.release_create(self.state_dir, self.name, self.record(), [])
        got = self.session.batch([prepare, create, self.journal(JournalStep.BUILDING)])
        prepared, created = got[prepare], got[create]
        self.prepared = True
        self.seq = created
        self.previous_build = prepared.current
        self.existing_builds = list(prepared.builds)
        self.complete_builds = None if prepared.complete is None else list(prepared.complete)
        self.build_seqs = dict(prepared.seqs)
        self.reporter.event(self.label, events.Building(self.build_dir, self.log_path))
        source = self.spec.source
        if source.git is not None:
            self.session.run(ops.nightly_fetch_git(self.repo, source.git.commit, self.builds_dir, self.name,
                                                   self.log_path), on_event=self._events())
            self.resolved_source = self.source_record()
            self.reporter.event(self.label, events.CheckedOut(source.git.commit))
        else:
            self.install_pinned()
        self.install_argvs = []
        steps = []
        for i, command in enumerate(self.spec.install):
            argv = render_words(command, self.variables, self.renderer(),
                                **self.spec.locations.where(("install", i)))
            self.install_argvs.append(argv)
            steps.append(ops.nightly_run(argv, self.build_dir, self.log_path))
        if steps:
            self.reporter.event(self.label, events.Installing(len(steps), self.build_dir))
            self.session.batch(steps, on_event=self._events())

    def install_pinned(self) -> None:
        """A pip source: a fresh venv, ``--require-hashes``, and the versions checked against the pins."""
        pip = self.spec.source.pip
        requirements = self.loaded.requirements
        assert pip is not None and requirements is not None
        args: list[str] = ["--no-index"] if pip.no_index else []
        for i, link in enumerate(pip.find_links):
            args += ["--find-links", str(self.render_value(link, ("source", "pip", "find_links", i),
                                                           self.variables))]
        if pip.index_url:
            args += ["--index-url", str(self.render_value(pip.index_url, ("source", "pip", "index_url"),
                                                          self.variables))]
        got = self.session.run(ops.nightly_pip(self.builds_dir, self.name, requirements.text, pip.python,
                                               args, self.log_path), on_event=self._events())
        installed = {canonical_name(p["name"]): p["version"] for p in got["packages"]}
        for pin in requirements.pins:
            if installed.get(canonical_name(pin.name)) != pin.version:
                raise RemoteError(f"{pin.name}=={pin.version} is not what the venv has "
                                  f"({installed.get(canonical_name(pin.name), 'missing')})")
        self.resolved_source = self.source_record()
        self.reporter.event(self.label, events.InstalledPinned(len(requirements.pins)))

    def patch(self) -> None:
        """The stack, in order, each playbook committed into the build before the next is planned."""
        firsts: dict[str, str] = {}
        lasts: dict[str, str] = {}
        self.stack_records = []
        for i, loaded in enumerate(self.loaded.stack):
            entry = self.loaded.stack_names[i]
            files_only = replace(loaded, model=loaded.model.model_copy(update={"server": None, "health": None}))
            try:
                plan = make_plan(self.session, files_only, self.stack_vars)
            except AnchorError as e:
                raise _anchor_named(e, loaded) from None
            records = []
            for f in plan.files:
                rel = build_relative(f.path, self.build_dir)
                if rel is None:
                    raise ConfigError(f"{f.path} is outside the new build {self.build_dir}: a night patches "
                                      "only its own build", file=loaded.display, key=f"files[{f.index}].path")
                before = f.remote.sha256 or ""
                after = f.new_sha256 if f.changed else before
                firsts.setdefault(rel, before)
                lasts[rel] = after
                records.append(FileRecord(path=rel, sha256_before=before, sha256_after=after))
            self.reporter.plan(self.label, plan)
            staged = stage_and_validate(self.session, plan, keep=True)
            if staged:
                # Into the new build, which nothing runs from: no release to mark, nothing to restore.
                wire = [{"path": s.file.path, "staged": s.staged, "before": s.file.remote.sha256,
                         "after": s.file.new_sha256} for s in staged]
                self.session.run(ops.commit(wire, None))
            self.stack_records.append(StackRecord(playbook=entry, sha256=loaded.sha256, files=records))
            changed = sum(1 for f in plan.files if f.changed)
            self.reporter.event(self.label, events.StackPatched(i, entry, changed))
        self.file_records = [FileRecord(path=p, sha256_before=firsts[p], sha256_after=lasts[p]) for p in firsts]

    def abandon(self, cause: BaseException) -> NightResult:
        """A failure before the switch: remove the half-built build, keep its log; nothing live was touched."""
        v = verdict(cause, self.reached)
        if isinstance(cause, KeyboardInterrupt):
            reason = f"{interruption(cause)} before the switch; nothing live was touched"
        else:
            reason = self._redact(str(cause))
            if isinstance(cause, RemoteStepError) and cause.log_tail:
                self.reporter.server_log(self.label, "build output (last lines)", cause.log_tail)
        self.reporter.event(self.label, events.NightFailedBeforeSwitch(reason))
        if not self.prepared:  # nothing was made on the host
            return self.result(v.outcome, v.exit_code, reason)
        result = self.result(v.outcome, v.exit_code, reason)
        result.build_log = self.read_log()
        if self.arm_sent:
            self.disarm(reason)
        with contextlib.suppress(OrchError):
            self.session.batch([
                ops.nightly_remove_build(self.builds_dir, self.name),
                ops.release_update(self.state_dir, self.name, {"outcome": Outcome.FAILED, "error": reason,
                                                                "finished": self.session.host_time()}),
                self.journal(JournalStep.FAILED, finished=True),
                self.log_op(f"failed before the switch: {reason}"),
            ])
            self.reporter.event(self.label, events.HalfBuiltRemoved(self.build_dir))
        return result

    def disarm(self, reason: str) -> None:
        """Interrupted while arming: the watchdog may be armed and the journal say ``armed``.
        Nothing live was touched; the restore machine closes the night at once (its record,
        the journal; the watchdog leaves) rather than at the watchdog's deadline."""
        with contextlib.suppress(OrchError):
            self.session.run(ops.restore_release(self.release_dir, "controller", reason=reason),
                             on_event=self._events())

    # ------------------------------------------------ arm, switch, probe, confirm

    def previous_server(self) -> ServerStart | None:
        """What runs now, read again just before the switch (a build takes a while):
        the process's own argv, cwd and environment — or, when nothing runs, the
        command line the current release started. The switch back starts it."""
        find = ops.server_find(self.pidfile, self.port)
        steps = [find]
        current = current_release_dir(self.state)
        spec = ops.get_json(f"{current}/restore.json") if current else None
        if spec is not None:
            steps.append(spec)
        got = self.session.batch(steps)
        self.running = ServerProcess.from_wire(got[find])
        recorded = RestoreSpec.from_wire(got[spec]) if spec is not None and got[spec] else None
        started = ServerProcess.from_wire(recorded.started) if recorded else None
        self.last_started = started if started and started.argv else None
        r = self.running
        if r is not None and r.argv:
            return ServerStart(list(r.argv), r.cwd, dict(r.env), True)
        s = self.last_started
        if s is not None and s.argv:
            return ServerStart(list(s.argv), s.cwd, dict(s.env), True if s.replace_env is None else s.replace_env)
        return None

    def new_start(self) -> ServerStart:
        server = self.server
        return ServerStart(server.desired_argv() or [], server.workdir, dict(server.env), False)

    def restore_plan(self, previous: ServerStart | None) -> RestorePlan:
        """What the runner, its guard, this run's own failure path, or ``orch rollback`` restores:
        ``current`` back where it pointed, the previous command line, its health."""
        running = self.running or ServerProcess()
        server = ServerTarget(
            manager="process", start=previous, pidfile=self.pidfile, log=self.server_log, port=self.port,
            stop_timeout=self.server.stop_timeout, free_timeout=self.server.free_timeout,
            before_pid=running.pid, before_starttime=running.starttime,
        )
        return RestorePlan(
            links=[LinkState(self.link, self.previous_build, self.name)], server=server,
            health=health_wire(self.health, for_restore=True) if previous is not None else None,
        )

    def arm(self, previous: ServerStart | None) -> None:
        """The night's restore plan and program, complete, and the guard — before anything live is touched."""
        new_start = self.new_start()
        self.manifest = self.make_manifest(new_start)
        spec = self.spec
        extra = [BudgetItem("probe", probe_seconds(spec.probe), "probe.timeout × batches")] if spec.probe else []
        budget = total(deploy_budget(spec.server, spec.health, extra))
        self.deadline = self.session.host_time() + budget  # until the host says when exactly
        restore = restore_spec(self.name, "night", self.restore_plan(previous), budget=budget,
                               started=new_start.to_wire())
        self.program = self.make_program(new_start)
        self.arm_sent = True
        armed = self.handover().arm(
            [ops.release_update(self.state_dir, self.name,
                                dict(self.switch_record(previous, new_start), watchdog_budget=budget)),
             ops.put_json(StatePaths(self.state_dir).restore(self.name), restore)],
            self.program, self.journal(JournalStep.ARMED))
        self.deadline = armed or self.deadline
        self.reached = Step.ARMED
        self.reporter.event(self.label, events.NightArmed(self.deadline))

    def handover(self) -> Handover:
        return Handover(self.session, self.state_dir, self.release_dir, "nightly")

    def make_program(self, new_start: ServerStart) -> ReleaseProgram:
        """Every step after the arm, as requests: stop the old server, point ``current`` at
        the new build, start it once, health and stability, the probe, the claim with its
        records. Kept in the release with the arm; the host's runner runs it (``host/runner.py``)."""
        program = ReleaseProgram(self.name, "night")
        running = self.running
        if running and running.pid:
            program.add(StepName.STOP, [ops.server_stop(running.pid, running.pgid, self.server.stop_timeout,
                                                        self.port, self.server.free_timeout)])
        program.add(StepName.SWITCH, [ops.nightly_link_swap(self.link, self.name, self.previous_build)])
        program.add(StepName.START, [ops.server_start(new_start.argv, new_start.cwd, new_start.env,
                                                      self.server_log, self.pidfile, new_start.replace_env)])
        program.prepend([StepName.STOP, StepName.SWITCH],
                        [ops.mark(StatePaths(self.state_dir).server_touched(self.name))])
        self.healthy = ops.health_wait(health_wire(self.health, for_restore=False), pid="started")
        program.add(StepName.HEALTH, [self.healthy])
        config = self.spec.probe
        if config is not None:
            body = self.render_value(config.json_, ("probe", "json"), self.variables)
            headers = {k: str(self.render_value(v, ("probe", "headers", k), self.variables))
                       for k, v in config.headers.items()}
            self.probe_rounds = probe_ops(self.health.base_url, config, body, headers)
            program.add(StepName.PROBE, self.probe_rounds,
                        expect={"answered": {"post": config.post, "concurrency": config.concurrency}})
        return self.with_confirm(program)

    def with_confirm(self, program: ReleaseProgram) -> ReleaseProgram:
        """The confirm step: the claim and every record it writes, known at arm, so that the
        host's runner confirms the night without this controller. What only the host knows
        at the end — when it finished, the steps' times, the probe's figures — its
        ``release_stamp`` fills in, into the release and the build's ``manifest.json``."""
        assert self.manifest is not None
        applied = self.state.applied + [self.name]
        releases = ordered_ids(self.state.releases) + [self.name]  # this night's seq is the newest
        self.pruning = prune_plan(releases, applied, self.target.keep_releases, drift_kept(self.state.releases))
        complete = None if self.complete_builds is None else [*self.complete_builds, self.name]
        seqs = dict(self.build_seqs, **({self.name: self.seq} if self.seq is not None else {}))
        prune_builds = builds_to_prune([*self.existing_builds, self.name], self.name, self.previous_build,
                                       self.spec.keep_builds, complete, seqs, steps=applied)
        self.prune = ops.nightly_prune(self.builds_dir, prune_builds)
        config = self.spec.probe
        probe = {"post": config.post, "concurrency": config.concurrency} if config is not None else None
        self.stamp = release_stamp(self.state_dir, self.name, self.release_dir, self.started, [], probe=probe,
                                   manifest={"path": f"{self.build_dir}/manifest.json",
                                             "record": self.manifest.model_dump()},
                                   fields={"outcome": RecordedOutcome.DEPLOYED})
        records = [
            self.stamp,
            ops.put_json(StatePaths(self.state_dir).state, AppliedState(applied).to_wire()),
            self.journal(JournalStep.CONFIRMED, finished=True),
            self.prune,
            ops.release_prune(self.state_dir, self.pruning.remove, self.target.keep_releases),
            self.log_op(f"night {self.name} is current"),
            ops.lock_release(self.state_dir),
        ]
        self.claim = ops.confirm_release(self.release_dir, records)
        program.add(StepName.CONFIRM, [self.claim])
        return program

    def switch_and_follow(self) -> NightResult:
        """The switch batch: the journal, the steps so far, the host's runner started (it
        stops the old server, points ``current`` at the new build, starts it, checks health,
        probes and confirms — or switches back — by itself), and its events followed to its
        verdict. The verdict is the host's whether or not this controller is still there."""
        assert self.program is not None and self.clock is not None
        new_start = self.new_start()
        running = self.running
        self.reporter.event(self.label, events.Switching(running.pid if running else None, self.name,
                                                         tuple(redact_argv(new_start.argv, self.secret_list))))
        self.reached = Step.RESTARTING
        follower = RunnerFollow(self.session, self.reporter, self.release_dir, "nightly", self.on_runner_event)
        got = self.handover().run(follower, [self.journal(JournalStep.SWITCHING)], self.started,
                                  self.clock.steps(self.session.host_time))
        if isinstance(got, StoppedFollowing):
            return self.stopped_following(got)
        return self.aborted(got.verdict) if got.aborted else self.ended(got.verdict)

    def on_runner_event(self, ev: dict[str, Any]) -> None:
        """One event of the runner's log as it comes: a step's answers (health, probe) shown
        once it ended, the switch back's cause as it begins, progress on the live line."""
        kind = ev.get("event")
        said = runner_event_of(ev)
        if isinstance(said, AnswersEvent):
            self.on_answers(said.step, said.answers)
            return
        if isinstance(said, RestoringEvent):
            self.show_failure(said.failed or StepFailure())
            return
        event = event_from_wire(ev)
        if isinstance(event, StepEvent):
            if event.state == StepEvent.BEGAN and event.step == StepName.CONFIRM.value:
                self.reached = Step.CONFIRMING
            return
        if kind != TickEvent.KIND:
            self.reporter.progress(self.label, ev)

    def on_answers(self, step: str, answers: Any) -> None:
        """Health's and the probe's answers, said as the night's controller always said them."""
        if step not in (StepName.HEALTH.value, StepName.PROBE.value) or self.program is None:
            return
        try:
            results = read_steps(self.program.steps, {step: answers}, [step])
        except (Malformed, ValueError):
            return  # a step this controller did not plan (a newer runner): nothing of ours to show
        if step == StepName.HEALTH.value and self.healthy is not None and self.healthy in results:
            got = results[self.healthy]
            self.reporter.event(self.label, events.Healthy(got["elapsed"], got["polls"], got.get("stable_for")))
        config = self.spec.probe
        if step == StepName.PROBE.value and config is not None and self.probe_rounds:
            result = self.probed = read_probe(config, results.each(self.probe_rounds))
            summary = result.summary()
            self.reporter.event(self.label, events.Probed(
                config.post, summary["requests_per_s"], summary.get("output_tokens_per_s"), summary["p50_ms"],
                summary["p99_ms"], summary["errors"], result.greedy_sha256))

    def show_failure(self, failed: StepFailure) -> str:
        """Why the night failed (the step the runner failed), said once, with the server's log."""
        if failed.aborted:
            reason = "interrupted (Ctrl-C)"
        else:
            reason = self._redact(failed.message or "the host's runner failed")
        if not self.failure_shown:
            self.failure_shown = True
            tail = failed.detail("log_tail")
            if isinstance(tail, list) and tail:
                self.reporter.server_log(self.label, "server log (last 40 lines)",
                                         [self._redact(str(line)) for line in tail])
            self.reporter.event(self.label, events.NightFailed(reason, switching_back=True))
        return reason

    def ended(self, v: RunVerdict, cause: BaseException | None = None) -> NightResult:
        """The runner's verdict as this night's result: current, or switched back (by the
        runner, its guard, or a person's rollback), or a switch back that failed."""
        if v.confirmed:
            return self.confirmed(v)
        record = RestoreRecord.from_wire(v.restore) if v.restore else None
        failed = self.failed_release()
        if v.verdict == RunVerdict.NOT_CONFIRMED:
            if record is None:
                return self.ended_with(failed.restoring_without_record())
            why = failed.unconfirmed_reason()
            return self.restored(RemoteError(why), why, record)
        # no step failed when the guard switched back (the runner died, or outlived the backstop): its reason
        reason = self.show_failure(v.failure())
        if record is None:
            return self.ended_with(failed.runner_could_not_restore(reason, v.event.error))
        return self.restored(cause or RemoteError(reason), reason, record, v.failed)

    def aborted(self, v: RunVerdict) -> NightResult:
        """Ctrl-C after the switch batch was sent: the runner aborted and switched back (its
        verdict was followed to the end); a runner that had confirmed already keeps the night."""
        if v.confirmed:
            self.reporter.event(self.label, events.InterruptedAfterConfirm(self.name))
            return self.confirmed(v)
        return self.ended(v, KeyboardInterrupt())

    def stopped_following(self, stop: StoppedFollowing) -> NightResult:
        """A second Ctrl-C, or SIGTERM/SIGHUP after the switch batch: one line naming the night
        and where its verdict is; exit 3. The runner goes on as it was."""
        return self.result(STOPPED_FOLLOWING.outcome, STOPPED_FOLLOWING.exit_code, ending=endings.StoppedFollowing(
            self.label, self.name, "night", stop.signame, stop.reconnecting))

    def confirmed(self, v: RunVerdict) -> NightResult:
        """The night as its runner confirmed it: current; the builds it pruned; the manifest
        with the host's finish time and probe (``release_stamp``'s record)."""
        assert self.manifest is not None and self.pruning is not None
        self.reached = Step.CONFIRMING
        if self.clock is not None:
            self.clock.adopt(v.stamped_steps())
        answer = self.claim_answer(v)
        stamp: dict[str, Any] = {}
        removed: list[str] = []
        if answer is not None and answer.confirmed and self.stamp is not None and self.prune is not None:
            stamp, removed = answer.results[self.stamp] or {}, answer.results[self.prune] or []
        probe = stamp.get("probe") if isinstance(stamp.get("probe"), dict) else None
        if probe is None and self.probed is not None:
            probe = self.probed.to_json()
        self.manifest = self.manifest.model_copy(update={
            "finished": stamp.get("finished") or self.session.host_time(), "probe": probe})
        if removed:
            self.reporter.event(self.label, events.BuildsPruned(tuple(str(r) for r in removed)))
        for rid, paths in self.pruning.held.items():
            self.reporter.event(self.label, events.HeldForDrift(rid, tuple(paths)))
        self.reporter.event(self.label, events.NightCurrent(self.name, self.build_dir))
        result = self.result(CHANGED.outcome, CHANGED.exit_code)
        result.build_log = self.read_log()
        return result

    def claim_answer(self, v: RunVerdict) -> ops.ConfirmAnswer | None:
        """The confirm's answer in a confirmed verdict, its records read by the ops that wrote
        them (None where the verdict carries none this controller can read)."""
        if self.program is None or self.claim is None:
            return None
        try:
            answer: ops.ConfirmAnswer = read_steps(self.program.steps, v.results, [StepName.CONFIRM.value])[self.claim]
        except (Malformed, ValueError, KeyError):
            return None
        return answer

    # ---------------------------------------------------------------- failure

    def fail(self, cause: BaseException) -> NightResult:
        """A failure once armed: the restore machine runs the night's plan, then the verdict
        (``pipeline.failure``, the same for a deploy)."""
        if isinstance(cause, KeyboardInterrupt):
            reason = interruption(cause)
        else:
            reason = self._redact(str(cause))
            if isinstance(cause, RemoteStepError) and cause.log_tail:
                self.reporter.server_log(self.label, "server log (last 40 lines)", cause.log_tail)
        if isinstance(cause, LinkLostError):
            v = verdict(cause, self.reached)
            return self.result(v.outcome, v.exit_code,
                               ending=endings.LostAfterCommit(self.label, self.name, reason, self.deadline, "night"))
        switched = self.reached >= Step.RESTARTING
        self.reporter.event(self.label, events.NightFailed(reason, switching_back=switched))
        spec = self.spec
        got = restore_here(self.session, self.release_dir, total(restore_budget(spec.server, spec.health)), reason,
                           self._events())
        if not isinstance(got, RestoreCut):
            return self.restored(cause, reason, got)
        failed = self.failed_release()
        # armed, the night's release exists: a host that says it has none could not run the restore
        return self.ended_with(failed.cut(got, reason, self.reached) or failed.could_not_run(got, reason))

    def failed_release(self) -> FailedRelease:
        return FailedRelease("night", self.label, self.name, self.release_dir, self.reporter, self._redact)

    def ended_with(self, ended: Ended) -> NightResult:
        return self.result(ended.outcome, ended.exit_code, ending=ended.ending)

    def restored(self, cause: BaseException, reason: str, record: RestoreRecord,
                 failed: StepFailure | None = None) -> NightResult:
        """The night's result from what the host recorded of its switch back (``failed``: the
        runner's step that failed, where the runner switched it back)."""
        done = events.RestoreAccount(record)

        def close(v: Verdict, ending: Ending) -> None:
            never_switched = v.outcome == Outcome.FAILED
            finished = self.session.host_time()
            steps = [ops.release_update(self.state_dir, self.name, {
                         "finished": finished, "duration": round(finished - self.started, 3),
                         **({"outcome": Outcome.FAILED} if never_switched else {})}),
                     self.log_op(ending)]
            if never_switched:
                steps.insert(0, ops.nightly_remove_build(self.builds_dir, self.name))
            with contextlib.suppress(OrchError):
                self.session.batch(steps)

        got = self.failed_release().restored(cause, reason, done, self.reached, failed, close)
        result = self.result(got.outcome, got.exit_code, reason, got.ending)
        result.restore = done
        result.build_log = self.read_log()
        return result

    # ---------------------------------------------------------------- records

    def record(self) -> dict[str, Any]:
        """The host's record of this night, for ``orch history``, ``orch status`` and ``orch rollback``.

        ``files`` stays empty: a night's patched files live in its own build,
        which a rollback never rewrites (it switches ``current``, see ``link``).
        """
        spec = self.spec
        return {
            "id": self.name, "kind": "night", "host": self.label,
            "playbook": {"name": spec.name, "path": str(self.loaded.path), "sha256": self.loaded.sha256},
            "build": self.name, "builds_dir": self.builds_dir, "build_dir": self.build_dir,
            "source": self.source_record().model_dump(), "files": [], "flag_changes": [],
            "restarted": False, "probe": None, "orch_version": __version__,
            "controller": lock_holder("nightly"), "created": self.started, "outcome": RecordedOutcome.IN_PROGRESS,
        }

    def switch_record(self, previous: ServerStart | None, new_start: ServerStart) -> dict[str, Any]:
        """What the night's record adds once it is armed (secrets masked: a record for people;
        what a restore runs is in ``restore.json``)."""
        health = health_wire(self.health, for_restore=True)
        before = redact_argv(previous.argv, self.secret_list) if previous else None
        after = redact_argv(new_start.argv, self.secret_list)
        # Flags compare with the command line the current release asked for, not with the
        # process's argv: an interpreter found through a shim (pyenv) shows its real path there.
        asked = self.last_started.argv if self.last_started else (previous.argv if previous else None)
        changes = flag_changes(redact_argv(asked, self.secret_list), after) if asked else []
        # Masker.record: every header value, the environments by the rule, known values anywhere
        return self.reporter.masker.record({
            "link": {"path": self.link, "before": self.previous_build, "after": self.name},
            "restarted": True,
            "patched": [f.model_dump() for f in self.file_records],
            "server_spec": {"manager": "process", "pidfile": self.pidfile, "log": self.server_log,
                            "port": self.port, "stop_timeout": self.server.stop_timeout},
            "health": health,
            "server_before": ({"argv": before, "cwd": previous.cwd, "env": redact_env(previous.env)}
                              if previous else None),
            "server_after": {"argv": after, "cwd": new_start.cwd, "env": redact_env(new_start.env)},
            "flag_changes": changes,
            "watchdog_deadline": self.deadline,
        })

    def make_manifest(self, start: ServerStart) -> NightManifest:
        rel = self.build_dir
        env = redact_env(relative_to_build(dict(start.env or {}), rel)) or {}
        return NightManifest(
            spec=self.spec.name, host=self.label, inputs=list(self.loaded.inputs),
            source=self.resolved_source or self.source_record(),
            install=[redact_argv(relative_to_build(a, rel), self.secret_list) for a in self.install_argvs],
            stack=self.stack_records, files=self.file_records,
            server=ServerRecord(argv=redact_argv(relative_to_build(start.argv, rel), self.secret_list),
                                cwd=relative_to_build(start.cwd, rel), env=env),
            orch_version=__version__,
            host_python=str(self.session.agent.info.get("python_version", "?")) if self.session.agent else "?",
            build=self.name, started=self.started, seq=self.seq,
        )

    def journal(self, step: JournalStep, *, finished: bool = False) -> ops.Op:
        return ops.put_json(StatePaths(self.state_dir).journal, Journal(
            self.name, "night", step, self.session.host_time(), finished, playbook=self.spec.name,
            controller=lock_holder("nightly"), builds_dir=self.builds_dir,
            previous_build=self.previous_build).to_wire())

    def log_op(self, last: str | events.Event) -> ops.Op:
        """The op that writes this run's log into the release (secrets redacted)."""
        return ops.release_log(self.state_dir, self.name, self.reporter.text(end=last))

    def read_log(self) -> str:
        """The build's own log, to keep beside the report (best effort)."""
        with contextlib.suppress(OrchError):
            info = self.session.run(ops.read([self.log_path]))[0]
            if info.get("exists"):
                return self._redact(wire_bytes(info.get("data")).decode("utf-8", "replace"))
        return ""


def nightly_host(
    target: HostTarget,
    loaded: LoadedNightly,
    cli_vars: dict[str, Any],
    options: ConnectOptions,
    reporter: Reporter,
    night: NightOptions,
) -> NightResult:
    """One night on one host; every error becomes this host's result (``core.outcomes.verdict``)."""
    started = time.time()  # until connected; then the host's clock names and times the night
    name = night_name(loaded, datetime.fromtimestamp(started, timezone.utc))
    current: Night | None = None
    clock = StepClock(target.name, reporter)
    session = HostSession(target, options)
    try:
        clock.start("connect")
        with session:
            clock.stop("connect")
            started = session.host_time()
            name = night_name(loaded, datetime.fromtimestamp(started, timezone.utc))
            current = Night(session, loaded, cli_vars, RunLog(reporter, options.masker, options.words), night, name, started, options.break_lock,
                            clock=clock)
            result = current.run()
            result.late = current.late
            result.notes.append(f"round trips: {session.round_trips}")
            result.steps = clock.steps(session.host_time)
            result.events = [e.to_wire() for e in current.reporter.events]
            return result
    except (OrchError, KeyboardInterrupt) as cause:
        clock.stop("connect")
        v = verdict(cause, current.reached if current else Step.CONNECTING)
        ending: Ending | None = None
        if isinstance(cause, KeyboardInterrupt):
            ending = endings.InterruptedBeforeChange("night", signal_name(cause))
        elif isinstance(cause, LinkLostError):
            ending = endings.LostBeforeChange(str(cause), "night")
        finished = current.session.host_time() if current is not None else time.time()
        result = NightResult(target.name, name, v.outcome, v.exit_code, started, finished,
                             error=options.words(ending) if ending else str(cause), ending=ending,
                             steps=clock.steps(session.host_time))
        if current is not None:
            result.manifest, result.last_good, result.seq = current.manifest, current.last_good, current.seq
            result.late = current.late
            result.events = [e.to_wire() for e in current.reporter.events]
        return result


__all__ = ["NightOptions", "NightResult", "night_name", "nightly_host"]
