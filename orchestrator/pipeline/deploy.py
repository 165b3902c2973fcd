"""One deploy on one host, as the contract's steps.

1 connect and lock · 2 plan · 3 stage and validate · 4 back up, journal,
arm the watchdog · 5 commit · 6 verification read · 7 restart · 8 health,
stability, the performance gate · 9 confirm · on any failure after 4, the
restore machine.

Each step is one method of ``Deployment`` and one round trip to the host's
helper. ``reached`` says how far the deploy got; when it ends in a failure,
``core.outcomes.verdict`` turns the cause, that step and the restore's own
record into the outcome and exit code. Every restore — this deploy's
automatic rollback, the host-side watchdog, ``orch rollback`` — is the same
host-side function running the release's ``restore.json`` (see
``host/restore.py``), so what is printed is what the host recorded.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from orchestrator import __version__
from orchestrator.core import endings, events
from orchestrator.core.budget import BudgetItem, deploy_budget, gate_items, restore_budget, total
from orchestrator.core.outcomes import (
    CHANGED,
    CHECK_REFUSED,
    PLANNED,
    STOPPED_FOLLOWING,
    UNCHANGED,
    UNSAFE,
    Outcome,
    Step,
    Verdict,
    committed_paths,
    verdict,
)
from orchestrator.core.predates import (
    commit_time,
    server_predates,
    server_whereabouts,
)
from orchestrator.core.preflight import (
    NOT_CHECKED,
    NOT_CHECKED_NOTE,
    PASSED,
    REFUSED,
    PreflightResult,
)
from orchestrator.core.regions import count_lines, view_ranges
from orchestrator.core.releases import (
    FileState,
    PrunePlan,
    drift_kept,
    new_release_id,
    ordered_ids,
    prune_plan,
)
from orchestrator.core.restore import (
    RestorePlan,
    RestoreRecord,
    ServerStart,
    ServerTarget,
    restore_spec,
)
from orchestrator.core.secrets import MASKED_NAMES, Masker, redact, secret_values
from orchestrator.core.target import HostTarget
from orchestrator.errors import (
    ContentChangedError,
    GateFailedError,
    LinkLostError,
    OrchError,
    PreflightRefusedError,
    RemoteError,
    Terminated,
    interruption,
    signal_name,
)
from orchestrator.host.program import StepName
from orchestrator.host.protocol_events import ReprobeEvent, StepEvent, event_from_wire
from orchestrator.host.protocol_verdict import (
    AnswersEvent,
    RestoringEvent,
    StepFailure,
    runner_event_of,
)
from orchestrator.host.records import (
    AppliedState,
    HostRecords,
    Journal,
    JournalStep,
    RecordedOutcome,
    ServerProcess,
    StatePaths,
)
from orchestrator.pipeline.events import Reporter, RunLog
from orchestrator.pipeline.failure import Ended, FailedRelease
from orchestrator.pipeline.fleet import LOST_AFTER_COMMIT
from orchestrator.pipeline.follow import RunnerFollow, StoppedFollowing
from orchestrator.pipeline.gate import SPEC_FILE, GateRun
from orchestrator.pipeline.locking import (
    current_release_dir,
    open_state,
    refuse_busy,
    release_lock,
)
from orchestrator.pipeline.plan import (
    HostPlan,
    ServerChange,
    Staged,
    make_plan,
    remove_quietly,
    server_log,
    server_pidfile,
    stage_and_validate,
    staged_preflight,
)
from orchestrator.pipeline.release import Handover, RestoreCut, restore_here
from orchestrator.pipeline.report import HostReport
from orchestrator.pipeline.session import ConnectOptions, HostSession, lock_holder
from orchestrator.pipeline.timings import StepClock
from orchestrator.shell import ops
from orchestrator.shell.agent_client import RemoteStepError
from orchestrator.shell.config_files import LoadedPlaybook
from orchestrator.shell.program import (
    ReleaseProgram,
    RunVerdict,
    StepResults,
    read_steps,
    release_stamp,
)
from orchestrator.shell.replies import Malformed

STOPPED_BY_CTRL_C = "stopped at the Ctrl-C above"
"""A deploy's live line when this controller's Ctrl-C stops it after the commit: the
acknowledgement already said "interrupted", the outcome line says it again at the end."""


@dataclass
class Deployment:
    """Steps 4–9 for one planned host; ``run`` returns the host's report."""

    session: HostSession
    plan: HostPlan
    staged: list[Staged]
    state_dir: str
    state: HostRecords
    reporter: Reporter
    release_id: str = ""
    release_dir: str = ""
    reached: Step = Step.PLANNING
    release_created: bool = False
    backup_sent: bool = False  # the backup was asked for: the release may exist even if no answer came
    deadline: float = 0.0  # when the watchdog acts unless confirmed: the host's wall time (host clock)
    clock: StepClock | None = None  # times the steps (``pipeline.timings``); one is made if none
    started_at: float = 0.0
    force_baseline: bool = False  # --baseline: probe the running server even where a record exists
    gate: GateRun | None = None
    commit_written: list[str] | None = None  # the host's record of what a failed commit batch wrote
    program: ReleaseProgram | None = None  # every step after the commit, kept in the release when it is armed
    readback: ops.Op | None = None  # the program's requests whose answers the deploy reads
    pruning: PrunePlan | None = None  # what the confirm prunes (decided before the commit)
    committed_shown: bool = False
    follower: RunnerFollow | None = None  # the runner's events followed, once the commit was sent
    failure_shown: bool = False  # the runner's "restoring" said why the deploy failed, as it happened
    restart_shown: bool = False
    runner_verdict: RunVerdict | None = None  # how the host's runner ended a failed release
    runner_record: RestoreRecord | None = None  # the restore it (or its guard) ran
    parser_check: ops.Op | None = None
    health_op: ops.Op | None = None
    baseline: list[ops.Op] | None = None
    after: list[ops.Op] | None = None

    def __post_init__(self) -> None:
        if self.clock is None:
            self.clock = StepClock(self.label, self.reporter)

    @property
    def timings(self) -> dict[str, float]:
        assert self.clock is not None
        return self.clock.timings

    @property
    def label(self) -> str:
        return self.session.target.name

    # ---------------------------------------------------------------- the steps

    def run(self) -> HostReport:
        self.started_at = self.session.host_time()
        self.release_id = new_release_id(datetime.fromtimestamp(self.started_at, timezone.utc),
                                         secrets.token_hex(2))
        self.release_dir = StatePaths(self.state_dir).release(self.release_id)
        try:
            self.gate = self._gate_run()
            self.back_up_and_arm()
            return self.commit_and_follow()
        except (OrchError, KeyboardInterrupt) as cause:
            return self.fail(cause)

    def back_up_and_arm(self) -> None:
        """Step 4: the release with its backups and restore plan, the journal, the watchdog."""
        self._start("backup")
        pb = self.plan.loaded.model
        change = self.plan.server
        extra = ([BudgetItem("pre-flight", self._preflight_timeout(), "server.preflight_timeout")]
                 if change and change.preflight else [])
        hooks = [h for h in (change.before_stop, change.after_healthy) if h] if change else []
        if hooks and pb.server is not None:
            extra.append(BudgetItem("hooks", len(hooks) * pb.server.hook_timeout, "server.hook_timeout"))
        if self.gate is not None and pb.gate is not None:
            extra += gate_items(pb.gate, baseline=bool(self.gate.to_probe))
        budget = total(deploy_budget(pb.server, pb.health, extra))
        self.deadline = self.session.host_time() + budget  # until the host says when exactly
        # bytes go as blob lines; the after copy is the staged file, already on the host
        staged = {s.file.path: s.staged for s in self.staged}
        files = [
            {"path": f.path, "n": f.index, "before": f.remote.data,
             "after": {"copy_of": staged[f.path], "sha256": f.new_sha256} if f.path in staged else f.new_bytes}
            for f in self.plan.changed_files
        ]
        spec = restore_spec(self.release_id, "deploy", self._restore_plan(), budget=budget,
                            started=self._started_record(),
                            mask=[str(v) for v in secret_values(self.plan.vars, self.plan.playbook.secret_names)])
        manifest = dict(self._manifest(), watchdog_budget=budget)
        self.program = self._program()
        self.backup_sent = True
        armed = self._handover().arm(
            [ops.release_create(self.state_dir, self.release_id, manifest, files, restore=spec)], self.program,
            ops.put_json(self._journal_path(), self._journal(JournalStep.BACKED_UP)))
        self.deadline = armed or self.deadline
        self.release_created = True
        self.reached = Step.ARMED
        self._stop("backup")
        self.reporter.event(self.label, events.BackedUp(len(files), self.release_id, self.deadline, runner=True))

    def commit_and_follow(self) -> HostReport:
        """Steps 5–9 in one round trip: compare-and-swap the files in, then the host's runner
        (``host/runner.py``) carries the release from the read-back to its verdict by itself;
        this controller prints its events as they come. The verdict is the host's whether
        or not the controller is still there to hear it."""
        assert self.program is not None
        steps: list[ops.Op] = []
        wire = [{"path": s.file.path, "staged": s.staged, "before": s.file.remote.sha256,
                 "after": s.file.new_sha256} for s in self.staged]
        if wire:
            steps += [ops.commit(wire, self.release_dir),
                      ops.put_json(self._journal_path(), self._journal(JournalStep.COMMITTED))]
        self.reached = Step.COMMITTING if wire else self.reached
        self._start("commit")
        before = self._steps() + [{"step": "commit", "at": round(self.session.host_time(), 3), "seconds": None}]
        self.follower = RunnerFollow(self.session, self.reporter, self.release_dir, "deploy", self._on_runner_event)
        try:
            got = self._handover().run(self.follower, steps, self.started_at, before)
        except RemoteStepError as e:
            if wire and e.op == "batch":
                # what the commit wrote, by the host's record: never assumed from where the batch failed
                self.commit_written = committed_paths(e.details)
                if self.commit_written == []:
                    self.reached = Step.ARMED  # the host says the commit wrote nothing
                    if e.kind == "changed":
                        raise ContentChangedError(f"{self.label}: {e.message}") from None
            raise
        finally:
            for phase in ("commit", "restart", "health", "gate"):
                self._stop(phase)
        if isinstance(got, StoppedFollowing):
            return self._stopped_following(got)
        return self._aborted(got.verdict) if got.aborted else self._verdict(got.verdict)

    def _handover(self) -> Handover:
        return Handover(self.session, self.state_dir, self.release_dir, "deploy")

    def _on_runner_event(self, ev: dict[str, Any]) -> None:
        """One event of the runner's log, as it comes: the step lines in the order the host
        ran them, each step's answers shown once it ended, progress on the live line."""
        said = runner_event_of(ev)
        if isinstance(said, AnswersEvent):
            self._on_answers(said.step, said.answers, said.judged)
            return
        if isinstance(said, RestoringEvent):
            if self.failure_shown:
                return
            # the host's runner restores now: say why, as the restore's progress follows
            failed = said.failed or StepFailure()
            reason = "interrupted (Ctrl-C)" if failed.aborted else self._redact(str(self._cause_of(failed, {})))
            self.failure_shown = True
            self._stop("commit")
            for phase in ("restart", "health", "gate", "confirm"):
                self._stop(phase)
            agent = self.session.agent
            if failed.aborted and agent is not None and agent.cancelled:
                reason = STOPPED_BY_CTRL_C  # this controller's: its acknowledgement named the Ctrl-C
            self.reporter.event(self.label, events.DeployFailed(reason, rolling_back=True))
            return
        event = event_from_wire(ev)
        if isinstance(event, StepEvent):
            if event.state == StepEvent.BEGAN:
                self._on_step_began(event.step)
            return
        if isinstance(event, ReprobeEvent):
            self.reporter.event(self.label, events.GateReprobe(tuple(event.probes)))
            return
        self.reporter.progress(self.label, ev)

    def _on_step_began(self, step: str) -> None:
        if self.staged and not self.committed_shown:
            self.committed_shown = True  # the runner's first step: the commit is done
            self.reporter.event(self.label, events.Committed(len(self.staged)))
        change = self.plan.server
        if step in (StepName.BEFORE_STOP.value, StepName.BASELINE.value, StepName.STOP.value,
                    StepName.START.value) and self.reached < Step.RESTARTING:
            self.reached = Step.RESTARTING
            self._stop("commit")
            self._start("restart")
        if step == StepName.BASELINE.value and self.gate is not None:
            self.reporter.event(self.label, events.GateBaseline(tuple(p.label for p in self.gate.to_probe)))
        if step in (StepName.STOP.value, StepName.START.value) and not self.restart_shown and change is not None:
            self.restart_shown = True
            self.reporter.event(self.label, events.Restarting(tuple(self._shown_argv(change.after_argv) or [])))
        if step == StepName.HEALTH.value:
            self._stop("restart")
            self._start("health")
        elif step == StepName.GATE.value:
            self._stop("health")
            self._start("gate")
        elif step == StepName.CONFIRM.value:
            for phase in ("commit", "restart", "health", "gate"):
                self._stop(phase)
            self.reached = Step.CONFIRMING
            self._start("confirm")

    def _on_answers(self, step: str, answers: Any, judged: Any) -> None:
        """What a step that ended answered, shown: the ``sed -n`` view, the pre-flight's
        acceptance, health, the gate's verdicts."""
        assert self.program is not None
        try:
            results = read_steps(self.program.steps, {step: answers}, [step],
                                 {step: judged} if isinstance(judged, dict) else None)
        except (Malformed, ValueError):
            return  # a step this controller did not plan (a newer runner): nothing of ours to show
        if step in (StepName.READ_BACK.value, StepName.PREFLIGHT.value):
            self._show_checks(results, committed=False)
        elif step == StepName.HEALTH.value:
            self._show_healthy(results)
        elif step == StepName.GATE.value and self.gate is not None and isinstance(judged, dict):
            self.reporter.gate(self.label, self.gate.take_judged(judged))

    def _stopped_following(self, stop: StoppedFollowing) -> HostReport:
        """A second Ctrl-C, or SIGTERM/SIGHUP after the commit: one line naming the release and
        where its verdict is; exit 3. A signal aborts nothing: the runner goes on as it was."""
        ending = endings.StoppedFollowing(self.label, self.release_id, "deploy", stop.signame, stop.reconnecting)
        return HostReport.ended(
            self.label, STOPPED_FOLLOWING, release=self.release_id,
            files=[f.path for f in self.plan.changed_files], extra={"timings": self.timings},
            ending=ending, error=self._words(ending))

    def _verdict(self, v: RunVerdict) -> HostReport:
        """The runner's verdict as this host's report: confirmed, or the failure it restored."""
        if v.confirmed:
            return self._confirmed(v)
        self.runner_verdict = v
        self.runner_record = RestoreRecord.from_wire(v.restore) if v.restore else None
        if v.verdict == RunVerdict.NOT_CONFIRMED:
            return self._restored_before_confirm(self.runner_record)
        # no step failed when the guard restored (the runner died, or outlived the backstop): its reason
        e = self._cause_of(v.failure(), v.results)
        if isinstance(e, RemoteStepError) and e.kind == "gate" and self.gate is not None:
            self.reporter.gate(self.label, self.gate.take_judged(e.details))
            raise GateFailedError(e.message)
        raise self._step_failure(e) if isinstance(e, RemoteStepError) else e

    def _cause_of(self, failed: StepFailure, results: dict[str, Any]) -> OrchError:
        """The error a step the runner failed stands for (as if this controller had run it)."""
        details = dict(failed.details or {}, program_step=failed.step, results=results)
        e = RemoteStepError("release_steps", failed.kind, failed.message or "the host's runner failed", details)
        if e.kind == "gate" and failed.step == StepName.GATE.value:
            return e
        return self._step_failure(e)

    def _aborted(self, v: RunVerdict) -> HostReport:
        """Ctrl-C after the commit was sent: the runner aborted and restored (its verdict was
        followed to the end); a runner that had confirmed already keeps the release."""
        if v.confirmed:
            self.reporter.event(self.label, events.InterruptedAfterConfirm(self.release_id))
            return self._confirmed(v)
        self.runner_verdict = v
        self.runner_record = RestoreRecord.from_wire(v.restore) if v.restore else None
        raise KeyboardInterrupt

    def _show_checks(self, answers: StepResults, committed: bool) -> None:
        """The commit, the ``sed -n`` view of each file the host read back as planned (the
        executor compared the sha256), the pre-flight's acceptance: as far as they went."""
        if committed:
            self.reporter.event(self.label, events.Committed(len(self.staged)))
        if self.readback is not None and self.readback in answers:
            for f in self.plan.changed_files:
                # The host's file hashes to the planned text, so that text is what it holds:
                # the view shows it without the file crossing the link a fourth time.
                text = f.plan.result
                ranges = view_ranges(f.plan.changes, count_lines(text), context=3)
                self.reporter.readback(self.label, f.path, text, ranges)
        if self.parser_check is not None and self.parser_check in answers:
            self.reporter.event(self.label, events.PreflightAccepted())

    def _step_failure(self, e: RemoteStepError) -> OrchError:
        """The error a step the host's executor failed stands for (the same as when the
        controller judged it): a file that reads back wrong, the server's parser refusing."""
        if e.kind == "readback":
            return RemoteError(e.message)
        if e.kind == "refused" and e.details.get("program_step") == StepName.PREFLIGHT.value:
            answer = e.details.get("answer")
            if isinstance(answer, dict):
                result = PreflightResult.from_wire(answer)
                return PreflightRefusedError(self._redact(result.refusal()))
        return e

    def _program(self) -> ReleaseProgram:
        """Every step after the commit, as requests: kept in the release when it is armed,
        then run by the host's executor a part at a time (``shell.program``)."""
        program = ReleaseProgram(self.release_id, "deploy")
        changed = self.plan.changed_files
        if self.staged:
            self.readback = ops.read([f.path for f in changed], with_data=False)
            program.add(StepName.READ_BACK, [self.readback],
                        expect={"sha256": {f.path: f.new_sha256 for f in changed}})
        change = self.plan.server
        if change is None:
            return self._with_confirm(program)
        if change.restart and change.preflight:
            self.parser_check = ops.preflight(change.preflight, cwd=change.after_cwd, env=change.after_env,
                                              replace_env=change.replace_env, timeout=self._preflight_timeout())
            program.add(StepName.PREFLIGHT, [self.parser_check], expect={"rc": 0})
        if not change.restart:
            return self._with_confirm(program)
        spec = self._server_target()
        assert spec is not None
        hook_timeout = self.plan.loaded.model.server.hook_timeout if self.plan.loaded.model.server else 300.0
        if change.before_stop:
            # drain first; a failing hook stops the program here: nothing is stopped
            program.add(StepName.BEFORE_STOP, [ops.mark(f"{self.release_dir}/drained"),
                                               ops.run_ok(change.before_stop, timeout=hook_timeout)])
        gate = self.gate
        if gate is not None and gate.to_probe:
            # the gate's baseline: the server as it runs now (drained, like the new one will be measured)
            self.baseline = gate.baseline_ops()
            program.add(StepName.BASELINE, self.baseline)
        if change.manager == "commands":
            if change.before is not None and change.stop:
                program.add(StepName.STOP, [ops.run_ok(change.stop, timeout=spec.stop_timeout + 60)])
            pid_cmd = self.plan.playbook.server.pid if self.plan.playbook.server else None
            program.add(StepName.START, [ops.commands_start(change.start or [], pid_cmd)])
        else:
            before = change.before
            if before is not None and before.pid:
                program.add(StepName.STOP, [ops.server_stop(before.pid, before.pgid, spec.stop_timeout, spec.port,
                                                            spec.free_timeout)])
            program.add(StepName.START, [ops.server_start(change.after_argv or [], change.after_cwd,
                                                          change.after_env, spec.log, spec.pidfile,
                                                          change.replace_env)])
        program.prepend([StepName.STOP, StepName.START],
                        [ops.mark(StatePaths(self.state_dir).server_touched(self.release_id))])
        # the journal's step for status and for an older orch, before anything is stopped
        program.prepend([StepName.BEFORE_STOP, StepName.STOP, StepName.START],  # not the baseline: its answers are probes
                        [ops.put_json(self._journal_path(), self._journal(JournalStep.RESTARTING))])
        health = self._health_wire(for_restore=False)
        if health is not None:
            # poll health while watching the process just started
            self.health_op = ops.health_wait(health, pid="started")
            program.add(StepName.HEALTH, [self.health_op])
        if gate is not None:
            self.after = gate.after_ops()  # the new server, once healthy and stable: judged on the host
            program.add(StepName.GATE, self.after, expect={"gate": gate.judge_spec()})
        if change.after_healthy:
            program.add(StepName.AFTER_HEALTHY, [ops.run_ok(change.after_healthy, timeout=hook_timeout)])
        return self._with_confirm(program)

    def _with_confirm(self, program: ReleaseProgram) -> ReleaseProgram:
        """The confirm step: the claim, and the records it writes — every one known now, before
        the commit, so that the host's runner confirms without this controller: the run's
        figures (``release_stamp``, from the host's own record of the run), the state, the
        journal, the pruning, the run log, the lock given back."""
        applied = self.state.applied + [self.release_id]
        releases = ordered_ids(self.state.releases) + [self.release_id]  # its seq is the newest
        keep = self.plan.playbook.keep_releases or self.session.target.keep_releases
        self.pruning = prune_plan(releases, applied, keep, drift_kept(self.state.releases))
        gate_records: list[ops.Op] = []
        stamp_gate = None
        if self.gate is not None:
            gate_records = [ops.put_json(f"{self.release_dir}/{SPEC_FILE}", self.gate.spec_record())]
            stamp_gate = self.gate.stamp_template()
        records = [
            release_stamp(self.state_dir, self.release_id, self.release_dir, self.started_at, [], stamp_gate,
                          fields={"outcome": RecordedOutcome.DEPLOYED}),
            *gate_records,
            ops.put_json(StatePaths(self.state_dir).state, AppliedState(applied).to_wire()),
            ops.put_json(self._journal_path(), self._journal(JournalStep.CONFIRMED, finished=True)),
            ops.release_prune(self.state_dir, self.pruning.remove, keep),
            self._log_op(f"release {self.release_id} is current"),
            ops.lock_release(self.state_dir),
        ]
        program.add(StepName.CONFIRM, [ops.confirm_release(self.release_dir, records)])
        return program

    def _show_healthy(self, answers: StepResults) -> None:
        if self.health_op is not None and self.health_op in answers:
            got = answers[self.health_op]
            self.reporter.event(self.label, events.Healthy(got["elapsed"], got["polls"], got.get("stable_for")))

    def _confirmed(self, v: RunVerdict | None = None) -> HostReport:
        """Step 9 as the runner did it: the release is current; what was pruned or held."""
        self._stop("confirm")
        if v is not None and self.clock is not None:
            self.clock.adopt(v.stamped_steps())
        self.reporter.event(self.label, events.ReleaseCurrent(self.release_id))
        assert self.pruning is not None
        for rid, paths in self.pruning.held.items():
            self.reporter.event(self.label, events.HeldForDrift(rid, tuple(paths)))
        in_effect = len(self.state.applied) + 1
        keep = self.plan.playbook.keep_releases or self.session.target.keep_releases
        if in_effect > keep:
            self.reporter.event(self.label, events.ManyInEffect(in_effect, keep))
        return HostReport.ended(
            self.label, CHANGED, release=self.release_id,
            files=[f.path for f in self.plan.changed_files],
            extra={**flag_change_report(self.plan.server), "timings": self.timings, **self._gate_report(),
                   **self._server_predates()},
        )

    def _server_predates(self) -> dict[str, Any]:
        """Files changed and no restart: a server that started before the commit still runs
        the code it loaded then. Says so in a note; ``server_predates_release`` in the report
        (None: could not be told). One read-only round trip, after the lock is given back;
        absent where the release restarted the server or changed no file."""
        if not self.plan.changed_files or (self.plan.server is not None and self.plan.server.restart):
            return {}
        pidfile, port = server_whereabouts(self.state, self.session.target)
        try:
            server = ServerProcess.from_wire(self.session.run(ops.server_find(pidfile, port)))
        except OrchError:
            return {"server_predates_release": None}  # the release stands; only this note is unknown
        predates = server_predates(server, commit_time(self._steps()))
        if predates and server is not None:
            self.reporter.event(self.label, events.ServerPredates(server.pid, server.started_at))
        return {"server_predates_release": predates}

    # ---------------------------------------------------------------- failure

    def fail(self, cause: BaseException) -> HostReport:
        """Any failure after the plan: close or restore the release, then the verdict
        (``pipeline.failure``, the same for a night)."""
        reason = self._reason(cause)
        if isinstance(cause, LinkLostError):
            return self._lost(cause, reason)
        if not self.release_created and not (self.backup_sent and isinstance(cause, KeyboardInterrupt)):
            # a Ctrl-C while the backup was asked for may have left a release behind: closed below
            self._remove_staged()
            return self._lost(cause, reason)
        changed = self.reached >= Step.COMMITTING
        interrupted = isinstance(cause, KeyboardInterrupt)
        if interrupted and not changed:
            reason = f"{interruption(cause)} before the commit: nothing on the host was changed"
        if not self.failure_shown and (changed or not interrupted):
            # an interruption is said once: the acknowledgement names it, the live line says
            # what this host does about it (a SIGTERM's had no acknowledgement: its reason),
            # the host's outcome line says how it ended
            ctrl_c = interrupted and not isinstance(cause, Terminated)
            self.reporter.event(self.label, events.DeployFailed(STOPPED_BY_CTRL_C if ctrl_c else reason,
                                                                rolling_back=changed))
        record: RestoreRecord | None = self.runner_record
        if self.runner_verdict is not None:
            # the host's runner restored it (or its guard did): its record is the one, and its time
            raw = self.runner_verdict.restore or {}
            began, ended = raw.get("started"), raw.get("finished")
            if isinstance(began, int | float) and isinstance(ended, int | float) and self.clock is not None:
                self.clock.adopt([{"step": "rollback", "at": began, "seconds": round(ended - began, 3)}])
            if record is None:
                return self._ended(self._failed().runner_could_not_restore(reason, self.runner_verdict.event.error))
        else:
            pb = self.plan.loaded.model
            self._start("rollback")
            try:
                got = restore_here(self.session, self.release_dir, total(restore_budget(pb.server, pb.health)),
                                   reason, lambda ev: self.reporter.progress(self.label, ev))
            finally:
                self._stop("rollback")
            if isinstance(got, RestoreCut):
                cut = self._failed().cut(got, reason, self.reached)
                if cut is None:  # the Ctrl-C came before the host made the release: nothing to close
                    self._remove_staged()
                    return self._lost(cause, reason)
                return self._ended(cut)
            record = got
        if not changed:
            self._remove_staged()
        # the runner recorded its own words for the failure; these are the controller's, as printed
        return self._restored(cause, reason, record, lambda v, ending: self._close_record(
            v.outcome, ending, reason if self.runner_verdict is not None else None))

    def _failed(self) -> FailedRelease:
        return FailedRelease("deploy", self.label, self.release_id, self.release_dir, self.reporter, self._redact)

    def _remove_staged(self) -> None:
        """Before the commit, a failed deploy leaves no staged copy beside its targets (best effort:
        the helper also removes them when its controller goes away)."""
        if self.staged and self.session.link_alive:
            with contextlib.suppress(OrchError):
                self.session.run(ops.remove([s.staged for s in self.staged]))

    def _restored_before_confirm(self, record: RestoreRecord | None) -> HostReport:
        """The guard (or a person's ``orch rollback``) restored the release before it could confirm."""
        failed = self._failed()
        if record is None:
            return self._ended(failed.restoring_without_record())
        why = failed.unconfirmed_reason()
        return self._restored(RemoteError(why), why, record, lambda v, ending: None)

    def _restored(self, cause: BaseException, reason: str, record: RestoreRecord,
                  close: Callable[[Verdict, endings.Ending], None]) -> HostReport:
        """The host's report from its record of the restore (``FailedRelease.restored``)."""
        done = events.RestoreAccount(record, tuple(f.path for f in self.plan.changed_files),
                                     tuple(self.commit_written or ()))
        failed = self.runner_verdict.failed if self.runner_verdict is not None else None
        got = self._failed().restored(cause, reason, done, self.reached, failed, close)
        return HostReport.ended(self.label, got.verdict, release=self.release_id,
                                files=[f.path for f in self.plan.changed_files], error=self._words(got.ending),
                                ending=got.ending, extra={"restore": done, "drift": [f.path for f in record.drift],
                                                          "timings": self.timings, **self._gate_report()})

    def _ended(self, ended: Ended) -> HostReport:
        """A failure's report where no restore record came back."""
        shown = self.reached >= Step.COMMITTING or ended.outcome == UNSAFE.outcome
        return HostReport.ended(self.label, ended.verdict, release=self.release_id or None,
                                files=[f.path for f in self.plan.changed_files] if shown else [],
                                error=self._words(ended.ending), ending=ended.ending, extra={"timings": self.timings})

    def _lost(self, cause: BaseException, reason: str) -> HostReport:
        """A failure with no restore to run: the link lost (before or after the commit), or a
        failure before the host held a release."""
        v: Verdict = verdict(cause, self.reached)
        ending: endings.Ending | None = None
        extra: dict[str, Any] = {"timings": self.timings}
        if isinstance(cause, LinkLostError):
            if self.reached >= Step.COMMITTING:
                # a fleet follows it again before its next batch (``pipeline.fleet.follow_lost``)
                extra[LOST_AFTER_COMMIT] = {"release_dir": self.release_dir,
                                              "events_seen": self.follower.lines_seen if self.follower else 0}
                ending = endings.LostAfterCommit(self.label, self.release_id, reason, self.deadline)
            elif self.release_created:
                ending = endings.LostBeforeCommit(self.label, self.release_id, reason, self.deadline)
            else:
                ending = endings.LostBeforeChange(reason)
        return HostReport(self.label, v.outcome, v.exit_code, release=self.release_id or None,  # type: ignore[arg-type]
                          files=[f.path for f in self.plan.changed_files] if self.reached >= Step.COMMITTING else [],
                          error=self._words(ending) if ending else reason, ending=ending, extra=extra)

    def _words(self, ending: endings.Ending) -> str:
        """The ending's sentence, in the words the CLI gave (``ConnectOptions.words``)."""
        return self.session.options.words(ending)

    def _close_record(self, outcome: str, ending: endings.Ending, reason: str | None = None) -> None:
        """Timings, the outcome and the run log, ending with how the run ended, into the release
        (best effort: the link may be gone)."""
        finished = self.session.host_time()
        with contextlib.suppress(OrchError):
            self.session.batch([
                ops.release_update(self.state_dir, self.release_id, {
                    "finished": finished, "timings": self.timings, "steps": self._steps(),
                    "duration": round(finished - self.started_at, 3), **self._gate_fields(),
                    **({"error": reason} if reason else {}),
                    **({"outcome": Outcome.FAILED} if outcome == Outcome.FAILED else {})}),
                self._log_op(ending),
            ])

    def _reason(self, cause: BaseException) -> str:
        if isinstance(cause, KeyboardInterrupt):
            return interruption(cause)
        if isinstance(cause, RemoteStepError) and cause.log_tail:
            self.reporter.server_log(self.label, "server log (last 40 lines)", cause.log_tail)
        return self._redact(str(cause))

    # ---------------------------------------------------------------- the gate

    def _gate_run(self) -> GateRun | None:
        """The playbook's gate for this deploy, with its baseline decided: the current
        release's record where it measured the server running now, else a probe before the stop."""
        spec = self.plan.playbook.gate
        change = self.plan.server
        if spec is None or change is None or not change.restart:
            return None
        running = self._shown_argv(change.before.argv if change.before else None)
        return GateRun.for_deploy(spec, self.state.current, running, running=change.before is not None,
                                  force_baseline=self.force_baseline)

    def _gate_fields(self) -> dict[str, Any]:
        """The manifest's ``gate`` (the verdicts) and ``probe`` (the new server's figures)."""
        if self.gate is None or self.gate.outcome is None:
            return {}
        return {"gate": self.gate.outcome.to_json(), "probe": self.gate.record()}

    def _gate_report(self) -> dict[str, Any]:
        """``--json``'s ``gate`` object for this host."""
        if self.gate is None or self.gate.outcome is None:
            return {}
        return {"gate": self.gate.outcome.to_json()}

    # ---------------------------------------------------------------- records

    def _restore_plan(self) -> RestorePlan:
        """What the watchdog, the automatic rollback or ``orch rollback`` restores: complete from the start."""
        files = [
            FileState(f.path, StatePaths(self.state_dir).copy(self.release_id, f.index, "before"), f.remote.sha256,
                      f.remote.mode,
                      f.remote.uid, f.remote.gid, expect=f.new_sha256, n=f.index)
            for f in self.plan.changed_files
        ]
        change = self.plan.server
        server = self._server_target() if change is not None and change.restart else None
        health = self._health_wire(for_restore=True) if server is not None and change and change.before else None
        return RestorePlan(files=files, server=server, health=health)

    def _server_target(self) -> ServerTarget | None:
        """The server as it ran before this release: what a restore brings back."""
        rendered = self.plan.playbook.server
        change = self.plan.server
        if rendered is None or change is None:
            return None
        target = self.session.target
        before = change.before or ServerProcess()
        start = None
        if change.manager == "process" and before.argv:
            start = ServerStart(list(before.argv), before.cwd, dict(before.env), True)
        hook_timeout = self.plan.loaded.model.server.hook_timeout if self.plan.loaded.model.server else 300.0
        return ServerTarget(
            manager=change.manager,
            start=start,
            pidfile=server_pidfile(target, self.plan.playbook),
            log=server_log(target, self.plan.playbook),
            port=change.port,
            stop_timeout=rendered.stop_timeout,
            free_timeout=rendered.free_timeout,
            before_pid=before.pid,
            before_starttime=before.starttime,
            stop_cmd=list(change.stop or []) if change.manager == "commands" else None,
            start_cmd=list(change.restore_start or []) if change.manager == "commands" and change.before else None,
            pid_cmd=list(rendered.pid or []) if rendered.pid else None,
            after_healthy=list(change.restore_after_healthy) if change.restore_after_healthy else None,
            hook_timeout=hook_timeout,
        )

    def _started_record(self) -> dict[str, Any] | None:
        """The command line this release starts: a later deploy starts it again
        if the server has died by then (restore.json, unmasked)."""
        change = self.plan.server
        if change is None or change.manager != "process" or not change.after_argv:
            return None
        return ServerStart(change.after_argv, change.after_cwd, change.after_env or {},
                           change.replace_env).to_wire()

    def _health_wire(self, *, for_restore: bool) -> dict[str, Any] | None:
        health = self.plan.playbook.health
        if health is None:
            return None
        checks = []
        for c in health.checks:
            check: dict[str, Any] = {"method": c.method, "path": c.path, "json": c.json, "status": c.status,
                                     "headers": dict(c.headers or {})}
            if not for_restore:  # the previous server need not know the new flag
                check["expect"] = dict(c.expect or {})
                check["body"] = c.body
            checks.append(check)
        return {"base_url": health.base_url, "checks": checks, "timeout": health.timeout,
                "interval": health.interval, "stable_for": health.stable_for}

    def _manifest(self) -> dict[str, Any]:
        target = self.session.target
        loaded = self.plan.loaded
        change = self.plan.server
        before = change.before if change else None
        server = self._server_target()
        health = self._health_wire(for_restore=True)
        # A record for people: ``Masker.record`` masks the headers, the environments by the rule,
        # the command lines' secret flags and every known value. What a restore runs is in restore.json.
        return self.masker.record({
            "id": self.release_id,
            "kind": "deploy",
            "host": target.name,
            "playbook": {"name": self.plan.playbook.name, "path": str(loaded.path), "sha256": loaded.sha256},
            "vars": redact(self.plan.vars, self.plan.playbook.secret_names),
            MASKED_NAMES: list(self.plan.loaded.model.secrets),  # names, for rollback and status
            "files": [
                {"path": f.path, "n": f.index, "existed": True, "mode": f.remote.mode, "uid": f.remote.uid,
                 "gid": f.remote.gid, "sha256_before": f.remote.sha256, "sha256_after": f.new_sha256}
                for f in self.plan.changed_files
            ],
            "server_spec": ({"manager": server.manager, "pidfile": server.pidfile, "log": server.log,
                             "port": server.port, "stop_timeout": server.stop_timeout}
                            if server is not None else None),
            "health": health,
            "server_before": (
                {"argv": self._shown_argv(before.argv), "cwd": before.cwd, "env": before.env, "pid": before.pid,
                 "found_by": before.found_by}
                if before else None
            ),
            "server_after": (
                {"argv": self._shown_argv(change.after_argv), "cwd": change.after_cwd,
                 "env": change.after_env}
                if change and change.restart else None
            ),
            "restarted": bool(change and change.restart),
            "flag_changes": [self._redact(c) for c in (change.flag_changes if change else [])],
            # flags declared in orch's blocks this release leaves, and those another release in
            # effect declares for it (core.declarations; an older manifest has neither)
            "declares": self.plan.declares,
            "provided_by": self.plan.provided_by,
            "watchdog_deadline": self.deadline,
            "orch_version": __version__,
            "controller": lock_holder("deploy"),
            "created": self.session.host_time(),  # host clock, like every time in the host's records
            "outcome": RecordedOutcome.IN_PROGRESS,
        })

    def _journal(self, step: JournalStep, finished: bool = False) -> dict[str, Any]:
        return Journal(self.release_id, "deploy", step, self.session.host_time(), finished,
                       playbook=self.plan.playbook.name, controller=lock_holder("deploy")).to_wire()

    def _journal_path(self) -> str:
        return StatePaths(self.state_dir).journal

    def _log_op(self, last: str | events.Event) -> ops.Op:
        """The op that writes this run's log into the release (made safe by ``RunLog.text``)."""
        log = self.reporter if isinstance(self.reporter, RunLog) else RunLog(self.reporter, self.masker,
                                                                             self.session.options.words)
        return ops.release_log(self.state_dir, self.release_id, log.text(end=last))

    def _preflight_timeout(self) -> float:
        server = self.plan.loaded.model.server
        return server.preflight_timeout if server is not None else 120.0

    def _steps(self) -> list[dict[str, Any]]:
        """The steps so far as fields, on the host's clock (``StepClock.steps``)."""
        assert self.clock is not None
        return self.clock.steps(self.session.host_time)

    @property
    def _phases_started(self) -> set[str]:
        assert self.clock is not None
        return self.clock.begun

    def _start(self, step: str) -> None:
        assert self.clock is not None
        self.clock.start(step)

    def _stop(self, step: str) -> None:
        assert self.clock is not None
        self.clock.stop(step)

    @property
    def masker(self) -> Masker:
        """The run's (``ConnectOptions.masker``): it knows this plan's secrets (``HostPlan.teach``)."""
        return self.session.options.masker

    def _redact(self, text: str) -> str:
        return self.masker.text(text)

    def _shown_argv(self, argv: list[str] | None) -> list[str] | None:
        return self.masker.argv(argv) if argv is not None else None


