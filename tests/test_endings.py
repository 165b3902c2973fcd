"""A run's ending is typed fields; the CLI alone makes its sentence (issue 18).

Unit tests of ``core.endings`` and their words in ``cli.words``: every ending has
words of its own, the words are the sentences the pipeline composed before
(byte for byte: tests over real sshd pin them, and people grep them), the fields
go to ``--json`` as ``ending``, and no string in ``orchestrator/pipeline`` but a
docstring composes a final sentence any more. The end-to-end ``ending`` fields
are asserted by tests/test_runner.py, tests/test_replies_malformed.py and
tests/test_rollback_runner.py.
"""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import pytest

from orchestrator.cli import words
from orchestrator.core import endings, events
from orchestrator.host.values import fields
from orchestrator.pipeline.fleet import undone_report
from orchestrator.pipeline.report import HostReport, not_started
from orchestrator.pipeline.session import at
from tests.fixtures.accounts import account

ROOT = Path(__file__).resolve().parents[1]
ENDING_TYPES = [c for _, c in inspect.getmembers(endings, inspect.isclass)
                if issubclass(c, endings.Ending) and c is not endings.Ending]
T = 1_700_000_000.0
U = 1_700_000_090.0
DIR = "/var/lib/orch/releases/R1"
LOST = "gpu: the connection was lost (ssh exited with 255)"

