"""The helper's protocol, defined once (``orchestrator/host/protocol*.py``).

Every request type is held to the helper function it runs (read with ``ast``
from ``shell/agent.py`` and, where the package split has landed, from the op
table in ``orchestrator/host``), every request, reply and event round-trips
through its wire form, a wrong op or field is refused in one line naming
both, and the pipeline reads no batch answer by position.
"""

from __future__ import annotations

import ast
import collections.abc
import copy
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import orchestrator
from orchestrator.host import protocol as p
from orchestrator.host import protocol_events as ev
from orchestrator.host import protocol_replies as r
from orchestrator.host import protocol_verdict as pv
from orchestrator.host.protocol_steps import ReprobeEvent, StepEvent
from orchestrator.shell import ops
from orchestrator.shell.replies import Malformed

ROOT = Path(orchestrator.__file__).parent
PROTOCOL_FILES = sorted((ROOT / "host").glob("protocol*.py"))

# ---------------------------------------------------------------- the helper's functions, read with ast

Param = tuple[str, bool, Any]  # name, has a default, the default's value


def _constants(tree: ast.Module) -> dict[str, Any]:
    """A module's top-level ``NAME = <literal>`` assignments (defaults may name them)."""
    out: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return out


def _params(fn: ast.FunctionDef, constants: dict[str, Any], drop_first: bool) -> list[Param]:
    args = fn.args.args[1:] if drop_first else fn.args.args
    assert not fn.args.vararg and not fn.args.kwarg and not fn.args.kwonlyargs, fn.name
    defaults = [None] * (len(fn.args.args) - len(fn.args.defaults)) + list(fn.args.defaults)
    defaults = defaults[1:] if drop_first else defaults
    out: list[Param] = []
    for arg, default in zip(args, defaults, strict=True):
        if default is None:
            out.append((arg.arg, False, None))
        elif isinstance(default, ast.Name):
            assert default.id in constants, f"{fn.name}: default {default.id} is no module constant"
            out.append((arg.arg, True, constants[default.id]))
        else:
            out.append((arg.arg, True, ast.literal_eval(default)))
    return out


def _agent_ops(path: Path) -> dict[str, list[Param]]:
    """``@op("name")`` functions of the single-file helper."""
    tree = ast.parse(path.read_text())
    constants = _constants(tree)
    found = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for d in node.decorator_list:
            if isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "op":
                found[d.args[0].value] = _params(node, constants, drop_first=False)  # type: ignore[attr-defined]
    return found


def _package_ops(host: Path) -> dict[str, list[Param]]:
    """The host package's op table (``OPS = {"name": ("module", "function")}``); each op
    function takes the session first, which is no argument of the request."""
    table: dict[str, tuple[str, str]] = {}
    for path in host.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "OPS" for t in node.targets)
                    and isinstance(node.value, ast.Dict)):
                table.update(ast.literal_eval(node.value))
    constants: dict[str, Any] = {}
    trees = {path.stem: ast.parse(path.read_text()) for path in host.glob("*.py")}
    for tree in trees.values():
        constants.update(_constants(tree))
    found = {}
    for name, (module, function) in table.items():
        fn = next(n for n in trees[module].body if isinstance(n, ast.FunctionDef) and n.name == function)
        found[name] = _params(fn, constants, drop_first=True)
    return found


def helper_ops() -> list[tuple[str, dict[str, list[Param]]]]:
    """Every helper that exists: the single file and/or the package's op table."""
    helpers = []
    agent = ROOT / "shell" / "agent.py"
    if agent.exists():
        helpers.append(("shell/agent.py", _agent_ops(agent)))
    package = _package_ops(ROOT / "host")
    if package:
        helpers.append(("orchestrator/host", package))
    assert helpers, "no helper found: neither shell/agent.py nor an op table in orchestrator/host"
    return helpers


def request_params(kind: type[p.Request]) -> list[Param]:
    return [(f.name, not f.required, None if f.required else f.default) for f in p.fields_of(kind)]


