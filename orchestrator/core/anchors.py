"""Anchors: which place in a file an edit lands beside.

The story behind orch is an insert that landed *inside* a multi-line
``parser.add_argument(`` call because the script anchored on a line. Here a
line only names a place: in a ``.py`` file the place is the innermost whole
Python statement containing that line (a compound statement when the line is
on its header, a clause header such as ``else:`` or a decorator), found from
the ``ast`` and ``tokenize`` views of the text. In other files, or on a
comment or blank line between statements, the place is the line itself. A
line that is an element of a multi-line list/tuple/set/dict literal names no
place: ``after:`` would land after the whole assignment, so it is refused
with the structural anchor to use instead.

Structural anchors name a place by what it is, not by its text: a class
field (``field_statements``), the statement holding a call whose first
argument is a given string (``call_statements``), an element of a literal
assigned to a name (``literal_statements``; the place is the element, and
the insert an element). Each is found by a cheap text search for candidate
lines, confirmed on the AST.

Pure: text in, places out. The statement index is ``core.pyindex.PySource``.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator.core.edit_spec import Anchor, EditSpec
from orchestrator.core.pyindex import (
    MODULE_BODY,
    BodyKey,
    LogicalLine,
    PySource,
    StmtInfo,
    leading_ws,
    rows_containing,
    split_lines,
    strip_eol,
)
from orchestrator.errors import AnchorError, EditError

# --------------------------------------------------------------------------- text


def newline_of(text: str) -> str:
    """The file's line ending, so inserted lines match the lines around them."""
    return "\r\n" if "\r\n" in text else "\n"


_SLASH_COMMENT_SUFFIXES = (".c", ".cc", ".cpp", ".h", ".hpp", ".js", ".ts", ".go", ".rs", ".java")


def comment_prefix(path: str, comment: str | None = None) -> str:
    """The comment leader for marker lines: ``comment`` if given, else by file type."""
    if comment:
        return comment
    return "//" if path.lower().endswith(_SLASH_COMMENT_SUFFIXES) else "#"


def is_python(path: str) -> bool:
    return path.endswith(".py")


def sub_key(spec: EditSpec, sub: str) -> str | None:
    """The error key of one part of an edit, e.g. ``files[0].edits[1].after``."""
    if not spec.key:
        return None
    if spec.key == sub or spec.key.endswith("." + sub):
        return spec.key
    return f"{spec.key}.{sub}"


_KIND_SUFFIX = {"text": "", "field": "_field", "call": "_call", "item": "_item"}


def anchor_key(spec: EditSpec) -> str | None:
    """The playbook key that holds ``spec``'s anchor (``after``, ``delete_regex``, ``after_call`` …)."""
    anchor = spec.anchor
    if spec.kind == "delete":
        return sub_key(spec, "delete" + ("_regex" if anchor and anchor.regex else ""))
    if anchor is None:
        return sub_key(spec, "after")
    if anchor.kind == "item":
        return sub_key(spec, "into")
    suffix = "_regex" if anchor.regex else _KIND_SUFFIX[anchor.kind]
    return sub_key(spec, anchor.side + suffix)


def edit_error(spec: EditSpec, message: str, sub: str | None = None) -> EditError:
    key = sub_key(spec, sub) if sub else spec.key
    return EditError(message, file=spec.file, line=spec.line, key=key)


def shorten(text: str, width: int = 90) -> str:
    text = text.strip()
    return text if len(text) <= width else text[: width - 3] + "..."


# --------------------------------------------------------------------------- places


LineLabel = Callable[[int], str]
"""How a message names row N of the text being edited (the planner says which line on disk)."""


def _line_label(row: int) -> str:
    return f"line {row}"


def span_label(label: LineLabel, first: int, last: int) -> str:
    """``lines A-B`` (or ``line A``) with each row named by ``label``."""
    a, b = label(first), label(last)
    if first == last:
        return a
    if a.startswith("line ") and b.startswith("line "):
        return f"lines {a[5:]}-{b[5:]}"
    return f"{a} to {b}"


