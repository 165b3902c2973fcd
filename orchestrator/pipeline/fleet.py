"""Many hosts at once: a bounded pool, batches, and when to stop.

``run_fleet`` runs one host's work (a deploy, a rollback, a read) on every
selected host:

- at most ``forks`` hosts at a time, on as many worker threads (never a
  thread per host). Each host's work opens its own ``HostSession`` in its
  worker and keeps it to the end, so no connection (no Paramiko object) is
  ever shared between threads, and one host's failure is that host's report:
  it never touches another host's files or holds up another's work. An
  unreachable host holds one worker until its connect timeout, no more.
- in batches (``--serial``, cut by ``core.selection.plan_batches``). After
  each batch, ``core.selection.judge_batch`` decides whether to go on. When
  it says stop, the hosts of the later batches are never started — not even
  connected — and come back in ``not_started``; ``after_failed_batch`` may
  first replace the failed batch's results (``--rollback-all-on-failure``
  undoes its successes through it). Before the judging, ``settle`` may
  replace some of the batch's results (a deploy follows again the hosts
  whose link was lost after their commit: ``follow_lost``), so the batch is
  judged by what its hosts ended in, not by where their controller lost them.
- Ctrl-C: no host is started any more, and every host at work gets a
  ``KeyboardInterrupt`` in its own thread, where the deploy turns it into a
  rollback, exactly as with one host (a second Ctrl-C reaches it again and
  stops the rollback waiting). Python delivers signals to the main thread
  only, so the interrupt is handed to each worker with
  ``PyThreadState_SetAsyncExc``; the worker sees it at its next Python
  instruction (the helper's events arrive at least every 5 s).

Generic over the result type: a deploy's ``HostReport``, a history, a status.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Generic, TypeVar

from orchestrator.core.endings import Ending, NotUndoneWithBatch, UndoneWithBatch
from orchestrator.core.events import RestoreAccount, plain
from orchestrator.core.outcomes import Outcome, Verdict, undone_verdict
from orchestrator.core.selection import BatchSize, judge_batch, plan_batches
from orchestrator.core.target import HostTarget
from orchestrator.errors import InterruptedTwice, interruption, interruption_words
from orchestrator.interrupts import thread_in_import_machinery
from orchestrator.pipeline.events import Words
from orchestrator.pipeline.report import HostReport

R = TypeVar("R")

INTERRUPTED = interruption_words(None)
"""A Ctrl-C's words, for a host no interruption of its own reached."""

HostWork = Callable[[HostTarget], R]

Settle = Callable[[list[HostTarget], dict[str, R], str], dict[str, R]]
"""``settle(batch, done, when)``: the results to put in place of some of a batch's before it is
judged; ``when`` says what waits on it ("before batch 2", "before the end of the run")."""


class SettleInterrupted(KeyboardInterrupt):
    """A Ctrl-C during a batch's ``settle``: the results it had settled by then (the others
    kept as they were); the run starts no later batch."""

    def __init__(self, results: dict[str, Any], why: str) -> None:
        super().__init__()
        self.results = results
        self.why = why  # "interrupted (Ctrl-C)", "stopped by SIGTERM"


@dataclass(frozen=True)
class FleetPlan:
    """How to go through the hosts: ``--forks``, ``--serial``, ``--max-fail-percent``."""

    forks: int = 10
    serial: tuple[BatchSize, ...] = ()
    max_fail_percent: Fraction | None = None


@dataclass
class FleetHooks(Generic[R]):
    """What the caller wants to know, and how to make a result the work did not return.

    ``started``/``finished`` are called from the worker threads (a view that
    draws must be thread-safe). ``interrupted(target, why)`` makes the result of
    a host whose work a Ctrl-C (or SIGTERM, SIGHUP: ``why`` names it) cut off
    outside the work's own handling (rare: between two of its steps).
    ``outcome`` is the outcome word a batch is judged by.
    ``interrupting`` is called once, from the main thread, at the first Ctrl-C
    (or SIGTERM, SIGHUP: its kind is passed): a host's work may take a while to
    notice it (a slow link), and the user must see at once that it was heard.
    """

    outcome: Callable[[R], str]
    interrupted: Callable[[HostTarget, str], R]
    started: Callable[[HostTarget], None] = lambda _t: None
    finished: Callable[[HostTarget, R], None] = lambda _t, _r: None
    interrupting: Callable[[type[KeyboardInterrupt]], None] = lambda _kind: None


