"""Unit tests of the pure edit engine: anchors, edits, markers, patches, checks, views."""

from __future__ import annotations

import ast
import textwrap

import pytest

from orchestrator.core.anchors import PySource, resolve_python_line
from orchestrator.core.edit_spec import Anchor, Change, EditSpec, FilePlan
from orchestrator.core.edits import indent_block, plan_file
from orchestrator.core.patches import PatchError, apply_patch, parse_patch
from orchestrator.core.regions import ViewRange, view_ranges
from orchestrator.core.structure import check_structure
from orchestrator.errors import AnchorError, ConfigError, EditError, StructureError

WHERE = {"file": "playbooks/x.yaml", "line": 14, "key": "files[0].edits[1]"}


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def insert(text: str, pattern: str, side: str = "after", **kw: object) -> EditSpec:
    regex = bool(kw.pop("regex", False))
    return EditSpec(
        kind="insert", text=text, anchor=Anchor(side, pattern, regex), **{**WHERE, **kw}
    )  # type: ignore[arg-type]


def plain(text: str, pattern: str, side: str = "after", **kw: object) -> EditSpec:
    return insert(text, pattern, side, markers=False, **kw)


def plan_ok(path: str, text: str, edits: list[EditSpec], **kw: object) -> FilePlan:
    """Plan, check the structure, and check that re-planning is a no-op."""
    plan = plan_file(path, text, edits, **kw)  # type: ignore[arg-type]
    check_structure(plan, edits)
    again = plan_file(path, plan.result, edits, **kw)  # type: ignore[arg-type]
    assert again.result == plan.result
    assert again.changes == ()
    return plan


def lines_of(text: str) -> list[str]:
    return text.splitlines()


# --------------------------------------------------------------------------- anchors (.py)

CALLS = src(
    """
    def add_cli_args(parser):
        parser.add_argument(
            "--accept",
            type=float,
            default=1.0,
        )
        parser.add_argument(
            "--token-map",
            type=str,
        )
    """
)


def test_anchor_inside_a_multiline_call_lands_after_the_whole_call() -> None:
    plan = plan_ok("m.py", CALLS, [plain("x = 1\n", '"--accept"')])
    assert lines_of(plan.result)[5:8] == ["    )", "    x = 1", "    parser.add_argument("]


def test_anchor_inside_a_multiline_call_before_lands_before_the_call() -> None:
    plan = plan_ok("m.py", CALLS, [plain("x = 1\n", "default=1.0", "before")])
    assert lines_of(plan.result)[:3] == [
        "def add_cli_args(parser):",
        "    x = 1",
        "    parser.add_argument(",
    ]


def test_the_resolved_place_of_each_line_of_a_call_is_the_call() -> None:
    index = PySource("m.py", CALLS)
    places = {(p.start, p.end) for p in (resolve_python_line(index, row) for row in range(2, 7))}
    assert places == {(2, 6)}


DECORATED = src(
    """
    import functools


    @functools.lru_cache(
        maxsize=None,
    )
    @staticmethod
    def compute(a,
                b):
        return a + b


    done = True
    """
)


@pytest.mark.parametrize(
    "pattern", ["@functools.lru_cache(", "maxsize=None", "@staticmethod", "def compute(a,", "b):"]
)
def test_header_and_decorator_lines_mean_the_whole_def(pattern: str) -> None:
    after = plan_ok("m.py", DECORATED, [plain("AFTER = 1\n", pattern)])
    rows = lines_of(after.result)
    assert rows[rows.index("    return a + b") + 1] == "AFTER = 1"
    before = plan_ok("m.py", DECORATED, [plain("BEFORE = 1\n", pattern, "before")])
    rows = lines_of(before.result)
    assert rows[rows.index("@functools.lru_cache(") - 1] == "BEFORE = 1"


