"""A release's runner followed from any controller: ``orch status --follow`` and ``orch rollback --abort``.

After its commit a deploy belongs to its runner on the host, which logs
every step to the release's event log and ends it in one verdict
(``host/runner.py``). Whoever follows the log — the deploy's own controller,
this module for a controller that was killed, lost its link, or never ran
the deploy — prints the same steps and ends with the same outcome and exit
code. The events are masked on the host: a controller without the playbook
prints no secret.

A verdict is *reported* once some controller has followed it to its end
(``reported.json`` in the release): ``status --follow`` on a host with no
release in progress prints the newest release whose verdict nobody has
reported yet, and otherwise says what the last release was.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core import endings, events
from orchestrator.core.events import plain
from orchestrator.core.outcomes import STOPPED_FOLLOWING, UNCHANGED, Verdict, runner_verdict
from orchestrator.core.progress import HostState, view_of_state
from orchestrator.core.target import HostTarget
from orchestrator.errors import (
    HostKeyError,
    LinkLostError,
    MalformedReplyError,
    OrchError,
    Terminated,
    UnreachableError,
)
from orchestrator.host.protocol_events import StepEvent, TickEvent, event_from_wire
from orchestrator.host.protocol_verdict import AnswersEvent
from orchestrator.host.records import HostRecords
from orchestrator.pipeline.events import Reporter, Words
from orchestrator.pipeline.fleet import LOST_AFTER_COMMIT
from orchestrator.pipeline.report import HostReport
from orchestrator.pipeline.session import ConnectOptions, HostSession, lock_holder
from orchestrator.shell import ops
from orchestrator.shell.agent_client import RemoteStepError
from orchestrator.shell.program import RunVerdict, release_abort, release_follow

if TYPE_CHECKING:
    from orchestrator.pipeline.nightly_late import LateNight

REPORTED_FILE = "reported.json"  # some controller followed this release's verdict to its end
RUNNER_FILE = "runner.json"
RECONNECT_SECONDS = 5.0  # between tries to reach a host again after its link was lost after the commit


def verdict_reads(release_dir: str) -> tuple[ops.Op, ops.Op]:
    """The two reads that say whether a release's verdict is owed to someone: its runner's
    record (a release a runner carried) and its ``reported.json`` (absent: nobody reported it)."""
    return ops.get_json(f"{release_dir}/{RUNNER_FILE}"), ops.get_json(f"{release_dir}/{REPORTED_FILE}")


def reported_op(release_dir: str, command: str) -> ops.Op:
    """The mark that a controller has reported this release's verdict (who, where, how). Best
    effort: it ends the batch that follows the runner, and a full disk must not turn the
    verdict that batch carries into an error (the controller then restored a release the
    runner had restored already, and said "files unchanged")."""
    return ops.put_json(f"{release_dir}/{REPORTED_FILE}", {"by": lock_holder(command)}, best_effort=True)


def reconnect_and_follow(session: HostSession, reporter: Reporter, release_dir: str, lost: LinkLostError,
                         after: Callable[[], int], on_event: Callable[[dict[str, Any]], None],
                         command: str) -> RunVerdict:
    """The link was lost after the runner was started (a deploy's commit, a night's switch):
    connect again (every 5 s, for up to 6 connect timeouts) and follow the runner on from the
    last line seen (``after()``, asked at each try). ``lost`` is raised again when the host
    cannot be reached in that time, has no runner (the batch that starts it never came), or
    spoke garbage (a helper that did is not asked for a verdict again)."""
    if isinstance(lost, MalformedReplyError):
        raise lost
    window = 6 * session.options.connect_timeout
    reporter.event(session.target.name, events.Reconnecting(session.options.masker.text(str(lost)), window))
    until = time.monotonic() + window
    while True:
        try:
            session.reconnect()
            follow = release_follow(release_dir, after())
            v: RunVerdict = session.batch([follow, reported_op(release_dir, command)], on_event=on_event)[follow]
            return v
        except RemoteStepError as e:
            if e.kind == "norunner":
                raise lost from None
            raise
        except (UnreachableError, LinkLostError, HostKeyError):
            if time.monotonic() + RECONNECT_SECONDS > until:
                raise lost from None
            time.sleep(RECONNECT_SECONDS)


def follow_host(target: HostTarget, options: ConnectOptions, reporter: Reporter, *, abort: bool = False,
                reports_dir: Path | None = None) -> HostReport:
    """Follow the host's release in progress (or the newest one nobody reported) to its verdict.

    ``abort``: ask its runner to abort first (``orch rollback --abort``): it stops its step
    and restores, and that restore is followed. ``reports_dir``: where a night's report goes
    (``orch status --follow --reports``): a night followed here is reported as its own
    controller would have (``pipeline.nightly_late``).
    """
    report, late = _follow(target, options, reporter, abort, reports_dir is not None)
    if late is not None and reports_dir is not None:
        from orchestrator.pipeline.nightly_late import write_late
        from orchestrator.pipeline.nightly_report import host_rows

        rows, unread = host_rows(target, options)
        path = write_late(reports_dir, late, rows)
        if unread:
            reporter.event(target.name, events.HistoryUnread(unread))
        reporter.event(target.name, events.LateReportWritten(str(path)))
        report.extra["report"] = str(path)
    return report


def _follow(target: HostTarget, options: ConnectOptions, reporter: Reporter, abort: bool,
            nights: bool) -> tuple[HostReport, LateNight | None]:
    """``follow_host`` on one connection; with ``nights``, a night followed here is returned to be
    reported late."""
    label = target.name
    with HostSession(target, options) as session:
        state: HostRecords = session.run(ops.state_read(target.state_dir))
        journal = state.journal
        in_progress = journal is not None and not journal.finished and bool(journal.release)
        newest = state.newest_first()
        release = journal.release if in_progress and journal is not None else (newest[0].id if newest else None)
        if release is None:
            reporter.event(label, events.NothingToFollow(None, None, False))
            return HostReport.ended(label, UNCHANGED), None
        release_dir = state.paths.release(release)
        runner_read, reported_read = verdict_reads(release_dir)
        got = session.batch([runner_read, reported_read])
        runner_rec, reported = got[runner_read], got[reported_read]
        last = next((m for m in newest if m.id == release), None)
        if runner_rec is None and abort and view_of_state(label, state).state is HostState.CONTROLLER_GONE:
            return restore_now(target, options, reporter), None
        if runner_rec is None or (reported is not None and not in_progress and not abort):
            outcome = last.outcome if last is not None else None
            reporter.event(label, events.NothingToFollow(release, outcome, in_progress))
            return HostReport.ended(label, UNCHANGED, release=release), None
        steps: list[ops.Op] = [release_abort(release_dir)] if abort else []
        follow = release_follow(release_dir, 0, abort_on_cancel=abort)
        steps += [follow, reported_op(release_dir, "status --follow")]

        try:
            v: RunVerdict = session.batch(steps, on_event=runner_steps(reporter, label))[follow]
        except KeyboardInterrupt:
            stopped = endings.FollowInterrupted(release)
            return HostReport.ended(label, STOPPED_FOLLOWING, release=release, ending=stopped,
                                    error=options.words(stopped)), None
        except RemoteStepError as e:
            if e.kind == "unfinished":
                return HostReport.ended(label, runner_verdict(False, None), release=release, error=e.message), None
            raise
        late = None
        if nights and last is not None and last.kind == "night" and not abort:
            from orchestrator.pipeline.nightly_late import late_night

            late = late_night(session, last, v)
        return report_of(label, release, v, aborted=abort, words=options.words), late


def restore_now(target: HostTarget, options: ConnectOptions, reporter: Reporter) -> HostReport:
    """``orch rollback --abort`` on a release no runner holds, only its watchdog (an older
    orch's deploy, or a night): there is no runner to ask, so it is restored now as ``orch
    rollback`` restores it (under the release's restore lock: the watchdog never restores
    it a second time)."""
    from orchestrator.pipeline.rollback import rollback_host

    return rollback_host(target, None, options, reporter)


def follow_again(target: HostTarget, options: ConnectOptions, reporter: Reporter, lost: HostReport,
                 when: str) -> HostReport:
    """A fleet's deploy whose link was lost after its commit, followed once more before the
    fleet decides its next batch (``pipeline.fleet.follow_lost``): one connection with the
    connect timeout, then the runner's events from where its controller lost them, to the
    verdict, which is marked reported. The report becomes the verdict's (confirmed:
    ``changed``; restored: ``rolled_back``; …); a host still out of reach keeps ``lost``
    (``unreachable``, exit 3), and so does a Ctrl-C here: it only stops this follow, the
    runner finishes the release by itself.
    """
    label, release = target.name, str(lost.release)
    seen = lost.extra.get(LOST_AFTER_COMMIT) or {}
    release_dir = str(seen.get("release_dir") or "")
    reporter.event(label, events.FollowingAgain(release, when))
    follow = release_follow(release_dir, int(seen.get("events_seen") or 0), abort_on_cancel=False)

    try:
        with HostSession(target, options) as session:
            v: RunVerdict = session.batch([follow, reported_op(release_dir, "deploy")],
                                          on_event=runner_steps(reporter, label))[follow]
    except KeyboardInterrupt:
        return lost
    except RemoteStepError as e:
        if e.kind == "unfinished":  # runner and guard both gone: `orch rollback` finishes it
            return HostReport.ended(label, runner_verdict(False, None), release=release, files=lost.files,
                                    error=e.message, extra=dict(lost.extra))
        return still_unreachable(reporter, lost, when, e, options.words)
    except OrchError as e:
        return still_unreachable(reporter, lost, when, e, options.words)
    found = report_of(label, release, v, words=options.words)
    extra = {k: w for k, w in lost.extra.items() if k != LOST_AFTER_COMMIT}
    return HostReport.ended(label, Verdict(found.outcome, found.exit_code), release=release, files=lost.files,
                            error=found.error, ending=found.ending, notes=lost.notes,
                            extra={**extra, **found.extra, "followed_again": when})


def still_unreachable(reporter: Reporter, lost: HostReport, when: str, cause: Exception,
                      words: Words = plain) -> HostReport:
    """The lost host's report as it was (``unreachable``, exit 3), saying that the second try failed too."""
    reporter.event(lost.host, events.StillUnreachable(str(lost.release), str(cause)))
    ending = endings.FollowedAgainInVain(str(lost.release), when, str(cause), lost.ending)
    # a lost report made without an ending (by hand) keeps its own words in front
    error = words(ending) if lost.ending is not None else f"{lost.error}; {words(ending)}"
    return HostReport(lost.host, lost.outcome, lost.exit_code, release=lost.release, files=lost.files,
                      error=error, notes=lost.notes, extra=dict(lost.extra), ending=ending)