@pytest.mark.parametrize("where, found", helper_ops(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_helper_op_has_a_request_type_with_its_exact_arguments(where: str, found: dict[str, list[Param]]
                                                                    ) -> None:
    assert sorted(found) == sorted(p.REQUESTS), f"{where}: ops and request types differ"
    for name, params in found.items():
        assert request_params(p.REQUESTS[name]) == params, f"{where}: {name}'s arguments differ from its type's"


def test_the_helpers_default_names_resolve_the_way_the_protocol_says() -> None:
    # lines=LOG_TAIL_LINES in the helper: the request's default is the same number
    assert p.LogTail("/log").lines == p.LOG_TAIL_LINES == 40


# ---------------------------------------------------------------- round trips

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                   max_size=3), max_leaves=8)
STEPS = st.lists(st.sampled_from([p.Mark("/m").to_wire(), p.Read(["/x"], with_data=False).to_wire(),
                                  p.LockRelease("~/.orch").to_wire()]), max_size=4)


def strategy(tp: Any) -> st.SearchStrategy[Any]:
    """Values of an annotation of the protocol's types."""
    if tp is Any:
        return JSON
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*[strategy(a) for a in args])
    if origin in (list, collections.abc.Sequence):
        return st.lists(strategy(args[0]), max_size=3)
    if origin is dict:
        return st.dictionaries(st.text(max_size=5), strategy(args[1]), max_size=3)
    simple = {str: st.text(max_size=10), int: st.integers(), float: st.floats(allow_nan=False),
              bool: st.booleans(), bytes: st.binary(max_size=10), type(None): st.none()}
    return simple[tp]


NAMES = {"Wire": dict[str, Any], "Any": Any, "ClassVar": typing.ClassVar, "Sequence": collections.abc.Sequence,
         "Mapping": collections.abc.Mapping}
"""What the protocol's annotations name but its modules import only for a type checker."""


def hints_of(kind: type) -> dict[str, Any]:
    return typing.get_type_hints(kind, {**NAMES, **vars(sys.modules[kind.__module__])})


def field_names(kind: type) -> list[str]:
    return [f.name for f in p.fields_of(kind)]


def instances(kind: type) -> st.SearchStrategy[Any]:
    hints = hints_of(kind)
    return st.builds(kind, **{name: STEPS if name in ("steps", "extra") else strategy(hints[name]) for name in field_names(kind)})


@pytest.mark.parametrize("kind", p.REQUEST_TYPES, ids=lambda k: k.OP)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_every_request_round_trips_through_its_wire_form(kind: type[p.Request], data: st.DataObject) -> None:
    request = data.draw(instances(kind))
    wire = request.to_wire()
    assert wire["op"] == kind.OP
    assert p.parse_request(copy.deepcopy(wire)) == request
    assert kind.from_wire(copy.deepcopy(wire)) == request
    assert p.parse_request(wire).to_wire() == wire


@pytest.mark.parametrize("kind", r.REPLY_TYPES, ids=lambda k: k.NAME)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_every_reply_round_trips_through_its_wire_form(kind: type[r.Reply], data: st.DataObject) -> None:
    reply = data.draw(instances(kind))
    assert kind.from_wire(copy.deepcopy(reply.to_wire())) == reply


@pytest.mark.parametrize("kind", [ev.TickEvent, ev.ProgressEvent, ev.HealthEvent], ids=lambda k: k.KIND)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_every_event_round_trips_through_its_wire_form(kind: type[ev.Event], data: st.DataObject) -> None:
    fields = {"step": st.none() | st.sampled_from(list(ev.ProgressStep)),
              "msg": st.text(max_size=20).filter(lambda m: not m.startswith("waiting up to"))}
    hints = hints_of(kind)
    event = data.draw(st.builds(kind, **{name: fields[name] if name in fields else strategy(hints[name])
                                         for name in field_names(kind)}))
    wire = dict(event.to_wire(), id=7)  # as the helper sends it: with the request's id
    assert wire["event"] == kind.KIND
    assert ev.event_from_wire(wire) == event
    assert kind.from_wire(wire) == event


WIRES = st.none() | st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3)
NUMBERS = st.floats(allow_nan=False, allow_infinity=False)
FAILURES = st.builds(pv.StepFailure, kind=st.text(min_size=1, max_size=8), message=st.text(max_size=20),
                     step=st.none() | st.text(max_size=8), details=WIRES)
