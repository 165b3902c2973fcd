"""Issue 21's table, rows "host failures" and "after a double Ctrl-C".

- host failures: a host's warning and failure lines (its ``warning:`` lines, the server log
  that explains a failure, its outcome line and error) on stderr, its step lines on stdout,
  each flushed as written, so that ``2>&1`` shows them in the order they happened; with
  ``--json`` stdout holds only the report.
- after a double Ctrl-C: the live (spinner) line is erased on every exit — a run that ends
  well, one that fails and is rolled back, a first and a second Ctrl-C — so the screen
  keeps no spinner for the shell's prompt to join. Read from a pseudo-terminal of 80
  columns whose bytes are replayed on a small screen model (``Screen``).

The real ``orch`` in a subprocess over real sshd, against the stand-in server.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest

from tests.fixtures.sandbox import Sandbox, wait_until
from tests.test_cli import CRASHING, run

SPINNER = set("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")
"""The frames of Rich's ``dots`` spinner (``console.status``): the live line's mark."""


# ------------------------------------------------------------------ host failures


def test_host_failures_row_warnings_and_failures_on_stderr_steps_on_stdout(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    (sandbox.root / "crashing.yaml").write_text(CRASHING)
    crash = run(sandbox, "deploy", "--host", "gpu", "crashing.yaml")
    assert crash.returncode == 1, crash.stdout + crash.stderr
    out, err = crash.stdout.splitlines(), crash.stderr.splitlines()
    # the failure: its warning, the log that explains it, the outcome and its error
    assert any(line.startswith("gpu warning: deploy failed: ") for line in err), crash.stderr
    assert "  | RuntimeError: STANDIN_CRASH_AT_START=1: the server fails at start" in err
    assert any(line.startswith("gpu: rolled_back") for line in err), crash.stderr
    assert "  server exited during start (code 1)" in err
    # the steps: on stdout, and none of the failure's lines there
    assert any(line.startswith("gpu backed up ") for line in out), crash.stdout
    assert any(line.startswith("gpu rolled back: ") for line in out), crash.stdout
    assert not [line for line in out if "warning:" in line or line.startswith(("gpu: ", "  | "))], crash.stdout
    assert not [line for line in err if line.startswith("gpu backed up ")], crash.stderr


def test_host_failures_row_2_to_1_keeps_the_order_things_happened_in(sandbox: Sandbox) -> None:
    """stdout and stderr into one pipe: step, failure, step, failure lines interleave as they
    happened (each line flushed as written, not stdout's block buffer at exit)."""
    sandbox.start_by_hand()
    # the story's patch, whose new server dies at start: a read-back view (plain lines) before it
    story = (sandbox.root / "playbooks" / "speculative-disable.yaml").read_text()
    crash = story.replace("  manager: process\n", '  manager: process\n  env: {STANDIN_CRASH_AT_START: "1"}\n', 1)
    assert crash != story
    (sandbox.root / "crashing.yaml").write_text(crash)
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env["COLUMNS"] = "80"
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "deploy", "--host", "gpu", "crashing.yaml",
                           "--ssh-config", str(sandbox.sshd.ssh_config)],
                          cwd=sandbox.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=240)
    assert proc.returncode == 1, proc.stdout
    lines = proc.stdout.splitlines()

    def first(prefix: str) -> int:
        found = [n for n, line in enumerate(lines) if line.startswith(prefix)]
        assert found, f"no line starting {prefix!r} in:\n{proc.stdout}"
        return found[0]

    backed_up = first("gpu backed up ")            # stdout
    viewed = first("❱ ")                            # stdout: the read-back view, written as plain lines
    failed = first("gpu warning: deploy failed: ")  # stderr
    restored = first("gpu rolled back: ")          # stdout
    outcome = first("gpu: rolled_back")            # stderr
    assert backed_up < viewed < failed < restored < outcome, proc.stdout


