"""The pipeline reports typed events; the CLI alone turns them into words (issue 18, item 2).

Unit tests of ``core.events`` and ``cli.words``: every event has its own words at
its own level, the words are today's (byte for byte: scripts and people grep
them), the fields go to ``--json`` as they are, ``RunLog`` writes ``run.log`` in
the CLI's words, and the pipeline composes no step/note/warning line itself.
The end-to-end lines are pinned by tests/test_cli_words.py, tests/test_progress.py
and the deploy, night and rollback tests, over real sshd.
"""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import words
from orchestrator.core import events
from orchestrator.core.secrets import Masker
from orchestrator.pipeline.events import Recorder, RunLog
from orchestrator.pipeline.session import ConnectOptions, at
from tests.fixtures.accounts import account

ROOT = Path(__file__).resolve().parents[1]
EVENT_TYPES = [c for _, c in inspect.getmembers(events, inspect.isclass)
               if issubclass(c, events.Event) and c is not events.Event]
DEADLINE = 1_700_000_000.0


def test_every_event_has_its_own_words_and_a_level() -> None:
    assert len(EVENT_TYPES) > 40
    fallback = words.line.dispatch(events.Event)
    without = [c.__name__ for c in EVENT_TYPES if words.line.dispatch(c) is fallback]
    assert without == [], f"events said by the fallback: {without}"
    assert {c.level for c in EVENT_TYPES} == {"step", "note", "warning"}


# Each line as the pipeline wrote it before events (the f-strings of deploy, nightly,
# rollback and locking), against the event that now stands for it.
TODAY: list[tuple[events.Event, str]] = [
    (events.BackedUp(2, "r1", DEADLINE),
     f"backed up 2 file(s) into release r1; the watchdog restores it at {at(DEADLINE)} unless confirmed"),
    (events.BackedUp(2, "r1", DEADLINE, runner=True),
     f"backed up 2 file(s) into release r1; from the commit on the host carries it to its verdict by itself "
     f"(backstop {at(DEADLINE)})"),
    (events.InterruptedAfterConfirm("r1"), "Ctrl-C came after the confirm: release r1 stays current"),
    (events.Committed(3), "committed 3 file(s)"),
    (events.PreflightAccepted(), "pre-flight: the server's parser accepts the new command line"),
    (events.GateBaseline(("chat", "long")), "gate: probing the running server before the stop (chat, long)"),
    (events.GateReprobe(("chat",)), "gate: inconclusive (within the spread), probing again: chat"),
    (events.Restarting(("python3", "-m", "srv", "--port", "1")), "restarting the server: python3 -m srv --port 1"),
    (events.Healthy(1.234, 3), "healthy after 1.2 s (3 polls)"),
    (events.Healthy(1.25, 4, 2.0), "healthy after 1.2 s (4 polls), stable for 2 s"),
    (events.ReleaseCurrent("r1"), "release r1 is current"),
    (events.ManyInEffect(5, 3), "5 releases are in effect, more than keep_releases 3: none of them is pruned, "
                                "each is a step of `orch rollback`"),
    (events.DeployFailed("health timed out", rolling_back=True), "deploy failed: health timed out; rolling back"),
    (events.DeployFailed("refused", rolling_back=False),
     "deploy failed: refused; closing the release (nothing was changed)"),
    (events.RolledBack("controller", account("a.py")), "rolled back: files restored: a.py"),
    (events.RolledBack("watchdog", account("a.py")), "rolled back (by the watchdog): files restored: a.py"),
    (events.ReleaseClosed("r1"), "release r1 closed: nothing on the host was changed"),
    (events.DriftKept("/a.py", "/r/1.drift"),
     "/a.py had changed on the host during the deploy: that content is kept in /r/1.drift"),
    (events.DriftKept("/a.py", "/r/1.drift", during_deploy=False),
     "/a.py had changed on the host (drift): that content is kept in /r/1.drift"),
    (events.RestoreNotRecorded("disk full"), "the host could not record the restore: disk full"),
    (events.RestoreNotRecorded("disk full", switch_back=True), "the host could not record the switch back: disk full"),
    (events.AlreadyAsPlanned(), "unchanged: files and server command line already as planned"),
    (events.Staged(2), "staged 2 file(s) beside their targets; validated"),
    (events.CheckUnchanged(), "unchanged: nothing to do"),
    (events.CheckValidated(), "validated on the host; nothing was changed (--check)"),
    (events.CheckValidated(would_refuse=True),
     "validated on the host; nothing was changed (--check), but a deploy would refuse"),
    (events.NightArmed(DEADLINE), f"armed: the watchdog switches back at {at(DEADLINE)} unless the night is confirmed"),
    (events.Switching(41, "n1", ("srv", "-x")), "switching: stop the old server (pid 41), current -> n1, start srv -x"),
    (events.Switching(None, "n1", ("srv",)), "switching: current -> n1, start srv"),
    (events.Probed("/v1/chat", 12.5, None, 80, 120, 0, "abcdef0123456789"),
     "probe /v1/chat: 12.5 req/s, ? tok/s, p50 80 ms, p99 120 ms, 0 error(s), greedy abcdef012345"),
    (events.BuildsPruned(("a", "b")), "pruned 2 old build(s): a, b"),
    (events.NightFailed("boom", switching_back=False), "night failed: boom; closing the release (nothing live was touched)"),
    (events.HistoryUnread("gpu: unreachable"),
     "report: the host's history could not be read (gpu: unreachable); the page words nights from their records"),
    (events.LateReportWritten("/r/gpu/n1.json"), "report: /r/gpu/n1.json"),
    (events.StackPatched(0, "p.yml", 2), "stack[0] p.yml: 2 file(s) patched and validated"),
    (events.RollingBack(("r2", "r1"), (("/cur", "b1"), ("/x", None)), restart=True),
     "rolling back r2, r1, switching /cur back to b1, switching /x back to (none) and restarting the previous server"),
    (events.FinishingUnfinished("deploy", "r1", "committed"), "finishing the unfinished deploy r1 (last step: committed)"),
    (events.StaleLockBroken("alice@ctl pid 7", 912.4), "breaking the stale lock of alice@ctl pid 7 (no heartbeat for 912 s)"),
    # a rollback's restore: what it was is fields (issue 18), its words are these
    (events.RestoreDone("undid", ("r3", "r2"), "r1", None, account("/a")),
     "rolled back r3, r2; current release: r1: files restored: /a"),
    (events.RestoreDone("undid", ("r1",), None, None, account("/a")),
     "rolled back r1; current release: none (the state before any release): files restored: /a"),
    (events.RestoreDone("finished", ("r4",), None, "rollback", account("/a")), "finished: files restored: /a"),
    (events.RestoreDone("restored_before", ("r2",), None, "rollback", account("/a")),
     "restored the state before r2: files restored: /a"),
    (events.RestoreDone("already_restored", ("r2",), None, "guard", account(planned=("/a",))),
     "r2 had already been restored by the guard: NOT restored: /a"),
]