@dataclass
class FleetRun(Generic[R]):
    """What a run did: results in the selection's order, the hosts never started, and why."""

    results: dict[str, R]
    not_started: list[str] = field(default_factory=list)
    stopped: str | None = None  # why the run stopped before its last batch (None: it did not)
    interrupted: bool = False  # ``stopped`` by a Ctrl-C, SIGTERM or SIGHUP
    batches: list[list[str]] = field(default_factory=list)


def run_fleet(
    targets: Sequence[HostTarget],
    work: HostWork[R],
    plan: FleetPlan,
    hooks: FleetHooks[R],
    *,
    after_failed_batch: Callable[[list[HostTarget], dict[str, R]], dict[str, R]] | None = None,
    settle: Settle[R] | None = None,
) -> FleetRun[R]:
    """``work`` on every target, ``plan.forks`` at a time, batch after batch (see the module doc)."""
    batches = plan_batches(list(targets), list(plan.serial) or None)
    run: FleetRun[R] = FleetRun({}, batches=[[t.name for t in b] for b in batches])
    results: dict[str, R] = {}
    stopped: str | None = None
    left: list[HostTarget] = []
    for number, batch in enumerate(batches, start=1):
        pool = HostPool(batch, work, plan.forks, hooks)
        done = pool.run()
        results.update(done)
        later = [t for b in batches[number:] for t in b]
        if pool.interrupted:
            stopped, run.interrupted = interruption(pool.interrupted_by), True
            left = pool.never_started + later
            break
        if settle is not None:
            when = f"before batch {number + 1}" if later else "before the end of the run"
            try:
                done = {**done, **settle(batch, done, when)}
            except SettleInterrupted as e:  # a Ctrl-C while it followed: no later batch starts
                results.update(e.results)
                stopped, left, run.interrupted = e.why, later, True
                break
            results.update(done)
        verdict = judge_batch([hooks.outcome(done[t.name]) for t in batch if t.name in done],
                              plan.max_fail_percent)
        if verdict.stop:
            if after_failed_batch is not None:
                results.update(after_failed_batch(batch, done))
            if later:
                where = f"batch {number} of {len(batches)}" if len(batches) > 1 else "the batch"
                stopped = f"{where} failed: {verdict.reason}"
                left = later
            break
    run.results = {t.name: results[t.name] for t in targets if t.name in results}
    waiting = {t.name for t in left}
    run.not_started = [t.name for t in targets if t.name in waiting and t.name not in results]
    run.stopped = stopped
    return run


