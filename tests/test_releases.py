"""``--to`` rules (pure): an unknown or undone release is refused in every state."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.core.outcomes import error_exit_code
from orchestrator.core.releases import describe_release, rollback_target, rollback_to
from orchestrator.errors import ConfigError, RefusedError
from orchestrator.host.records import Manifest


def release(rid: str, **fields: Any) -> Manifest:
    return Manifest.from_wire({"id": rid, "kind": "deploy", "outcome": "deployed", "files": [], **fields})


RELEASES = {
    "20260101T000000000-aaaa": release("20260101T000000000-aaaa", undone_by="20260101T000002000-cccc"),
    "20260101T000001000-bbbb": release("20260101T000001000-bbbb", outcome="rolled_back"),
    "20260101T000002000-cccc": Manifest.from_wire({"id": "20260101T000002000-cccc", "kind": "rollback",
                                                   "outcome": "done", "undid": ["20260101T000000000-aaaa"]}),
}


@pytest.mark.parametrize("applied", [[], ["20260101T000000000-aaaa"]])
def test_unknown_to_is_a_config_error_whatever_is_current(applied: list[str]) -> None:
    releases = dict(RELEASES)
    if applied:
        releases[applied[0]] = release(applied[0])
    with pytest.raises(ConfigError) as info:
        rollback_to("nope", applied, releases)
    assert error_exit_code(info.value) == 2
    assert str(info.value).startswith("--to: no release 'nope' on this host (the latest: ")


def test_unknown_to_on_a_host_without_releases() -> None:
    with pytest.raises(ConfigError) as info:
        rollback_target([], {}, "/r", to="x")
    assert str(info.value) == "--to: no release 'x' on this host (no release was ever recorded here)"


def test_an_undone_release_is_never_called_deployed() -> None:
    with pytest.raises(RefusedError) as info:
        rollback_to("20260101T000000000", [], RELEASES)
    message = str(info.value)
    assert "undone by 20260101T000002000-cccc" in message
    assert "deployed" not in message
    assert describe_release(RELEASES["20260101T000000000-aaaa"], []) == "undone by 20260101T000002000-cccc"
    assert describe_release(release("x"), []) == "not in effect"
    assert describe_release(release("x"), ["x"]) == "current"
    assert describe_release(release("x"), ["x", "y"]) == "deployed"


def test_a_rolled_back_release_and_a_rollback_record_are_refused_as_such() -> None:
    with pytest.raises(RefusedError, match=r"\(rolled back\)"):
        rollback_to("20260101T000001", ["20260101T000000000-aaaa"], RELEASES)
    with pytest.raises(RefusedError, match=r"\(undid 20260101T000000000-aaaa\)"):
        rollback_to("20260101T000002", [], RELEASES)


def test_to_a_release_in_effect() -> None:
    releases = {r: release(r) for r in ("r1", "r2", "r3")}
    assert rollback_to("r1", ["r1", "r2", "r3"], releases) == "r1"
    target = rollback_target(["r1", "r2", "r3"], releases, "/s/releases", to="r1")
    assert target.undo == ("r3", "r2") and target.new_applied == ("r1",)


def test_a_release_holding_drift_is_held_not_pruned_and_does_not_shift_the_cap() -> None:
    """Issue 16.4: drift lives in rolled back releases and rollback records, which go first."""
    from orchestrator.core.releases import drift_kept, prune_candidates, prune_plan

    ids = ["r1", "r2", "r3", "r4", "r5"]
    applied = ["r3", "r5"]
    holding = drift_kept([release("r1", drift_kept=[{"path": "/a.py", "copy": "/s/r1/files/0.drift"}]),
                          release("r2", drift_kept=[])])
    assert holding == {"r1": ["/a.py"]}
    plan = prune_plan(ids, applied, keep=3, holding=holding)
    assert plan.remove == ["r2", "r4"] and plan.held == {"r1": ["/a.py"]}
    assert prune_candidates(ids, applied, keep=3) == ["r1", "r2"]  # without drift, the oldest go
    assert prune_plan(ids, applied, keep=5, holding=holding).held == {}  # nothing would be pruned: no note
