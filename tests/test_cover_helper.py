"""The coverage plug-in's mapping: the names the helper runs under are agent.py's.

The figure CI prints (and fails under 85 %) depends on it: a copy it does not
claim is not measured at all, and one it claimed wrongly would count another
file's lines as the helper's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.shell import agent_client
from tests.cover_helper import HELPER_SOURCE, HelperCopies


def test_the_plug_in_maps_onto_the_source_the_controller_sends() -> None:
    assert Path(HELPER_SOURCE).read_text(encoding="utf-8") == agent_client.AGENT_SOURCE


@pytest.mark.parametrize("name", [
    "/root/orch-agent",  # the source sent as a string, compiled in the login user's home
    f"/var/lib/orch/helper/orch_helper_{agent_client.HELPER_ID}.py",  # the copy a host keeps
    HELPER_SOURCE,
])
def test_the_helper_s_names_are_claimed_as_agent_py(name: str) -> None:
    tracer = HelperCopies().file_tracer(name)
    assert tracer is not None and tracer.source_filename() == HELPER_SOURCE


@pytest.mark.parametrize("name", [
    "/var/lib/orch/releases/r1/files/orch_helper_x.py",  # not in a helper/ directory
    "/srv/app/helper/other.py",
    str(Path(HELPER_SOURCE).with_name("agent_client.py")),
    "/srv/orch-agent.py",
])
def test_other_files_are_left_to_coverage(name: str) -> None:
    assert HelperCopies().file_tracer(name) is None