class HostPool(Generic[R]):
    """``work`` on ``targets``, at most ``forks`` at a time, each host in one worker thread.

    ``run`` returns when every started host has finished. A Ctrl-C while it
    waits stops the taking of new hosts (they stay in ``never_started``) and
    interrupts the hosts at work (see the module doc).
    """

    def __init__(self, targets: Sequence[HostTarget], work: HostWork[R], forks: int,
                 hooks: FleetHooks[R]) -> None:
        self.work = work
        self.hooks = hooks
        self.forks = max(1, forks)
        self.queue = list(targets)
        self.targets = list(targets)
        self.results: dict[str, R] = {}
        self.failures: dict[str, BaseException] = {}
        self.interrupted = False
        self.interrupts = 0  # Ctrl-C (and SIGTERM/SIGHUP) passed on to the workers so far
        self.interrupted_by: type[KeyboardInterrupt] = KeyboardInterrupt  # the first one's kind
        self._taken: set[str] = set()
        self._at_work: dict[int, str] = {}  # thread id -> host
        self._lock = threading.Lock()
        self._working = 0  # workers not yet returned
        self._all_done = threading.Event()

    @property
    def never_started(self) -> list[HostTarget]:
        return [t for t in self.targets if t.name not in self._taken]

    def run(self) -> dict[str, R]:
        workers = [threading.Thread(target=self._worker, name=f"orch-worker-{i + 1}", daemon=True)
                   for i in range(min(self.forks, len(self.queue)))]
        self._working = len(workers)
        for w in workers:
            w.start()
        # Not ``Thread.join``: a Ctrl-C that interrupts a join marks the thread as stopped
        # while it still runs (CPython 3.11, bpo-45274's fix releases its state lock).
        # A Ctrl-C is passed on at the top of the loop, inside the ``try``: a second one that
        # comes while the first is passed on (its line printed, the workers told) is caught too.
        pending: type[KeyboardInterrupt] | None = None
        while True:
            try:
                if pending is not None:
                    kind, pending = pending, None
                    self._interrupt(kind)
                if self._all_done.wait(0.25):
                    break
            except KeyboardInterrupt as e:
                pending = type(e)  # a Ctrl-C, or SIGTERM/SIGHUP (``errors.Terminated``)
        for w in workers:
            w.join()
        for t in self.targets:  # taken, but cut off before its work could say anything
            if t.name in self._taken and t.name not in self.results and t.name not in self.failures:
                self.results[t.name] = self._cut_off(t)
        if self.failures:  # a bug, not a host's failure: raised once every other host is done
            raise next(iter(self.failures.values()))
        return self.results

    def _cut_off(self, target: HostTarget) -> R:
        """The result of a host the first interruption cut off between two of its steps."""
        return self.hooks.interrupted(target, interruption(self.interrupted_by))

    def _interrupt(self, kind: type[KeyboardInterrupt] = KeyboardInterrupt) -> None:
        self.interrupts += 1  # first: a second one that cuts this call short is one more
        if self.interrupts == 1:
            self.interrupted_by = kind
            self.hooks.interrupting(kind)
        elif kind is KeyboardInterrupt:
            kind = InterruptedTwice  # in its slot, it also stands for a first one not yet seen
        with self._lock:
            self.interrupted = True
            self.queue.clear()
            for ident in self._at_work:
                raise_in_thread(ident, kind)

    def _take(self) -> HostTarget | None:
        with self._lock:
            if not self.queue:
                return None
            target = self.queue.pop(0)
            self._taken.add(target.name)
            self._at_work[threading.get_ident()] = target.name
            return target

    def _worker(self) -> None:
        me = threading.get_ident()
        while True:
            try:
                target = self._take()
                if target is None:
                    break
                self._one(target)
            except KeyboardInterrupt:
                pass  # meant for a host that had just finished: its result is kept, nothing to stop
            self._leave(me)
        while True:  # a late Ctrl-C must not keep ``run`` waiting for this worker
            try:
                with self._lock:
                    self._working -= 1
                    if self._working == 0:
                        self._all_done.set()
                return
            except KeyboardInterrupt:
                continue

    def _leave(self, ident: int) -> None:
        while True:
            try:
                with self._lock:
                    self._at_work.pop(ident, None)
                return
            except KeyboardInterrupt:
                continue

    def _one(self, target: HostTarget) -> None:
        try:
            self.hooks.started(target)
            # one store: a Ctrl-C aimed at this host lands inside ``work`` (which handles
            # it), or after its result is kept
            self.results[target.name] = self.work(target)
        except KeyboardInterrupt:
            self.results.setdefault(target.name, self._cut_off(target))
        except BaseException as exc:  # noqa: BLE001 - kept and raised by ``run``, after the others
            self.failures[target.name] = exc
        self._leave(threading.get_ident())
        if target.name in self.results:
            self.hooks.finished(target, self.results[target.name])


_THREAD_START = threading.Thread.start.__code__


def raise_in_thread(ident: int, exc: type[BaseException]) -> None:
    """Make ``exc`` happen in thread ``ident`` at its next Python instruction, and there only.

    Up to Python 3.11 a thread being started carries the id of the thread that starts it
    until it runs, and the call reaches the newest thread of that id: a Ctrl-C handed to a
    worker in that instant (its link opening its reader threads) reached the new thread
    instead, which died in its start-up while the worker waited for it to start, for ever
    (``orch status`` hung on a Ctrl-C). So it waits until no thread is being started:
    ``threading`` keeps such threads in ``_limbo``, under the lock this holds while it raises,
    until each runs under its own id. Nor is it raised while the worker is inside the
    import machinery, where it could leave the import lock held (``orchestrator.interrupts``):
    a look before raising, which narrows that window to the instant between look and raise."""
    limbo = getattr(threading, "_limbo", None)
    lock = getattr(threading, "_active_limbo_lock", None)
    if limbo is None or lock is None:  # a Python without them: nothing to wait for
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc))
        return
    while True:
        with lock:
            if not limbo and not thread_in_import_machinery(ident):
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc))
                # The thread may be in ``Thread.start``, waiting for this lock to put its new
                # thread in ``_limbo``: the exception would land right after, before that thread
                # is started, and leave it in ``_limbo`` for ever (every later call here would wait
                # for ever). The thread cannot pass this lock yet: if it is in there, take the
                # exception back (None: NULL) and try again once it is out.
                frame = sys._current_frames().get(ident)
                if frame is None or frame.f_code is not _THREAD_START:
                    return
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)
        time.sleep(0.001)


