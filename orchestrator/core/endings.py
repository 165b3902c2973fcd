"""How a host's run ended, as data: one small type per kind of ending.

A run's last sentence ("… after the commit of release R; the host finishes it
by itself …; `orch status --follow --host gpu` gives the verdict") used to be
composed in the pipeline, so ``--json`` carried English where a script wants
to know *which* ending it was and *when* the backstop acts (issue 18). Here
the pipeline says what happened (``LostAfterCommit(release, backstop_at)``);
the CLI words it (``orchestrator.cli.words.line``), and the report keeps both:
``HostReport.ending`` for scripts, ``HostReport.error`` (the words) for every
printer that already reads it.

An ending is an ``Event`` (``Ending`` subclasses it) rather than a sibling
type: the CLI's ``line`` is a ``singledispatch`` on ``Event``, so one function
words both a run's lines and its end, ``kind()`` names it in JSON the same way,
and a ``Recorder`` or ``RunLog`` without a CLI still says every field
(``events.plain``). Its level is ``warning``: an ending is only made for a run
that did not end as asked. It is not emitted as a line of the run; it ends the
report.

Fields are data: release ids, host labels, times as seconds on the host's
clock (the words say them in UTC), paths, and a cause's own message as
``reason`` (exception texts are kept as they were). ``run`` says whose release
it is: ``deploy``, ``night`` or ``rollback`` (a night's release is its name).
Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from orchestrator.core.events import WARNING, Event, Level, RestoreAccount, RollbackDid, as_json
from orchestrator.host.values import fields, value

Run = Literal["deploy", "night", "rollback"]


@value(frozen=True)
class Ending(Event):
    """The base of every ending: a warning, with its fields as JSON (an ending inside
    another one carries its own ``kind``)."""

    level: ClassVar[Level] = WARNING

    def to_json(self) -> dict[str, Any]:
        """``{"kind": "lost_after_commit", "release": …, …}``: ``HostReport.ending`` in ``--json``."""
        return {"kind": self.kind(), **self._fields()}

    def to_wire(self) -> dict[str, Any]:
        return {"event": self.kind(), "level": self.level, **self._fields()}

    def _fields(self) -> dict[str, Any]:
        return {f.name: as_json(getattr(self, f.name)) for f in fields(self)}


# ---------------------------------------------------------------- the link, or the controller, gone


@value(frozen=True)
class StoppedFollowing(Ending):
    """A second Ctrl-C, a SIGTERM or a SIGHUP after the hand-over: this controller stopped
    following and the host's runner finishes the release (``signame``: the signal; None, a
    Ctrl-C; ``reconnecting``: it came while the link was being found again)."""

    host: str
    release: str
    run: Run
    signame: str | None = None
    reconnecting: bool = False


@value(frozen=True)
class FollowInterrupted(Ending):
    """Ctrl-C in ``orch status --follow``: only the following stops; the runner finishes."""

    release: str


@value(frozen=True)
class LostAfterCommit(Ending):
    """The link was lost after the hand-over (a deploy's commit, a night's switch, a rollback
    handed on) and not found again in time: the host decides; ``backstop_at`` is when its
    backstop restores at the latest (None: a rollback, which has nothing to restore to)."""

    host: str
    release: str
    reason: str
    backstop_at: float | None
    run: Run = "deploy"


@value(frozen=True)
class LostDuringRestore(Ending):
    """The link dropped while the host restored the release (or switched the night back): it
    finishes that by itself, and the backstop backs it up at ``until``. ``reason``: why the run
    failed; ``lost``: the link's own error."""

    host: str
    release: str
    reason: str
    lost: str
    until: float
    run: Run = "deploy"


@value(frozen=True)
class LostBeforeCommit(Ending):
    """The link was lost after the release was made, before its commit: nothing on the host
    changed, and the watchdog closes the release at ``closes_at``."""

    host: str
    release: str
    reason: str
    closes_at: float


@value(frozen=True)
class LostBeforeChange(Ending):
    """The link was lost (or never came) before anything on the host changed."""

    reason: str
    run: Run = "deploy"


