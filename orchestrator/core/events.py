"""What a run tells the person watching it, as data: one small type per line the pipeline emits.

The pipeline says *what happened* (``Committed(files=3)``), never how it reads:
the words are the CLI's (``orchestrator.cli.words.line``), made in one place so
that a console line, a fleet's board row and the host's ``run.log`` say the same
thing, and ``--json`` can carry the fields a script wants instead of English.

Every event is a frozen value class (``host.values``: a frozen dataclass to the
type checker, without its cost at each start of ``orch``) with a ``level`` (``step``, ``note`` or
``warning``) kept on its type: the level is part of what happened (a drift kept
is a warning wherever it is said), not a choice of the caller. Pure: no I/O.
Times are seconds on the host's clock (``HostSession.host_time``); the words
say them in UTC.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from orchestrator.host.restore_plan import RestoreRecord
from orchestrator.host.values import fields, value

Level = Literal["step", "note", "warning"]
STEP: Level = "step"
NOTE: Level = "note"
WARNING: Level = "warning"


@value(frozen=True)
class Event:
    """The base of every event: its ``level`` and its wire form."""

    level: ClassVar[Level] = STEP

    @classmethod
    def kind(cls) -> str:
        """``Committed`` -> ``committed``, ``BackedUp`` -> ``backed_up``: the event's name in JSON."""
        return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()

    def to_wire(self) -> dict[str, Any]:
        """``{"event": "committed", "level": "step", "files": 3}``: fields for ``--json``."""
        return {"event": self.kind(), "level": self.level, **{f.name: as_json(getattr(self, f.name))
                                                               for f in fields(self)}}


def as_json(v: Any) -> Any:
    """A field as ``--json`` carries it: a value with fields of its own (``RestoreAccount``,
    an ending) as its ``to_json``."""
    return v.to_json() if hasattr(v, "to_json") else v


def plain(ev: Event) -> str:
    """The fallback words of an event where no CLI gave its own (a ``RunLog`` or a
    ``Recorder`` built in a test): its name and fields, never empty."""
    shown = ", ".join(f"{f.name}={getattr(ev, f.name)!r}" for f in fields(ev))
    return f"{ev.kind()}({shown})"


# ---------------------------------------------------------------- shared by deploy, night, rollback


@value(frozen=True)
class RestoreAccount:
    """What a restore did: the host's record of it, every path its plan covered (so that a
    file it never reached is named too), and what a failed commit batch had written before
    (by the host's record). The words are the CLI's (``cli.restore_words``); ``--json``
    carries the fields."""

    record: RestoreRecord
    planned: tuple[str, ...] = ()
    written: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The host's record without its server log (said as a log of its own), with the plan's paths."""
        record = self.record.to_wire()
        record.pop("log_tail", None)
        record.pop("format", None)
        return {**record, "planned": list(self.planned), "written_by_commit": list(self.written)}


@value(frozen=True)
class PlanNote(Event):
    """A note the plan made (a layout found, a flag already set): its text is the planner's."""

    level: ClassVar[Level] = NOTE
    text: str


@value(frozen=True)
class Healthy(Event):
    """The new server answered health (and stayed up ``stable_for`` seconds, when asked)."""

    elapsed: float
    polls: int
    stable_for: float | None = None


@value(frozen=True)
class HeldForDrift(Event):
    """A release outlives ``keep_releases``: it holds the only copy of a person's edit."""

    level: ClassVar[Level] = NOTE
    release: str
    paths: tuple[str, ...]


@value(frozen=True)
class DriftKept(Event):
    """A file a person changed on the host while orch worked: its content is kept aside."""

    level: ClassVar[Level] = WARNING
    path: str
    kept_in: str | None
    during_deploy: bool = True  # False: found by a rollback


@value(frozen=True)
class RestoreNotRecorded(Event):
    """The restore (or a night's switch back) ran, but the host could not write its record."""

    level: ClassVar[Level] = WARNING
    problem: str
    switch_back: bool = False


# ---------------------------------------------------------------- deploy


@value(frozen=True)
class WatchdogRestoredEarlier(Event):
    level: ClassVar[Level] = NOTE
    release: str


@value(frozen=True)
class AlreadyAsPlanned(Event):
    """A deploy with nothing to change: files and command line are already as planned."""


@value(frozen=True)
class Staged(Event):
    files: int