@dataclass(frozen=True)
class Place:
    """Where an edit lands: rows ``start..end`` of the current text, and their indentation.

    ``statement`` is false for a line place (a non-``.py`` line, or a comment
    or blank line between Python statements).
    """

    start: int
    end: int
    indent: str
    statement: bool
    line: int  # the (first) anchor line that named this place
    element: bool = False  # an element of a list/tuple/set/dict literal (an ``into`` anchor)
    # why no edit may go here, given how to name a line (the anchor names a place it cannot use)
    refusal: Callable[[LineLabel], str] | None = None


def matching_lines(lines: Sequence[str], anchor: Anchor) -> list[int]:
    """1-based numbers of the lines the anchor pattern matches."""
    if anchor.regex:
        try:
            rx = re.compile(anchor.pattern)
        except re.error as exc:
            raise ValueError(f"bad regex {anchor.pattern!r}: {exc}") from None
        return [n for n, line in enumerate(lines, 1) if rx.search(strip_eol(line))]
    pattern = anchor.pattern
    if "\r" in pattern or "\n" in pattern:
        return [n for n, line in enumerate(lines, 1) if pattern in strip_eol(line)]
    return [n for n, line in enumerate(lines, 1) if pattern in line]


def resolve_python_line(src: PySource, row: int) -> Place:
    """The place named by line ``row`` of a Python text (see the module docstring)."""
    key = src.ll_index(row)
    if key is None:
        around = src.decorated_around(row)  # a comment between decorators and their def
        if around is not None:
            return _statement_place(src, around, row)
        return _line_place(src, row)
    info = src.decorator_at(key) or src.clause_at(key) or src.header_at(key)
    if info is not None:
        return _statement_place(src, info, row)
    ll = src.logical_line(key)
    simple = src.simple_at(key)
    if simple:
        start = min(s.start for s in simple)
        end = max(s.end for s in simple)
        return Place(start, end, leading_ws(src.line(start)), True, row)
    return Place(ll.first, ll.last, ll.indent, True, row)


def _statement_place(src: PySource, info: StmtInfo, row: int) -> Place:
    return Place(info.start, info.end, leading_ws(src.line(info.start)), True, row)


class NoRoomError(ValueError):
    """A comment/blank line where no statement may go (e.g. between ``if x: y`` and ``else:``)."""


def _first_statement(src: PySource, ll: LogicalLine) -> StmtInfo | None:
    simple = src.simple_at(ll.first)
    return src.decorator_at(ll.first) or src.header_at(ll.first) or (simple[0] if simple else None)


def _line_place(src: PySource, row: int) -> Place:
    """A comment or blank line: the place is the line; find a legal indentation for it.

    A statement placed here must continue one of the statement lists that are
    open at this point (the previous statement's list or one enclosing it)
    and fit what follows (the next statement's list, or stay inside the
    compound statement whose ``else:``/``except`` comes next). The comment's
    own indentation wins when it is one of those.
    """
    prev = src.prev_ll(row)
    nxt = src.next_ll(row)
    next_body: BodyKey | None = None
    clause_owner: StmtInfo | None = None
    if nxt is not None:
        clause_owner = src.clause_at(nxt.first)
        if clause_owner is None:
            info = _first_statement(src, nxt)
            next_body = info.body if info else None
    if prev is None:
        chain = [next_body or MODULE_BODY]
    elif prev.opens_block:
        chain = [next_body] if next_body else []
    else:
        chain = src.open_bodies_after(prev.first)
    valid: list[BodyKey] = []
    for key in chain:
        if clause_owner is not None and key == clause_owner.body:
            break
        valid.append(key)
        if next_body is not None and key == next_body:
            break
    else:
        if next_body is not None and next_body not in valid:
            valid = [next_body]
    if not valid:
        raise NoRoomError(f"no statement can go at line {row}")
    line = src.line(row)
    own = leading_ws(line) if line.strip() else ""
    indents = {src.body_indent(key): key for key in reversed(valid)}
    if own in indents:
        indent = own
    elif next_body in valid:
        indent = src.body_indent(next_body)
    else:
        indent = src.body_indent(valid[0])
    return Place(row, row, indent, False, row)


