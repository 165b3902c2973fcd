"""Words a person reads are said once, at one level (issue 21's table, row "layout note").

The real ``orch`` in a subprocess over real sshd, against the stand-in server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.sandbox import Sandbox
from tests.fixtures.sshd import SshdServer
from tests.test_deploy_layouts import PLAYBOOK, sandbox_for


@pytest.fixture
def spec_box(tmp_path: Path, sshd: SshdServer) -> Iterator[Sandbox]:
    box = sandbox_for(tmp_path, sshd, "spec")
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
