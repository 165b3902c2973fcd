"""The one policy that maps a cause and the step reached (and a restore's record) to an outcome."""

from __future__ import annotations

import json

import pytest

from orchestrator.core.budget import deploy_budget, restore_budget, total
from orchestrator.core.models import parse_playbook
from orchestrator.core.outcomes import (
    CHANGED,
    MEANING,
    PLANNED,
    RETRY_OUTCOMES,
    UNCHANGED,
    ExitCode,
    Outcome,
    Step,
    Verdict,
    committed_paths,
    error_exit_code,
    read_verdict,
    rollback_verdict,
    status_exit_code,
    undone_verdict,
    verdict,
    worst,
)
from orchestrator.core.restore import RestoreRecord
from orchestrator.errors import (
    ConfigError,
    ContentChangedError,
    GateFailedError,
    HostKeyError,
    HostUnsafeError,
    LinkLostError,
    MalformedReplyError,
    OrchError,
    PreflightRefusedError,
    RefusedError,
    RemoteError,
    ServerFailedError,
    UnreachableError,
    ValidationError,
)


def record(ok: bool, action: str | None = None) -> RestoreRecord:
    action = action or ("restored" if ok else "unchanged")
    return RestoreRecord.from_wire({"by": "controller", "ok": ok, "completed": True,
                                    "files": [{"path": "/x", "action": action}]})


@pytest.mark.parametrize(("cause", "reached", "restore", "outcome", "code"), [
    (UnreachableError("no route"), Step.CONNECTING, None, "unreachable", 2),
    (LinkLostError("closed"), Step.PLANNING, None, "unreachable", 2),
    (LinkLostError("closed"), Step.ARMED, None, "unreachable", 2),
    (LinkLostError("closed"), Step.COMMITTING, None, "unreachable", 3),
    (LinkLostError("closed"), Step.RESTARTING, None, "unreachable", 3),
    (ConfigError("bad"), Step.PLANNING, None, "failed", 2),
    (ValidationError("syntax"), Step.PLANNING, None, "failed", 2),
    (ContentChangedError("edited"), Step.ARMED, record(True, "unchanged"), "failed", 2),
    (KeyboardInterrupt(), Step.PLANNING, None, "failed", 1),
    (KeyboardInterrupt(), Step.ARMED, record(True, "unchanged"), "failed", 1),
    # issue 17: whatever step the controller believed it reached, a restore that put a
    # file back says the run had written it: rolled back (1), never "nothing changed" (2)
    (RemoteError("internal: OSError"), Step.ARMED, record(True, "restored"), "rolled_back", 1),
    (RemoteError("internal: OSError"), Step.ARMED, record(True, "removed"), "rolled_back", 1),
    (KeyboardInterrupt(), Step.RESTARTING, record(True), "rolled_back", 1),
    (RemoteError("unhealthy"), Step.RESTARTING, record(True), "rolled_back", 1),
    (RemoteError("unhealthy"), Step.RESTARTING, record(False), "rollback_failed", 3),
    (RemoteError("unhealthy"), Step.RESTARTING, None, "rollback_failed", 3),
    (PreflightRefusedError("unrecognized arguments"), Step.ARMED, record(True), "rolled_back", 1),
    (PreflightRefusedError("unrecognized arguments"), Step.COMMITTING, record(True), "rolled_back", 1),
])
def test_verdict(cause: BaseException, reached: Step, restore: RestoreRecord | None, outcome: str,
                 code: int) -> None:
    v = verdict(cause, reached, restore)
    assert (v.outcome, v.exit_code) == (outcome, code)


def test_a_lost_link_is_not_shadowed_by_another_branch() -> None:
    # The defect this policy replaced: LinkLostError was a HostUnsafeError, so an
    # earlier `except HostUnsafeError` gave exit 3 before anything had changed.
    assert verdict(LinkLostError("x"), Step.PLANNING).exit_code == 2


def test_the_watchdog_deadline_covers_every_step_after_the_commit() -> None:
    pb = parse_playbook(
        "name: t\nserver: {stop_timeout: 20s, free_timeout: 40s}\n"
        "health: {base_url: 'http://h:1', timeout: 10m, stable_for: 7s, confirm_timeout: 30s, checks: [{get: /h}]}\n",
        "t.yaml")
    items = {i.name: i.seconds for i in deploy_budget(pb.server, pb.health)}
    assert items["health"] == 600 and items["stable"] == 7 and items["confirm"] == 30
    assert items["stop"] >= 20 and items["port and GPUs free"] == 40
    assert total(deploy_budget(pb.server, pb.health)) == sum(items.values())
    # the controller's own rollback is backed up after the restart it needs, without the confirm slack
    assert total(restore_budget(pb.server, pb.health)) < total(deploy_budget(pb.server, pb.health))


