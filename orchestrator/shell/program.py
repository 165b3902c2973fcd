"""A release's program as the controller builds and feeds it (``host/program.py``, ``host/executor.py``).

Deploy and night each say, before the commit, what every step after it runs
(``ReleaseProgram.add``); the program is kept in the release with its arm
(``write``), and the controller then asks the host's executor for it a part
at a time (``run``: "on through the health step"), with its own judgement
between parts. Each answer is read by the ``Op`` that built the request, as
a batch's are (``StepResults``), never by a position.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from orchestrator.host import protocol as p
from orchestrator.host.program import ORDER, Program, ProgramStep, StepName
from orchestrator.host.protocol_verdict import StepFailure, VerdictEvent
from orchestrator.shell.ops import Op, _op
from orchestrator.shell.replies import ANY, DictOf, ListOf, Malformed, Opt


class StepResults:
    """The answers of one ``release_steps`` call, each read by the ``Op`` that asked for it."""

    def __init__(self, answers: dict[Op, Any], ran: Sequence[StepName],
                 judged: dict[str, Any] | None = None) -> None:
        self._answers = answers
        self.ran = list(ran)
        self.judged = dict(judged or {})  # what the host decided a step by (the gate's outcome and figures)

    def __getitem__(self, op: Op) -> Any:
        if op not in self._answers:
            raise KeyError(f"{op.name} has no answer (its step did not run in this call)")
        return self._answers[op]

    def each(self, ops: Sequence[Op]) -> list[Any]:
        return [self[o] for o in ops]

    def __contains__(self, op: Op) -> bool:
        return op in self._answers

    def __iter__(self) -> Iterator[Any]:
        return iter(self._answers.values())


class ReleaseProgram:
    """The steps after one release's commit, as the controller's ``Op``s."""

    def __init__(self, release: str, kind: str) -> None:
        self.release = release
        self.kind = kind
        self.steps: dict[StepName, list[Op]] = {}
        self.expect: dict[StepName, dict[str, Any]] = {}

    def add(self, name: StepName, ops: Sequence[Op], expect: dict[str, Any] | None = None) -> None:
        """``expect``: what the step's last request must answer (``host.program.EXPECT_KEYS``)."""
        self.steps.setdefault(name, []).extend(ops)
        if expect:
            self.expect[name] = expect

    def prepend(self, names: Sequence[StepName], ops: Sequence[Op]) -> None:
        """``ops`` at the front of the first of ``names`` that holds a request (the last of
        ``names`` if none does): a record written before whichever of them runs first."""
        held = [n for n in names if self.steps.get(n)]
        name = held[0] if held else names[-1]
        self.steps[name] = list(ops) + self.steps.get(name, [])

    def has(self, name: StepName) -> bool:
        return bool(self.steps.get(name))

    def ordered(self) -> list[tuple[StepName, list[Op]]]:
        return [(n, self.steps[n]) for n in ORDER if self.steps.get(n)]

    def program(self) -> Program:
        return Program(self.release, self.kind,
                       [ProgramStep(n, [o.request for o in ops], self.expect.get(n)) for n, ops in self.ordered()])

    def write(self, release_dir: str) -> Op:
        """The request that keeps the program in the release (checked whole on the host)."""
        return _op(p.ProgramWrite(release_dir, self.program().to_wire()), shape=bool)

    def run(self, release_dir: str, through: StepName, confirm: Op | None = None) -> Op:
        """On from the last step that ended, through ``through``. ``confirm``: the
        ``confirm_release`` this run's figures fill (its steps go as ``extra``)."""
        extra = list(confirm.request.steps) if confirm is not None else None  # type: ignore[attr-defined]
        steps = dict(self.steps)
        if confirm is not None:
            steps[StepName.CONFIRM] = [confirm]

        def parse(answer: dict[str, Any]) -> StepResults:
            return read_steps(steps, answer.get("results") or {}, list(answer.get("ran") or []),
                              answer.get("judged"))

        return _op(p.RunSteps(release_dir, through.value, extra=extra), parse,
                   {"results": DictOf(ListOf(ANY)), "ran": ListOf(str), "judged": Opt(dict)})

    def ended(self, details: dict[str, Any]) -> StepResults:
        """The answers of the steps that ended before a ``release_steps`` call failed (its
        error's ``results``): what the host did, to be shown before the failure is."""
        results = details.get("results")
        if not isinstance(results, dict):
            return StepResults({}, [])
        try:
            return read_steps(self.steps, results, list(results))
        except (Malformed, ValueError):
            return StepResults({}, [])


