"""The fleet runner's pool and batches (orchestrator/pipeline/fleet.py), without hosts.

The work here is plain functions that wait on events, so each test decides
the order of events itself: nothing depends on timing.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path

from orchestrator.core.selection import parse_serial
from orchestrator.core.target import HostTarget
from orchestrator.pipeline.fleet import (
    LOST_AFTER_COMMIT,
    FleetHooks,
    FleetPlan,
    HostPool,
    follow_lost,
    lost_after_commit,
    raise_in_thread,
    run_fleet,
    undone_report,
)
from orchestrator.pipeline.report import HostReport
from tests.fixtures.accounts import account

WAIT = 30.0


def targets(n: int) -> list[HostTarget]:
    return [HostTarget(name=f"h{i}") for i in range(1, n + 1)]


def hooks(**kw: object) -> FleetHooks[HostReport]:
    return FleetHooks(outcome=lambda r: r.outcome,
                      interrupted=lambda t, why: HostReport(t.name, "failed", 1, error=why), **kw)  # type: ignore[arg-type]


def test_no_more_than_forks_hosts_at_work_and_every_host_done() -> None:
    lock = threading.Lock()
    at_work: list[str] = []
    most = 0
    first_two = threading.Barrier(2, timeout=WAIT)

    def work(t: HostTarget) -> HostReport:
        nonlocal most
        with lock:
            at_work.append(t.name)
            most = max(most, len(at_work))
        if t.name in ("h1", "h2"):
            first_two.wait()  # both of the first two are at work at once: the pool is parallel
        with lock:
            at_work.remove(t.name)
        return HostReport(t.name, "changed", 0)

    run = run_fleet(targets(7), work, FleetPlan(forks=2), hooks())
    assert most == 2
    assert list(run.results) == [f"h{i}" for i in range(1, 8)]  # the selection's order
    assert run.not_started == [] and run.stopped is None


def test_a_failed_canary_stops_the_run_and_later_batches_are_never_started() -> None:
    started: list[str] = []

    def work(t: HostTarget) -> HostReport:
        started.append(t.name)
        return HostReport(t.name, "rolled_back" if t.name == "h1" else "changed", 1 if t.name == "h1" else 0)

    plan = FleetPlan(forks=10, serial=tuple(parse_serial("1,100%")), max_fail_percent=Fraction(0))
    run = run_fleet(targets(4), work, plan, hooks())
    assert started == ["h1"]
    assert run.not_started == ["h2", "h3", "h4"]
    assert run.batches == [["h1"], ["h2", "h3", "h4"]]
    assert run.stopped == "batch 1 of 2 failed: every host of the batch failed (1 of 1)"


def test_batches_go_on_while_failures_stay_under_the_limit() -> None:
    def work(t: HostTarget) -> HostReport:
        bad = t.name in ("h2",)
        return HostReport(t.name, "failed" if bad else "changed", 2 if bad else 0)

    plan = FleetPlan(forks=3, serial=tuple(parse_serial("2")), max_fail_percent=Fraction(50))
    run = run_fleet(targets(6), work, plan, hooks())
    assert run.not_started == [] and run.stopped is None and len(run.results) == 6


def test_a_failed_batch_hands_its_results_to_after_failed_batch() -> None:
    seen: list[list[str]] = []

    def work(t: HostTarget) -> HostReport:
        bad = t.name == "h2"
        return HostReport(t.name, "rolled_back" if bad else "changed", 1 if bad else 0, release=f"r-{t.name}")

    def after(batch: list[HostTarget], done: dict[str, HostReport]) -> dict[str, HostReport]:
        seen.append([t.name for t in batch])
        undo = HostReport("h1", "rolled_back", 0, release="u-h1", extra={"restore": account("/a")})
        return {"h1": undone_report(done["h1"], undo)}

    plan = FleetPlan(forks=2, serial=tuple(parse_serial("2")), max_fail_percent=Fraction(0))
    run = run_fleet(targets(4), work, plan, hooks(), after_failed_batch=after)
    assert seen == [["h1", "h2"]]
    assert run.results["h1"].outcome == "rolled_back" and run.results["h1"].exit_code == 1
    assert run.results["h1"].release == "r-h1" and run.results["h1"].extra["undone_by"] == "u-h1"
    assert run.not_started == ["h3", "h4"]


def test_a_bug_in_one_hosts_work_is_raised_after_the_others_finished() -> None:
    finished: list[str] = []
    h1_failed = threading.Event()

    def work(t: HostTarget) -> HostReport:
        if t.name == "h1":
            h1_failed.set()
            raise RuntimeError("a bug")
        assert h1_failed.wait(WAIT)
        finished.append(t.name)
        return HostReport(t.name, "changed", 0)

    pool = HostPool(targets(3), work, 3, hooks())
    try:
        pool.run()
    except RuntimeError as e:
        assert str(e) == "a bug"
    else:
        raise AssertionError("the bug was swallowed")
    assert sorted(finished) == ["h2", "h3"]


def lost_or_changed(t: HostTarget) -> HostReport:
    """h1's deploy lost its link after the commit (``unreachable``, exit 3); the others changed."""
    if t.name == "h1":
        return HostReport("h1", "unreachable", 3, release="r-h1", error="lost after the commit",
                          extra={LOST_AFTER_COMMIT: {"release_dir": "/s/releases/r-h1", "events_seen": 7}})
    return HostReport(t.name, "changed", 0, release=f"r-{t.name}")


