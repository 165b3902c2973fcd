"""Words a person reads are said once, at one level (issue 21's table, row "layout note").

The real ``orch`` in a subprocess over real sshd, against the stand-in server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.sandbox import SHIPPED_SPEC, Sandbox, quick_stability
from tests.fixtures.sshd import SshdServer
from tests.test_deploy_layouts import sandbox_for

# The story's playbook with a 0.2 s stability window instead of the shipped 5 s:
# the deploy below waits it out, and the note is said before any of it.
PLAYBOOK = "story.yaml"


@pytest.fixture
def spec_box(tmp_path: Path, sshd: SshdServer) -> Iterator[Sandbox]:
    box = sandbox_for(tmp_path, sshd, "spec")
    (tmp_path / PLAYBOOK).write_text(quick_stability(SHIPPED_SPEC, "0.2s"))
    try:
        yield box
    finally:
        box.stop_all()


def test_the_layout_note_is_a_note_in_check_and_in_deploy(spec_box: Sandbox) -> None:
    spec_box.start_by_hand()
    check = spec_box.orch("deploy", "--check", "--host", "gpu", PLAYBOOK)
    assert check.returncode == 0, check.stdout + check.stderr
    deploy = spec_box.orch("deploy", "--host", "gpu", PLAYBOOK)
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    for run in (check, deploy):
        said = run.stdout + run.stderr
        notes = [line for line in said.splitlines() if "add_flag" in line and "uses" in line]
        assert notes, said
        assert all("note:" in line and "warning:" not in line for line in notes), notes


STARTING = """\
name: starting
vars: {{port: {port}}}
files: []
server:
  manager: process
  command: "{{{{ python }}}} -m sglang.launch_server --model-path {{{{ model }}}} --port {{{{ port }}}}"
  python: {python}
  env: {{PYTHONPATH: "{pythonpath}", PYTHONDONTWRITEBYTECODE: "1"}}
  flags: {{"--speculative-accept-threshold-acc": 0.5}}
health:
  base_url: "http://127.0.0.1:{{{{ port }}}}"
  timeout: 2m
  interval: 0.2s
  stable_for: 0.5s
  checks: [{{get: /health}}]
"""


def test_a_stopped_server_is_started_not_listed_as_flag_changes(sandbox: Sandbox) -> None:
    import sys

    playbook = sandbox.root / "starting.yaml"
    playbook.write_text(STARTING.format(port=sandbox.port, python=sys.executable,
                                        pythonpath=sandbox.sglang_root.parent))
    got = sandbox.orch("deploy", "--host", "gpu", str(playbook))
    assert got.returncode == 0, got.stdout + got.stderr
    said = got.stdout + got.stderr
    assert "no server running: starting " in said and "--speculative-accept-threshold-acc 0.5" in said
    assert "flag command:" not in said and "flag -m:" not in said and "(absent) ->" not in said, said


def test_an_unhealthy_server_is_called_not_healthy_once(sandbox: Sandbox) -> None:
    # the story, stable for 0.2 s, as the sandbox's own: each restart here waits it out
    sandbox.root.joinpath("playbooks", "speculative-disable.yaml").write_text(quick_stability(SHIPPED_SPEC, "0.2s"))
    sandbox.start_by_hand()
    assert sandbox.orch("deploy", "--host", "gpu", "speculative-disable").returncode == 0
    sandbox.stop_all()
    got = sandbox.orch("status", "--host", "gpu")
    assert got.returncode == 3
    health = [line for line in got.stdout.splitlines() if "health:" in line]
    assert health and all(line.lower().count("not healthy") == 1 for line in health), got.stdout


def test_a_restore_with_no_file_says_files_to_restore_none(sandbox: Sandbox) -> None:
    from tests.test_cli import BAD_FLAG

    sandbox.start_by_hand()
    (sandbox.root / "bad-flag.yaml").write_text(BAD_FLAG)
    got = sandbox.orch("deploy", "--host", "gpu", "bad-flag.yaml")
    assert got.returncode == 1, got.stdout + got.stderr
    said = got.stdout + got.stderr
    # said once, by the step line; the host's own progress line is for the live line and -v
    assert said.count("no file to restore") == 1 and "files: none" not in said, said
    verbose = sandbox.orch("deploy", "--host", "gpu", "-v", "bad-flag.yaml")
    assert verbose.returncode == 1, verbose.stdout + verbose.stderr
    said = verbose.stdout + verbose.stderr
    assert "files to restore: none" in said and "files: none" not in said, said
