"""The inventory and playbook as typed models, and their parsers.

Every model forbids unknown keys: a typo'd ``aftr:`` must be an error naming
it, never an edit silently anchored nowhere. ``parse_inventory`` and
``parse_playbook`` turn pydantic's error list into one ``ConfigError``
``file:line: key.path: message`` for the first problem, with the line found by
``yamlsrc``. Pure: text in, models out.
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from orchestrator.core.cmdline import FlagValue
from orchestrator.core.durations import Duration
from orchestrator.core.selection import expand_group_members, expand_inventory_hosts
from orchestrator.core.yamlsrc import Loc, SourceDoc, key_path, load_yaml
from orchestrator.errors import ConfigError

# The gate's rules are judged on both sides, so their names are defined once in the host
# package (stdlib only); these models validate a playbook's ``gate:`` and hand rules over.
from orchestrator.host.gate import BOUND_KINDS as BOUND_KINDS
from orchestrator.host.gate import FIGURE_RULES as FIGURE_RULES
from orchestrator.host.gate import GateRules as HostGateRules

PYTHON_SYNTAX = "python-syntax"
"""The built-in ``validate`` step: compile the staged file without writing bytecode."""


class LocatedProblem(Exception):  # noqa: N818 - not an error users see; carries a location
    """Raised by a validator that knows a more precise location than pydantic would give.

    Deliberately not a ``ValueError``: pydantic lets it through unwrapped, and
    the parser turns it into a ``ConfigError`` at ``loc``.
    """

    def __init__(self, loc: Loc, message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _empty_means_default(cls, data: Any) -> Any:
        """``vars:`` with nothing after it is YAML null; read it as the empty default."""
        if isinstance(data, dict):
            empty = {
                key for key, value in data.items() if value is None and _collection_field(cls, key)
            }
            if empty:
                return {k: v for k, v in data.items() if k not in empty}
        return data


def _collection_field(model: type[BaseModel], key: Any) -> bool:
    for name, field in model.model_fields.items():
        if (field.alias or name) == key:
            return field.default_factory is not None
    return False


# ---------------------------------------------------------------- inventory

Connection = Literal["ssh", "local"]


def _scalar_to_str(value: Any) -> Any:
    """YAML reads ``CUDA_VISIBLE_DEVICES: 0`` as an int; env values are strings."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


StrValue = Annotated[str, BeforeValidator(_scalar_to_str)]


class HostSettings(_Model):
    """What ``defaults`` and each host may set; ``None`` = not set here."""

    user: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str | None = None
    become: bool | None = None
    state_dir: str | None = Field(default=None, min_length=1)
    vars: dict[str, Any] = Field(default_factory=dict)
    python: str | None = Field(default=None, min_length=1)
    keep_releases: int | None = Field(default=None, ge=1)
    connection: Connection | None = None


class Defaults(HostSettings):
    """Inventory ``defaults``: every host inherits these."""


class HostEntry(HostSettings):
    """One inventory host. Without ``address``, the host's name is its address."""

    address: str | None = Field(default=None, min_length=1)


class Inventory(_Model):
    """``inventory.yaml``. Everything optional: no inventory at all is valid."""

    defaults: Defaults = Field(default_factory=Defaults)
    hosts: dict[str, HostEntry] = Field(default_factory=dict)
    groups: dict[str, list[str]] = Field(default_factory=dict)

    @field_validator("hosts", mode="before")
    @classmethod
    def _hosts_may_be_bare(cls, value: Any) -> Any:
        """``hosts: {gpu1:}`` (no settings) means a host with nothing of its own."""
        if isinstance(value, dict):
            return {name: {} if entry is None else entry for name, entry in value.items()}
        return value

    @model_validator(mode="after")
    def _expand_ranges_and_check_members(self) -> Inventory:
        """``gpu[01:50]`` in ``hosts`` and in a group's list stands for ``gpu01`` … ``gpu50``
        (``core.selection``): expanded here, so everything after the parser sees names."""
        try:
            self.hosts = expand_inventory_hosts(
                self.hosts, has_address={name: e.address is not None for name, e in self.hosts.items()})
        except ConfigError as exc:
            raise LocatedProblem(("hosts", (exc.key or "").removeprefix("hosts.")), exc.message) from None
        for group, members in self.groups.items():
            if group in self.hosts:
                raise LocatedProblem(("groups", group), f"group '{group}' has a host's name")
            expanded: list[str] = []
            for index, member in enumerate(members):
                try:
                    names = expand_group_members([member], key=f"groups.{group}")
                except ConfigError as exc:
                    raise LocatedProblem(("groups", group, index), exc.message) from None
                for name in names:
                    if name not in self.hosts:
                        raise LocatedProblem(
                            ("groups", group, index),
                            f"group '{group}' lists unknown host '{name}'",
                        )
                expanded.extend(n for n in names if n not in expanded)
            self.groups[group] = expanded
        return self