def test_a_host_lost_after_its_commit_is_followed_again_before_its_batch_is_judged() -> None:
    asked: list[tuple[str, str, int]] = []

    def follow(t: HostTarget, lost: HostReport) -> HostReport:
        asked.append((t.name, str(lost.release), lost.extra[LOST_AFTER_COMMIT]["events_seen"]))
        return HostReport(t.name, "changed", 0, release=lost.release, extra={"followed_again": True})

    def settle(batch: list[HostTarget], done: dict[str, HostReport], when: str) -> dict[str, HostReport]:
        asked.append(("when", when, 0))
        return follow_lost(batch, done, follow, 2, hooks())

    plan = FleetPlan(forks=2, serial=tuple(parse_serial("1")), max_fail_percent=Fraction(0))
    run = run_fleet(targets(3), lost_or_changed, plan, hooks(), settle=settle)
    # only the lost host is followed, once, from where its controller lost it
    assert asked == [("when", "before batch 2", 0), ("h1", "r-h1", 7), ("when", "before batch 3", 0),
                     ("when", "before the end of the run", 0)]
    assert run.results["h1"].outcome == "changed" and run.results["h1"].extra["followed_again"] is True
    assert run.stopped is None and run.not_started == [] and len(run.results) == 3


def test_a_host_still_unreachable_counts_as_failed_and_the_later_batches_never_start() -> None:
    def settle(batch: list[HostTarget], done: dict[str, HostReport], when: str) -> dict[str, HostReport]:
        return follow_lost(batch, done, lambda t, lost: lost, 2, hooks())  # the second try fails too

    plan = FleetPlan(forks=2, serial=tuple(parse_serial("1")), max_fail_percent=Fraction(0))
    run = run_fleet(targets(3), lost_or_changed, plan, hooks(), settle=settle)
    assert run.results["h1"].outcome == "unreachable" and run.results["h1"].exit_code == 3
    assert run.not_started == ["h2", "h3"]
    assert run.stopped == "batch 1 of 3 failed: every host of the batch failed (1 of 1)"
    assert not lost_after_commit(HostReport("h9", "unreachable", 2))  # before the commit: not followed again


def test_a_second_ctrl_c_while_the_first_is_passed_on_reaches_the_worker_as_interrupted_twice() -> None:
    """The first Ctrl-C's line is being printed (``interrupting``) when the second comes: the
    second is not lost out of the pool (it would end the run as a bare "interrupted"), and the
    worker is told both at once: ``InterruptedTwice``."""
    import _thread

    from orchestrator.errors import InterruptedTwice

    at_work = threading.Event()
    told: list[type[BaseException]] = []

    def work(t: HostTarget) -> HostReport:
        at_work.set()
        try:
            while True:  # a host at work (Python runs here, as the line reader's loop does)
                time.sleep(0.01)
        except KeyboardInterrupt as e:
            told.append(type(e))
        return HostReport(t.name, "failed", 1, error="stopped")

    def interrupting(_kind: type[KeyboardInterrupt]) -> None:
        if not told and not said:
            said.append("the first Ctrl-C's line")
            raise KeyboardInterrupt  # the second Ctrl-C, landing while that line is printed

    class Waiting(threading.Event):
        """The pool's "all done" event, which says when the main thread waits on it: the
        first Ctrl-C comes then, not while the pool still starts its workers."""
        waited = threading.Event()

        def wait(self, timeout: float | None = None) -> bool:
            Waiting.waited.set()
            return super().wait(timeout)

    said: list[str] = []
    pool = HostPool(targets(1), work, 1, hooks(interrupting=interrupting))
    pool._all_done = Waiting()
    threading.Thread(target=lambda: at_work.wait(WAIT) and Waiting.waited.wait(WAIT) and _thread.interrupt_main(),
                     daemon=True).start()
    try:
        results = pool.run()
    except KeyboardInterrupt:
        raise AssertionError("a Ctrl-C escaped the pool") from None
    assert said == ["the first Ctrl-C's line"]
    assert told == [InterruptedTwice]
    assert results["h1"].error == "stopped"


