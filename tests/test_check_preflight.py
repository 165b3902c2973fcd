"""``orch deploy --check`` runs the server's pre-flight against the staged files (issue 20 item 1).

Over the real sshd, with the real CLI and a hand-started stand-in server: the
built-in pre-flight runs the stand-in's own parser with ``python -B`` and an
import finder that reads each planned target from its staged copy, so what
only the patched files can reveal shows before anything is committed — a
second ``parser.add_argument`` of a flag the file already declares (argparse's
``conflicting option string``), a flag declared in ``arg_groups/fields/spec.py``
of the spec layout (parsed, or refused as not an int). A custom
``server.preflight`` runs only when it takes the map (``{{ staged_files }}`` or
``ORCH_STAGED``); otherwise ``--check`` says it was not run. After every
``--check`` the whole tree, its ``__pycache__`` included, is byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.standin import make_tree
from tests.fixtures.sandbox import SHIPPED_SPEC, Sandbox, quick_stability
from tests.fixtures.sshd import SshdServer, free_port

FLAG = "--speculative-disable-batch-threshold"

HEALTH = """\
health:
  base_url: "http://127.0.0.1:{{ port }}"
  timeout: 5m
  interval: 0.2s
  checks:
    - get: /health
"""

DUPLICATE = """\
name: duplicate
files:
  - path: "{{ sglang_root }}/srt/server_args.py"
    edits:
      # --tokenizer-path is declared by the unpatched file itself: no orch release knows it
      - content: |
          parser.add_argument("--tokenizer-path", type=str, help="a second declaration")
        after: '"--trust-remote-code"'
    validate: [python-syntax]
server:
  manager: process
""" + HEALTH


def tree_digest(tree: Path) -> dict[str, str]:
    """Every file and directory under ``tree`` (``__pycache__`` and hidden files included): its bytes' sha256."""
    out = {}
    for path in sorted(tree.rglob("*")):
        rel = str(path.relative_to(tree))
        out[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def started(box: Sandbox) -> Path:
    """The stand-in started by hand and every module of the tree compiled: the tree then holds a
    ``__pycache__`` of the unpatched files (a stale one for what ``--check`` stages)."""
    box.start_by_hand()
    tree = box.sglang_root.parent.parent
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree)], check=True, capture_output=True)
    assert (box.sglang_root / "srt" / "__pycache__").is_dir()
    assert any(p.name.startswith("server_args.") for p in (box.sglang_root / "srt" / "__pycache__").iterdir())
    return tree


def check(box: Sandbox, playbook: str, *args: str) -> tuple[int, dict, str]:
    proc = box.orch("deploy", "--check", "--json", "--host", "gpu", *args, playbook)
    report = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
    return proc.returncode, report.get("hosts", {}).get("gpu", {}), proc.stderr


def write(box: Sandbox, name: str, text: str) -> str:
    path = box.root / f"{name}.yaml"
    path.write_text(text)
    return str(path)


def with_preflight(command: str, name: str = "custom") -> str:
    """The story's playbook with a custom ``server.preflight``."""
    text = quick_stability(SHIPPED_SPEC).replace("name: speculative-disable\n", f"name: {name}\n", 1)
    anchor = "  manager: process\n"
    assert anchor in text
    return text.replace(anchor, anchor + f"  preflight: {json.dumps(command)}\n", 1)


@pytest.fixture
def spec_box(tmp_path: Path, sshd: SshdServer) -> Iterator[Sandbox]:
    root = make_tree(tmp_path / "box", layout="spec")
    box = Sandbox(tmp_path, sshd, free_port(), root, tmp_path / "state")
    box.write_inventory()
    try:
        yield box
    finally:
        box.stop_all()


# --------------------------------------------------------------------------- (a), (d)


def test_a_second_declaration_of_a_flag_the_file_declares_is_refused_by_argparse(sandbox: Sandbox) -> None:
    box = sandbox
    tree = started(box)
    before, pid = tree_digest(tree), box.server_pid()
    code, host, err = check(box, write(box, "duplicate", DUPLICATE))
    assert code == 2, err
    assert host["outcome"] == "failed" and host["preflight"] == "refused"
    assert "conflicting option string: --tokenizer-path" in host["error"], host["error"]
    assert host["error"].startswith("the pre-flight refused the new command line with the staged files (exit 1): ")
    assert host["error"].endswith("; nothing was changed (--check)")
    assert "\n" not in host["error"] and "Traceback" not in err
    assert tree_digest(tree) == before  # nothing staged, compiled or changed is left, __pycache__ as it was
    assert box.server_pid() == pid and not box.state_dir.exists()


def test_the_story_patch_passes_the_preflight_against_the_staged_file(sandbox: Sandbox) -> None:
    box = sandbox
    tree = started(box)
    before = tree_digest(tree)
    code, host, err = check(box, str(box.root / "playbooks" / "speculative-disable.yaml"))
    assert code == 0, err
    assert host["outcome"] == "planned" and host["preflight"] == "passed"
    assert "pre-flight: the server's parser accepts the new command line with the staged files" in err
    assert tree_digest(tree) == before
    # the same flag with a value its declaration (in the staged file only) refuses
    code, host, err = check(box, str(box.root / "playbooks" / "speculative-disable.yaml"), "--var", "threshold=many")
    assert code == 2, err
    assert host["preflight"] == "refused"
    assert f"argument {FLAG}: invalid int value: 'many'" in host["error"], host["error"]
    assert tree_digest(tree) == before


