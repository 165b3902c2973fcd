"""The one place a run's events (``orchestrator.core.events``) become English.

The pipeline reports what happened as typed events; the console, a fleet's
board and the host's ``run.log`` (``RunLog``, given ``line`` by the CLI) all
say it with ``line``. Each event type has its function here; the wording is
pinned by tests (tests/test_cli_words.py, tests/test_progress.py, …), so a
change here is a change people and their ``grep`` see.
"""

from __future__ import annotations

from functools import singledispatch

from orchestrator.cli.restore_words import restore_done
from orchestrator.core import endings as end
from orchestrator.core import events as ev
from orchestrator.core.predates import predates_note
from orchestrator.core.preflight import NOT_CHECKED_NOTE
from orchestrator.errors import interruption_words
from orchestrator.host.records import ServerProcess
from orchestrator.host.retention import held_note
from orchestrator.pipeline.report import Named, RollbackSummary
from orchestrator.pipeline.session import at


@singledispatch
def line(event: ev.Event) -> str:
    """The line a person reads for ``event`` (an event without words here: its fields)."""
    return ev.plain(event)


def _stable(stable_for: float | None) -> str:
    return f", stable for {stable_for:g} s" if stable_for else ""


def _by(by: str) -> str:
    """`` (by the guard)``; nothing when the run itself restored (its controller, or its runner)."""
    return "" if by in ("controller", "runner") else f" (by the {by})"


# ---------------------------------------------------------------- shared


@line.register
def _(e: ev.PlanNote) -> str:
    return e.text


@line.register
def _(e: ev.Healthy) -> str:
    return f"healthy after {e.elapsed:.1f} s ({e.polls} polls){_stable(e.stable_for)}"


@line.register
def _(e: ev.HeldForDrift) -> str:
    return held_note(e.release, e.paths)


@line.register
def _(e: ev.DriftKept) -> str:
    where = "during the deploy" if e.during_deploy else "(drift)"
    return f"{e.path} had changed on the host {where}: that content is kept in {e.kept_in}"


@line.register
def _(e: ev.RestoreNotRecorded) -> str:
    return f"the host could not record the {'switch back' if e.switch_back else 'restore'}: {e.problem}"


# ---------------------------------------------------------------- deploy


@line.register
def _(e: ev.WatchdogRestoredEarlier) -> str:
    return f"the watchdog restored release {e.release} earlier"


@line.register
def _(e: ev.AlreadyAsPlanned) -> str:
    return "unchanged: files and server command line already as planned"


@line.register
def _(e: ev.Staged) -> str:
    return f"staged {e.files} file(s) beside their targets; validated"


@line.register
def _(e: ev.BackedUp) -> str:
    if e.runner:
        return (f"backed up {e.files} file(s) into release {e.release}; from the commit on the host "
                f"carries it to its verdict by itself (backstop {at(e.deadline)})")
    return (f"backed up {e.files} file(s) into release {e.release}; "
            f"the watchdog restores it at {at(e.deadline)} unless confirmed")


@line.register
def _(e: ev.Committed) -> str:
    return f"committed {e.files} file(s)"


@line.register
def _(e: ev.PreflightAccepted) -> str:
    return "pre-flight: the server's parser accepts the new command line" + (
        " with the staged files" if e.staged else "")


@line.register
def _(e: ev.PreflightNotChecked) -> str:
    return f"{NOT_CHECKED_NOTE}: server.preflight uses neither {{{{ staged_files }}}} nor ORCH_STAGED"


@line.register
def _(e: ev.GateBaseline) -> str:
    return f"gate: probing the running server before the stop ({', '.join(e.probes)})"


@line.register
def _(e: ev.GateReprobe) -> str:
    return f"gate: inconclusive (within the spread), probing again: {', '.join(e.probes)}"


@line.register
def _(e: ev.Restarting) -> str:
    return f"restarting the server: {' '.join(e.argv)}"