def test_comment_between_decorator_and_def_means_the_def() -> None:
    text = src(
        """
        @dec
        # the comment
        def f():
            pass
        """
    )
    plan = plan_ok("m.py", text, [plain("y = 2\n", "the comment", "before")])
    assert lines_of(plan.result)[:2] == ["y = 2", "@dec"]


COMPOUND = src(
    """
    def outer():
        if a:
            x = 1
        elif b:
            x = 2
        else:
            x = 3
        try:
            pass
        except ValueError:
            pass
        finally:
            done()
        return x
    """
)


@pytest.mark.parametrize(
    ("pattern", "after_line"),
    [
        ("if a:", "        x = 3"),
        ("elif b:", "        x = 3"),
        ("else:", "        x = 3"),
        ("except ValueError", "        done()"),
        ("finally:", "        done()"),
    ],
)
def test_clause_headers_mean_the_whole_compound_statement(pattern: str, after_line: str) -> None:
    plan = plan_ok("m.py", COMPOUND, [plain("marker()\n", pattern)])
    rows = lines_of(plan.result)
    assert rows[rows.index(after_line) + 1] == "    marker()"


def test_anchor_in_a_nested_body_uses_that_statement_and_its_indentation() -> None:
    plan = plan_ok("m.py", COMPOUND, [plain("y = x\n", "x = 2")])
    rows = lines_of(plan.result)
    assert rows[rows.index("        x = 2") + 1] == "        y = x"


def test_match_case_lines_mean_the_match_statement() -> None:
    text = src(
        """
        match command:
            case "go":
                run()
            case _:
                stop()
        tail = 1
        """
    )
    plan = plan_ok("m.py", text, [plain("after_match = 1\n", 'case "go"')])
    assert lines_of(plan.result)[5] == "after_match = 1"


def test_triple_quoted_string_lines_mean_the_whole_assignment() -> None:
    text = src(
        '''
        HELP = """
        def fake():
            speculative_accept_threshold_acc: float = 2.0
        """
        real = 1
        '''
    )
    plan = plan_ok("m.py", text, [plain("new = 2\n", "speculative_accept_threshold_acc")])
    assert lines_of(plan.result)[3:6] == ['"""', "new = 2", "real = 1"]


def test_backslash_continuation_is_one_statement() -> None:
    text = src(
        """
        total = 1 + \\
            2 + \\
            3
        other = 4
        """
    )
    plan = plan_ok("m.py", text, [plain("mid = 0\n", "2 + ")])
    assert lines_of(plan.result)[3] == "mid = 0"


def test_semicolon_line_is_one_place() -> None:
    text = "a = 1; b = 2\nc = 3\n"
    plan = plan_ok("m.py", text, [plain("z = 0\n", "b = 2")])
    assert plan.result == "a = 1; b = 2\nz = 0\nc = 3\n"


def test_one_line_compound_header_means_the_compound() -> None:
    text = "if flag: value = 1\nelse: value = 2\nnext_one = 3\n"
    plan = plan_ok("m.py", text, [plain("z = 0\n", "value = 1")])
    assert lines_of(plan.result) == [
        "if flag: value = 1",
        "else: value = 2",
        "z = 0",
        "next_one = 3",
    ]


def test_comment_line_is_the_line_itself_at_its_indentation() -> None:
    text = src(
        """
        def f():
            a = 1
            # INSERT HERE
            b = 2
        """
    )
    plan = plan_ok("m.py", text, [plain("c = 3\n", "INSERT HERE")])
    assert lines_of(plan.result)[2:5] == ["    # INSERT HERE", "    c = 3", "    b = 2"]


def test_comment_at_an_odd_indentation_gets_a_legal_one() -> None:
    text = "def f():\n    a = 1\n  # odd\n    b = 2\n"
    plan = plan_ok("m.py", text, [plain("c = 3\n", "# odd")])
    assert lines_of(plan.result)[3] == "    c = 3"


def test_comment_where_no_statement_can_go_is_an_anchor_error() -> None:
    text = "if x: y = 1\n# between\nelse: y = 2\n"
    with pytest.raises(AnchorError, match="no statement can go at line 2"):
        plan_file("m.py", text, [plain("z = 0\n", "between")])