# ---------------------------------------------------------------- locations


@dataclass(frozen=True)
class Locations:
    """Where keys sit in the parsed file, for errors raised after validation."""

    file: str
    doc: SourceDoc | None

    def line(self, loc: Loc) -> int | None:
        return self.doc.line_of(loc) if self.doc else None

    def content_line(self, loc: Loc) -> int | None:
        return self.doc.content_line_of(loc) if self.doc else None

    def where(self, loc: Loc) -> dict[str, Any]:
        """``file``, ``line`` and ``key`` keyword arguments for an error at ``loc``."""
        return {"file": self.file, "line": self.line(loc), "key": key_path(loc) or None}


# ----------------------------------------------------------------- playbook


def _regex(value: str | None) -> str | None:
    if value is not None:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"bad regex: {exc}") from None
    return value


EDIT_KINDS = (
    "insert",
    "content",
    "replace",
    "replace_regex",
    "delete",
    "delete_regex",
    "patch",
    "add_flag",
)
ANCHOR_KEYS = (
    "after",
    "before",
    "after_regex",
    "before_regex",
    "after_field",
    "before_field",
    "after_call",
    "before_call",
    "after_item",
    "before_item",
)
FLAG_TYPES = ("int", "float", "str", "bool")
FLAG_NAME = re.compile(r"(--)?[A-Za-z_][A-Za-z0-9_-]*")
SECRET_ENTRY = re.compile(r"(--)?[A-Za-z_][A-Za-z0-9_.-]*")
"""An entry of ``secrets:``: a var, env var, flag or header name."""
"""What ``add_flag``'s ``name`` and ``near`` look like: a field name or a ``--flag``."""


def _got(names: Sequence[str]) -> str:
    if not names:
        return "none"
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]


def _call_anchor(value: Any) -> Any:
    """``after_call: "--flag"`` is short for ``{func: add_argument, arg: "--flag"}``."""
    if isinstance(value, str):
        return {"func": "add_argument", "arg": value}
    return value


class CallAnchor(_Model):
    """A call named by its function (``parser.add_argument``; bare ``add_argument``: any
    receiver) and the string its first argument must be."""

    func: str = Field(min_length=1)
    arg: str | None = Field(default=None, min_length=1)


def _flag_word(value: str) -> str:
    """A field name or a ``--flag`` (a template is checked once rendered)."""
    stem = value.strip()
    if "{" not in stem and not FLAG_NAME.fullmatch(stem):
        raise ValueError(f"expected a field name or a --flag (got: {value!r})")
    return stem


