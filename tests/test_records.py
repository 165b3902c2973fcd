"""The host's records (``orchestrator/host``): each one round-trips through its wire form,
reads what earlier versions wrote (missing fields take their documented defaults),
ignores fields it does not know, and refuses a ``format`` it does not know with one line
naming the record and the version — at the boundary too, as an ``orch`` error (exit 2)."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.outcomes import error_exit_code
from orchestrator.errors import RecordFormatError, RefusedError
from orchestrator.host.records import (
    AppliedState,
    HostRecords,
    Journal,
    JournalStep,
    Lock,
    Manifest,
    ReleaseFile,
    ServerProcess,
    ServerSpec,
    StatePaths,
    UnknownRecordFormat,
    WatchdogRecord,
)
from orchestrator.host.restore_plan import (
    FileOutcome,
    FileState,
    LinkState,
    RestorePlan,
    RestoreRecord,
    RestoreSpec,
    ServerStart,
    ServerTarget,
)
from orchestrator.shell import ops
from tests.fixtures.sandbox import Sandbox

ROOT = Path(__file__).resolve().parent.parent
HOST = ROOT / "orchestrator" / "host"

# ---------------------------------------------------------------- strategies

text = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=12)
maybe_text = st.none() | text
words = st.lists(text, max_size=4)
seconds = st.floats(min_value=0, max_value=4e9, allow_nan=False, allow_infinity=False)
maybe_seconds = st.none() | seconds
pids = st.none() | st.integers(min_value=1, max_value=4_000_000)
env = st.dictionaries(text, text, max_size=3)
small_json = st.recursive(st.none() | st.booleans() | st.integers(-9, 9) | text,
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                          max_leaves=6)
json_object = st.dictionaries(text, small_json, max_size=3)
steps = st.none() | st.sampled_from(list(JournalStep)) | st.just("a_step_of_a_newer_orch")

journals = st.builds(Journal, release=maybe_text, kind=st.sampled_from(["deploy", "night", "rollback"]), step=steps,
                     since=maybe_seconds, finished=st.booleans(), playbook=maybe_text,
                     controller=st.none() | json_object, builds_dir=maybe_text, previous_build=maybe_text,
                     drift=st.none() | words)
locks = st.builds(Lock, user=text, controller=text, controller_id=maybe_text, pid=pids, command=text.filter(bool),
                  started=maybe_seconds, token=maybe_text, helper_pid=pids, helper_alive=st.booleans(),
                  heartbeat_age=seconds, taken=maybe_seconds)
watchdogs = st.builds(WatchdogRecord, release=text.filter(bool), alive=st.booleans(), acts_at=maybe_seconds,
                      pid=pids, armed=st.booleans(), restored=st.booleans())
processes = st.builds(ServerProcess, pid=pids, argv=st.none() | words, cwd=maybe_text, env=env, pgid=pids, sid=pids,
                      starttime=maybe_seconds, found_by=st.none() | st.sampled_from(["pidfile", "port"]),
                      replace_env=st.none() | st.booleans())
release_files = st.builds(ReleaseFile, path=text, n=st.none() | st.integers(0, 99), existed=st.booleans(),
                          mode=st.none() | st.integers(0, 0o7777), uid=pids, gid=pids, sha256_before=maybe_text,
                          sha256_after=maybe_text)
EXTRA_KEYS = st.sampled_from(["vars", "host", "masked_names", "orch_version", "to", "patched"])
manifests = st.builds(
    Manifest, id=text.filter(bool), kind=st.sampled_from(["deploy", "night", "rollback"]),
    seq=st.none() | st.integers(1, 10**6), created=seconds, finished=maybe_seconds, duration=maybe_seconds,
    outcome=maybe_text, error=maybe_text, restored_by=maybe_text, playbook=json_object,
    files=st.lists(release_files, max_size=3), flag_changes=words, server_spec=st.none() | json_object,
    health=st.none() | json_object, server_before=st.none() | processes, server_after=st.none() | processes,
    drift_kept=st.lists(json_object, max_size=2), probe=st.none() | json_object, builds_dir=maybe_text,
    restarted=st.booleans(), link=st.none() | json_object, undid=words, undone_by=maybe_text,
    source=st.none() | json_object, timings=st.none() | st.dictionaries(text, seconds, max_size=3),
    gate=st.none() | json_object, extra=st.dictionaries(EXTRA_KEYS, small_json, max_size=3))
host_records = st.builds(HostRecords, root=text, exists=st.booleans(), journal=st.none() | journals,
                         state=st.builds(AppliedState, words), lock=st.none() | locks,
                         releases=st.lists(manifests, max_size=3), watchdog=st.none() | watchdogs,
                         host_time=maybe_seconds)
starts = st.builds(ServerStart, argv=words, cwd=maybe_text, env=env, replace_env=st.booleans())


@st.composite
def server_targets(draw: Any) -> ServerTarget:
    """A target as the controller writes them: a ``commands`` server has commands, not a start."""
    commands = draw(st.booleans())
    before_pid = draw(pids)
    return ServerTarget(
        manager="commands" if commands else "process", start=None if commands else draw(st.none() | starts),
        pidfile=draw(maybe_text), log=draw(maybe_text), port=draw(st.none() | st.integers(1, 65535)),
        stop_timeout=draw(seconds), free_timeout=draw(seconds), before_pid=before_pid,
        before_starttime=draw(maybe_seconds) if before_pid else None,
        stop_cmd=draw(words) if commands else None, start_cmd=draw(words) if commands else None,
        pid_cmd=draw(st.none() | words) if commands else None, after_healthy=draw(st.none() | words),
        hook_timeout=draw(seconds))


plans = st.builds(RestorePlan,
                  files=st.lists(st.builds(FileState, path=text, source=maybe_text, sha256=maybe_text,
                                           mode=st.none() | st.integers(0, 0o7777), uid=pids, gid=pids,
                                           expect=maybe_text, n=st.none() | st.integers(0, 9)), max_size=3),
                  links=st.lists(st.builds(LinkState, path=text, target=maybe_text, expect=maybe_text), max_size=2),
                  server=st.none() | server_targets(), health=st.none() | json_object, always=st.booleans(),
                  on_success=st.lists(json_object, max_size=2))
specs = st.builds(RestoreSpec, release=text, kind=st.sampled_from(["deploy", "night", "rollback"]), plan=plans,
                  budget=maybe_seconds, started=st.none() | json_object,
                  mask=st.lists(text, max_size=3, unique=True).map(sorted))
outcomes = st.builds(FileOutcome, path=text, action=st.sampled_from(["unchanged", "restored", "removed", "left"]),
                     drift=maybe_text, earlier=maybe_text, refused=st.lists(text, max_size=2).map(tuple))
restore_records = st.builds(
    RestoreRecord, by=st.sampled_from(["controller", "watchdog", "rollback"]), ok=st.booleans(),
    completed=st.booleans(), error=maybe_text, error_kind=maybe_text, files=st.lists(outcomes, max_size=3),
    links=st.lists(json_object, max_size=2), server=st.none() | json_object, health=st.none() | json_object,
    record_errors=words, already=st.booleans(), log_tail=words, listening=st.none() | json_object,
    committed=st.none() | st.booleans())


# ---------------------------------------------------------------- round trips

ROUND_TRIPS = [
    (journals, Journal.from_wire), (locks, Lock.from_wire), (watchdogs, WatchdogRecord.from_wire),
    (st.builds(AppliedState, words), AppliedState.from_wire), (processes, ServerProcess.from_wire),
    (release_files, ReleaseFile.from_wire),
    (st.builds(ServerSpec, manager=st.sampled_from(["process", "commands"]), pidfile=maybe_text, log=maybe_text,
               port=st.none() | st.integers(1, 65535), stop_timeout=maybe_seconds), ServerSpec.from_wire),
    (manifests, Manifest.from_wire), (host_records, HostRecords.from_wire),
    (starts, ServerStart.from_wire), (server_targets(), ServerTarget.from_wire), (plans, RestorePlan.from_wire),
    (specs, RestoreSpec.from_wire), (outcomes, FileOutcome.from_wire), (restore_records, RestoreRecord.from_wire),
]


@pytest.mark.parametrize(("records", "from_wire"), ROUND_TRIPS, ids=lambda v: getattr(v, "__qualname__", ""))
def test_every_record_round_trips_through_its_wire_form(records: Any, from_wire: Any) -> None:
    @settings(max_examples=60, deadline=None)
    @given(records)
    def round_trip(record: Any) -> None:
        assert from_wire(record.to_wire()) == record

    round_trip()


def test_records_are_written_in_the_format_this_version_reads() -> None:
    assert Journal("R").to_wire()["format"] == 1
    assert Manifest("R").to_wire()["format"] == 1
    assert RestoreSpec("R", "deploy", RestorePlan()).to_wire()["version"] == 3  # the historic field stays


# ---------------------------------------------------------------- records of earlier versions


def test_records_of_earlier_versions_read_with_their_documented_defaults() -> None:
    journal = Journal.from_wire({"release": "R1", "step": "committed"})
    assert journal == Journal("R1", "deploy", JournalStep.COMMITTED, None, False)
    lock = Lock.from_wire({"user": "ann", "controller": "lap", "pid": 42})  # before heartbeats and tokens
    assert lock is not None and (lock.command, lock.token, lock.helper_alive, lock.heartbeat_age) == (
        "a run", None, False, 0.0)
    assert lock.since == 0.0 and lock.who == "ann@lap"
    old = Manifest.from_wire({"id": "20260101T000000000-aaaa", "outcome": "deployed", "playbook": "p.yaml",
                              "files": [{"path": "/a.py", "n": 0, "sha256_before": "x", "sha256_after": "y"}]})
    assert (old.kind, old.seq, old.created, old.flag_changes, old.server_before) == ("deploy", None, 0.0, [], None)
    assert old.order == (0, 0, "20260101T000000000-aaaa")  # before any numbered release
    assert old.playbook_name == "p.yaml" and old.files[0].existed is True and old.files[0].mode is None
    assert old.process_server is None and old.health_checks == [] and old.recorded_probes == []
    spec = Manifest.from_wire({"id": "b", "server_spec": {"pidfile": "/p", "port": 30000}})  # before "manager"
    assert spec.process_server == ServerSpec("process", "/p", None, 30000, None)
    assert AppliedState.from_wire(None).applied == [] and AppliedState.from_wire({}).current is None
    state = HostRecords.from_wire({"root": "/s", "state": {"applied": ["a"]}, "releases": [{"id": "a"}]})
    assert (state.exists, state.journal, state.lock, state.watchdog, state.host_time) == (True, None, None, None, None)
    assert state.current is not None and state.current.id == "a"
    record = RestoreRecord.from_wire({"ok": True, "files": [{"path": "/a.py"}]})
    assert (record.by, record.completed, record.committed, record.files[0].action) == ("?", False, None, "?")
    spec = RestoreSpec.from_wire({"release": "R", "plan": {"server": {"start": {"argv": ["x"]}}}})
    assert spec.plan.server is not None and spec.plan.server.manager == "process"
    assert spec.plan.server.start == ServerStart(["x"]) and spec.plan.server.stop_timeout == 30.0
    assert WatchdogRecord.from_wire({"release": "R", "pid": 9}) == WatchdogRecord("R", pid=9)
    assert WatchdogRecord.from_wire({"release": None}) is None


def test_a_step_written_by_a_newer_orch_is_kept_as_its_word() -> None:
    journal = Journal.from_wire({"release": "R", "step": "draining"})
    assert journal is not None and journal.step == "draining" and not isinstance(journal.step, JournalStep)


# ---------------------------------------------------------------- unknown fields


def test_unknown_fields_are_ignored_and_a_manifest_keeps_them_for_its_rewrite() -> None:
    base = {"release": "R", "kind": "night", "step": "armed", "time": 5.0}
    assert Journal.from_wire({**base, "written_by": "orch 9", "quorum": [1, 2]}) == Journal.from_wire(base)
    assert Lock.from_wire({"user": "a", "shiny": True}) == Lock.from_wire({"user": "a"})
    assert ServerProcess.from_wire({"pid": 3, "cgroup": "/x"}) == ServerProcess(pid=3)
    record = RestoreRecord.from_wire({"by": "watchdog", "ok": True, "new_field": 1})
    assert record == RestoreRecord.from_wire({"by": "watchdog", "ok": True})
    manifest = Manifest.from_wire({"id": "R", "vars": {"tp": 2}, "a_newer_field": [1]})
    assert manifest.extra == {"vars": {"tp": 2}, "a_newer_field": [1]}
    assert manifest.to_wire()["a_newer_field"] == [1]


# ---------------------------------------------------------------- an unknown format


UNKNOWN_FORMAT = [
    ("journal.json", lambda f: Journal.from_wire({"release": "R", "format": f})),
    ("lock.json", lambda f: Lock.from_wire({"user": "a", "format": f})),
    ("state.json", lambda f: AppliedState.from_wire({"applied": [], "format": f})),
    ("watchdog", lambda f: WatchdogRecord.from_wire({"release": "R", "format": f})),
    ("server process", lambda f: ServerProcess.from_wire({"pid": 1, "format": f})),
    ("manifest.json", lambda f: Manifest.from_wire({"id": "R", "format": f})),
    ("restore.json", lambda f: RestoreSpec.from_wire({"release": "R", "format": f})),
    ("restored.json", lambda f: RestoreRecord.from_wire({"ok": True, "format": f})),
]


@pytest.mark.parametrize(("name", "read"), UNKNOWN_FORMAT, ids=[n for n, _ in UNKNOWN_FORMAT])
@pytest.mark.parametrize("version", [2, 0, "1", True])
def test_an_unknown_format_is_refused_in_one_line_naming_the_record(name: str, read: Any, version: Any) -> None:
    with pytest.raises(UnknownRecordFormat) as refused:
        read(version)
    message = str(refused.value)
    assert message.startswith(f"{name}: record format {version!r} ")
    assert "\n" not in message and refused.value.record == name


def test_format_1_and_an_absent_format_read_alike() -> None:
    assert Journal.from_wire({"release": "R", "format": 1}) == Journal.from_wire({"release": "R"})


def test_at_the_boundary_an_unknown_format_is_an_orch_refusal_not_a_malformed_reply() -> None:
    answer = {"root": "/s", "exists": True, "state": {"applied": []}, "releases": [{"id": "R", "format": 7}],
              "journal": None, "lock": None}
    with pytest.raises(RecordFormatError) as refused:
        ops.state_read("/s").read(answer)
    assert isinstance(refused.value, RefusedError) and error_exit_code(refused.value) == 2
    assert str(refused.value).startswith("manifest.json: record format 7 ")
    good = ops.state_read("/s").read({**answer, "releases": [{"id": "R"}]})
    assert isinstance(good, HostRecords) and good.releases[0].id == "R"
    opened = ops.open_state("/s", {"user": "a"}).read(
        {"root": "/s", "lock": {"acquired": False, "holder": {"user": "bob", "controller": "c", "pid": 4}},
         "state": {"root": "/s", "state": {"applied": []}, "releases": []}})
    assert opened.lock is not None and not opened.lock.acquired
    assert opened.lock.holder is not None and opened.lock.holder.who == "bob@c"


# ---------------------------------------------------------------- the state dir's paths, the steps


def test_state_paths_are_built_in_one_place() -> None:
    paths = StatePaths("/home/u/.orch")
    assert (paths.lock, paths.journal, paths.state) == (
        "/home/u/.orch/lock.json", "/home/u/.orch/journal.json", "/home/u/.orch/state.json")
    assert paths.release("R") == "/home/u/.orch/releases/R"
    assert paths.restore("R") == "/home/u/.orch/releases/R/restore.json"
    assert paths.copy("R", 3, "before") == "/home/u/.orch/releases/R/files/3.before"
    assert paths.server_touched("R") == "/home/u/.orch/releases/R/server.touched"


def test_the_helper_writes_its_steps_from_the_step_enum() -> None:
    """The helper names every step it writes by ``JournalStep`` (a step written as a word
    anywhere in orchestrator/host is reported by tests/test_outcome_literals.py's scan)."""
    from orchestrator.host import restore_records

    steps = restore_records.JOURNAL_STEP_BY
    assert steps and all(type(s) is JournalStep for s in steps.values())
    assert f"{JournalStep.ROLLED_BACK}" == "rolled_back"  # the word in f-strings on every Python


# ---------------------------------------------------------------- the host package's rules


@pytest.mark.parametrize("module", sorted(HOST.glob("*.py")), ids=lambda p: p.name)
def test_host_modules_are_python_38_and_standard_library_only(module: Path) -> None:
    source = module.read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    assert len(source.splitlines()) <= 600
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            assert top in sys.stdlib_module_names or name.startswith("orchestrator.host"), (module.name, name)


# ---------------------------------------------------------------- end to end: a newer orch's state dir


def test_a_state_dir_written_in_an_unknown_format_is_refused_by_name_and_left_as_is(sandbox: Sandbox) -> None:
    """The real CLI over sshd: ``status``, ``history`` and ``rollback`` refuse a journal a newer
    orch wrote (format 9), exit 2, one line naming the record and the version; nothing changes."""
    sandbox.state_dir.mkdir(parents=True)
    journal = sandbox.state_dir / "journal.json"
    journal.write_text(json.dumps({"format": 9, "release": "R", "kind": "deploy", "step": "committed",
                                   "finished": False, "time": 1.0}))
    (sandbox.state_dir / "state.json").write_text(json.dumps({"applied": []}))
    before = journal.read_bytes()
    for command in ("status", "history", "rollback"):
        proc = sandbox.orch(command, "--host", "gpu")
        said = [line for line in (proc.stdout + proc.stderr).splitlines() if "record format" in line]
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert len(said) == 1 and "journal.json: record format 9 is not one this orch reads" in said[0], said
    assert journal.read_bytes() == before
    assert not (sandbox.state_dir / "lock.json").exists()  # the refusing run gave its lock back
