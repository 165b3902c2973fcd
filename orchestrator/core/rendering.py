"""Playbook + vars -> the rendered values the edit engine and the pipeline consume.

After this step nothing downstream sees a template: file paths, inserted
text, command lines (word by word), flag values and health checks are plain
values, each edit carrying the playbook location its errors must name. The
one thing left for later is ``validate`` commands, because ``{{ staged }}``
is only known once the staged copy exists on the host (``render_validate``).
Pure: the renderer's lookup is injected.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from orchestrator.core.cmdline import FlagValue, apply_flags, render_words, split_words
from orchestrator.core.edit_spec import Anchor, EditSpec
from orchestrator.core.flags import FlagRequest
from orchestrator.core.layouts import field_name
from orchestrator.core.models import (
    FLAG_NAME,
    PYTHON_SYNTAX,
    Check,
    Edit,
    FileEntry,
    Gate,
    GateProbe,
    GateRules,
    Health,
    Locations,
    Playbook,
    Server,
)
from orchestrator.core.secrets import secret_names as find_secret_names
from orchestrator.core.target import HostTarget
from orchestrator.core.templating import Renderer
from orchestrator.core.yamlsrc import Loc, load_value
from orchestrator.errors import ConfigError

FORCED_BUILTINS = ("python", "facts")
"""Builtins no var can override: ``{{ python }}`` is always ``server.python`` or python3,
``facts`` what the host said."""


# ----------------------------------------------------------------- vars


def parse_cli_vars(items: Sequence[str | Mapping[str, Any]]) -> dict[str, Any]:
    """``--var k=v`` items to a dict; values read as YAML scalars (``64`` is int 64).

    A mapping in ``items`` is a ``--var @file.yaml`` already read: its
    top-level keys replace earlier ones, in command-line order, so
    ``--var @cluster.yaml --var tp=4`` overrides the file's ``tp``.
    """
    out: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, str):
            out.update(item)
            continue
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name or any(c.isspace() for c in name):
            raise ConfigError(f"expected k=v (got: {item!r})", key="--var")
        try:  # the help says YAML: a value YAML cannot read is a mistake, not a string
            load_value(text, f"--var {name}")  # budgeted: nesting 100,000 deep is refused, not a traceback
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or "not valid YAML"
            raise ConfigError(
                f"value {text!r} is not valid YAML ({problem}); quote it to pass a string: "
                f"--var '{name}=\"...\"'",
                key=f"--var {name}",
            ) from None
        out[name] = yaml_scalar(text)
    return out


def yaml_scalar(text: str) -> Any:
    """``text`` read as a YAML scalar (``"32"`` -> 32, ``"true"`` -> True); else ``text`` itself."""
    if not text.strip():
        return text
    try:
        value = load_value(text, "value")
    except (yaml.YAMLError, ConfigError):
        return text
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return text  # a list or mapping: not a scalar, keep the words as written


def builtin_vars(pb: Playbook) -> dict[str, Any]:
    """Vars orch defines: ``python`` = ``server.python`` or ``python3``."""
    python = pb.server.python if pb.server and pb.server.python else "python3"
    return {"python": python}


def merge_vars(
    playbook_vars: Mapping[str, Any],
    inventory_vars: Mapping[str, Any],
    cli_vars: Mapping[str, Any],
    builtins: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Playbook vars < inventory vars (defaults overlaid by host) < ``--var``.

    Builtins sit underneath everything, except those in ``FORCED_BUILTINS``
    (``python``), which always win: the interpreter that runs the server is
    the one ``{{ python }}`` means.
    """
    builtins = dict(builtins or {})
    merged = {k: v for k, v in builtins.items() if k not in FORCED_BUILTINS}
    merged.update(playbook_vars)
    merged.update(inventory_vars)
    merged.update(cli_vars)
    merged.update({k: v for k, v in builtins.items() if k in FORCED_BUILTINS})
    return merged


def vars_for_host(pb: Playbook, host: HostTarget, cli_vars: Mapping[str, Any]) -> dict[str, Any]:
    """The vars a playbook renders with on ``host`` (its vars: defaults overlaid by its own)."""
    return merge_vars(pb.vars, host.vars, cli_vars, builtin_vars(pb))


# ------------------------------------------------------------ rendered values