# Each ending with the sentence the pipeline composed for it before (its f-strings, filled in).
SAID: list[tuple[endings.Ending, str]] = [
    (endings.StoppedFollowing("gpu", "R1", "deploy", "SIGTERM"),
     "SIGTERM: orch stopped following release R1, which its runner on the host finishes; "
     "`orch status --follow --host gpu` gives the verdict"),
    (endings.StoppedFollowing("gpu", "R1", "deploy", None, reconnecting=True),
     "interrupted (Ctrl-C) while reaching the host again: orch stopped following release R1, which its runner "
     "on the host finishes; `orch status --follow --host gpu` gives the verdict"),
    (endings.StoppedFollowing("gpu", "R1", "deploy"),
     "interrupted again: orch stopped following release R1, which its runner on the host still finishes "
     "(aborting it); `orch status --follow --host gpu` gives the verdict"),
    (endings.StoppedFollowing("gpu", "N1", "night", "SIGHUP"),
     "SIGHUP: orch stopped following night N1, which its runner on the host finishes; "
     "`orch status --follow --host gpu` gives the verdict"),
    (endings.StoppedFollowing("gpu", "N1", "night", None, reconnecting=True),
     "interrupted (Ctrl-C) while reaching the host again: orch stopped following night N1, which its runner "
     "on the host finishes; `orch status --follow --host gpu` gives the verdict"),
    (endings.StoppedFollowing("gpu", "N1", "night"),
     "interrupted again: orch stopped following night N1, which its runner on the host still finishes "
     "(switching it back); `orch status --follow --host gpu` gives the verdict"),
    (endings.StoppedFollowing("gpu", "R2", "rollback", "SIGTERM"),
     "SIGTERM: orch stopped following rollback R2, which its runner on the host finishes; "
     "`orch status --follow --host gpu` gives the verdict"),
    (endings.StoppedFollowing("gpu", "R2", "rollback", None, reconnecting=True),
     "interrupted (Ctrl-C) while reaching the host again: orch stopped following rollback R2, which its "
     "runner on the host finishes; `orch status --follow --host gpu` gives the verdict"),
    (endings.StoppedFollowing("gpu", "R2", "rollback"),
     "interrupted (Ctrl-C): orch stopped following rollback R2, which its runner on the host finishes; "
     "`orch status --follow --host gpu` gives the verdict"),
    (endings.FollowInterrupted("R1"), "stopped following release R1; its runner still finishes it"),
    (endings.LostAfterCommit("gpu", "R1", LOST, T),
     f"{LOST} after the commit of release R1; the host finishes it by itself (its runner confirms or restores "
     f"it; the backstop restores it at {at(T)} at the latest); `orch status --follow --host gpu` gives the verdict"),
    (endings.LostAfterCommit("gpu", "N1", LOST, T, "night"),
     f"{LOST} during night N1; the host finishes it by itself (its runner confirms it or switches it back; the "
     f"backstop switches it back at {at(T)} at the latest); `orch status --follow --host gpu` gives the verdict"),
    (endings.LostAfterCommit("gpu", "R2", LOST, None, "rollback"),
     f"{LOST} after the rollback R2 was handed on; the host finishes it by itself; "
     "`orch status --follow --host gpu` gives the verdict"),
    (endings.LostDuringRestore("gpu", "R1", "health timed out", LOST, U),
     f"health timed out; the restore of release R1 was under way on the host when the link dropped: the host "
     f"finishes it by itself, and the watchdog backs it up at {at(U)}; run `orch status --host gpu` to see"),
    (endings.LostDuringRestore("gpu", "N1", "health timed out", LOST, U, "night"),
     f"health timed out; {LOST}: the switch back of night N1 was under way on the host when the link dropped: "
     f"the host finishes it by itself, and the backstop backs it up at {at(U)}; run `orch status --host gpu` "
     "to see"),
    (endings.LostBeforeCommit("gpu", "R1", LOST, T),
     f"{LOST}; nothing on the host was changed. The watchdog closes release R1 at {at(T)}, or "
     "`orch rollback --host gpu` does it now"),
    (endings.LostBeforeChange(LOST), f"{LOST}; nothing on the host was changed"),
    (endings.LostBeforeChange(LOST, "night"), f"{LOST}; nothing live was touched"),
    (endings.InterruptedBeforeChange(), "interrupted (Ctrl-C) before anything changed"),
    (endings.InterruptedBeforeChange("night"), "interrupted (Ctrl-C) before anything changed"),
    (endings.InterruptedBeforeChange(signame="SIGTERM"), "stopped by SIGTERM before anything changed"),
    (endings.InterruptedBeforeChange("night", "SIGHUP"), "stopped by SIGHUP before anything changed"),
    (endings.FollowedAgainInVain("R1", "before batch 2", "gpu: unreachable",
                                 endings.LostAfterCommit("gpu", "R1", LOST, T)),
     f"{LOST} after the commit of release R1; the host finishes it by itself (its runner confirms or restores "
     f"it; the backstop restores it at {at(T)} at the latest); `orch status --follow --host gpu` gives the "
     "verdict; followed again before batch 2, in vain: gpu: unreachable"),
    (endings.InterruptedDuringRestore("gpu", "R1", U),
     "gpu: interrupted again during the rollback of R1: orch stopped waiting and the restore on the host "
     f"stopped where it was. The watchdog finishes it at {at(U)}; or run `orch rollback --host gpu` now"),
    (endings.InterruptedDuringRestore("gpu", "N1", U, "night"),
     "gpu: interrupted again during the switch back of night N1: orch stopped waiting and the restore on the "
     f"host stopped where it was. The backstop finishes it at {at(U)}; or run `orch rollback --host gpu` now"),
    (endings.RestoreCouldNotRun("gpu", "R1", "health timed out", "no such file", DIR, U),
     f"gpu: deploy failed (health timed out) and its restore could not run: no such file. Backups are in {DIR}; "
     f"the watchdog restores at {at(U)}; run `orch status --host gpu`"),
    (endings.RestoreCouldNotRun("gpu", "N1", "health timed out", "no such file", DIR, U, "night"),
     "gpu: night N1 failed (health timed out) and its switch back could not run: no such file. The backstop "
     f"switches back at {at(U)}; run `orch status --host gpu`"),
    (endings.Restored("gpu", "R1", "gpu: not healthy after 20 s", account("a.py"), "runner",
                      "health", "health"),
     "gpu: not healthy after 20 s"),
    (endings.RestoreFailed("gpu", "R1", "health timed out", account("a.py", error="the server did not start"), DIR),
     "health timed out; and the ROLLBACK FAILED: files restored: a.py; FAILED: the server did not start. The host is not known "
     f"to be healthy; backups are in {DIR}; fix the cause and run `orch rollback --host gpu`"),
    (endings.RestoreFailed("gpu", "N1", "health timed out", account(error="the server did not start"), DIR, "night"),
     "health timed out; and the SWITCH BACK FAILED: no file to restore; FAILED: the server did not start. The host is not known to be "
     f"healthy; its restore plan is {DIR}/restore.json; fix the cause and run `orch rollback --host gpu`"),
    (endings.RunnerCouldNotRestore("gpu", "R1", "health timed out", "disk full", DIR),
     f"gpu: deploy failed (health timed out) and the host's runner could not restore it: disk full. Backups "
     f"are in {DIR}; run `orch rollback --host gpu`"),
    (endings.RunnerCouldNotRestore("gpu", "N1", "health timed out", "disk full", DIR, "night"),
     "gpu: night N1 failed (health timed out) and the host's runner could not switch it back: disk full; its "
     f"restore plan is {DIR}/restore.json; run `orch rollback --host gpu`"),
    (endings.RestoringWithoutRecord("gpu", "R1"),
     "gpu: the watchdog's deadline passed before the deploy could confirm; the watchdog is restoring release "
     "R1 but left no record; run `orch status --host gpu`"),
    (endings.RestoringWithoutRecord("gpu", "N1", "night"),
     "gpu: the backstop's deadline passed before the night could confirm; night N1 is being switched back but "
     "left no record; run `orch status --host gpu`"),
    (endings.RollbackFailed("gpu", "R2", "undid", ("R1",), "R0", None, account(error="the server did not start")),
     "gpu: rolled back R1; current release: R0 FAILED: no file to restore; FAILED: the server did not start. The host is not known to be "
     "healthy; fix the cause and run `orch rollback --host gpu` again"),
    (endings.RollbackFailed("gpu", "R3", "undid", ("R2", "R1"), None, None, account("/a", error="no space")),
     "gpu: rolled back R2, R1; current release: none (the state before any release) FAILED: files restored: /a; "
     "FAILED: no space. The host is not known to be healthy; fix the cause and run `orch rollback --host gpu` again"),
    (endings.RollbackFailed("gpu", "R2", "restored_before", ("R2",), None, None, account("/a", written=("/a",))),
     "gpu: restored the state before R2 FAILED: written by the commit before it failed: /a; files restored: /a. The host is not known to be "
     "healthy; fix the cause and run `orch rollback --host gpu` again"),
    (endings.RollbackLeftNoRecord("gpu", "R2", "failed"),
     "gpu: the rollback R2 ended without a restore record (failed); run `orch status --host gpu`"),
    (endings.RunnerFailed("R1", "restored", "health timed out"), "health timed out"),
    (endings.UndoneWithBatch("R1", "R2", account("/a")),
     "rolled back with its failed batch (--rollback-all-on-failure): files restored: /a"),
    (endings.UndoneWithBatch("R1", "R2", None), "rolled back with its failed batch (--rollback-all-on-failure): restored"),
    (endings.NotUndoneWithBatch("R1", "gpu: unreachable"),
     "its batch failed and --rollback-all-on-failure could not roll it back: gpu: unreachable"),
    (endings.NotStarted("batch 1 of 3 failed"), "not started: batch 1 of 3 failed"),
]


