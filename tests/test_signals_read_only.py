"""The signal table's row "Ctrl-C in a read-only command (`status`, `history`, `lint`,
`--list-hosts`)": one line, exit 1, the JSON report with ``--json``; aborts nothing.

Two ways to send the Ctrl-C, neither a race the test must win:

- held: the helper's interpreter on the host is a wrapper that waits for a file before it
  starts the helper (a fake ``python`` in the inventory, a fault from outside orch), so
  ``status`` and ``history`` are certainly reading the host when the signal comes. Then the
  host is looked at: the same files with the same bytes, the same server, healthy.
- at issue 21's offsets: T + 0.02, 0.1, 0.5 and 1 s, where T is what a bare ``python -c
  pass`` takes here (measured first), for all four commands. Where the signal lands is not
  known: the run is either interrupted (the row's answer) or it had already finished (its
  usual answer), and nothing else — never a traceback, never two reports.

The real ``orch`` console script in a subprocess, stdout and stderr through pipes, 80 columns.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import INTERRUPTED_REPORT
from tests.fixtures.sandbox import SHIPPED_SPEC, Sandbox, health_status, quick_stability, wait_until
from tests.test_ctrl_c_early import (
    DELAYS,
    bare_start,
    before_orch,
    orch_command,
    sigint_after_start,
)

LINE = "orch: error: interrupted"
"""The one line of an interrupted run, on stderr."""

COMMANDS = {
    "status": ["status", "--host", "gpu"],
    "history": ["history", "--host", "gpu"],
    "lint": ["lint", "playbooks/speculative-disable.yaml"],
    "list-hosts": ["deploy", "--list-hosts", "--host", "all"],
}
CONTACTS_A_HOST = {"status", "history"}


def command_line(box: Sandbox, command: str, *extra: str) -> list[str]:
    args = [*orch_command(), *COMMANDS[command], *extra]
    if command in CONTACTS_A_HOST:
        args += ["--ssh-config", str(box.sshd.ssh_config)]
    return args


def start(box: Sandbox, command: str, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, COLUMNS="80", NO_COLOR="1")
    return subprocess.Popen(command_line(box, command, *extra), cwd=box.root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ended(proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def assert_interrupted(got: subprocess.CompletedProcess[str], as_json: bool, printed_first: str = "") -> None:
    """The row's answer: exit 1, stderr ending in exactly one line, and with ``--json`` one
    report (exit_code 1, ``interrupted: true``) and nothing else on stdout.

    ``printed_first``: the usual run's stderr, when the signal may come after the command
    printed some of it (``--list-hosts --json`` writes its table to stderr, then its report
    to stdout): before the error line there may be whole lines of its start, nothing else."""
    said = f"exit {got.returncode}\n--- stdout:\n{got.stdout}--- stderr:\n{got.stderr}"
    assert got.returncode == 1, said
    assert got.stderr.endswith(LINE + "\n"), said  # the line last: no traceback after it
    before = got.stderr[: -len(LINE) - 1]
    assert before == "" or before.endswith("\n"), said  # the error on a line of its own
    assert printed_first.startswith(before), said  # no blank line, nothing but its own
    if as_json:
        assert json.loads(got.stdout) == INTERRUPTED_REPORT, said


def state_files(state_dir: Path) -> dict[str, str]:
    """Every file under the host's state dir, by its sha256 (a read must change none)."""
    if not state_dir.exists():
        return {}
    return {str(p.relative_to(state_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(state_dir.rglob("*")) if p.is_file()}


def held_python(box: Sandbox) -> tuple[Path, Path]:
    """A ``python`` for the host that says it was started (a file ``held.PID``) and starts
    the real one only once ``go`` exists: the helper, and so the read, waits for the test.
    It gives up after about 4 minutes (a test that failed half-way leaves nothing behind)."""
    marks = box.root / "held"
    marks.mkdir()
    wrapper = box.root / "held-python"
    wrapper.write_text("#!/bin/sh\n"
                       f'touch "{marks}/held.$$"\n'
                       "n=0\n"
                       f'while [ ! -e "{marks}/go" ]; do\n'
                       "  n=$((n + 1)); [ $n -gt 4800 ] && exit 1; sleep 0.05\n"
                       "done\n"
                       f'exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, marks


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ctrl_c_in_a_read_only_command_row_while_reading_the_host(sandbox: Sandbox) -> None:
    """``status`` and ``history`` (with and without ``--json``) held while they read the
    host: one line, exit 1, the report; the host's records and server untouched."""
    # the story, stable for 0.2 s, as the sandbox's own: each restart here waits it out
    sandbox.root.joinpath("playbooks", "speculative-disable.yaml").write_text(quick_stability(SHIPPED_SPEC, "0.2s"))
    sandbox.start_by_hand()
    sandbox.orch("deploy", "--host", "gpu", "speculative-disable", check_codes=(0,))
    server = sandbox.server_pid()
    before = state_files(sandbox.state_dir)
    assert before, "the deploy left records to compare"
    wrapper, marks = held_python(sandbox)
    sandbox.write_inventory(python=str(wrapper))
    try:
        for command in ("status", "history"):
            for extra in ([], ["--json"]):
                seen = set(marks.glob("held.*"))
                proc = start(sandbox, command, *extra)
                held = wait_until(lambda seen=seen: set(marks.glob("held.*")) - seen,
                                  f"{command}'s helper to be started")
                pid = int(next(iter(held)).name.split(".", 1)[1])
                proc.send_signal(signal.SIGINT)
                got = ended(proc)
                assert_interrupted(got, as_json=bool(extra))
                # aborts nothing: the held helper, let go, finds no controller and ends by itself
                (marks / "go").touch()
                wait_until(lambda pid=pid: not alive(pid), "the helper left behind to end")
                (marks / "go").unlink()
    finally:
        (marks / "go").touch()  # a failed assertion leaves no helper waiting
    assert state_files(sandbox.state_dir) == before
    assert sandbox.server_pid() == server and health_status(sandbox.port) == 200


@pytest.mark.parametrize("command", list(COMMANDS))
def test_ctrl_c_in_a_read_only_command_row_at_the_issue_offsets(sandbox: Sandbox, command: str) -> None:
    """SIGINT at T + 0.02, 0.1, 0.5 and 1 s: interrupted (the row) or already finished (its
    usual answer, as a run without the signal gives it); never anything else."""
    usual = {flag: subprocess.run(command_line(sandbox, command, *flag), cwd=sandbox.root, capture_output=True,
                                  text=True, env=dict(os.environ, COLUMNS="80", NO_COLOR="1"), timeout=120)
             for flag in ((), ("--json",))}
    assert usual[()].returncode == 0 and "interrupted" not in usual[()].stdout + usual[()].stderr, usual
    t = bare_start()
    for delay in DELAYS:
        for flag in ((), ("--json",)):
            for attempt in range(5):  # a signal inside CPython's own start-up: again, a start later
                proc = start(sandbox, command, *flag)
                sigint_after_start(proc, t * (1 + attempt) + delay)
                got = ended(proc)
                if not before_orch(got.stdout + got.stderr):
                    break
            else:
                raise AssertionError(f"every SIGINT at T + {delay} landed in the interpreter's start-up")
            said = f"T + {delay} {flag}: exit {got.returncode}\n{got.stdout}{got.stderr}"
            assert "Traceback" not in said and "Fatal Python error" not in said, said
            if LINE in got.stderr:
                assert_interrupted(got, as_json=bool(flag), printed_first=usual[flag].stderr)
                continue
            assert got.returncode == usual[flag].returncode, said
            assert "interrupted" not in got.stdout + got.stderr, said
            if flag:
                assert json.loads(got.stdout)["exit_code"] == got.returncode, said