@pytest.mark.parametrize(("details", "written"), [
    ({"step": 0, "committed": []}, []),  # the commit refused or failed before its first rename
    ({"step": 0, "committed": ["/a"]}, ["/a"]),  # it renamed /a, then failed on the next file
    ({"step": 1, "done": [["/a", "/b"]]}, ["/a", "/b"]),  # the journal write after it failed
    ({"step": 2, "done": [["/a"], True]}, ["/a"]),
    ({}, None),  # the host said nothing: unknown, never "nothing written"
    ({"step": 0}, None),
])
def test_what_the_commit_wrote_is_read_from_the_hosts_record(details: dict[str, object],
                                                              written: list[str] | None) -> None:
    assert committed_paths(details) == written


# ------------------------------------------------------------------ the other ends of a run


def test_rollback_verdict_is_from_the_hosts_record() -> None:
    # orch rollback's purpose is the restore: rolled_back is success (0); a failed restore is unsafe (3)
    assert rollback_verdict(record(True)) == Verdict(Outcome.ROLLED_BACK, 0)
    assert rollback_verdict(record(False)) == Verdict(Outcome.ROLLBACK_FAILED, 3)


@pytest.mark.parametrize(("rollback", "undone"), [
    (Verdict(Outcome.ROLLED_BACK, 0), Verdict(Outcome.ROLLED_BACK, 1)),  # back as it was; the run failed there
    (Verdict(Outcome.ROLLBACK_FAILED, 3), Verdict(Outcome.ROLLBACK_FAILED, 3)),
    (Verdict(Outcome.UNREACHABLE, 2), Verdict(Outcome.UNREACHABLE, 2)),
    (Verdict(Outcome.UNCHANGED, 0), Verdict(Outcome.FAILED, 2)),  # still on the release it deployed
])
def test_a_host_undone_with_its_failed_batch(rollback: Verdict, undone: Verdict) -> None:
    assert undone_verdict(rollback) == undone


@pytest.mark.parametrize(("cause", "expected"), [
    (UnreachableError("no route"), Verdict(Outcome.UNREACHABLE, 2)),
    (HostKeyError("changed key"), Verdict(Outcome.UNREACHABLE, 2)),
    (LinkLostError("closed"), Verdict(Outcome.UNREACHABLE, 2)),  # a read changes nothing: never 3
    (MalformedReplyError("not JSON"), Verdict(Outcome.UNREACHABLE, 2)),
    (ConfigError("bad"), Verdict(Outcome.FAILED, 2)),
    (HostUnsafeError("half done"), Verdict(Outcome.FAILED, 3)),
])
def test_a_read_only_command_that_raised(cause: BaseException, expected: Verdict) -> None:
    # by class, not by the class's name (a subclass is matched too)
    assert read_verdict(cause) == expected


@pytest.mark.parametrize(("cause", "code"), [
    (ConfigError("bad"), 2), (RefusedError("locked"), 2), (LinkLostError("closed"), 2),
    (ServerFailedError("exited"), 1), (GateFailedError("slower"), 1), (HostUnsafeError("unknown"), 3),
    (OrchError("other"), 2),
])
def test_an_error_outside_a_host_run_has_its_classs_code(cause: OrchError, code: int) -> None:
    assert error_exit_code(cause) == code


def test_several_hosts_exit_with_the_worst_code() -> None:
    assert worst([]) == 0
    assert worst([0, 1, 0]) == 1
    assert worst([2, 3, 1]) == 3
    assert type(worst([ExitCode.UNSAFE])) is int  # printed and serialised as the number


@pytest.mark.parametrize(("problems", "regressed", "code"), [
    ([], False, 0), ([], True, 1), (["server not healthy"], False, 3), (["server not running"], True, 3),
])
def test_status_exit_code(problems: list[str], regressed: bool, code: int) -> None:
    assert status_exit_code(problems, regressed) == code


def test_an_outcome_is_its_word_everywhere() -> None:
    # the contract's words are unchanged: JSON, f-strings, comparisons and lookups see the word
    assert json.dumps({"outcome": Outcome.ROLLED_BACK}) == '{"outcome": "rolled_back"}'
    assert f"gpu: {Outcome.ROLLBACK_FAILED}" == "gpu: rollback_failed"
    assert Outcome.NOT_STARTED == "not_started" and "failed" in RETRY_OUTCOMES
    assert {o.value for o in Outcome} == set(MEANING)
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3]
    ends = [(v.outcome, v.exit_code) for v in (UNCHANGED, PLANNED, CHANGED)]
    assert ends == [("unchanged", 0), ("planned", 0), ("changed", 0)]
