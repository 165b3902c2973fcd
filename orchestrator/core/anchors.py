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

import ast
import bisect
import difflib
import io
import re
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator.core.edit_spec import Anchor, EditSpec
from orchestrator.errors import AnchorError, EditError

# --------------------------------------------------------------------------- text


def split_lines(text: str) -> list[str]:
    """Lines with their endings, split on ``\\n`` only (what ``ast`` counts as a line).

    ``str.splitlines`` would also split on form feeds and other characters
    Python treats as whitespace, and line numbers would drift from ``ast``'s.
    """
    if not text:
        return []
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def strip_eol(line: str) -> str:
    """A line without its ``\\n`` / ``\\r\\n`` ending."""
    if line.endswith("\n"):
        line = line[:-1]
    if line.endswith("\r"):
        line = line[:-1]
    return line


def newline_of(text: str) -> str:
    """The file's line ending, so inserted lines match the lines around them."""
    return "\r\n" if "\r\n" in text else "\n"


def leading_ws(line: str) -> str:
    body = strip_eol(line)
    return body[: len(body) - len(body.lstrip(" \t"))]


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


# --------------------------------------------------------------------------- python index


@dataclass(frozen=True)
class LogicalLine:
    """One logical line of Python source (``tokenize``'s NEWLINE-terminated unit).

    A multi-line call, a bracketed header, a triple-quoted string or a
    backslash continuation is one logical line spanning rows ``first..last``;
    comment-only and blank lines between statements belong to none.
    """

    first: int
    last: int
    head: str
    indent: str
    opens_block: bool


BodyKey = tuple[int, str]  # (id of the node holding the list, field name)


@dataclass(eq=False)
class StmtInfo:
    """A real statement (``elif`` branches are clauses of their ``if``, not statements)."""

    node: ast.stmt
    start: int  # first row, decorators included
    end: int  # last row of its last logical line
    body: BodyKey  # the statement list it sits in
    owner: StmtInfo | None  # the enclosing real compound statement
    compound: bool


@dataclass(eq=False)
class BodyInfo:
    key: BodyKey
    owner: StmtInfo | None
    stmts: list[StmtInfo] = field(default_factory=list)

    @property
    def parent(self) -> BodyKey | None:
        return self.owner.body if self.owner else None


_COMPOUND = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.If,
    ast.With,
    ast.AsyncWith,
    ast.Try,
    ast.Match,
) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())

MODULE_BODY: BodyKey = (0, "module")


def parse_python(path: str, text: str) -> ast.Module:
    """``ast.parse`` with a one-line error naming the file and the line."""
    try:
        return ast.parse(text, filename=path)
    except SyntaxError as exc:
        raise SyntaxError(f"{path} does not parse: line {exc.lineno}: {exc.msg}") from None
    except ValueError as exc:  # e.g. null bytes
        raise SyntaxError(f"{path} does not parse: {exc}") from None