@line.register
def _(e: ev.ReleaseCurrent) -> str:
    return f"release {e.release} is current"


@line.register
def _(e: ev.Reconnecting) -> str:
    return (f"{e.lost}; the host goes on by itself: connecting again to follow it "
            f"(every 5 s, for up to {e.window:.0f} s)")


@line.register
def _(e: ev.FollowingAgain) -> str:
    return f"following release {e.release} again {e.when}"


@line.register
def _(e: ev.StillUnreachable) -> str:
    return (f"release {e.release} could not be followed again ({e.why}): unreachable, and counted as "
            "failed; the host finishes it by itself")


@line.register
def _(e: ev.RunnerStep) -> str:
    took = f" ({e.seconds:.1f} s)" if e.seconds is not None else ""
    return f"{e.step}: {e.state}{took}"


@line.register
def _(e: ev.NothingToFollow) -> str:
    if e.release is None:
        return "nothing in progress (no release on this host)"
    if e.in_progress:
        return f"release {e.release} is in progress without a runner (a night, or an older orch's): see `orch status`"
    return f"nothing in progress (last: {e.release}, {e.outcome or '?'})"


@line.register
def _(e: ev.InterruptedAfterConfirm) -> str:
    return f"Ctrl-C came after the confirm: release {e.release} stays current"


@line.register
def _(e: ev.ManyInEffect) -> str:
    return (f"{e.in_effect} releases are in effect, more than keep_releases {e.keep}: "
            "none of them is pruned, each is a step of `orch rollback`")


@line.register
def _(e: ev.ServerPredates) -> str:
    return predates_note(ServerProcess(pid=e.pid, started_at=e.started_at))


@line.register
def _(e: ev.DeployFailed) -> str:
    return f"deploy failed: {e.reason}; " + ("rolling back" if e.rolling_back
                                             else "closing the release (nothing was changed)")


@line.register
def _(e: ev.RolledBack) -> str:
    return f"rolled back{_by(e.by)}: {restore_done(e.done)}"


@line.register
def _(e: ev.ReleaseClosed) -> str:
    return f"release {e.release} closed: nothing on the host was changed"


@line.register
def _(e: ev.CheckUnchanged) -> str:
    return "unchanged: nothing to do"


@line.register
def _(e: ev.CheckValidated) -> str:
    return "validated on the host; nothing was changed (--check)" + (
        ", but a deploy would refuse" if e.would_refuse else
        ", but the pre-flight refused" if e.preflight_refused else "")


# ---------------------------------------------------------------- night


@line.register
def _(e: ev.BuildDrift) -> str:
    return f"drift in the current build: {e.path} (--force: building anyway)"


@line.register
def _(e: ev.Building) -> str:
    return f"building {e.build_dir} (log {e.log})"


@line.register
def _(e: ev.CheckedOut) -> str:
    return f"checked out {e.commit} (HEAD verified)"


@line.register
def _(e: ev.Installing) -> str:
    return f"install: {e.commands} command(s) in {e.build_dir}"


@line.register
def _(e: ev.InstalledPinned) -> str:
    return f"installed {e.packages} pinned package(s) with --require-hashes"


@line.register
def _(e: ev.StackPatched) -> str:
    return f"stack[{e.index}] {e.playbook}: {e.files} file(s) patched and validated"


@line.register
def _(e: ev.NightFailedBeforeSwitch) -> str:
    return f"night failed before the switch: {e.reason}"


@line.register
def _(e: ev.HalfBuiltRemoved) -> str:
    return f"removed the half-built {e.build_dir}; nothing running was touched"


@line.register
def _(e: ev.NightArmed) -> str:
    return f"armed: the watchdog switches back at {at(e.deadline)} unless the night is confirmed"


@line.register
def _(e: ev.Switching) -> str:
    stop = f"stop the old server (pid {e.old_pid}), " if e.old_pid else ""
    return f"switching: {stop}current -> {e.night}, start {' '.join(e.argv)}"