def undo_changed(
    batch: Sequence[HostTarget],
    done: dict[str, HostReport],
    undo: HostWork[HostReport],
    forks: int,
    hooks: FleetHooks[HostReport],
    words: Words = plain,
) -> dict[str, HostReport]:
    """``--rollback-all-on-failure``: roll back the hosts of a failed batch whose deploy succeeded.

    Each such host gets ``orch rollback``'s work (its new release undone, the
    server restarted as it ran before, health-checked) and a report that says
    so: ``rolled_back``, exit 1 (the run failed there too), or the rollback's
    own failure. Hosts whose deploy changed nothing are left alone: a rollback
    there would undo an older release.
    """
    changed = [t for t in batch if t.name in done and done[t.name].outcome == Outcome.CHANGED]
    if not changed:
        return {}
    undone = HostPool(changed, undo, forks, hooks).run()
    return {name: undone_report(done[name], report, words) for name, report in undone.items()}


def follow_lost(
    batch: Sequence[HostTarget],
    done: dict[str, HostReport],
    follow: Callable[[HostTarget, HostReport], HostReport],
    forks: int,
    hooks: FleetHooks[HostReport],
) -> dict[str, HostReport]:
    """A deploy's ``settle``: follow again the hosts of a batch whose link was lost after their commit.

    Their runners carry those releases on by themselves; the batch is decided
    by how the releases end. ``follow(target, report)`` connects once and
    follows the release to its verdict (``pipeline.follow.follow_again``); a
    host it cannot reach keeps its ``unreachable`` report, which
    ``--max-fail-percent`` counts as failed. The hosts are followed
    ``forks`` at a time, like the batch itself.
    """
    lost = [t for t in batch if t.name in done and lost_after_commit(done[t.name])]
    if not lost:
        return {}
    pool = HostPool(lost, lambda t: follow(t, done[t.name]), forks, hooks)
    found = pool.run()
    if pool.interrupted:
        # a host the Ctrl-C cut off keeps its report (unreachable: its runner finishes it by itself)
        why = interruption(pool.interrupted_by)
        raise SettleInterrupted({t.name: done[t.name] if found.get(t.name) is None or found[t.name].error == why
                                 else found[t.name] for t in lost}, why)
    return found


def lost_after_commit(report: HostReport) -> bool:
    """A deploy whose controller lost the link after the commit and could not reconnect in time."""
    return report.outcome == Outcome.UNREACHABLE and bool(report.extra.get(LOST_AFTER_COMMIT))


LOST_AFTER_COMMIT = "lost_after_commit"
"""The report field of a deploy that lost its link after the commit: ``{"release_dir", "events_seen"}``."""


def undone_report(deployed: HostReport, rollback: HostReport, words: Words = plain) -> HostReport:
    """The report of a host whose successful deploy was rolled back with its failed batch
    (``words``: the CLI's, for its ``error``)."""
    extra = {**deployed.extra, "undone_by": rollback.release}
    v = undone_verdict(Verdict(rollback.outcome, rollback.exit_code))
    ending: Ending
    if v.outcome == Outcome.ROLLED_BACK:
        done = rollback.extra.get("restore")
        ending = UndoneWithBatch(deployed.release, rollback.release, done if isinstance(done, RestoreAccount) else None)
        return HostReport.ended(deployed.host, v, release=deployed.release, files=deployed.files,
                                ending=ending, error=words(ending), notes=deployed.notes, extra=extra)
    # still on the release it deployed (healthy then), or not known to be healthy (3)
    ending = NotUndoneWithBatch(deployed.release, str(rollback.error or rollback.outcome))
    return HostReport.ended(deployed.host, v, release=deployed.release,
                            files=deployed.files, notes=deployed.notes, extra=extra,
                            ending=ending, error=words(ending))
