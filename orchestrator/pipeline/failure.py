"""How a failed release ends: written once for a deploy and a night.

Once a release exists on the host, a deploy and a night fail alike. The host's restore
machine puts back what the release changed — run by the release's runner, by its guard, by
this controller (``pipeline.release.restore_here``) or by a person's ``orch rollback`` — and
the run ends in a verdict (``core.outcomes.verdict`` of the cause, the step reached and the
host's record) and an ending, whose words are the CLI's. What differs between the two runs is
data (``FailedRelease.run``): which events say it, which words the record's log closes with.
A rollback never comes here: its failure is ``rollback_failed`` and restores nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.core import endings, events
from orchestrator.core.endings import Ending, Run
from orchestrator.core.events import RestoreAccount
from orchestrator.core.outcomes import UNSAFE, Outcome, Step, Verdict, verdict
from orchestrator.host.protocol_verdict import StepFailure
from orchestrator.pipeline.events import Reporter
from orchestrator.pipeline.release import Cut, RestoreCut


@dataclass(frozen=True)
class Ended:
    """A failed release's verdict and the ending that says it."""

    verdict: Verdict
    ending: Ending

    @property
    def outcome(self) -> str:
        return self.verdict.outcome

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code


@dataclass(frozen=True)
class FailedRelease:
    """The failed release as its end needs it; ``redact`` masks the playbook's secrets."""

    run: Run  # "deploy" or "night"
    label: str
    release: str
    release_dir: str
    reporter: Reporter
    redact: Callable[[str], str]

    def unconfirmed_reason(self) -> str:
        """Why a release that was restored before its runner confirmed it failed."""
        if self.run == "night":
            return "the backstop's deadline passed before the night could confirm"
        return "the watchdog's deadline passed before the deploy could confirm"

    def unsafe(self, ending: Ending) -> Ended:
        return Ended(UNSAFE, ending)

    def restoring_without_record(self) -> Ended:
        """Restored before the confirm, by the guard or a person, and no record of it yet."""
        return self.unsafe(endings.RestoringWithoutRecord(self.label, self.release, self.run))

    def runner_could_not_restore(self, reason: str, error: dict[str, object] | None) -> Ended:
        """The host's runner failed the release and no restore record came of it."""
        problem = str((error or {}).get("message", "?"))
        return self.unsafe(endings.RunnerCouldNotRestore(self.label, self.release, reason, problem,
                                                         self.release_dir, self.run))

    def cut(self, cut: RestoreCut, reason: str, reached: Step) -> Ended | None:
        """The restore this controller asked for came back without a record: why, as an ending.
        None where the host has no such release (a Ctrl-C before it made one): nothing to close."""
        if cut.why is Cut.ABSENT:
            return None
        if cut.why is Cut.LINK_LOST:
            assert cut.error is not None
            return Ended(verdict(cut.error, reached), endings.LostDuringRestore(
                self.label, self.release, reason, self.redact(str(cut.error)), cut.until, self.run))
        if cut.why is Cut.INTERRUPTED:
            return self.unsafe(endings.InterruptedDuringRestore(self.label, self.release, cut.until, self.run))
        return self.could_not_run(cut, reason)

    def could_not_run(self, cut: RestoreCut, reason: str) -> Ended:
        """The host refused or failed to run the restore: the backstop is what is left."""
        return self.unsafe(endings.RestoreCouldNotRun(self.label, self.release, reason, self.redact(str(cut.error)),
                                                      self.release_dir, cut.until, self.run))

    def restored(self, cause: BaseException, reason: str, done: RestoreAccount, reached: Step,
                 failed: StepFailure | None, close: Callable[[Verdict, Ending], None]) -> Ended:
        """What the host recorded of the restore (``done``), said: the server's log, the events
        and the ending; then the release's record closed with them (``close``, best effort: its
        run log ends with the ending). ``failed``: the runner's program step that failed, where
        the runner had the release."""
        record = done.record
        v = verdict(cause, reached, record)
        if record.log_tail:
            title = "switch back" if self.run == "night" else "restore"
            self.reporter.server_log(self.label, f"server log, {title} (last 40 lines)", record.log_tail)
        ending: Ending
        if record.ok:
            if v.outcome == Outcome.ROLLED_BACK:
                back = events.SwitchedBack if self.run == "night" else events.RolledBack
                self.reporter.event(self.label, back(record.by, done))
            else:
                closed = events.NightClosed if self.run == "night" else events.ReleaseClosed
                self.reporter.event(self.label, closed(self.release))
            ending = endings.Restored(self.label, self.release, reason, done, record.by,
                                      failed.step if failed else None, failed.kind if failed else None, self.run)
        else:
            ending = endings.RestoreFailed(self.label, self.release, reason, done, self.release_dir, self.run)
        for f in record.drift:
            self.reporter.event(self.label, events.DriftKept(f.path, f.drift))
        for problem in record.record_errors:
            self.reporter.event(self.label, events.RestoreNotRecorded(problem, switch_back=self.run == "night"))
        close(v, ending)
        return Ended(v, ending)