class FlagEdit(_Model):
    """``add_flag``: a new server flag, declared the way the file's release declares flags.

    ``name`` is the field (``speculative_disable_batch_threshold``) or the flag
    (``--speculative-disable-batch-threshold``); ``near`` the neighbouring
    flag it goes after, in either form, or a list of them: the first the file
    declares wins (older releases lack the newer neighbours).
    """

    name: str = Field(min_length=1)
    type: Literal["int", "float", "str", "bool"] = "str"
    default: Any = None
    help: str = ""
    near: str | list[str] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _flag_like(cls, value: str) -> str:
        return _flag_word(value)

    @field_validator("near")
    @classmethod
    def _flags_like(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, str):
            return _flag_word(value)
        return [_flag_word(one) for one in value]

    @property
    def near_names(self) -> list[str]:
        """``near`` as a list, in the playbook's order."""
        return [self.near] if isinstance(self.near, str) else list(self.near)

    @model_validator(mode="after")
    def _default_fits(self) -> FlagEdit:
        if self.default is None or isinstance(self.default, str) and "{" in self.default:
            return self  # none, or a template rendered later
        ok = {
            "int": isinstance(self.default, int) and not isinstance(self.default, bool),
            "float": isinstance(self.default, int | float) and not isinstance(self.default, bool),
            "str": isinstance(self.default, str),
            "bool": isinstance(self.default, bool),
        }[self.type]
        if not ok:
            raise ValueError(f"default {self.default!r} is not a {self.type}")
        return self


class Edit(_Model):
    """One edit of a file: exactly one kind key, plus what that kind needs."""

    insert: str | None = Field(default=None, min_length=1)
    content: str | None = None
    replace: str | None = Field(default=None, min_length=1)
    replace_regex: str | None = Field(default=None, min_length=1)
    delete: str | None = Field(default=None, min_length=1)
    delete_regex: str | None = Field(default=None, min_length=1)
    patch: str | None = Field(default=None, min_length=1)
    add_flag: FlagEdit | None = None
    after: str | None = Field(default=None, min_length=1)
    before: str | None = Field(default=None, min_length=1)
    after_regex: str | None = Field(default=None, min_length=1)
    before_regex: str | None = Field(default=None, min_length=1)
    after_field: str | None = Field(default=None, min_length=1)
    before_field: str | None = Field(default=None, min_length=1)
    after_call: Annotated[CallAnchor | None, BeforeValidator(_call_anchor)] = None
    before_call: Annotated[CallAnchor | None, BeforeValidator(_call_anchor)] = None
    into: str | None = Field(default=None, min_length=1)
    after_item: str | None = Field(default=None, min_length=1)
    before_item: str | None = Field(default=None, min_length=1)
    with_: str | None = Field(default=None, alias="with")
    count: int = Field(1, ge=1)
    markers: bool | None = None
    id: str | None = Field(default=None, min_length=1, pattern=r"^\S+$")
    when: str | None = Field(default=None, min_length=1)

    _check_regexes = field_validator(
        "replace_regex", "delete_regex", "after_regex", "before_regex"
    )(_regex)

    @field_validator("after_item", "before_item", mode="before")
    @classmethod
    def _item_text(cls, value: Any) -> Any:
        """An element may be written as a number or a bare word: it is compared as text."""
        return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value

    @property
    def kind_key(self) -> str:
        """The one kind key this edit uses (``insert``, ``content``, ``replace`` …)."""
        return next(k for k in EDIT_KINDS if getattr(self, k) is not None)

    @property
    def anchor_key(self) -> str | None:
        """The anchor key of an insert, if any."""
        return next((k for k in ANCHOR_KEYS if getattr(self, k) is not None), None)

    @model_validator(mode="after")
    def _one_kind(self) -> Edit:
        kinds = [k for k in EDIT_KINDS if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"expected one of {', '.join(EDIT_KINDS)} (got: {_got(kinds)})")
        kind = kinds[0]
        anchors = [k for k in ANCHOR_KEYS if getattr(self, k) is not None]
        if kind in ("insert", "content"):
            if len(anchors) != 1:
                raise ValueError(
                    f"{kind} needs exactly one of {', '.join(ANCHOR_KEYS)} (got: {_got(anchors)})"
                )
        elif anchors:
            raise ValueError(f"{anchors[0]} is only for insert and content, not {kind}")
        item = anchors[0].endswith("_item") if anchors else False
        if item and self.into is None:
            raise ValueError(f"{anchors[0]} needs into: (the list, tuple, set or dict it is an element of)")
        if self.into is not None and not item:
            raise ValueError("into is only with after_item or before_item")
        if kind in ("replace", "replace_regex"):
            if self.with_ is None:
                raise ValueError(f"{kind} needs with: (the replacement text)")
        else:
            if self.with_ is not None:
                raise ValueError(f"with is only for replace and replace_regex, not {kind}")
            if "count" in self.model_fields_set:
                raise ValueError(f"count is only for replace and replace_regex, not {kind}")
        return self


