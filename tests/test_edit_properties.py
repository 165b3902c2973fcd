"""Property tests of the edit engine over generated Python modules.

The generator writes modules with the shapes that break line-based patching:
multi-line calls (with comments and nested brackets inside), decorators
(multi-line ones too), nested defs and classes, compound statements with
``elif``/``else``/``except``/``finally`` clauses, triple-quoted strings whose
text looks like code and like an anchor, backslash continuations, comments
and blank lines. Every line that can carry one gets a unique anchor token
(``A17Z``), and the generator records which statement owns that line — so the
test knows, independently of the engine, where an insert must land.

Every statement's first line carries its id (``_s12``), which identifies the
inserted block's neighbour in the result's AST.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from orchestrator.core.edit_spec import Anchor, Change, EditSpec, FilePlan
from orchestrator.core.edits import plan_file
from orchestrator.core.regions import view_ranges
from orchestrator.core.structure import check_structure
from orchestrator.errors import StructureError

SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

INSERTS = [
    "INS_VALUE = 1\n",
    'INS_call(\n    "--x",\n    y=[\n        1,\n    ],\n)\n',
    "if INS_FLAG:\n    ins_a = 1\n\n    ins_b = 2\nelse:\n    pass\n",
    '@INS_deco\ndef ins_f(a,\n          b):\n    return """\nA1Z\n"""\n',
]


@dataclass
class Spot:
    """An anchor token on one line, and what that line means."""

    token: str
    line: int  # 1-based, in the generated module
    target: int | None  # id of the owning statement; None for a comment line (the line itself)


@dataclass
class Module:
    lines: list[str] = field(default_factory=list)
    spots: list[Spot] = field(default_factory=list)
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> first, last line
    next_id: int = 0
    next_token: int = 0

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def token(self) -> str:
        self.next_token += 1
        return f"A{self.next_token}Z"

    def emit(self, text: str, owner: int | None, spot: bool = True) -> None:
        """One line; ``{t}`` in it becomes a fresh token owned by ``owner``."""
        if "{t}" in text:
            token = self.token()
            text = text.replace("{t}", token)
            if spot:
                self.spots.append(Spot(token, len(self.lines) + 1, owner))
        self.lines.append(text)

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _body(draw: st.DrawFn, mod: Module, depth: int, pad: str, size: int) -> None:
    for _ in range(size):
        if draw(st.booleans()) and draw(st.booleans()):
            mod.emit("", None, spot=False)
        if draw(st.integers(0, 5)) == 0:
            mod.emit(pad + "# a comment {t}", None)
        _statement(draw, mod, depth, pad)


def _suite(draw: st.DrawFn, mod: Module, depth: int, pad: str) -> None:
    if draw(st.booleans()):
        mod.emit(pad + "    # first in the body {t}", None)
    _body(draw, mod, depth + 1, pad + "    ", draw(st.integers(1, 2 if depth else 3)))


SIMPLE = ("assign", "call", "string", "backslash")
COMPOUND = ("def", "class", "if", "for", "while", "with", "try")


def _statement(draw: st.DrawFn, mod: Module, depth: int, pad: str) -> None:
    kinds = SIMPLE + (COMPOUND if depth < 3 else ())
    kind = draw(st.sampled_from(kinds))
    sid = mod.new_id()
    first = len(mod.lines) + 1
    e = mod.emit
    if kind == "assign":
        e(f"{pad}v_s{sid} = {sid}  # {{t}}", sid)
    elif kind == "call":
        e(f"{pad}call_s{sid}(  # {{t}}", sid)
        e(f'{pad}    "--flag-{{t}}",', sid)
        if draw(st.booleans()):
            e(f"{pad}    # inside the call {{t}}", sid)
        if draw(st.booleans()):
            e(f"{pad}    key=[  # {{t}}", sid)
            e(f"{pad}        1,", sid, spot=False)
            e(f"{pad}    ],", sid, spot=False)
        e(f"{pad}    default=None,  # {{t}}", sid)
        e(f"{pad})  # {{t}}", sid)
    elif kind == "string":
        e(f'{pad}doc_s{sid} = "{{t}}" + """', sid)
        e("def fake_{t}(a,", sid)
        e(f"    v_s9{sid} = 1  # A{sid}Y looks like an anchor", sid, spot=False)
        e("parser.add_argument(", sid, spot=False)
        e('"""  # {t}', sid)
    elif kind == "backslash":
        e(f'{pad}tot_s{sid} = "{{t}}" + \\', sid)
        e(f'{pad}    "{{t}}"  # {{t}}', sid)
    elif kind == "def":
        decorators = draw(st.integers(0, 2))
        if decorators:
            e(f"{pad}@deco_s{sid}(  # {{t}}", sid)
            e(f'{pad}    "{{t}}",', sid)
            e(f"{pad})", sid, spot=False)
        if decorators > 1:
            e(f"{pad}@plain  # {{t}}", sid)
        name = f"f_s{sid}" if not decorators else "f"
        if draw(st.booleans()):
            e(f"{pad}def {name}(a,  # {{t}}", sid)
            e(f"{pad}        b=1):  # {{t}}", sid)
        else:
            e(f"{pad}def {name}(a):  # {{t}}", sid)
        _suite(draw, mod, depth, pad)
    elif kind == "class":
        e(f"{pad}class C_s{sid}(object):  # {{t}}", sid)
        _suite(draw, mod, depth, pad)
    elif kind == "if":
        e(f"{pad}if cond_s{sid}:  # {{t}}", sid)
        _suite(draw, mod, depth, pad)
        if draw(st.booleans()):
            e(f"{pad}elif other:  # {{t}}", sid)
            _suite(draw, mod, depth, pad)
        if draw(st.booleans()):
            e(f"{pad}else:  # {{t}}", sid)
            _suite(draw, mod, depth, pad)
    elif kind == "for":
        e(f"{pad}for i_s{sid} in range(2):  # {{t}}", sid)
        _suite(draw, mod, depth, pad)
        if draw(st.booleans()):
            e(f"{pad}else:  # {{t}}", sid)
            _suite(draw, mod, depth, pad)
    elif kind == "while":
        e(f"{pad}while cond_s{sid}:  # {{t}}", sid)
        _suite(draw, mod, depth, pad)
    elif kind == "with":
        e(f"{pad}with ctx_s{sid}(  # {{t}}", sid)
        e(f'{pad}    "{{t}}",', sid)
        e(f"{pad}) as handle:  # {{t}}", sid)
        _suite(draw, mod, depth, pad)
    elif kind == "try":
        e(f"{pad}try:  # id_s{sid} {{t}}", sid)
        _suite(draw, mod, depth, pad)
        e(f"{pad}except (ValueError,  # {{t}}", sid)
        e(f"{pad}        KeyError):  # {{t}}", sid)
        _suite(draw, mod, depth, pad)
        if draw(st.booleans()):
            e(f"{pad}finally:  # {{t}}", sid)
            _suite(draw, mod, depth, pad)
    mod.spans[sid] = (first, len(mod.lines))


