"""The failed release's end (``pipeline/failure.py``), once for a deploy and a night: the
same record gives the same verdict, and only the run's kind picks the events' words.
No host: the restore records are built as the host writes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core import endings, events
from orchestrator.core.events import RestoreAccount
from orchestrator.core.outcomes import UNSAFE, ExitCode, Outcome, Step
from orchestrator.errors import LinkLostError, RemoteError
from orchestrator.host.protocol_verdict import StepFailure
from orchestrator.pipeline.events import Recorder
from orchestrator.pipeline.failure import FailedRelease
from orchestrator.pipeline.release import Cut, RestoreCut
from tests.fixtures.accounts import record


def failed(run: str, rec: Recorder) -> FailedRelease:
    return FailedRelease(run, "gpu1", "R1", "/state/releases/R1", rec,  # type: ignore[arg-type]
                         lambda text: text.replace("s3cret", "***"))


@pytest.mark.parametrize(("run", "back", "closed"), [
    ("deploy", events.RolledBack, events.ReleaseClosed),
    ("night", events.SwitchedBack, events.NightClosed),
])
def test_a_restore_after_the_commit_is_rolled_back_and_said_by_the_runs_kind(run: str, back: type,
                                                                              closed: type) -> None:
    rec = Recorder()
    closes: list[str] = []
    done = RestoreAccount(record("/srv/a.py", tail=("boom",)))
    got = failed(run, rec).restored(RemoteError("health failed"), "health failed", done, Step.RESTARTING,
                                    StepFailure("health", step="health"), lambda v, ending: closes.append((v.outcome, ending)))
    assert (got.outcome, got.exit_code) == (Outcome.ROLLED_BACK, ExitCode.FAILED)
    assert closes == [(Outcome.ROLLED_BACK, got.ending)]  # the record is closed once, with the verdict
    assert isinstance(got.ending, endings.Restored)
    assert (got.ending.run, got.ending.by, got.ending.step, got.ending.release) == (run, "runner", "health", "R1")
    kinds = [type(e) for _, e in rec.events]
    assert kinds == [back] and closed not in kinds
    assert rec.events[0][1].done == done  # the host's record, as fields: the words are the CLI's
    assert rec.logs and rec.logs[0][2] == ["boom"]


@pytest.mark.parametrize("run", ["deploy", "night"])
def test_a_restore_before_the_commit_that_wrote_nothing_closes_the_release(run: str) -> None:
    rec = Recorder()
    got = failed(run, rec).restored(RemoteError("refused"), "refused", RestoreAccount(record(unchanged=("/a",))),
                                    Step.ARMED, None, lambda v, ending: None)
    assert got.outcome == Outcome.FAILED
    assert [type(e) for _, e in rec.events] == [events.NightClosed if run == "night" else events.ReleaseClosed]


@pytest.mark.parametrize("run", ["deploy", "night"])
def test_a_failed_restore_is_unsafe_and_names_the_release_dir(run: str) -> None:
    rec = Recorder()
    done = RestoreAccount(record("/srv/a.py", error="disk full", drift="/state/drift/a.py", problems=("no space",)))
    got = failed(run, rec).restored(RemoteError("x"), "x", done, Step.RESTARTING, None, lambda v, ending: None)
    assert (got.outcome, got.exit_code) == (UNSAFE.outcome, UNSAFE.exit_code)
    assert isinstance(got.ending, endings.RestoreFailed)
    assert got.ending.release_dir == "/state/releases/R1" and got.ending.run == run
    said = [e for _, e in rec.events]
    assert isinstance(said[0], events.DriftKept) and said[0].kept_in == "/state/drift/a.py"
    assert isinstance(said[1], events.RestoreNotRecorded) and said[1].switch_back == (run == "night")


@pytest.mark.parametrize("run", ["deploy", "night"])
def test_a_restore_cut_short_ends_by_why(run: str) -> None:
    path = failed(run, Recorder())
    lost = path.cut(RestoreCut(Cut.LINK_LOST, 100.0, LinkLostError("link lost, token s3cret")), "r",
                    Step.RESTARTING)
    assert lost is not None and isinstance(lost.ending, endings.LostDuringRestore)
    assert lost.ending.lost == "link lost, token ***" and lost.ending.until == 100.0 and lost.ending.run == run
    assert lost.outcome == Outcome.UNREACHABLE
    cut = path.cut(RestoreCut(Cut.INTERRUPTED, 5.0), "r", Step.RESTARTING)
    assert cut is not None and isinstance(cut.ending, endings.InterruptedDuringRestore)
    assert cut.exit_code == ExitCode.UNSAFE
    refused = path.cut(RestoreCut(Cut.COULD_NOT_RUN, 5.0, RemoteError("no s3cret")), "r", Step.RESTARTING)
    assert refused is not None and isinstance(refused.ending, endings.RestoreCouldNotRun)
    assert refused.ending.problem == "no ***" and refused.outcome == UNSAFE.outcome
    assert path.cut(RestoreCut(Cut.ABSENT, 5.0, RemoteError("absent")), "r", Step.ARMED) is None


def test_only_one_module_writes_the_failed_releases_end() -> None:
    """The deploy and the night call it; neither builds those endings itself."""
    pipeline = Path(__file__).resolve().parents[1] / "orchestrator" / "pipeline"
    for name in ("deploy.py", "nightly.py"):
        text = (pipeline / name).read_text()
        for ending in ("Restored(", "RestoreFailed(", "LostDuringRestore(", "InterruptedDuringRestore(",
                       "RestoreCouldNotRun(", "RunnerCouldNotRestore(", "RestoringWithoutRecord("):
            assert f"endings.{ending}" not in text, (name, ending)