PROGRAM_EVENTS = {
    StepEvent: st.builds(StepEvent, step=st.text(max_size=8), state=st.sampled_from(["began", "ended", "failed"]),
                         at=NUMBERS, seconds=st.none() | NUMBERS),
    ReprobeEvent: st.builds(ReprobeEvent, probes=st.tuples(st.text(max_size=5), st.text(max_size=5))),
    pv.AnswersEvent: st.builds(pv.AnswersEvent, step=st.text(max_size=8),
                               answers=st.none() | st.lists(WIRES, max_size=3), judged=WIRES),
    pv.RestoringEvent: st.builds(pv.RestoringEvent, failed=st.none() | FAILURES, by=st.text(min_size=1, max_size=8)),
    pv.VerdictEvent: st.builds(pv.VerdictEvent, verdict=st.text(max_size=10), failed=st.none() | FAILURES,
                               results=WIRES, judged=WIRES, restore=WIRES, reason=st.none() | st.text(max_size=10),
                               by=st.none() | st.text(max_size=8), error=WIRES, note=st.none() | st.text(max_size=8),
                               claim=WIRES, at=st.none() | NUMBERS),
}


@pytest.mark.parametrize("kind", list(PROGRAM_EVENTS), ids=lambda k: k.KIND)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_every_program_and_runner_event_round_trips_through_the_event_log(kind: type[Any], data: st.DataObject) -> None:
    """What the runner writes to a release's ``events.jsonl`` (a step, a re-probe, a step's answers,
    the restore beginning, the verdict) is read back by every follower as the same typed event."""
    event = data.draw(PROGRAM_EVENTS[kind])
    line = json.loads(json.dumps(event.to_wire()))  # as the log keeps it
    assert line["event"] == kind.KIND
    read = ev.event_from_wire(line) if kind in (StepEvent, ReprobeEvent) else pv.runner_event_of(line)
    assert read == event


def test_a_verdict_an_older_runner_wrote_is_read_and_a_newer_runners_field_is_ignored() -> None:
    """A verdict outlives the run that wrote it: 0.7's runner wrote ``failed`` with its step inside
    ``details`` too and no ``by`` on a guard's verdict; a newer one may add fields."""
    old = {"event": "verdict", "verdict": "restored", "reason": "the runner was killed (signal 9)",
           "failed": {"step": None, "kind": "runner", "message": "killed", "details": {"program_step": None}},
           "restore": {"ok": True, "by": "guard"}, "results": {}, "at": 1700000000.5, "new_field": [1, 2]}
    got = pv.runner_event_of(old)
    assert isinstance(got, pv.VerdictEvent)
    assert got.verdict == pv.VerdictEvent.RESTORED and got.by is None and got.restore == {"ok": True, "by": "guard"}
    assert got.failed == pv.StepFailure("runner", "killed", None, {"program_step": None})
    assert got.reason == "the runner was killed (signal 9)" and got.at == 1700000000.5
    assert pv.runner_event_of({"event": "verdict"}) == pv.VerdictEvent()  # every field has its default
    assert pv.runner_event_of({"event": "tick"}) is None


def test_replies_read_what_an_older_helper_left_out_and_ignore_what_a_newer_one_adds() -> None:
    assert r.FileInfo.from_wire({"path": "/x", "exists": False, "new_field": 1}) == r.FileInfo("/x", False)
    assert r.Armed.from_wire({"deadline": 5.0}).fires_at is None
    with pytest.raises(p.ProtocolError, match="^health_wait: missing field 'polls'$"):
        r.HealthReply.from_wire({"elapsed": 1.0})


def test_hello_carries_the_link_timeout_and_the_helper_keeps_it() -> None:
    """``hello``'s ``link_timeout`` across the wire and back; an older controller's hello (none)
    means the old constant, 30 s, on both ends; the helper's session keeps the limit sent, and
    ticks well within it; under the floor it is refused in one line."""
    import io
    import json

    from orchestrator.host import dispatch, wire
    from orchestrator.host.session import Session
    from orchestrator.host.wire import AgentError
    from orchestrator.shell import agent_client

    hello = p.Hello(link_timeout=6.5)
    line = json.loads(json.dumps(dict(hello.to_wire(), id=3), separators=(",", ":")))
    assert line == {"id": 3, "op": "hello", "args": {"link_timeout": 6.5}}
    assert p.parse_request(line) == hello and p.Hello.from_wire(line).link_timeout == 6.5
    older = p.Hello.from_wire({"id": 1, "op": "hello", "args": {}})
    assert older.link_timeout == wire.SILENCE_SECONDS == agent_client.LINK_TIMEOUT == 30.0

    session = Session(io.BytesIO())
    assert (session.silence_seconds, session.tick_seconds) == (30.0, wire.TICK_SECONDS)
    assert dispatch.op_hello(session, **hello.arguments())["protocol"] == wire.PROTOCOL
    assert session.silence_seconds == 6.5 and session.tick_seconds == pytest.approx(6.5 / 3)
    assert session.heard_seconds == 6.5
    dispatch.op_hello(session, **older.arguments())
    assert (session.silence_seconds, session.tick_seconds, session.heard_seconds) == (30.0, 5.0, 12.0)
    for bad in (2.9, 0, -1, float("nan"), "6", True):
        with pytest.raises(AgentError, match="^hello: link_timeout must be 3 s or more, got "):
            dispatch.op_hello(session, link_timeout=bad)
    assert session.silence_seconds == 30.0  # a refused hello changes nothing


