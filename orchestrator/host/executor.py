"""The one executor of a release's program (``program.py``): deploy's, night's and rollback's.

The controller keeps the program in the release when it arms it
(``op_program_write``) and then asks for it a part at a time
(``op_release_steps``: "on through the health step"), so that its own
judgement (the gate's verdict, a failure's restore) comes between parts.
Each step's requests run in order through the op table, as a batch's do;
the first failure stops the step and the program there.

Every step that begins, ends or fails is a ``StepEvent`` on the host's
clock, sent to the controller and appended to the release's event log
(``events.jsonl``, 0600). The log is the executor's memory: a later call —
from another connection, or from a process on the host that runs the
program without any controller — goes on after the last step that ended,
and the manifest's step times can be read from it.
"""

import os
import time

from . import eventlog
from .dispatch import find_op
from .files import read_record, write_json
from .program import Program, StepName
from .protocol import ConfirmRelease, ProtocolError, parse_request
from .protocol_steps import ReprobeEvent, StepEvent
from .wire import AgentError, expand

PROGRAM_FILE = "program.json"
EVENTS_FILE = eventlog.EVENTS_FILE
GATE_JUDGED = "gate_judged.json"  # the gate step's outcome and the figures it was decided on
BASELINE_ANSWERS = "baseline.json"  # the baseline step's probe answers: the gate step may come in a later call
PROBE_ANSWERS = "probe.json"  # a night's probe step's answers: its confirm's records are written from them


def program_of(release_dir):
    """The release's kept program; an ``AgentError`` naming what is wrong if it has none or a bad one."""
    wire = read_record(os.path.join(release_dir, PROGRAM_FILE))
    if wire is None:
        raise AgentError("absent", "release %s has no program" % os.path.basename(release_dir))
    try:
        return Program.from_wire(wire)
    except ProtocolError as e:
        raise AgentError("protocol", str(e))


def op_program_write(s, release_dir, program):
    """Check the program whole, then keep it in the release (0600, like ``restore.json``)."""
    try:
        Program.from_wire(program)
    except ProtocolError as e:
        raise AgentError("protocol", str(e))
    write_json(os.path.join(expand(release_dir), PROGRAM_FILE), program)
    return True


def step_events(release_dir):
    """The release's event log, as ``StepEvent``s (a line that is not one is skipped)."""
    return [StepEvent.from_wire(w) for w in eventlog.lines(release_dir) if w.get("event") == StepEvent.KIND]


def steps_ended(release_dir):
    """How many of the program's steps have ended: where the next call goes on."""
    return len([e for e in step_events(release_dir) if e.state == StepEvent.ENDED])


def record_event(s, release_dir, event):
    """Append ``event`` to the release's log, then tell the controller, if one listens."""
    eventlog.append(release_dir, event.to_wire())
    wire = event.to_wire()
    s.event(wire.pop("event"), **wire)


def with_extra(request, extra):
    """The confirm step's claim with ``extra`` run first inside it (after the claim)."""
    if not extra or not isinstance(request, ConfirmRelease):
        return request
    return ConfirmRelease(request.release_dir, list(extra) + list(request.steps))


def check_answer(step, answer):
    """The step's ``expect`` held against its last request's answer: an ``AgentError`` where
    it differs (``readback``: a file does not hold what was committed; ``refused``: a command
    such as the server's parser said no), with the answer in its details."""
    expect = step.expect or {}
    planned = expect.get("sha256")
    if planned:
        asked = getattr(step.requests[-1], "paths", None) or []  # answered in the order asked (paths expanded)
        got = {path: info.get("sha256") for path, info in zip(asked, answer or []) if isinstance(info, dict)}
        for path, digest in sorted(planned.items()):
            if got.get(path) != digest:
                raise AgentError("readback", "%s reads back with sha256 %s, planned %s" % (path, got.get(path), digest),
                                 path=path, sha256=got.get(path), planned=digest)
    if step.name is StepName.RESTORE and isinstance(answer, dict) and not answer.get("ok"):
        # a rollback's restore that failed fails its step: its runner never restores again
        raise AgentError("restore", "the rollback's restore failed: %s" % restore_failure(answer), record=answer)
    if "rc" in expect:
        rc = answer.get("rc") if isinstance(answer, dict) else None
        if rc != expect["rc"]:
            raise AgentError("refused", refusal(step, answer, rc), answer=answer)


def restore_failure(record):
    """What a restore record says went wrong, in a line (its error, else its server's)."""
    server = record.get("server") if isinstance(record.get("server"), dict) else {}
    return str(record.get("error") or server.get("error") or "see its record")


