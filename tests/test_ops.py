"""The helper protocol, typed: every op builder names a real helper op with
arguments its function accepts — checked here, not on a host mid-deploy."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from orchestrator.host import dispatch
from orchestrator.host import protocol as p
from orchestrator.shell import ops

HOLDER = {"user": "u", "pid": 1}

SAMPLES: dict[str, tuple[Any, ...]] = {
    "open_state": (ops.open_state("~/.orch", HOLDER), ops.open_state("~/.orch")),
    "state_read": (ops.state_read("~/.orch"),),
    "lock_acquire": (ops.lock_acquire("~/.orch", HOLDER, replace_token="t"),),
    "lock_release": (ops.lock_release("~/.orch"),),
    "get_json": (ops.get_json("/x"),),
    "put_json": (ops.put_json("/x", None), ops.put_json("/x", {"a": 1})),
    "mark": (ops.mark("/x"),),
    "read": (ops.read(["/x"]), ops.read(["/x"], with_data=False)),
    "sha256": (ops.sha256(["/x"]),),
    "stage": (ops.stage([{"path": "/x", "data": ""}], "tok", clean_stale=True),),
    "validate": (ops.validate([{"target": "/x", "argvs": []}], "tok", keep_staged=False),),
    "remove": (ops.remove(["/x"]),),
    "commit": (ops.commit([{"path": "/x", "staged": "/y", "before": "a", "after": "b"}], "/r"),),
    "release_create": (ops.release_create("/s", "r", {}, [], restore={}),),
    "release_update": (ops.release_update("/s", "r", {"outcome": "x"}),),
    "release_prune": (ops.release_prune("/s", ["r"]),),
    "release_log": (ops.release_log("/s", "r", "text"),),
    "release_arm": (ops.release_arm("/s", "/s/releases/r"),),
    "restore_release": (ops.restore_release("/r", "controller", until=1.0, reason="why"),),
    "confirm_release": (ops.confirm_release("/r", [ops.lock_release("/s")]),),
    "server_find": (ops.server_find("/p", 30000), ops.server_find(None, None)),
    "process": (ops.process(1),),
    "server_stop": (ops.server_stop(1, 1, 5.0, 30000, 10.0),),
    "server_start": (ops.server_start(["x"], None, {}, "/log", "/pid", True),),
    "run": (ops.run(["true"], timeout=5.0, cwd="/"),),
    "run_ok": (ops.run_ok(["true"]),),
    "commands_start": (ops.commands_start(["start"], ["pid"]), ops.commands_start(["start"], None)),
    "read_host": (ops.read_host(["/x"], packages=["sglang"], python="python3", pidfile="/p", port=1,
                                follow=[{"index": 0, "names": ["n"]}]), ops.read_host(["/x"])),
    "preflight": (ops.preflight(["python3", "-c", "pass"], cwd=None, env={}, replace_env=True, timeout=5.0),),
    "health_wait": (ops.health_wait({"base_url": "http://h", "checks": [], "timeout": 1.0, "interval": 1.0,
                                     "stable_for": 0.0}, pid="started"),),
    "nightly_prepare": (ops.nightly_prepare("/b", "n1"),),
    "nightly_builds": (ops.nightly_builds("/b"),),
    "nightly_fetch_git": (ops.nightly_fetch_git("/src.git", "a" * 40, "/b", "n1", "/b/logs/n1.log"),),
    "nightly_pip": (ops.nightly_pip("/b", "n1", "x==1 --hash=sha256:" + "a" * 64, "python3", ["--no-index"],
                                    "/b/logs/n1.log"),),
    "nightly_run": (ops.nightly_run(["true"], "/b/n1", "/b/logs/n1.log"),),
    "nightly_remove_build": (ops.nightly_remove_build("/b", "n1"),),
    "nightly_prune": (ops.nightly_prune("/b", ["n0"]),),
    "nightly_link_swap": (ops.nightly_link_swap("/b/current", "n1", None),
                          ops.nightly_link_swap("/b/current", None, "n1")),
    "probe_http": (ops.probe_http("http://h", "/generate", {"text": "x"}, requests=2, concurrency=1, timeout=5.0,
                                  headers={}, warmup=1, greedy_body={"text": "x"}),
                   ops.probe_http("http://h", "/generate", None, requests=1, concurrency=1, timeout=5.0,
                                  headers={})),
}


def builders() -> list[str]:
    return sorted(name for name, fn in vars(ops).items()
                  if inspect.isfunction(fn) and fn.__module__ == ops.__name__
                  and not name.startswith("_") and name != "batch")


def test_every_builder_has_samples() -> None:
    assert builders() == sorted(SAMPLES)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_builder_sends_a_request_the_helper_takes(name: str) -> None:
    # parse_request is what the helper reads a line with; tests/test_protocol.py holds each
    # request type to the helper function's signature
    for op in SAMPLES[name]:
        assert op.name == name
        assert p.parse_request(op.wire()) == op.request  # ProtocolError names a bad op or argument
        assert op.name in dispatch.OPS, f"{op.name!r} is no helper op"
        # every op takes the helper's session first; TypeError names the bad argument
        inspect.signature(dispatch.find_op(op.name)).bind(None, **op.args)
        if op.name in ("batch", "confirm_release"):
            for step in op.args["steps"]:
                inspect.signature(dispatch.find_op(step["op"])).bind(None, **step["args"])


def test_a_batch_reads_each_answer_with_its_own_op() -> None:
    record = {"by": "controller", "ok": True, "completed": True, "files": [{"path": "/x", "action": "restored"}]}
    mark = ops.mark("/m")
    batch = ops.batch([mark, ops.restore_release("/r", "controller")])
    marked, restored = batch.parse([True, record])  # in order, and by the op that asked:
    assert batch.parse([True, record])[mark] is True
    assert marked is True
    assert restored.ok and restored.files[0].action == "restored"