def test_a_ctrl_c_handed_to_a_worker_while_it_starts_a_thread_reaches_the_worker_alone() -> None:
    """A worker that opens a link starts its reader threads; a Ctrl-C handed to it then must
    not reach the thread it is starting (Python up to 3.11 gives that thread the worker's id
    until it runs): that thread died in its start-up and the worker waited for it for ever
    (``orch status`` hung on a Ctrl-C). Each round's worker starts threads until the Ctrl-C
    lands in it; it must end, and no thread it started may have died in its start-up."""
    unraisable: list[object] = []
    ran: list[int] = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    # No collection during the rounds: a finalizer the collector runs in the worker (garbage
    # of earlier tests) would take the Ctrl-C and drop it as "Exception ignored", which no
    # hand-off can prevent (Python's own Ctrl-C neither); a second Ctrl-C reaches the worker.
    gc.collect()
    gc.disable()
    try:
        for _ in range(60):
            started: list[threading.Thread] = []
            reached = threading.Event()

            def worker(started: list[threading.Thread] = started, reached: threading.Event = reached) -> None:
                try:
                    while True:
                        t = threading.Thread(target=ran.append, args=(1,))
                        t.start()
                        started.append(t)
                        reached.set()
                except KeyboardInterrupt:
                    pass

            w = threading.Thread(target=worker)
            w.start()
            assert reached.wait(30)
            assert w.ident is not None
            raise_in_thread(w.ident, KeyboardInterrupt)
            w.join(60)
            assert not w.is_alive(), "the worker hung starting a thread: the Ctrl-C reached that thread"
            for t in started:
                t.join(60)
    finally:
        gc.enable()
        sys.unraisablehook = hook
    assert unraisable == [], unraisable  # no thread died in its start-up
    assert len(ran) >= 60



def test_a_ctrl_c_for_a_worker_waiting_to_start_a_thread_waits_until_that_thread_started() -> None:
    """The worker waits for ``threading``'s lock inside ``Thread.start``, to put its new thread
    in ``_limbo``, while the hand-off holds that lock: raised then, the Ctrl-C landed just
    after the worker got the lock, before the thread was started, and left it in ``_limbo``
    for ever (every later hand-off waited for ever). It must be held back until the worker
    is out of ``Thread.start``. The order is forced in a fresh interpreter without a tracer
    (``tests/fixtures/limbo_race.py`` says why); a hang there is this test's timeout."""
    checkout = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COV_CORE_", "COVERAGE_", "ORCH_TEST_COVERAGE"))}
    env["PYTHONPATH"] = str(checkout)
    run = subprocess.run([sys.executable, "-m", "tests.fixtures.limbo_race"], cwd=checkout, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen["reached_thread_start"], "the worker never waited inside Thread.start"
    assert seen["retried"] >= 1, "raised while the worker waited inside Thread.start"
    assert not seen["worker_alive"] and seen["caught"] == [True]
    assert seen["stale_in_limbo"] == [], "a thread was left in threading._limbo: every later Ctrl-C would wait for ever"
    assert seen["started"] == 1 and seen["started_alive"] == [False]


def test_a_host_cut_off_between_its_steps_by_sigterm_is_said_stopped_by_sigterm_not_ctrl_c() -> None:
    """A host whose work lets the interruption through (between two of its steps) gets the
    result the hooks make for it, with the signal's own words, and so does the run."""
    from orchestrator.errors import Hangup, Terminated

    for kind, words in ((Terminated, "stopped by SIGTERM"), (Hangup, "stopped by SIGHUP"),
                        (KeyboardInterrupt, "interrupted (Ctrl-C)")):
        at_work = threading.Event()

        def work(t: HostTarget, at_work: threading.Event = at_work) -> HostReport:
            at_work.set()
            while True:  # between two steps: nothing here handles the interruption
                time.sleep(0.01)

        pool = HostPool(targets(2), work, 1, hooks())
        threading.Thread(target=lambda k=kind, a=at_work, p=pool: a.wait(WAIT) and p._interrupt(k), daemon=True).start()
        results = pool.run()
        assert results["h1"].error == words and pool.interrupted, (kind, results)
        assert [t.name for t in pool.never_started] == ["h2"]
