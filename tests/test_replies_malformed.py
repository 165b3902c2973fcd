"""Issue 16 item 5: a host whose helper answers garbage is that host's error.

The host's interpreter (the inventory's ``python:``, which is how the
helper's interpreter is chosen) is a hostile wrapper: it runs the real
helper under the real python and relays every line both ways, but replaces
the answer to one request (the first that mentions ``TRIGGER``) with
garbage of one kind. So everything up to that answer is real — the SSH
login, the helper, its lock — and the garbage arrives exactly where a broken
host would send it. Through the real CLI over real sshd, with ``--json``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.shell.replies import MAX_REPLY_DEPTH
from tests.fixtures.fleet import Fleet
from tests.fixtures.sandbox import SHIPPED_SPEC, Sandbox, quick_stability, wait_until

WRAPPER = '''#!{python}
"""A hostile host: the real helper, with the answer to one request replaced by garbage."""
import json, subprocess, sys, threading
KIND, TRIGGER = {kind!r}, {trigger!r}
child = subprocess.Popen([{python!r}] + sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
hostile = set()

def garbage(rid):
    if KIND == "not_json":
        return b"oops, this is not JSON {{\\n"
    if KIND == "deep":
        return b"[" * 200000 + b"]" * 200000 + b"\\n"
    value = {{
        "null_result": {{"id": rid, "done": True, "ok": True, "result": None}},
        "wrong_types": {{"id": rid, "done": True, "ok": True, "result": {{"root": 17, "lock": "yes", "state": []}}}},
        "list": [rid, True, "ok"],
        "bad_envelope": {{"id": rid, "done": True, "ok": "yes"}},
        "bad_error": {{"id": rid, "done": True, "ok": False, "error": {{"type": 5}}}},
        "short_batch": {{"id": rid, "done": True, "ok": True, "result": []}},
    }}[KIND]
    return json.dumps(value).encode() + b"\\n"

def down():
    for line in iter(sys.stdin.buffer.readline, b""):
        if TRIGGER.encode() in line and not hostile:
            hostile.add(json.loads(line)["id"])
        child.stdin.write(line)
    child.stdin.close()

threading.Thread(target=down, daemon=True).start()
for line in iter(child.stdout.readline, b""):
    try:
        msg = json.loads(line)
    except ValueError:
        msg = None
    if isinstance(msg, dict) and msg.get("done") and msg.get("id") in hostile:
        line = garbage(msg["id"])
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
sys.exit(child.wait())
'''

OPEN_STATE = '"op":"open_state"'
COMMIT = '"op":"commit"'


def hostile_python(where: Path, kind: str, trigger: str) -> str:
    path = where / f"python-{kind}"
    path.write_text(WRAPPER.format(python=sys.executable, kind=kind, trigger=trigger))
    path.chmod(0o755)
    return str(path)


def as_json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        return dict(json.loads(proc.stdout))
    except ValueError:
        raise AssertionError(f"no JSON report:\n{proc.stdout}\n{proc.stderr}") from None


def assert_one_line_naming(error: str, host: str, op: str) -> None:
    assert "\n" not in error
    assert error.startswith(host) and f"malformed answer to {op}" in error, error


WHAT = {
    "not_json": "not JSON",
    "deep": f"nested more than {MAX_REPLY_DEPTH} levels",
    "null_result": "result is null, expected an object",
    "wrong_types": "result.root is a number, expected a string",
    "list": "the answer is a list of 3, expected an object",
    "bad_envelope": "the answer.ok is the string 'yes', expected true or false",
    "bad_error": "the answer.error.type is a number, expected a string",
}


@pytest.mark.parametrize("kind", list(WHAT))
def test_garbage_before_the_commit_is_that_hosts_failure(sandbox: Sandbox, kind: str) -> None:
    sandbox.start_by_hand()
    sandbox.write_inventory(python=hostile_python(sandbox.root, kind, OPEN_STATE))
    before = sandbox.server_args.read_bytes()

    proc = sandbox.orch("deploy", "--host", "gpu", "--json", "playbooks/speculative-disable.yaml")

    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    report = as_json(proc)
    assert report["exit_code"] == 2
    host = report["hosts"]["gpu"]
    assert host["outcome"] == "failed"
    assert_one_line_naming(host["error"], "gpu", "open_state")
    assert WHAT[kind] in host["error"]
    assert sandbox.server_args.read_bytes() == before
    # the link was dropped, so the real helper behind the garbage gave the lock back
    wait_until(lambda: not (sandbox.state_dir / "lock.json").exists(), "the hostile host's lock to go")


def test_garbage_after_the_commit_is_unreachable_with_what_is_known(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    sandbox.write_inventory(python=hostile_python(sandbox.root, "short_batch", COMMIT))

    proc = sandbox.orch("deploy", "--host", "gpu", "--json", "playbooks/speculative-disable.yaml")

    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    host = as_json(proc)["hosts"]["gpu"]
    assert host["outcome"] == "unreachable"
    assert_one_line_naming(host["error"], "gpu", "batch")
    assert re.search(r"result has 0 answers for \d+ steps", host["error"]), host["error"]
    # what is known: the release, its files, and who restores it
    assert host["release"] and host["files"] == [str(sandbox.server_args)]
    assert "the host finishes it by itself" in host["error"] and "orch status --follow --host gpu" in host["error"]
    assert (sandbox.state_dir / "releases" / host["release"] / "restore.json").exists()


def test_one_hostile_host_of_three_keeps_the_fleet_report(fleet: Fleet) -> None:
    hosts = fleet.new_boxes(fleet.root, count=3)
    bad = hostile_python(fleet.root, "deep", OPEN_STATE)
    fleet.write_inventory(hosts, extra={"gpu02": {"python": bad}})
    before = hosts[1].file_sha()
    story = fleet.root / "story.yaml"
    # the shipped playbook, its health polled every 0.2 s and stable for 1 s (not 1 s and 5 s)
    story.write_text(quick_stability(SHIPPED_SPEC).replace("  interval: 1s\n", "  interval: 0.2s\n"))

    proc = fleet.orch("deploy", "--host", "fleet", "--json", str(story))

    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    report = as_json(proc)
    outcomes = {name: h["outcome"] for name, h in report["hosts"].items()}
    assert outcomes == {"gpu01": "changed", "gpu02": "failed", "gpu03": "changed"}, proc.stdout
    assert_one_line_naming(report["hosts"]["gpu02"]["error"], "gpu02", "open_state")
    assert hosts[1].file_sha() == before
    for h in (hosts[0], hosts[2]):
        assert h.current_flag() == 32


# ------------------------------------------------------------------ the boundary's pieces, on their own


def test_the_depth_scan_skips_brackets_inside_strings_and_counts_the_rest() -> None:
    from orchestrator.shell.replies import Malformed, decode, too_deep

    text = json.dumps({"id": 1, "done": True, "ok": True, "result": "[" * 5000 + "{" * 5000}).encode()
    assert not too_deep(text)  # 10,000 brackets, all inside one string (with an escaped quote or not)
    assert decode(text)["result"].startswith("[[[")
    assert not too_deep(b'["\\"[[[[", ' + b"[" * MAX_REPLY_DEPTH + b"]" * MAX_REPLY_DEPTH + b"]", MAX_REPLY_DEPTH + 1)
    assert too_deep(b"[" * (MAX_REPLY_DEPTH + 1) + b"]" * (MAX_REPLY_DEPTH + 1))
    with pytest.raises(Malformed, match="nested more than"):
        decode(b"{" + b'"a":[' * 100_000)


def test_a_batch_answer_is_read_step_by_step_with_the_step_named() -> None:
    from orchestrator.shell import ops
    from orchestrator.shell.replies import Malformed

    run = ops.run(["true"])
    op = ops.batch([ops.sha256(["/a"]), run])
    assert op.read([{"/a": None}, {"rc": 0, "stdout": "", "stderr": ""}])[run]["rc"] == 0
    with pytest.raises(Malformed, match=r"result\[1\] \(run\)\.rc is the string '0', expected an integer"):
        op.read([{"/a": None}, {"rc": "0", "stdout": "", "stderr": ""}])
    with pytest.raises(Malformed, match="cannot be read"):
        ops.restore_release("/r", "controller").read({"files": [{"no path": 1}]})
