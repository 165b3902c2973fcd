"""Issue 16 item 11: YAML nested 100,000 deep is a config error, not a RecursionError.

Through the real CLI: the playbook, the inventory and a ``--var`` value, each
with ``--json``; exit 2, one line naming the file and the line, the JSON
report complete, and nothing contacted (the inventory's one host is local).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.yamlsrc import MAX_DEPTH, load_yaml
from orchestrator.errors import ConfigError
from tests.fixtures.forkrun import run_orch
from tests.fixtures.sandbox import SHIPPED_SPEC

DEEP = 100_000


def orch(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="200", NO_COLOR="1")
    return run_orch([*args], cwd=cwd, env=env, timeout=240)


def report(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        return dict(json.loads(proc.stdout))
    except ValueError:
        raise AssertionError(f"no JSON report:\n{proc.stdout}\n{proc.stderr}") from None


def nested(levels: int) -> str:
    return "[" * levels + "1" + "]" * levels


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "inventory.yaml").write_text(
        "hosts:\n  box:\n    connection: local\n    state_dir: " + str(tmp_path / "state") + "\n")
    (tmp_path / "play.yaml").write_text(SHIPPED_SPEC)
    return tmp_path


def assert_refused_at(proc: subprocess.CompletedProcess[str], name: str, line: int) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stdout + proc.stderr
    got = report(proc)
    assert got["exit_code"] == 2 and got["hosts"] == {}
    assert f"{name}:{line}:" in got["error"] and f"more than {MAX_DEPTH} levels" in got["error"]
    assert "\n" not in got["error"]


def test_a_playbook_nested_100000_deep_is_refused_at_its_line(workdir: Path) -> None:
    (workdir / "play.yaml").write_text(SHIPPED_SPEC + "extra_nesting: " + nested(DEEP) + "\n")
    line = SHIPPED_SPEC.count("\n") + 1
    proc = orch(workdir, "deploy", "--check", "--host", "box", "--json", "play.yaml")
    assert_refused_at(proc, "play.yaml", line)
    assert not (workdir / "state").exists()


def test_an_inventory_nested_100000_deep_is_refused_at_its_line(workdir: Path) -> None:
    inv = workdir / "inventory.yaml"
    text = inv.read_text() + "    vars:\n      deep:\n\n        " + nested(DEEP) + "\n"
    inv.write_text(text)
    line = text[: text.index("[")].count("\n") + 1  # the line the nesting starts on, after a blank one
    proc = orch(workdir, "deploy", "--check", "--host", "box", "--json", "play.yaml")
    assert_refused_at(proc, "inventory.yaml", line)
    assert not (workdir / "state").exists()


def test_a_var_nested_60000_deep_is_refused_naming_the_var(workdir: Path) -> None:
    # 60,000: one argv word may not exceed 128 KiB (MAX_ARG_STRLEN)
    proc = orch(workdir, "deploy", "--check", "--host", "box", "--json", "--var", "t=" + nested(60_000),
                "play.yaml")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    got = report(proc)
    assert "--var t" in got["error"] and f"more than {MAX_DEPTH} levels" in got["error"]
    assert not (workdir / "state").exists()


def test_block_style_nesting_is_budgeted_too_and_the_budget_is_exact() -> None:
    ok = "".join("  " * i + f"k{i}:\n" for i in range(MAX_DEPTH - 1)) + "  " * (MAX_DEPTH - 1) + "k: 1\n"
    doc = load_yaml(ok, "ok.yaml")  # MAX_DEPTH mappings: accepted
    assert doc.line_of(tuple(f"k{i}" for i in range(MAX_DEPTH - 1)) + ("k",)) == MAX_DEPTH
    deeper = "".join("  " * i + f"k{i}:\n" for i in range(MAX_DEPTH)) + "  " * MAX_DEPTH + "k: 1\n"
    with pytest.raises(ConfigError) as info:
        load_yaml(deeper, "deep.yaml")
    assert info.value.file == "deep.yaml" and info.value.line == MAX_DEPTH + 1
