"""``orch nightly``: rebuild one server from a pinned spec, switch once, probe, prove it.

One night on one host, as steps:

1. **lock and journal** as a deploy does (``open_state``, ``refuse_unfinished``);
   read what runs now and the last good night's manifest (nothing written);
   refuse over drift in the current build (unless ``--force``) and, with
   ``--frozen``, over any input that differs from the last good night;
2. **build** into a fresh ``builds_dir/<UTC stamp>-<short id>/`` while the old
   night keeps serving: the pinned source (git: a mirror cache on the host,
   then exactly the commit, ``HEAD`` read back; pip: a fresh venv and
   ``pip install --require-hashes``), then the ``install`` commands; their
   output streams to the terminal and into ``builds_dir/logs/<build>.log``;
3. **patch** the build with the stack, in order, with deploy's own planning,
   staged validation and structural check (``make_plan``,
   ``stage_and_validate``); each playbook is committed into the build (which
   nothing runs from) before the next one is planned, so it sees its result;
4. **switch** (``nightly_switch``): stop the old server, point
   ``builds_dir/current`` at the new build, start the server once from
   ``current/``, health with crash detection; then **probe** it;
5. any failure before the switch: nothing running was touched, the build is
   removed (its log kept), exit 2. After it: switch back and start the
   previous command line (exit 1, or 3 if that fails too).

The manifest (``core.nightly.NightManifest``) goes into the build and into
the controller's report; the host's records get a ``kind: night`` entry for
``orch history``/``orch status``, and ``nightly.json`` names the current and
previous good builds.
"""

from __future__ import annotations

import base64
import contextlib
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from orchestrator import __version__
from orchestrator.core.cmdline import flag_changes, render_words
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
from orchestrator.core.probe import ProbeResult
from orchestrator.core.releases import new_release_id
from orchestrator.core.rendering import RenderedHealth, merge_vars, render_playbook
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
    HostUnsafeError,
    LinkLostError,
    OrchError,
    RefusedError,
    RemoteError,
)
from orchestrator.pipeline.deploy import open_state, refuse_unfinished, release_lock
from orchestrator.pipeline.events import Reporter, RunLog
from orchestrator.pipeline.nightly_switch import ServerStart, SwitchRecord, switch, switch_back
from orchestrator.pipeline.plan import health_port, make_plan, stage_and_validate
from orchestrator.pipeline.probe import run_probe
from orchestrator.pipeline.report import HostReport
from orchestrator.pipeline.session import ConnectOptions, HostSession, lock_holder
from orchestrator.shell.agent_client import RemoteStepError
from orchestrator.shell.config_files import (
    LoadedPlaybook,
    display_path,
    template_dirs_for,
    template_lookup,
)
from orchestrator.shell.nightly_files import LoadedNightly


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
    error: str | None = None
    manifest: NightManifest | None = None
    last_good: NightManifest | None = None
    build_log: str = ""
    notes: list[str] = field(default_factory=list)

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
        return HostReport(self.host, self.outcome, self.exit_code, release=self.name,  # type: ignore[arg-type]
                          files=[f.path for f in self.manifest.files] if self.manifest else [],
                          error=self.error, notes=list(self.notes), extra=extra)


def night_name(loaded: LoadedNightly, now: datetime) -> str:
    """``<UTC stamp>-<short id>``: the short commit, or a short digest of the requirements."""
    source = loaded.model.source
    short = source.git.commit[:7] if source.git else (loaded.requirements.sha256[:7] if loaded.requirements else "pip")
    return new_release_id(now, short)


class PreSwitchFailure(Exception):
    """A failure before anything live was touched: the build is removed, exit 2."""


def health_wire(health: RenderedHealth, *, for_restore: bool) -> dict[str, Any]:
    checks = []
    for c in health.checks:
        check: dict[str, Any] = {"method": c.method, "path": c.path, "json": c.json, "status": c.status,
                                 "headers": dict(c.headers)}
        if not for_restore:
            check["expect"] = dict(c.expect)
            check["body"] = c.body
        checks.append(check)
    return {"base_url": health.base_url, "checks": checks, "timeout": health.timeout,
            "interval": health.interval}


