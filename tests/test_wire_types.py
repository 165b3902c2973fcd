"""What crosses the wire is type-checked: a wrong op name or field fails here, before a host sees it.

The requests, replies, events and records (``orchestrator/host/protocol*.py``,
``records.py``), the controller's events and request builders (``core/events.py``,
``shell/ops.py``, ``shell/program.py``) and the client that sends them (``shell/agent_client.py``) are checked by mypy, strictly enough that
a builder passing a field its request does not have, or a reply read by a name it
does not carry, is an error. Since 0.8.3 mypy checks the whole package (``[tool.mypy]`` in
pyproject.toml, the stand-in's copied server trees excluded): the wire modules are the ones
that must never be left out of it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
WIRE = [
    "orchestrator/host/protocol.py",
    "orchestrator/host/protocol_runner.py",
    "orchestrator/host/protocol_events.py",
    "orchestrator/host/protocol_steps.py",
    "orchestrator/host/protocol_replies.py",
    "orchestrator/host/protocol_verdict.py",
    "orchestrator/host/records.py",
    "orchestrator/host/restore_plan.py",
    "orchestrator/host/values.py",
    "orchestrator/core/events.py",
    "orchestrator/core/endings.py",
    "orchestrator/shell/ops.py",
    "orchestrator/shell/program.py",
    "orchestrator/shell/agent_client.py",
]


def test_mypy_finds_nothing_in_the_package_and_checks_every_wire_module(tmp_path: Path) -> None:
    run = subprocess.run(  # the files: pyproject.toml's [tool.mypy]
        [sys.executable, "-m", "mypy", "--verbose", "--cache-dir", str(tmp_path / "cache")],
        cwd=CHECKOUT, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stdout
    checked = set(re.findall(r"Found source: +BuildSource\(path='([^']+)'", run.stderr))
    assert len(checked) > 100, run.stderr[-2000:]
    assert not [m for m in WIRE if m not in checked], sorted(checked)


def test_mypy_catches_a_request_built_with_a_field_it_does_not_have(tmp_path: Path) -> None:
    """The check above can fail: a builder that names a field its request lacks is an error."""
    bad = tmp_path / "bad_builder.py"
    bad.write_text(
        "from orchestrator.host.protocol import Read\n"
        "Read(paths=['/x'], with_data=True, no_such_field=1)\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "--no-error-summary",
         "--cache-dir", str(tmp_path / "cache"), str(bad)],
        cwd=CHECKOUT, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 1 and "no_such_field" in run.stdout, run.stdout + run.stderr