def test_every_ending_has_words_of_its_own_and_is_a_warning() -> None:
    assert len(ENDING_TYPES) >= 15
    fallback = words.line.dispatch(events.Event)
    without = [c.__name__ for c in ENDING_TYPES if words.line.dispatch(c) is fallback]
    assert without == [], f"endings said by the fallback (events.plain): {without}"
    assert {c.level for c in ENDING_TYPES} == {"warning"}
    assert {type(e) for e, _ in SAID} == set(ENDING_TYPES), "an ending without its sentence pinned here"


IDS = [f"{type(e).__name__}-{i}" for i, (e, _) in enumerate(SAID)]


@pytest.mark.parametrize(("ending", "sentence"), SAID, ids=IDS)
def test_the_words_are_the_sentences_the_pipeline_composed(ending: endings.Ending, sentence: str) -> None:
    assert words.line(ending) == sentence


@pytest.mark.parametrize("ending", [e for e, _ in SAID], ids=IDS)
def test_the_wire_carries_every_field(ending: endings.Ending) -> None:
    wire = json.loads(json.dumps(ending.to_wire()))
    assert wire["event"] == ending.kind() and wire["level"] == "warning"
    as_json = json.loads(json.dumps(ending.to_json()))
    assert as_json["kind"] == ending.kind()
    for f in fields(ending):
        value = getattr(ending, f.name)
        expected = value.to_json() if hasattr(value, "to_json") else value
        expected = list(expected) if isinstance(expected, tuple) else expected  # JSON has lists
        assert wire[f.name] == expected and as_json[f.name] == expected, f.name
    assert set(as_json) == {"kind", *(f.name for f in fields(ending))}


