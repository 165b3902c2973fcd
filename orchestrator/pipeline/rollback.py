"""``orch rollback``: undo the current release (or down to ``--to R``), or
finish a deploy (or a rollback) that never did.

Both are the restore machine (``host/restore.py``): finishing runs the
unfinished release's own ``restore.json``; undoing writes a new release of
kind ``rollback`` whose ``restore.json`` is the state asked for, then runs
it. The live content a rollback replaces is kept as that release's
"before" copies, so a rollback over hand edits (drift) loses nothing.
Undoing a night switches ``builds_dir/current`` back (the plan's links) and
restarts the command line that ran before it; a build that ``keep_builds``
removed is refused before anything is touched.
"""

from __future__ import annotations

import posixpath
import secrets
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from orchestrator import __version__
from orchestrator.core import endings, events
from orchestrator.core.budget import COMMIT_ALLOWANCE, KILL_GRACE, NO_HEALTH_WAIT
from orchestrator.core.cmdline import flag_change_fields, flag_changes
from orchestrator.core.events import plain
from orchestrator.core.outcomes import STOPPED_FOLLOWING, UNCHANGED, Step, rollback_verdict, verdict
from orchestrator.core.releases import (
    FileState,
    LinkState,
    new_release_id,
    rollback_target,
    rollback_to,
)
from orchestrator.core.restore import RestorePlan, RestoreRecord, restore_spec
from orchestrator.core.target import HostTarget
from orchestrator.errors import HostUnsafeError, LinkLostError, OrchError, RefusedError
from orchestrator.host.program import StepName
from orchestrator.host.protocol_events import StepEvent, TickEvent
from orchestrator.host.protocol_verdict import AnswersEvent
from orchestrator.host.records import (
    AppliedState,
    HostRecords,
    Journal,
    JournalStep,
    Manifest,
    RecordedOutcome,
    StatePaths,
)
from orchestrator.host.restore_plan import RestoreSpec, ServerTarget
from orchestrator.host.values import replace  # the host records are value classes, not dataclasses
from orchestrator.pipeline.events import Reporter, RunLog, Words
from orchestrator.pipeline.follow import RunnerFollow, StoppedFollowing, reported_op
from orchestrator.pipeline.locking import open_state, release_lock
from orchestrator.pipeline.report import HostReport, Named, RollbackSummary
from orchestrator.pipeline.session import ConnectOptions, HostSession, lock_holder
from orchestrator.pipeline.timings import StepClock
from orchestrator.shell import ops
from orchestrator.shell.agent_client import RemoteStepError
from orchestrator.shell.program import (
    ReleaseProgram,
    RunVerdict,
    read_steps,
    release_follow,
    release_run,
)


def rollback_host(
    target: HostTarget, to: str | None, options: ConnectOptions, reporter: Reporter
) -> HostReport:
    """The rollback on one host; every error becomes this host's report, which carries
    ``steps`` (``StepClock.steps``) as far as the host got."""
    label = target.name
    reporter = RunLog(reporter, options.masker, options.words)  # keeps the events for ``--json``
    reached = Step.CONNECTING
    clock = StepClock(label, reporter)
    session = HostSession(target, options)
    try:
        clock.start("connect")
        with session:
            clock.stop("connect")
            reached = Step.PLANNING
            report = _rollback_in_session(session, to, options, reporter, clock)
            report.extra["steps"] = clock.steps(session.host_time)
            report.extra["events"] = [e.to_wire() for e in reporter.events]  # what was said, as fields
            return report
    except (OrchError, KeyboardInterrupt) as cause:
        clock.stop("connect")
        v = verdict(cause, reached)
        return HostReport(label, v.outcome, v.exit_code, error=str(cause) or "interrupted (Ctrl-C)",  # type: ignore[arg-type]
                          ending=cause.ending if isinstance(cause, EndedUnsafe) else None,
                          extra={"steps": clock.steps(session.host_time),
                                 "events": [e.to_wire() for e in reporter.events]})


