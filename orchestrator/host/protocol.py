"""What crosses the wire between orch and its helper on a host, defined once.

Every request the controller may send is a type here, named by the helper op it
runs (``OP``) and with exactly that op's arguments (names, types, defaults: the
helper function's signature, checked by ``tests/test_protocol.py``). The
controller builds its requests from these types (``shell/ops.py``) and the
helper reads each line with ``parse_request``, so a misspelt op or argument is
refused in one line naming both, before anything runs, on either side.

The replies the controller reads field by field (``protocol_replies``) and the
events the helper sends while an op runs (``protocol_events``) are types too,
each with ``to_wire``/``from_wire``. Readers ignore fields they do not know (a
newer helper may say more) and take the documented default for a field an older
helper did not send.

Standard library only, Python 3.8 syntax: this module is shipped to the host.
"""

from __future__ import annotations

import types

from .values import MISSING as MISSING
from .values import Field as Field
from .values import fields_of as fields_of
from .values import value

TYPE_CHECKING = False  # what ``typing.TYPE_CHECKING`` says, without importing typing on the host
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from dataclasses import dataclass as message
    from typing import Any, ClassVar, TypeVar

    Wire = dict[str, Any]
    R = TypeVar("R", bound="Request")
else:
    message = value  # ``dataclass(frozen=True)`` as the type checker sees it (``values``)

LOG_TAIL_LINES = 40  # lines of a server's log the helper sends back by default (``log_tail``)


class ProtocolError(ValueError):
    """A request or reply that does not fit its type; the message is one line naming the op and field."""


class Message:
    """The base of every request and step: ``@message`` gives each its fields and methods."""

    __fields__: ClassVar[tuple[Field, ...]] = ()


class Request(Message):
    """One request: ``OP`` names the helper op, the fields are its arguments."""

    OP: ClassVar[str] = ""

    def arguments(self) -> Wire:
        """Every argument, defaults included: what the helper calls its function with."""
        return {f.name: getattr(self, f.name) for f in fields_of(self)}

    def to_wire(self) -> Wire:
        """The request as a line carries it. An optional argument left at None is not sent
        (the helper's own default applies, as the builders always did); a required one is
        sent as given, None included (``nightly_link_swap``'s "no link")."""
        args = {}
        for f in fields_of(self):
            value = getattr(self, f.name)
            if value is None and not f.required:
                continue
            args[f.name] = list(value) if isinstance(value, tuple) else value
        return {"op": self.OP, "args": args}

    @classmethod
    def from_wire(cls: type[R], wire: Mapping[str, Any]) -> R:
        """The request a line carries; ``ProtocolError`` if it is not one of this type."""
        request = parse_request(wire)
        if not isinstance(request, cls):
            raise ProtocolError("op %r: expected %r" % (request.OP, cls.OP))
        return request


# ---------------------------------------------------------------- the session


@message(frozen=True)
class Hello(Request):
    OP: ClassVar[str] = "hello"
    link_timeout: float = 30.0  # seconds: the controller's silence limit, which the helper keeps too


@message(frozen=True)
class Bye(Request):
    OP: ClassVar[str] = "bye"


@message(frozen=True)
class Batch(Request):
    """Several requests (each one's wire form) run in order until the first failure."""

    OP: ClassVar[str] = "batch"
    steps: list[Wire]


# ---------------------------------------------------------------- files


@message(frozen=True)
class Read(Request):
    OP: ClassVar[str] = "read"
    paths: list[str]
    with_data: bool = True


@message(frozen=True)
class Sha256(Request):
    OP: ClassVar[str] = "sha256"
    paths: list[str]


@message(frozen=True)
class Stage(Request):
    OP: ClassVar[str] = "stage"
    files: list[Wire]
    token: str
    clean_stale: bool = False


@message(frozen=True)
class Run(Request):
    OP: ClassVar[str] = "run"
    argv: list[str]
    cwd: str | None = None
    env: dict[str, str] | None = None
    timeout: float = 600.0
    stdin: bytes | None = None  # sent as blob lines


@message(frozen=True)
class Validate(Request):
    OP: ClassVar[str] = "validate"
    checks: list[Wire]
    token: str
    keep_staged: bool = True
    timeout: float = 600.0


@message(frozen=True)
class Remove(Request):
    OP: ClassVar[str] = "remove"
    paths: list[str]


@message(frozen=True)
class Commit(Request):
    OP: ClassVar[str] = "commit"
    files: list[Wire]
    release_dir: str | None = None


@message(frozen=True)
class ReadHost(Request):
    OP: ClassVar[str] = "read_host"
    paths: list[str]
    packages: Sequence[str] = ()
    python: str | None = None
    pidfile: str | None = None
    port: int | None = None
    follow: list[Wire] | None = None
    timeout: float = 60.0


@message(frozen=True)
class Preflight(Request):
    OP: ClassVar[str] = "preflight"
    argv: list[str]
    cwd: str | None = None
    env: dict[str, str] | None = None
    replace_env: bool = False
    timeout: float = 120.0
    staged: list[str] | None = None  # --check: staged copies the parser reads; each must still be orch's