def test_the_controllers_shapes_read_exactly_the_reply_types_fields() -> None:
    def names(kind: type) -> set[str]:
        return {f.name for f in p.fields_of(kind)}

    assert set(ops.FILE) == names(r.FileInfo)
    assert set(ops.PROCESS) == names(r.ProcessInfo)
    assert set(ops.LOCK) == names(r.LockReply)
    assert set(ops.RUN) == names(r.RunReply)
    assert set(ops.HEALTH) <= names(r.HealthReply)


# ---------------------------------------------------------------- refused in one line, before anything runs


@pytest.mark.parametrize("line, message", [
    ({"op": "reed", "args": {"paths": []}}, "unknown op 'reed'"),
    ({"args": {}}, "unknown op None"),
    ({"op": "read", "args": {"paths": [], "pathz": []}}, "op 'read': unknown field 'pathz'"),
    ({"op": "read", "args": {}}, "op 'read': missing field 'paths'"),
    ({"op": "read", "args": ["/x"]}, "op 'read': args is not an object"),
    ({"op": "batch", "args": {"steps": [{"op": "mark", "args": {"path": "/m"}},
                                        {"op": "server_stop", "args": {"pid": 1, "timeout": 5}}]}},
     "batch.steps[1]: op 'server_stop': unknown field 'timeout'"),
    ({"op": "confirm_release", "args": {"release_dir": "/r", "steps": [{"op": "bogus"}]}},
     "confirm_release.steps[0]: unknown op 'bogus'"),
])
def test_a_wrong_op_or_field_is_refused_in_one_line_naming_both(line: dict[str, Any], message: str) -> None:
    with pytest.raises(p.ProtocolError) as caught:
        p.parse_request(line)
    assert str(caught.value) == message
    assert "\n" not in str(caught.value)


def test_a_misspelt_argument_fails_on_the_controller_before_anything_is_sent() -> None:
    health = {"base_url": "http://h", "checks": [], "timeout": 1.0, "interval": 1.0, "stable_fr": 3.0}
    with pytest.raises(TypeError, match="stable_fr"):
        ops.health_wait(health)
    with pytest.raises(p.ProtocolError, match="expected 'read'"):
        p.Read.from_wire(p.Mark("/m").to_wire())


def test_optional_arguments_left_at_none_are_not_sent_but_required_ones_are() -> None:
    assert p.ServerFind(None, 8000).to_wire() == {"op": "server_find", "args": {"port": 8000}}
    assert p.NightlyLinkSwap("/c", None, "n1").to_wire()["args"] == {"link": "/c", "to": None, "expect": "n1"}
    assert p.PutJson("/x", None).to_wire()["args"] == {"path": "/x", "value": None}
    assert ops.put_json("/x", 1, best_effort=True).request.to_wire()["args"] == {"path": "/x", "value": 1,
                                                                                 "best_effort": True}


def test_a_best_effort_record_on_a_full_disk_answers_false_and_any_other_fails(tmp_path: Path) -> None:
    """The mark that a verdict was reported ends the batch that carries the verdict: a disk
    that cannot take it must not cost the controller that verdict."""
    from orchestrator.host.files import op_put_json
    from orchestrator.host.wire import AgentError

    missing = str(tmp_path / "no-such-release" / "reported.json")  # fails as a full disk does: no write
    assert op_put_json(None, missing, {"by": {}}, best_effort=True) is False
    with pytest.raises((OSError, AgentError)):
        op_put_json(None, missing, {"by": {}})
    written = str(tmp_path / "reported.json")
    assert op_put_json(None, written, {"by": {}}, best_effort=True) is True
    assert json.loads(Path(written).read_text()) == {"by": {}}