@line.register
def _(e: ev.Probed) -> str:
    return (f"probe {e.post}: {e.requests_per_s} req/s, "
            f"{e.tokens_per_s if e.tokens_per_s is not None else '?'} tok/s, p50 {e.p50_ms} ms, "
            f"p99 {e.p99_ms} ms, {e.errors} error(s), greedy {str(e.greedy_sha256)[:12]}")


@line.register
def _(e: ev.BuildsPruned) -> str:
    return f"pruned {len(e.builds)} old build(s): {', '.join(e.builds)}"


@line.register
def _(e: ev.NightCurrent) -> str:
    return f"night {e.night} is current ({e.build_dir})"


@line.register
def _(e: ev.NightFailed) -> str:
    return f"night failed: {e.reason}; " + ("switching back" if e.switching_back
                                            else "closing the release (nothing live was touched)")


@line.register
def _(e: ev.SwitchedBack) -> str:
    return f"switched back{_by(e.by)}: {restore_done(e.done)}"


@line.register
def _(e: ev.HistoryUnread) -> str:
    return f"report: the host's history could not be read ({e.problem}); the page words nights from their records"


@line.register
def _(e: ev.LateReportWritten) -> str:
    return f"report: {e.path}"


@line.register
def _(e: ev.NightClosed) -> str:
    return f"night {e.night} closed: nothing live was touched"


# ---------------------------------------------------------------- rollback


@line.register
def _(e: ev.AlreadyCurrent) -> str:
    return f"release {e.release} is already current: nothing to do"


def rollback_did(did: ev.RollbackDid, releases: tuple[str, ...], current: str | None, by: str | None) -> str:
    """What a rollback was, in words: "rolled back R2; current release: R1", "finished", …"""
    if did == "undid":
        return f"rolled back {', '.join(releases)}; current release: {current or 'none (the state before any release)'}"
    if did == "finished":
        return "finished"
    if did == "restored_before":
        return f"restored the state before {', '.join(releases)}"
    return f"{', '.join(releases)} had already been restored by the {by}"


@line.register
def _(e: ev.RestoreDone) -> str:
    return f"{rollback_did(e.did, e.releases, e.current, e.by)}: {restore_done(e.done)}"


@line.register
def _(e: ev.FinishingUnfinished) -> str:
    return f"finishing the unfinished {e.kind_of_run} {e.release} (last step: {e.last_step})"


@line.register
def _(e: ev.UnfinishedChangedNothing) -> str:
    return f"{e.kind_of_run} {e.release} had not changed anything; journal closed"


@line.register
def _(e: ev.ConfirmedBeforeEnd) -> str:
    return f"{e.release} had been confirmed before its run ended; journal closed"


@line.register
def _(e: ev.BuildNotRemoved) -> str:
    return f"could not remove the build of night {e.night}: {e.problem}"


@line.register
def _(e: ev.HalfBuildRemoved) -> str:
    return f"removed the half-built {e.builds_dir}/{e.night} (its log is kept)"


@line.register
def _(e: ev.NothingToRollBack) -> str:
    return "nothing to roll back: no release is current (there is nothing before)"


@line.register
def _(e: ev.RollingBack) -> str:
    switching = "".join(f", switching {path} back to {target or '(none)'}" for path, target in e.links)
    return (f"rolling back {', '.join(e.releases)}{switching}"
            + (" and restarting the previous server" if e.restart else ""))


# ---------------------------------------------------------------- the lock


@line.register
def _(e: ev.LockTakenOver) -> str:
    return f"took the lock left by {e.holder}: that process is gone, and so is its helper on the host"


@line.register
def _(e: ev.StaleLockBroken) -> str:
    return f"breaking the stale lock of {e.holder} (no heartbeat for {e.age:.0f} s)"