def _anchor_named(error: ConfigError, loaded: LoadedPlaybook) -> ConfigError:
    """An anchor error with the anchor's own text added, so the message names it."""
    import re

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
    state_dir: str = ""
    builds_dir: str = ""
    build_dir: str = ""
    log_path: str = ""
    variables: dict[str, Any] = field(default_factory=dict)
    stack_vars: dict[str, Any] = field(default_factory=dict)
    secret_list: list[str] = field(default_factory=list)
    last_good: NightManifest | None = None
    previous_build: str | None = None
    prepared: bool = False
    switch_begun: bool = False
    manifest: NightManifest | None = None
    repo: str = ""
    # filled by build() and patch(), read by make_manifest()
    existing_builds: list[str] = field(default_factory=list)
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

    def _redact(self, text: str) -> str:
        return redact_text(text, self.secret_list)

    def _events(self) -> Any:
        return lambda ev: self.reporter.progress(self.label, ev)

    def result(self, outcome: str, code: int, error: str | None = None) -> NightResult:
        return NightResult(self.label, self.name, outcome, code, self.started, time.time(),
                           error=self._redact(error) if error else None, manifest=self.manifest,
                           last_good=self.last_good)

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
        """``builds_dir``, ``build`` and the spec's vars, rendered for this host."""
        spec = self.spec
        builtins = {"python": spec.server.python or "python3"}
        base = merge_vars({}, self.target.vars, self.cli_vars, builtins)
        builds_dir = str(self.render_value(spec.builds_dir, ("builds_dir",), base)).rstrip("/")
        if builds_dir.startswith("~"):
            builds_dir = str(self.session.agent.info.get("home", "~")) + builds_dir[1:] if self.session.agent else builds_dir
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

    # --------------------------------------------------------------- the steps

    def run(self) -> NightResult:
        self.state_dir, state = open_state(self.session, f"nightly {self.loaded.display}", self.break_lock,
                                           self.reporter)
        try:
            refuse_unfinished(self.label, state["journal"])
            self.resolve_vars()
            server, health = self.render_server()
            running = self.read_host(server, health)
            try:
                self.build()
                self.patch()
            except (OrchError, RemoteError, KeyboardInterrupt) as e:
                return self.abandon(e)
            return self.switch_and_probe(server, health, running)
        finally:
            if self.session.agent is not None and self.session.agent._proc is not None:
                release_lock(self.session, self.state_dir)

    def render_server(self) -> tuple[Any, RenderedHealth]:
        spec = self.spec
        pb = Playbook(name=spec.name, secrets=spec.secrets, server=spec.server, health=spec.health)
        rendered = render_playbook(pb, spec.locations, self.variables, self.renderer())
        assert rendered.server is not None and rendered.health is not None
        return rendered.server, rendered.health

    def server_files(self, server: Any) -> tuple[str, str]:
        pidfile = server.pidfile or f"{self.state_dir}/server.pid"
        log = server.log or f"{self.state_dir}/server.log"
        return pidfile, log

    def read_host(self, server: Any, health: RenderedHealth) -> dict[str, Any] | None:
        """What runs, the last good night, drift and ``--frozen``: read only, nothing written."""
        pidfile, _ = self.server_files(server)
        port = health_port(health.base_url)
        got = self.session.call("batch", steps=[
            {"op": "get_json", "args": {"path": f"{self.builds_dir}/current/manifest.json"}},
            {"op": "get_json", "args": {"path": f"{self.state_dir}/nightly.json"}},
            {"op": "server_find", "args": {"pidfile": pidfile, "port": port}},
        ])
        if got[0]:
            self.last_good = NightManifest.model_validate(got[0])
        nightly = got[1] or {}
        self.previous_build = nightly.get("current") if nightly.get("builds_dir") == self.builds_dir else None
        if self.last_good and self.last_good.files:
            paths = [f"{self.builds_dir}/current/{f.path}" for f in self.last_good.files]
            shas = self.session.call("sha256", paths=paths)
            drift = [f.path for f, p in zip(self.last_good.files, paths, strict=True)
                     if shas.get(p) != f.sha256_after]
            if drift and not self.options.force:
                raise RefusedError(
                    f"{self.label}: files of the current build changed on the host since night "
                    f"{self.last_good.build}: {', '.join(drift)}; a new night would drop those edits. "
                    "Look at them (`orch status`), then pass --force to build anyway"
                )
            for path in drift:
                self.reporter.warn(self.label, f"drift in the current build: {path} (--force: building anyway)")
        if self.options.frozen:
            self.refuse_unless_frozen(server)
        return got[2]

    def refuse_unless_frozen(self, server: Any) -> None:
        """Inputs, source and the server's command line as the last good night had them, or refuse."""
        if self.last_good is None:
            raise RefusedError(f"{self.label}: --frozen: no last good night on this host to compare with")
        changes = input_changes(self.last_good.inputs, self.loaded.inputs)
        changes += source_changes(self.last_good.source, self.source_record())
        argv = redact_argv(relative_to_build(server.desired_argv() or [], self.build_dir), self.secret_list)
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

    def journal(self, step: str, finished: bool = False) -> dict[str, Any]:
        return {"op": "put_json", "args": {"path": f"{self.state_dir}/journal.json", "value": {
            "release": self.name, "kind": "night", "playbook": self.spec.name, "step": step,
            "finished": finished, "time": time.time(), "controller": lock_holder("nightly"),
            "builds_dir": self.builds_dir, "previous_build": self.previous_build,
            "switch_record": self.switch_record_path}}}

    @property
    def release_dir(self) -> str:
        return f"{self.state_dir}/releases/{self.name}"

    @property
    def switch_record_path(self) -> str:
        return f"{self.release_dir}/switch.json"

    def record(self) -> dict[str, Any]:
        """The host's record of this night, for ``orch history`` and ``orch status``."""
        spec = self.spec
        return {
            "id": self.name, "kind": "night", "host": self.label,
            "playbook": {"name": spec.name, "path": str(self.loaded.path), "sha256": self.loaded.sha256},
            "build": self.name, "builds_dir": self.builds_dir, "build_dir": self.build_dir,
            "source": self.source_record().model_dump(), "files": [], "flag_changes": [],
            "restarted": False, "probe": None, "orch_version": __version__,
            "controller": lock_holder("nightly"), "created": self.started, "outcome": "in_progress",
        }

    def build(self) -> None:
        got = self.session.call("batch", steps=[
            {"op": "nightly_prepare", "args": {"builds_dir": self.builds_dir, "build": self.name}},
            {"op": "release_create", "args": {"state_dir": self.state_dir, "release_id": self.name,
                                              "manifest": self.record(), "files": []}},
            self.journal("building"),
        ])
        self.prepared = True
        current = got[0]["current"]
        if current != self.previous_build:
            self.previous_build = current
        self.existing_builds = list(got[0]["builds"])
        self.reporter.step(self.label, f"building {self.build_dir} (log {self.log_path})")
        source = self.spec.source
        if source.git is not None:
            self.session.call("nightly_fetch_git", repo=self.repo, commit=source.git.commit,
                              builds_dir=self.builds_dir, build=self.name, log=self.log_path,
                              on_event=self._events())
            self.resolved_source = self.source_record()
            self.reporter.step(self.label, f"checked out {source.git.commit} (HEAD verified)")
        else:
            pip = source.pip
            assert pip is not None and self.loaded.requirements is not None
            args: list[str] = ["--no-index"] if pip.no_index else []
            for i, link in enumerate(pip.find_links):
                args += ["--find-links", str(self.render_value(link, ("source", "pip", "find_links", i),
                                                               self.variables))]
            if pip.index_url:
                args += ["--index-url", str(self.render_value(pip.index_url, ("source", "pip", "index_url"),
                                                              self.variables))]
            got = self.session.call("nightly_pip", builds_dir=self.builds_dir, build=self.name,
                                    requirements=self.loaded.requirements.text, python=pip.python,
                                    pip_args=args, log=self.log_path, on_event=self._events())
            installed = {canonical_name(p["name"]): p["version"] for p in got["packages"]}
            for pin in self.loaded.requirements.pins:
                if installed.get(canonical_name(pin.name)) != pin.version:
                    raise RemoteError(f"{pin.name}=={pin.version} is not what the venv has "
                                      f"({installed.get(canonical_name(pin.name), 'missing')})")
            self.resolved_source = self.source_record()
            self.reporter.step(self.label, f"installed {len(self.loaded.requirements.pins)} pinned package(s) "
                                           "with --require-hashes")
        self.install_argvs = []
        steps = []
        for i, command in enumerate(self.spec.install):
            argv = render_words(command, self.variables, self.renderer(),
                                **self.spec.locations.where(("install", i)))
            self.install_argvs.append(argv)
            steps.append({"op": "nightly_run", "args": {"argv": argv, "cwd": self.build_dir,
                                                        "log": self.log_path}})
        if steps:
            self.reporter.step(self.label, f"install: {len(steps)} command(s) in {self.build_dir}")
            self.session.call("batch", steps=steps, on_event=self._events())

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
                wire = [{"path": s.file.path, "staged": s.staged, "sha256": s.file.new_sha256} for s in staged]
                self.session.call("commit", files=wire)
            self.stack_records.append(StackRecord(playbook=entry, sha256=loaded.sha256, files=records))
            changed = sum(1 for f in plan.files if f.changed)
            self.reporter.step(self.label, f"stack[{i}] {entry}: {changed} file(s) patched and validated")
        self.file_records = [FileRecord(path=p, sha256_before=firsts[p], sha256_after=lasts[p]) for p in firsts]

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
            build=self.name, started=self.started,
        )

    def abandon(self, error: BaseException) -> NightResult:
        """A failure before the switch: remove the half-built build, keep its log, exit 2."""
        if isinstance(error, KeyboardInterrupt):
            reason, code = "interrupted (Ctrl-C) before the switch; nothing live was touched", 1
        else:
            reason, code = str(error), 2
            if isinstance(error, RemoteStepError) and error.details.get("log_tail"):
                self.reporter.server_log(self.label, "build output (last lines)", error.details["log_tail"])
        self.reporter.warn(self.label, f"night failed before the switch: {reason}")
        if not self.prepared:  # nothing was made on the host
            return self.result("failed", code, reason)
        with contextlib.suppress(Exception):
            self.session.call("batch", steps=[
                {"op": "nightly_remove_build", "args": {"builds_dir": self.builds_dir, "build": self.name}},
                {"op": "release_update", "args": {"state_dir": self.state_dir, "release_id": self.name,
                                                  "fields": {"outcome": "failed", "error": self._redact(reason),
                                                             "finished": time.time()}}},
                self.journal("failed", True),
                self.log_step(f"failed before the switch: {reason}"),
            ])
            self.reporter.step(self.label, f"removed the half-built {self.build_dir}; nothing running was touched")
        result = self.result("failed", code, reason)
        result.build_log = self.read_log()
        return result

    def log_step(self, last: str) -> dict[str, Any]:
        text = self.reporter.text() + f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {'end':8} {last}\n"
        return {"op": "release_log", "args": {"state_dir": self.state_dir, "release_id": self.name,
                                              "text": self._redact(text)}}

    def read_log(self) -> str:
        with contextlib.suppress(Exception):
            info = self.session.call("read", paths=[self.log_path])[0]
            if info.get("exists"):
                return self._redact(base64.b64decode(info.get("data") or "").decode("utf-8", "replace"))
        return ""

    def switch_and_probe(self, server: Any, health: RenderedHealth, running: dict[str, Any] | None) -> NightResult:
        pidfile, log = self.server_files(server)
        new_start = ServerStart(server.desired_argv() or [], server.workdir, dict(server.env), False)
        previous_start = None
        if running is not None and running.get("argv"):
            previous_start = ServerStart(running["argv"], running.get("cwd"), running.get("env"), True)
        elif self.previous_build:
            nightly = self.session.call("get_json", path=f"{self.state_dir}/nightly.json") or {}
            previous_start = ServerStart.from_wire(nightly.get("start"))
        record = SwitchRecord(
            link=f"{self.builds_dir}/current", new_build=self.name, previous_build=self.previous_build,
            new_start=new_start, previous_start=previous_start,
            previous_pid=running.get("pid") if running else None,
            previous_pgid=running.get("pgid") if running else None,
            pidfile=pidfile, log=log, port=health_port(health.base_url), stop_timeout=server.stop_timeout,
            health=health_wire(health, for_restore=False), restore_health=health_wire(health, for_restore=True),
        )
        self.manifest = self.make_manifest(new_start)
        server_spec = {"manager": "process", "pidfile": pidfile, "log": log, "port": record.port,
                       "stop_timeout": server.stop_timeout}
        self.session.call("batch", steps=[
            {"op": "release_update", "args": {"state_dir": self.state_dir, "release_id": self.name, "fields": {
                "server_spec": server_spec, "health": record.restore_health,
                "files": [{"path": f"{self.build_dir}/{f.path}", "sha256_before": f.sha256_before,
                           "sha256_after": f.sha256_after} for f in self.file_records],
                "previous_build": self.previous_build,
                "server_after": {"argv": self.manifest.server.argv}}}},
            self.journal("switching"),
        ])
        shown = " ".join(redact_argv(new_start.argv, self.secret_list))
        self.reporter.step(self.label, f"switching: stop the old server, current -> {self.name}, start {shown}")
        try:
            self.switch_begun = True
            got = switch(self.session, record, self.switch_record_path, self._events())
            self.reporter.step(self.label, f"healthy after {got['elapsed']:.1f} s ({got['polls']} polls)")
            probe = self.probe(health)
            return self.confirm(record, probe)
        except KeyboardInterrupt:
            return self.back("interrupted (Ctrl-C)")
        except LinkLostError as e:
            raise HostUnsafeError(
                f"{self.label}: {e} during the switch to {self.name}. The host may be serving the new build or "
                f"nothing; its switch record is {self.switch_record_path}. Run `orch status --host {self.label}`"
            ) from None
        except (RemoteError, OrchError) as e:
            if isinstance(e, RemoteStepError) and e.details.get("log_tail"):
                self.reporter.server_log(self.label, "server log (last 40 lines)", e.details["log_tail"])
            return self.back(str(e))

    def probe(self, health: RenderedHealth) -> ProbeResult | None:
        config = self.spec.probe
        if config is None:
            return None
        body = self.render_value(config.json_, ("probe", "json"), self.variables)
        headers = {k: str(self.render_value(v, ("probe", "headers", k), self.variables))
                   for k, v in config.headers.items()}
        result = run_probe(self.session, health.base_url, config, body, headers, self._events())
        summary = result.summary()
        ok = sum(r.ok for r in result.rounds)
        if ok == 0:
            first = next((r.first_error for r in result.rounds if r.first_error), "?")
            raise RemoteError(f"probe: no request to {config.post} succeeded (first error: {first})")
        tps = summary.get("output_tokens_per_s")
        self.reporter.step(self.label, (
            f"probe {config.post}: {summary['requests_per_s']} req/s, "
            f"{tps if tps is not None else '?'} tok/s, p50 {summary['p50_ms']} ms, p99 {summary['p99_ms']} ms, "
            f"{summary['errors']} error(s), greedy {str(result.greedy_sha256)[:12]}"))
        return result

    def confirm(self, record: SwitchRecord, probe: ProbeResult | None) -> NightResult:
        assert self.manifest is not None
        finished = time.time()
        self.manifest = self.manifest.model_copy(update={
            "finished": finished, "probe": probe.to_json() if probe else None})
        builds = [*self.existing_builds, self.name]
        prune = builds_to_prune(builds, self.name, self.previous_build, self.spec.keep_builds)
        results = self.session.call("batch", steps=[
            {"op": "put_json", "args": {"path": f"{self.build_dir}/manifest.json",
                                        "value": self.manifest.model_dump()}},
            {"op": "release_update", "args": {"state_dir": self.state_dir, "release_id": self.name, "fields": {
                "outcome": "good", "probe": probe.to_json() if probe else None, "finished": finished,
                "duration": round(finished - self.started, 3)}}},
            {"op": "put_json", "args": {"path": f"{self.state_dir}/nightly.json", "value": {
                "builds_dir": self.builds_dir, "current": self.name, "previous": self.previous_build,
                "start": record.new_start.to_wire(), "switch_record": self.switch_record_path}}},
            self.journal("good", True),
            {"op": "nightly_prune", "args": {"builds_dir": self.builds_dir, "remove": prune}},
            self.log_step(f"night {self.name} is current"),
        ])
        removed = results[4]
        if removed:
            self.reporter.step(self.label, f"pruned {len(removed)} old build(s): {', '.join(removed)}")
        self.reporter.step(self.label, f"night {self.name} is current ({self.build_dir})")
        result = self.result("changed", 0)
        result.build_log = self.read_log()
        return result

    def back(self, reason: str) -> NightResult:
        """A failure after the switch began: link back, previous server, health."""
        reason = self._redact(reason)
        self.reporter.warn(self.label, f"night failed after the switch: {reason}; switching back")
        try:
            self.session.call("batch", steps=[self.journal("switching_back")])
            record = switch_back(self.session, self.switch_record_path, self._events())
        except KeyboardInterrupt:
            raise HostUnsafeError(
                f"{self.label}: interrupted during the switch back from {self.name}; the host may be half-"
                f"restored. Its switch record is {self.switch_record_path}") from None
        except (RemoteError, OrchError) as e:
            detail = self._redact(str(e))
            if isinstance(e, RemoteStepError) and e.details.get("log_tail"):
                self.reporter.server_log(self.label, "previous server log (last 40 lines)", e.details["log_tail"])
            with contextlib.suppress(Exception):
                self.session.call("batch", steps=[
                    {"op": "release_update", "args": {"state_dir": self.state_dir, "release_id": self.name,
                                                      "fields": {"outcome": "switch_back_failed",
                                                                 "error": f"{reason}; switch back: {detail}"}}},
                    self.journal("switch_back_failed"),
                ])
            raise HostUnsafeError(
                f"{self.label}: night {self.name} failed ({reason}) and SWITCHING BACK FAILED too: {detail}. "
                f"The host is not known to be healthy; the switch record is {self.switch_record_path}"
            ) from None
        finished = time.time()
        self.session.call("batch", steps=[
            {"op": "release_update", "args": {"state_dir": self.state_dir, "release_id": self.name, "fields": {
                "outcome": "switched_back", "error": reason, "finished": finished,
                "duration": round(finished - self.started, 3)}}},
            self.journal("switched_back", True),
            self.log_step(f"switched back: {reason}"),
        ])
        back_to = record.previous_build or "no build (there was none before)"
        self.reporter.step(self.label, f"switched back: current -> {back_to}"
                                       + ("; the previous server is healthy" if record.previous_start else ""))
        result = self.result("rolled_back", 1, reason)
        result.build_log = self.read_log()
        return result