def _normalise_validate(value: Any) -> Any:
    """Accept ``[python-syntax, "cmd"]``, ``"cmd"``, ``{commands: [...]}`` and mixes."""
    if value is None:
        return []
    if isinstance(value, str | dict):
        value = [value]
    if not isinstance(value, list):
        raise ValueError("expected a list of checks: python-syntax or command lines")
    out: list[Any] = []
    for item in value:
        if isinstance(item, dict):
            extra = [k for k in item if k != "commands"]
            if extra:
                raise ValueError(f"unknown key '{extra[0]}' (expected: commands)")
            commands = item.get("commands") or []
            if isinstance(commands, str):
                commands = [commands]
            if not isinstance(commands, list):
                raise ValueError("commands: expected a list of command lines")
            out.extend(commands)
        else:
            out.append(item)
    for item in out:
        if not isinstance(item, str) or not item.strip():
            raise ValueError(f"expected python-syntax or a command line (got: {item!r})")
    return out


class FileEntry(_Model):
    """One target file: its (templated) path, its edits, how to check the result."""

    path: str = Field(min_length=1)
    edits: list[Edit] = Field(min_length=1)
    validate_: Annotated[list[str], BeforeValidator(_normalise_validate)] = Field(
        default_factory=list, alias="validate"
    )
    markers: bool = True
    comment: str | None = Field(default=None, min_length=1)
    when: str | None = Field(default=None, min_length=1)


def _check_flag_value(value: Any) -> Any:
    scalar = (str, int, float, bool)
    if value is None or isinstance(value, scalar):
        return value
    if isinstance(value, list) and all(
        isinstance(v, scalar) and not isinstance(v, bool) for v in value
    ):
        return value
    raise ValueError(
        "a flag value is a string, a number, true/false, null or a list of strings and numbers"
    )


CheckedFlagValue = Annotated[FlagValue, BeforeValidator(_check_flag_value)]


class Server(_Model):
    """How the inference server is run: ``process`` (orch starts it) or ``commands``.

    ``command`` is optional: without it, ``flags`` are applied to the command
    line of the server running now (found by pidfile or health port).
    ``before_stop``/``after_healthy`` are hooks around the restart (drain the
    host from a router, put it back).
    ``preflight`` is a command that runs the server's own argument parser on
    the new command line without starting a server (``{{ argv }}`` as a word
    of its own is the new command line's words, ``{{ command }}`` the same,
    shell-quoted, as one word); without it orch uses a default for the servers
    it knows (``core.preflight``); ``preflight: false`` runs none.
    """

    manager: Literal["process", "commands"] = "process"
    command: str | None = Field(default=None, min_length=1)
    flags: dict[str, CheckedFlagValue] = Field(default_factory=dict)
    python: str | None = Field(default=None, min_length=1)
    workdir: str | None = Field(default=None, min_length=1)
    env: dict[str, StrValue] = Field(default_factory=dict)
    pidfile: str | None = Field(default=None, min_length=1)
    log: str | None = Field(default=None, min_length=1)
    stop_timeout: Duration = 30.0
    free_timeout: Duration = 120.0  # after the stop: wait this long for the port and GPUs to be released
    start: str | None = Field(default=None, min_length=1)
    stop: str | None = Field(default=None, min_length=1)
    pid: str | None = Field(default=None, min_length=1)
    status: str | None = Field(default=None, min_length=1)
    preflight: str | bool | None = None  # a command; false: none; unset/true: the built-in one
    preflight_timeout: Duration = 120.0  # the parser imports the server's modules: seconds, on a big box
    # Hooks around the restart, rendered like ``start`` (``{{ command }}``: the command
    # line): take the host out of a router before the stop, put it back once healthy
    # (a restore puts it back too). A failing before_stop stops nothing.
    before_stop: str | None = Field(default=None, min_length=1)
    after_healthy: str | None = Field(default=None, min_length=1)
    hook_timeout: Duration = 300.0

    @field_validator("preflight", mode="after")
    @classmethod
    def _preflight(cls, value: str | bool | None) -> str | bool | None:
        if isinstance(value, str) and not value.strip():
            raise ValueError("must not be empty (false turns the pre-flight off)")
        return None if value is True else value

    @field_validator("flags", mode="after")
    @classmethod
    def _flag_names(cls, flags: dict[str, Any]) -> dict[str, Any]:
        for name in flags:
            if not name.startswith("-") or name.strip("-") == "" or "=" in name or " " in name:
                raise ValueError(f"a flag name looks like --name (got: {name!r})")
        return flags

    @model_validator(mode="after")
    def _manager_needs(self) -> Server:
        if self.manager == "process":
            # without `command:`, flags apply to the command line of the server running now
            given = [k for k in ("start", "stop", "pid", "status") if getattr(self, k)]
            if given:
                raise ValueError(f"{given[0]} is only for manager: commands")
        else:
            missing = [k for k in ("start", "stop") if not getattr(self, k)]
            if missing:
                raise ValueError(f"manager commands needs {' and '.join(missing)}:")
            if not (self.pid or self.status):
                raise ValueError("manager commands needs pid: or status:")
        return self


