"""Structural anchors, elements, playbook order, moves, on-disk line numbers, BOM — pure engine tests."""

from __future__ import annotations

import textwrap

import pytest

from orchestrator.core.edit_spec import Anchor, EditSpec
from orchestrator.core.edits import plan_file
from orchestrator.core.structure import check_structure
from orchestrator.errors import AnchorError, StructureError

WHERE = {"file": "p.yaml", "line": 4, "key": "files[0].edits[0]"}


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def ins(text: str, anchor: Anchor, **kw: object) -> EditSpec:
    return EditSpec(kind="insert", text=text, anchor=anchor, **{**WHERE, **kw})  # type: ignore[arg-type]


def planned(path: str, text: str, edits: list[EditSpec]) -> str:
    plan = plan_file(path, text, edits)
    check_structure(plan, edits)
    again = plan_file(path, plan.result, edits)
    assert not again.changed, again.notes
    return plan.result


MODULE = src(
    '''
    import dataclasses


    @dataclasses.dataclass
    class ServerArgs:
        accept: float = 1.0  # "--accept"
        token_map: str = ""


    class Other:
        accept: int = 2


    def add_cli_args(parser, group):
        parser.add_argument(
            "--accept",
            type=float,
            default=ServerArgs.accept,
        )
        group.add_argument("--token-map", type=str)


    ORDER = (
        "accept",
        "token_map",
    )
    ONE_LINE = ("a", "b")
    NO_COMMA = [
        "x",
        "y"
    ]
    TABLE = {
        "accept": 1,
        "token_map": 2,
    }
    '''
)


# --------------------------------------------------------------------------- fields and calls


def test_after_field_names_the_class_field_not_a_comment_or_another_class() -> None:
    result = planned("m.py", MODULE, [ins("new: int = 0\n", Anchor("after", "ServerArgs.accept", kind="field"))])
    lines = result.splitlines()
    at = lines.index('    accept: float = 1.0  # "--accept"')
    assert lines[at + 1 : at + 4] == ["    # >>> orch edit-1", "    new: int = 0", "    # <<< orch edit-1"]


def test_a_bare_field_name_in_two_classes_lists_both() -> None:
    with pytest.raises(AnchorError) as error:
        plan_file("m.py", MODULE, [ins("x: int = 0\n", Anchor("after", "accept", kind="field"))])
    message = str(error.value)
    assert message.startswith("p.yaml:4: files[0].edits[0].after_field: anchor matches 2 places in m.py (field accept)")
    assert "line 6: accept: float" in message and "line 11: accept: int = 2" in message


def test_before_field() -> None:
    result = planned("m.py", MODULE, [ins("new: int = 0\n", Anchor("before", "ServerArgs.token_map", kind="field"), markers=False)])
    assert '    accept: float = 1.0  # "--accept"\n    new: int = 0\n    token_map: str = ""\n' in result


def test_after_call_lands_after_the_whole_call_whichever_receiver() -> None:
    result = planned(
        "m.py",
        MODULE,
        [
            ins('parser.add_argument("--new", type=int)\n', Anchor("after", "parser.add_argument", kind="call", arg="--accept"), markers=False),
            ins('group.add_argument("--new2")\n', Anchor("after", "add_argument", kind="call", arg="--token-map"), markers=False),
        ],
    )
    assert '        default=ServerArgs.accept,\n    )\n    parser.add_argument("--new", type=int)\n' in result
    assert 'group.add_argument("--token-map", type=str)\n    group.add_argument("--new2")\n' in result


def test_after_call_with_the_wrong_receiver_matches_nothing_and_says_so() -> None:
    with pytest.raises(AnchorError, match=r"after_call: anchor matches 0 places in m.py \(call group.add_argument\('--accept', …\)\)"):
        plan_file("m.py", MODULE, [ins("x = 1\n", Anchor("after", "group.add_argument", kind="call", arg="--accept"))])


