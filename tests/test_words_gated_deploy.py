"""Issue 21's table, row "gated deploy": each fact once, in the order things happen, and the
host's progress (health polls, ``probe: 43/64 requests answered``, "healthy after …; checking
it stays healthy") on the live line only.

Before, a gated deploy through a pipe printed every progress event as a line: the probe's
counts read as failures, "healthy after" came twice (the host's progress line and the step),
and the baseline probe's lines came after "restarting the server". Now:

- through a pipe (80 columns): no progress line at all; the step lines, each once, in order:
  pre-flight, the gate's baseline, the restart, healthy, the gate's table, current, outcome;
- with ``-v``: the progress as lines too (docs/CLI.md, "How much");
- on a terminal (a pty of 80 columns): the progress is drawn on the live line (a spinner
  frame carrying ``probe: …``) and erased: the screen keeps the same step lines, once each,
  in the same order, and no spinner.

The real ``orch`` in a subprocess over real sshd, against the stand-in server; the gate
passes by a wide margin (``PASSING``).
"""

from __future__ import annotations

import re

from tests.fixtures.sandbox import Sandbox
from tests.test_cli import run, run_in_pty_raw
from tests.test_gate_deploy import SPECULATION, WIDE, gated
from tests.test_words_streams_live_line import SPINNER, Screen, no_spinner_left

PASSING = {name: rule for name, rule in WIDE.items() if name != "p99_ms"}
"""``WIDE`` without its p99 rule: these tests are about the words of a gate that passes, and
a small sample's p99 under a busy machine once spread ±466 % over the baseline's rounds, so
the rule stayed inconclusive and failed the deploy (the gate's judgement has its own tests in
tests/test_gate_deploy.py). Throughput goes up by half with the patch: no spread reaches that."""

STEPS_IN_ORDER = (
    "gpu pre-flight: the server's parser accepts the new command line",
    "gpu gate: probing the running server before the stop (/generate@32)",
    "gpu restarting the server: ",
    "gpu healthy after ",
    "gpu performance gate: pass",
    "gpu release ",
    "gpu: changed release ",
)
"""The step lines of a passing gated deploy whose baseline is probed, each once, in this order."""

PROGRESS = ("probe: ", "requests answered", "GET /health", "checking it stays healthy", "waiting up to",
            "SIGTERM sent", "started pid")
"""Words only the host's progress events say (never a step line's)."""


def once_each_in_order(lines: list[str]) -> None:
    """Each of ``STEPS_IN_ORDER`` starts exactly one line, and they come in that order."""
    where = []
    for prefix in STEPS_IN_ORDER:
        found = [n for n, line in enumerate(lines) if line.startswith(prefix)]
        assert len(found) == 1, f"{prefix!r} starts {len(found)} lines:\n" + "\n".join(lines)
        where.append(found[0])
    assert where == sorted(where), "out of order:\n" + "\n".join(lines)
    said = "\n".join(lines)
    assert said.count("healthy after") == 1, said


def test_gated_deploy_row_through_a_pipe_each_fact_once_in_order_no_progress_lines(sandbox: Sandbox) -> None:
    sandbox.start_by_hand(*SPECULATION)  # slow at the gate's concurrency: the patch makes it faster
    playbook = gated(sandbox, threshold=8, rules=PASSING)
    got = run(sandbox, "deploy", "--host", "gpu", str(playbook))  # pipes, COLUMNS=80
    assert got.returncode == 0, got.stdout + got.stderr
    lines = got.stdout.splitlines()
    shown = [line for line in lines + got.stderr.splitlines() if any(w in line for w in PROGRESS)]
    assert not shown, "progress printed as lines through a pipe:\n" + "\n".join(shown)
    once_each_in_order(lines)
    assert not got.stderr.strip(), got.stderr  # a deploy that passed has no warning or failure

    # -v: the same progress, as lines (the new server's health wait and the gate's probes)
    verbose = run(sandbox, "deploy", "--host", "gpu", "-v", "--var", "threshold=16", str(playbook))
    assert verbose.returncode == 0, verbose.stdout + verbose.stderr
    for words in ("gpu probe: 64 request(s) to /generate at concurrency 32", "gpu waiting up to ",
                  "checking it stays healthy"):
        assert words in verbose.stdout, f"{words!r} not under -v:\n{verbose.stdout}"


def test_gated_deploy_row_on_a_terminal_progress_on_the_live_line_only(sandbox: Sandbox) -> None:
    sandbox.start_by_hand(*SPECULATION)
    playbook = gated(sandbox, threshold=8, rules=PASSING)
    code, raw_bytes = run_in_pty_raw(sandbox, "deploy", "--host", "gpu", str(playbook), columns=80)
    raw = raw_bytes.decode("utf-8", "replace")
    screen = Screen(80)
    screen.feed(raw)
    lines = screen.lines()
    assert code == 0, "\n".join(lines)
    # drawn on the live line: a spinner frame (styles between) carrying the probe's progress
    frame = re.compile("[" + "".join(sorted(SPINNER)) + r"](?:\x1b\[[0-9;]*m)* gpu probe: ")
    assert frame.search(raw), "no live-line frame with the probe's progress"
    # and erased: the screen keeps only the step lines
    shown = [line for line in lines if any(w in line for w in PROGRESS)]
    assert not shown, "progress left on the screen:\n" + "\n".join(lines)
    once_each_in_order(lines)
    no_spinner_left(lines, raw)