def test_several_lines_of_one_statement_are_one_place() -> None:
    text = src(
        """
        parser.add_argument(
            "--flag",
            help="the --flag flag",
        )
        """
    )
    plan = plan_ok("m.py", text, [plain("x = 1\n", "--flag")])
    assert lines_of(plan.result)[-1] == "x = 1"


def test_regex_anchor() -> None:
    plan = plan_ok("m.py", CALLS, [plain("x = 1\n", r'"--tok\w+-map"', regex=True)])
    assert lines_of(plan.result)[-1] == "    x = 1"


# --------------------------------------------------------------------------- anchor errors


def test_zero_matches_names_file_line_key_and_suggests_close_lines() -> None:
    with pytest.raises(AnchorError) as error:
        plan_file("/srv/server_args.py", CALLS, [insert("x = 1\n", '"--acept"')])
    message = str(error.value)
    assert message.startswith(
        "playbooks/x.yaml:14: files[0].edits[1].after: anchor matches 0 places in /srv/server_args.py"
    )
    assert 'did you mean: line 3: "--accept",' in message
    assert "\n" not in message
    assert isinstance(error.value, ConfigError)
    assert (error.value.file, error.value.line) == ("playbooks/x.yaml", 14)


def test_several_places_lists_each_candidate_with_its_line() -> None:
    with pytest.raises(AnchorError) as error:
        plan_file("m.py", CALLS, [insert("x = 1\n", "parser.add_argument(", "before")])
    message = str(error.value)
    assert "files[0].edits[1].before: anchor matches 2 places in m.py" in message
    assert "line 2: parser.add_argument(; line 7: parser.add_argument(" in message


def test_regex_key_is_named_in_errors() -> None:
    with pytest.raises(AnchorError, match=r"files\[0\]\.edits\[1\]\.after_regex: anchor matches 0"):
        plan_file("m.py", CALLS, [insert("x = 1\n", r"nothing\d+", regex=True)])


def test_bad_regex_is_an_anchor_error() -> None:
    with pytest.raises(AnchorError, match="bad regex"):
        plan_file("m.py", CALLS, [insert("x = 1\n", "(unclosed", regex=True)])


def test_python_file_that_does_not_parse_is_an_edit_error() -> None:
    with pytest.raises(EditError) as error:
        plan_file("/srv/broken.py", "def f(:\n    pass\n", [insert("x = 1\n", "pass")])
    message = str(error.value)
    assert (
        "playbooks/x.yaml:14: files[0].edits[1]: /srv/broken.py does not parse: line 1" in message
    )


# --------------------------------------------------------------------------- indentation


def test_indentation_keeps_relative_indent_and_empty_blank_lines() -> None:
    assert indent_block("if x:\n    y()\n\nz = 1\n", "    ") == [
        "    if x:",
        "        y()",
        "",
        "    z = 1",
    ]
    text = "class A:\n    def f(self):\n        return 1\n"
    block = "def g(self):\n    if True:\n        return 2\n\n    return 3\n"
    plan = plan_ok("m.py", text, [plain(block, "def f(")])
    assert lines_of(plan.result)[3:] == [
        "    def g(self):",
        "        if True:",
        "            return 2",
        "",
        "        return 3",
    ]
    assert not any(row != row.rstrip() for row in lines_of(plan.result))


# --------------------------------------------------------------------------- markers


def test_markers_wrap_the_block_at_its_indentation() -> None:
    plan = plan_ok("m.py", CALLS, [insert("x = 1\n", '"--accept"', marker_id="flag")])
    assert lines_of(plan.result)[6:9] == ["    # >>> orch flag", "    x = 1", "    # <<< orch flag"]
    assert plan.changes[0].new_start == 7 and plan.changes[0].new_end == 9