@value(frozen=True)
class InterruptedBeforeChange(Ending):
    """Ctrl-C (or ``signame``: SIGTERM, SIGHUP) before the run changed anything on the host."""

    run: Run = "deploy"
    signame: str | None = None


@value(frozen=True)
class FollowedAgainInVain(Ending):
    """A fleet's second try to follow a release lost after its commit failed too: the host
    stays ``unreachable``. ``lost``: how the first try ended."""

    release: str
    when: str
    reason: str
    lost: Ending | None = None


# ---------------------------------------------------------------- the restore


@value(frozen=True)
class InterruptedDuringRestore(Ending):
    """A second Ctrl-C during the restore: it stopped where it was; the backstop finishes it at ``until``."""

    host: str
    release: str
    until: float
    run: Run = "deploy"


@value(frozen=True)
class RestoreCouldNotRun(Ending):
    """The run failed and its restore could not run (``problem``); the backstop restores at ``until``."""

    host: str
    release: str
    reason: str
    problem: str
    release_dir: str
    until: float
    run: Run = "deploy"


@value(frozen=True)
class Restored(Ending):
    """The run failed and the one restore machine put the host back as it was (or closed a
    release that had changed nothing): why, where, by whom, and what the host's record says
    it did. Its words are the cause's own (``reason``); the fields are what a script asks:
    ``step``, the program step that failed on the host (``health``, ``preflight``, ``gate`` …;
    None where it failed on the controller, before the runner had it), ``failure``, that
    step's kind of failure (``health``, ``refused``, ``cancelled`` for an abort …), and
    ``by``, who restored (``controller``, ``runner``, ``guard``, ``watchdog``)."""

    host: str
    release: str
    reason: str
    done: RestoreAccount
    by: str
    step: str | None = None
    failure: str | None = None
    run: Run = "deploy"


@value(frozen=True)
class RestoreFailed(Ending):
    """The run failed and so did its restore: ``done`` is what the host's record says it did."""

    host: str
    release: str
    reason: str
    done: RestoreAccount
    release_dir: str
    run: Run = "deploy"


@value(frozen=True)
class RunnerCouldNotRestore(Ending):
    """The host's runner failed the release and could not restore it (``problem``: its error)."""

    host: str
    release: str
    reason: str
    problem: str
    release_dir: str
    run: Run = "deploy"


@value(frozen=True)
class RestoringWithoutRecord(Ending):
    """The backstop's deadline passed before the confirm: it is restoring, but left no record."""

    host: str
    release: str
    run: Run = "deploy"


@value(frozen=True)
class RollbackFailed(Ending):
    """``orch rollback``'s restore failed: what the rollback was (``did``, ``releases``,
    ``current``, ``by``: as ``events.RestoreDone``), ``done`` what the host recorded."""

    host: str
    release: str
    did: RollbackDid
    releases: tuple[str, ...]
    current: str | None
    by: str | None
    done: RestoreAccount


@value(frozen=True)
class RollbackLeftNoRecord(Ending):
    """A rollback's runner ended without a restore record (``reason``: its failure, or its verdict)."""

    host: str
    release: str
    reason: str


@value(frozen=True)
class RunnerFailed(Ending):
    """A release followed to its verdict (``orch status --follow``, a fleet's second try, a
    night reported late) that did not confirm: ``reason`` is the runner's own message."""

    release: str
    verdict: str
    reason: str


# ---------------------------------------------------------------- a fleet


@value(frozen=True)
class UndoneWithBatch(Ending):
    """``--rollback-all-on-failure`` rolled back this host's good deploy with its failed batch."""

    release: str | None
    undone_by: str | None
    done: RestoreAccount | None  # None: the rollback's report carried no record


@value(frozen=True)
class NotUndoneWithBatch(Ending):
    """``--rollback-all-on-failure`` could not roll this host back (``reason``: the rollback's)."""

    release: str | None
    reason: str


@value(frozen=True)
class NotStarted(Ending):
    """A fleet run never reached this host (``why``: why the run stopped)."""

    why: str