def test_a_flag_an_earlier_release_of_another_playbook_declared_is_refused_at_plan_time(sandbox: Sandbox) -> None:
    """The case in issue 20's Why: the shipped site.yaml's plain inserts after another playbook's release."""
    box = sandbox
    box.start_by_hand()
    provider = quick_stability(SHIPPED_SPEC).replace("name: speculative-disable\n", "name: provider\n", 1)
    proc = box.orch("deploy", "--host", "gpu", write(box, "provider", provider))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (release,) = json.loads((box.state_dir / "state.json").read_text())["applied"]
    tree = box.sglang_root.parent.parent
    before = tree_digest(tree)
    site = (Path(__file__).resolve().parents[1] / "playbooks" / "site.yaml").read_text()
    code, host, err = check(box, write(box, "site", site))
    assert code == 2, err
    assert f"{FLAG} is already declared by release {release} (playbook provider)" in host["error"], host["error"]
    assert "preflight" not in host  # refused by the plan: the pre-flight had nothing to judge
    assert tree_digest(tree) == before


# --------------------------------------------------------------------------- (c) the spec layout


def test_the_spec_layout_flag_in_arg_groups_is_read_from_its_staged_copy(spec_box: Sandbox) -> None:
    box = spec_box
    tree = started(box)
    spec = box.sglang_root / "srt" / "arg_groups" / "fields" / "spec.py"
    before = tree_digest(tree)
    playbook = str(Path(__file__).resolve().parents[1] / "playbooks" / "speculative-disable.yaml")
    code, host, err = check(box, playbook)
    assert code == 0, err
    assert host["files"] == [str(spec)]
    assert host["preflight"] == "passed"  # the unpatched spec.py has no such flag: only the staged one
    assert tree_digest(tree) == before
    code, host, err = check(box, playbook, "--var", "threshold=many")
    assert code == 2, err
    assert "invalid int value: 'many'" in host["error"], host["error"]
    assert tree_digest(tree) == before


# --------------------------------------------------------------------------- (e) custom pre-flights


def test_a_custom_preflight_that_ignores_the_map_is_not_run(sandbox: Sandbox) -> None:
    box = sandbox
    tree = started(box)
    before = tree_digest(tree)
    # it would refuse anything: not run, so --check passes and says so
    code, host, err = check(box, write(box, "custom", with_preflight("{{ python }} -c 'import sys; sys.exit(9)'")))
    assert code == 0, err
    assert host["outcome"] == "planned" and host["preflight"] == "not_checked"
    assert "pre-flight not run against the staged files" in host["notes"]
    assert "pre-flight not run against the staged files" in err
    assert tree_digest(tree) == before


AWARE = (
    "{{ python }} -c 'import json, os, sys; m = json.loads(sys.argv[1]); "
    "assert m == json.loads(os.environ[\"ORCH_STAGED\"]), \"env differs\"; "
    "assert all(os.path.isfile(v) and \".orch-staged-\" in v for v in m.values()), \"no staged copy\"; "
    "sys.exit(\"custom: refused \" + \" \".join(sorted(m)) if \"--refuse\" in sys.argv else 0)' "
    "{{ staged_files }} {{ argv }}"
)


def test_a_staged_aware_custom_preflight_gets_the_map(sandbox: Sandbox) -> None:
    box = sandbox
    tree = started(box)
    before = tree_digest(tree)
    code, host, err = check(box, write(box, "aware", with_preflight(AWARE)))
    assert code == 0, err
    assert host["preflight"] == "passed"
    assert tree_digest(tree) == before
    refusing = with_preflight(AWARE.replace("{{ argv }}", "--refuse {{ argv }}"), "refusing")
    code, host, err = check(box, write(box, "refusing", refusing))
    assert code == 2, err
    assert host["preflight"] == "refused"
    assert f"custom: refused {box.server_args}" in host["error"], host["error"]
    assert tree_digest(tree) == before


# --------------------------------------------------------------------------- the controller gone


def test_the_staged_copies_go_when_the_controller_dies_during_the_preflight(sandbox: Sandbox) -> None:
    """Kept while the pre-flight runs, removed by the helper once its controller is gone (kill -9)."""
    import signal

    from tests.fixtures.sandbox import wait_until

    box = sandbox
    tree = started(box)
    before = tree_digest(tree)
    mark = box.root / "preflight-running"
    slow = with_preflight(
        "{{ python }} -c 'import pathlib, sys, time; pathlib.Path(sys.argv[1]).write_text(sys.argv[2]); time.sleep(5)' "
        f"{mark} {{{{ staged_files }}}}", "slow")
    proc = box.start_orch("deploy", "--check", "--host", "gpu", write(box, "slow", slow))
    try:
        wait_until(mark.exists, "the pre-flight to start", timeout=120)
        copies = list(json.loads(mark.read_text()).values())
        assert copies and all(Path(c).is_file() for c in copies)  # kept until the pre-flight ran
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    wait_until(lambda: not any(Path(c).exists() for c in copies), "the helper to remove the staged copies", timeout=120)
    wait_until(lambda: tree_digest(tree) == before, "the tree to be as it was", timeout=60)