@pytest.mark.parametrize(
    ("path", "leader"), [("main.c", "//"), ("app.ts", "//"), ("conf.ini", "#")]
)
def test_marker_comment_leader_follows_the_file_type(path: str, leader: str) -> None:
    plan = plan_ok(path, "a\nb\n", [insert("new\n", "a", marker_id="m")])
    assert plan.result == f"a\n{leader} >>> orch m\nnew\n{leader} <<< orch m\nb\n"


def test_comment_option_sets_the_marker_leader() -> None:
    plan = plan_ok("x.sql", "a\n", [insert("b\n", "a", marker_id="m")], comment="--")
    assert plan.result == "a\n-- >>> orch m\nb\n-- <<< orch m\n"


def test_changed_block_is_replaced_in_place() -> None:
    first = plan_file("m.py", CALLS, [insert("x = 1\n", '"--accept"', marker_id="flag")])
    changed = [insert("x = 2\ny = 3\n", '"--accept"', marker_id="flag")]
    plan = plan_file("m.py", first.result, changed)
    check_structure(plan, changed)
    assert lines_of(plan.result)[6:10] == [
        "    # >>> orch flag",
        "    x = 2",
        "    y = 3",
        "    # <<< orch flag",
    ]
    assert plan.notes == ("edit 1: block orch:flag replaced in place (lines 7-9)",)
    assert plan.result.count(">>> orch flag") == 1
    change = plan.changes[0]
    assert (change.old_start, change.old_end, change.new_start, change.new_end) == (7, 9, 7, 10)
    assert plan_file("m.py", plan.result, changed).result == plan.result


def test_an_applied_block_whose_anchor_matches_nothing_is_the_clean_file_error() -> None:
    applied = plan_file("m.py", CALLS, [insert("x = 1\n", '"--accept"', marker_id="flag")])
    gone = [insert("x = 1\n", "no such anchor", marker_id="flag")]
    with pytest.raises(AnchorError) as on_applied:
        plan_file("m.py", applied.result, gone)
    with pytest.raises(AnchorError) as on_clean:
        plan_file("m.py", CALLS, gone)
    assert str(on_applied.value) == str(on_clean.value)
    assert "anchor matches 0 places in m.py" in str(on_applied.value)


def test_begin_marker_twice_is_an_edit_error() -> None:
    text = "# >>> orch m\nx = 1\n# <<< orch m\n# >>> orch m\n# <<< orch m\n"
    with pytest.raises(EditError, match=r"found 2 times in m.py \(lines 1, 4\)"):
        plan_file("m.py", text, [insert("y = 1\n", "x", marker_id="m")])


def test_begin_marker_without_end_is_an_edit_error() -> None:
    text = "# >>> orch m\nx = 1\n"
    with pytest.raises(EditError, match="at line 1 of m.py has no end marker"):
        plan_file("m.py", text, [insert("y = 1\n", "x", marker_id="m")])
    with pytest.raises(EditError, match="has no begin marker"):
        plan_file("m.py", "x = 1\n# <<< orch m\n", [insert("y = 1\n", "x", marker_id="m")])


def test_one_marker_id_for_two_inserts_is_an_edit_error() -> None:
    edits = [
        insert("a = 1\n", '"--accept"', marker_id="m"),
        insert("b = 1\n", '"--token-map"', marker_id="m"),
    ]
    with pytest.raises(EditError, match="marker id 'm' is already used by edit 1"):
        plan_file("m.py", CALLS, edits)


def test_unmarked_block_already_in_place_is_recognised() -> None:
    edits = [plain("x = 1\n", '"--accept"'), plain("early = 0\n", '"--token-map"', "before")]
    plan = plan_ok("m.py", CALLS, edits)
    again = plan_file("m.py", plan.result, edits)
    assert again.notes == ("edit 1: already applied", "edit 2: already applied")


def test_unmarked_block_containing_its_own_anchor_is_still_recognised() -> None:
    edits = [plain('note("--accept")\n', '"--accept"')]
    plan = plan_ok("m.py", CALLS, edits)
    assert plan.result.count("--accept") == 2