# ---------------------------------------------------------------- events the controller acts on


def test_the_health_wait_begins_on_a_typed_step_not_on_the_helpers_words() -> None:
    typed = ev.ProgressEvent("the server is starting", step=ev.ProgressStep.HEALTH_WAIT).to_wire()
    assert typed == {"event": "progress", "msg": "the server is starting", "step": "health_wait"}
    assert ev.health_began(typed)
    assert ev.health_began(ev.HealthEvent("connection refused", 0.5, 2).to_wire())
    # a helper from before the typed step (a kept copy) said it only in words: still understood
    assert ev.health_began({"event": "progress", "msg": "waiting up to 60 s for http://h to be healthy"})
    assert not ev.health_began({"event": "progress", "msg": "started pid 12"})
    assert not ev.health_began({"event": "progress", "msg": "x", "step": "a step of a newer helper"})
    assert not ev.health_began({"event": "tick", "t": 1.0})
    assert ev.event_from_wire({"event": "a kind of a newer helper"}) is None


# ---------------------------------------------------------------- answers read by name


def test_a_batchs_answers_are_read_by_the_op_that_asked_never_by_position() -> None:
    mark, run = ops.mark("/m"), ops.run(["true"])
    answers = ops.batch([mark, run]).read([True, {"rc": 3, "stdout": "", "stderr": ""}])
    assert answers[run]["rc"] == 3 and answers[mark] is True
    assert answers.each([run, mark]) == [{"rc": 3, "stdout": "", "stderr": ""}, True]
    with pytest.raises(TypeError, match="read by their Op"):
        answers[1]  # noqa: B018
    with pytest.raises(KeyError, match="run is not a step of this batch"):
        answers[ops.run(["true"])]  # an equal op, but not the one the batch was built with  # noqa: B018


def test_a_confirmed_releases_step_answers_are_read_by_op() -> None:
    prune = ops.nightly_prune("/b", ["n0"])
    confirm = ops.confirm_release("/r", [ops.mark("/m"), prune])
    answer = confirm.read({"confirmed": True, "results": [True, ["n0"]]})
    assert answer.confirmed and answer.results[prune] == ["n0"]
    lost = confirm.read({"confirmed": False, "claim": {"by": "watchdog"}})
    assert not lost.confirmed and lost.claimed_by == "watchdog" and not lost.results
    with pytest.raises(Malformed, match="has 1 answers for 2 steps"):
        confirm.read({"confirmed": True, "results": [True]})


def test_the_pipeline_writes_no_op_dict_and_reads_no_answer_by_position() -> None:
    literal = re.compile(r"""\{\s*["']op["']\s*:""")
    by_position = re.compile(r"""(results|answers|got|armed)\[-?\d+\]|\]\)\[-?\d+\]|batch\([^\n]*\)\[-?\d+\]""")
    found = []
    for path in sorted((ROOT / "pipeline").glob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if literal.search(line) or by_position.search(line):
                found.append(f"{path.name}:{n}: {line.strip()}")
    assert found == []


def test_ops_names_no_op_it_does_not_take_from_the_protocol() -> None:
    tree = ast.parse((ROOT / "shell" / "ops.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id in ("Op", "_op")]
    assert calls
    assert all(not (c.args and isinstance(c.args[0], ast.Constant)) for c in calls)
    assert not [k for k in ast.walk(tree) if isinstance(k, ast.Dict)
                and any(isinstance(key, ast.Constant) and key.value == "op" for key in k.keys)]


# ---------------------------------------------------------------- shipped to the host


@pytest.mark.parametrize("path", PROTOCOL_FILES, ids=lambda f: f.name)
def test_the_protocol_is_python_3_8_and_imports_only_the_standard_library(path: Path) -> None:
    source = path.read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    assert len(source.splitlines()) <= 600
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # within the host package
                assert (node.module or "").startswith(("protocol", "values")), node.module  # and its value classes
                continue
            roots = [(node.module or "").split(".")[0]]
        else:
            continue
        assert all(root in sys.stdlib_module_names for root in roots), roots