def _path(value: Any) -> Any:
    if isinstance(value, str) and not value.startswith("/"):
        raise ValueError(f"a path starting with / (got: {value!r})")
    return value


HttpPath = Annotated[str, BeforeValidator(_path)]


class Check(_Model):
    """One health request and what its answer must look like."""

    get: HttpPath | None = None
    post: HttpPath | None = None
    json_: Any = Field(default=None, alias="json")
    status: int = Field(200, ge=100, le=599)
    expect: dict[str, Any] = Field(default_factory=dict)
    body: str | None = None
    headers: dict[str, StrValue] = Field(default_factory=dict)

    _check_body = field_validator("body")(_regex)

    @property
    def method(self) -> Literal["GET", "POST"]:
        return "GET" if self.get is not None else "POST"

    @property
    def path(self) -> str:
        return self.get if self.get is not None else (self.post or "/")

    @model_validator(mode="after")
    def _one_method(self) -> Check:
        methods = [k for k in ("get", "post") if getattr(self, k) is not None]
        if len(methods) != 1:
            raise ValueError(f"expected one of get, post (got: {_got(methods)})")
        if self.get is not None and "json_" in self.model_fields_set:
            raise ValueError("json is only for post")
        return self


class Health(_Model):
    """How to tell the server is healthy, and how long to wait for it."""

    base_url: str
    timeout: Duration = 900.0
    interval: Duration = 1.0
    confirm_timeout: Duration = 60.0
    stable_for: Duration = 5.0  # after the first pass, the checks must keep passing this long
    checks: list[Check] = Field(min_length=1)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"expected an http:// or https:// URL (got: {value!r})")
        return value.rstrip("/")

    @field_validator("interval")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("interval must be more than 0")
        return value


# --------------------------------------------------------- probe and gate


class ProbeConfig(_Model):
    """``probe:`` in a nightly spec, and the base of each of a gate's probes.

    ``post`` is the route (``/generate`` or ``/v1/completions`` …), ``json``
    the body sent as is by every request; ``timeout`` bounds each request.
    ``warmup`` requests are sent first and not counted. ``rounds`` repeats
    the whole measurement so the figures come with a spread. ``greedy: false``
    skips the fingerprint request. (The figures: ``core.probe``.)
    """

    post: HttpPath
    json_: Any = Field(default=None, alias="json")
    requests: int = Field(64, ge=1, le=100_000)
    concurrency: int = Field(8, ge=1, le=1024)
    warmup: int = Field(0, ge=0, le=100_000)
    rounds: int = Field(1, ge=1, le=50)
    timeout: Duration = 60.0
    headers: dict[str, StrValue] = Field(default_factory=dict)
    greedy: bool = True

    @model_validator(mode="after")
    def _body_is_object(self) -> ProbeConfig:
        if self.json_ is not None and not isinstance(self.json_, dict):
            raise ValueError("json must be a mapping (the request body)")
        if self.timeout <= 0:
            raise ValueError("timeout must be more than 0")
        return self