def places_for(
    path: str, text: str, anchor: Anchor, src: PySource | None = None
) -> list[Place]:
    """Every distinct place the anchor names (lines naming the same place count once).

    Raises ``ValueError`` for a bad regex, a comment line with no room, or a
    structural anchor in a file that is not Python.
    """
    if anchor.kind != "text":
        if src is None:
            raise ValueError(f"{anchor.kind} anchors are for .py files ({path} is not one)")
        return _structural_places(src, anchor)
    lines = src.raw if src is not None else split_lines(text)
    rows = matching_lines(lines, anchor)
    places: dict[tuple[int, int], Place] = {}
    for row in rows:
        if src is not None:
            place = resolve_python_line(src, row)
            refusal = _inside_literal(src, row, anchor)
            if refusal:
                place = Place(place.start, place.end, place.indent, True, row, refusal=refusal)
        else:
            place = Place(row, row, leading_ws(lines[row - 1]), False, row)
        places.setdefault((place.start, place.end), place)
    return sorted(places.values(), key=lambda p: p.start)


# --------------------------------------------------------------------------- structural anchors

_LITERALS = (ast.List, ast.Tuple, ast.Set, ast.Dict)
_LITERAL_NAMES = {ast.List: "list", ast.Tuple: "tuple", ast.Set: "set", ast.Dict: "dict"}


def _elements(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.Dict):
        return [k if k is not None else v for k, v in zip(node.keys, node.values, strict=False)]
    return list(node.elts)  # type: ignore[attr-defined]


def _element_end(node: ast.Dict | ast.expr, element: ast.expr) -> ast.expr:
    """The last node of an element (a dict entry ends with its value)."""
    if isinstance(node, ast.Dict):
        index = next(i for i, k in enumerate(node.keys) if (k if k is not None else node.values[i]) is element)
        return node.values[index]
    return element


def _target_name(node: ast.stmt) -> str | None:
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    for target in targets:
        if isinstance(target, ast.Name | ast.Attribute):
            return ast.unparse(target)
    return None


def _inside_literal(src: PySource, row: int, anchor: Anchor) -> Callable[[LineLabel], str] | None:
    """Why a line anchor on ``row`` may not be used: it is an element of a multi-line literal.

    ``after:`` places whole statements; on an element it would land after
    the whole assignment, which is never what naming an element means.
    """
    info = src.statement_at(row)
    if info is None or info.compound:
        return None
    for node in ast.walk(info.node):
        if not isinstance(node, _LITERALS) or node.lineno >= row or (node.end_lineno or 0) < row:
            continue
        for element in _elements(node):
            last = _element_end(node, element)
            if element.lineno <= row <= (last.end_lineno or element.lineno):
                owner = _target_name(info.node)
                name = _LITERAL_NAMES[type(node)]
                what = f"the {name} {owner}" if owner else f"a {name}"
                item = element.value if isinstance(element, ast.Constant) else ast.unparse(element)
                fix = (
                    f"; to add an element use into: {owner} with {anchor.side}_item: {item!r}"
                    if owner
                    else ""
                )
                first, end = node.lineno, node.end_lineno or node.lineno
                start, stop = info.start, info.end
                return lambda label: (
                    f"{label(row)} is an element of {what} ({span_label(label, first, end)}): "
                    f"{anchor.side}: places whole statements and would land {anchor.side} the "
                    f"whole statement at {span_label(label, start, stop)}{fix}"
                )
    return None


def _rows_with(src: PySource, needles: Sequence[str]) -> list[int]:
    return rows_containing(src.raw, needles)


def _structural_places(src: PySource, anchor: Anchor) -> list[Place]:
    if anchor.kind == "field":
        found = field_statements(src, anchor.pattern)
        return [_statement_place(src, info, info.start) for info in found]
    if anchor.kind == "call":
        found = call_statements(src, anchor.pattern, anchor.arg)
        return [_statement_place(src, info, info.start) for info in found]
    return _item_places(src, anchor)


def field_statements(src: PySource, name: str) -> list[StmtInfo]:
    """The class-body annotated assignments declaring ``name`` (``Class.name`` or ``name``)."""
    owner, _, field_name = name.rpartition(".")
    rx = re.compile(rf"^\s*{re.escape(field_name)}\s*:")
    out: dict[int, StmtInfo] = {}
    for row in [n for n in rows_containing(src.raw, [field_name]) if rx.match(src.raw[n - 1])]:
        info = src.statement_at(row)
        node = info.node if info else None
        if (
            info is None
            or not isinstance(node, ast.AnnAssign)
            or not isinstance(node.target, ast.Name)
            or node.target.id != field_name
            or info.owner is None
            or not isinstance(info.owner.node, ast.ClassDef)
            or (owner and info.owner.node.name != owner.rpartition(".")[2])
        ):
            continue
        out[info.start] = info
    return [out[k] for k in sorted(out)]