def test_empty_insert_text_is_an_edit_error() -> None:
    with pytest.raises(EditError, match="insert text is empty"):
        plan_file("m.py", CALLS, [insert("\n", '"--accept"')])


# --------------------------------------------------------------------------- non-.py files

YAML = "server:\n  port: 30000\n  flags:\n    a: 1\n"


def test_non_python_files_anchor_on_the_line_itself() -> None:
    plan = plan_ok("conf.yaml", YAML, [plain("host: 0.0.0.0\n", "port:")])
    assert plan.result == "server:\n  port: 30000\n  host: 0.0.0.0\n  flags:\n    a: 1\n"
    check_structure(plan, [])  # a no-op for other files


def test_non_python_anchor_errors_list_lines() -> None:
    with pytest.raises(
        AnchorError, match="anchor matches 2 places in conf.yaml: line 2: port: 30000; line 3"
    ):
        plan_file("conf.yaml", "a\nport: 30000\nport: 1\n", [plain("x\n", "port")])


def test_crlf_files_keep_their_line_endings() -> None:
    plan = plan_ok("conf.ini", "a\r\nb\r\n", [insert("new\n", "a", marker_id="m")])
    assert plan.result == "a\r\n# >>> orch m\r\nnew\r\n# <<< orch m\r\nb\r\n"


def test_insert_after_a_last_line_without_newline() -> None:
    plan = plan_ok("m.py", "x = 1", [plain("y = 2\n", "x = 1")])
    assert plan.result == "x = 1\ny = 2\n"


# --------------------------------------------------------------------------- replace


def replace(pattern: str, text: str, count: int = 1, regex: bool = False) -> EditSpec:
    return EditSpec(kind="replace", pattern=pattern, text=text, count=count, regex=regex, **WHERE)  # type: ignore[arg-type]


def test_replace_exact_count_and_idempotent() -> None:
    plan = plan_ok("m.py", CALLS, [replace("default=1.0", "default=2.0")])
    assert "default=2.0" in plan.result and "default=1.0" not in plan.result
    assert plan.changes == (Change(0, "replace", 5, 5, 5, 5, "replaced"),)
    assert (
        plan_file("m.py", plan.result, [replace("default=1.0", "default=2.0")])
        .notes[0]
        .startswith("edit 1: already applied")
    )


def test_replace_wrong_count_says_how_many_and_where() -> None:
    with pytest.raises(EditError) as error:
        plan_file("m.py", CALLS, [replace("parser.add_argument(", "p.add(")])
    message = str(error.value)
    assert message.startswith("playbooks/x.yaml:14: files[0].edits[1].replace: expected 1 of")
    assert "found 2 matches (lines 2, 7)" in message
    with pytest.raises(EditError, match="found 0 matches"):
        plan_file("m.py", CALLS, [replace("nowhere", "x")])


def test_replace_count_several() -> None:
    plan = plan_ok("m.py", CALLS, [replace("parser.add_argument(", "parser.add(", count=2)])
    assert plan.result.count("parser.add(") == 2
    assert [(c.new_start, c.new_end) for c in plan.changes] == [(2, 2), (7, 7)]


def test_replace_whose_text_contains_the_pattern_is_idempotent() -> None:
    plan = plan_ok("m.py", CALLS, [replace("type=str", "type=str, nargs=1")])
    assert plan.result.count("type=str, nargs=1") == 1


def test_replace_regex_with_groups_and_multiline() -> None:
    plan = plan_file("m.py", CALLS, [replace(r"default=(\d)\.0", r"default=\g<1>.5", regex=True)])
    assert "default=1.5" in plan.result
    joined = plan_file("t.txt", "a\nb\nc\n", [replace("a\nb\n", "ab ")])
    assert joined.result == "ab c\n"
    assert joined.changes[0].old_start == 1 and joined.changes[0].old_end == 3


