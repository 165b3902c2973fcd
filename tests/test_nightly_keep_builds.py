"""Issue 21, item 4: "``keep_builds`` prunes failed and undone builds first and never a build
that is a step of ``orch rollback``; history marks a night whose build was pruned".

The real ``orch nightly``, ``orch rollback`` and ``orch history`` over real sshd, with the
nights of ``tests/test_nightly.py``'s fixture (a git repository of the stand-in tree, the
stand-in server started from ``current/``).
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.core.nightly import builds_to_prune
from tests.fixtures.sandbox import get_json, wait_healthy
from tests.test_nightly import NightBox, nightbox  # noqa: F401 - the fixture, shared


def builds_on_disk(nb: NightBox) -> list[str]:
    return sorted(p.name for p in nb.builds.iterdir() if p.name not in ("current", "logs", ".cache"))


def good_night(nb: NightBox, *args: str) -> str:
    proc, data = nb.night(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(data["hosts"]["gpu"]["build"])


def history(nb: NightBox) -> dict[str, dict[str, Any]]:
    proc = nb.box.orch("history", "--host", "gpu", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {r["id"]: r for r in json.loads(proc.stdout)["hosts"]["gpu"]}


def test_keep_builds_prunes_failed_and_undone_builds_first_never_a_rollback_step(
    nightbox: NightBox,  # noqa: F811
) -> None:
    box = nightbox.box
    nightbox.write_spec(keep_builds=3, probe=False)
    n1, n2, n3 = (good_night(nightbox, "--var", f"threshold={t}") for t in (16, 24, 32))
    undo = box.orch("rollback", "--host", "gpu", "--json")  # n3 undone: current is n2 again
    assert undo.returncode == 0, undo.stdout + undo.stderr
    assert nightbox.current() == n2
    failed, data = nightbox.night("--var", "crash=1")  # switched back: its build never served
    assert failed.returncode == 1, failed.stdout + failed.stderr
    n4 = str(data["hosts"]["gpu"]["build"])
    assert builds_on_disk(nightbox) == sorted([n1, n2, n3, n4])

    proc, data = nightbox.night("--var", "threshold=40")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    n5 = str(data["hosts"]["gpu"]["build"])
    # before: the undone n3 counted as good, and the good n1 (a step back) went in its place
    assert builds_on_disk(nightbox) == sorted([n1, n2, n5])
    assert f"pruned 2 old build(s): {n4}, {n3}" in proc.stderr

    # every build `orch rollback` switches back to is there: n5 -> n2 -> n1
    for back, threshold in ((n2, 24), (n1, 16)):
        proc = box.orch("rollback", "--host", "gpu", "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert json.loads(proc.stdout)["hosts"]["gpu"]["current"] == back
        assert nightbox.current() == back
        wait_healthy(box.port, 60)
        assert get_json(box.port, "/get_server_info")["speculative_disable_batch_threshold"] == threshold

    # history marks the nights whose build is gone, and only those (pipe and JSON)
    rows = history(nightbox)
    assert rows[n3]["build_pruned"] and rows[n3]["outcome"].endswith("; build pruned"), rows[n3]
    assert rows[n3]["outcome"].startswith("undone by ")
    assert rows[n4]["outcome"] == "switched back" and not rows[n4]["build_pruned"]  # it never served
    assert not any(rows[n]["build_pruned"] or "pruned" in rows[n]["outcome"] for n in (n1, n2, n5))
    lines = box.orch("history", "--host", "gpu").stdout.splitlines()
    assert [line for line in lines if n3 in line and "build pruned" in line], lines


def test_history_marks_a_night_whose_build_keep_builds_pruned(nightbox: NightBox) -> None:  # noqa: F811
    """A good night beyond ``keep_builds`` and an undone one: both still listed, neither called
    plainly "good" or "undone" (``orch rollback`` cannot switch back to them)."""
    box = nightbox.box
    nightbox.write_spec(keep_builds=2, probe=False)
    n1, n2, n3 = (good_night(nightbox, "--var", f"threshold={t}") for t in (16, 24, 32))
    assert builds_on_disk(nightbox) == sorted([n2, n3])
    undo = box.orch("rollback", "--host", "gpu", "--json")  # n3 undone: current is n2 again
    assert undo.returncode == 0, undo.stdout + undo.stderr
    undid = str(json.loads(undo.stdout)["hosts"]["gpu"]["release"])
    proc, data = nightbox.night("--var", "threshold=40")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    n4 = str(data["hosts"]["gpu"]["build"])
    assert f"pruned 1 old build(s): {n3}" in proc.stderr
    assert builds_on_disk(nightbox) == sorted([n2, n4])  # n2: the step back from n4
    rows = history(nightbox)
    assert rows[n1]["outcome"] == "good; build pruned" and rows[n1]["build_pruned"] is True
    assert rows[n3]["outcome"] == f"undone by {undid}; build pruned" and rows[n3]["build_pruned"] is True
    assert rows[n2]["outcome"] == "good" and rows[n2]["build_pruned"] is False
    assert rows[n4]["outcome"] == "current" and rows[n4]["build_pruned"] is False
    lines = box.orch("history", "--host", "gpu").stdout.splitlines()
    for night in (n1, n3):
        assert [line for line in lines if night in line and "; build pruned" in line], lines


def test_keep_builds_order_undone_before_steps_failed_always() -> None:
    """The rule itself: failed (half-made, switched back) always go; undone before any step;
    steps (the nights in effect) only beyond ``keep``, oldest first; current and previous never."""
    builds = ["n1", "n2", "n3", "n4", "n5"]
    complete = ["n1", "n2", "n3", "n5"]  # n4 failed
    # n3 undone: applied is n1, n2, n5
    assert builds_to_prune(builds, "n5", "n2", keep=3, complete=complete, steps=["n1", "n2", "n5"]) == ["n4", "n3"]
    # one fewer kept: then the oldest step
    assert builds_to_prune(builds, "n5", "n2", keep=2, complete=complete, steps=["n1", "n2", "n5"]) == \
        ["n4", "n3", "n1"]
    # without steps (an older caller): every confirmed build is one, oldest first
    assert builds_to_prune(builds, "n5", "n2", keep=3, complete=complete) == ["n4", "n1"]
    # a deploy id among the applied ones is no build; current and previous are kept whatever keep says
    assert builds_to_prune(builds, "n5", "n3", keep=2, complete=complete, steps=["n1", "d9", "n5"]) == \
        ["n4", "n2", "n1"]
