"""Ctrl-C at any moment of a run is one line, the signal table's exit code, and the JSON
report with ``--json`` — never a traceback (issue 21's table, row "Ctrl-C in the first
~0.15 s").

The test first measures T, what a bare ``python -c pass`` takes here, then sends SIGINT
to the real ``orch`` at T + 0.02, T + 0.1, T + 0.5 and T + 1 s: from inside the
interpreter's start-up and Click's import to the middle of talking to the host. Nothing
depends on where exactly the signal lands: every moment must give the same kind of answer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.sandbox import Sandbox

DELAYS = (0.02, 0.1, 0.5, 1.0)


def bare_start() -> float:
    """T: what a bare interpreter's start takes on this machine now (the slowest of five:
    on a busy machine, a signal sent before the interpreter itself is up would test Python's
    start-up, not orch's)."""
    times = []
    for _ in range(5):
        start = time.monotonic()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.monotonic() - start)
    return max(times)


def orch_command() -> list[str]:
    """The ``orch`` console script as a user runs it (installed beside the interpreter)."""
    script = Path(sys.executable).parent / "orch"
    assert script.is_file(), "the package is installed (pip install -e '.[test]'), its script with it"
    return [str(script)]


def catches_sigint(pid: int) -> bool:
    """Whether process ``pid`` has a handler for SIGINT (``SigCgt`` in ``/proc/PID/status``)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), "0")
    return bool(int(caught, 16) & (1 << (signal.SIGINT - 1)))


def sigint_after_start(proc: subprocess.Popen[str], after: float) -> None:
    """SIGINT ``after`` seconds once the interpreter has installed its SIGINT handler.

    Before that moment the default action kills the process without a word (exit -2):
    that is CPython's start-up, which no program can answer, and on a busy machine it
    can outlast T (a bare interpreter's start measured a moment earlier)."""
    deadline = time.monotonic() + 120
    while not catches_sigint(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(after)
    proc.send_signal(signal.SIGINT)


def interrupted_run(box: Sandbox, args: list[str], after: float) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="80", NO_COLOR="1")
    cmd = [*orch_command(), *args, "--ssh-config", str(box.sshd.ssh_config)]
    proc = subprocess.Popen(cmd, cwd=box.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    sigint_after_start(proc, after)
    out, err = proc.communicate(timeout=240)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def before_orch(said: str) -> bool:
    """The signal landed before any line of orch ran: in CPython's own start-up (site,
    runpy) or the console script's first import, where no program can answer it. No frame
    of the package is in the traceback then."""
    return ("Traceback" in said or "Fatal Python error" in said) and "orchestrator/" not in said


def interrupted_after(box: Sandbox, args: list[str], delay: float, t: float) -> subprocess.CompletedProcess[str]:
    """``interrupted_run`` at T + delay; when that moment fell inside the interpreter's own
    start-up (a busy machine starts it slowly), again a start later, up to five times."""
    for attempt in range(5):
        got = interrupted_run(box, args, t * (1 + attempt) + delay)
        if not before_orch(got.stdout + got.stderr):
            return got
    raise AssertionError(f"every SIGINT at T + {delay} landed in the interpreter's start-up")


@pytest.mark.parametrize("command", ["status", "deploy"])
def test_ctrl_c_at_any_moment_is_one_line_and_a_report(sandbox: Sandbox, command: str) -> None:
    sandbox.start_by_hand()
    t = bare_start()
    args = {"status": ["status", "--host", "gpu"],
            "deploy": ["deploy", "--host", "gpu", "speculative-disable"]}[command]
    for delay in DELAYS:
        for json_flag in ([], ["--json"]):
            got = interrupted_after(sandbox, args + json_flag, delay, t)
            said = got.stdout + got.stderr
            assert "Traceback" not in said and "KeyboardInterrupt" not in said, said
            # read-only: exit 1 (or 0/3 had it finished first); deploy: the signal table's codes
            allowed = {0, 1, 3} if command == "status" else {0, 1}
            assert got.returncode in allowed, (delay, json_flag, said)
            if got.returncode == 1:  # said once: the error line, or the host's outcome line
                human = (got.stderr if json_flag else said).splitlines()
                told = [line for line in human if "interrupted" in line]
                # said once; a deploy with its host at work also acknowledges at once (naming
                # what a second Ctrl-C does), before the host's outcome line says what it left
                acks = [line for line in told if "Ctrl-C again" in line]
                assert len(told) - len(acks) == 1 and len(acks) <= (1 if command == "deploy" else 0), (
                    delay, json_flag, human)
            if json_flag:
                report = json.loads(got.stdout)
                assert report["exit_code"] == got.returncode, said
        if command == "deploy":  # leave the next round a host without a release in progress
            box_state = sandbox.orch("status", "--host", "gpu")
            if "unfinished" in box_state.stdout:
                sandbox.orch("rollback", "--host", "gpu", check_codes=(0,))


def test_the_early_report_is_what_the_json_module_would_write() -> None:
    """Written out by hand (the json module may be half-imported when Ctrl-C comes): the same text."""
    import orchestrator

    report = {"exit_code": 1, "error": "interrupted", "hosts": {}, "interrupted": True}
    assert report == orchestrator.INTERRUPTED_REPORT
    assert json.dumps(report, indent=2, sort_keys=True) + "\n" == orchestrator.INTERRUPTED_JSON


CONVERTING = """\
import os, signal, sys, time
import orchestrator.cli.app as app
from orchestrator.cli.entry import main
def command(args):
    converted = False
    try:
        if {signal!r}:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)
    except KeyboardInterrupt:
        if {inside!r}:  # as zipfile's cleanup: an error of its own while the interrupt is handled
            raise ValueError("Can't close the ZIP file while there is an open writing handle")
        converted = True
    if converted or not {signal!r}:  # as pydantic-core: raised after, with no trace of the interrupt
        raise ValueError("SchemaError: Error building serializer: KeyboardInterrupt")
app.main = command
sys.argv = ["orch", "status", "--json"]
main()
"""


def converted_run(tmp_path: Path, *, signal: bool, inside: bool) -> subprocess.CompletedProcess[str]:
    """The real entry point, a real SIGINT (``signal``); only the command is a stand-in that turns
    the interrupt into an error of its own, inside the handler or after it, as libraries did."""
    script = tmp_path / "converting.py"
    script.write_text(CONVERTING.format(signal=signal, inside=inside))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("inside", [True, False], ids=["in-the-handler", "after-it"])
def test_a_ctrl_c_a_library_turned_into_its_own_error_is_still_one_line(tmp_path: Path, inside: bool) -> None:
    """Seen in the suite: a Ctrl-C inside zipfile's writer during an import made zipfile's
    ``__exit__`` raise ValueError; under a busy loop, a SIGINT while pydantic-core built a model's
    schema came out as its ``SchemaError`` with no ``KeyboardInterrupt`` in its context. Each run
    ended in that traceback, not in one line."""
    got = converted_run(tmp_path, signal=True, inside=inside)
    assert got.returncode == 1, got.stdout + got.stderr
    assert "Traceback" not in got.stderr and got.stderr.strip().splitlines() == ["orch: error: interrupted"]
    assert json.loads(got.stdout)["interrupted"] is True


def test_the_same_error_with_no_ctrl_c_is_not_taken_for_one(tmp_path: Path) -> None:
    """The check above can fail: an error of a run nobody interrupted is still shown as it is."""
    got = converted_run(tmp_path, signal=False, inside=False)
    assert "Traceback" in got.stderr and "SchemaError" in got.stderr and "interrupted" not in got.stdout


INSIDE_IMPORT = """\
import os, signal, sys, time
from orchestrator.cli.app import SIGINT_GATE
from orchestrator.cli.entry import ctrl_c
signal.signal(signal.SIGINT, ctrl_c if {which!r} == "entry" else SIGINT_GATE.handler)
signal.signal(signal.SIGTERM, SIGINT_GATE.terminate)
SIGINT_GATE.in_command = True
said = []
exec(compile('''
def locked_section(said):
    said.append("acquired")
    for signum in {signals!r}:
        os.kill(os.getpid(), getattr(signal, signum))
        for _ in range(1000):
            pass
    said.append("released")
''', {filename!r}, "exec"), globals())
try:
    locked_section(said)
    time.sleep(30)
    said.append("never answered")
except BaseException as e:
    said.append(type(e).__name__)
try:
    time.sleep(0.1)  # no answer is left waiting to go off later
except BaseException as e:
    said.append("late " + type(e).__name__)
if signal.getsignal(signal.SIGALRM) is not signal.SIG_DFL:
    said.append("SIGALRM left set")
print(",".join(said))
"""


def inside_import(tmp_path: Path, which: str, filename: str, signals: list[str]) -> list[str]:
    """What a section of ``filename`` that receives ``signals`` saw, in order (the script above)."""
    script = tmp_path / "inside_import.py"
    script.write_text(INSIDE_IMPORT.format(which=which, filename=filename, signals=signals))
    got = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0 and "Exception ignored" not in got.stderr, got.stderr
    return got.stdout.strip().split(",")


@pytest.mark.parametrize("which", ["gate", "entry", "sigterm"])
@pytest.mark.parametrize("filename", ["<frozen importlib._bootstrap>", "orchestrator/anything.py"],
                         ids=["inside-the-import-machinery", "elsewhere"])
def test_a_signal_inside_the_import_machinery_is_answered_once_it_is_out(
        tmp_path: Path, which: str, filename: str) -> None:
    """Seen once in CI: a Ctrl-C landed in importlib's ``_get_module_lock.<locals>.cb``, between
    its ``acquire_lock()`` and the ``try`` that releases it. The exception was printed as
    "Exception ignored" and dropped, the import lock stayed held, and the deploy hung on its
    next import in another thread. A handler must not raise in such a frame (its code's file is
    ``<frozen importlib._bootstrap>``): the section runs to its end and the answer comes after."""
    signals = ["SIGTERM"] if which == "sigterm" else ["SIGINT"]
    answer = "Terminated" if which == "sigterm" else "KeyboardInterrupt"
    expected = ["acquired", "released", answer] if filename.startswith("<frozen") else ["acquired", answer]
    assert inside_import(tmp_path, which, filename, signals) == expected


def test_two_signals_inside_the_import_machinery_are_answered_once_after_it(tmp_path: Path) -> None:
    """A Ctrl-C, then a SIGTERM, both inside the import machinery: one answer (the latest) once
    the section is done, none left to go off later, and SIGALRM's own handler put back."""
    got = inside_import(tmp_path, "gate", "<frozen importlib._bootstrap>", ["SIGINT", "SIGTERM"])
    assert got == ["acquired", "released", "Terminated"]


DROPPED = """\
import os, signal, sys, time
from orchestrator.cli.app import SIGINT_GATE
from orchestrator.interrupts import answer_dropped_interrupts
signal.signal(signal.SIGINT, SIGINT_GATE.handler)
signal.signal(signal.SIGTERM, SIGINT_GATE.terminate)
if {hooked!r}:
    answer_dropped_interrupts()
SIGINT_GATE.in_command = {in_command!r}
said = []
class Dropping:
    def __del__(self):
        said.append("in __del__")
        os.kill(os.getpid(), signal.{signum})
        for _ in range(1000):
            pass
        said.append("past the signal")  # only where the signal's answer did not raise
try:
    Dropping()  # freed at once: the signal's exception is raised inside its __del__
    time.sleep({wait})
    said.append("not answered")
except BaseException as e:
    said.append(type(e).__name__)
said.append("pending" if SIGINT_GATE.pending else "not pending")
print(",".join(said))
"""


def dropped_run(tmp_path: Path, signum: str, *, hooked: bool = True, in_command: bool = True,
                wait: float = 30) -> tuple[list[str], str]:
    """What a ``__del__`` that receives ``signum`` saw (the script above), and stderr."""
    script = tmp_path / "dropped.py"
    script.write_text(DROPPED.format(hooked=hooked, in_command=in_command, signum=signum, wait=wait))
    got = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    return got.stdout.strip().split(","), got.stderr


@pytest.mark.parametrize(("signum", "answer"), [("SIGINT", "KeyboardInterrupt"), ("SIGTERM", "Terminated")])
def test_an_interrupt_the_interpreter_would_drop_is_answered_a_moment_later(
        tmp_path: Path, signum: str, answer: str) -> None:
    """Seen once in CI: a Ctrl-C in ``orch lint --json`` was raised where CPython could not pass
    it on (pydantic-core using a field's ``pattern``): printed as "Exception ignored in: '^\\\\S+$'",
    dropped, and the run went on to say "ok", exit 0. The interrupt is signalled again a moment
    later, where the command's handler answers it: no traceback, and the run ends as interrupted."""
    said, err = dropped_run(tmp_path, signum)
    assert "Exception ignored" not in err and "Traceback" not in err, err
    assert said == ["in __del__", answer, "not pending"], said


def test_a_dropped_interrupt_after_the_command_is_noted_not_raised(tmp_path: Path) -> None:
    """Outside a command (Click parsing, or the command has returned) the signal's answer is
    the gate's: noted as pending, not raised into Click or the report being written."""
    said, err = dropped_run(tmp_path, "SIGINT", in_command=False, wait=1)
    assert "Exception ignored" not in err and "Traceback" not in err, err
    assert said == ["in __del__", "past the signal", "not answered", "pending"], said


def test_without_the_hook_the_interrupt_is_dropped(tmp_path: Path) -> None:
    """What the hook is for: without it, the same interrupt is printed as ignored and lost."""
    said, err = dropped_run(tmp_path, "SIGINT", hooked=False, wait=1)
    assert "Exception ignored" in err and "KeyboardInterrupt" in err, err
    assert said == ["in __del__", "not answered", "not pending"], said


def test_sigint_waits_for_the_interpreters_handler() -> None:
    """``sigint_after_start`` never hands SIGINT to an interpreter still in its own start-up:
    a program without a handler is told apart from Python with its ``KeyboardInterrupt``."""
    plain = subprocess.Popen(["sleep", "60"])
    try:
        assert not catches_sigint(plain.pid)
    finally:
        plain.kill()
        plain.wait()
    python = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    sigint_after_start(python, 0.0)
    _, err = python.communicate(timeout=60)
    # Python's handler answered: its traceback. Landing in the rest of the interpreter's
    # start, the exit is 1; landing in the program's read (a machine slow to get there),
    # CPython prints it and ends by SIGINT (-2). The default action, before any handler,
    # kills with no word at all.
    assert err.rstrip().endswith("KeyboardInterrupt"), (python.returncode, err)
    assert python.returncode in (1, -signal.SIGINT), (python.returncode, err)
