"""Controller CPU of drawing the verification view, before and after windowed highlighting.

    python bench/bench_render.py [--rounds N] [--width W]

The file is the real ``sglang/srt/server_args.py`` of SGLang 0.5.13 (8,187
lines), fetched from the package registry by ``tests/fixtures/sglang_wheel.py``
(cached). The story's playbook is planned on it in memory, and the two
``sed -n`` views a deploy reads back (around the field and around the new
``add_argument`` call) are drawn, in one process, ``--rounds`` times each:

- **before**: the view as orch drew it until this change, Rich's ``Syntax``
  given the *whole file* with ``line_range`` (Pygments lexes all 8,187 lines
  to show 23 of them), on a terminal-like console;
- **after, terminal**: ``cli.views.draw_view`` on a terminal: ``Syntax`` given
  only the window, long lines folded;
- **after, pipe / CI / --json**: ``draw_view`` off a terminal: plain lines,
  no highlighting at all;
- **after, -q**: nothing is drawn, so nothing is computed (shown as 0).

Prints the median CPU seconds (``time.process_time``) of each and the ratio
before/after; also the first round alone (it includes Pygments' lexer set-up,
which a one-host run pays once). Prints figures only; asserts nothing.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from rich.syntax import Syntax  # noqa: E402
from rich.text import Text  # noqa: E402

from orchestrator.cli.output import Output  # noqa: E402
from orchestrator.cli.views import draw_view, lexer_for  # noqa: E402
from orchestrator.core.edits import plan_file  # noqa: E402
from orchestrator.core.regions import ViewRange, view_ranges  # noqa: E402
from orchestrator.core.rendering import render_playbook  # noqa: E402
from orchestrator.shell.config_files import load_playbook, make_renderer  # noqa: E402
from tests.fixtures.sglang_wheel import sglang_file  # noqa: E402

PATH = "/root/sglang/python/sglang/srt/server_args.py"


def planned_text() -> tuple[str, list[ViewRange]]:
    """The story's patch on the real file, and the ranges a deploy reads back."""
    original = sglang_file("0.5.13", "sglang/srt/server_args.py").read_text()
    loaded = load_playbook(REPO / "playbooks" / "speculative-disable.yaml")
    rendered = render_playbook(loaded.model, loaded.locations,
                               {**loaded.model.vars, "sglang_root": "/root/sglang/python/sglang",
                                "python": "python3"}, make_renderer(loaded))
    plan = plan_file(PATH, original, rendered.files[0].edits)
    return plan.result, view_ranges(plan.changes, len(plan.result.splitlines()), context=3)


def terminal_console(width: int) -> Console:
    return Console(file=io.StringIO(), force_terminal=True, color_system="truecolor", width=width)


def draw_before(console: Console, text: str, ranges: Sequence[ViewRange]) -> None:
    """The verification view as ``RichReporter.verification`` drew it before (verbatim)."""
    for r in ranges:
        header = Text.assemble(("sed -n ", "dim"), (f"{r.start},{r.end}p", "bold"), (f" {PATH}", ""),
                               ("  (read back)", "dim"))
        console.print(header)
        console.print(Syntax(text, lexer_for(PATH), theme="ansi_dark", line_numbers=True,
                             line_range=(r.start, r.end), highlight_lines=set(r.highlight),
                             word_wrap=False))


def cpu_seconds(draw: Callable[[], None], rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        started = time.process_time()
        draw()
        times.append(time.process_time() - started)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--width", type=int, default=120)
    args = parser.parse_args()

    text, ranges = planned_text()
    shown = sum(r.end - r.start + 1 for r in ranges)
    print(f"SGLang 0.5.13 server_args.py: {len(text.splitlines())} lines; views: "
          + ", ".join(f"sed -n {r.sed}" for r in ranges) + f" ({shown} lines shown)")

    def before() -> None:
        draw_before(terminal_console(args.width), text, ranges)

    def after_terminal() -> None:
        out = Output(console=terminal_console(args.width), terminal=True)
        draw_view(out, PATH, text, ranges, title="read back")

    def after_plain() -> None:
        out = Output(console=Console(file=io.StringIO(), soft_wrap=True, no_color=True),
                     terminal=False)
        draw_view(out, PATH, text, ranges, title="read back")

    # interleaved, so both sides see the same machine load
    runs: dict[str, list[float]] = {"before": [], "after, terminal": [], "after, pipe": []}
    for _ in range(args.rounds):
        runs["before"] += cpu_seconds(before, 1)
        runs["after, terminal"] += cpu_seconds(after_terminal, 1)
        runs["after, pipe"] += cpu_seconds(after_plain, 1)

    base = statistics.median(runs["before"])
    print(f"{'verification view (2 ranges)':32} {'median CPU':>11} {'first round':>12} {'before/after':>13}")
    for name, times in runs.items():
        med = statistics.median(times)
        ratio = f"{base / med:.0f}x" if name != "before" and med > 0 else "-"
        print(f"{name:32} {med * 1000:9.2f}ms {times[0] * 1000:10.2f}ms {ratio:>13}")
    print(f"{'after, -q':32} {0.0:9.2f}ms {0.0:10.2f}ms {'(not drawn)':>13}")
    print(f"rounds: {args.rounds}; console width {args.width}; Python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