@dataclass(frozen=True)
class ValidateStep:
    """One ``validate`` entry: the built-in ``python-syntax`` or a command line template."""

    builtin: str | None
    argv_template: str | None
    file: str | None = None
    line: int | None = None
    key: str | None = None


RenderedEdit = EditSpec | FlagRequest
"""An edit ready for the engine, or an ``add_flag`` that becomes inserts once its file is read."""


@dataclass(frozen=True)
class RenderedFile:
    """One target file with its edits rendered (those whose ``when:`` holds).

    ``index`` is the entry's position in the playbook's ``files`` (entries
    whose ``when:`` is false are left out, so positions can skip).
    """

    path: str
    edits: tuple[RenderedEdit, ...]
    validate: tuple[ValidateStep, ...] = ()
    comment: str | None = None
    file: str | None = None
    line: int | None = None
    key: str | None = None
    index: int = 0


@dataclass(frozen=True)
class RenderedServer:
    """``server`` with every command rendered into argv lists.

    ``argv`` is ``server.command`` as words; ``flags`` still has to be applied
    (``desired_argv``) — to this argv, or to the running server's.
    """

    manager: Literal["process", "commands"]
    argv: list[str] | None
    flags: dict[str, FlagValue] = field(default_factory=dict)
    python: str = "python3"
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    pidfile: str | None = None
    log: str | None = None
    stop_timeout: float = 30.0
    free_timeout: float = 120.0
    start: list[str] | None = None
    stop: list[str] | None = None
    pid: list[str] | None = None
    status: list[str] | None = None
    before_stop: list[str] | None = None  # checked here; rendered with {{ command }} when planned
    after_healthy: list[str] | None = None
    # rendered once the new command line is known (``core.preflight``): the raw
    # ``server.preflight`` and where it is in the playbook
    preflight: str | bool | None = None  # False: no pre-flight
    preflight_where: tuple[str | None, int | None, str | None] = (None, None, None)

    def desired_argv(self, base: Sequence[str] | None = None) -> list[str] | None:
        """``base`` (default: ``argv``) with ``flags`` applied."""
        words = base if base is not None else self.argv
        return apply_flags(words, self.flags) if words is not None else None


@dataclass(frozen=True)
class RenderedCheck:
    """One health request, rendered; ``expect`` values already read as YAML scalars."""

    method: Literal["GET", "POST"]
    path: str
    json: Any = None
    status: int = 200
    expect: dict[str, Any] = field(default_factory=dict)
    body: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RenderedHealth:
    base_url: str
    timeout: float
    interval: float
    confirm_timeout: float
    checks: tuple[RenderedCheck, ...]
    stable_for: float = 0.0


@dataclass(frozen=True)
class RenderedProbe:
    """One probe of a gate: its settings, its body and headers rendered, its rules.

    ``key`` names what the probe measures (route, body, requests,
    concurrency): a release's recorded figures are a baseline for a later
    gate only under the same key.
    """

    label: str
    config: GateProbe
    body: Any
    headers: dict[str, str]
    rules: GateRules

    @property
    def key(self) -> str:
        what = {"post": self.config.post, "body": self.body, "requests": self.config.requests,
                "concurrency": self.config.concurrency}
        return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RenderedGate:
    """``gate:`` rendered: the probes run against ``base_url`` (``health.base_url``)."""

    base_url: str
    probes: tuple[RenderedProbe, ...]
    reprobes: int
    on_inconclusive: Literal["fail", "pass"]


@dataclass(frozen=True)
class RenderedPlaybook:
    name: str
    files: tuple[RenderedFile, ...]
    server: RenderedServer | None
    health: RenderedHealth | None
    vars: dict[str, Any]
    secret_names: frozenset[str]
    keep_releases: int | None = None
    gate: RenderedGate | None = None


# ------------------------------------------------------------------ rendering