def read_steps(steps: dict[StepName, list[Op]], results: dict[str, Any], ran: Sequence[str],
               judged: dict[str, Any] | None = None) -> StepResults:
    """Each answer of the steps that ran, read by the ``Op`` that asked for it."""
    names = [StepName(n) for n in ran]
    read: dict[Op, Any] = {}
    for name in names:
        ops, got = steps.get(name, []), results.get(name.value) or []
        if len(got) != len(ops):
            raise Malformed(f"step {name.value} has {len(got)} answers for {len(ops)} requests")
        for i, (o, a) in enumerate(zip(ops, got, strict=True)):
            read[o] = o.read(a, f"result.results.{name.value}[{i}] ({o.name})")
    return StepResults(read, names, judged)



# ---------------------------------------------------------------- the runner (``host/runner.py``)


STEPS_FILE = "steps.json"  # the controller's steps before the commit, for ``host/stamp.py``


class RunVerdict:
    """How the runner ended a release (its log's last event, ``VerdictEvent``), read by field."""

    CONFIRMED = VerdictEvent.CONFIRMED
    RESTORED = VerdictEvent.RESTORED
    RESTORE_FAILED = VerdictEvent.RESTORE_FAILED
    NOT_CONFIRMED = VerdictEvent.NOT_CONFIRMED  # someone else restored it first (`orch rollback`, the guard)
    ROLLBACK_FAILED = VerdictEvent.ROLLBACK_FAILED

    def __init__(self, wire: dict[str, Any], lines: int) -> None:
        self.event = VerdictEvent.from_wire(wire)
        self.lines = lines  # where a later follow goes on
        self.verdict = self.event.verdict
        self.failed: StepFailure | None = self.event.failed
        self.restore: dict[str, Any] | None = self.event.restore
        self.results: dict[str, Any] = self.event.results or {}
        self.judged: dict[str, Any] = self.event.judged or {}
        self.by = self.event.by or str((self.restore or {}).get("by") or "runner")

    def failure(self) -> StepFailure:
        """Why it did not confirm: the step that failed, or, where none did (the runner died,
        the backstop's deadline passed), the guard's reason."""
        return self.failed or StepFailure("runner", self.event.reason or "the host's runner died")

    @property
    def confirmed(self) -> bool:
        return self.verdict == self.CONFIRMED

    def stamped_steps(self) -> list[dict[str, Any]]:
        """The steps the host recorded when it confirmed (``release_stamp``'s answer, the
        first record the confirm wrote): [] where there is none."""
        confirm = (self.results.get("confirm") or [None])[-1]
        records = confirm.get("results") if isinstance(confirm, dict) else None
        stamp = records[0] if isinstance(records, list) and records else None
        steps = stamp.get("steps") if isinstance(stamp, dict) else None
        return [s for s in steps if isinstance(s, dict)] if isinstance(steps, list) else []


def release_run(release_dir: str, state_dir: str) -> Op:
    """The commit is done: the host's runner takes the release (and the lock) from here."""
    return _op(p.ReleaseRun(release_dir, state_dir), shape={"pid": Opt(int), "guard": Opt(int)})


def release_follow(release_dir: str, after: int = 0, *, abort_on_cancel: bool = True) -> Op:
    """The runner's events from line ``after`` on, then its verdict. ``abort_on_cancel``: a
    Ctrl-C here aborts the runner (the deploy's own controller), or only stops following."""
    return _op(p.ReleaseFollow(release_dir, after, abort_on_cancel), lambda a: RunVerdict(a["verdict"], int(a.get("lines") or 0)),
               {"verdict": dict, "lines": Opt(int)})


def release_abort(release_dir: str) -> Op:
    return _op(p.ReleaseAbort(release_dir), shape={"aborted": bool})


def release_stamp(state_dir: str, release_id: str, release_dir: str, started: float,
                  steps: Sequence[dict[str, Any]], gate: dict[str, Any] | None = None, *,
                  probe: dict[str, Any] | None = None, manifest: dict[str, Any] | None = None,
                  fields: dict[str, Any] | None = None) -> Op:
    """Inside the confirm: the run's figures from the host's own record of it (``host/stamp.py``);
    a night's probe (``post``, ``concurrency``) and build manifest (``path``, ``record``) too;
    ``fields`` set in the release's manifest in the same write (the outcome)."""
    return _op(p.ReleaseStamp(state_dir, release_id, release_dir, started, [dict(s) for s in steps], gate,
                              probe, manifest, fields))