def test_kinds_are_snake_case_names_of_what_happened() -> None:
    assert endings.LostAfterCommit.kind() == "lost_after_commit"
    assert endings.RestoreFailed.kind() == "restore_failed"
    assert endings.NotStarted.kind() == "not_started"
    assert len({c.kind() for c in ENDING_TYPES}) == len(ENDING_TYPES)


def test_a_report_carries_its_ending_as_fields_and_its_words_as_the_error() -> None:
    report = not_started("gpu", "batch 1 of 2 failed", words.line)
    data = report.to_json()
    assert data["error"] == "not started: batch 1 of 2 failed"
    assert data["ending"] == {"kind": "not_started", "why": "batch 1 of 2 failed"}
    assert HostReport("gpu", "changed", 0).to_json()["ending"] is None  # type: ignore[arg-type]
    # without a CLI the words are the fields (``events.plain``), never empty
    assert not_started("gpu", "x").error == "not_started(why='x')"


def test_a_host_undone_with_its_batch_says_so_in_words_and_fields() -> None:
    deployed = HostReport("h1", "changed", 0, release="r-h1")  # type: ignore[arg-type]
    undo = HostReport("h1", "rolled_back", 0, release="u-h1", extra={"restore": account("/a")})  # type: ignore[arg-type]
    report = undone_report(deployed, undo, words.line)
    assert report.error == "rolled back with its failed batch (--rollback-all-on-failure): files restored: /a"
    ending = report.to_json()["ending"]
    assert (ending["kind"], ending["release"], ending["undone_by"]) == ("undone_with_batch", "r-h1", "u-h1")
    # what the rollback did, as the host's record's fields
    assert ending["done"]["files"] == [{"path": "/a", "action": "restored", "drift": None, "earlier": None,
                                        "refused": []}]
    assert ending["done"]["ok"] is True and ending["done"]["planned"] == []
    json.dumps(report.to_json())


def test_core_endings_is_pure() -> None:
    tree = ast.parse((ROOT / "orchestrator" / "core" / "endings.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    # host.values: the value classes (standard library, no I/O), as the host's records use
    assert imported <= {"__future__", "typing", "orchestrator.core.events", "orchestrator.host.values"}, imported


FINAL_WORDS = ("orch status --", "orch rollback --host", "gives the verdict")


def docstrings(tree: ast.AST) -> set[int]:
    """The ``id`` of every docstring's node: the first string of a module, class or function."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def final_sentences(pipeline: Path) -> list[str]:
    """``file:line: text`` of every string constant (f-strings' parts included) outside docstrings
    that says a run's final sentence: where the pipeline still composes English for the CLI."""
    found = []
    for path in sorted(pipeline.glob("*.py")):
        tree = ast.parse(path.read_text())
        skip = docstrings(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
                    and any(w in node.value for w in FINAL_WORDS)):
                found.append(f"{path.name}:{node.lineno}: {node.value}")
    return found


def test_the_pipeline_composes_no_final_sentence() -> None:
    assert final_sentences(ROOT / "orchestrator" / "pipeline") == []


def test_an_interruption_is_named_by_what_sent_it() -> None:
    """A Ctrl-C is a person's; SIGTERM and SIGHUP come from a service manager, ``timeout`` or a
    closed SSH session, and a run that got one says so, not "Ctrl-C"."""
    from orchestrator.cli.fleet import stopping_line
    from orchestrator.errors import Hangup, InterruptedTwice, Terminated, interruption

    assert interruption(KeyboardInterrupt()) == interruption(InterruptedTwice()) == "interrupted (Ctrl-C)"
    assert interruption(Terminated()) == "stopped by SIGTERM"
    assert interruption(Hangup) == "stopped by SIGHUP"  # a fleet passes the kind, not an instance
    assert stopping_line(KeyboardInterrupt).endswith("a committed one restored); Ctrl-C again to stop waiting")
    # after the commit a SIGTERM aborts nothing (docs/CLI.md, "Signals"): no promise of a restore
    said = stopping_line(Terminated)
    assert said.startswith("stopped by SIGTERM: stopping the hosts at work") and "restored" not in said
    assert "a committed one is finished by its host" in said