def refusal(step, answer, rc):
    """The sentence a refused step is recorded with when no controller words it: the
    command's own last line of complaint (as ``core.preflight.PreflightResult.refusal``)."""
    said = ""
    if isinstance(answer, dict):
        said = str(answer.get("error_line") or "")
        if not said:
            tail = str(answer.get("stderr") or answer.get("stdout") or "").strip().splitlines()
            said = tail[-1] if tail else ""
    if step.name is StepName.PREFLIGHT:
        return "the pre-flight refused the new command line (exit %s): %s; the running server was not touched" % (
            rc, said or "exit %s" % rc)
    return "%s: exit %s%s" % (step.name.value, rc, (": " + said) if said else "")


def check_answered(probe, answers):
    """A probe of which no request succeeded measured nothing: the step fails, naming the
    first error (``probe``: the route and concurrency its answers are read with)."""
    from .figures import probe_result

    result = probe_result(str(probe.get("post")), int(probe.get("concurrency") or 1), answers)
    if sum(r.ok for r in result.rounds) == 0:
        first = next((r.first_error for r in result.rounds if r.first_error), "?")
        raise AgentError("probe", "probe: no request to %s succeeded (first error: %s)" % (probe.get("post"), first))


def gate_verdict(s, release_dir, step, answers, results):
    """The gate step decided here (``gate_step.judge_gate``): its outcome and the figures it
    was decided on; an ``AgentError`` ``gate`` carrying both when it fails. The baseline
    probes' answers are this call's, or the ones kept when the baseline step ended."""
    from .gate_step import judge_gate

    baseline = results.get(StepName.BASELINE.value)
    if baseline is None:
        baseline = read_record(os.path.join(release_dir, BASELINE_ANSWERS)) or []

    def run_again(labels, indexes):
        s.event(ReprobeEvent.KIND, probes=list(labels))
        return [run_request(s, step.requests[i]) for i in indexes]

    outcome, after = judge_gate(step.expect["gate"], answers, baseline, run_again)
    verdict = {"outcome": outcome.to_json(), "after": {k: v.to_json() for k, v in after.items()}}
    write_json(os.path.join(release_dir, GATE_JUDGED), verdict)  # the confirm's records are written from it
    if outcome.verdict != "pass":
        raise AgentError("gate", outcome.message(), **verdict)
    return verdict


def run_request(s, request):
    fn = find_op(request.OP)
    return fn(s, **request.arguments())


def op_release_steps(s, release_dir, through, extra=None):
    """Run the kept program on from its last ended step through ``through``.

    The answer: ``{"results": {step: [answers of its requests]}, "ran": [steps]}``.
    A failing request fails its step (a ``failed`` event) and the call, whose
    error details say which step (``program_step``), what that step's requests
    answered before it (``done``) and the answers of the steps that ended
    (``results``).
    """
    release_dir = expand(release_dir)
    try:
        last = StepName(through)
        extra = list(extra or [])
        for wire in extra:
            parse_request(wire, "release_steps.extra: ")  # checked now; sent on as wire, as a batch's steps
    except (ValueError, ProtocolError) as e:
        raise AgentError("protocol", str(e))
    program = program_of(release_dir)
    results = {}
    judged = {}
    for step in program.through(steps_ended(release_dir), last):
        began = time.time()
        started = time.monotonic()
        record_event(s, release_dir, StepEvent(step.name.value, StepEvent.BEGAN, began))
        done = []
        for request in step.requests:
            if step.name is StepName.CONFIRM:
                request = with_extra(request, extra)
            try:
                done.append(run_request(s, request))
                if len(done) == len(step.requests):
                    check_answer(step, done[-1])
                    if "answered" in (step.expect or {}):
                        check_answered(step.expect["answered"], done)
                    if step.name is StepName.GATE and "gate" in (step.expect or {}):
                        judged[step.name.value] = gate_verdict(s, release_dir, step, done, results)
            except Exception as e:
                seconds = round(time.monotonic() - started, 3)
                record_event(s, release_dir, StepEvent(step.name.value, StepEvent.FAILED, time.time(), seconds))
                if not isinstance(e, AgentError):
                    e = AgentError("internal", "%s: %s" % (type(e).__name__, e))
                e.details.update(program_step=step.name.value, step_done=done, results=results)
                raise e
        if step.name is StepName.BASELINE:
            write_json(os.path.join(release_dir, BASELINE_ANSWERS), done)
        elif step.name is StepName.PROBE:
            write_json(os.path.join(release_dir, PROBE_ANSWERS), done)
        seconds = round(time.monotonic() - started, 3)
        record_event(s, release_dir, StepEvent(step.name.value, StepEvent.ENDED, time.time(), seconds))
        s.answered(step.name.value, done, judged.get(step.name.value))
        results[step.name.value] = done
    return {"results": results, "ran": list(results), "judged": judged}
