"""The release's program and its one executor (``host/program.py``, ``host/executor.py``).

The program round-trips its wire form and refuses what it does not describe
(pure); the real helper over the local transport keeps it 0600, runs it a part
at a time, each step's begin and end a typed event on the host's clock in the
release's ``events.jsonl`` — the record a later call (or a runner with no
controller) goes on from — and fails a step naming it.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.host import protocol as p
from orchestrator.host.program import ORDER, Program, ProgramStep, StepName
from orchestrator.host.protocol import ProtocolError
from orchestrator.host.protocol_events import StepEvent, event_from_wire
from orchestrator.shell import ops
from orchestrator.shell.agent_client import Agent, RemoteStepError
from orchestrator.shell.program import ReleaseProgram


@pytest.fixture
def agent(local_agent: Agent) -> Agent:
    return local_agent


def call(agent: Agent, op: ops.Op, events: list[dict[str, Any]] | None = None) -> Any:
    """One op through the real helper, its answer read by the op (as ``HostSession.run`` does)."""
    answer = agent.call(op.name, on_event=events.append if events is not None else None, **op.args)
    return op.read(answer)


def logged(release: Path) -> list[StepEvent]:
    lines = (release / "events.jsonl").read_text().splitlines()
    return [StepEvent.from_wire(json.loads(line)) for line in lines]


# ---------------------------------------------------------------- the program, pure


def test_a_program_round_trips_its_wire_form_and_keeps_the_one_order() -> None:
    program = Program("R1", "deploy", [
        ProgramStep(StepName.READ_BACK, [p.Read(["/a"], with_data=False)]),
        ProgramStep(StepName.START, [p.ServerStart(["python3", "-m", "x"], None, None, "/l", "/p", False)]),
        ProgramStep(StepName.HEALTH, []),  # a step with nothing to run is no step
        ProgramStep(StepName.CONFIRM, [p.ConfirmRelease("/r", [])]),
    ])
    wire = json.loads(json.dumps(program.to_wire()))
    assert Program.from_wire(wire) == program
    assert program.names == [StepName.READ_BACK, StepName.START, StepName.CONFIRM]
    assert [s.name for s in program.through(0, StepName.HEALTH)] == [StepName.READ_BACK, StepName.START]
    assert [s.name for s in program.through(2, StepName.CONFIRM)] == [StepName.CONFIRM]
    assert list(ORDER).index(StepName.STOP) < list(ORDER).index(StepName.SWITCH) < list(ORDER).index(StepName.START)
    with pytest.raises(ProtocolError, match="out of order"):
        Program("R1", "deploy", [ProgramStep(StepName.START, [p.Mark("/m")]),
                                 ProgramStep(StepName.STOP, [p.Mark("/n")])])


@pytest.mark.parametrize(("wire", "message"), [
    ({"format": 1, "release": "R", "kind": "deploy", "steps": [{"step": "reboot", "requests": []}]},
     "unknown program step 'reboot'"),
    ({"format": 1, "release": "R", "kind": "deploy",
      "steps": [{"step": "stop", "requests": [{"op": "server_stop", "args": {"pid": 1, "timeout": 3}}]}]},
     "stop: op 'server_stop': unknown field 'timeout'"),
    ({"format": 9, "release": "R", "kind": "deploy", "steps": []}, "unknown format 9"),
])
def test_a_program_that_does_not_fit_its_type_is_refused_in_one_line(wire: dict[str, Any], message: str) -> None:
    with pytest.raises(ProtocolError) as e:
        Program.from_wire(wire)
    assert message in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------- the executor, on a real helper


def make_release(tmp_path: Path) -> tuple[Path, Path]:
    release = tmp_path / "releases" / "R1"
    release.mkdir(parents=True)
    target = tmp_path / "server_args.py"
    target.write_text("x = 1\n")
    return release, target


def test_the_executor_runs_the_kept_program_a_part_at_a_time_and_logs_each_step(
        agent: Agent, tmp_path: Path) -> None:
    release, target = make_release(tmp_path)
    program = ReleaseProgram("R1", "deploy")
    readback = ops.read([str(target)], with_data=False)
    program.add(StepName.READ_BACK, [readback])
    parser = ops.run_ok([sys.executable, "-c", "print('parsed')"], timeout=30)
    program.add(StepName.PREFLIGHT, [parser])
    program.add(StepName.START, [ops.mark(str(tmp_path / "started"))])
    program.prepend([StepName.STOP, StepName.START], [ops.mark(str(tmp_path / "touched"))])
    program.add(StepName.CONFIRM, [ops.confirm_release(str(release), [])])
    assert call(agent, program.write(str(release))) is True
    kept = release / "program.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert Program.from_wire(json.loads(kept.read_text())) == program.program()

    events: list[dict[str, Any]] = []
    first = call(agent, program.run(str(release), StepName.PREFLIGHT), events)
    assert first.ran == [StepName.READ_BACK, StepName.PREFLIGHT]
    assert first[readback][0]["sha256"] is not None and first[readback][0]["exists"]
    assert "parsed" in first[parser]["stdout"]
    assert not (tmp_path / "started").exists()  # the start is a later part
    sent = [e for e in map(event_from_wire, events) if isinstance(e, StepEvent)]
    assert [(e.step, e.state) for e in sent] == [("read_back", "began"), ("read_back", "ended"),
                                                 ("preflight", "began"), ("preflight", "ended")]
    assert logged(release) == sent  # what the controller heard is what the host kept
    assert all(e.seconds is not None and e.seconds >= 0 for e in sent if e.state == "ended")

    # the confirm's steps come with it: here, a record written inside the claim
    claim = ops.confirm_release(str(release), [ops.put_json(str(tmp_path / "state.json"), {"applied": ["R1"]})])
    second = call(agent, program.run(str(release), StepName.CONFIRM, confirm=claim))
    assert second.ran == [StepName.START, StepName.CONFIRM]  # on from the last step that ended
    assert (tmp_path / "touched").exists() and (tmp_path / "started").exists()
    assert second[claim].confirmed
    assert json.loads((tmp_path / "state.json").read_text()) == {"applied": ["R1"]}
    steps = logged(release)
    assert [e.step for e in steps if e.state == "ended"] == ["read_back", "preflight", "start", "confirm"]
    assert [e.at for e in steps] == sorted(e.at for e in steps)  # the host's clock, in order

    third = call(agent, program.run(str(release), StepName.CONFIRM))
    assert third.ran == []  # nothing is run twice


def test_a_failing_step_stops_the_program_there_and_is_logged_as_failed(agent: Agent, tmp_path: Path) -> None:
    release, _ = make_release(tmp_path)
    program = ReleaseProgram("R1", "deploy")
    program.add(StepName.BEFORE_STOP, [ops.run_ok([sys.executable, "-c", "import sys; sys.exit(3)"], timeout=30)])
    program.add(StepName.STOP, [ops.mark(str(tmp_path / "stopped"))])
    call(agent, program.write(str(release)))
    with pytest.raises(RemoteStepError) as e:
        call(agent, program.run(str(release), StepName.HEALTH))
    assert e.value.details["program_step"] == "before_stop"
    assert not (tmp_path / "stopped").exists()  # a failed drain stops nothing
    assert [(s.step, s.state) for s in logged(release)] == [("before_stop", "began"), ("before_stop", "failed")]


def test_a_bad_program_is_refused_before_anything_is_kept(agent: Agent, tmp_path: Path) -> None:
    release, _ = make_release(tmp_path)
    bad = {"format": 1, "release": "R1", "kind": "deploy",
           "steps": [{"step": "start", "requests": [{"op": "launch_missiles", "args": {}}]}]}
    with pytest.raises(RemoteStepError) as e:
        agent.call("program_write", release_dir=str(release), program=bad)
    assert e.value.kind == "protocol" and "unknown op 'launch_missiles'" in e.value.message
    assert not (release / "program.json").exists()
    with pytest.raises(RemoteStepError) as absent:
        agent.call("release_steps", release_dir=str(release), through="confirm")
    assert absent.value.kind == "absent" and "has no program" in absent.value.message
    with pytest.raises(RemoteStepError) as step:
        agent.call("release_steps", release_dir=str(release), through="reboot")
    assert step.value.kind == "protocol" and "'reboot'" in step.value.message
    assert os.listdir(release) == []


def test_the_host_decides_a_step_by_what_it_expects_a_read_back_and_a_parser(agent: Agent, tmp_path: Path) -> None:
    """The read-back and the pre-flight are decided on the host (``expect``), so that a runner
    with no controller decides them the same way: a file that reads back other than
    committed fails ``read_back``; a parser that exits non-zero fails ``preflight``."""
    release, target = make_release(tmp_path)
    import hashlib

    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    program = ReleaseProgram("R1", "deploy")
    program.add(StepName.READ_BACK, [ops.read([str(target)], with_data=False)], expect={"sha256": {str(target): digest}})
    refusing = [sys.executable, "-c", "import sys; sys.stderr.write('error: unrecognized arguments: --x\\n'); sys.exit(2)"]
    program.add(StepName.PREFLIGHT, [ops.preflight(refusing, cwd=None, env=None, replace_env=False, timeout=30)],
                expect={"rc": 0})
    call(agent, program.write(str(release)))
    with pytest.raises(RemoteStepError) as e:
        call(agent, program.run(str(release), StepName.PREFLIGHT))
    assert e.value.kind == "refused" and e.value.details["program_step"] == "preflight"
    assert e.value.details["answer"]["rc"] == 2
    assert "unrecognized arguments" in e.value.details["answer"]["stderr"]
    ended = program.ended(e.value.details)
    assert ended.ran == [StepName.READ_BACK]  # what the host did before: shown before the failure

    other = tmp_path / "releases" / "R2"
    other.mkdir()
    wrong = ReleaseProgram("R2", "deploy")
    wrong.add(StepName.READ_BACK, [ops.read([str(target)], with_data=False)], expect={"sha256": {str(target): "0" * 64}})
    call(agent, wrong.write(str(other)))
    with pytest.raises(RemoteStepError) as bad:
        call(agent, wrong.run(str(other), StepName.CONFIRM))
    assert bad.value.kind == "readback" and f"reads back with sha256 {digest}, planned {'0' * 64}" in bad.value.message
