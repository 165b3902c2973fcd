"""Anchors: which place in a file an edit lands beside.

The story behind orch is an insert that landed *inside* a multi-line
``parser.add_argument(`` call because the script anchored on a line. Here a
line only names a place: in a ``.py`` file the place is the innermost whole
Python statement containing that line (a compound statement when the line is
on its header, a clause header such as ``else:`` or a decorator), found from
the ``ast`` and ``tokenize`` views of the text. In other files, or on a
comment or blank line between statements, the place is the line itself.

Pure: text in, places out. ``PySource`` is also the statement index the
structural check (``core.structure``) works from.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.core.edit_spec import Anchor, EditSpec
from orchestrator.core.pyindex import (
    MODULE_BODY,
    BodyKey,
    LogicalLine,
    PySource,
    StmtInfo,
    leading_ws,
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


def anchor_key(spec: EditSpec) -> str | None:
    """The playbook key that holds ``spec``'s anchor (``after``, ``delete_regex`` …)."""
    anchor = spec.anchor
    base = "delete" if spec.kind == "delete" else (anchor.side if anchor else "after")
    return sub_key(spec, base + ("_regex" if anchor and anchor.regex else ""))


def edit_error(spec: EditSpec, message: str, sub: str | None = None) -> EditError:
    key = sub_key(spec, sub) if sub else spec.key
    return EditError(message, file=spec.file, line=spec.line, key=key)


def shorten(text: str, width: int = 90) -> str:
    text = text.strip()
    return text if len(text) <= width else text[: width - 3] + "..."


# --------------------------------------------------------------------------- places


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


def places_for(path: str, text: str, anchor: Anchor, src: PySource | None = None) -> list[Place]:
    """Every distinct place the anchor names (lines naming the same place count once).

    Raises ``ValueError`` for a bad regex or a comment line with no room.
    """
    lines = src.raw if src is not None else split_lines(text)
    rows = matching_lines(lines, anchor)
    places: dict[tuple[int, int], Place] = {}
    for row in rows:
        if src is not None:
            place = resolve_python_line(src, row)
        else:
            place = Place(row, row, leading_ws(lines[row - 1]), False, row)
        places.setdefault((place.start, place.end), place)
    return sorted(places.values(), key=lambda p: p.start)


def describe_candidates(text: str, places: Sequence[Place], limit: int = 10) -> str:
    """``line N: text; …`` for the first ``limit`` places (one line, for an error)."""
    lines = split_lines(text)
    shown = "; ".join(
        f"line {p.line}: {shorten(strip_eol(lines[p.line - 1]))}" for p in places[:limit]
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


def locate(
    path: str,
    text: str,
    spec: EditSpec,
    src: PySource | None,
    *,
    allow_missing: bool = False,
) -> Place | None:
    """The one place ``spec.anchor`` names, or ``AnchorError`` listing the candidates.

    With ``allow_missing`` zero matches give ``None`` (a delete already done).
    """
    anchor = spec.anchor
    key = anchor_key(spec)
    if anchor is None or not anchor.pattern:
        raise AnchorError(f"{spec.kind} needs an anchor", file=spec.file, line=spec.line, key=key)
    try:
        places = places_for(path, text, anchor, src)
    except ValueError as exc:
        raise AnchorError(str(exc), file=spec.file, line=spec.line, key=key) from None
    if len(places) == 1:
        return places[0]
    if not places:
        if allow_missing:
            return None
        hints = did_you_mean(text, anchor.pattern)
        hint = ""
        if hints:
            hint = "; did you mean: " + "; ".join(f"line {r}: {shorten(t)}" for r, t in hints)
        raise AnchorError(
            f"anchor matches 0 places in {path}{hint}", file=spec.file, line=spec.line, key=key
        )
    raise AnchorError(
        f"anchor matches {len(places)} places in {path}: {describe_candidates(text, places)}",
        file=spec.file,
        line=spec.line,
        key=key,
    )
