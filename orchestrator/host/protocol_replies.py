"""The helper's answers that the controller reads field by field, as types.

``orchestrator.host.protocol`` defines the requests; these are what some of
them answer (named per type below). ``from_wire`` takes the documented default
for a field an older helper did not send and ignores fields it does not know (a
newer helper may say more); a required field missing is a ``ProtocolError``
naming the reply and the field. The controller still checks every answer's
types against its shape first (``shell.replies``), so a hostile host's answer
is one line, never a traceback.

Standard library only, Python 3.8 syntax: this module is shipped to the host.
"""

from __future__ import annotations

from collections.abc import Mapping

from .protocol import ProtocolError
from .values import TYPE_CHECKING, field, fields_of, value

if TYPE_CHECKING:
    from typing import Any, ClassVar, TypeVar

    from .protocol import Wire

    T = TypeVar("T", bound="Reply")


class Reply:
    """A reply: its fields (``values``) are the keys of the answer's object."""

    NAME: ClassVar[str] = ""

    @classmethod
    def from_wire(cls: type[T], data: Mapping[str, Any]) -> T:
        if not isinstance(data, Mapping):
            raise ProtocolError("%s: not an object" % cls.NAME)
        args = {}
        for f in fields_of(cls):
            if f.name in data:
                args[f.name] = data[f.name]
            elif f.required:
                raise ProtocolError("%s: missing field %r" % (cls.NAME, f.name))
        return cls(**args)

    def to_wire(self) -> Wire:
        return {f.name: getattr(self, f.name) for f in fields_of(self)}


@value(frozen=True)
class HelloReply(Reply):
    """``hello``: who and where the helper is, and the host's clock."""

    NAME: ClassVar[str] = "hello"
    protocol: int | None = None
    pid: int | None = None
    python: str | None = None
    python_version: str | None = None
    hostname: str | None = None
    uid: int | None = None
    home: str | None = None
    nvidia_smi: str | None = None
    time: float | None = None


@value(frozen=True)
class FileInfo(Reply):
    """``read`` (a list of them) and ``read_host``'s files: one file as the host has it."""

    NAME: ClassVar[str] = "file"
    path: str
    exists: bool
    real: str | None = None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    sha256: str | None = None
    size: int | None = None
    data: bytes | None = None


@value(frozen=True)
class ProcessInfo(Reply):
    """``server_find`` and ``process`` (or None: nothing found)."""

    NAME: ClassVar[str] = "process"
    pid: int | None = None
    pgid: int | None = None
    argv: list[str] | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None
    starttime: float | None = None
    found_by: str | None = None
    started_at: float | None = None  # the start on the host's wall clock


@value(frozen=True)
class LockReply(Reply):
    """``lock_acquire`` (and ``open_state``'s ``lock``)."""

    NAME: ClassVar[str] = "lock"
    acquired: bool
    holder: Wire | None = None
    token: str | None = None


@value(frozen=True)
class RunReply(Reply):
    """``run``: a command whose exit code is data."""

    NAME: ClassVar[str] = "run"
    rc: int
    stdout: str
    stderr: str


@value(frozen=True)
class ValidateReply(Reply):
    """``validate`` (a list of them): one check run on a staged copy."""

    NAME: ClassVar[str] = "validate"
    rc: int
    stdout: str
    stderr: str
    target: str
    argv: list[str]


@value(frozen=True)
class StagedFile(Reply):
    """``stage`` (a list of them): where each file was staged."""

    NAME: ClassVar[str] = "stage"
    staged: str


@value(frozen=True)
class HealthReply(Reply):
    """``health_wait``: healthy after ``elapsed`` s and ``polls`` polls."""

    NAME: ClassVar[str] = "health_wait"
    elapsed: float
    polls: int
    last: str | None = None
    stable_for: float | None = None


@value(frozen=True)
class ReleaseCreated(Reply):
    """``release_create``: the release's dir and its ``seq`` (None: an older helper)."""

    NAME: ClassVar[str] = "release_create"
    root: str
    seq: int | None = None


@value(frozen=True)
class Armed(Reply):
    """``release_arm``: the watchdog's pid and when it acts (the host's wall time)."""

    NAME: ClassVar[str] = "release_arm"
    pid: int | None = None
    fires_at: float | None = None
    budget: float | None = None
    deadline: float | None = None  # what an older helper called ``fires_at``


@value(frozen=True)
class ConfirmReply(Reply):
    """``confirm_release``: confirmed (each step's answer), or the restore's record that got there first."""

    NAME: ClassVar[str] = "confirm_release"
    confirmed: bool = False
    restored: Wire | None = None
    claim: Wire | None = None
    results: list[Any] = field(default_factory=list)


def _names(value: Any) -> list[str] | None:
    return None if value is None else [str(v) for v in value]


@value(frozen=True)
class Builds(Reply):
    """``nightly_builds``: a host's ``builds_dir``, its builds oldest first, where ``current`` points."""

    NAME: ClassVar[str] = "nightly_builds"
    builds_dir: str
    current: str | None = None
    builds: list[str] = field(default_factory=list)
    complete: list[str] | None = None  # confirmed builds (None: an older helper did not say)
    seqs: dict[str, int] = field(default_factory=dict)  # each build's ``seq``, where its manifest has one

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Builds:
        return cls(data["builds_dir"], data.get("current"), list(data.get("builds") or []),
                   _names(data.get("complete")), dict(data.get("seqs") or {}))


@value(frozen=True)
class PreparedBuild(Reply):
    """``nightly_prepare``: a new build's place, made ready while the old build serves."""

    NAME: ClassVar[str] = "nightly_prepare"
    builds_dir: str
    build_dir: str
    current: str | None
    builds: list[str]
    log: str
    complete: list[str] | None = None  # confirmed builds (None: an older helper did not say)
    seqs: dict[str, int] = field(default_factory=dict)  # each build's ``seq``, where its manifest has one

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> PreparedBuild:
        return cls(data["builds_dir"], data["build_dir"], data.get("current"), list(data.get("builds") or []),
                   data["log"], _names(data.get("complete")), dict(data.get("seqs") or {}))


REPLY_TYPES: tuple[type[Reply], ...] = (
    HelloReply, FileInfo, ProcessInfo, LockReply, RunReply, ValidateReply, StagedFile, HealthReply,
    ReleaseCreated, Armed, ConfirmReply, Builds, PreparedBuild,
)