def _rollback_in_session(
    session: HostSession, to: str | None, options: ConnectOptions, reporter: Reporter, clock: StepClock
) -> HostReport:
    label = session.target.name
    with clock.step("lock"):
        state_dir, state = open_state(session, "rollback", options.break_lock, reporter)
    options.masker.declare_recorded(m.to_wire() for m in state.releases)
    try:
        applied = state.applied
        # an unknown or undone --to is refused (exit 2) whatever the host's state
        rid = rollback_to(to, applied, state.by_id) if to else None
        journal = state.open_journal
        if journal is not None:
            with clock.step("rollback"):
                return finish_unfinished(session, state_dir, journal, reporter)
        if rid is not None and rid == applied[-1]:
            reporter.event(label, events.AlreadyCurrent(rid))
            return HostReport.ended(label, UNCHANGED, release=rid)
        with clock.step("rollback"):
            return undo_releases(session, state_dir, state, to, reporter)
    finally:
        release_lock(session, state_dir)


class EndedUnsafe(HostUnsafeError):
    """A rollback that ended not known to be healthy, raised to ``rollback_host`` with its
    ending (``core.endings``); its message is the ending's words."""

    def __init__(self, ending: endings.Ending, words: Words) -> None:
        super().__init__(words(ending))
        self.ending = ending


def _events(reporter: Reporter, label: str) -> Any:
    return lambda ev: reporter.progress(label, ev)


def report_restore(
    label: str, release_id: str, record: RestoreRecord, reporter: Reporter, planned: list[str],
    did: events.RollbackDid, releases: Sequence[str], current: str | None = None, by: str | None = None,
    extra: dict[str, Any] | None = None, words: Words = plain,
) -> HostReport:
    """The rollback's report, from what the host recorded (``words``: the CLI's, for a failure);
    what the rollback was (``did``, ``releases``, ``current``, ``by``) as ``events.RestoreDone``."""
    done = events.RestoreAccount(record, tuple(planned))
    for f in record.drift:
        reporter.event(label, events.DriftKept(f.path, f.drift, during_deploy=False))
    for problem in record.record_errors:
        reporter.event(label, events.RestoreNotRecorded(problem))
    if record.log_tail:
        reporter.server_log(label, "server log (last 40 lines)", record.log_tail)
    info = {"restore": done, "drift": [f.path for f in record.drift], **(extra or {})}
    v = rollback_verdict(record)
    if not record.ok:
        info.pop("summary", None)  # nothing was undone: the error says what happened
        ending = endings.RollbackFailed(label, release_id, did, tuple(releases), current, by, done)
        return HostReport.ended(label, v, release=release_id, files=planned, extra=info, ending=ending,
                                error=words(ending))
    reporter.event(label, events.RestoreDone(did, tuple(releases), current, by, done))
    return HostReport.ended(label, v, release=release_id, files=planned, extra=info)


def runner_progress(reporter: Reporter, label: str) -> Callable[[dict[str, Any]], None]:
    """The rollback runner's log as it comes: the restore's progress on the live line (its
    step's begin and end and its answers are said by the report)."""
    def on_event(ev: dict[str, Any]) -> None:
        if ev.get("event") not in (AnswersEvent.KIND, TickEvent.KIND, StepEvent.KIND):
            reporter.progress(label, ev)
    return on_event


def runner_record(label: str, release_id: str, v: RunVerdict, program: ReleaseProgram,
                  restore: ops.Op, words: Words = plain) -> RestoreRecord:
    """The restore record of a rollback's runner: its restore step's answer (done), or the record
    its failed step carries (``rollback_failed``); the guard's when the runner died mid-way."""
    if v.confirmed:
        record: RestoreRecord = read_steps(program.steps, v.results, [StepName.RESTORE.value])[restore]
        return record
    # the runner died: its guard finished the rollback; or the record its failed step carries
    wire: Any = v.restore if v.restore is not None else (v.failed.detail("record") if v.failed else None)
    if not isinstance(wire, dict):
        why = (v.failed.message if v.failed else "") or v.verdict
        raise EndedUnsafe(endings.RollbackLeftNoRecord(label, release_id, why), words)
    return RestoreRecord.from_wire(wire)