# ---------------------------------------------------------------- endings (``core.endings``): a report's ``error``


def _at(when: float | None) -> str:
    """``at``, for a time an ending may not know (a rollback has no backstop to name)."""
    return at(when) if when is not None else "?"


def _whose(run: str, release: str) -> str:
    """``release R``, ``night N``, ``rollback R``: whose release a sentence names."""
    return f"{'release' if run == 'deploy' else run} {release}"


@line.register
def _(e: end.StoppedFollowing) -> str:
    whose = _whose(e.run, e.release)
    if e.run == "rollback":
        said = e.signame or ("interrupted (Ctrl-C) while reaching the host again" if e.reconnecting
                             else "interrupted (Ctrl-C)")
        why = f"{said}: orch stopped following {whose}, which its runner on the host finishes"
    elif e.signame:
        why = f"{e.signame}: orch stopped following {whose}, which its runner on the host finishes"
    elif e.reconnecting:
        why = (f"interrupted (Ctrl-C) while reaching the host again: orch stopped following {whose}, "
               "which its runner on the host finishes")
    else:
        doing = "switching it back" if e.run == "night" else "aborting it"
        why = f"interrupted again: orch stopped following {whose}, which its runner on the host still finishes ({doing})"
    return f"{why}; `orch status --follow --host {e.host}` gives the verdict"


@line.register
def _(e: end.FollowInterrupted) -> str:
    return f"stopped following release {e.release}; its runner still finishes it"


@line.register
def _(e: end.LostAfterCommit) -> str:
    verdict = f"`orch status --follow --host {e.host}` gives the verdict"
    if e.run == "rollback":
        return f"{e.reason} after the rollback {e.release} was handed on; the host finishes it by itself; {verdict}"
    if e.run == "night":
        return (f"{e.reason} during night {e.release}; the host finishes it by itself (its runner confirms it or "
                f"switches it back; the backstop switches it back at {_at(e.backstop_at)} at the latest); {verdict}")
    return (f"{e.reason} after the commit of release {e.release}; the host finishes it by itself (its "
            f"runner confirms or restores it; the backstop restores it at {_at(e.backstop_at)} at "
            f"the latest); {verdict}")


@line.register
def _(e: end.LostDuringRestore) -> str:
    if e.run == "night":
        return (f"{e.reason}; {e.lost}: the switch back of night {e.release} was under way on the host when the "
                f"link dropped: the host finishes it by itself, and the backstop backs it up at {at(e.until)}; run "
                f"`orch status --host {e.host}` to see")
    return (f"{e.reason}; the restore of release {e.release} was under way on the host when the link "
            f"dropped: the host finishes it by itself, and the watchdog backs it up at "
            f"{at(e.until)}; run `orch status --host {e.host}` to see")


@line.register
def _(e: end.LostBeforeCommit) -> str:
    return (f"{e.reason}; nothing on the host was changed. The watchdog closes release {e.release} at "
            f"{at(e.closes_at)}, or `orch rollback --host {e.host}` does it now")


@line.register
def _(e: end.LostBeforeChange) -> str:
    return f"{e.reason}; " + ("nothing live was touched" if e.run == "night" else "nothing on the host was changed")


@line.register
def _(e: end.InterruptedBeforeChange) -> str:
    return f"{interruption_words(e.signame)} before anything changed"


@line.register
def _(e: end.FollowedAgainInVain) -> str:
    earlier = f"{line(e.lost)}; " if e.lost is not None else ""
    return f"{earlier}followed again {e.when}, in vain: {e.reason}"


@line.register
def _(e: end.InterruptedDuringRestore) -> str:
    if e.run == "night":
        return (f"{e.host}: interrupted again during the switch back of night {e.release}: orch stopped "
                f"waiting and the restore on the host stopped where it was. The backstop finishes it at "
                f"{at(e.until)}; or run `orch rollback --host {e.host}` now")
    return (f"{e.host}: interrupted again during the rollback of {e.release}: orch stopped "
            f"waiting and the restore on the host stopped where it was. The watchdog finishes it at "
            f"{at(e.until)}; or run `orch rollback --host {e.host}` now")


