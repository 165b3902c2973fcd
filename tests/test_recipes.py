"""docs/SERVERS.md's recipes for the ``commands`` manager, as a user copies them.

The tmux recipe runs for real: over sshd, against the stand-in server in a
tmux session, a deploy, a flag the server's parser refuses (the pre-flight
stops it before the server is touched) and a rollback. systemd-run and Docker
are not on the test machines: their recipes are checked by ``orch lint``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.forkrun import run_orch
from tests.fixtures.sandbox import Sandbox, cmdline, get_json, health_status, sha256, wait_until

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "SERVERS.md"
FLAG = "--speculative-disable-batch-threshold"


def recipe(name: str) -> str:
    """The page's YAML block whose playbook is called ``name``."""
    for block in re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), re.S):
        if re.search(rf"^name: {re.escape(name)}$", block, re.M):
            return str(block)
    raise AssertionError(f"docs/SERVERS.md has no recipe named {name}")


def tmux_pane_pid(session: str) -> int | None:
    got = subprocess.run(["tmux", "display-message", "-p", "-t", f"={session}:", "#{pane_pid}"],
                         capture_output=True, text=True)
    return int(got.stdout) if got.returncode == 0 and got.stdout.strip().isdigit() else None


@pytest.fixture
def session() -> Iterator[str]:
    name = f"orchtest-{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(["tmux", "kill-session", "-t", f"={name}"], capture_output=True)


def test_tmux_recipe_deploys_refuses_a_bad_flag_and_rolls_back(sandbox: Sandbox, session: str) -> None:
    workdir = sandbox.sglang_root.parent
    log = sandbox.root / "tmux.log"
    text = recipe("sglang-in-tmux").replace("/opt/sglang/.venv/bin/python", sys.executable)
    # The recipe's commands as written; only its health waits are shorter than the page's
    # (polled every 0.2 s, stable for 1 s instead of the 5 s default), as for every deploy
    # of the suite: the deploy and the rollback each wait them out.
    assert "  interval: 1s\n" in text, "the recipe's health has no interval line to shorten"
    text = text.replace("  interval: 1s\n", "  interval: 0.2s\n  stable_for: 1s\n", 1)
    (sandbox.root / "tmux.yaml").write_text(text)
    values = ["--var", f"session={session}", "--var", f"workdir={workdir}", "--var", f"log={log}",
              "--var", f"port={sandbox.port}", "--var", "model=/models/standin"]
    original = sha256(sandbox.server_args)

    # The server as the user runs it: in the session, started by hand (no flag yet).
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-c", str(workdir),
                    f"exec {sys.executable} -m sglang.launch_server --model-path /models/standin "
                    f"--port {sandbox.port}"], check=True)
    wait_until(lambda: health_status(sandbox.port) == 200, "the hand-started server is healthy")
    first = tmux_pane_pid(session)
    assert first is not None and cmdline(first)[1:3] == ["-m", "sglang.launch_server"]

    deployed = sandbox.orch("deploy", "--host", "gpu", *values, "tmux.yaml")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    second = tmux_pane_pid(session)
    assert second is not None and second != first  # restarted through the recipe's stop and start
    assert cmdline(second)[-2:] == [FLAG, "32"]
    assert get_json(sandbox.port, "/get_server_info")["speculative_disable_batch_threshold"] == 32
    changed = sha256(sandbox.server_args)
    assert changed != original
    # the recipe's pipe-pane appends the server's output to its log
    wait_until(lambda: log.exists() and log.stat().st_size > 0, "the pane's output in the recipe's log")

    # A value the server's own parser refuses: the recipe's pre-flight stops it
    # after the commit and before the stop; the server is never touched.
    refused = sandbox.orch("deploy", "--host", "gpu", *values, "--var", "threshold=many", "tmux.yaml")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "invalid int value: 'many'" in refused.stdout + refused.stderr
    assert tmux_pane_pid(session) == second
    assert sha256(sandbox.server_args) == changed

    back = sandbox.orch("rollback", "--host", "gpu")
    assert back.returncode == 0, back.stdout + back.stderr
    assert sha256(sandbox.server_args) == original
    third = tmux_pane_pid(session)
    assert third is not None and third != second
    assert FLAG not in cmdline(third)
    assert health_status(sandbox.port) == 200


@pytest.mark.parametrize("name", ["sglang-under-systemd", "sglang-in-docker"])
def test_systemd_and_docker_recipes_pass_lint(tmp_path: Path, name: str) -> None:
    """Not run here (no systemd as PID 1, no Docker): lint renders every command of them."""
    playbook = tmp_path / f"{name}.yaml"
    playbook.write_text(recipe(name))
    (tmp_path / "inventory.yaml").write_text(
        "hosts:\n  gpu: {address: 127.0.0.1, vars: {sglang_root: /opt/sglang/python/sglang}}\n")
    proc = run_orch(["lint", str(playbook)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 playbook" in proc.stdout + proc.stderr

    # and lint would catch a broken one: an undefined variable in a server command
    broken = tmp_path / "broken.yaml"
    broken.write_text(recipe(name).replace("{{ port }}", "{{ prot }}", 1))
    bad = run_orch(["lint", str(broken)], cwd=tmp_path)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "prot" in bad.stdout + bad.stderr