@pytest.mark.parametrize(("event", "said"), TODAY, ids=lambda x: type(x).__name__ if isinstance(x, events.Event) else "")
def test_the_words_are_todays(event: events.Event, said: str) -> None:
    assert words.line(event) == said


def test_the_fields_go_to_json_as_they_are() -> None:
    wire = events.BackedUp(2, "r1", DEADLINE).to_wire()
    assert wire == {"event": "backed_up", "level": "step", "files": 2, "release": "r1", "deadline": DEADLINE,
                    "runner": False}
    for event, _ in TODAY:
        back = json.loads(json.dumps(event.to_wire()))
        assert back["level"] == event.level and back["event"] == event.kind()
    assert events.DeployFailed("x", True).to_wire()["rolling_back"] is True


class Inner:
    """The inner reporter of a RunLog: what it was handed."""

    def __init__(self) -> None:
        self.got: list[tuple[str, events.Event]] = []

    def event(self, host: str, ev: events.Event) -> None:
        self.got.append((host, ev))


def test_run_log_says_events_in_the_words_it_was_given_at_their_level() -> None:
    inner = Inner()
    log = RunLog(inner, Masker(), words.line)  # type: ignore[arg-type]
    failed = events.DeployFailed("health timed out", rolling_back=True)
    log.event("gpu", events.Committed(1))
    log.event("gpu", failed)
    log.event("gpu", events.PlanNote("uses add_flag"))
    assert inner.got == [("gpu", events.Committed(1)), ("gpu", failed), ("gpu", events.PlanNote("uses add_flag"))]
    kinds = [line.split()[1:] for line in log.text().splitlines()]
    assert kinds[0] == ["step", "committed", "1", "file(s)"]
    assert kinds[1][0] == "warning" and " ".join(kinds[1][1:]) == words.line(failed)
    assert kinds[2] == ["note", "uses", "add_flag"]
    assert log.events == [events.Committed(1), failed, events.PlanNote("uses add_flag")]


def test_without_the_cli_a_run_log_and_a_recorder_still_say_every_field() -> None:
    log = RunLog(Recorder(), Masker())
    log.event("gpu", events.Committed(3))
    assert "committed(files=3)" in log.text()
    rec = Recorder(words=words.line)
    rec.event("gpu", events.StaleLockBroken("bob", 30.0))
    assert rec.events == [("gpu", events.StaleLockBroken("bob", 30.0))]
    assert rec.lines == [("warn", "gpu", "breaking the stale lock of bob (no heartbeat for 30 s)")]
    assert rec.text() == "breaking the stale lock of bob (no heartbeat for 30 s)"


def test_the_cli_hands_its_words_to_the_pipeline() -> None:
    from orchestrator.cli.options import HostFlags

    assert ConnectOptions().words is events.plain
    connect = inspect.getsource(HostFlags.connect)
    assert "words=line" in connect


def calls(path: Path) -> list[tuple[int, str]]:
    """``reporter.step/note/warn(...)`` calls in a module: lines composed outside the CLI."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"step", "note", "warn"}):
            owner: Any = node.func.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name == "reporter":
                found.append((node.lineno, node.func.attr))
    return found


@pytest.mark.parametrize("module", ["deploy", "nightly", "rollback", "locking"])
def test_the_pipeline_composes_no_line_of_its_own(module: str) -> None:
    assert calls(ROOT / "orchestrator" / "pipeline" / f"{module}.py") == []


def test_core_events_is_pure() -> None:
    tree = ast.parse((ROOT / "orchestrator" / "core" / "events.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    # host.values: the value classes (standard library, no I/O), as the host's records use
    assert imported <= {"__future__", "re", "typing", "orchestrator.host.values",
                        "orchestrator.host.restore_plan"}, imported


def test_a_rollbacks_words_are_the_clis_not_the_pipelines() -> None:
    """What a rollback was travels as fields (``RestoreDone``, ``RollbackFailed``); the phrases
    are made in ``cli/words.py`` alone, so none is written in ``pipeline/rollback.py``."""
    source = (ROOT / "orchestrator" / "pipeline" / "rollback.py").read_text()
    for phrase in ("current release:", "had already been restored", "restored the state before", "rolled back {"):
        assert phrase not in source, phrase
    said = words.line(events.RestoreDone("undid", ("r2",), "r1", None, account("/a")))
    assert said == "rolled back r2; current release: r1: files restored: /a"