class _Ctx:
    """The renderer, vars and locations threaded through one render."""

    def __init__(self, renderer: Renderer, vars: Mapping[str, Any], locations: Locations) -> None:
        self.renderer = renderer
        self.vars = vars
        self.locations = locations

    def where(self, loc: Loc) -> dict[str, Any]:
        return self.locations.where(loc)

    def string(self, text: str, loc: Loc) -> str:
        return self.renderer.render_string(
            text, self.vars, **self.where(loc), source_line=self.locations.content_line(loc)
        )

    def words(self, command: str, loc: Loc) -> list[str]:
        return render_words(command, self.vars, self.renderer, **self.where(loc))

    def holds(self, expression: str | None, loc: Loc) -> bool:
        """A ``when:`` expression's truth (no expression: true)."""
        if expression is None:
            return True
        return bool(self.renderer.evaluate(expression, self.vars, **self.where(loc)))

    def value(self, value: Any, loc: Loc) -> Any:
        """Render every string inside ``value`` (types of non-strings kept)."""
        if isinstance(value, str):
            return self.string(value, loc)
        if isinstance(value, list):
            return [self.value(v, (*loc, i)) for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {k: self.value(v, (*loc, k)) for k, v in value.items()}
        return value


def render_playbook(
    pb: Playbook,
    locations: Locations | None,
    vars: Mapping[str, Any],
    renderer: Renderer,
) -> RenderedPlaybook:
    """Render everything in ``pb`` with ``vars``; ``TemplateError``/``ConfigError`` located."""
    ctx = _Ctx(renderer, vars, locations or pb.locations)
    files = tuple(
        _file(pb, i, entry, ctx)
        for i, entry in enumerate(pb.files)
        if ctx.holds(entry.when, ("files", i, "when"))
    )
    health = _health(pb.health, ctx) if pb.health else None
    return RenderedPlaybook(
        name=pb.name,
        files=files,
        server=_server(pb.server, ctx) if pb.server else None,
        health=health,
        vars=dict(vars),
        secret_names=frozenset(find_secret_names(vars, pb.secrets)),
        keep_releases=pb.keep_releases,
        gate=_gate(pb.gate, health, ctx) if pb.gate and health else None,
    )


def _file(pb: Playbook, index: int, entry: FileEntry, ctx: _Ctx) -> RenderedFile:
    base: Loc = ("files", index)
    path = ctx.string(entry.path, (*base, "path")).strip()
    if not path:
        raise ConfigError("path renders to nothing", **ctx.where((*base, "path")))
    edits = tuple(
        _edit(pb, entry, (*base, "edits", j), edit, ctx, f"{pb.name}:{index}.{j}")
        for j, edit in enumerate(entry.edits)
        if ctx.holds(edit.when, (*base, "edits", j, "when"))
    )
    steps: list[ValidateStep] = []
    for k, item in enumerate(entry.validate_):
        where = ctx.where((*base, "validate", k))
        if item.strip() == PYTHON_SYNTAX:
            steps.append(ValidateStep(builtin=PYTHON_SYNTAX, argv_template=None, **where))
        else:
            try:  # a quoting mistake is reported now, not after staging on the host
                split_words(item)
            except ConfigError as exc:
                raise exc.located(**where) from None
            steps.append(ValidateStep(builtin=None, argv_template=item, **where))
    return RenderedFile(
        path=path,
        edits=edits,
        validate=tuple(steps),
        comment=entry.comment,
        index=index,
        **ctx.where((*base, "path")),
    )


def render_paths(
    pb: Playbook, locations: Locations | None, vars: Mapping[str, Any], renderer: Renderer
) -> list[str]:
    """Every ``files[].path``, rendered (``when:`` not looked at): what to read from the host."""
    ctx = _Ctx(renderer, vars, locations or pb.locations)
    return [ctx.string(entry.path, ("files", i, "path")).strip() for i, entry in enumerate(pb.files)]


_STRUCTURAL = {
    "after_field": ("after", "field"),
    "before_field": ("before", "field"),
    "after_call": ("after", "call"),
    "before_call": ("before", "call"),
    "after_item": ("after", "item"),
    "before_item": ("before", "item"),
}


def _anchor(edit: Edit, key: str, loc: Loc, ctx: _Ctx) -> Anchor:
    """The anchor under ``key``, its strings rendered (anchors are templates too)."""
    if key in _STRUCTURAL:
        side, kind = _STRUCTURAL[key]
        if kind == "call":
            call = getattr(edit, key)
            return Anchor(
                side,  # type: ignore[arg-type]
                ctx.string(call.func, (*loc, key, "func")),
                kind="call",
                arg=ctx.string(call.arg, (*loc, key, "arg")) if call.arg is not None else None,
            )
        if kind == "item":
            return Anchor(
                side,  # type: ignore[arg-type]
                ctx.string(str(edit.into), (*loc, "into")),
                kind="item",
                arg=ctx.string(str(getattr(edit, key)), (*loc, key)),
            )
        return Anchor(side, ctx.string(str(getattr(edit, key)), (*loc, key)), kind="field")  # type: ignore[arg-type]
    return Anchor(
        side="before" if key.startswith("before") else "after",
        pattern=ctx.string(str(getattr(edit, key)), (*loc, key)),
        regex=key.endswith("_regex"),
    )


def _flag_field(value: str, ctx: _Ctx, loc: Loc) -> str:
    """A rendered ``add_flag`` name as its field name; anything else is refused at ``loc``."""
    value = value.strip()
    if not FLAG_NAME.fullmatch(value):
        raise ConfigError(f"expected a field name or a --flag (got: {value!r})", **ctx.where(loc))
    return field_name(value)


def _flag(edit: Edit, loc: Loc, ctx: _Ctx, common: dict[str, Any]) -> FlagRequest:
    flag = edit.add_flag
    assert flag is not None
    base = (*loc, "add_flag")
    default = flag.default
    if isinstance(default, str):
        default = ctx.string(default, (*base, "default"))
        if flag.type != "str":
            default = yaml_scalar(default)
    kinds: dict[str, type | tuple[type, ...]] = {"int": int, "float": (int, float), "str": str, "bool": bool}
    expected = kinds[flag.type]
    if default is not None and (
        not isinstance(default, expected) or (flag.type != "bool" and isinstance(default, bool))
    ):
        raise ConfigError(f"default {default!r} is not a {flag.type}", **ctx.where((*base, "default")))
    name = _flag_field(ctx.string(flag.name, (*base, "name")), ctx, (*base, "name"))
    near_locs: list[Loc] = (
        [(*base, "near", i) for i in range(len(flag.near))] if isinstance(flag.near, list) else [(*base, "near")]
    )
    near = tuple(
        _flag_field(ctx.string(one, at), ctx, at) for one, at in zip(flag.near_names, near_locs, strict=True)
    )
    return FlagRequest(
        name=name,
        type=flag.type,
        default=float(default) if flag.type == "float" and isinstance(default, int | float) else default,
        help=ctx.string(flag.help, (*base, "help")),
        near=near,
        **common,
        **ctx.where(base),
    )


def _edit(
    pb: Playbook, entry: FileEntry, loc: Loc, edit: Edit, ctx: _Ctx, default_id: str
) -> RenderedEdit:
    kind_key = edit.kind_key
    kind_loc = (*loc, kind_key)
    markers = edit.markers if edit.markers is not None else entry.markers
    common: dict[str, Any] = {"markers": markers, "marker_id": edit.id or default_id}
    if kind_key == "add_flag":
        return _flag(edit, loc, ctx, common)
    if kind_key in ("insert", "content"):
        anchor_key = edit.anchor_key or "after"
        if kind_key == "insert":
            text = ctx.renderer.render_template(str(edit.insert), ctx.vars, **ctx.where(kind_loc))
        else:
            text = ctx.string(str(edit.content), kind_loc)
        anchor = _anchor(edit, anchor_key, loc, ctx)
        where_key = "into" if anchor_key.endswith("_item") else anchor_key
        return EditSpec(
            kind="insert", text=text, anchor=anchor, **common, **ctx.where((*loc, where_key))
        )
    if kind_key in ("replace", "replace_regex"):
        text = ctx.string(str(edit.with_), (*loc, "with"))
        return EditSpec(
            kind="replace",
            text=text,
            pattern=str(getattr(edit, kind_key)),
            regex=kind_key == "replace_regex",
            count=edit.count,
            **common,
            **ctx.where(kind_loc),
        )
    if kind_key in ("delete", "delete_regex"):
        anchor = Anchor(
            side="after",
            pattern=ctx.string(str(getattr(edit, kind_key)), kind_loc),
            regex=kind_key == "delete_regex",
        )
        return EditSpec(kind="delete", anchor=anchor, **common, **ctx.where(kind_loc))
    diff = ctx.renderer.source(str(edit.patch), **ctx.where(kind_loc))
    return EditSpec(kind="patch", text=diff, **common, **ctx.where(kind_loc))


def _server(server: Server, ctx: _Ctx) -> RenderedServer:
    base: Loc = ("server",)

    def words(name: str) -> list[str] | None:
        command = getattr(server, name)
        return ctx.words(command, (*base, name)) if command else None

    def text(name: str) -> str | None:
        value = getattr(server, name)
        return ctx.string(value, (*base, name)) if value is not None else None

    flags: dict[str, FlagValue] = {
        name: ctx.value(value, (*base, "flags", name)) for name, value in server.flags.items()
    }
    return RenderedServer(
        manager=server.manager,
        argv=words("command"),
        flags=flags,
        python=server.python or "python3",
        workdir=text("workdir"),
        env={k: ctx.string(v, (*base, "env", k)) for k, v in server.env.items()},
        pidfile=text("pidfile"),
        log=text("log"),
        stop_timeout=server.stop_timeout,
        free_timeout=server.free_timeout,
        start=words("start"),
        stop=words("stop"),
        pid=words("pid"),
        status=words("status"),
        before_stop=words("before_stop"),
        after_healthy=words("after_healthy"),
        preflight=server.preflight,
        preflight_where=tuple(ctx.where((*base, "preflight")).values()),  # type: ignore[arg-type]
    )


def _health(health: Health, ctx: _Ctx) -> RenderedHealth:
    base: Loc = ("health",)
    return RenderedHealth(
        base_url=ctx.string(health.base_url, (*base, "base_url")).rstrip("/"),
        timeout=health.timeout,
        interval=health.interval,
        confirm_timeout=health.confirm_timeout,
        stable_for=health.stable_for,
        checks=tuple(_check(c, (*base, "checks", i), ctx) for i, c in enumerate(health.checks)),
    )


def _check(check: Check, loc: Loc, ctx: _Ctx) -> RenderedCheck:
    method_key = "get" if check.get is not None else "post"
    return RenderedCheck(
        method=check.method,
        path=ctx.string(check.path, (*loc, method_key)),
        json=ctx.value(check.json_, (*loc, "json")),
        status=check.status,
        expect={k: _scalars(ctx.value(v, (*loc, "expect", k))) for k, v in check.expect.items()},
        body=ctx.string(check.body, (*loc, "body")) if check.body is not None else None,
        headers={k: ctx.string(v, (*loc, "headers", k)) for k, v in check.headers.items()},
    )


def _gate(gate: Gate, health: RenderedHealth, ctx: _Ctx) -> RenderedGate:
    probes = []
    for i, probe in enumerate(gate.probes):
        loc: Loc = ("gate", "probes", i)
        probes.append(RenderedProbe(
            label=probe.label,
            config=probe,
            body=ctx.value(probe.json_, (*loc, "json")),
            headers={k: ctx.string(v, (*loc, "headers", k)) for k, v in probe.headers.items()},
            rules=gate.rules_of(probe),
        ))
    return RenderedGate(health.base_url, tuple(probes), gate.reprobes, gate.on_inconclusive)


def _scalars(value: Any) -> Any:
    """Strings (already rendered) read as YAML scalars, recursively."""
    if isinstance(value, str):
        return yaml_scalar(value)
    if isinstance(value, list):
        return [_scalars(v) for v in value]
    if isinstance(value, dict):
        return {k: _scalars(v) for k, v in value.items()}
    return value


def render_validate(
    step: ValidateStep, vars: Mapping[str, Any], staged: str, renderer: Renderer
) -> list[str]:
    """The argv of a command ``validate`` step for the staged copy at ``staged``.

    Returns ``[]`` for the built-in (the caller runs ``python-syntax`` itself).
    """
    if step.builtin or not step.argv_template:
        return []
    return render_words(
        step.argv_template,
        {**vars, "staged": staged},
        renderer,
        file=step.file,
        line=step.line,
        key=step.key,
    )


__all__ = [
    "RenderedCheck",
    "RenderedFile",
    "RenderedGate",
    "RenderedHealth",
    "RenderedPlaybook",
    "RenderedProbe",
    "RenderedServer",
    "ValidateStep",
    "builtin_vars",
    "merge_vars",
    "parse_cli_vars",
    "render_paths",
    "render_playbook",
    "render_validate",
    "vars_for_host",
    "yaml_scalar",
]