@value(frozen=True)
class BackedUp(Event):
    """The release is made and its backstop armed at ``deadline``. ``runner``: from the commit
    on the host's runner carries it to its verdict (a deploy); else the watchdog restores it
    at ``deadline`` unless the controller confirms (a night)."""

    files: int
    release: str
    deadline: float
    runner: bool = False


@value(frozen=True)
class Committed(Event):
    files: int


@value(frozen=True)
class PreflightAccepted(Event):
    """The server's own parser accepts the new command line (``staged``: ``--check``'s,
    run against the staged files)."""

    staged: bool = False


@value(frozen=True)
class PreflightNotChecked(Event):
    """``--check`` did not run a custom pre-flight: it reads neither the staged files' map
    (``{{ staged_files }}``) nor ``ORCH_STAGED``."""

    level: ClassVar[Level] = NOTE


@value(frozen=True)
class GateBaseline(Event):
    """The gate probes the running server before the stop."""

    probes: tuple[str, ...]


@value(frozen=True)
class GateReprobe(Event):
    """The gate's comparison is inconclusive (within the spread): these probes run again."""

    probes: tuple[str, ...]


@value(frozen=True)
class Restarting(Event):
    """The server restarts with ``argv`` (secrets already redacted by the pipeline)."""

    argv: tuple[str, ...]


@value(frozen=True)
class ReleaseCurrent(Event):
    release: str


@value(frozen=True)
class Reconnecting(Event):
    """The link was lost after the commit: orch connects again to follow the runner."""

    level: ClassVar[Level] = WARNING
    lost: str
    window: float


@value(frozen=True)
class FollowingAgain(Event):
    """A fleet follows again a release whose link was lost after its commit, before it decides
    its next batch (``when``: "before batch 2", "before the end of the run")."""

    release: str
    when: str


@value(frozen=True)
class StillUnreachable(Event):
    """The fleet's second try could not follow that release either: the host stays ``unreachable``."""

    level: ClassVar[Level] = WARNING
    release: str
    why: str


@value(frozen=True)
class RunnerStep(Event):
    """A step of a release's runner began, ended or failed (``status --follow``)."""

    step: str
    state: str
    seconds: float | None = None


@value(frozen=True)
class NothingToFollow(Event):
    """``status --follow``: no release in progress, none unreported. ``in_progress``: the journal's
    release is in progress but has no runner (an older orch's, or a night)."""

    release: str | None
    outcome: str | None
    in_progress: bool = False


@value(frozen=True)
class InterruptedAfterConfirm(Event):
    """Ctrl-C came after the host's runner had confirmed the release: it stays current."""

    level: ClassVar[Level] = NOTE
    release: str


@value(frozen=True)
class ManyInEffect(Event):
    """More releases are in effect than ``keep_releases``: none of them is pruned."""

    level: ClassVar[Level] = NOTE
    in_effect: int
    keep: int


@value(frozen=True)
class ServerPredates(Event):
    """Files changed and no restart: the running server still runs the code it loaded before."""

    level: ClassVar[Level] = NOTE
    pid: int | None
    started_at: float | None


@value(frozen=True)
class DeployFailed(Event):
    level: ClassVar[Level] = WARNING
    reason: str
    rolling_back: bool  # False: closing a release that changed nothing


@value(frozen=True)
class RolledBack(Event):
    """The restore machine put the host back; ``by`` who ran it, ``done`` what it did."""

    by: str
    done: RestoreAccount


@value(frozen=True)
class ReleaseClosed(Event):
    """A failed release that had changed nothing on the host, closed."""

    release: str


@value(frozen=True)
class CheckUnchanged(Event):
    """``--check`` with nothing to do."""


@value(frozen=True)
class CheckValidated(Event):
    """``--check`` staged and validated on the host, changing nothing (``would_refuse``: the
    plan refuses; ``preflight_refused``: the server's parser refused the staged files)."""

    would_refuse: bool = False
    preflight_refused: bool = False


# ---------------------------------------------------------------- night


@value(frozen=True)
class BuildDrift(Event):
    """A file of the current build changed by hand; ``--force`` builds anyway."""

    level: ClassVar[Level] = WARNING
    path: str


@value(frozen=True)
class Building(Event):
    build_dir: str
    log: str