def flag_change_report(change: ServerChange | None) -> dict[str, Any]:
    """``--json``'s flag changes: ``flag_changes`` as fields (``{"flag", "from", "to"}``, a flag
    absent on one side is null) and ``flag_changes_text``, the lines people read (secrets masked)."""
    return {"flag_changes": list(change.flag_fields) if change else [],
            "flag_changes_text": list(change.flag_changes) if change else []}


def deploy_host(
    target: HostTarget,
    loaded: LoadedPlaybook,
    cli_vars: dict[str, Any],
    options: ConnectOptions,
    reporter: Reporter,
    *,
    check: bool = False,
    baseline: bool = False,
) -> HostReport:
    """The whole story on one host; every error becomes this host's report.

    ``baseline``: a performance gate probes the running server before the
    stop even where the current release has a record to compare with.
    Every report carries ``timings``: the seconds each step took
    (``pipeline.timings``), as far as the host got.
    """
    label = target.name
    reporter = RunLog(reporter, options.masker, options.words)
    clock = StepClock(label, reporter)
    reached = Step.CONNECTING
    session = HostSession(target, options)
    try:
        clock.start("connect")
        with session:
            clock.stop("connect")
            reached = Step.PLANNING
            result = _deploy_in_session(session, loaded, cli_vars, options, reporter, check, clock, baseline)
            result.extra["round_trips"] = session.round_trips
            result.extra["execs"] = session.execs
            result.extra["timings"] = clock.timings
            result.extra["steps"] = clock.steps(session.host_time)
            result.extra["events"] = [e.to_wire() for e in reporter.events]  # what was said, as fields
            return result
    except (OrchError, KeyboardInterrupt) as cause:
        clock.stop("connect")
        v = verdict(cause, reached)
        ending: endings.Ending | None = None
        if isinstance(cause, KeyboardInterrupt):
            ending = endings.InterruptedBeforeChange(signame=signal_name(cause))
        elif isinstance(cause, LinkLostError):
            ending = endings.LostBeforeChange(str(cause))
        return HostReport(label, v.outcome, v.exit_code,  # type: ignore[arg-type]
                          error=options.words(ending) if ending else str(cause), ending=ending,
                          extra={"timings": clock.timings, "steps": clock.steps(session.host_time),
                                 "events": [e.to_wire() for e in reporter.events]})