@line.register
def _(e: end.RestoreCouldNotRun) -> str:
    if e.run == "night":
        return (f"{e.host}: night {e.release} failed ({e.reason}) and its switch back could not run: {e.problem}. "
                f"The backstop switches back at {at(e.until)}; run `orch status --host {e.host}`")
    return (f"{e.host}: deploy failed ({e.reason}) and its restore could not run: {e.problem}. Backups are in "
            f"{e.release_dir}; the watchdog restores at {at(e.until)}; run `orch status --host {e.host}`")


@line.register
def _(e: end.Restored) -> str:
    return e.reason


@line.register
def _(e: end.RestoreFailed) -> str:
    if e.run == "night":
        return (f"{e.reason}; and the SWITCH BACK FAILED: {restore_done(e.done)}. The host is not known to be healthy; its "
                f"restore plan is {e.release_dir}/restore.json; fix the cause and run "
                f"`orch rollback --host {e.host}`")
    return (f"{e.reason}; and the ROLLBACK FAILED: {restore_done(e.done)}. The host is not known to be healthy; "
            f"backups are in {e.release_dir}; fix the cause and run `orch rollback --host {e.host}`")


@line.register
def _(e: end.RunnerCouldNotRestore) -> str:
    if e.run == "night":
        return (f"{e.host}: night {e.release} failed ({e.reason}) and the host's runner could not switch it "
                f"back: {e.problem}; its restore plan is {e.release_dir}/restore.json; run "
                f"`orch rollback --host {e.host}`")
    return (f"{e.host}: deploy failed ({e.reason}) and the host's runner could not restore it: "
            f"{e.problem}. Backups are in {e.release_dir}; run `orch rollback --host {e.host}`")


@line.register
def _(e: end.RestoringWithoutRecord) -> str:
    if e.run == "night":
        return (f"{e.host}: the backstop's deadline passed before the night could confirm; night {e.release} "
                f"is being switched back but left no record; run `orch status --host {e.host}`")
    return (f"{e.host}: the watchdog's deadline passed before the deploy could confirm; the watchdog is "
            f"restoring release {e.release} but left no record; run `orch status --host {e.host}`")


@line.register
def _(e: end.RollbackFailed) -> str:
    return (f"{e.host}: {rollback_did(e.did, e.releases, e.current, e.by)} FAILED: {restore_done(e.done)}. The host is not known to be healthy; fix the cause and run "
            f"`orch rollback --host {e.host}` again")


@line.register
def _(e: end.RollbackLeftNoRecord) -> str:
    return (f"{e.host}: the rollback {e.release} ended without a restore record ({e.reason}); "
            f"run `orch status --host {e.host}`")


@line.register
def _(e: end.RunnerFailed) -> str:
    return e.reason


@line.register
def _(e: end.UndoneWithBatch) -> str:
    return f"rolled back with its failed batch (--rollback-all-on-failure): {restore_done(e.done) if e.done else 'restored'}"


@line.register
def _(e: end.NotUndoneWithBatch) -> str:
    return f"its batch failed and --rollback-all-on-failure could not roll it back: {e.reason}"


@line.register
def _(e: end.NotStarted) -> str:
    return f"not started: {e.why}"


def rollback_summary(s: RollbackSummary) -> str:
    """A rollback's summary line: "undid R2 (speculative-disable); current: R1 (gated)"."""
    def named(n: Named) -> str:
        return f"{n.release} ({n.playbook})" if n.playbook else n.release

    current = named(s.current) if s.current is not None else "none (the state before any release)"
    return f"undid {', '.join(named(n) for n in s.undid)}; current: {current}"