def nightly_host(
    target: HostTarget,
    loaded: LoadedNightly,
    cli_vars: dict[str, Any],
    options: ConnectOptions,
    reporter: Reporter,
    night: NightOptions,
) -> NightResult:
    """One night on one host; every error becomes this host's result."""
    started = time.time()
    name = night_name(loaded, datetime.fromtimestamp(started, timezone.utc))
    label = target.name
    runlog = RunLog(reporter)
    current: Night | None = None
    try:
        with HostSession(target, options) as session:
            current = Night(session, loaded, cli_vars, runlog, night, name, started, options.break_lock)
            result = current.run()
            result.notes.append(f"round trips: {session.round_trips}")
            return result
    except HostUnsafeError as e:
        outcome, code, error = "rollback_failed", 3, str(e)
    except OrchError as e:
        unreachable = type(e).__name__ in ("UnreachableError", "HostKeyError") or isinstance(e, LinkLostError)
        outcome, code, error = ("unreachable" if unreachable else "failed"), e.exit_code, str(e)
    except KeyboardInterrupt:
        outcome, code, error = "failed", 1, "interrupted (Ctrl-C) before anything changed"
    result = NightResult(label, name, outcome, code, started, time.time(), error=error)
    if current is not None:
        result.manifest, result.last_good = current.manifest, current.last_good
    return result


__all__ = ["NightOptions", "NightResult", "night_name", "nightly_host"]