def _deploy_in_session(
    session: HostSession,
    loaded: LoadedPlaybook,
    cli_vars: dict[str, Any],
    options: ConnectOptions,
    reporter: Reporter,
    check: bool,
    clock: StepClock,
    baseline: bool = False,
) -> HostReport:
    label = session.target.name
    if check:
        return _check(session, loaded, cli_vars, reporter, clock)
    with clock.step("lock"):
        state_dir, state = open_state(session, f"deploy {loaded.display}", options.break_lock, reporter)
    try:
        refuse_busy(label, state)
        if state.journal is not None and state.journal.step == JournalStep.RESTORED_BY_WATCHDOG:
            reporter.event(label, events.WatchdogRestoredEarlier(str(state.journal.release)))
        with clock.step("plan"):
            plan = make_plan(session, loaded, cli_vars, current_release_dir=current_release_dir(state), state=state)
        plan.teach(options.masker)
        for note in plan.notes:
            reporter.event(label, events.PlanNote(note))
        reporter.plan(label, plan)
        if not plan.changed:
            reporter.event(label, events.AlreadyAsPlanned())
            # the lock goes back with the helper's goodbye as the session closes: no round trip
            return HostReport.ended(label, UNCHANGED)
        with clock.step("stage"):
            staged = stage_and_validate(session, plan, keep=True)
        if staged:
            reporter.event(label, events.Staged(len(staged)))
        report = Deployment(session, plan, staged, state_dir, state, reporter, clock=clock,
                            force_baseline=baseline).run()
        if report.outcome != Outcome.CHANGED:  # a confirmed deploy gave the lock back with its confirm
            release_lock(session, state_dir)
        return report
    except BaseException:
        release_lock(session, state_dir)
        raise


