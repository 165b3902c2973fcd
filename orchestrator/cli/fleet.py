"""One command on the selected hosts: the pool, the view, the report, the retry file.

The commands hand their per-host work to ``run_reports`` (deploy, rollback:
each host ends with a ``HostReport``) or ``read_hosts`` (history, status:
each host ends with what was read, or the report of why it could not be).
Both run ``pipeline.fleet.run_fleet`` — ``--forks`` hosts at once, in
``--serial`` batches — and show it with ``cli.live``: a live board on a
terminal, plain host-prefixed lines elsewhere. One host is shown exactly as
before fleets existed (its own spinner, its summary line).

A run in which some of several hosts failed or were not started writes them
to ``orch.retry`` in the working directory, one per line, so that
``--limit @orch.retry`` reruns exactly them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from orchestrator.cli.live import FleetReporter, HostBoard, start_board
from orchestrator.cli.output import Output, live_stopped
from orchestrator.cli.views import ConsoleReporter
from orchestrator.cli.words import line
from orchestrator.core.outcomes import INTERRUPTED as INTERRUPTED_VERDICT
from orchestrator.core.outcomes import Outcome, read_verdict
from orchestrator.core.selection import hosts_to_retry, retry_file_text
from orchestrator.core.target import HostTarget
from orchestrator.errors import OrchError, interruption, signal_name
from orchestrator.pipeline.events import Reporter
from orchestrator.pipeline.fleet import (
    INTERRUPTED,
    FleetHooks,
    FleetPlan,
    follow_lost,
    run_fleet,
    undo_changed,
)
from orchestrator.pipeline.report import HostReport, RunReport, not_started

RETRY_FILE = "orch.retry"
"""Where a run writes the hosts to rerun (``--limit @orch.retry``), in the working directory."""

T = TypeVar("T")

HostCommand = Callable[[HostTarget, Reporter], HostReport]
FollowCommand = Callable[[HostTarget, Reporter, HostReport, str], HostReport]
"""``follow(target, reporter, lost, when)``: ``pipeline.follow.follow_again``."""


def run_reports(
    out: Output,
    targets: Sequence[HostTarget],
    work: HostCommand,
    plan: FleetPlan,
    inner: ConsoleReporter,
    *,
    title: str,
    undo: HostCommand | None = None,
    follow: FollowCommand | None = None,
) -> RunReport:
    """``work`` on every target as ``plan`` says; every host's report, in the selection's order.

    ``undo`` (``--rollback-all-on-failure``): rolls back the successes of a
    batch that failed. ``follow`` (a deploy on several hosts): follows again,
    before the batch is judged, each host whose link was lost after its
    commit (``pipeline.fleet.follow_lost``). Each report gets ``duration``:
    the host's wall time.
    """
    many = len(targets) > 1
    board = HostBoard([t.name for t in targets], title) if many and out.terminal and not out.quiet else None
    if many:
        inner.live_line = False  # one spinner cannot follow several hosts: the board does
    fleet_reporter = FleetReporter(inner, board) if many else None
    reporter: Reporter = fleet_reporter or inner

    def timed(command: HostCommand) -> Callable[[HostTarget], HostReport]:
        def run(target: HostTarget) -> HostReport:
            began = time.monotonic()
            report = command(target, reporter)
            report.extra["duration"] = round(time.monotonic() - began, 3)
            return report
        return run

    hooks: FleetHooks[HostReport] = FleetHooks(
        outcome=lambda r: r.outcome,
        interrupted=lambda t, why: HostReport.ended(t.name, INTERRUPTED_VERDICT, error=why),
        started=(lambda t: fleet_reporter.started(t.name)) if fleet_reporter else (lambda _t: None),
        finished=(lambda t, r: fleet_reporter.finished(t.name, r)) if fleet_reporter else (lambda _t, _r: None),
        interrupting=lambda kind: out.line(stopping_line(kind), "yellow"),
    )
    after = None
    if undo is not None:
        def after(batch: list[HostTarget], done: dict[str, HostReport]) -> dict[str, HostReport]:
            return undo_changed(batch, done, timed(undo), plan.forks, hooks, line)

    settle = None
    if follow is not None:
        def settle(batch: list[HostTarget], done: dict[str, HostReport], when: str) -> dict[str, HostReport]:
            return follow_lost(batch, done, lambda t, lost: follow(t, reporter, lost, when), plan.forks, hooks)

    live = start_board(out, board) if board is not None else None
    try:
        run = run_fleet(targets, timed(work), plan, hooks, after_failed_batch=after, settle=settle)
    finally:
        if live is not None:
            live.stop()
            live_stopped(live)
    report = RunReport(stopped=run.stopped)
    for target in targets:
        name = target.name
        report.hosts[name] = run.results.get(name) or not_started(name, run.stopped or INTERRUPTED, line)
    if many:
        report.retry_file = write_retry_file(out, report)
    return report


def read_hosts(
    out: Output,
    targets: Sequence[HostTarget],
    read: Callable[[HostTarget], T],
    plan: FleetPlan,
    *,
    title: str,
    exit_code: Callable[[T], int] = lambda _found: 0,
) -> dict[str, T | HostReport]:
    """``read`` on every target, ``plan.forks`` at a time; what each host gave, in the selection's order.

    A host that could not be read (unreachable, refused) gets the
    ``HostReport`` of why; the others are read all the same. A Ctrl-C ends
    the read at once as a ``KeyboardInterrupt``: a read changes nothing, so
    there is nothing to finish or undo and no host to wait for (a stalled
    link would hold its worker up to the link timeout); the run is one line,
    ``interrupted``, and no host is reported as "failed" (docs/CLI.md,
    "Signals"). The workers left reading are daemon threads: they end with
    the process, and each host's helper with its SSH session.
    """
    board = HostBoard([t.name for t in targets], title) if len(targets) > 1 and out.terminal else None

    def one(target: HostTarget) -> T | HostReport:
        try:
            return read(target)
        except OrchError as e:
            return HostReport.ended(target.name, read_verdict(e), error=str(e))

    def finished(target: HostTarget, found: T | HostReport) -> None:
        if board is not None:
            if isinstance(found, HostReport):
                board.finished(target.name, found.outcome, found.exit_code)
            else:
                code = exit_code(found)
                board.finished(target.name, "read" if code == 0 else f"read (exit {code})", code)

    hooks: FleetHooks[T | HostReport] = FleetHooks(
        outcome=lambda f: f.outcome if isinstance(f, HostReport) else Outcome.UNCHANGED,
        interrupted=lambda t, why: HostReport.ended(t.name, INTERRUPTED_VERDICT, error=why),
        started=(lambda t: board.started(t.name)) if board else (lambda _t: None),
        finished=finished,
        interrupting=stop_reading,
    )
    live = start_board(out, board) if board is not None else None
    try:
        run = run_fleet(targets, one, plan, hooks)
    finally:
        if live is not None:
            live.stop()
            live_stopped(live)
    if run.interrupted:
        raise KeyboardInterrupt
    return {t.name: run.results.get(t.name) or not_started(t.name, run.stopped or INTERRUPTED, line)
            for t in targets}


def stopping_line(kind: type[KeyboardInterrupt]) -> str:
    """What the first interruption of a deploy, night or rollback does, said at once. A SIGTERM
    or SIGHUP aborts no committed release (docs/CLI.md, "Signals"): its host finishes it."""
    said = f"{interruption(kind)}: stopping the hosts at work (a release not yet committed is closed"
    if signal_name(kind) is None:
        return f"{said}, a committed one restored); Ctrl-C again to stop waiting"
    return f"{said}; a committed one is finished by its host)"


def stop_reading(_kind: type[KeyboardInterrupt]) -> None:
    """The first Ctrl-C in a read: leave the pool now rather than wait for the hosts at work."""
    raise KeyboardInterrupt


def write_retry_file(out: Output, report: RunReport) -> str | None:
    """The hosts to rerun (failed or not started) into ``RETRY_FILE``; its name, or None if none."""
    # a successful ``orch rollback`` is ``rolled_back`` too, with exit 0: not one to rerun
    hosts = hosts_to_retry({name: r.outcome for name, r in report.hosts.items() if r.exit_code != 0})
    if not hosts:
        return None
    try:
        Path(RETRY_FILE).write_text(retry_file_text(hosts), encoding="utf-8")
    except OSError as e:
        out.problem(f"warning: could not write the retry file {RETRY_FILE}: {e.strerror or e}", "yellow")
        return None
    return RETRY_FILE
