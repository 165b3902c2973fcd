"""Step 2 and 3 of the deploy: read, render, edit in memory, stage, validate.

``make_plan`` reads every target file and the running server in one round
trip, then does all the thinking on the controller (pure core). ``stage_and_validate``
puts the results beside their targets and runs the validators there, in
one more round trip, and always removes what it staged. ``deploy --check``
is exactly these two and nothing else.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import secrets
import shlex
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from orchestrator.core.cmdline import apply_flags, flag_changes, render_words
from orchestrator.core.edit_spec import FilePlan
from orchestrator.core.edits import plan_file
from orchestrator.core.rendering import (
    RenderedFile,
    RenderedPlaybook,
    RenderedServer,
    merge_vars,
    render_playbook,
    render_validate,
)
from orchestrator.core.secrets import redact_argv, secret_values
from orchestrator.core.structure import check_structure
from orchestrator.core.target import HostTarget
from orchestrator.core.templating import Renderer
from orchestrator.errors import ConfigError, ValidationError
from orchestrator.pipeline.session import HostSession
from orchestrator.shell import ops
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
            data=base64.b64decode(info["data"]) if info.get("data") else b"",
            mode=info.get("mode"),
            uid=info.get("uid"),
            gid=info.get("gid"),
            sha256=info.get("sha256"),
        )


@dataclass
class PlannedFile:
    rendered: RenderedFile
    remote: RemoteFile
    plan: FilePlan
    index: int

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
    before: dict[str, Any] | None  # recorded process: argv, cwd, env, pid, pgid, found_by
    after_argv: list[str] | None
    after_cwd: str | None
    after_env: dict[str, str] | None
    replace_env: bool
    port: int | None
    restart: bool
    flag_changes: list[str] = field(default_factory=list)
    # ``commands`` manager only: the user's commands, rendered with
    # ``{{ command }}`` = the new (start) or the previous (restore_start) command line.
    start: list[str] | None = None
    restore_start: list[str] | None = None
    stop: list[str] | None = None


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

    @property
    def changed_files(self) -> list[PlannedFile]:
        return [f for f in self.files if f.changed]

    @property
    def changed(self) -> bool:
        return bool(self.changed_files) or bool(self.server and self.server.restart)


def health_port(base_url: str | None) -> int | None:
    if not base_url:
        return None
    parsed = urlparse(base_url)
    return parsed.port or (443 if parsed.scheme == "https" else 80)


def plan_server(
    server: RenderedServer | None,
    running: dict[str, Any] | None,
    files_changed: bool,
    port: int | None,
    last_started: dict[str, Any] | None = None,
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
        before_argv = running.get("argv") if running else None
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
    if recorded is None and not server.argv and last_started and last_started.get("argv"):
        recorded = last_started
    if server.argv:
        base = list(server.argv)
    elif recorded is not None:
        base = list(recorded["argv"])
    else:
        raise ConfigError(
            "no server is running (by pidfile or on the health port) and server.command is not set",
            key="server.command",
        )
    after = apply_flags(base, server.flags)
    if recorded is not None:
        env = dict(recorded.get("env") or {})
        env.update(server.env)
        replace_env = True if running is not None else bool(recorded.get("replace_env"))
        cwd = server.workdir or recorded.get("cwd")
    else:
        env, replace_env, cwd = dict(server.env), False, server.workdir
    before_argv = running["argv"] if running else []
    restart = files_changed or running is None or after != before_argv
    return ServerChange(
        "process", running, after, cwd, env, replace_env, port, restart,
        flag_changes(before_argv, after),
    )


def make_plan(
    session: HostSession,
    loaded: LoadedPlaybook,
    cli_vars: dict[str, Any],
    *,
    check: bool = False,
    current_release_dir: str | None = None,
) -> HostPlan:
    """Read the host, render the playbook for it, and edit in memory.

    With ``check``, a server that cannot be planned (none running and no
    ``command``) is a note, not an error: ``--check`` is also how one looks
    at a patch on a box whose server is down.
    """
    target = session.target
    pb = loaded.model
    builtins = {"python": (pb.server.python if pb.server and pb.server.python else "python3")}
    variables = merge_vars(pb.vars, target.vars, cli_vars, builtins)
    renderer = make_renderer(loaded)
    # ``{{ command }}`` (commands manager) is only known after planning; see render_commands.
    rendered = render_playbook(pb, loaded.locations, {"command": "", **variables}, renderer)
    port = health_port(rendered.health.base_url if rendered.health else None)
    steps: list[dict[str, Any]] = [
        {"op": "read", "args": {"paths": [f.path for f in rendered.files]}},
    ]
    if rendered.server is not None and rendered.server.manager == "process":
        steps.append(
            {"op": "server_find", "args": {"pidfile": server_pidfile(target, rendered), "port": port}}
        )
    if current_release_dir and rendered.server is not None and rendered.server.manager == "process":
        # what the current release started, in case nothing runs now (same round trip)
        steps.append({"op": "get_json", "args": {"path": f"{current_release_dir}/restore.json"}})
    results = session.call("batch", steps=steps)
    infos = results[0]
    running = results[1] if len(results) > 1 else None
    last_started = (results[2] or {}).get("started") if len(results) > 2 else None
    if rendered.server is not None and rendered.server.manager == "commands":
        running = find_commands_server(session, rendered.server)
    planned: list[PlannedFile] = []
    for i, (rfile, info) in enumerate(zip(rendered.files, infos, strict=False)):
        remote = RemoteFile.from_wire(info)
        key = f"files[{i}].path"
        if not remote.exists:
            raise ConfigError(
                f"{remote.path} does not exist on {target.label}", file=loaded.display, key=key
            )
        try:
            text = remote.data.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(
                f"{remote.path} on {target.label} is not UTF-8 text", file=loaded.display, key=key
            ) from None
        fplan = plan_file(remote.path, text, rfile.edits, comment=rfile.comment)
        if fplan.changed:
            check_structure(fplan, rfile.edits)
        planned.append(PlannedFile(rfile, remote, fplan, i))
    files_changed = any(p.changed for p in planned)
    notes: list[str] = []
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
        before_argv = (server.before or {}).get("argv") or []
        server.flag_changes = flag_changes(
            redact_argv(before_argv, values), redact_argv(server.after_argv or [], values)
        )
    if server is not None and server.manager == "commands":
        render_commands(server, loaded, renderer, variables)
    return HostPlan(target, rendered, loaded, planned, server, variables, notes, refusal)


def render_commands(
    change: ServerChange, loaded: LoadedPlaybook, renderer: Renderer, variables: dict[str, Any]
) -> None:
    """Render ``start``/``stop`` with ``{{ command }}``: the new command line for
    the deploy, the recorded previous one for a restore."""
    spec = loaded.model.server
    assert spec is not None and spec.start and spec.stop

    def words(key: str, raw: str, argv: list[str] | None) -> list[str]:
        where = loaded.locations.where(("server", key))
        command = shlex.join(argv) if argv else ""
        return render_words(raw, {**variables, "command": command}, renderer, **where)

    before_argv = change.before.get("argv") if change.before else None
    change.start = words("start", spec.start, change.after_argv)
    change.restore_start = words("start", spec.start, before_argv or change.after_argv)
    change.stop = words("stop", spec.stop, before_argv)


def find_commands_server(session: HostSession, server: RenderedServer) -> dict[str, Any] | None:
    """With the ``commands`` manager, ``pid`` (or ``status``) says what runs."""
    if server.pid:
        res = session.call("run", argv=list(server.pid), timeout=60.0)
        words = (res["stdout"] or "").split()
        if res["rc"] != 0 or not words or not words[0].isdigit():
            return None
        record: dict[str, Any] | None = session.call("process", pid=int(words[0]))
        return record
    if server.status:
        res = session.call("run", argv=list(server.status), timeout=60.0)
        return {"argv": None, "pid": None, "found_by": "status command"} if res["rc"] == 0 else None
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


def stage_and_validate(session: HostSession, plan: HostPlan, *, keep: bool) -> list[Staged]:
    """Put every changed file beside its target and run ``validate`` on it.

    With ``keep`` false (``--check``) the staged copies are removed in the
    same round trip; on any failure they are removed too. Raises
    ``ValidationError`` naming the file and the validator's own message.
    """
    changed = plan.changed_files
    if not changed:
        return []
    token = secrets.token_hex(4)
    files = [
        {"path": f.path, "data": base64.b64encode(f.new_bytes).decode("ascii")} for f in changed
    ]
    checks = []
    renderer = make_renderer(plan.loaded)
    python = plan.vars.get("python", "python3")
    for f in changed:
        argvs = [
            ["python-syntax"] if step.builtin == "python-syntax"
            else render_validate(step, plan.vars, staged_name(f.remote.real or f.path, token), renderer)
            for step in f.rendered.validate
        ]
        checks.append({"target": f.path, "argvs": argvs, "python": python})
    steps = [ops.stage(files, token, clean_stale=keep), ops.validate(checks, token, keep_staged=keep)]
    try:
        staged_info, results = session.batch(steps)
    except BaseException:
        _remove_quietly(session, [staged_name(f.remote.real or f.path, token) for f in changed])
        raise
    staged_paths = [r["staged"] for r in staged_info]
    failed = [r for r in results if r["rc"] != 0]
    if failed:
        if keep:
            _remove_quietly(session, staged_paths)
        r = failed[0]
        message = (r["stdout"] + r["stderr"]).strip().splitlines()
        first = message[-1] if message else f"exit {r['rc']}"
        f = next(p for p in changed if p.path == r["target"])
        shown = "python-syntax" if r["argv"][1:2] == ["-c"] else " ".join(r["argv"])
        raise ValidationError(
            f"{plan.loaded.display}: files[{f.index}].validate: {shown} failed on the staged "
            f"{r['target']}: {first}"
        )
    return [Staged(f, s) for f, s in zip(changed, staged_paths, strict=True)]


def staged_name(path: str, token: str) -> str:
    """What ``{{ staged }}`` means in a validate command: the helper's name for
    the staged copy of ``path`` (pass the real file of a symlinked target)."""
    directory, _, base = path.rpartition("/")
    stem, dot, ext = base.rpartition(".")
    if not dot or not stem:
        stem, ext = base, ""
    suffix = f".{ext}" if ext else ""
    return f"{directory}/.{stem}.orch-staged-{token}{suffix}"


def _remove_quietly(session: HostSession, paths: list[str]) -> None:
    # Already failing: the original error is the one to report.
    if not session.link_alive:
        return
    with contextlib.suppress(Exception):
        session.run(ops.remove(paths))