def test_replace_with_empty_text_deletes_and_then_is_done() -> None:
    plan = plan_file("t.txt", "keep\ndrop me\n", [replace("drop me\n", "")])
    assert plan.result == "keep\n"
    assert not plan_file("t.txt", plan.result, [replace("drop me\n", "")]).changed


# --------------------------------------------------------------------------- delete


def delete(pattern: str, regex: bool = False) -> EditSpec:
    return EditSpec(kind="delete", anchor=Anchor("after", pattern, regex), **WHERE)  # type: ignore[arg-type]


def test_delete_removes_the_whole_statement() -> None:
    plan = plan_ok("m.py", CALLS, [delete('"--accept"')])
    assert plan.result == "def add_cli_args(parser):\n" + "".join(
        CALLS.splitlines(keepends=True)[6:]
    )
    assert plan.changes == (Change(0, "delete", 2, 6, 2, 1, "deleted"),)
    assert plan_file("m.py", plan.result, [delete('"--accept"')]).notes == (
        "edit 1: already absent",
    )


def test_delete_a_decorated_def_takes_its_decorators() -> None:
    plan = plan_ok("m.py", DECORATED, [delete("def compute")])
    assert "@staticmethod" not in plan.result and "lru_cache" not in plan.result
    assert "done = True" in plan.result


def test_delete_a_line_of_another_file_and_key_in_errors() -> None:
    plan = plan_ok("conf.yaml", YAML, [delete("port:")])
    assert plan.result == "server:\n  flags:\n    a: 1\n"
    with pytest.raises(
        AnchorError, match=r"files\[0\]\.edits\[1\]\.delete: anchor matches 2 places"
    ):
        plan_file("m.py", CALLS, [delete("parser.add_argument(")])


# --------------------------------------------------------------------------- patch

PATCH = """\
--- a/m.py
+++ b/m.py
@@ -3,4 +3,5 @@
         "--accept",
         type=float,
         default=1.0,
+        help="accept",
     )
"""


def patch(text: str) -> EditSpec:
    return EditSpec(kind="patch", text=text, **WHERE)  # type: ignore[arg-type]


def test_patch_applies_exactly_and_then_is_already_applied() -> None:
    plan = plan_ok("m.py", CALLS, [patch(PATCH)])
    assert lines_of(plan.result)[5] == '        help="accept",'
    assert plan.changes == (Change(0, "patch", 6, 5, 6, 6, "patched"),)
    again = plan_file("m.py", plan.result, [patch(PATCH)])
    assert again.notes == ("edit 1: already applied (its reverse applies)",)


def test_patch_at_an_offset_applies_when_unique() -> None:
    shifted = "import os\nimport sys\n" + CALLS
    plan = plan_file("m.py", shifted, [patch(PATCH)])
    assert lines_of(plan.result)[7] == '        help="accept",'
    assert "offset 2" in plan.notes[0]


def test_patch_that_does_not_apply_names_the_hunk_and_why() -> None:
    with pytest.raises(EditError) as error:
        plan_file("m.py", CALLS.replace("default=1.0", "default=9.0"), [patch(PATCH)])
    message = str(error.value)
    assert message.startswith(
        "playbooks/x.yaml:14: files[0].edits[1].patch: patch refused for m.py:"
    )
    assert "hunk 1 (@@ -3,4 +3,5 @@) does not apply" in message
    assert "line 5 reads 'default=9.0,' where the patch expects 'default=1.0,'" in message