# ---------------------------------------------------------------- state, lock, records


@message(frozen=True)
class StateInit(Request):
    OP: ClassVar[str] = "state_init"
    state_dir: str


@message(frozen=True)
class LockAcquire(Request):
    OP: ClassVar[str] = "lock_acquire"
    state_dir: str
    holder: Wire
    replace_token: str | None = None


@message(frozen=True)
class OpenState(Request):
    OP: ClassVar[str] = "open_state"
    state_dir: str
    holder: Wire | None = None
    replace_token: str | None = None


@message(frozen=True)
class LockRelease(Request):
    OP: ClassVar[str] = "lock_release"
    state_dir: str


@message(frozen=True)
class GetJson(Request):
    OP: ClassVar[str] = "get_json"
    path: str
    default: Any = None


@message(frozen=True)
class PutJson(Request):
    OP: ClassVar[str] = "put_json"
    path: str
    value: Any
    best_effort: bool | None = None  # True: a mark that may be missing (``reported.json``): a full disk is no failure


@message(frozen=True)
class StateRead(Request):
    OP: ClassVar[str] = "state_read"
    state_dir: str


@message(frozen=True)
class Mark(Request):
    OP: ClassVar[str] = "mark"
    path: str


# ---------------------------------------------------------------- releases and restores


@message(frozen=True)
class ReleaseCreate(Request):
    OP: ClassVar[str] = "release_create"
    state_dir: str
    release_id: str
    manifest: Wire
    files: list[Wire]
    restore: Wire | None = None


@message(frozen=True)
class ReleaseUpdate(Request):
    OP: ClassVar[str] = "release_update"
    state_dir: str
    release_id: str
    fields: Wire


@message(frozen=True)
class ReleasePrune(Request):
    OP: ClassVar[str] = "release_prune"
    state_dir: str
    remove: list[str]
    keep: int | None = None  # the keep_releases that chose ``remove``: recorded in pruned.json for history


@message(frozen=True)
class ReleaseLog(Request):
    OP: ClassVar[str] = "release_log"
    state_dir: str
    release_id: str
    text: str


@message(frozen=True)
class ReleaseArm(Request):
    OP: ClassVar[str] = "release_arm"
    state_dir: str
    release_dir: str
    python: str | None = None


@message(frozen=True)
class RestoreRelease(Request):
    OP: ClassVar[str] = "restore_release"
    release_dir: str
    by: str
    until: float | None = None
    reason: str | None = None
    within: float | None = None


@message(frozen=True)
class ConfirmRelease(Request):
    """Claim the release as confirmed, then run ``steps`` (each one's wire form)."""

    OP: ClassVar[str] = "confirm_release"
    release_dir: str
    steps: list[Wire]


# ---------------------------------------------------------------- the release's program

@message(frozen=True)
class ProgramWrite(Request):
    """Keep ``program.Program`` in the release (0600), checked whole before the commit."""

    OP: ClassVar[str] = "program_write"
    release_dir: str
    program: Wire


@message(frozen=True)
class RunSteps(Request):
    """The kept program on from where it stopped, through ``through`` (a ``StepName``);
    ``extra``: requests run first inside the confirm step's claim (the run's figures, log)."""

    OP: ClassVar[str] = "release_steps"
    release_dir: str
    through: str
    extra: list[Wire] | None = None


# ---------------------------------------------------------------- servers


@message(frozen=True)
class ServerFind(Request):
    OP: ClassVar[str] = "server_find"
    pidfile: str | None = None
    port: int | None = None


@message(frozen=True)
class Process(Request):
    OP: ClassVar[str] = "process"
    pid: int


@message(frozen=True)
class ServerStop(Request):
    OP: ClassVar[str] = "server_stop"
    pid: int
    pgid: int | None = None
    stop_timeout: float = 30.0
    port: int | None = None
    free_timeout: float = 120.0


@message(frozen=True)
class ServerStart(Request):
    OP: ClassVar[str] = "server_start"
    argv: list[str]
    cwd: str | None = None
    env: dict[str, str] | None = None
    log: str | None = None
    pidfile: str | None = None
    replace_env: bool = False


@message(frozen=True)
class RunOk(Request):
    OP: ClassVar[str] = "run_ok"
    argv: list[str]
    timeout: float = 600.0


@message(frozen=True)
class CommandsStart(Request):
    OP: ClassVar[str] = "commands_start"
    start: list[str]
    pid_cmd: list[str] | None = None
    timeout: float = 600.0


@message(frozen=True)
class HealthWait(Request):
    """``pid="started"``: the server started earlier in the same batch."""

    OP: ClassVar[str] = "health_wait"
    base_url: str
    checks: list[Wire]
    timeout: float
    interval: float
    pid: int | str | None = None
    log: str | None = None
    stable_for: float = 0.0


@message(frozen=True)
class LogTail(Request):
    OP: ClassVar[str] = "log_tail"
    path: str
    lines: int = LOG_TAIL_LINES