def test_structural_anchors_are_for_python_files() -> None:
    with pytest.raises(AnchorError, match="field anchors are for .py files"):
        plan_file("notes.txt", "accept: 1\n", [ins("x\n", Anchor("after", "accept", kind="field"))])


# --------------------------------------------------------------------------- elements


def test_into_after_item_lands_inside_the_tuple_with_a_comma() -> None:
    spec = ins('"new_field"\n', Anchor("after", "ORDER", kind="item", arg="accept"))
    result = planned("m.py", MODULE, [spec])
    assert 'ORDER = (\n    "accept",\n    # >>> orch edit-1\n    "new_field",\n    # <<< orch edit-1\n    "token_map",\n)' in result
    namespace: dict = {}
    exec(compile(result, "m.py", "exec"), namespace)  # noqa: S102 - the test's own module
    assert namespace["ORDER"] == ("accept", "new_field", "token_map")


def test_before_item_and_dict_entries() -> None:
    result = planned(
        "m.py",
        MODULE,
        [
            ins('"first": 0,\n', Anchor("before", "TABLE", kind="item", arg="accept"), markers=False),
            ins('"last": 9\n', Anchor("after", "TABLE", kind="item", arg="token_map"), markers=False),
            ins('"z"\n', Anchor("before", "NO_COMMA", kind="item", arg="x"), markers=False),
        ],
    )
    namespace: dict = {}
    exec(compile(result, "m.py", "exec"), namespace)  # noqa: S102
    assert list(namespace["TABLE"]) == ["first", "accept", "token_map", "last"]
    assert namespace["NO_COMMA"] == ["z", "x", "y"]


@pytest.mark.parametrize(
    ("anchor", "message"),
    [
        (Anchor("after", "ONE_LINE", kind="item", arg="a"), "the tuple ONE_LINE (line 27) is written on one line; an element goes on a line of its own"),
        (Anchor("after", "NO_COMMA", kind="item", arg="y"), "'y' is the last element of the list NO_COMMA (lines 28-31) and has no trailing comma; add one, or use before_item"),
    ],
)
def test_elements_that_cannot_take_a_neighbour_line_are_refused_with_the_reason(anchor: Anchor, message: str) -> None:
    with pytest.raises(AnchorError) as error:
        plan_file("m.py", MODULE, [ins('"n"\n', anchor)])
    assert str(error.value) == f"p.yaml:4: files[0].edits[0].into: {message}"


def test_a_line_anchor_on_a_tuple_element_is_refused_not_put_after_the_whole_assignment() -> None:
    with pytest.raises(AnchorError) as error:
        plan_file("m.py", MODULE, [ins("x = 1\n", Anchor("after", '"accept",'))])
    message = str(error.value)
    assert message.startswith("p.yaml:4: files[0].edits[0].after: line 24 is an element of the tuple ORDER (lines 23-26)")
    assert "would land after the whole statement at lines 23-26" in message
    assert "use into: ORDER with after_item: 'accept'" in message


def test_the_structural_check_refuses_a_half_element() -> None:
    from orchestrator.core.edit_spec import Change, FilePlan
    from orchestrator.core.edits import ELEMENT

    lines = MODULE.splitlines(keepends=True)
    at = lines.index('    "accept",\n') + 1
    broken = "".join(lines[:at] + ['    "new" +\n'] + lines[at:])  # parses ("new" + "token_map"), is no element of its own
    change = Change(0, "insert", at + 1, at, at + 1, at + 1, ELEMENT)
    spec = ins('"new" +\n', Anchor("after", "ORDER", kind="item", arg="accept"))
    with pytest.raises(StructureError, match="not whole elements"):
        check_structure(FilePlan("m.py", MODULE, broken, (change,)), [spec])


# --------------------------------------------------------------------------- order, moves, line numbers