def test_patch_parsing_edge_cases() -> None:
    hunks = parse_patch("@@ -1 +1 @@\n-a\n+b\n")
    assert (hunks[0].old, hunks[0].new) == (("a",), ("b",))
    with pytest.raises(PatchError, match="no hunks"):
        parse_patch("just text\n")
    with pytest.raises(PatchError, match="more than one file"):
        parse_patch("--- a\n+++ a\n@@ -1 +1 @@\n-a\n+b\n--- b\n+++ b\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(PatchError, match="truncated"):
        parse_patch("@@ -1,3 +1,3 @@\n a\n")
    with pytest.raises(PatchError, match="several places"):
        apply_patch("x\na\nx\na\n", "@@ -9,2 +9,2 @@\n x\n-a\n+b\n")
    two = apply_patch(
        "1\n2\n3\n4\n5\n", "@@ -1,2 +1,2 @@\n-1\n+one\n 2\n@@ -4,2 +4,2 @@\n 4\n-5\n+five\n"
    )
    assert [(s.start, s.end, s.lines) for s in two.splices] == [(1, 1, ("one",)), (5, 5, ("five",))]


def test_patch_pure_addition_is_idempotent() -> None:
    diff = "@@ -0,0 +1 @@\n+# header\n"
    plan = plan_ok("t.txt", "body\n", [patch(diff)])
    assert plan.result == "# header\nbody\n"


# --------------------------------------------------------------------------- several edits


def test_changes_are_in_result_and_original_coordinates_over_several_edits() -> None:
    edits = [
        insert("x = 1\n", '"--token-map"', marker_id="a"),
        delete('"--accept"'),
        plain("first = 0\n", "def add_cli_args", "before"),
    ]
    plan = plan_ok("m.py", CALLS, edits)
    assert lines_of(plan.result)[0] == "first = 0"
    by_edit = {c.edit_index: c for c in plan.changes}
    assert (by_edit[2].old_start, by_edit[2].old_end, by_edit[2].new_start, by_edit[2].new_end) == (
        1,
        0,
        1,
        1,
    )
    assert (by_edit[1].old_start, by_edit[1].old_end) == (2, 6)
    assert (by_edit[0].old_start, by_edit[0].old_end) == (11, 10)
    rows = lines_of(plan.result)
    assert rows[by_edit[0].new_start - 1 : by_edit[0].new_end] == [
        "    # >>> orch a",
        "    x = 1",
        "    # <<< orch a",
    ]


def test_a_later_edit_may_anchor_on_an_earlier_insert() -> None:
    edits = [plain("alpha = 1\n", '"--accept"'), plain("beta = 2\n", "alpha = 1")]
    plan = plan_ok("m.py", CALLS, edits)
    assert lines_of(plan.result)[6:8] == ["    alpha = 1", "    beta = 2"]


# --------------------------------------------------------------------------- structure check


def hand_plan(original: str, result: str, change: Change, path: str = "m.py") -> FilePlan:
    return FilePlan(path, original, result, (change,))


def test_structure_refuses_a_block_inside_a_call() -> None:
    rows = CALLS.splitlines(keepends=True)
    block = ["    x = 1\n"]
    broken = "".join(rows[:5] + block + rows[5:])  # between default=1.0, and )
    with pytest.raises(StructureError) as error:
        check_structure(
            hand_plan(CALLS, broken, Change(0, "insert", 6, 5, 6, 6)),
            [plain("x = 1\n", '"--accept"')],
        )
    assert (
        str(error.value)
        == "m.py: line 6 is not a whole statement: it falls inside the call that starts at line 2"
    )


def test_structure_refuses_lines_inside_a_string_even_though_it_parses() -> None:
    text = 'doc = """\nline one\n"""\nz = 1\n'
    broken = 'doc = """\nline one\nx = 1\n"""\nz = 1\n'
    ast.parse(broken)
    with pytest.raises(StructureError, match="inside the string that starts at line 1"):
        check_structure(hand_plan(text, broken, Change(0, "insert", 3, 2, 3, 3)), [])


def test_structure_refuses_a_block_in_the_wrong_body() -> None:
    text = "def f():\n    a = 1\nafter = 2\n"
    # The def is the anchor's statement; a block at its body's indentation joins the body.
    broken = "def f():\n    a = 1\n    x = 1\nafter = 2\n"
    spec = plain("x = 1\n", "def f")
    with pytest.raises(StructureError, match="not right after the statement their anchor names"):
        check_structure(hand_plan(text, broken, Change(0, "insert", 3, 2, 3, 3)), [spec])
    spec = plain("x = 1\n", "a = 1", "before")
    # Right sibling position is before a = 1; after it is not "before".
    with pytest.raises(StructureError, match="not right before"):
        check_structure(hand_plan(text, broken, Change(0, "insert", 3, 2, 3, 3)), [spec])


def test_structure_refuses_blocks_that_are_not_siblings_or_not_whole() -> None:
    text = "if a:\n    b = 1\nc = 2\n"
    broken = "if a:\n    b = 1\n    x = 1\ny = 2\nc = 2\n"
    with pytest.raises(StructureError, match="not siblings in one body"):
        check_structure(hand_plan(text, broken, Change(0, "insert", 3, 2, 3, 4)), [])
    half = "if a:\n    b = 1\nelse:\n    pass\nc = 2\n"
    with pytest.raises(StructureError, match="not whole statements"):
        check_structure(hand_plan(text, half, Change(0, "insert", 3, 2, 3, 4)), [])


def test_structure_refuses_an_unrecorded_change() -> None:
    text = "a = 1\nb = 2\n"
    with pytest.raises(
        StructureError, match="not the original plus exactly the planned statements"
    ):
        check_structure(FilePlan("m.py", text, "a = 1\nb = 3\n"), [])
    with pytest.raises(StructureError, match="does not parse: line 2"):
        check_structure(FilePlan("m.py", text, "a = 1\nb = (\n"), [])


def test_structure_refuses_a_deletion_of_part_of_a_statement() -> None:
    rows = CALLS.splitlines(keepends=True)
    broken = "".join(rows[:3] + rows[4:])  # drop only `type=float,`
    with pytest.raises(StructureError, match="inside the call that starts at line 2"):
        check_structure(hand_plan(CALLS, broken, Change(0, "delete", 4, 4, 4, 3)), [])


def test_structure_compiles_the_result() -> None:
    text = "def f():\n    pass\n"
    broken = "def f():\n    pass\nreturn 1\n"
    ast.parse(broken)  # parses, but does not compile
    with pytest.raises(StructureError, match="does not compile: line 3"):
        check_structure(hand_plan(text, broken, Change(0, "insert", 3, 2, 3, 3)), [])


def test_a_replace_inside_an_inserted_block_keeps_the_block_whole() -> None:
    block = 'parser.add_argument(\n    "--new",\n    default=1,\n)\n'
    edits = [
        insert(block, '"--accept"', marker_id="new"),
        replace("default=1,\n    )", "default=2,\n    )"),
    ]
    plan = plan_file("m.py", CALLS, edits)
    assert [c.kind for c in plan.changes] == ["insert", "replace", "insert"]
    check_structure(plan, edits)
    assert "default=2," in plan.result
    assert plan_file("m.py", plan.result, edits).result == plan.result


def test_structure_accepts_replace_and_patch_plans_that_compile() -> None:
    edits = [
        replace("default=1.0", "default=2.0"),
        patch(PATCH.replace("default=1.0", "default=2.0")),
    ]
    plan = plan_file("m.py", CALLS, edits)
    check_structure(plan, edits)
    assert 'help="accept"' in plan.result


# --------------------------------------------------------------------------- view ranges


def test_view_ranges_merge_clip_and_show_deletions() -> None:
    changes = [
        Change(0, "insert", 2, 1, 2, 3),
        Change(1, "insert", 6, 5, 8, 8),
        Change(2, "delete", 30, 32, 20, 19),
    ]
    assert view_ranges(changes, 21) == [
        ViewRange(1, 11, (2, 3, 8)),
        ViewRange(17, 21, ()),
    ]
    assert view_ranges(changes, 21, context=0) == [ViewRange(2, 3, (2, 3)), ViewRange(8, 8, (8,))]
    assert view_ranges([Change(0, "insert", 2, 1, 2, 3)], 100)[0].sed == "1,6p"