def rollback_budget(server: ServerTarget | None, health: dict[str, Any] | None) -> float:
    """The backstop of a rollback's runner (host clock): the files, the stop, the port free, a
    hook, health and the stability window, with the confirm's slack: what its restore may take."""
    seconds = COMMIT_ALLOWANCE + NO_HEALTH_WAIT
    if server is not None:
        seconds += server.stop_timeout + KILL_GRACE + server.free_timeout
        seconds += server.hook_timeout if server.after_healthy else 0.0
    if health is not None:
        seconds += float(health.get("timeout") or 0) + float(health.get("stable_for") or 0)
    return seconds


def rollback_summary(undone: Sequence[str], now: Manifest | None, releases: dict[str, Manifest]) -> RollbackSummary:
    """What was undone and what is current now, each with its playbook, not the rollback's own id."""
    def named(rid: str) -> Named:
        m = releases.get(rid)
        return Named(rid, m.playbook_name if m is not None and m.playbook_name else None)

    return RollbackSummary(tuple(named(r) for r in undone), named(now.id) if now is not None else None)


def finish_unfinished(
    session: HostSession, state_dir: str, journal: Journal, reporter: Reporter
) -> HostReport:
    """The journal shows a run that died mid-way: run its release's restore plan."""
    label = session.target.name
    rid = str(journal.release)
    paths = StatePaths(state_dir)
    release_dir = paths.release(rid)
    kind = journal.kind
    reporter.event(label, events.FinishingUnfinished(str(kind), rid, str(journal.step)))
    wire = session.run(ops.get_json(paths.restore(rid)))
    session.options.masker.learn(wire)  # its env, argv and headers: masked in what follows
    if wire is None:
        # Died before its release was written: nothing was changed.
        remove_half_built(session, journal, reporter)
        session.run(ops.put_json(paths.journal, journal.moved_to(JournalStep.ABANDONED, finished=True).to_wire()))
        reporter.event(label, events.UnfinishedChangedNothing(str(kind), rid))
        return HostReport.ended(label, UNCHANGED, release=rid)
    try:
        record = session.run(ops.restore_release(release_dir, "rollback", reason="unfinished; restored by orch rollback"),
                             on_event=_events(reporter, label))
    except RemoteStepError as e:
        if e.kind != "confirmed":
            raise
        session.run(ops.put_json(paths.journal, journal.moved_to(JournalStep.CONFIRMED, finished=True).to_wire()))
        reporter.event(label, events.ConfirmedBeforeEnd(rid))
        return HostReport.ended(label, UNCHANGED, release=rid)
    if record.ok and journal.step == JournalStep.ARMED:
        remove_half_built(session, journal, reporter)  # armed, never switched: its build never ran
    planned = [f.path for f in RestoreSpec.from_wire(wire).plan.files]
    did: events.RollbackDid = "finished" if kind == "rollback" else "restored_before"
    if record.already:
        did = "already_restored"
    return report_restore(label, rid, record, reporter, planned, did, (rid,), by=record.by,
                          words=session.options.words)


def remove_half_built(session: HostSession, journal: Journal, reporter: Reporter) -> None:
    """A night that died before its switch leaves its build half-made: remove it (its log stays),
    so that it never takes the place of a good build under ``keep_builds``. The helper never
    removes the build ``current`` points to."""
    builds_dir = journal.builds_dir
    if journal.kind != "night" or not builds_dir or not journal.release:
        return
    label = session.target.name
    try:
        removed = session.run(ops.nightly_remove_build(builds_dir, journal.release))
    except RemoteStepError as e:
        reporter.event(label, events.BuildNotRemoved(journal.release, e.message))
        return
    if removed:
        reporter.event(label, events.HalfBuildRemoved(builds_dir, journal.release))


