"""The structural check: the edited Python file is the original plus exactly the plan.

This is the check that would have stopped the story's patch: a block put
between a call's ``default=`` line and its ``)`` is not a whole statement.
It trusts nothing the planner did; it looks at the original, the result and
the recorded changes only:

1. every insertion point and every deleted range sits between whole logical
   lines of the original (never inside a bracketed call, a string, a header,
   or between decorators and their ``def``);
2. the result compiles;
3. each inserted block (marker comments aside) is whole statements, siblings
   in one body, beside the statement its anchor names and in that
   statement's body;
4. when the plan only inserts and deletes: the result's AST with the
   inserted statements removed equals the original's AST with the deleted
   (and replaced-in-place) statements removed (``ast.dump``, positions
   ignored). A replace or a patch changes code on purpose; there compiling
   is the check.

The work is proportional to the file and the change: the original is
tokenized once (or not at all, when the planner's index comes with the
plan), the result is the original line for line outside the recorded
changes (checked by comparing lines), and only the top-level statements
around each change (``pyindex.Window``) are parsed, compiled and compared.
Those windows start and end at top-level statement boundaries of an
unchanged text, so the rest of the file parses exactly as the original did;
a result that differs from the original where no change is recorded is
checked as one window, the whole file.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import replace

from orchestrator.core.anchors import is_python, literal_statements, places_for
from orchestrator.core.edit_spec import Change, EditSpec, FilePlan
from orchestrator.core.edits import ELEMENT, IN_PLACE
from orchestrator.core.pyindex import (
    PySource,
    StmtInfo,
    Window,
    compile_ast,
    split_bom,
    split_lines,
)
from orchestrator.errors import StructureError

_NODE_NAMES: tuple[tuple[type, str], ...] = (
    (ast.Call, "call"),
    (ast.List, "list"),
    (ast.Tuple, "tuple"),
    (ast.Dict, "dict"),
    (ast.Set, "set"),
    (ast.JoinedStr, "f-string"),
    (ast.Subscript, "subscript"),
    (ast.ListComp, "comprehension"),
    (ast.SetComp, "comprehension"),
    (ast.DictComp, "comprehension"),
    (ast.GeneratorExp, "generator expression"),
    (ast.Lambda, "lambda"),
    (ast.BinOp, "expression"),
    (ast.BoolOp, "expression"),
    (ast.Compare, "expression"),
)

_STMT_NAMES: dict[type, str] = {
    ast.FunctionDef: "`def` header",
    ast.AsyncFunctionDef: "`async def` header",
    ast.ClassDef: "`class` header",
    ast.If: "`if` header",
    ast.For: "`for` header",
    ast.AsyncFor: "`async for` header",
    ast.While: "`while` header",
    ast.With: "`with` header",
    ast.AsyncWith: "`async with` header",
    ast.Match: "`match` header",
    ast.Assign: "assignment",
    ast.AnnAssign: "annotated assignment",
    ast.AugAssign: "assignment",
    ast.Return: "`return` statement",
    ast.Import: "import",
    ast.ImportFrom: "import",
    ast.Assert: "`assert` statement",
    ast.Raise: "`raise` statement",
    ast.Delete: "`del` statement",
}


def _describe(stmt: ast.stmt, row: int) -> tuple[str, int]:
    """Name the innermost construct of ``stmt`` spanning rows ``row`` and ``row + 1``."""
    best: ast.AST | None = None
    for node in ast.walk(stmt):
        lineno = getattr(node, "lineno", None)
        end = getattr(node, "end_lineno", None)
        if lineno is None or end is None or not (lineno <= row and end >= row + 1):
            continue
        if best is None or (lineno, node.col_offset) >= (best.lineno, best.col_offset):  # type: ignore[attr-defined]
            best = node
    node = best or stmt
    at: int = getattr(node, "lineno", stmt.lineno)  # every node the walk kept has one
    if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
        return "string", at
    for kind, name in _NODE_NAMES:
        if isinstance(node, kind):
            return name, at
    if isinstance(node, ast.stmt):
        return _STMT_NAMES.get(type(node), "statement"), at
    return "statement", stmt.lineno


class _Shift:
    """Original line numbers -> result line numbers, from the recorded changes."""

    def __init__(self, changes: Sequence[Change]) -> None:
        self.changes = changes

    def __call__(self, row: int) -> int:
        shift = 0
        for change in self.changes:
            if change.old_start <= row and change.old_end < row:
                shift += (change.new_end - change.new_start) - (change.old_end - change.old_start)
        return row + shift


def _span(first: int, last: int) -> str:
    return f"lines {first}-{last}" if last > first else f"line {first}"


def _whole(first: int, last: int) -> str:
    return "whole statements" if last > first else "a whole statement"


def _fall(first: int, last: int) -> str:
    return "they fall" if last > first else "it falls"


def _are(first: int, last: int) -> str:
    """``lines 5-7 are`` / ``line 6 is``, for messages about an edited range."""
    return _span(first, last) + (" are" if last > first else " is")


def _gap_problem(src: PySource, row: int) -> tuple[str, int] | None:
    """Why nothing may go between lines ``row`` and ``row + 1`` of ``src``, if so."""
    here, there = src.ll_index(row), src.ll_index(row + 1)
    if here is not None and here == there:
        info = src.statement_at(row)
        if info is not None:
            name, line = _describe(info.node, row)
            return f"inside the {name} that starts at line {line}", line
        return f"inside the logical line that starts at line {here}", row
    info = src.decorated_around(row)
    if info is not None and row + 1 <= info.node.lineno:
        return (
            f"between the decorators and the {_STMT_NAMES.get(type(info.node), 'statement')} "
            f"that starts at line {info.start}"
        ), info.start
    return None


def _check_original_side(path: str, orig: PySource, changes: Sequence[Change]) -> None:
    shift = _Shift(changes)
    for change in changes:
        if change.kind not in ("insert", "delete") or change.note == ELEMENT:
            continue
        if change.old_end >= change.old_start:
            gaps = [change.old_start - 1, change.old_end]
        else:
            gaps = [change.old_start - 1]
        for gap in gaps:
            problem = _gap_problem(orig, gap)
            if problem is None:
                continue
            text, line = problem
            text = text.replace(f"line {line}", f"line {shift(line)}")
            if change.new_end >= change.new_start:
                lines = _span(change.new_start, change.new_end)
            else:
                lines = _span(change.old_start, change.old_end) + " of the original"
            plural = lines.startswith("lines")
            whole = "are not whole statements" if plural else "is not a whole statement"
            fall = "they fall" if plural else "it falls"
            raise StructureError(f"{path}: {lines} {whole}: {fall} {text}")


def _check_block(
    path: str,
    res: PySource,
    change: Change,
    edits: Sequence[EditSpec],
    inserted: Sequence[tuple[int, int]],
) -> None:
    a, b = change.new_start, change.new_end
    lines = _are(a, b)
    for ll in res.lls_overlapping(a, b):
        if ll.first < a or ll.last > b:
            row = a - 1 if ll.first < a else b
            info = res.statement_at(row)
            name, line = _describe(info.node, row) if info else ("statement", ll.first)
            raise StructureError(
                f"{path}: {lines} not {_whole(a, b)}: {_fall(a, b)} inside the {name} "
                f"that starts at line {line}"
            )
    inside: list[StmtInfo] = []
    for info in res.stmts_overlapping(a, b):
        if a <= info.start and info.end <= b:
            inside.append(info)
            continue
        for key in res.own_lls(info):
            ll = res.logical_line(key)
            if a <= ll.first <= b:
                raise StructureError(
                    f"{path}: {lines} not {_whole(a, b)}: line {ll.first} "
                    f"({ll.head} …) belongs to the statement that starts at line {info.start}"
                )
    ids = {id(info) for info in inside}
    top = [info for info in inside if info.owner is None or id(info.owner) not in ids]
    if not top:
        return  # comments only
    bodies = {info.body for info in top}
    if len(bodies) > 1:
        raise StructureError(
            f"{path}: {lines} not siblings in one body: "
            + "; ".join(f"line {info.start} is at indentation level {_depth(info)}" for info in top)
        )
    first, last = min(i.start for i in top), max(i.end for i in top)
    siblings = [i for i in res.stmts_overlapping(first, last) if i.body == top[0].body]
    if any(id(i) not in ids for i in siblings):
        raise StructureError(f"{path}: {lines} not consecutive statements of one body")
    _check_beside_anchor(path, res, change, edits, inserted, top)


def _depth(info: StmtInfo) -> int:
    depth = 0
    while info.owner is not None:
        depth, info = depth + 1, info.owner
    return depth


def _check_beside_anchor(
    path: str,
    res: PySource,
    change: Change,
    edits: Sequence[EditSpec],
    inserted: Sequence[tuple[int, int]],
    top: Sequence[StmtInfo],
) -> None:
    """An inserted block sits right after (before) the statement its anchor names, as a sibling."""
    if change.note == IN_PLACE or not 0 <= change.edit_index < len(edits):
        return
    spec = edits[change.edit_index]
    if spec.kind != "insert" or spec.anchor is None:
        return
    try:
        places = places_for(path, res.text, spec.anchor, res)
    except ValueError:
        return
    if not places:
        return  # the anchor is gone (a later edit removed it): nothing to compare with
    after = spec.anchor.side == "after"
    # Rows between the block and its anchor statement may hold comments, blank
    # lines and other inserted blocks, nothing else.
    others = [r for r in inserted if r != (change.new_start, change.new_end)]
    neighbours: list[int] = []
    row = change.new_start - 1 if after else change.new_end + 1
    while 1 <= row <= res.nlines:
        neighbours.append(row)
        block = next((r for r in others if (r[1] if after else r[0]) == row), None)
        if block is not None:  # (a later insert may have extended the anchor statement)
            neighbours.extend(range(block[0], block[1] + 1))
            row = block[0] - 1 if after else block[1] + 1
        elif res.ll_index(row) is None:
            row = row - 1 if after else row + 1
        else:
            break
    lines = _are(change.new_start, change.new_end)
    for place in places:
        edge = place.end if after else place.start
        if edge not in neighbours:
            continue
        if place.statement:
            anchor_stmt = next(
                (
                    s
                    for s in res.stmts_overlapping(place.start, place.start)
                    if s.start == place.start and s.end <= place.end
                ),
                None,
            )
            if anchor_stmt is not None and anchor_stmt.body != top[0].body:
                raise StructureError(
                    f"{path}: {lines} not in the body of the statement their anchor names "
                    f"({_span(place.start, place.end)}): the block is at indentation level "
                    f"{_depth(top[0])}, the statement at level {_depth(anchor_stmt)}"
                )
        return
    names = ", ".join(_span(p.start, p.end) for p in places)
    side = "after" if after else "before"
    raise StructureError(
        f"{path}: {lines} not right {side} the statement their anchor names ({names})"
    )


_LITERALS = (ast.List, ast.Tuple, ast.Set, ast.Dict)


def _entries(node: ast.expr) -> list[tuple[ast.expr, ast.expr, ast.expr]]:
    """``(node to drop, first node, last node)`` per element (a dict entry is key and value)."""
    if isinstance(node, ast.Dict):
        return [
            (v, k if k is not None else v, v) for k, v in zip(node.keys, node.values, strict=False)
        ]
    return [(e, e, e) for e in node.elts]  # type: ignore[attr-defined]


def _check_element_block(
    path: str, res: PySource, change: Change, edits: Sequence[EditSpec]
) -> list[ast.expr]:
    """An inserted element block is whole elements of the literal its anchor names; returns them."""
    a, b = change.new_start, change.new_end
    lines = _are(a, b)
    info = res.statement_at(a)
    spec = edits[change.edit_index] if 0 <= change.edit_index < len(edits) else None
    container = spec.anchor.pattern if spec and spec.anchor and spec.anchor.kind == "item" else None
    for node in ast.walk(info.node) if info else ():
        if not isinstance(node, _LITERALS) or not node.lineno < a <= b < (node.end_lineno or 0):
            continue
        inside: list[ast.expr] = []
        for drop, first, last in _entries(node):
            begin, end = first.lineno, last.end_lineno or last.lineno
            if a <= begin and end <= b:
                inside.append(drop)
            elif begin <= b and end >= a:
                raise StructureError(
                    f"{path}: {lines} not whole elements: the element at line {begin} "
                    f"reaches outside them"
                )
        if not inside:
            continue
        if container is not None and info is not None:
            named = [stmt for stmt, _ in literal_statements(res, container) if stmt is info]
            if not named:
                raise StructureError(
                    f"{path}: {lines} not elements of {container}, which their anchor names"
                )
        return inside
    raise StructureError(f"{path}: {lines} not elements of a list, tuple, set or dict literal")


def _dumps_without(
    src: PySource,
    first: int,
    last: int,
    ranges: Sequence[tuple[int, int]],
    elements: Sequence[ast.expr] = (),
) -> list[tuple[int, object]]:
    """``(line, shape)`` of the top-level statements in rows ``first..last``, minus those in
    ``ranges`` and minus the literal ``elements`` (inserted ones).

    A shape is the AST as nested tuples without positions (what ``ast.dump``
    compares), built without copying or changing the index's trees.
    """
    if last < first:
        return []
    chunks = src.chunks_overlapping(first, last)
    drop = {
        id(info.node)
        for chunk in chunks
        for info in chunk.stmts
        if any(lo <= info.start and info.end <= hi for lo, hi in ranges)
    }
    drop |= {id(element) for element in elements}
    return [
        (node.lineno, _shape(node, drop))
        for chunk in chunks
        for node in chunk.nodes
        if id(node) not in drop
    ]


def _shape(node: object, drop: set[int]) -> object:
    """``node`` as comparable nested tuples, leaving out the nodes in ``drop``."""
    if isinstance(node, ast.Dict):
        pairs = [(k, v) for k, v in zip(node.keys, node.values, strict=False) if id(v) not in drop]
        return ("Dict", tuple(_shape(k, drop) for k, _ in pairs), tuple(_shape(v, drop) for _, v in pairs))
    if isinstance(node, ast.AST):
        return (type(node).__name__, *(_shape(getattr(node, f, None), drop) for f in node._fields))
    if isinstance(node, list):
        return tuple(_shape(item, drop) for item in node if id(item) not in drop)
    return (type(node).__name__, node)  # 1, 1.0 and True are equal values, not equal code


def _insert_blocks(changes: Sequence[Change]) -> list[Change]:
    """The inserted blocks of the result, each one range.

    A later replace or patch that rewrote lines of an inserted block (its run
    has no original lines) splits the insert's run in the change list; the
    block to check is the pieces together.
    """
    runs = sorted(
        (c for c in changes if c.new_end >= c.new_start and c.note != ELEMENT),
        key=lambda c: c.new_start,
    )
    blocks: list[Change] = []
    pending: list[Change] = []  # rewrites of new lines, not yet next to an insert
    for run in runs:
        rewrite = run.kind in ("replace", "patch") and run.old_end < run.old_start
        last = blocks[-1] if blocks else None
        touching = last is not None and last.new_end + 1 == run.new_start
        if run.kind == "insert":
            head = (
                pending[0].new_start
                if pending and pending[-1].new_end + 1 == run.new_start
                else run.new_start
            )
            if touching and last is not None and last.edit_index == run.edit_index:
                blocks[-1] = replace(last, new_end=run.new_end)
            else:
                blocks.append(replace(run, new_start=min(head, run.new_start)))
            pending = []
        elif rewrite and touching and last is not None:
            blocks[-1] = replace(last, new_end=run.new_end)
        elif rewrite:
            pending = (
                [*pending, run] if pending and pending[-1].new_end + 1 == run.new_start else [run]
            )
        else:
            pending = []
    return blocks


def _result_index(
    path: str, orig: PySource, original: str, result: str, changes: Sequence[Change]
) -> PySource:
    """The result's index, made from the original's by the recorded changes.

    Only when the result *is* the original outside the changes, line for line
    (checked here); otherwise the whole result is one window, read in full.
    """
    old = orig.raw
    new = split_lines(result)
    runs = sorted(changes, key=lambda c: (c.old_start, c.new_start))
    at_old = at_new = 1
    consistent = True
    for change in runs:
        same = change.old_start - at_old
        if (
            same < 0
            or change.new_start - at_new != same
            or old[at_old - 1 : change.old_start - 1] != new[at_new - 1 : change.new_start - 1]
        ):
            consistent = False
            break
        at_old = max(at_old, change.old_end + 1, change.old_start)
        at_new = max(at_new, change.new_end + 1, change.new_start)
    if consistent and (len(old) - at_old != len(new) - at_new or old[at_old - 1 :] != new[at_new - 1 :]):
        consistent = False
    if consistent and runs:
        splices = [(c.old_start, c.old_end, c.new_end - c.new_start + 1) for c in runs]
        return orig.spliced(path, result, splices)
    whole = PySource(path, result)
    whole.windows = (Window(1, len(old), 1, len(new)),)
    return whole


def _check_window_compiles(path: str, res: PySource, window: Window, flags: int) -> None:
    """Parse and compile the statements of one window (positions are the file's)."""
    try:
        nodes = res.top_nodes(window.new_first, window.new_last)
    except SyntaxError as exc:
        raise StructureError(f"after the edits, {exc.msg}") from None
    first_real = res.first_statement_row()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__" and node.lineno > first_real:
            raise StructureError(
                f"after the edits, {path} does not compile: line {node.lineno}: "
                "from __future__ imports must occur at the beginning of the file"
            )
    try:
        compile_ast(ast.Module(body=nodes, type_ignores=[]), path, flags)
    except (SyntaxError, ValueError) as exc:
        where = f"line {exc.lineno}: {exc.msg}" if isinstance(exc, SyntaxError) else str(exc)
        raise StructureError(f"after the edits, {path} does not compile: {where}") from None


def check_structure(plan: FilePlan, edits: Sequence[EditSpec]) -> None:
    """Raise ``StructureError`` unless ``plan.result`` is the original plus exactly the plan.

    A no-op for files that are not ``.py`` and for unchanged plans. A UTF-8
    byte order mark before line 1 is not part of the code (Python skips it).
    """
    path = plan.path
    if not is_python(path) or not plan.changed:
        return
    original, result = split_bom(plan.original)[1], split_bom(plan.result)[1]
    orig = plan.index if isinstance(plan.index, PySource) and plan.index.text == original else None
    try:
        orig = orig or PySource(path, original)
        flags = orig.future_flags()
        changes = list(plan.changes)
        _check_original_side(path, orig, changes)
    except SyntaxError as exc:
        raise StructureError(f"the original {exc.msg}") from None
    try:
        res = _result_index(path, orig, original, result, changes)
    except SyntaxError as exc:
        raise StructureError(f"after the edits, {exc.msg}") from None
    for window in res.windows:
        _check_window_compiles(path, res, window, flags)
    blocks = _insert_blocks(changes)
    inserted = [(c.new_start, c.new_end) for c in blocks]
    for block in blocks:
        _check_block(path, res, block, edits, inserted)
    elements = [
        element
        for change in changes
        if change.note == ELEMENT
        for element in _check_element_block(path, res, change, edits)
    ]
    if any(c.kind not in ("insert", "delete") for c in changes):
        return
    removed = [(c.old_start, c.old_end) for c in changes if c.old_end >= c.old_start]
    for window in res.windows:
        before = _dumps_without(orig, window.old_first, window.old_last, removed)
        after = _dumps_without(res, window.new_first, window.new_last, inserted, elements)
        if [dump for _, dump in before] == [dump for _, dump in after]:
            continue
        line = next(
            (ln for (ln, x), (_, y) in zip(after, before, strict=False) if x != y),
            after[len(before)][0] if len(after) > len(before) else (after[-1][0] if after else 1),
        )
        raise StructureError(
            f"{path}: the edited file is not the original plus exactly the planned statements "
            f"(first difference in the top-level statement at line {line})"
        )