def call_matches(func: ast.expr, wanted: str) -> bool:
    """``func`` is the function ``wanted`` names (a bare name matches any receiver's method)."""
    text = ast.unparse(func)
    if "." in wanted:
        return text == wanted
    return text == wanted or text.endswith("." + wanted)


def first_string_arg(call: ast.Call) -> str | None:
    if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        return call.args[0].value
    return None


def call_statements(src: PySource, func: str, arg: str | None) -> list[StmtInfo]:
    """Statements holding a call of ``func`` whose first argument is the string ``arg``."""
    needles = [f'"{arg}"', f"'{arg}'"] if arg else [func.rpartition(".")[2] + "("]
    out: dict[int, StmtInfo] = {}
    for row in _rows_with(src, needles):
        info = src.statement_at(row)
        if info is None or info.start in out:
            continue
        for node in ast.walk(info.node):
            if (
                isinstance(node, ast.Call)
                and call_matches(node.func, func)
                and (arg is None or first_string_arg(node) == arg)
            ):
                owner = src.statement_at(node.lineno)
                if owner is not None and owner.end >= (node.end_lineno or node.lineno):
                    out[owner.start] = owner
    return [out[k] for k in sorted(out)]


def literal_statements(src: PySource, name: str) -> list[tuple[StmtInfo, ast.expr]]:
    """Assignments of a list/tuple/set/dict literal to ``name``, with the literal."""
    rx = re.compile(rf"(^|[^\w.]){re.escape(name)}\s*(:[^=]*)?=")
    out: dict[int, tuple[StmtInfo, ast.expr]] = {}
    for row in [n for n, line in enumerate(src.raw, 1) if rx.search(line)]:
        info = src.statement_at(row)
        if info is None or not isinstance(info.node, ast.Assign | ast.AnnAssign):
            continue
        value = info.node.value
        if _target_name(info.node) == name and isinstance(value, _LITERALS):
            out[info.start] = (info, value)
    return [out[k] for k in sorted(out)]


def _item_places(src: PySource, anchor: Anchor) -> list[Place]:
    places: list[Place] = []
    for _info, literal in literal_statements(src, anchor.pattern):
        elements = _elements(literal)
        for index, element in enumerate(elements):
            shown = element.value if isinstance(element, ast.Constant) else ast.unparse(element)
            if str(shown) != anchor.arg and ast.unparse(element) != anchor.arg:
                continue
            last = _element_end(literal, element)
            first_row, last_row = element.lineno, last.end_lineno or element.lineno
            place = Place(
                first_row, last_row, leading_ws(src.line(first_row)), False, first_row, element=True
            )
            refusal = _element_refusal(src, literal, elements, index, anchor)
            places.append(
                Place(place.start, place.end, place.indent, False, place.line, True, refusal)
            )
    return places


def _element_refusal(
    src: PySource,
    literal: ast.expr,
    elements: list[ast.expr],
    index: int,
    anchor: Anchor,
) -> Callable[[LineLabel], str] | None:
    """Why an element cannot be placed beside ``elements[index]`` line-wise, if so."""
    element = elements[index]
    last = _element_end(literal, element)
    first_row, last_row = literal.lineno, literal.end_lineno or literal.lineno

    def name(label: LineLabel) -> str:
        kind = _LITERAL_NAMES[type(literal)]
        return f"the {kind} {anchor.pattern} ({span_label(label, first_row, last_row)})"

    if first_row == last_row:
        return lambda label: f"{name(label)} is written on one line; an element goes on a line of its own"
    previous = _element_end(literal, elements[index - 1]) if index else None
    following = elements[index + 1] if index + 1 < len(elements) else None
    if (
        element.lineno == first_row
        or (previous is not None and previous.end_lineno == element.lineno)
        or (following is not None and following.lineno == last.end_lineno)
    ):
        return lambda label: (
            f"{name(label)} has other elements on the line of {anchor.arg!r}; "
            "an element goes on a line of its own"
        )
    if anchor.side == "after":
        rest = src.line(last.end_lineno or last.lineno)[last.end_col_offset or 0 :].lstrip()
        if not rest.startswith(","):
            return lambda label: (
                f"{anchor.arg!r} is the last element of {name(label)} and has no trailing comma; "
                "add one, or use before_item"
            )
    return None