class Bounds(_Model):
    """The bounds one figure must keep: against the baseline (``min_ratio``,
    ``max_ratio``) or absolute (``min``, ``max``, in the figure's own unit)."""

    min_ratio: float | None = Field(default=None, gt=0)
    max_ratio: float | None = Field(default=None, gt=0)
    min: float | None = Field(default=None, ge=0)
    max: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _some_bound(self) -> Bounds:
        if all(getattr(self, k) is None for k in BOUND_KINDS):
            raise ValueError(f"expected at least one of {', '.join(BOUND_KINDS)}")
        return self


class GateRules(_Model):
    """A playbook's ``rules:``, validated where they are written; the host judges by
    ``host.gate.GateRules`` (``to_host``), whose docstring says what each rule means."""

    tokens_per_s: Bounds | None = None
    requests_per_s: Bounds | None = None
    p50_ms: Bounds | None = None
    p99_ms: Bounds | None = None
    errors: int | None = Field(default=None, ge=0)
    greedy: Literal["same"] | None = None

    @property
    def empty(self) -> bool:
        return all(getattr(self, k) is None for k in type(self).model_fields)

    def to_wire(self) -> dict[str, Any]:
        """The rules set, as a playbook writes them and ``host.gate.GateRules.from_wire`` reads them."""
        return self.model_dump(exclude_none=True)  # python mode: an infinite bound stays one

    def to_host(self) -> HostGateRules:
        """The host's dataclass of these rules (what ``host.gate.check_probe`` judges by),
        through the wire form: a rule the host's reader would not take fails here, in tests."""
        return HostGateRules.from_wire(self.to_wire())


class GateProbe(ProbeConfig):
    """One probe of a gate: a ``ProbeConfig`` with a name, 3 rounds by default,
    and, optionally, rules of its own (instead of the gate's)."""

    name: str | None = Field(default=None, min_length=1, pattern=r"^[^\s]+$")
    rounds: int = Field(3, ge=1, le=50)
    rules: GateRules | None = None

    @property
    def label(self) -> str:
        """The probe's name in tables and messages: ``name``, else ``/route@concurrency``."""
        return self.name or f"{self.post}@{self.concurrency}"


class Gate(_Model):
    """``gate:``: probe the server before and after, and roll back unless the rules hold.

    A rule's verdict is ``inconclusive`` when the difference is inside the
    measured spread; then the new server is probed again, up to
    ``reprobes`` times, and a verdict still inconclusive counts as
    ``on_inconclusive`` (``fail`` unless set to ``pass``). See docs/GATE.md.
    """

    probes: list[GateProbe] = Field(min_length=1)
    rules: GateRules | None = None
    reprobes: int = Field(1, ge=0, le=10)
    on_inconclusive: Literal["fail", "pass"] = "fail"

    def rules_of(self, probe: GateProbe) -> GateRules:
        """The rules ``probe`` is judged by: its own, else the gate's."""
        return probe.rules or self.rules or GateRules()

    @model_validator(mode="after")
    def _every_probe_judged(self) -> Gate:
        labels: set[str] = set()
        for i, probe in enumerate(self.probes):
            rules = self.rules_of(probe)
            if rules.empty:
                if probe.rules is not None:
                    where: Loc = ("gate", "probes", i, "rules")
                else:
                    where = ("gate", "rules") if self.rules is not None else ("gate",)
                raise LocatedProblem(where, f"no rules for probe {probe.label}: nothing would be checked")
            if rules.greedy and not probe.greedy:
                raise LocatedProblem(("gate", "probes", i, "greedy"),
                                     "greedy: same needs the probe's greedy request (greedy: true)")
            if probe.label in labels:
                raise LocatedProblem(("gate", "probes", i),
                                     f"two probes are named {probe.label}: give each its own name:")
            labels.add(probe.label)
        return self