@value(frozen=True)
class CheckedOut(Event):
    commit: str


@value(frozen=True)
class Installing(Event):
    commands: int
    build_dir: str


@value(frozen=True)
class InstalledPinned(Event):
    packages: int


@value(frozen=True)
class StackPatched(Event):
    index: int
    playbook: str
    files: int


@value(frozen=True)
class NightFailedBeforeSwitch(Event):
    level: ClassVar[Level] = WARNING
    reason: str


@value(frozen=True)
class HalfBuiltRemoved(Event):
    """A night that failed before its switch: its build removed, nothing running touched."""

    build_dir: str


@value(frozen=True)
class NightArmed(Event):
    deadline: float


@value(frozen=True)
class Switching(Event):
    """``current`` moves to the night's build; the old server (``old_pid``) stops, the new one starts."""

    old_pid: int | None
    night: str
    argv: tuple[str, ...]


@value(frozen=True)
class Probed(Event):
    """A night's probe of its new server: the summary's figures as the host measured them."""

    post: str
    requests_per_s: Any
    tokens_per_s: Any
    p50_ms: Any
    p99_ms: Any
    errors: Any
    greedy_sha256: str | None


@value(frozen=True)
class BuildsPruned(Event):
    builds: tuple[str, ...]


@value(frozen=True)
class NightCurrent(Event):
    night: str
    build_dir: str


@value(frozen=True)
class HistoryUnread(Event):
    """A night's report: the host's history could not be read, so the page words nights from
    their own records."""

    level: ClassVar[Level] = NOTE
    problem: str


@value(frozen=True)
class LateReportWritten(Event):
    """``orch status --follow --reports``: the report of a night that ended without its controller."""

    path: str


@value(frozen=True)
class NightFailed(Event):
    level: ClassVar[Level] = WARNING
    reason: str
    switching_back: bool  # False: closing a release that touched nothing live


@value(frozen=True)
class SwitchedBack(Event):
    by: str
    done: RestoreAccount


@value(frozen=True)
class NightClosed(Event):
    night: str


# ---------------------------------------------------------------- rollback


@value(frozen=True)
class AlreadyCurrent(Event):
    """``orch rollback --to`` a release that is already current."""

    release: str


RollbackDid = Literal["undid", "finished", "restored_before", "already_restored"]
"""What a rollback was: an undo of ``releases`` (``current``: the release current after it, None
for the state before any release); the finish of an unfinished rollback; the restore of the state
before an unfinished deploy or night (``releases``: that run's); or that run found restored
already (``by`` whom)."""


@value(frozen=True)
class RestoreDone(Event):
    """A rollback's restore ran: what it was (``did`` with its releases), ``done`` what the host
    recorded it did."""

    did: RollbackDid
    releases: tuple[str, ...]
    current: str | None
    by: str | None
    done: RestoreAccount


@value(frozen=True)
class FinishingUnfinished(Event):
    kind_of_run: str  # deploy, night or rollback
    release: str
    last_step: str


@value(frozen=True)
class UnfinishedChangedNothing(Event):
    kind_of_run: str
    release: str


@value(frozen=True)
class ConfirmedBeforeEnd(Event):
    """The unfinished run had confirmed its release before it ended: only its journal is closed."""

    level: ClassVar[Level] = WARNING
    release: str


@value(frozen=True)
class BuildNotRemoved(Event):
    level: ClassVar[Level] = WARNING
    night: str
    problem: str


@value(frozen=True)
class HalfBuildRemoved(Event):
    """``orch rollback`` removed the build of a night that died before its switch (its log stays)."""

    builds_dir: str
    night: str


@value(frozen=True)
class NothingToRollBack(Event):
    """No release is current: there is nothing before."""


@value(frozen=True)
class RollingBack(Event):
    """``releases`` undone, newest first; ``links`` (path, target) switched back; the server restarted."""

    releases: tuple[str, ...]
    links: tuple[tuple[str, str | None], ...]
    restart: bool


# ---------------------------------------------------------------- the lock


@value(frozen=True)
class LockTakenOver(Event):
    """The lock's holder is gone (and its helper with it): this run takes the lock."""

    level: ClassVar[Level] = NOTE
    holder: str


@value(frozen=True)
class StaleLockBroken(Event):
    level: ClassVar[Level] = WARNING
    holder: str
    age: float
