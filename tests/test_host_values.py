"""Values the host cannot use are refused while planning (issue 16.7).

A NUL byte in a flag value, a var, a validate command or a hook; an
environment name with ``=`` (or empty); a NUL in an environment value or a
path: ``execve`` and ``open`` on the host refuse them. Found there, they
failed a step after the commit, and the deploy was committed and restored
for nothing. Now: one line naming the file and key, exit 2, nothing staged,
no release — through the real CLI over sshd against the stand-in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.core.hostvalues import (
    HostValue,
    argv_problem,
    env_problem,
    first_problem,
    headers_problem,
    path_problem,
)
from tests.fixtures.sandbox import SHIPPED_SPEC, Sandbox, sha256


def playbook(box: Sandbox, change: dict[str, Any], name: str = "bad.yaml") -> Path:
    """The story's playbook with ``change`` merged into its ``server`` (and ``files[0]``)."""
    spec = yaml.safe_load(SHIPPED_SPEC)
    spec["server"].update(change.get("server", {}))
    spec["files"][0].update(change.get("file", {}))
    spec["vars"].update(change.get("vars", {}))
    path = box.root / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


CASES = {
    "nul-in-a-flag-value-from-a-var": (
        {"vars": {"threshold": "3\0 2"}}, "server.flags.--speculative-disable-batch-threshold", "NUL"),
    "equals-in-an-env-name": (
        {"server": {"env": {"CUDA=VISIBLE": "0"}}}, "server.env.CUDA=VISIBLE", "contains '='"),
    "nul-in-an-env-value": (
        {"server": {"env": {"MY_TOKEN": "{{ token }}"}}, "vars": {"token": "ab\0cd"}}, "server.env.MY_TOKEN",
        "NUL"),
    "nul-in-a-validate-command": (
        {"file": {"validate": ["python-syntax", "sh -c 'test -s {{ staged }}' {{ token }}"]},
         "vars": {"token": "x\0"}}, "files[0].validate[1]", "NUL"),
    "nul-in-a-hook": (
        {"server": {"before_stop": "echo {{ token }}"}, "vars": {"token": "drain\0"}}, "server.before_stop", "NUL"),
    "nul-in-the-server-command": (
        {"server": {"command": "{{ python }} -m sglang.launch_server --model-path {{ token }} --port {{ port }}"},
         "vars": {"token": "/models/a\0b"}}, "server.command", "NUL"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_a_value_the_host_cannot_use_is_refused_before_anything_is_staged(sandbox: Sandbox, case: str) -> None:
    change, key, why = CASES[case]
    box = sandbox
    pid = box.start_by_hand()
    original = sha256(box.server_args)
    args = ["deploy", "--host", "gpu", "--json", str(playbook(box, change))]
    proc = box.orch(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    rep = json.loads(proc.stdout)["hosts"]["gpu"]
    assert rep["outcome"] == "failed", rep
    error = rep["error"]
    assert "bad.yaml" in error and key in error and why in error, error
    assert "the host cannot use it" in error and "\n" not in error
    # touched nothing: no staged copy, no release, no journal; the server never stopped
    assert sha256(box.server_args) == original and box.server_pid() == pid
    assert list(box.server_args.parent.glob(".*orch-staged*")) == []
    assert not (box.state_dir / "releases").exists() or list((box.state_dir / "releases").iterdir()) == []
    assert box.journal() == {}
    # --check refuses it the same way
    check = box.orch(*args[:1], "--check", *args[1:])
    assert check.returncode == 2 and key in json.loads(check.stdout)["hosts"]["gpu"]["error"]


# ---------------------------------------------------------------- the rules, pure


def test_the_rules_follow_what_execve_and_open_refuse() -> None:
    assert argv_problem(["python3", "-c", "pass"]) is None
    assert "word 3" in (argv_problem(["a", "b", "c\0"]) or "")
    assert env_problem({"A": "1", "B_2": "x=y"}) is None  # '=' in a value is fine
    assert "empty name" in (env_problem({"": "1"}) or "")
    assert "contains '='" in (env_problem({"A=B": "1"}) or "")
    assert "NUL" in (env_problem({"A\0": "1"}) or "")
    assert "NUL" in (env_problem({"A": "1\0"}) or "")
    assert path_problem("/srv/a b/c.py") is None and "NUL" in (path_problem("/srv/a\0") or "")
    assert headers_problem({"Authorization": "Bearer x"}) is None
    assert headers_problem({"X-A": "a\r\nX-Injected: 1"}) is not None
    assert headers_problem({"Bad Name": "1"}) is not None


def test_the_first_unusable_value_is_named_by_its_own_key() -> None:
    values = [HostValue(("server", "flags", "--a"), "argv", ["--a", "1"]),
              HostValue(("server", "command"), "argv", None),
              HostValue(("server", "env", "X"), "env", {"X": "a\0"}),
              HostValue(("server", "workdir"), "path", "/x\0")]
    found = first_problem(values)
    assert found is not None and found[0].loc == ("server", "env", "X")
