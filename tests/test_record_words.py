"""The words the host's records hold are defined once, and what the helper writes parses into them.

``RecordedOutcome`` (a release's ``outcome``) and ``JournalStep`` (the journal's
``step``) are the vocabulary of the host's records. The helper writes their values
(``host/restore.py`` has no word of its own), the controller reads them through
``Manifest``/``Journal``, and ``core.outcomes.Outcome`` takes the words a run's
outcome shares with a record from ``RecordedOutcome``. These tests run the real
helper over the local transport, restore a release with it, and parse the records
it left on disk into their types.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.core.outcomes import Outcome
from orchestrator.host.records import (
    Journal,
    JournalStep,
    Manifest,
    RecordedOutcome,
    UnknownRecordFormat,
)
from orchestrator.host.restore_plan import RestoreRecord
from orchestrator.shell.agent_client import Agent
from tests.test_agent_restore import Release


def records_of(release: Release) -> tuple[RestoreRecord, Manifest, Journal]:
    """The three records a restore leaves, each parsed into its type (as the controller does)."""
    restored = RestoreRecord.from_wire(json.loads((release.dir / "restored.json").read_text()))
    journal = Journal.from_wire(release.journal())
    assert journal is not None
    return restored, Manifest.from_wire(release.manifest()), journal


# ---------------------------------------------------------------- one vocabulary


def test_the_words_a_run_and_a_record_share_are_one_definition() -> None:
    """``failed``, ``rolled_back``, ``rollback_failed`` are both a run's outcome and a record's:
    ``Outcome`` takes them from ``RecordedOutcome``; the record's other words (in progress,
    deployed, done) are never a run's outcome, so neither can be read as the other."""
    shared = {r for r in RecordedOutcome if r.value in {o.value for o in Outcome}}
    assert shared == {RecordedOutcome.FAILED, RecordedOutcome.ROLLED_BACK, RecordedOutcome.ROLLBACK_FAILED}
    for word in shared:
        assert Outcome(word) == word and Outcome(word).value is word.value
    assert {r.value for r in RecordedOutcome} - {r.value for r in shared} == {"in_progress", "deployed", "done"}


@pytest.mark.parametrize("word", list(RecordedOutcome))
def test_every_recorded_outcome_round_trips_through_a_manifest(word: RecordedOutcome) -> None:
    wire = Manifest(id="r1", outcome=word).to_wire()
    assert wire["outcome"] == word.value and type(wire["outcome"]) is str
    assert Manifest.from_wire(json.loads(json.dumps(wire))).outcome is word


def test_a_record_word_a_newer_orch_wrote_is_kept_as_its_word() -> None:
    read = Manifest.from_wire({"id": "r1", "outcome": "paused"})
    assert read.outcome == "paused" and not isinstance(read.outcome, RecordedOutcome)
    assert read.to_wire()["outcome"] == "paused"
    assert Manifest.from_wire({"id": "r1"}).outcome is None


# ---------------------------------------------------------------- what the helper writes


@pytest.mark.parametrize(("by", "step"), [("controller", JournalStep.ROLLED_BACK),
                                          ("watchdog", JournalStep.RESTORED_BY_WATCHDOG),
                                          ("rollback", JournalStep.ROLLED_BACK)])
def test_a_deploy_s_restore_leaves_records_that_parse_with_the_enums(
        local_agent: Agent, tmp_path: Path, by: str, step: JournalStep) -> None:
    target = tmp_path / "model.py"
    release = Release(local_agent, tmp_path / "state")
    release.change(target, b"v = 1\n", b"v = 2\n")
    release.create()
    release.committed()

    local_agent.call("restore_release", release_dir=str(release.dir), by=by, reason="health failed")

    restored, manifest, journal = records_of(release)
    assert restored.ok and restored.by == by and target.read_bytes() == b"v = 1\n"
    assert manifest.outcome is RecordedOutcome.ROLLED_BACK
    assert (manifest.restored_by, manifest.error) == (by, "health failed")
    assert journal.step is step and journal.finished and journal.release == "r1"


def test_a_rollback_s_restore_leaves_done_in_its_records(local_agent: Agent, tmp_path: Path) -> None:
    target = tmp_path / "x.py"
    release = Release(local_agent, tmp_path / "state", rid="rb1", kind="rollback")
    release.change(target, b"x = 1\n", b"x = 2\n")
    release.create(always=True)

    local_agent.call("restore_release", release_dir=str(release.dir), by="rollback")

    restored, manifest, journal = records_of(release)
    assert restored.ok and manifest.outcome is RecordedOutcome.DONE and manifest.restored_by is None
    assert journal.step is JournalStep.DONE and journal.finished


def test_a_failed_restore_leaves_rollback_failed_and_an_open_journal(local_agent: Agent, tmp_path: Path) -> None:
    target = tmp_path / "model.py"
    release = Release(local_agent, tmp_path / "state")
    release.change(target, b"good = 1\n", b"good = 2\n")
    release.create()
    release.committed()
    (release.dir / "files" / "0.before").write_bytes(b"bit rot\n")

    local_agent.call("restore_release", release_dir=str(release.dir), by="controller")

    restored, manifest, journal = records_of(release)
    assert not restored.ok and restored.completed
    assert manifest.outcome is RecordedOutcome.ROLLBACK_FAILED and "is damaged" in manifest.extra["restore_error"]
    assert journal.step is JournalStep.RESTORE_FAILED and not journal.finished


def test_the_restore_sets_its_fields_and_keeps_every_other_one(local_agent: Agent, tmp_path: Path) -> None:
    """The helper updates the records it finishes; fields it does not know (a newer orch's,
    or ones only the controller reads) stay as they were, in the manifest and the journal."""
    target = tmp_path / "model.py"
    release = Release(local_agent, tmp_path / "state")
    release.change(target, b"v = 1\n", b"v = 2\n")
    release.create()
    release.committed()
    manifest = dict(release.manifest(), vars={"k": "v"}, note="kept")
    (release.dir / "manifest.json").write_text(json.dumps(manifest))
    (release.state / "journal.json").write_text(json.dumps(dict(release.journal(), note="kept too")))

    local_agent.call("restore_release", release_dir=str(release.dir), by="controller")

    after = release.manifest()
    assert after == dict(manifest, outcome="rolled_back", restored_by="controller")
    assert release.journal()["note"] == "kept too"


def test_a_newer_orch_s_manifest_is_restored_but_never_rewritten(local_agent: Agent, tmp_path: Path) -> None:
    """The restore still puts the files back; the manifest in a format this helper does not
    know is left as it is, and the restore's record says so in one line naming it."""
    target = tmp_path / "model.py"
    release = Release(local_agent, tmp_path / "state")
    release.change(target, b"v = 1\n", b"v = 2\n")
    release.create()
    release.committed()
    newer = dict(release.manifest(), format=7)
    (release.dir / "manifest.json").write_text(json.dumps(newer))

    record = local_agent.call("restore_release", release_dir=str(release.dir), by="controller")

    assert record["ok"] and target.read_bytes() == b"v = 1\n"
    assert release.manifest() == newer
    assert record["record_errors"] == [str(UnknownRecordFormat("manifest.json", 7))]
    assert release.journal()["step"] == JournalStep.ROLLED_BACK.value
