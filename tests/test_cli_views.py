"""What orch draws, without a host: the diff's hunks, the ``sed -n`` view on both media."""

from __future__ import annotations

import difflib
import io
import textwrap

import pytest

from orchestrator.cli.diffs import unified_diff
from orchestrator.cli.output import Output, make_output
from orchestrator.cli.views import draw_view
from orchestrator.core.edit_spec import Anchor, EditSpec
from orchestrator.core.edits import plan_file
from orchestrator.core.regions import ViewRange, view_ranges

CALLS = textwrap.dedent('''\
    def add_cli_args(parser):
        parser.add_argument(
            "--accept",
            type=float,
            default=1.0,
        )
        parser.add_argument(
            "--token-map",
            type=str,
            default=None,
        )
''')

NEW_CALL = textwrap.dedent('''\
    parser.add_argument(
        "--disable-batch-threshold",
        type=int,
        default=None,
    )
''')


def apply_strictly(text: str, diff: str) -> str:
    """Apply a unified diff at exactly its stated lines (what ``patch -F0`` without offsets does)."""
    old = text.splitlines(keepends=True)
    out: list[str] = []
    at = 0  # lines of ``old`` consumed
    rows = diff.splitlines(keepends=True)[2:]
    for row in rows:
        if row.startswith("@@"):
            start = int(row.split()[1].lstrip("-").split(",")[0])
            count = int(row.split()[1].split(",")[1]) if "," in row.split()[1] else 1
            first = start if count else start + 1
            out.extend(old[at : first - 1])
            at = first - 1
        elif row.startswith(" ") or row.startswith("-"):
            assert old[at] == row[1:], (old[at], row)
            at += 1
            if row.startswith(" "):
                out.append(row[1:])
        elif row.startswith("+"):
            out.append(row[1:])
    return "".join(out + old[at:])


def insert_after(pattern: str, text: str, markers: bool = False) -> EditSpec:
    return EditSpec(kind="insert", text=text, anchor=Anchor("after", pattern, False), markers=markers,
                    marker_id="t:0")


def test_difflib_would_show_the_insert_starting_inside_the_previous_call() -> None:
    """The reason diffs follow the plan: difflib matches the ``)`` lines up differently."""
    plan = plan_file("a.py", CALLS, [insert_after('"--accept"', NEW_CALL)])
    naive = [row for row in difflib.unified_diff(CALLS.splitlines(), plan.result.splitlines(),
                                                 lineterm="") if row.startswith("+") and
             not row.startswith("+++")]
    assert naive[0].strip() != "parser.add_argument("  # the picture of the story's bug


def test_the_diff_adds_whole_statements() -> None:
    plan = plan_file("a.py", CALLS, [insert_after('"--accept"', NEW_CALL)])
    diff = unified_diff(plan.original, plan.result, plan.changes, fromfile="a", tofile="b")
    added = [row[1:] for row in diff.splitlines() if row.startswith("+") and not row.startswith("+++")]
    assert added == textwrap.indent(NEW_CALL, "    ").splitlines()
    # and it is a real diff: applying it to the original gives the result
    assert apply_strictly(plan.original, diff) == plan.result


@pytest.mark.parametrize("markers", [True, False])
def test_the_diff_of_several_edits_applies(markers: bool) -> None:
    text = CALLS + "\n\ndef other():\n    return 1\n" + "x = 1\n" * 20 + "y = 2\n"
    edits = [insert_after('"--accept"', NEW_CALL, markers),
             EditSpec(kind="insert", text="z = 3\n", anchor=Anchor("after", "y = 2", False),
                      markers=markers, marker_id="t:1")]
    plan = plan_file("a.py", text, edits)
    diff = unified_diff(plan.original, plan.result, plan.changes, fromfile="a", tofile="b")
    assert diff.count("@@ -") == 2  # two hunks, far apart
    assert apply_strictly(plan.original, diff) == plan.result


def test_changes_that_do_not_add_up_fall_back_to_difflib() -> None:
    plan = plan_file("a.py", CALLS, [insert_after('"--accept"', NEW_CALL)])
    diff = unified_diff(plan.original, plan.result + "extra\n", plan.changes, fromfile="a", tofile="b")
    assert apply_strictly(plan.original, diff) == plan.result + "extra\n"