@dataclass(frozen=True)
class Followed:
    """The runner's verdict, followed to its end; ``aborted``: a Ctrl-C asked it to abort first
    (its restore, or the confirm it had made already, is this verdict)."""

    verdict: RunVerdict
    aborted: bool = False


@dataclass(frozen=True)
class StoppedFollowing:
    """This controller stopped following; the runner on the host goes on to its verdict.
    ``signame``: a SIGTERM or SIGHUP; None: a Ctrl-C that aborted nothing (a second one, one
    where nothing is to be aborted, or one while the link was being found again:
    ``reconnecting``)."""

    signame: str | None = None
    reconnecting: bool = False


class RunnerFollow:
    """One controller following the runner it started (a deploy's commit, a night's switch, a
    rollback's hand-over), written once for the three: the runner's events counted as they
    come, so that a follow after a lost link goes on from the last line seen; the link found
    again; and the signal table's rows after the hand-over (docs/CLI.md, "Signals")."""

    def __init__(self, session: HostSession, reporter: Reporter, release_dir: str, command: str,
                 on_event: Callable[[dict[str, Any]], None]) -> None:
        self.session = session
        self.reporter = reporter
        self.release_dir = release_dir
        self.command = command
        self.on_event = on_event
        self.lines_seen = 0  # the runner's log lines followed so far (``release_follow``'s ``after``)

    def event(self, ev: dict[str, Any]) -> None:
        line = ev.get("line")
        if isinstance(line, int) and line > self.lines_seen:
            self.lines_seen = line
        self.on_event(ev)

    def run(self, steps: list[ops.Op], follow: ops.Op, *, abort_on_ctrl_c: bool = True) -> Followed | StoppedFollowing:
        """``steps`` (which start the runner, then ``follow`` it) in one batch, to the verdict.

        A lost link is found again and followed on (``reconnect_and_follow``; its
        ``LinkLostError`` when the host stays out of reach). A Ctrl-C asks the runner to
        abort and follows its restore (``abort_on_ctrl_c``: a deploy's, a night's; a
        rollback's runner is never aborted); a second one, a SIGTERM or a SIGHUP only stops
        the following. Errors of the batch itself (a commit refused) are the caller's.
        """
        reconnecting = False
        try:
            try:
                got = self.session.batch(steps, on_event=self.event)
            except LinkLostError as lost:
                reconnecting = True
                return Followed(reconnect_and_follow(self.session, self.reporter, self.release_dir, lost,
                                                     lambda: self.lines_seen, self.event, self.command))
            return Followed(got[follow])
        except KeyboardInterrupt as e:
            if isinstance(e, Terminated):
                return StoppedFollowing(signal.Signals(e.signum).name, reconnecting)
            agent = self.session.agent
            if reconnecting or not abort_on_ctrl_c or (agent is not None and agent.interrupted_twice):
                return StoppedFollowing(None, reconnecting)
            v = abort_and_follow(self.session, self.release_dir, self.command, self.event)
            return StoppedFollowing() if v is None else Followed(v, aborted=True)