class Playbook(_Model):
    """A playbook: edits to files, the server to restart, the checks to pass."""

    name: str = Field(min_length=1)
    vars: dict[str, Any] = Field(default_factory=dict)
    secrets: list[str] = Field(default_factory=list)
    keep_releases: int | None = Field(default=None, ge=1)
    files: list[FileEntry] = Field(default_factory=list)
    server: Server | None = None
    health: Health | None = None
    gate: Gate | None = None

    _locations: Locations | None = PrivateAttr(default=None)

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, value: list[str]) -> list[str]:
        """Names, not values: a var, and the env var, ``--flag`` or header of the same name
        (``hf_token`` is ``HF_TOKEN`` and ``--hf-token`` too). A value pasted here by mistake
        would be printed in the error, so the message does not quote it."""
        for i, name in enumerate(value):
            if not SECRET_ENTRY.fullmatch(name):
                raise LocatedProblem(("secrets", i), "expected the name of a var, env var, --flag or "
                                                      "header (letters, digits, _ . -), not a value")
        return value

    @model_validator(mode="after")
    def _gate_needs_a_restart_and_health(self) -> Playbook:
        if self.gate is not None:
            missing = [k for k in ("server", "health") if getattr(self, k) is None]
            if missing:
                raise LocatedProblem(("gate",), f"a gate needs {' and '.join(missing)}: (it probes the "
                                                "restarted server at health.base_url)")
        return self

    @property
    def locations(self) -> Locations:
        """Where each key came from (empty when built in code, not parsed)."""
        return self._locations or Locations(file="<playbook>", doc=None)


# ------------------------------------------------------------------ parsing

M = TypeVar("M", bound=BaseModel)


def parse_inventory(text: str, filename: str) -> Inventory:
    """Parse ``inventory.yaml`` text; one ``ConfigError`` for the first problem."""
    return _parse(Inventory, text, filename)


def parse_playbook(text: str, filename: str) -> Playbook:
    """Parse a playbook; the result keeps its ``locations`` for later errors."""
    return _parse(Playbook, text, filename)


def _parse(model: type[M], text: str, filename: str) -> M:
    doc = load_yaml(text, filename)
    data = {} if doc.data is None else doc.data
    try:
        result = model.model_validate(data)
    except ValidationError as exc:
        raise _config_error(exc, doc, model) from None
    except LocatedProblem as exc:
        raise ConfigError(
            exc.message, file=filename, line=doc.line_of(exc.loc), key=key_path(exc.loc) or None
        ) from None
    if "_locations" in getattr(type(result), "__private_attributes__", {}):
        # a playbook, a nightly spec: the private attribute the check above found
        result._locations = Locations(file=filename, doc=doc)  # type: ignore[attr-defined]
    return result


class SchemaError(ConfigError):
    """The first schema problem of a file (what a deploy prints), carrying all of them in
    file order (``problems``): ``orch lint`` reports every one in a single run."""

    problems: tuple[ConfigError, ...] = ()


def _config_error(exc: ValidationError, doc: SourceDoc, root: type[BaseModel]) -> ConfigError:
    """One ``ConfigError`` for the first of pydantic's errors (unknown keys first), located;
    all of them, one per key, in its ``problems``."""
    errors = exc.errors(include_url=False)
    # A typo'd key also makes the real key "missing": name the typo, it is the cause.
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    typo_parents = {_data_loc(doc.data, e["loc"])[:-1] for e in errors if e["type"] == "extra_forbidden"}
    located: dict[Loc, ConfigError] = {}
    for error in [first, *errors]:
        loc = _data_loc(doc.data, error["loc"])
        if loc in located or (error["type"] == "missing" and loc[:-1] in typo_parents):
            continue  # a union's other branches; the key a typo left missing
        located[loc] = _located_error(error, doc, root, loc)
    head = next(iter(located.values()))
    out = SchemaError(head.message, file=head.file, line=head.line, key=head.key)
    out.problems = tuple(sorted(located.values(), key=lambda e: (e.line or 0, e.key or "")))
    return out