@st.composite
def modules(draw: st.DrawFn) -> Module:
    mod = Module()
    if draw(st.booleans()):
        mod.emit('"""Module docstring: def fake(): parser.add_argument( A0Y"""', None, spot=False)
    _body(draw, mod, 0, "", draw(st.integers(1, 5)))
    return mod


@st.composite
def cases(draw: st.DrawFn) -> tuple[Module, Spot, EditSpec]:
    mod = draw(modules())
    spot = draw(st.sampled_from(mod.spots))
    side = draw(st.sampled_from(["after", "before"]))
    markers = draw(st.booleans())
    spec = EditSpec(
        kind="insert",
        text=draw(st.sampled_from(INSERTS)),
        anchor=Anchor(side, spot.token),  # type: ignore[arg-type]
        markers=markers,
        marker_id="prop",
        file="playbooks/p.yaml",
        line=3,
        key="files[0].edits[0]",
    )
    return mod, spot, spec


def _inserted(tree: ast.Module, lines: list[str]) -> tuple[list[ast.stmt], int]:
    """The statement list holding the one inserted statement, and its index."""
    found: list[tuple[list[ast.stmt], int]] = []
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            body = getattr(node, name, None)
            if not isinstance(body, list):
                continue
            for index, stmt in enumerate(body):
                first = _first_line(stmt)
                if "INS" in lines[first - 1]:
                    found.append((body, index))
    assert len(found) == 1, f"expected one inserted statement, found {len(found)}"
    return found[0]


def _first_line(stmt: ast.stmt) -> int:
    decorators = getattr(stmt, "decorator_list", None) or []
    return min([d.lineno for d in decorators] + [stmt.lineno])


def _id_of(stmt: ast.stmt, lines: list[str]) -> int | None:
    match = re.search(r"_s(\d+)\b", lines[_first_line(stmt) - 1])
    return int(match.group(1)) if match else None


@SETTINGS
@given(cases())
def test_insert_lands_beside_the_whole_statement(case: tuple[Module, Spot, EditSpec]) -> None:
    mod, spot, spec = case
    original = mod.text
    plan = plan_file("gen.py", original, [spec])
    result_lines = plan.result.splitlines()

    # The result parses, and is structurally the original plus the inserted statement.
    tree = ast.parse(plan.result)
    check_structure(plan, [spec])
    body, index = _inserted(tree, result_lines)
    inserted = body.pop(index)
    assert ast.dump(tree) == ast.dump(ast.parse(original))

    # Where it landed: beside the statement that owns the anchor line, as its sibling.
    assert spec.anchor is not None
    if spot.target is not None:
        neighbour_index = index - 1 if spec.anchor.side == "after" else index
        assert 0 <= neighbour_index < len(body), "the inserted statement has no neighbour"
        assert _id_of(body[neighbour_index], result_lines) == spot.target
    else:  # a comment line: the block is right beside the line itself
        first = _first_line(inserted) - (1 if spec.markers else 0)
        last = inserted.end_lineno + (1 if spec.markers else 0)  # type: ignore[operator]
        comment_at = first - 1 if spec.anchor.side == "after" else last + 1
        assert spot.token in result_lines[comment_at - 1]

    # Re-planning the applied file changes nothing.
    again = plan_file("gen.py", plan.result, [spec])
    assert again.result == plan.result
    assert not again.changed