class PySource:
    """The statement structure of one Python text, by line.

    Raises ``SyntaxError`` (message already one line, naming ``path``) when
    the text does not parse.
    """

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.text = text
        self.lines = [strip_eol(line) for line in split_lines(text)]
        self.tree = parse_python(path, text)
        self.logical = self._logical_lines(text)
        self._ll_at: list[int | None] = [None] * (len(self.lines) + 2)
        for index, ll in enumerate(self.logical):
            for row in range(ll.first, min(ll.last, len(self.lines)) + 1):
                self._ll_at[row] = index
        self.stmts: list[StmtInfo] = []
        self.bodies: dict[BodyKey, BodyInfo] = {MODULE_BODY: BodyInfo(MODULE_BODY, None)}
        self.header_ll: dict[int, StmtInfo] = {}
        self.decorator_ll: dict[int, StmtInfo] = {}
        self.clause_ll: dict[int, StmtInfo] = {}
        self.simple_ll: dict[int, list[StmtInfo]] = {}
        self._walk(self.tree.body, MODULE_BODY, None)
        self.stmts.sort(key=lambda s: (s.start, -s.end))
        self.decorated = [s for s in self.stmts if getattr(s.node, "decorator_list", None)]
        self.ll_firsts = [ll.first for ll in self.logical]

    # -- building

    def _logical_lines(self, text: str) -> list[LogicalLine]:
        out: list[LogicalLine] = []
        first: int | None = None
        head = ""
        last_tok: tokenize.TokenInfo | None = None
        skip = {tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}
        try:
            for tok in tokenize.generate_tokens(io.StringIO(text).readline):
                if tok.type in skip:
                    continue
                if tok.type == tokenize.ENDMARKER:
                    break
                if tok.type == tokenize.NEWLINE:
                    if first is not None:
                        opens = (
                            last_tok is not None
                            and last_tok.type == tokenize.OP
                            and last_tok.string == ":"
                        )
                        indent = (
                            leading_ws(self.lines[first - 1]) if first <= len(self.lines) else ""
                        )
                        out.append(LogicalLine(first, tok.start[0], head, indent, opens))
                    first = None
                    continue
                if first is None:
                    first, head = tok.start[0], tok.string
                last_tok = tok
        except (tokenize.TokenError, SyntaxError) as exc:
            raise SyntaxError(f"{self.path} does not tokenize: {exc}") from None
        if first is not None and last_tok is not None:  # no final NEWLINE token
            out.append(
                LogicalLine(first, last_tok.end[0], head, leading_ws(self.lines[first - 1]), False)
            )
        return out

    def ll_index(self, row: int) -> int | None:
        return self._ll_at[row] if 0 < row < len(self._ll_at) else None

    def _ll_first(self, row: int) -> int:
        index = self.ll_index(row)
        return self.logical[index].first if index is not None else row

    def _ll_last(self, row: int) -> int:
        index = self.ll_index(row)
        return self.logical[index].last if index is not None else row

    def _body(self, key: BodyKey, owner: StmtInfo | None) -> BodyInfo:
        if key not in self.bodies:
            self.bodies[key] = BodyInfo(key, owner)
        return self.bodies[key]

    def _clause(self, body: list[ast.stmt], owner: StmtInfo) -> None:
        """Register the ``else:`` / ``finally:`` line that opens ``body``."""
        if not body:
            return
        decorators = getattr(body[0], "decorator_list", None) or []
        index = self.ll_index(min([d.lineno for d in decorators] + [body[0].lineno]))
        if index is None:
            return
        if self.logical[index].head not in ("else", "finally") and index > 0:
            index -= 1
        if self.logical[index].head in ("else", "finally"):
            self.clause_ll[index] = owner

    def _walk(self, body: list[ast.stmt], key: BodyKey, owner: StmtInfo | None) -> None:
        info_body = self._body(key, owner)
        for node in body:
            decorators = getattr(node, "decorator_list", None) or []
            first_row = min([d.lineno for d in decorators] + [node.lineno])
            info = StmtInfo(
                node=node,
                start=self._ll_first(first_row),
                end=self._ll_last(node.end_lineno or node.lineno),
                body=key,
                owner=owner,
                compound=isinstance(node, _COMPOUND),
            )
            self.stmts.append(info)
            info_body.stmts.append(info)
            head = self.ll_index(node.lineno)
            if head is None:
                continue
            for dec in decorators:
                dec_index = self.ll_index(dec.lineno)
                if dec_index is not None:
                    self.decorator_ll[dec_index] = info
            if info.compound:
                self.header_ll.setdefault(head, info)
                self._walk_children(node, info)
            else:
                self.simple_ll.setdefault(head, []).append(info)

    def _walk_children(self, node: ast.stmt, info: StmtInfo) -> None:
        if isinstance(node, ast.Match):
            for case in node.cases:
                index = self.ll_index(case.pattern.lineno)
                if index is not None:
                    self.clause_ll[index] = info
                self._walk(case.body, (id(case), "body"), info)
            return
        self._walk(node.body, (id(node), "body"), info)
        for handler in getattr(node, "handlers", []):
            index = self.ll_index(handler.lineno)
            if index is not None:
                self.clause_ll[index] = info
            self._walk(handler.body, (id(handler), "body"), info)
        orelse = getattr(node, "orelse", [])
        branch: ast.stmt = node
        while (
            isinstance(branch, ast.If)
            and len(orelse) == 1
            and isinstance(orelse[0], ast.If)
            and self._head_at(orelse[0].lineno) == "elif"
        ):
            elif_node = orelse[0]
            index = self.ll_index(elif_node.lineno)
            if index is not None:
                self.clause_ll[index] = info
            self._walk(elif_node.body, (id(elif_node), "body"), info)
            branch, orelse = elif_node, elif_node.orelse
        self._clause(orelse, info)
        self._walk(orelse, (id(branch), "orelse"), info)
        finalbody = getattr(node, "finalbody", [])
        self._clause(finalbody, info)
        self._walk(finalbody, (id(node), "finalbody"), info)

    def _head_at(self, row: int) -> str:
        index = self.ll_index(row)
        return self.logical[index].head if index is not None else ""

    # -- queries

    def body_indent(self, key: BodyKey) -> str:
        body = self.bodies.get(key)
        if key == MODULE_BODY or body is None or not body.stmts:
            return ""
        return leading_ws(self.lines[body.stmts[0].start - 1])

    def open_bodies_after(self, index: int) -> list[BodyKey]:
        """Statement lists a new statement may continue right after logical line ``index``.

        Innermost first: the list the line's statement is in, then the lists
        enclosing it (a one-line ``if x: y`` closes its own body at once).
        """
        if index in self.clause_ll:
            key: BodyKey | None = self.clause_ll[index].body
        elif index in self.header_ll:
            key = self.header_ll[index].body
        elif index in self.simple_ll:
            key = self.simple_ll[index][0].body
        else:
            key = MODULE_BODY
        chain: list[BodyKey] = []
        while key is not None:
            chain.append(key)
            key = self.bodies[key].parent if key in self.bodies else None
        return chain

    def statement_at(self, row: int) -> StmtInfo | None:
        """The innermost real statement whose rows include ``row``."""
        best: StmtInfo | None = None
        for info in self.stmts:
            if info.start <= row <= info.end and (best is None or info.start >= best.start):
                best = info
        return best


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
    return [n for n, line in enumerate(lines, 1) if anchor.pattern in strip_eol(line)]


