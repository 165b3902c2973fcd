"""``--json`` carries fields, not prose (issue 18): ``flag_changes`` and ``steps``.

The real ``orch`` in a subprocess, over real sshd, against the stand-in
server: a deploy that adds a flag, one that changes its value, a
``--check`` that would change it again, ``orch rollback`` putting the value
back, and ``orch status`` reading the current release's fields from the
host's record.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from tests.fixtures.sandbox import SHIPPED_SPEC, Sandbox, get_json, health_status, quick_stability

FLAG = "--speculative-disable-batch-threshold"


def orch_json(box: Sandbox, *args: str, code: int = 0) -> dict[str, Any]:
    """``orch ARGS --json``'s report of host ``gpu``, after checking the exit code."""
    proc: subprocess.CompletedProcess[str] = box.orch(*args, "--host", "gpu", "--json")
    assert proc.returncode == code, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["exit_code"] == code
    return dict(report["hosts"]["gpu"])


def assert_steps(report: dict[str, Any], first: list[str]) -> list[dict[str, Any]]:
    """``steps``: one object per finished step, ``{"step", "at", "seconds"}``, in the order they
    began, none overlapping the next; the same steps and seconds as ``timings`` (where kept)."""
    steps = report["steps"]
    assert [s["step"] for s in steps][: len(first)] == first
    for s in steps:
        assert set(s) == {"step", "at", "seconds"}
        assert isinstance(s["at"], float) and isinstance(s["seconds"], float) and s["seconds"] >= 0
    for earlier, later in zip(steps, steps[1:], strict=False):
        assert earlier["at"] + earlier["seconds"] <= later["at"] + 0.01, steps  # one after the other
    if "timings" in report:
        assert {s["step"]: s["seconds"] for s in steps} == report["timings"]
    return list(steps)


def events_by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``events``: each line the run said, as ``{"event", "level", ...its fields}``; by name
    (the last of a name), without the name."""
    assert all({"event", "level"} <= set(e) for e in report["events"]), report["events"]
    return {e["event"]: {k: v for k, v in e.items() if k != "event"} for e in report["events"]}


def test_flag_changes_and_steps_are_fields_for_deploy_check_rollback_and_status(sandbox: Sandbox) -> None:
    # the story, stable for 0.2 s, as the sandbox's own: each restart here waits it out
    sandbox.root.joinpath("playbooks", "speculative-disable.yaml").write_text(quick_stability(SHIPPED_SPEC, "0.2s"))
    sandbox.start_by_hand()

    # a flag added: absent before is null
    added = orch_json(sandbox, "deploy", "speculative-disable")
    assert added["outcome"] == "changed"
    assert added["flag_changes"] == [{"flag": FLAG, "from": None, "to": "32"}]
    assert added["flag_changes_text"] == [f"{FLAG}: (absent) -> 32"]  # the line people read, kept
    steps = assert_steps(added, ["connect", "lock", "plan", "stage", "backup", "commit", "restart", "health"])
    assert steps[-1]["step"] == "confirm"
    # what the console said, as fields (``core.events``): a script reads these, not the lines
    said = events_by_name(added)
    assert said["committed"] == {"level": "step", "files": 1}
    assert said["backed_up"]["release"] == added["release"] and isinstance(said["backed_up"]["deadline"], float)
    assert any(FLAG in word for word in said["restarting"]["argv"])
    assert isinstance(said["healthy"]["polls"], int) and said["healthy"]["polls"] >= 1
    assert said["release_current"] == {"level": "step", "release": added["release"]}

    # status: the current release's fields, read from the host's record (its steps as the
    # host's runner recorded them when it confirmed, on the host's clock: the same figures)
    status = orch_json(sandbox, "status")
    assert status["current"] == added["release"]
    assert status["flag_changes"] == added["flag_changes"]
    recorded = assert_steps(status, ["connect", "lock", "plan", "stage", "backup", "commit"])
    assert [s["step"] for s in recorded] == [s["step"] for s in steps]
    for mine, theirs in zip(recorded, steps, strict=True):
        assert mine["seconds"] == theirs["seconds"] and abs(mine["at"] - theirs["at"]) < 0.01

    # a flag's value changed: only the command line, the files are as planned
    changed = orch_json(sandbox, "deploy", "speculative-disable", "--var", "threshold=16")
    assert changed["outcome"] == "changed" and changed["files"] == []
    assert changed["flag_changes"] == [{"flag": FLAG, "from": "32", "to": "16"}]
    assert get_json(sandbox.port, "/get_server_info")["speculative_disable_batch_threshold"] == 16
    assert_steps(changed, ["connect", "lock", "plan"])

    # --check plans a change and reports it the same way; nothing changes
    planned = orch_json(sandbox, "deploy", "--check", "speculative-disable", "--var", "threshold=8")
    assert planned["outcome"] == "planned"
    assert planned["flag_changes"] == [{"flag": FLAG, "from": "16", "to": "8"}]
    assert_steps(planned, ["connect", "plan"])
    assert events_by_name(planned)["check_validated"] == {"level": "step", "would_refuse": False,
                                                          "preflight_refused": False}

    # a rollback puts the value back: its flag changes go the other way
    back = orch_json(sandbox, "rollback")
    assert back["outcome"] == "rolled_back" and back["undid"] == [changed["release"]]
    assert back["flag_changes"] == [{"flag": FLAG, "from": "16", "to": "32"}]
    assert_steps(back, ["connect", "lock", "rollback"])
    rolling = events_by_name(back)["rolling_back"]
    assert rolling["releases"] == [changed["release"]] and rolling["restart"] is True
    assert get_json(sandbox.port, "/get_server_info")["speculative_disable_batch_threshold"] == 32
    assert health_status(sandbox.port) == 200

    # an unchanged deploy has steps too, and no flag change to report
    same = orch_json(sandbox, "deploy", "speculative-disable")
    assert same["outcome"] == "unchanged" and "flag_changes" not in same
    assert [s["step"] for s in assert_steps(same, ["connect", "lock", "plan"])] == ["connect", "lock", "plan"]


def test_a_refused_host_reports_the_steps_it_reached(sandbox: Sandbox) -> None:
    """A run that ends before the plan still has ``steps`` (as far as it got), and the
    exit code and outcome words of the contract."""
    refused = orch_json(sandbox, "rollback", "--to", "nope", code=2)
    assert refused["outcome"] == "failed"
    assert [s["step"] for s in assert_steps(refused, ["connect"])] in (["connect"], ["connect", "lock"])
