"""Step 2 and 3 of the deploy: read, render, edit in memory, stage, validate.

``make_plan`` reads the host's facts, every target file, the modules an
``add_flag`` may have to write (those its file imports that mention the
neighbour flag) and the running server in one round trip, then does all the
thinking on the controller (pure core). File paths are rendered before that
round trip with facts deferred (``core.facts``); everything else after it,
with the facts, so ``when:`` can test them. A file an ``add_flag`` writes
without the playbook naming it becomes a planned file like the others:
backed up, compared-and-swapped, shown in the diff and read back.
``stage_and_validate`` puts the results beside their targets and runs the
validators there, in one more round trip, and always removes what it
staged. ``deploy --check`` is exactly these two and nothing else.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import shlex
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlparse

from orchestrator.core.cmdline import apply_flags, flag_change_fields, flag_changes, render_words
from orchestrator.core.declarations import (
    ReleaseRecord,
    declared_blocks,
    releases_in_effect,
    relied_on_change,
)
from orchestrator.core.edit_spec import EditSpec, FilePlan
from orchestrator.core.edits import MOVED_NOTE, plan_file
from orchestrator.core.facts import (
    ROOT_VARS,
    Facts,
    deferred_facts,
    deferred_root_vars,
    packages_to_gather,
)
from orchestrator.core.flags import (
    FlagRequest,
    NeighbourNotFound,
    expand_edits,
    wants_wider_read,
    wider_refusal,
)
from orchestrator.core.hints import anchor_hints
from orchestrator.core.hostvalues import HostValue, playbook_values, refuse_unusable
from orchestrator.core.layouts import field_name
from orchestrator.core.preflight import (
    STAGED_ENV,
    default_preflight,
    render_preflight,
    staged_aware,
    staged_builtin,
    staged_files_json,
)
from orchestrator.core.rendering import (
    RenderedFile,
    RenderedPlaybook,
    RenderedServer,
    merge_vars,
    render_paths,
    render_playbook,
    render_validate,
)
from orchestrator.core.secrets import Masker, redact_argv, secret_values
from orchestrator.core.structure import check_structure
from orchestrator.core.target import HostTarget
from orchestrator.core.templating import Renderer
from orchestrator.errors import ConfigError, OrchError, TemplateError, ValidationError
from orchestrator.host.records import HostRecords, ServerProcess
from orchestrator.host.restore_plan import RestoreSpec
from orchestrator.pipeline.session import HostSession
from orchestrator.shell import ops
from orchestrator.shell.agent_client import RemoteStepError, wire_bytes
from orchestrator.shell.config_files import LoadedPlaybook, make_renderer


@dataclass
class RemoteFile:
    path: str
    exists: bool
    data: bytes = b""
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    sha256: str | None = None
    real: str | None = None  # the file a symlinked path names: what is staged beside and written

    @classmethod
    def from_wire(cls, info: dict[str, Any]) -> RemoteFile:
        return cls(
            real=info.get("real"),
            path=info["path"],
            exists=info["exists"],
            data=wire_bytes(info.get("data")),
            mode=info.get("mode"),
            uid=info.get("uid"),
            gid=info.get("gid"),
            sha256=info.get("sha256"),
        )


@dataclass
class PlannedFile:
    """One file the deploy may change.

    ``index`` is unique per plan (it names the file's backups); ``source`` is
    the playbook ``files[]`` entry it comes from (for messages): an entry's
    own file has ``index == source``, a file an ``add_flag`` of that entry
    writes elsewhere gets an index past the playbook's files.
    """

    rendered: RenderedFile
    remote: RemoteFile
    plan: FilePlan
    index: int
    source: int = -1

    def __post_init__(self) -> None:
        if self.source < 0:
            self.source = self.index

    @property
    def path(self) -> str:
        return self.remote.path

    @property
    def changed(self) -> bool:
        return self.plan.changed

    @property
    def new_bytes(self) -> bytes:
        return self.plan.result.encode("utf-8")

    @property
    def new_sha256(self) -> str:
        return hashlib.sha256(self.new_bytes).hexdigest()


@dataclass
class ServerChange:
    """The server's command line as it runs now and as it will run."""

    manager: str
    before: ServerProcess | None  # the process running now: argv, cwd, env, pid, pgid, found_by
    after_argv: list[str] | None
    after_cwd: str | None
    after_env: dict[str, str] | None
    replace_env: bool
    port: int | None
    restart: bool
    flag_changes: list[str] = field(default_factory=list)
    flag_fields: list[dict[str, Any]] = field(default_factory=list)  # the same as fields, for ``--json``
    # ``commands`` manager only: the user's commands, rendered with
    # ``{{ command }}`` = the new (start) or the previous (restore_start) command line.
    start: list[str] | None = None
    restore_start: list[str] | None = None
    stop: list[str] | None = None
    # step 7: the command that runs the server's own parser on ``after_argv``
    # (``server.preflight`` rendered, or ``core.preflight``'s default; None: none known)
    preflight: list[str] | None = None
    # hooks around the restart (either manager), ``{{ command }}`` = the new command
    # line; ``restore_after_healthy`` is rendered with the previous one, for a restore
    before_stop: list[str] | None = None
    after_healthy: list[str] | None = None
    restore_after_healthy: list[str] | None = None
    why: str = ""  # why it restarts when no flag changes: files, environment, not running


@dataclass
class HostPlan:
    target: HostTarget
    playbook: RenderedPlaybook
    loaded: LoadedPlaybook
    files: list[PlannedFile]
    server: ServerChange | None
    vars: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    refusal: str | None = None  # --check only: why a deploy would refuse (exit 2)
    facts: Facts = field(default_factory=Facts)
    # for the release's manifest: the blocks it leaves that declare flags, and the declarations
    # another release in effect provides instead (``core.declarations``)
    declares: list[dict[str, Any]] = field(default_factory=list)
    provided_by: list[dict[str, Any]] = field(default_factory=list)

    @property
    def changed_files(self) -> list[PlannedFile]:
        return [f for f in self.files if f.changed]

    @property
    def changed(self) -> bool:
        return bool(self.changed_files) or bool(self.server and self.server.restart)

    def teach(self, masker: Masker) -> None:
        """Tell the run's masker every secret this plan holds, before anything of it is shown:
        the secret vars' values, the playbook's ``secrets:`` names, and what the rules find in
        the server's environment and command lines (as running and as planned) and in the
        health checks' headers and URL."""
        masker.declare(self.loaded.model.secrets)
        masker.hide(secret_values(self.vars, self.playbook.secret_names))
        change = self.server
        if change is not None:
            masker.learn({"before": change.before.to_wire() if change.before else None, "argv": change.after_argv, "env": change.after_env,
                          "start": change.start, "restore_start": change.restore_start, "stop": change.stop,
                          "before_stop": change.before_stop, "after_healthy": change.after_healthy})
        health = self.playbook.health
        if health is not None:
            masker.learn({"base_url": health.base_url, "checks": [{"headers": dict(c.headers)} for c in health.checks]})


def health_port(base_url: str | None) -> int | None:
    if not base_url:
        return None
    parsed = urlparse(base_url)
    return parsed.port or (443 if parsed.scheme == "https" else 80)


def plan_server(
    server: RenderedServer | None,
    running: ServerProcess | None,
    files_changed: bool,
    port: int | None,
    last_started: ServerProcess | None = None,
) -> ServerChange | None:
    """Decide the new command line and whether the server must restart.

    The new command line is ``server.command`` with ``flags`` applied, or,
    without a ``command``, the running server's own recorded command line
    with ``flags`` applied — or, when nothing runs (it crashed), the command
    line the current release started. A change of flags alone is a change.
    """
    if server is None:
        return None
    if server.manager == "commands":
        before_argv = running.argv if running else None
        base = list(server.argv) if server.argv else (list(before_argv) if before_argv else None)
        after = apply_flags(base, server.flags) if base is not None else None
        restart = files_changed or running is None or (after is not None and after != before_argv)
        return ServerChange(
            "commands", running, after, server.workdir, dict(server.env), False, port, restart,
            flag_changes(before_argv or [], after) if after is not None else [],
        )
    # What runs now, or, when nothing does and there is no ``command``, what
    # the current release started: its command line, cwd and environment.
    recorded = running
    if recorded is None and not server.argv and last_started and last_started.argv:
        recorded = last_started
    if server.argv:
        base = list(server.argv)
    elif recorded is not None and recorded.argv is not None:
        base = list(recorded.argv)
    else:
        raise ConfigError(
            "no server is running (by pidfile or on the health port) and server.command is not set",
            key="server.command",
        )
    after = apply_flags(base, server.flags)
    if recorded is not None:
        env = dict(recorded.env)
        env.update(server.env)
        replace_env = True if running is not None else bool(recorded.replace_env)
        cwd = server.workdir or recorded.cwd
    else:
        env, replace_env, cwd = dict(server.env), False, server.workdir
    before_argv = (running.argv or []) if running else []
    # a changed server.env is a change too: it only takes effect by a restart
    env_changed = sorted(k for k, v in server.env.items() if running is not None and running.env.get(k) != v)
    restart = files_changed or running is None or after != before_argv or bool(env_changed)
    why = ("no server is running" if running is None else "files changed" if files_changed
           else f"environment changed: {', '.join(env_changed)}" if env_changed else "")
    return ServerChange(
        "process", running, after, cwd, env, replace_env, port, restart,
        flag_changes(before_argv, after), why=why,
    )


def make_plan(
    session: HostSession,
    loaded: LoadedPlaybook,
    cli_vars: dict[str, Any],
    *,
    check: bool = False,
    current_release_dir: str | None = None,
    state: HostRecords | None = None,
) -> HostPlan:
    """Read the host, render the playbook for it, and edit in memory.

    With ``check``, a server that cannot be planned (none running and no
    ``command``) is a note, not an error: ``--check`` is also how one looks
    at a patch on a box whose server is down. ``state``: the host's records
    (``state_read``), to tell which release in effect wrote an orch block
    that declares a flag, and which blocks a release in effect relies on.
    """
    target = session.target
    pb = loaded.model
    renderer = make_renderer(loaded)
    python = pb.server.python if pb.server and pb.server.python else "python3"
    packages = packages_to_gather(loaded.text, {**pb.vars, **target.vars, **cli_vars})
    early = merge_vars(
        pb.vars,
        target.vars,
        cli_vars,
        {"python": python, "facts": deferred_facts(), **deferred_root_vars(packages)},
    )
    paths = render_paths(pb, loaded.locations, {"command": "", **early}, renderer)
    refuse_unusable([HostValue(("files", i, "path"), "path", p) for i, p in enumerate(paths)],
                    loaded.locations.where)  # before the read: the host would fail to open it
    port = health_port(_early_string(pb.health.base_url if pb.health else None, early, renderer))
    pidfile = _early_pidfile(target, pb, early, renderer)
    manager = pb.server.manager if pb.server else None
    read_host = ops.read_host(paths, packages=packages, python=pb.server.python if pb.server else None,
                              pidfile=pidfile if manager == "process" else None,
                              port=port if manager == "process" else None, follow=_follow(pb, early, renderer))
    steps = [read_host]
    spec = None
    if current_release_dir and manager == "process":
        # what the current release started, in case nothing runs now (same round trip)
        spec = ops.get_json(f"{current_release_dir}/restore.json")
        steps.append(spec)
    results = session.batch(steps)
    host = results[read_host]
    running = ServerProcess.from_wire(host.get("server"))  # what read_host found by the pidfile or the port
    recorded = RestoreSpec.from_wire(results[spec]) if spec is not None and results[spec] else None
    last_started = ServerProcess.from_wire(recorded.started) if recorded else None
    facts = Facts.from_wire(host.get("facts"))
    variables = merge_vars(
        pb.vars, target.vars, cli_vars, {"python": python, "facts": facts.as_var(), **facts.root_vars()}
    )
    # ``{{ command }}`` (commands manager) is only known after planning; see render_server_commands.
    try:
        rendered = render_playbook(pb, loaded.locations, {"command": "", **variables}, renderer)
    except TemplateError as e:
        raise _explain_root(e, facts) from None
    refuse_unusable([*playbook_values(rendered), *_validate_values(rendered, variables, renderer)],
                    loaded.locations.where)
    if rendered.server is not None and rendered.server.manager == "commands":
        running = find_commands_server(session, rendered.server)
    read = dict(zip(host["paths"], host["files"], strict=False))
    known = _releases_in_effect(state)
    try:
        planned, notes, provided = _plan_files(target, loaded, rendered, read, host["companions"], paths,
                                               renderer, variables, known)
    except NeighbourNotFound as e:
        raise _with_closest_names(session, e) from None
    _refuse_changing_relied_on(planned, known, loaded)
    files_changed = any(p.changed for p in planned)
    refusal: str | None = None
    try:
        server = plan_server(rendered.server, running, files_changed, port, last_started)
    except ConfigError as e:
        if not check:
            raise e.located(file=loaded.display) from None
        server = None
        refusal = str(e.located(file=loaded.display))
        notes.append(f"server: {e.message}; a deploy would refuse")
    if server is not None:
        # shown to people and kept in the history: secrets masked
        values = secret_values(variables, rendered.secret_names)
        before_argv = (server.before.argv if server.before else None) or []
        server.flag_changes = flag_changes(
            redact_argv(before_argv, values), redact_argv(server.after_argv or [], values)
        )
        server.flag_fields = flag_change_fields(
            redact_argv(before_argv, values), redact_argv(server.after_argv or [], values)
        )
        server.preflight = preflight_argv(rendered.server, server.after_argv, variables, renderer)
    if server is not None:
        render_server_commands(server, loaded, renderer, variables)
        refuse_unusable(_change_values(server), loaded.locations.where)
    declares = [d for p in planned for d in declared_blocks(p.path, p.plan.result, p.rendered.edits)]
    return HostPlan(target, rendered, loaded, planned, server, variables, notes, refusal, facts,
                    declares, provided)


def _releases_in_effect(state: HostRecords | None) -> tuple[ReleaseRecord, ...]:
    if state is None:
        return ()
    return releases_in_effect([m.to_wire() for m in state.releases], state.applied)


def _refuse_changing_relied_on(planned: list[PlannedFile], known: tuple[ReleaseRecord, ...],
                               loaded: LoadedPlaybook) -> None:
    """A deploy may not change or remove a block whose declaration a release in effect relies
    on (it was satisfied by it, ``provided_by``): refused before anything is staged."""
    if not any(r.provided_by for r in known):
        return  # nothing relies on another release's block: no file to decode again
    files = [(p.path, _text_of(p.remote), p.plan.result) for p in planned if p.changed]
    refusal = relied_on_change(files, known)
    if refusal is not None:
        raise ConfigError(refusal, file=loaded.display)


def _text_of(remote: RemoteFile) -> str:
    return remote.data.decode("utf-8", errors="replace")


def _validate_values(rendered: RenderedPlaybook, variables: dict[str, Any], renderer: Renderer) -> list[HostValue]:
    """The ``validate`` commands as they will run (``{{ staged }}`` is a name orch makes, never a problem)."""
    out = []
    for f in rendered.files:
        for j, step in enumerate(f.validate):
            argv = render_validate(step, variables, f"{f.path}.staged", renderer)
            out.append(HostValue(("files", f.index, "validate", j), "argv", argv or None))
    return out


def _change_values(change: ServerChange) -> list[HostValue]:
    """The planned server's command lines and environment, as they reach the host
    (the flags and ``server.env`` were checked by their own keys already)."""
    argvs = {"command": change.after_argv, "preflight": change.preflight, "start": change.start,
             "stop": change.stop, "before_stop": change.before_stop, "after_healthy": change.after_healthy}
    out = [HostValue(("server", key), "argv", argv) for key, argv in argvs.items()]
    out.append(HostValue(("server", "env"), "env", change.after_env))
    out.append(HostValue(("server", "workdir"), "path", change.after_cwd))
    return out


def _explain_root(error: TemplateError, facts: Facts) -> TemplateError:
    """``'sglang_root' is undefined``: say that no package was found to default it from, and where."""
    for var, package in ROOT_VARS.items():
        if f"'{var}' is undefined" in error.message:
            asked = facts.python or "the server's interpreter"
            why = f"; {asked} failed: {facts.error}" if facts.error else ""
            return TemplateError(
                f"{error.message} (set it, or install {package} for {asked} on the host: "
                f"it was not found there{why})",
                file=error.file, line=error.line, key=error.key,
            )
    return error


def _early_string(text: str | None, variables: dict[str, Any], renderer: Renderer) -> str | None:
    """A string needed before the host is read (the health URL, a pidfile), rendered then."""
    if text is None:
        return None
    try:
        return renderer.render_string(text, variables)
    except OrchError:
        return None  # rendered (and reported) properly after the read


def _early_pidfile(target: HostTarget, pb: Any, variables: dict[str, Any], renderer: Renderer) -> str:
    given = _early_string(pb.server.pidfile if pb.server else None, variables, renderer)
    return given or f"{target.state_dir.rstrip('/')}/server.pid"


def _follow(pb: Any, variables: dict[str, Any], renderer: Renderer) -> list[dict[str, Any]]:
    """For each file with an ``add_flag``: the neighbour names whose module the helper should find."""
    out = []
    for index, entry in enumerate(pb.files):
        names = []
        for edit in entry.edits:
            if edit.add_flag is not None:
                for near in edit.add_flag.near_names:
                    names.append(field_name(_early_string(near, variables, renderer) or near))
        if names:
            out.append({"index": index, "names": sorted(set(names))})
    return out


def _plan_files(
    target: HostTarget,
    loaded: LoadedPlaybook,
    rendered: RenderedPlaybook,
    read: dict[str, dict[str, Any]],
    companions: dict[str, list[dict[str, Any]]],
    paths: list[str],
    renderer: Renderer,
    variables: dict[str, Any],
    known: tuple[ReleaseRecord, ...] = (),
) -> tuple[list[PlannedFile], list[str], list[dict[str, Any]]]:
    """Every file to change, planned and structurally checked; the notes worth telling; the
    ``add_flag`` declarations another release in effect provides (``provided_by`` records)."""
    notes: list[str] = []
    order: list[str] = []  # paths in playbook order
    sources: dict[str, tuple[RenderedFile, RemoteFile, int]] = {}
    edits: dict[str, list[EditSpec]] = {}
    hints: dict[str, Any] = {}
    provided: list[dict[str, Any]] = []
    extra = len(loaded.model.files)
    for rfile in rendered.files:
        info = read.get(rfile.path) or read.get(paths[rfile.index])
        key = f"files[{rfile.index}].path"
        remote = RemoteFile.from_wire(info) if info else RemoteFile(rfile.path, False)
        if not remote.exists:
            raise ConfigError(f"{remote.path} does not exist on {target.label}", file=loaded.display, key=key)
        text = _text(remote, target, loaded, key)
        related = {
            RemoteFile.from_wire(c).path: RemoteFile.from_wire(c)
            for c in companions.get(str(rfile.index), [])
        }
        related_text = {p: _text(r, target, loaded, key) for p, r in related.items()}
        hints[remote.path] = anchor_hints(related_text)
        if remote.path not in sources:
            order.append(remote.path)
            sources[remote.path] = (rfile, remote, rfile.index)
        expanded, flags = expand_edits(remote.path, rfile.edits, text, related_text, renderer, variables, known)
        notes.extend(_flag_note(f.request, f.layout.description, remote.path, f.layout.paths) for f in flags)
        for f in flags:
            if f.provided is not None:
                notes.append(f"add_flag {f.request.flag}: {f.provided.words()}; nothing to add")
                provided.append(f.provided.record())
        for path, specs in expanded.items():
            if path not in sources:
                order.append(path)
                sources[path] = (_extra_file(rfile, path), related[path], rfile.index)
                hints.setdefault(path, anchor_hints(related_text))
            edits.setdefault(path, []).extend(specs)
    planned: list[PlannedFile] = []
    for path in order:
        rfile, remote, source = sources[path]
        index = source if rfile.path == path else extra
        if index == extra:
            extra += 1
        specs = edits.get(path, [])
        if not specs and rfile.path == path and any(not isinstance(e, EditSpec) for e in rfile.edits):
            continue  # its add_flag writes another module (the spec layout): nothing to do here
        text = _text(remote, target, loaded, f"files[{source}].path")
        fplan = planned_file(path, text, specs, rfile.comment, hints.get(path))
        planned.append(PlannedFile(replace(rfile, edits=tuple(specs)), remote, fplan, index, source))
        notes.extend(f"{path}: {note.partition(': ')[2]}" for note in fplan.notes if MOVED_NOTE in note)
    return planned, notes, provided


PLAN_MEMO_SIZE = 16
"""Plans kept for reuse: one per distinct (path, content, edits) of a run, a few runs' worth."""

_plans: OrderedDict[tuple[Any, ...], FilePlan] = OrderedDict()
_planning: dict[tuple[Any, ...], threading.Lock] = {}
_plans_lock = threading.Lock()


def planned_file(path: str, text: str, specs: list[EditSpec], comment: str | None, hints: Any) -> FilePlan:
    """``plan_file`` and its structural check, done once per distinct file in a run.

    A fleet's hosts usually hold the same file (one SGLang release
    everywhere): planning and checking it is pure and costs tens of
    milliseconds per host on a real ``server_args.py``, so the plan of the
    first host serves the others. The plan depends on the content, the
    edits, the comment leader and the file's type (its name's suffix); the
    directory only appears in messages, so a host whose tree lives elsewhere
    gets the same plan under its own path. Only successes are kept (an error
    is raised, and located, for each host); ``hints`` only shape error messages.
    """
    name = path.rpartition("/")[2]
    key = (name, hashlib.sha256(text.encode("utf-8")).digest(), tuple(specs), comment)
    with _plans_lock:
        gate = _planning.setdefault(key, threading.Lock())
    with gate:  # hosts at work at once: one plans, the others take its plan
        with _plans_lock:
            known = _plans.get(key)
        if known is not None:
            return known if known.path == path else replace(known, path=path)
        fplan = plan_file(path, text, specs, comment=comment, hints=hints)
        if fplan.changed:
            check_structure(fplan, specs)
        with _plans_lock:
            _plans[key] = fplan
            while len(_plans) > PLAN_MEMO_SIZE:
                _planning.pop(_plans.popitem(last=False)[0], None)
        return fplan


FIELD_MODULES = "A["
"""What the field modules of SGLang's spec layout contain (``name: A[...]``): a wider read follows these."""


def _with_closest_names(session: HostSession, error: NeighbourNotFound) -> OrchError:
    """A ``near:`` that names no flag, on the spec layout: one more round trip (only on this
    refusal) reads the field modules the file imports, so the message can name the closest."""
    if not wants_wider_read(error):
        return error
    try:
        (host,) = session.batch([ops.read_host([error.path], follow=[{"index": 0, "names": [FIELD_MODULES]}])])
        modules = [RemoteFile.from_wire(c) for c in host["companions"].get("0", [])]
        texts = {m.path: m.data.decode("utf-8") for m in modules}
    except (OrchError, UnicodeDecodeError, KeyError):
        return error  # the refusal stands without suggestions
    return wider_refusal(error, texts)


def _text(remote: RemoteFile, target: HostTarget, loaded: LoadedPlaybook, key: str) -> str:
    try:
        return remote.data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(
            f"{remote.path} on {target.label} is not UTF-8 text", file=loaded.display, key=key
        ) from None


def _extra_file(entry: RenderedFile, path: str) -> RenderedFile:
    """A file the playbook does not name but an ``add_flag`` of ``entry`` writes: checked like it."""
    return replace(entry, path=path, edits=())


def _flag_note(request: FlagRequest, layout: str, path: str, written: tuple[str, ...]) -> str:
    elsewhere = [p for p in written if p != path]
    where = f"; declared in {', '.join(elsewhere)}" if elsewhere else ""
    return f"add_flag {request.flag}: {path} uses {layout}{where}"


def preflight_argv(
    server: RenderedServer | None,
    argv: list[str] | None,
    variables: dict[str, Any],
    renderer: Renderer,
) -> list[str] | None:
    """The pre-flight command for the new command line ``argv``: the playbook's, or the default.

    The default runs only for the ``process`` manager, whose server orch starts
    itself with a known working directory and environment; a ``commands``
    server may run in a container or under a supervisor whose environment orch
    cannot reproduce, so there only ``server.preflight`` runs.
    """
    if server is None or not argv or server.preflight is False:
        return None
    if isinstance(server.preflight, str):
        file, line, key = server.preflight_where
        return render_preflight(server.preflight, argv, variables, renderer, file=file, line=line, key=key)
    if server.manager != "process":
        return None
    return default_preflight(argv, server.python if server.python != "python3" else None)


@dataclass(frozen=True)
class StagedPreflight:
    """``--check``'s pre-flight: the command and the environment that point it at the staged copies."""

    argv: list[str]
    env: dict[str, str]


def staged_preflight(plan: HostPlan, staged: dict[str, str]) -> StagedPreflight | None:
    """The pre-flight the deploy would run, pointed at ``staged`` (target path → staged copy).

    The built-in one runs with ``-B`` and ``core.preflight.STAGED_FINDER``; a custom
    ``server.preflight`` is rendered again with ``{{ staged_files }}`` = the map. ``None``
    when the custom one is not staged-aware (``core.preflight.staged_aware``): run as it is, it
    would judge the files on disk, not the planned ones. Either way the map is in
    ``ORCH_STAGED`` and no bytecode is written (``PYTHONDONTWRITEBYTECODE``).
    """
    change, server = plan.server, plan.playbook.server
    assert change is not None and change.preflight and server is not None
    if isinstance(server.preflight, str):
        if not staged_aware(server.preflight):
            return None
        file, line, key = server.preflight_where
        argv = render_preflight(server.preflight, change.after_argv or [], plan.vars, make_renderer(plan.loaded),
                                file=file, line=line, key=key, staged=staged)
    else:
        argv = staged_builtin(change.preflight) or list(change.preflight)
    env = {**(change.after_env or {}), STAGED_ENV: staged_files_json(staged), "PYTHONDONTWRITEBYTECODE": "1"}
    return StagedPreflight(argv, env)


def render_server_commands(
    change: ServerChange, loaded: LoadedPlaybook, renderer: Renderer, variables: dict[str, Any]
) -> None:
    """Render the user's commands with ``{{ command }}``: the new command line for
    the deploy, the recorded previous one for a restore. ``start``/``stop`` are
    the ``commands`` manager's; the hooks are any manager's."""
    spec = loaded.model.server
    assert spec is not None

    def words(key: str, raw: str, argv: list[str] | None) -> list[str]:
        where = loaded.locations.where(("server", key))
        command = shlex.join(argv) if argv else ""
        return render_words(raw, {**variables, "command": command}, renderer, **where)

    before_argv = change.before.argv if change.before else None
    if change.manager == "commands":
        assert spec.start and spec.stop
        change.start = words("start", spec.start, change.after_argv)
        change.restore_start = words("start", spec.start, before_argv or change.after_argv)
        change.stop = words("stop", spec.stop, before_argv)
    if spec.before_stop:
        change.before_stop = words("before_stop", spec.before_stop, before_argv or change.after_argv)
    if spec.after_healthy:
        change.after_healthy = words("after_healthy", spec.after_healthy, change.after_argv)
        change.restore_after_healthy = words("after_healthy", spec.after_healthy, before_argv or change.after_argv)


def find_commands_server(session: HostSession, server: RenderedServer) -> ServerProcess | None:
    """With the ``commands`` manager, ``pid`` (or ``status``) says what runs."""
    if server.pid:
        res = session.run(ops.run(server.pid, timeout=60.0))
        words = (res["stdout"] or "").split()
        if res["rc"] != 0 or not words or not words[0].isdigit():
            return None
        return ServerProcess.from_wire(session.run(ops.process(int(words[0]))))
    if server.status:
        res = session.run(ops.run(server.status, timeout=60.0))
        return ServerProcess(found_by="status command") if res["rc"] == 0 else None
    return None


def server_pidfile(target: HostTarget, rendered: RenderedPlaybook) -> str:
    """The pidfile orch keeps for a ``process`` server: the playbook's, or under state_dir."""
    if rendered.server and rendered.server.pidfile:
        return rendered.server.pidfile
    return f"{target.state_dir.rstrip('/')}/server.pid"


def server_log(target: HostTarget, rendered: RenderedPlaybook) -> str:
    if rendered.server and rendered.server.log:
        return rendered.server.log
    return f"{target.state_dir.rstrip('/')}/server.log"


@dataclass
class Staged:
    file: PlannedFile
    staged: str


def stage_and_validate(session: HostSession, plan: HostPlan, *, keep: bool,
                       clean_stale: bool | None = None) -> list[Staged]:
    """Put every changed file beside its target and run ``validate`` on it.

    With ``keep`` false (``--check`` without a pre-flight) the staged copies
    are removed in the same round trip; on any failure they are removed too.
    ``clean_stale`` (default: ``keep``) first removes what a dead run left
    beside the targets: a deploy's, which holds the lock; ``--check`` holds
    none and keeps its copies only until its pre-flight ran, so it passes False. Raises
    ``ValidationError`` naming the file and the validator's own message.

    The staged copy's name is the host's (the stage reply's ``staged``):
    a validate command's ``{{ staged }}`` is rendered from it, so stage and
    validate share one round trip only when no command needs the name
    (the built-in ``python-syntax`` is given it on the host).
    """
    changed = plan.changed_files
    if not changed:
        return []
    token = secrets.token_hex(4)
    files = [{"path": f.path, "data": f.new_bytes} for f in changed]  # bytes go as blob lines
    stage = ops.stage(files, token, clean_stale=keep if clean_stale is None else clean_stale)
    custom = any(step.builtin != "python-syntax" for f in changed for step in f.rendered.validate)
    staged_info: list[dict[str, Any]] = []
    try:
        if custom:
            staged_info = session.run(stage)
            results = session.run(ops.validate(validate_checks(plan, staged_info), token, keep_staged=keep))
        else:
            check = ops.validate(validate_checks(plan, None), token, keep_staged=keep)
            answers = session.batch([stage, check])
            staged_info, results = answers[stage], answers[check]
    except BaseException as e:
        done = (e.details.get("done") or []) if isinstance(e, RemoteStepError) else []
        staged_info = staged_info or (done[0] if done else [])
        remove_quietly(session, [r["staged"] for r in staged_info])
        raise
    staged_paths = [r["staged"] for r in staged_info]
    failed = [r for r in results if r["rc"] != 0]
    if failed:
        if keep:
            remove_quietly(session, staged_paths)
        r = failed[0]
        message = (r["stdout"] + r["stderr"]).strip().splitlines()
        first = message[-1] if message else f"exit {r['rc']}"
        f = next(p for p in changed if p.path == r["target"])
        shown = "python-syntax" if r["argv"][1:2] == ["-c"] else " ".join(r["argv"])
        raise ValidationError(
            f"{plan.loaded.display}: files[{f.source}].validate: {shown} failed on the staged "
            f"{r['target']}: {first}"
        )
    return [Staged(f, s) for f, s in zip(changed, staged_paths, strict=True)]


def validate_checks(plan: HostPlan, staged_info: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The validate op's checks; commands rendered with each file's staged path as the host named it."""
    renderer = make_renderer(plan.loaded)
    python = plan.vars.get("python", "python3")
    checks = []
    for i, f in enumerate(plan.changed_files):
        staged = staged_info[i]["staged"] if staged_info is not None else ""
        argvs = [
            ["python-syntax"] if step.builtin == "python-syntax"
            else render_validate(step, plan.vars, staged, renderer)
            for step in f.rendered.validate
        ]
        checks.append({"target": f.path, "argvs": argvs, "python": python})
    return checks


def remove_quietly(session: HostSession, paths: list[str]) -> None:
    """Remove staged copies after a failure; the original error is the one to report."""
    if not paths or not session.link_alive:
        return
    with contextlib.suppress(Exception):
        session.run(ops.remove(paths))