def resolve_python_line(src: PySource, row: int) -> Place:
    """The place named by line ``row`` of a Python text (see the module docstring)."""
    index = src.ll_index(row)
    if index is None:
        for info in src.decorated:  # a comment between decorators and their def
            if info.start <= row < info.node.lineno:
                return _statement_place(src, info, row)
        return _line_place(src, row)
    info = src.decorator_ll.get(index) or src.clause_ll.get(index) or src.header_ll.get(index)
    if info is not None:
        return _statement_place(src, info, row)
    ll = src.logical[index]
    simple = src.simple_ll.get(index)
    if simple:
        start = min(s.start for s in simple)
        end = max(s.end for s in simple)
        return Place(start, end, leading_ws(src.lines[start - 1]), True, row)
    return Place(ll.first, ll.last, ll.indent, True, row)


def _statement_place(src: PySource, info: StmtInfo, row: int) -> Place:
    return Place(info.start, info.end, leading_ws(src.lines[info.start - 1]), True, row)


class NoRoomError(ValueError):
    """A comment/blank line where no statement may go (e.g. between ``if x: y`` and ``else:``)."""


def _line_place(src: PySource, row: int) -> Place:
    """A comment or blank line: the place is the line; find a legal indentation for it.

    A statement placed here must continue one of the statement lists that are
    open at this point (the previous statement's list or one enclosing it)
    and fit what follows (the next statement's list, or stay inside the
    compound statement whose ``else:``/``except`` comes next). The comment's
    own indentation wins when it is one of those.
    """
    # ``row`` is in no logical line: the ones before it end before it.
    after = bisect.bisect_right(src.ll_firsts, row)
    prev_index = after - 1 if after > 0 else None
    next_index = after if after < len(src.logical) else None
    next_body: BodyKey | None = None
    clause_owner: StmtInfo | None = None
    if next_index is not None:
        clause_owner = src.clause_ll.get(next_index)
        if clause_owner is None:
            info = (
                src.decorator_ll.get(next_index)
                or src.header_ll.get(next_index)
                or (src.simple_ll.get(next_index) or [None])[0]
            )
            next_body = info.body if info else None
    if prev_index is None:
        chain = [next_body or MODULE_BODY]
    elif src.logical[prev_index].opens_block:
        chain = [next_body] if next_body else []
    else:
        chain = src.open_bodies_after(prev_index)
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
    own = leading_ws(src.lines[row - 1]) if src.lines[row - 1].strip() else ""
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
    lines = split_lines(text)
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