def test_host_failures_row_with_json_stdout_is_only_the_report(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    (sandbox.root / "crashing.yaml").write_text(CRASHING)
    crash = run(sandbox, "deploy", "--host", "gpu", "crashing.yaml", "--json")
    assert crash.returncode == 1, crash.stdout + crash.stderr
    report = json.loads(crash.stdout)  # the whole of stdout: one JSON document
    assert report["hosts"]["gpu"]["outcome"] == "rolled_back"
    err = crash.stderr.splitlines()
    assert any(line.startswith("gpu backed up ") for line in err)  # the steps too: human text
    assert any(line.startswith("gpu warning: deploy failed: ") for line in err)
    assert any(line.startswith("gpu: rolled_back") for line in err)


# ------------------------------------------------------------ after a double Ctrl-C


class Screen:
    """The text a terminal shows after ``feed``: enough of a VT100 for Rich's output
    (printable text, CR, LF, BS, erase in line, cursor up/down/column; colours and cursor
    visibility ignored). Lines are as wide as the terminal; text past it wraps."""

    CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")
    OSC = re.compile(r"\x1b\][^\x07]*\x07")

    def __init__(self, columns: int = 80) -> None:
        self.columns = columns
        self.rows: list[list[str]] = [[]]
        self.row = 0
        self.col = 0

    def _line(self) -> list[str]:
        while len(self.rows) <= self.row:
            self.rows.append([])
        return self.rows[self.row]

    def _put(self, ch: str) -> None:
        if self.col >= self.columns:
            self.row, self.col = self.row + 1, 0
        line = self._line()
        while len(line) <= self.col:
            line.append(" ")
        line[self.col] = ch
        self.col += 1

    def _control(self, args: str, code: str) -> None:
        n = int(args) if args.isdigit() else None
        line = self._line()
        if code == "K":  # erase in line: 0 (default) to its end, 1 to the cursor, 2 all of it
            if n == 2:
                line.clear()
            elif n == 1:
                line[: self.col] = [" "] * min(self.col, len(line))
            else:
                del line[self.col:]
        elif code == "A":
            self.row = max(0, self.row - (n or 1))
        elif code == "B":
            self.row += n or 1
        elif code == "G":
            self.col = (n or 1) - 1
        elif code == "J" and n in (None, 0):
            del line[self.col:]
            del self.rows[self.row + 1:]

    def feed(self, text: str) -> None:
        text = self.OSC.sub("", text)
        pos = 0
        for m in self.CSI.finditer(text):
            self._text(text[pos:m.start()])
            self._control(m.group(1), m.group(2))
            pos = m.end()
        self._text(text[pos:])

    def _text(self, text: str) -> None:
        for ch in text:
            if ch == "\r":
                self.col = 0
            elif ch == "\n":
                self.row, self.col = self.row + 1, 0
            elif ch == "\b":
                self.col = max(0, self.col - 1)
            elif ch == "\x1b" or ord(ch) < 32:
                continue
            else:
                self._put(ch)

    def lines(self) -> list[str]:
        """The screen's lines, blank ones at its end left out."""
        lines = ["".join(line).rstrip() for line in self.rows]
        while lines and not lines[-1]:
            lines.pop()
        return lines


def test_the_screen_model_keeps_an_unerased_spinner_and_drops_an_erased_one() -> None:
    """The model the Ctrl-C tests read the screen with: a frame redrawn after CR and
    erase-line is gone; a line printed after a frame without erasing joins it."""
    erased = Screen()
    erased.feed("step one\r\n⠋ gpu waiting\r\x1b[2K⠙ gpu waiting\r\x1b[2Korch: error: interrupted\r\n")
    assert erased.lines() == ["step one", "orch: error: interrupted"]
    left = Screen()
    left.feed("step one\r\n⠋ gpu waiting\x1b[?25lorch: error: interrupted\r\n")
    assert left.lines()[1] == "⠋ gpu waitingorch: error: interrupted"
    up = Screen()
    up.feed("a\r\nb\r\n\x1b[1A\x1b[2K\x1b[1A\x1b[2Kc")
    assert up.lines() == ["c"]


class PtyRun:
    """``orch ARGS`` under a pseudo-terminal of 80 columns; what it wrote, read as it comes."""

    def __init__(self, box: Sandbox, *args: str, columns: int = 80) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
        env["TERM"] = "xterm-256color"
        cmd = [sys.executable, "-m", "orchestrator", *args, "--ssh-config", str(box.sshd.ssh_config)]
        self.proc = subprocess.Popen(cmd, cwd=box.root, env=env, stdin=slave, stdout=slave, stderr=slave,
                                     start_new_session=True)
        os.close(slave)
        self.columns = columns
        self.master = master
        self.chunks: list[bytes] = []
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: the child side closed
                break
            if not data:
                break
            with self.lock:
                self.chunks.append(data)

    def text(self) -> str:
        with self.lock:
            return b"".join(self.chunks).decode("utf-8", "replace")

    def spinner_seen(self) -> bool:
        return bool(SPINNER & set(self.text()))

    def ctrl_c(self) -> None:
        """What a terminal's Ctrl-C does: SIGINT to the foreground process (orch)."""
        self.proc.send_signal(signal.SIGINT)

    def finish(self, timeout: float = 240) -> tuple[int, list[str], str]:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("orch did not end; the end of what it wrote:\n" + self.text()[-3000:]) from None
        self.reader.join(30)
        os.close(self.master)
        screen = Screen(self.columns)
        raw = self.text()
        screen.feed(raw)
        return code, screen.lines(), raw


def waiting_playbook(box: Sandbox, ready: Path, timeout: str = "5m") -> Path:
    """A restart whose new server turns healthy only once ``ready`` exists: the deploy's
    health wait (the spinner) lasts until the test says so."""
    text = CRASHING.replace("name: crashing", "name: waiting").replace(
        'env: {STANDIN_CRASH_AT_START: "1"}', f'env: {{STANDIN_READY_FILE: "{ready}"}}').replace(
        "timeout: 5m", f"timeout: {timeout}")
    assert str(ready) in text and f"timeout: {timeout}" in text
    path = box.root / "waiting.yaml"
    path.write_text(text)
    return path


def no_spinner_left(lines: list[str], raw: str) -> None:
    shown = [line for line in lines if SPINNER & set(line)]
    assert not shown, f"a spinner line stays on the screen: {shown}\n--- screen:\n" + "\n".join(lines)
    assert "\x1b[?25h" in raw[raw.rfind("\x1b[?25l"):], "the cursor is shown again after the live line"


@pytest.mark.parametrize("end", ["normal", "error", "first ctrl-c", "second ctrl-c"])
def test_after_a_double_ctrl_c_row_the_live_line_is_erased_on_every_exit(sandbox: Sandbox, end: str) -> None:
    """Each way a deploy ends while its live line (the health wait's spinner) is on screen:
    the new server turns healthy (exit 0); its health timeout passes and the host is rolled
    back (exit 1); a Ctrl-C, after which the host is rolled back (exit 1); a Ctrl-C, then a
    second one while the rollback's own health wait spins (orch stops waiting: exit 3, the
    watchdog finishes). The restored server waits for ``ready`` too (the restore starts it
    with the environment the release recorded), so the test decides when that wait ends."""
    sandbox.start_by_hand()
    ready = sandbox.root / "ready"
    playbook = waiting_playbook(sandbox, ready, timeout="3s" if end == "error" else "5m")
    run_ = PtyRun(sandbox, "deploy", "--host", "gpu", str(playbook))
    wait_until(run_.spinner_seen, "the live line of the health wait")
    if end == "normal":
        ready.write_text("")
    elif end == "error":
        wait_until(lambda: "rolling back" in run_.text(), "the health timeout")
        ready.write_text("")
    else:
        run_.ctrl_c()
        wait_until(lambda: "rolling back" in run_.text(), "the first Ctrl-C's answer")
        if end == "first ctrl-c":
            ready.write_text("")
        else:
            wait_until(lambda: SPINNER & set(run_.text().split("rolling back")[-1]),
                       "the live line of the rollback's health wait")
            run_.ctrl_c()
    code, lines, raw = run_.finish()
    screen = "\n".join(lines)
    assert code == {"normal": 0, "error": 1, "first ctrl-c": 1, "second ctrl-c": 3}[end], (code, screen)
    assert "Traceback" not in raw, screen
    no_spinner_left(lines, raw)
    last = [line for line in lines if line.strip()][-1]
    said = {"normal": "changed", "error": "not healthy after", "first ctrl-c": "interrupted",
            "second ctrl-c": "interrupted again"}[end]
    assert said in screen.split("\n", 3)[-1] and not SPINNER & set(last), screen