def _located_error(error: Any, doc: SourceDoc, root: type[BaseModel], loc: Loc) -> ConfigError:
    message = _message(error, root, loc)
    if error["type"] in ("missing", "extra_forbidden"):
        line = doc.line_of(loc) if error["type"] == "extra_forbidden" else doc.line_of(loc[:-1])
    else:
        line = doc.line_of(loc)
    return ConfigError(message, file=doc.filename, line=line, key=key_path(loc) or None)


def _data_loc(data: Any, loc: Sequence[str | int]) -> Loc:
    """Keep the parts of pydantic's ``loc`` that index the data (drop union/validator tags)."""
    out: list[str | int] = []
    current = data
    parts = list(loc)
    for position, part in enumerate(parts):
        if _indexes(current, part):
            out.append(part)
            current = current[part]
        elif position == len(parts) - 1 and isinstance(current, dict | type(None)):
            out.append(part)  # a missing key: name it
        # else: a tag such as 'function-after[...]' or 'list[str]'; skip it
    return tuple(out)


def _indexes(container: Any, part: str | int) -> bool:
    if isinstance(container, dict):
        return part in container
    if isinstance(container, list) and isinstance(part, int) and not isinstance(part, bool):
        return 0 <= part < len(container)
    return False


_SIMPLE: dict[str, str] = {
    "missing": "field required",
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected an integer",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "string_type": "expected a string",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "model_attributes_type": "expected a mapping",
    "list_type": "expected a list",
}


def _message(error: Any, root: type[BaseModel], loc: Loc) -> str:
    kind: str = error["type"]
    ctx: dict[str, Any] = error.get("ctx") or {}
    value = error.get("input")
    if kind == "extra_forbidden":
        return "extra key not permitted" + _did_you_mean(root, loc)
    if kind in ("value_error", "assertion_error"):
        return _one_line(str(ctx.get("error", error["msg"])))
    if kind == "literal_error":
        expected = ctx.get("expected", "").replace("'", "")
        expected = expected.replace(" or ", ", ")
        return f"expected one of {expected} (got: {value})"
    if kind in ("too_short", "string_too_short"):
        return "must not be empty"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        ops = {"greater_than_equal": ">=", "greater_than": ">"}
        ops |= {"less_than_equal": "<=", "less_than": "<"}
        bound = next(iter(ctx.values()), "?")
        return f"must be {ops[kind]} {bound} (got: {value})"
    if kind in _SIMPLE:
        if kind == "missing":
            return _SIMPLE[kind]
        return f"{_SIMPLE[kind]} (got: {_type_name(value)})"
    msg = str(error["msg"])
    return _one_line(msg[:1].lower() + msg[1:])


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _did_you_mean(root: type[BaseModel], loc: Loc) -> str:
    """Suggest the closest permitted key for a typo, when one is close."""
    model = _model_at(root, loc[:-1]) if loc else None
    if model is None:
        return ""
    names = [f.alias or name for name, f in model.model_fields.items()]
    close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.7)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _model_at(root: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The model class that validates the mapping at ``loc``, following the annotations."""
    annotation: Any = root
    for part in loc:
        annotation = _step(_unwrap(annotation), part)
        if annotation is None:
            return None
    model = _unwrap(annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """Strip ``Annotated[...]`` and ``X | None`` down to the interesting type."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation


def _step(annotation: Any, part: str | int) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        for name, field in annotation.model_fields.items():
            if (field.alias or name) == part:
                return field.annotation
        return None
    origin = get_origin(annotation)
    if origin is list and isinstance(part, int):
        return get_args(annotation)[0]
    if origin is dict:
        return get_args(annotation)[1]
    return None


def _one_line(text: str) -> str:
    return " ".join(text.split())