def describe_candidates(
    text: str,
    places: Sequence[Place],
    limit: int = 10,
    label: LineLabel = _line_label,
    lines: Sequence[str] | None = None,
) -> str:
    """``line N: text; …`` for the first ``limit`` places (one line, for an error)."""
    lines = lines if lines is not None else split_lines(text)
    shown = "; ".join(
        f"{label(p.line)}: {shorten(strip_eol(lines[p.line - 1]))}" for p in places[:limit]
    )
    more = len(places) - limit
    return shown + (f"; … and {more} more" if more > 0 else "")


def did_you_mean(text: str, pattern: str, limit: int = 3) -> list[tuple[int, str]]:
    """Up to ``limit`` lines close to ``pattern`` (difflib), for a zero-match anchor."""
    scored: list[tuple[float, int, str]] = []
    size = len(pattern)
    if not size:
        return []
    for row, raw in enumerate(split_lines(text), 1):
        line = strip_eol(raw).strip()
        if not line:
            continue
        matcher = difflib.SequenceMatcher(None, pattern, line, autojunk=False)
        match = matcher.find_longest_match(0, size, 0, len(line))
        if match.size < max(2, size // 3):
            continue
        begin = max(0, match.b - match.a)
        window = line[begin : begin + size + 2]
        score = difflib.SequenceMatcher(None, pattern, window, autojunk=False).ratio()
        if score >= 0.6:
            scored.append((score, row, line))
    scored.sort(key=lambda item: (-item[0], item[1]))
    return [(row, line) for _, row, line in scored[:limit]]


ZeroMatchHint = Callable[[Anchor], str]
"""Builds the "; did you mean: …" part of a zero-match error (the planner ranks by meaning)."""


def locate(
    path: str,
    text: str,
    spec: EditSpec,
    src: PySource | None,
    *,
    allow_missing: bool = False,
    exclude: tuple[int, int] | None = None,
    label: LineLabel = _line_label,
    hint: ZeroMatchHint | None = None,
) -> Place | None:
    """The one place ``spec.anchor`` names, or ``AnchorError`` listing the candidates.

    With ``allow_missing`` zero matches give ``None`` (a delete already done).
    Matches on rows ``exclude`` (a block being re-checked) do not count.
    """
    anchor = spec.anchor
    key = anchor_key(spec)
    if anchor is None or not anchor.pattern:
        raise AnchorError(f"{spec.kind} needs an anchor", file=spec.file, line=spec.line, key=key)
    try:
        places = places_for(path, text, anchor, src)
    except ValueError as exc:
        raise AnchorError(str(exc), file=spec.file, line=spec.line, key=key) from None
    if exclude is not None:
        places = [p for p in places if not exclude[0] <= p.line <= exclude[1]]
    if len(places) == 1:
        if places[0].refusal:
            raise AnchorError(places[0].refusal(label), file=spec.file, line=spec.line, key=key)
        return places[0]
    what = "" if anchor.kind == "text" else f" ({anchor.describe()})"
    if not places:
        if allow_missing:
            return None
        if hint is not None:
            extra = hint(anchor)
        elif anchor.kind == "text":
            close = did_you_mean(text, anchor.pattern)
            extra = "; did you mean: " + "; ".join(
                f"{label(r)}: {shorten(t)}" for r, t in close
            ) if close else ""
        else:
            extra = ""
        raise AnchorError(
            f"anchor matches 0 places in {path}{what}{extra}",
            file=spec.file,
            line=spec.line,
            key=key,
        )
    lines = src.raw if src is not None else None
    raise AnchorError(
        f"anchor matches {len(places)} places in {path}{what}: "
        f"{describe_candidates(text, places, label=label, lines=lines)}",
        file=spec.file,
        line=spec.line,
        key=key,
    )