def abort_and_follow(session: HostSession, release_dir: str, command: str,
                     on_event: Callable[[dict[str, Any]], None]) -> RunVerdict | None:
    """Ctrl-C after the hand-over (a deploy's commit, a night's switch): ask the runner to abort,
    then follow it to its verdict (its restore, or the confirm it had already made). None when
    a second Ctrl-C stops the following; a ``KeyboardInterrupt`` when the batch that starts the
    runner stopped before it did (nothing to follow: the caller restores as before a commit)."""
    abort, follow = release_abort(release_dir), release_follow(release_dir)
    try:
        v: RunVerdict = session.batch([abort, follow, reported_op(release_dir, command)], on_event=on_event)[follow]
    except KeyboardInterrupt:
        return None
    except RemoteStepError as e:
        if e.kind == "norunner":
            raise KeyboardInterrupt from None
        raise
    return v


def runner_steps(reporter: Reporter, label: str) -> Callable[[dict[str, Any]], None]:
    """A runner's log as a follower without the playbook prints it: each step's begin and end,
    progress on the live line (the steps' answers are for the controller that planned them)."""
    def on_event(ev: dict[str, Any]) -> None:
        event = event_from_wire(ev)
        if isinstance(event, StepEvent):
            reporter.event(label, events.RunnerStep(event.step, event.state, event.seconds))
        elif ev.get("event") not in (AnswersEvent.KIND, TickEvent.KIND):
            reporter.progress(label, ev)
    return on_event


def report_of(label: str, release: str, v: RunVerdict, *, aborted: bool = False,
              words: Words = plain) -> HostReport:
    """The outcome and exit code the run that started ``release`` would have had (``aborted``:
    ``orch rollback --abort``'s, whose success is the restore)."""
    restored_ok = bool(v.restore.get("ok")) if v.restore else None
    verdict = runner_verdict(v.confirmed, restored_ok, aborted=aborted)
    said = v.failed.message if v.failed else ""
    ending = None if v.confirmed else endings.RunnerFailed(
        release, str(v.verdict), str(said or (v.restore or {}).get("error") or v.verdict))
    by = (v.restore or {}).get("by") if v.restore else None
    return HostReport.ended(label, verdict, release=release, error=words(ending) if ending else None, ending=ending,
                            extra={"verdict": v.verdict, "restored_by": by})