def test_several_inserts_at_one_anchor_land_in_playbook_order() -> None:
    text = src(
        """
        a = 1
        b = 2
        """
    )
    edits = [
        ins("x1 = 1\n", Anchor("after", "a = 1"), marker_id="one"),
        ins("x2 = 2\n", Anchor("after", "a = 1"), markers=False),
        ins("x3 = 3\n", Anchor("after", "a = 1"), marker_id="three"),
        ins("y1 = 1\n", Anchor("before", "b = 2"), markers=False),
        ins("y2 = 2\n", Anchor("before", "b = 2"), markers=False),
    ]
    result = planned("m.py", text, edits)
    order = [line.split(" =")[0] for line in result.splitlines() if not line.startswith("#")]
    assert order == ["a", "x1", "x2", "x3", "y1", "y2", "b"]


def test_a_moved_anchor_moves_its_block() -> None:
    text = src(
        """
        import os
        first = 1
        second = 2
        """
    )
    edits = [ins("x = 1\n", Anchor("after", "first = 1"), marker_id="m")]
    applied = plan_file("m.py", text, edits).result
    reordered = applied.replace("first = 1\n", "").replace("second = 2\n", "second = 2\nfirst = 1\n")
    plan = plan_file("m.py", reordered, edits)
    check_structure(plan, edits)
    assert plan.result == "import os\nsecond = 2\nfirst = 1\n# >>> orch m\nx = 1\n# <<< orch m\n"
    assert plan.notes == ("edit 1: block orch:m moved from lines 2-4 to after the statement at line 6 (its anchor no longer points at it)",)
    assert not plan_file("m.py", plan.result, edits).changed


def test_a_block_with_comments_between_it_and_its_anchor_stays() -> None:
    text = "a = 1\n# a note someone wrote\n# >>> orch m\nx = 1\n# <<< orch m\nb = 2\n"
    assert not plan_file("m.py", text, [ins("x = 1\n", Anchor("after", "a = 1"), marker_id="m")]).changed


def test_error_lines_are_the_original_files_after_an_earlier_insert() -> None:
    text = src(
        """
        a = 1
        twin = 1
        b = 2
        twin = 1
        """
    )
    edits = [
        ins("x = 1\ny = 2\nz = 3\n", Anchor("after", "a = 1"), marker_id="m"),
        ins("q = 1\n", Anchor("after", "twin"), key="files[0].edits[1]"),
    ]
    with pytest.raises(AnchorError) as error:
        plan_file("m.py", text, edits)
    assert "anchor matches 2 places in m.py: line 2: twin = 1; line 4: twin = 1" in str(error.value)


def test_a_match_inside_an_earlier_insert_is_named_as_such() -> None:
    edits = [
        ins("marker = 1\n", Anchor("after", "a = 1"), markers=False),
        ins("q = 1\n", Anchor("after", "marker"), key="files[0].edits[1]"),
        ins("r = 1\n", Anchor("after", "= 1"), key="files[0].edits[2]"),
    ]
    with pytest.raises(AnchorError) as error:
        plan_file("m.py", "a = 1\n", edits)
    assert "line 1: a = 1; a line edit 1 inserts: marker = 1" in str(error.value)


# --------------------------------------------------------------------------- BOM


def test_a_utf8_bom_target_is_planned_and_kept() -> None:
    bom = "\ufeff"
    text = bom + "import os\nfirst = 1\n"
    edits = [ins("x = 1\n", Anchor("after", "first = 1"), marker_id="m"), ins("y = 0\n", Anchor("before", "import os"), markers=False)]
    plan = plan_file("m.py", text, edits)
    check_structure(plan, edits)
    assert plan.result == bom + "y = 0\nimport os\nfirst = 1\n# >>> orch m\nx = 1\n# <<< orch m\n"
    assert [(c.new_start, c.new_end) for c in plan.changes] == [(1, 1), (4, 6)]  # lines as Python counts them
    compile(plan.result.encode("utf-8"), "m.py", "exec")  # what the host's python runs: the BOM is fine
    assert not plan_file("m.py", plan.result, edits).changed