@SETTINGS
@given(cases())
def test_the_naive_line_insert_is_refused(case: tuple[Module, Spot, EditSpec]) -> None:
    """What a line-based tool does — the block beside the anchor *line* — never passes."""
    mod, spot, spec = case
    assert spec.anchor is not None
    if spot.target is None:
        return  # a comment line: the line is the place, the naive insert is the right one
    first, last = mod.spans[spot.target]
    after = spec.anchor.side == "after"
    if (after and spot.line == last) or (not after and spot.line == first):
        return  # the anchor line is the statement's edge: naive and right coincide
    line = mod.lines[spot.line - 1]
    pad = line[: len(line) - len(line.lstrip())]
    block = [pad + row if row.strip() else "" for row in spec.text.rstrip("\n").split("\n")]
    at = spot.line if after else spot.line - 1
    broken = mod.lines[:at] + block + mod.lines[at:]
    change = Change(0, "insert", at + 1, at, at + 1, at + len(block))
    plan = FilePlan("gen.py", mod.text, "\n".join(broken) + "\n", (change,))
    with pytest.raises(StructureError):
        check_structure(plan, [spec])


@SETTINGS
@given(modules(), st.data())
def test_two_inserts_and_a_delete_keep_the_structure(mod: Module, data: st.DataObject) -> None:
    assume(len(mod.spots) >= 2)
    spots = data.draw(
        st.lists(st.sampled_from(mod.spots), min_size=2, max_size=2, unique_by=lambda s: s.token)
    )
    edits = [
        EditSpec(
            kind="insert",
            # (no anchor-like text here: an insert that adds a later edit's anchor
            # makes that anchor ambiguous, and refusing it is right)
            text=data.draw(st.sampled_from(INSERTS))
            .replace("INS", f"INS{n}")
            .replace("A1Z", "A1Y"),
            anchor=Anchor(data.draw(st.sampled_from(["after", "before"])), spot.token),  # type: ignore[arg-type]
            markers=data.draw(st.booleans()),
            marker_id=f"m{n}",
        )
        for n, spot in enumerate(spots)
    ]
    victims = [s for s in mod.spots if s.target is not None and s not in spots]
    if victims and data.draw(st.booleans()):
        victim = data.draw(st.sampled_from(victims))
        owners = {s.target for s in spots}
        first, last = mod.spans[victim.target]  # type: ignore[index]
        # Only delete statements that hold no anchor of the inserts.
        if not any(first <= s.line <= last for s in spots) and victim.target not in owners:
            edits.append(EditSpec(kind="delete", anchor=Anchor("after", victim.token)))
    plan = plan_file("gen.py", mod.text, edits)
    try:
        check_structure(plan, edits)
    except StructureError as exc:
        # Deleting the only statement of a body leaves it empty: refusing that is right.
        assert edits[-1].kind == "delete" and "does not parse" in str(exc)
        return
    assert plan_file("gen.py", plan.result, edits).result == plan.result


@st.composite
def change_lists(draw: st.DrawFn) -> tuple[list[Change], int]:
    total = draw(st.integers(1, 80))
    changes = []
    for _ in range(draw(st.integers(0, 6))):
        start = draw(st.integers(1, total + 1))
        size = draw(st.integers(0, max(0, total + 1 - start)))
        changes.append(Change(0, "insert", start, start - 1, start, start + size - 1))
    return changes, total


@SETTINGS
@given(change_lists(), st.integers(0, 5))
def test_view_ranges_cover_every_change_once(case: tuple[list[Change], int], context: int) -> None:
    changes, total = case
    ranges = view_ranges(changes, total, context)
    for prev, nxt in zip(ranges, ranges[1:], strict=False):
        assert prev.end + 1 < nxt.start  # sorted, apart (touching ones are merged)
    for view in ranges:
        assert 1 <= view.start <= view.end <= total
        assert all(view.start <= n <= view.end for n in view.highlight)
    shown = {n for view in ranges for n in range(view.start, view.end + 1)}
    lit = {n for view in ranges for n in view.highlight}
    for change in changes:
        changed = set(range(change.new_start, change.new_end + 1))
        assert changed <= lit
        # A pure insertion/deletion spot sits before new_start: context on both sides of it.
        first, last = change.new_start - context, change.new_end + context
        assert set(range(max(1, first), min(total, last) + 1)) <= shown
    assert lit == {n for c in changes for n in range(c.new_start, c.new_end + 1)}