def refuse_pruned_builds(session: HostSession, links: Sequence[LinkState]) -> None:
    """A night's build that ``keep_builds`` removed cannot be switched back to: refuse
    (exit 2) before anything is touched, naming it."""
    for link in links:
        if link.target is None:
            continue
        builds = session.run(ops.nightly_builds(posixpath.dirname(link.path)))
        if link.target not in builds.builds:
            raise RefusedError(
                f"{session.target.name}: build {link.target} is no longer in {builds.builds_dir} (pruned by "
                f"keep_builds): `orch rollback` cannot switch {link.path} back to it; nothing was changed"
            )


def undo_releases(
    session: HostSession, state_dir: str, state: HostRecords, to: str | None, reporter: Reporter
) -> HostReport:
    label = session.target.name
    words = session.options.words
    applied = state.applied
    releases = state.by_id
    paths_of = StatePaths(state_dir)
    releases_dir = paths_of.releases
    if not applied:
        reporter.event(label, events.NothingToRollBack())
        return HostReport.ended(label, UNCHANGED, notes=["nothing before"])
    target = rollback_target(applied, releases, releases_dir, to)
    refuse_pruned_builds(session, target.links)
    newest = releases[target.undo[0]]
    paths = [f.path for f in target.files]
    live = session.run(ops.read(paths, with_data=False))  # the backups are copied on the host
    expected_after: dict[str, str] = {}
    for rid in reversed(target.undo):  # oldest first: the newest's "after" wins
        for entry in releases[rid].files:
            expected_after[entry.path] = str(entry.sha256_after)
    rid = new_release_id(datetime.fromtimestamp(session.host_time(), timezone.utc), secrets.token_hex(2))
    release_dir = paths_of.release(rid)
    server = None
    health = None
    if target.restart:
        # The oldest undone release's restore.json says exactly what ran before
        # it (unmasked: the manifest is the masked record for people).
        wire = session.run(ops.get_json(paths_of.restore(target.undo[-1])))
        session.options.masker.learn(wire)  # its env, argv and headers: masked in what follows
        recorded = RestoreSpec.from_wire(wire).plan if wire else None
        if recorded is None or recorded.server is None:
            raise OrchError(f"{label}: release {target.undo[-1]} has no restore record for its server")
        # a later rollback restarts in any case: the process that ran back then is forgotten
        server = replace(recorded.server, before_pid=None, before_starttime=None)
        health = recorded.health
    on_success = [ops.put_json(paths_of.state, AppliedState(list(target.new_applied)).to_wire())]
    on_success += [ops.release_update(state_dir, undone, {"undone_by": rid}) for undone in target.undo]
    plan = RestorePlan(
        files=[FileState(f.path, f.source, f.sha256, f.mode, f.uid, f.gid, expect=expected_after.get(f.path), n=n)
               for n, f in enumerate(target.files)],
        links=target.links, server=server, health=health, always=True,
        on_success=[op.wire() for op in on_success])
    record_files = [
        {"path": info["path"], "n": n, "existed": info["exists"], "mode": info.get("mode"),
         "uid": info.get("uid"), "gid": info.get("gid"), "sha256_before": info.get("sha256"),
         "sha256_after": f.sha256}
        for n, (info, f) in enumerate(zip(live, target.files, strict=True))
    ]
    # a record for people: masked by today's rules even where it copies an older release's record
    manifest = session.options.masker.record({
        "id": rid, "kind": "rollback", "host": label, "undid": list(target.undo),
        "to": target.new_applied[-1] if target.new_applied else None,
        "playbook": {"name": "(rollback)"}, "files": record_files,
        "links": [{"path": link.path, "from": link.expect, "to": link.target} for link in target.links],
        "server_before": newest.server_after.to_wire() if newest.server_after else None,
        "server_after": target.server_before.to_wire() if target.server_before else None,
        "restarted": target.restart, "flag_changes": [], "orch_version": __version__,
        "controller": lock_holder("rollback"), "created": session.host_time(), "outcome": RecordedOutcome.IN_PROGRESS,
    })
    # Each live file is backed up from itself on the host (not sent there and back), and only if it
    # still holds what was just read: a file changed since is refused, never backed up stale.
    backups = [{"path": i["path"], "n": n,
                "before": {"copy_of": i["real"], "sha256": i["sha256"]} if i["exists"] else None}
               for n, i in enumerate(live)]
    reporter.event(label, events.RollingBack(tuple(target.undo), tuple((link.path, link.target) for link in target.links),
                                             restart=server is not None))
    # The rollback is a release run by the host's runner, as a deploy's steps after its commit
    # are: armed (its guard), then handed on in the same round trip, so that from the moment
    # it changes anything the host carries it to its verdict by itself. Its program is the
    # one restore; a rollback's runner never restores on failure (``rollback_failed``).
    restore = ops.restore_release(release_dir, "rollback")
    program = ReleaseProgram(rid, "rollback")
    program.add(StepName.RESTORE, [restore])
    spec = restore_spec(rid, "rollback", plan, budget=rollback_budget(server, health))
    steps = [
        ops.release_create(state_dir, rid, manifest, backups, restore=spec),
        program.write(release_dir),
        ops.put_json(paths_of.journal, Journal(rid, "rollback", JournalStep.ROLLING_BACK, session.host_time(),
                                               controller=lock_holder("rollback")).to_wire()),
    ]
    if server is not None:
        steps.append(ops.mark(paths_of.server_touched(rid)))
    # a signal stops the following only: the runner finishes the rollback (it has nothing to restore to)
    follow = release_follow(release_dir, abort_on_cancel=False)
    steps += [ops.release_arm(state_dir, release_dir), release_run(release_dir, state_dir), follow,
              reported_op(release_dir, "rollback")]
    started = session.host_time()
    try:
        # a lost link is found again and the runner followed on; a signal only stops the following
        got = RunnerFollow(session, reporter, release_dir, "rollback", runner_progress(reporter, label)).run(
            steps, follow, abort_on_ctrl_c=False)
    except LinkLostError as gone:
        # without an answer in the window the rollback may be under way there: not known to be
        # healthy (exit 3)
        ending: endings.Ending = endings.LostAfterCommit(label, rid, str(gone), None, "rollback")
        return HostReport.ended(label, verdict(gone, Step.COMMITTING), release=rid, files=paths,
                                ending=ending, error=words(ending))
    if isinstance(got, StoppedFollowing):
        # once handed on, nothing is aborted (docs/CLI.md, "Signals"): the rollback is the host's
        # to finish, and this run cannot say how it ends: not known to be healthy (exit 3)
        ending = endings.StoppedFollowing(label, rid, "rollback", got.signame, got.reconnecting)
        return HostReport.ended(label, STOPPED_FOLLOWING, release=rid, files=paths,
                                ending=ending, error=words(ending))
    verdict_of = got.verdict
    record = runner_record(label, rid, verdict_of, program, restore, words)
    finished = session.host_time()
    session.run(ops.release_update(state_dir, rid, {"finished": finished,
                                                     "duration": round(finished - started, 3)}))
    # the command line goes back from the newest undone release's to the one the release current
    # now started (or, where it started none, the one that ran before the oldest undone): both as
    # asked and recorded (masked), not the process's argv, where a shim shows its real path
    now = releases.get(target.new_applied[-1]) if target.new_applied else None
    now_started = now.server_after if now is not None else None
    argvs = (list(newest.server_after.argv or []) if newest.server_after else [],
             list(then.argv or []) if (then := now_started or target.server_before) else [])
    return report_restore(label, rid, record, reporter, paths, "undid", target.undo,
                          target.new_applied[-1] if target.new_applied else None, words=words, extra={"summary": rollback_summary(target.undo, now, releases),
                                 "undid": list(target.undo),
                                 "current": target.new_applied[-1] if target.new_applied else None,
                                 "flag_changes": flag_change_fields(*argvs) if target.restart else [],
                                 "flag_changes_text": flag_changes(*argvs) if target.restart else []})