def _check(
    session: HostSession, loaded: LoadedPlaybook, cli_vars: dict[str, Any], reporter: Reporter,
    clock: StepClock,
) -> HostReport:
    label = session.target.name
    state = session.run(ops.state_read(session.target.state_dir))  # reads, creates nothing
    refuse_busy(label, state)  # --check exits 2 where a deploy would refuse
    with clock.step("plan"):
        plan = make_plan(session, loaded, cli_vars, check=True, current_release_dir=current_release_dir(state),
                         state=state)
    plan.teach(session.options.masker)
    reporter.plan(label, plan)
    for note in plan.notes:  # the same level as the deploy's: a layout found is news, not a warning
        reporter.event(label, events.PlanNote(note))
    if not plan.changed and plan.refusal is None:
        reporter.event(label, events.CheckUnchanged())
        return HostReport.ended(label, UNCHANGED)
    change = plan.server
    runs_preflight = plan.refusal is None and change is not None and change.restart and bool(change.preflight)
    with clock.step("stage"):
        # kept (not cleaned beside the targets: --check holds no lock) until the pre-flight read them
        staged = stage_and_validate(session, plan, keep=runs_preflight, clean_stale=False)
    if plan.refusal is not None:
        reporter.event(label, events.CheckValidated(would_refuse=True))
        return HostReport.ended(label, CHECK_REFUSED, files=[f.path for f in plan.changed_files], error=plan.refusal)
    preflight = _check_preflight(session, plan, staged, reporter) if runs_preflight else None
    notes = list(plan.notes) + ([NOT_CHECKED_NOTE] if preflight == NOT_CHECKED else [])
    if isinstance(preflight, PreflightResult):
        reporter.event(label, events.CheckValidated(preflight_refused=True))
        return HostReport.ended(label, CHECK_REFUSED, files=[f.path for f in plan.changed_files],
                                error=session.options.masker.text(preflight.refusal(staged=True)),
                                extra={"preflight": REFUSED})
    reporter.event(label, events.CheckValidated())
    return HostReport.ended(
        label, PLANNED,
        files=[f.path for f in plan.changed_files],
        notes=notes,
        extra={"restart": bool(change and change.restart), "preflight": preflight, **flag_change_report(change)},
    )


def _check_preflight(
    session: HostSession, plan: HostPlan, staged: list[Staged], reporter: Reporter,
) -> str | PreflightResult:
    """``--check``'s pre-flight, on the staged copies, which it then removes (one round trip; the
    helper removes them too if this controller goes away). ``PASSED``, ``NOT_CHECKED``, or the
    refusing parser's result."""
    label = session.target.name
    change = plan.server
    assert change is not None and change.preflight
    copies = [s.staged for s in staged]
    try:
        command = staged_preflight(plan, {s.file.path: s.staged for s in staged})
        if command is None:
            reporter.event(label, events.PreflightNotChecked())
            if copies:
                session.run(ops.remove(copies))
            return NOT_CHECKED
        server = plan.loaded.model.server
        check = ops.preflight(command.argv, cwd=change.after_cwd, env=command.env, replace_env=change.replace_env,
                              timeout=server.preflight_timeout if server is not None else 120.0, staged=copies)
        steps = [check, ops.remove(copies)] if copies else [check]
        result: PreflightResult = session.batch(steps)[check]
    except BaseException:
        remove_quietly(session, copies)
        raise
    if not result.ok:
        return result
    reporter.event(label, events.PreflightAccepted(staged=True))
    return PASSED