LONG = '        help="' + "a very long help text that goes on " * 6 + '",'


def plain_output() -> tuple[Output, io.StringIO]:
    stream = io.StringIO()  # not a terminal
    return make_output(stream=stream), stream


def test_off_a_terminal_the_view_is_plain_lines_never_cut() -> None:
    text = "\n".join(["x = 1"] * 8 + [LONG, "y = 2"] + ["z = 3"] * 8) + "\n"
    out, stream = plain_output()
    assert not out.terminal
    plan = plan_file("a.txt", text, [insert_after("y = 2", "w = 4\n")])
    draw_view(out, "/srv/a.txt", plan.result, view_ranges(plan.changes, 19, context=3),
              title="planned")
    printed = stream.getvalue().splitlines()
    assert printed[0] == "sed -n 8,14p /srv/a.txt  (planned)"
    assert f"   9 {LONG}" in printed  # verbatim, whole, numbered
    assert "❱ 11 w = 4" in printed
    assert "\x1b[" not in stream.getvalue()


def test_on_a_terminal_long_lines_fold_and_every_word_is_kept() -> None:
    stream = io.StringIO()
    out = make_output(stream=stream, color=False)
    out.terminal = True  # what a tty gets: Rich's layout at its width
    out.console.width = 80
    out.console.soft_wrap = False
    text = "\n".join(["x = 1"] * 3 + [LONG]) + "\n"
    draw_view(out, "/srv/a.py", text, [ViewRange(1, 4, (4,))], title="t")
    rows = stream.getvalue().splitlines()
    assert len(rows) > 5 and all(len(r) <= 80 for r in rows)  # folded, not cut
    words = " ".join(r.replace("❱", " ").split(" ", 3)[-1] for r in rows[1:]).split()
    assert " ".join(words).count("a very long help text that goes on") == 6


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("tty", "no_color_env", "flag", "coloured"),
    [
        (False, False, None, False),  # a pipe: no colour
        (False, False, True, True),   # --color through a pipe
        (True, False, None, True),    # a terminal: colour
        (True, True, None, False),    # NO_COLOR
        (True, True, True, True),     # --color wins over NO_COLOR
        (True, False, False, False),  # --no-color
    ],
)
def test_colour_follows_the_medium_no_color_and_the_flags(
    monkeypatch: pytest.MonkeyPatch, tty: bool, no_color_env: bool, flag: bool | None, coloured: bool
) -> None:
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TERM", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    if no_color_env:
        monkeypatch.setenv("NO_COLOR", "1")
    else:
        monkeypatch.delenv("NO_COLOR", raising=False)
    stream = FakeTty() if tty else io.StringIO()
    out = make_output(stream=stream, color=flag)
    assert out.terminal is tty  # the layout follows the medium, whatever the colour
    out.line("gpu: rolled_back", "yellow")
    assert ("\x1b[" in stream.getvalue()) is coloured
    assert "gpu: rolled_back" in stream.getvalue()


@pytest.mark.parametrize("text", ["plain", "tab\there\tx", "cr\rline", "esc \x1b[31mred\x1b[0m",
                                  "  lead and trail  ", "multi\nline", "[bold]markup[/]", "bell\x07",
                                  "uni ❱ é", "", "a" * 300, "x\x0by\x0cz"])
def test_a_line_off_a_terminal_is_what_rich_would_have_printed(text: str) -> None:
    """Off a terminal without colour a line skips Rich's layout (a fleet prints hundreds);
    the bytes must be the ones Rich gives for the same safe text (control codes shown escaped,
    ``Output.safe``), tabs expanded, never cut."""
    from rich.text import Text

    fast, rich_way = io.StringIO(), io.StringIO()
    make_output(stream=fast).line(text, "red")
    reference = make_output(stream=rich_way)
    reference.console.print(Text(reference.safe(text), style="red"))
    assert fast.getvalue() == rich_way.getvalue()
    assert "\x1b" not in fast.getvalue() and "\r" not in fast.getvalue()