@message(frozen=True)
class ProbeHttp(Request):
    OP: ClassVar[str] = "probe_http"
    base_url: str
    path: str
    body: Any
    requests: int
    concurrency: int
    timeout: float
    headers: dict[str, str] | None = None
    warmup: int = 0
    greedy_body: Wire | None = None


# ---------------------------------------------------------------- nightly builds


@message(frozen=True)
class NightlyPrepare(Request):
    OP: ClassVar[str] = "nightly_prepare"
    builds_dir: str
    build: str


@message(frozen=True)
class NightlyBuilds(Request):
    OP: ClassVar[str] = "nightly_builds"
    builds_dir: str


@message(frozen=True)
class NightlyFetchGit(Request):
    OP: ClassVar[str] = "nightly_fetch_git"
    repo: str
    commit: str
    builds_dir: str
    build: str
    log: str
    timeout: float = 3600.0


@message(frozen=True)
class NightlyPip(Request):
    OP: ClassVar[str] = "nightly_pip"
    builds_dir: str
    build: str
    requirements: str
    python: str
    pip_args: list[str]
    log: str
    timeout: float = 3600.0


@message(frozen=True)
class NightlyRun(Request):
    OP: ClassVar[str] = "nightly_run"
    argv: list[str]
    cwd: str
    env: dict[str, str] | None = None
    log: str | None = None
    timeout: float = 3600.0


@message(frozen=True)
class NightlyRemoveBuild(Request):
    OP: ClassVar[str] = "nightly_remove_build"
    builds_dir: str
    build: str


@message(frozen=True)
class NightlyPrune(Request):
    OP: ClassVar[str] = "nightly_prune"
    builds_dir: str
    remove: list[str]


@message(frozen=True)
class NightlyLinkSwap(Request):
    """Point ``link`` at ``to`` only if it points at ``expect`` now (None: no link; sent as such)."""

    OP: ClassVar[str] = "nightly_link_swap"
    link: str
    to: str | None
    expect: str | None


from .protocol_runner import ReleaseAbort, ReleaseFollow, ReleaseRun, ReleaseStamp  # noqa: E402 - they need Request

REQUEST_TYPES: tuple[type[Request], ...] = (
    Hello, Bye, Batch, Read, Sha256, Stage, Run, Validate, Remove, Commit, ReadHost, Preflight,
    StateInit, LockAcquire, OpenState, LockRelease, GetJson, PutJson, StateRead, Mark,
    ReleaseCreate, ReleaseUpdate, ReleasePrune, ReleaseLog, ReleaseArm, RestoreRelease, ConfirmRelease,
    ProgramWrite, RunSteps, ReleaseRun, ReleaseFollow, ReleaseAbort, ReleaseStamp,
    ServerFind, Process, ServerStop, ServerStart, RunOk, CommandsStart, HealthWait, LogTail, ProbeHttp,
    NightlyPrepare, NightlyBuilds, NightlyFetchGit, NightlyPip, NightlyRun, NightlyRemoveBuild, NightlyPrune,
    NightlyLinkSwap)
REQUESTS: Mapping[str, type[Request]] = types.MappingProxyType({t.OP: t for t in REQUEST_TYPES})
"""Every op the helper runs, by name."""

NESTED: tuple[type[Request], ...] = (Batch, ConfirmRelease)
"""Requests that carry other requests (``steps``): each step is checked with its parent."""


def parse_request(line: Mapping[str, Any], where: str = "") -> Request:
    """The request a line (``{"op", "args"}``; other keys such as ``id`` ignored) carries.

    An unknown op, an unknown argument or a missing one is a ``ProtocolError``
    whose message is one line naming the op and the argument; the steps of a
    batch are checked too, so nothing of a bad batch runs.
    """
    if not isinstance(line, dict):
        raise ProtocolError("%srequest is not an object" % where)
    name = line.get("op")
    kind = REQUESTS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise ProtocolError("%sunknown op %r" % (where, name))
    args = line.get("args")
    args = {} if args is None else args
    if not isinstance(args, dict):
        raise ProtocolError("%sop %r: args is not an object" % (where, name))
    fields = fields_of(kind)
    known = {f.name for f in fields}
    for key in args:
        if key not in known:
            raise ProtocolError("%sop %r: unknown field %r" % (where, name, key))
    for f in fields:
        if f.required and f.name not in args:
            raise ProtocolError("%sop %r: missing field %r" % (where, name, f.name))
    request = kind(**args)
    for i, step in enumerate((request.extra if isinstance(request, RunSteps) else None) or []):
        parse_request(step, "%s%s.extra[%d]: " % (where, name, i))
    if isinstance(request, NESTED):
        steps = request.steps  # type: ignore[attr-defined]
        if not isinstance(steps, list):
            raise ProtocolError("%sop %r: steps is not a list" % (where, name))
        for i, step in enumerate(steps):
            parse_request(step, "%s%s.steps[%d]: " % (where, name, i))
    return request
