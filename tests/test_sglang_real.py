"""The story's two edits on the real SGLang 0.5.13 ``server_args.py``.

The file comes from the registry (``tests.fixtures.sglang_wheel``). These
tests pin exactly where each insert lands, that the result compiles and is
structurally the original plus the two planned statements, that re-planning
is a no-op, and that the naive insert after the anchor *line* (what a
line-based tool does, and what broke the server in the story) is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.edit_spec import Anchor, Change, EditSpec, FilePlan
from orchestrator.core.edits import plan_file
from orchestrator.core.regions import view_ranges
from orchestrator.core.structure import check_structure
from orchestrator.errors import AnchorError, StructureError
from tests.fixtures.sglang_wheel import sglang_file

VERSION = "0.5.13"
MEMBER = "sglang/srt/server_args.py"

FIELD = "speculative_disable_batch_threshold: Optional[int] = None\n"
ARGUMENT = """\
parser.add_argument(
    "--speculative-disable-batch-threshold",
    type=int,
    default=ServerArgs.speculative_disable_batch_threshold,
    help="Disable speculation when decode batch size exceeds this threshold.",
)
"""


def story_edits() -> list[EditSpec]:
    return [
        EditSpec(
            kind="insert",
            text=FIELD,
            anchor=Anchor("after", "speculative_accept_threshold_acc:"),
            marker_id="speculative-disable-field",
            file="playbooks/site.yaml",
            line=9,
            key="files[0].edits[0]",
        ),
        EditSpec(
            kind="insert",
            text=ARGUMENT,
            anchor=Anchor("after", '"--speculative-accept-threshold-acc"'),
            marker_id="speculative-disable-flag",
            file="playbooks/site.yaml",
            line=11,
            key="files[0].edits[1]",
        ),
    ]


@pytest.fixture(scope="module")
def server_args() -> tuple[str, str]:
    path = sglang_file(VERSION, MEMBER)
    return str(path), Path(path).read_text()


@pytest.fixture(scope="module")
def story_plan(server_args: tuple[str, str]) -> FilePlan:
    path, text = server_args
    return plan_file(path, text, story_edits())


def test_the_fixture_is_the_file_the_story_is_about(server_args: tuple[str, str]) -> None:
    _, text = server_args
    lines = text.splitlines()
    assert len(lines) == 8187
    assert lines[610] == "    speculative_accept_threshold_acc: float = 1.0"
    assert lines[5881] == "        parser.add_argument("
    assert lines[5882] == '            "--speculative-accept-threshold-acc",'
    assert lines[5886] == "        )"
    assert lines[5888] == '            "--speculative-token-map",'
    assert sglang_file(VERSION, MEMBER) == Path(server_args[0])  # cached, same path


def test_the_field_lands_right_after_line_611(story_plan: FilePlan) -> None:
    lines = story_plan.result.splitlines()
    assert lines[610] == "    speculative_accept_threshold_acc: float = 1.0"
    assert lines[611:614] == [
        "    # >>> orch speculative-disable-field",
        "    speculative_disable_batch_threshold: Optional[int] = None",
        "    # <<< orch speculative-disable-field",
    ]
    assert lines[614] == "    speculative_token_map: Optional[str] = None"
    first = story_plan.changes[0]
    assert (first.old_start, first.old_end, first.new_start, first.new_end) == (612, 611, 612, 614)


def test_the_argument_lands_after_the_closing_paren_at_8_spaces(story_plan: FilePlan) -> None:
    lines = story_plan.result.splitlines()
    shift = 3  # the field block above
    close = 5887 + shift  # the ")" closing --speculative-accept-threshold-acc
    assert lines[close - 6 : close - 4] == [
        "        parser.add_argument(",
        '            "--speculative-accept-threshold-acc",',
    ]
    assert lines[close - 1] == "        )"
    assert lines[close : close + 8] == [
        "        # >>> orch speculative-disable-flag",
        "        parser.add_argument(",
        '            "--speculative-disable-batch-threshold",',
        "            type=int,",
        "            default=ServerArgs.speculative_disable_batch_threshold,",
        '            help="Disable speculation when decode batch size exceeds this threshold.",',
        "        )",
        "        # <<< orch speculative-disable-flag",
    ]
    assert lines[close + 8 : close + 10] == [
        "        parser.add_argument(",
        '            "--speculative-token-map",',
    ]
    second = story_plan.changes[1]
    assert (second.old_start, second.old_end) == (5888, 5887)
    assert (second.new_start, second.new_end) == (close + 1, close + 8)


def test_the_result_is_structurally_the_original_plus_two_statements(
    story_plan: FilePlan,
) -> None:
    check_structure(story_plan, story_edits())
    compile(story_plan.result, story_plan.path, "exec")
    assert len(story_plan.result.splitlines()) == 8187 + 3 + 8


def test_replanning_the_applied_file_is_a_no_op(story_plan: FilePlan) -> None:
    again = plan_file(story_plan.path, story_plan.result, story_edits())
    assert again.result == story_plan.result
    assert not again.changed
    assert again.changes == ()
    assert all("already applied" in note for note in again.notes)


def test_the_verification_view_shows_both_blocks_with_context(story_plan: FilePlan) -> None:
    ranges = view_ranges(story_plan.changes, len(story_plan.result.splitlines()))
    assert [(r.start, r.end) for r in ranges] == [(609, 617), (5888, 5901)]
    assert ranges[1].highlight == tuple(range(5891, 5899))


def _naive_insert(text: str, after_line: int, indent: str) -> str:
    """What a line-based tool does: the block right after the matching line."""
    lines = text.splitlines(keepends=True)
    block = [(indent + row if row else "") + "\n" for row in ARGUMENT.rstrip("\n").split("\n")]
    return "".join(lines[:after_line] + block + lines[after_line:])


def test_the_naive_insert_after_the_anchor_line_is_refused(server_args: tuple[str, str]) -> None:
    path, text = server_args
    broken = _naive_insert(text, 5883, " " * 8)  # after '"--speculative-accept-threshold-acc",'
    plan = FilePlan(path, text, broken, (Change(0, "insert", 5884, 5883, 5884, 5889),))
    with pytest.raises(StructureError) as refused:
        check_structure(plan, story_edits()[1:])
    message = str(refused.value)
    assert "lines 5884-5889 are not whole statements" in message
    assert "inside the call that starts at line 5882" in message


def test_the_storys_broken_file_is_refused_even_without_change_records(
    server_args: tuple[str, str],
) -> None:
    path, text = server_args
    # The story: the block between the call's default= line and its ")".
    broken = _naive_insert(text, 5886, " " * 8)
    with pytest.raises(SyntaxError):
        compile(broken, path, "exec")
    bare = FilePlan(path, text, broken)
    with pytest.raises(StructureError, match="does not parse: line "):
        check_structure(bare, story_edits()[1:])
    recorded = FilePlan(path, text, broken, (Change(0, "insert", 5887, 5886, 5887, 5892),))
    with pytest.raises(StructureError, match="inside the call that starts at line 5882"):
        check_structure(recorded, story_edits()[1:])


def test_an_anchor_on_every_add_argument_call_lists_candidates(
    server_args: tuple[str, str],
) -> None:
    path, text = server_args
    spec = EditSpec(
        kind="insert",
        text="x = 1\n",
        anchor=Anchor("after", "parser.add_argument("),
        file="playbooks/site.yaml",
        line=11,
        key="files[0].edits[1]",
    )
    with pytest.raises(AnchorError) as error:
        plan_file(path, text, [spec])
    message = str(error.value)
    assert message.startswith("playbooks/site.yaml:11: files[0].edits[1].after: ")
    assert "anchor matches 406 places" in message
    assert "line 4489: parser.add_argument(" in message
    assert "\n" not in message
