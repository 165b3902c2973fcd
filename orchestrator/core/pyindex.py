"""The statement structure of a Python text, by line, built only where it is asked for.

Anchors, flag layouts and the structural check all ask local questions —
which statement owns line 5883, which logical line does row 612 belong to,
what sits right after this call. A 50 MB target must not cost three full
parses for that, so the index works in two levels:

1. one ``tokenize`` pass over the whole text finds the **chunks**: the
   top-level statements (with their decorators and ``else``/``except``
   clauses), as row ranges. Nothing else of the file is kept;
2. a chunk is parsed (``ast``) and tokenized into logical lines only when a
   question touches it, and the answer is cached.

An edited text is indexed from the index of the text it was made from
(``spliced``): chunks no splice touched are the same statements shifted by
the lines inserted or removed before them; the rows around each splice
become a **window** that is re-chunked (and parsed) only if asked. So
planning and checking cost one pass over the file plus work proportional to
the change. ``windows`` says, for an edited text, which rows changed
statements may live in, and where those rows were in the original: the
structural check compares and compiles exactly those.

A text that starts with a UTF-8 byte order mark is indexed without it
(Python ignores it when it runs the file); rows and columns are unaffected.

Pure: text in, answers out. Raises ``SyntaxError`` with a one-line message
naming the file and the line when a part it needs does not parse.
"""

from __future__ import annotations
import __future__

import ast
import bisect
import hashlib
import threading
import tokenize
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from orchestrator.core.kept import Kept

BOM = "\ufeff"

# --------------------------------------------------------------------------- parsing

# CPython 3.11's AST machinery keeps a recursion counter in global state, so two
# threads parsing at once can fail with "SystemError: AST constructor recursion
# depth mismatch" (python/cpython#106905). A fleet plans several hosts on
# threads: every parse and every compile of an AST goes through this lock.
AST_LOCK = threading.Lock()


def parse_ast(text: str, filename: str) -> ast.Module:
    """``ast.parse``, one thread at a time."""
    with AST_LOCK:
        return ast.parse(text, filename=filename)


def compile_ast(module: ast.Module, filename: str, flags: int) -> None:
    """Compile an AST (to check it), one thread at a time."""
    with AST_LOCK:
        compile(module, filename, "exec", flags=flags, dont_inherit=True)


# --------------------------------------------------------------------------- text


def split_bom(text: str) -> tuple[str, str]:
    """``(bom, rest)``: the UTF-8 byte order mark at the start of ``text`` (or ``""``) and the rest."""
    return (BOM, text[1:]) if text.startswith(BOM) else ("", text)


def split_lines(text: str) -> list[str]:
    """Lines with their endings, split on ``\\n`` only (what ``ast`` counts as a line).

    ``str.splitlines`` would also split on form feeds and other characters
    Python treats as whitespace, and line numbers would drift from ``ast``'s;
    it is used (it is fast) only on texts that have none of those: where it
    finds as many lines as there are ``\n`` (a regex search for the others
    cost more than the split itself).
    """
    if not text:
        return []
    lines = text.splitlines(keepends=True)
    if len(lines) == text.count("\n") + (not text.endswith("\n")):
        return lines
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


def rows_containing(lines: Sequence[str], needles: Sequence[str]) -> list[int]:
    """The rows (1-based, ascending, each once) of ``lines`` that hold any of ``needles``.

    ``lines`` are split on ``\\n`` (``split_lines``). One ``str.find`` scan of
    the joined text per needle, rows counted by ``str.count`` between hits,
    rather than a Python test per line: on SGLang's 4,000-8,000-line
    ``server_args.py`` those per-line loops were a third of a plan's CPU.
    """
    text = "".join(lines)
    rows: set[int] = set()
    for needle in needles:
        if not needle or "\n" in needle:  # in every line / never within one line
            rows.update(n for n, line in enumerate(lines, 1) if needle in line)
            continue
        row, counted = 1, 0  # the row of text[counted]
        pos = text.find(needle)
        while pos != -1:
            row += text.count("\n", counted, pos)
            rows.add(row)
            end = text.find("\n", pos)
            if end == -1:
                break
            row, counted = row + 1, end + 1
            pos = text.find(needle, counted)
    return sorted(rows)


def leading_ws(line: str) -> str:
    body = strip_eol(line)
    return body[: len(body) - len(body.lstrip(" \t"))]


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class LogicalLine:
    """One logical line of Python source (``tokenize``'s NEWLINE-terminated unit).

    A multi-line call, a bracketed header, a triple-quoted string or a
    backslash continuation is one logical line spanning rows ``first..last``;
    comment-only and blank lines between statements belong to none. A logical
    line is named by its first row (its *key*).
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
    """A statement list. The module's own list is never listed whole (it is the file)."""

    key: BodyKey
    owner: StmtInfo | None
    stmts: list[StmtInfo] = field(default_factory=list)

    @property
    def parent(self) -> BodyKey | None:
        return self.owner.body if self.owner else None


@dataclass(frozen=True)
class Window:
    """Rows of an edited text whose statements are re-read, and the rows they were in the original.

    ``old_first..old_last`` of the original became ``new_first..new_last``;
    everything outside the windows is the original's text, line for line.
    """

    old_first: int
    old_last: int
    new_first: int
    new_last: int


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
_CLAUSES = frozenset({"else", "elif", "except", "finally"})
_SKIP = frozenset({tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING})


def _tokens(path: str, lines: Sequence[str], offset: int) -> Iterator[tokenize.TokenInfo]:
    """``tokenize`` over ``lines``; a failure is a one-line ``SyntaxError`` at the file's row."""
    try:
        yield from tokenize.generate_tokens(iter(lines).__next__)
    except (tokenize.TokenError, SyntaxError) as exc:
        raise _tokenize_error(path, lines, offset, exc) from None


def _tokenize_error(
    path: str, lines: Sequence[str], offset: int, exc: tokenize.TokenError | SyntaxError
) -> SyntaxError:
    # Python's own parser says it better ("invalid syntax", at the right
    # line); on this failure path its cost does not matter.
    try:
        parse_ast("".join(lines), path)
    except SyntaxError as parsed:
        at = (parsed.lineno or 1) + offset
        return SyntaxError(f"{path} does not parse: line {at}: {parsed.msg}")
    except ValueError:
        pass
    row: int | None = None
    if isinstance(exc, SyntaxError):
        row = exc.lineno
    elif len(exc.args) > 1 and isinstance(exc.args[1], tuple):
        row = exc.args[1][0]
    where = f"line {row + offset}: " if row else ""
    message = exc.msg if isinstance(exc, SyntaxError) else exc.args[0]
    return SyntaxError(f"{path} does not tokenize: {where}{message}")


def top_level_spans(
    path: str, lines: Sequence[str], offset: int = 0, *, stop_after: int | None = None
) -> tuple[list[tuple[int, int]], int | None]:
    """Row ranges (``offset`` added) of the top-level statements of ``lines``, in one tokenize pass.

    A decorator starts its statement's range, an ``else``/``except``/
    ``finally`` at column 0 continues it; comment and blank lines between
    statements belong to none. With ``stop_after``, reading stops at the
    first statement that starts below that row: the second value is the row
    it starts at (``None`` when the end was reached).
    """
    spans: list[tuple[int, int]] = []
    depth = 0
    line_start = True
    decorator = prev_decorator = False
    first = last = 0
    indent, dedent, newline, endmarker = tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE, tokenize.ENDMARKER
    op, name, skip, clauses = tokenize.OP, tokenize.NAME, _SKIP, _CLAUSES
    try:
        # (the hot loop of a big target: one pass, local names, nothing per token but the needed)
        for kind, string, start, _, _ in tokenize.generate_tokens(iter(lines).__next__):
            if kind == indent:
                depth += 1
            elif kind == dedent:
                depth -= 1
            elif kind == newline:
                line_start = True
                last = start[0]
                if depth == 0:
                    prev_decorator = decorator
            elif kind in skip:
                continue
            elif kind == endmarker:
                break
            elif line_start:
                line_start = False
                if depth == 0:
                    decorator = kind == op and string == "@"
                    if not (first and (prev_decorator or (kind == name and string in clauses))):
                        if first:
                            spans.append((first + offset, last + offset))
                        first = start[0]
                        if stop_after is not None and first + offset > stop_after:
                            return spans, first + offset
    except (tokenize.TokenError, SyntaxError) as exc:
        raise _tokenize_error(path, lines, offset, exc) from None
    if first:
        spans.append((first + offset, last + offset))
    return spans, None


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


# --------------------------------------------------------------------------- one chunk


CHUNK_CACHE_SIZE = 64
"""Statement groups kept read (``read_chunk``)."""
SPANS_CACHE_SIZE = 64
"""Windows kept split into statement groups (``cached_top_level_spans``)."""
SPANS_CACHE_MAX_ROWS = 50_000

_chunks: Kept[tuple[int, int, str], _Chunk] = Kept(CHUNK_CACHE_SIZE)
_spans: Kept[tuple[bytes, int, int | None], tuple[list[tuple[int, int]], int | None]] = Kept(SPANS_CACHE_SIZE)


def read_chunk(src: PySource, first: int, last: int) -> _Chunk:
    """The statement group at rows ``first..last`` of ``src``, read once per content.

    Reading the group that holds a large class is most of a plan's CPU; it
    is kept by the group's rows and text (``Kept``).
    """
    key = (first, last, "".join(src.raw[first - 1 : last]))
    return _chunks.get(key, lambda: _Chunk(src, first, last))


def cached_top_level_spans(
    path: str, lines: Sequence[str], offset: int, *, stop_after: int | None
) -> tuple[list[tuple[int, int]], int | None]:
    """``top_level_spans``, once per content: the tokenize pass over a large file
    is the rest of a plan's CPU, and every host of a fleet would pay it.

    Kept by a digest of the text; a window longer than ``SPANS_CACHE_MAX_ROWS``
    (a generated file, not a fleet's server_args.py) is not kept: hashing
    it again for each statement asked about would cost more than it saves.
    """
    if len(lines) > SPANS_CACHE_MAX_ROWS:
        return top_level_spans(path, lines, offset, stop_after=stop_after)
    digest = hashlib.blake2b("".join(lines).encode("utf-8", "surrogatepass"), digest_size=20).digest()
    return _spans.get((digest, offset, stop_after),
                      lambda: top_level_spans(path, lines, offset, stop_after=stop_after))


class _Chunk:
    """One top-level statement group, read: its logical lines, statements and bodies (file rows)."""

    def __init__(self, src: PySource, first: int, last: int) -> None:
        self.first, self.last = first, last
        lines = src.raw[first - 1 : last]
        text = "".join(lines)
        try:
            tree = parse_ast(text, src.path)
        except SyntaxError as exc:
            row = (exc.lineno or 1) + first - 1
            raise SyntaxError(f"{src.path} does not parse: line {row}: {exc.msg}") from None
        except ValueError as exc:  # e.g. null bytes
            raise SyntaxError(f"{src.path} does not parse: {exc}") from None
        ast.increment_lineno(tree, first - 1)
        self.nodes: list[ast.stmt] = tree.body
        self.logical: dict[int, LogicalLine] = {}
        self.ll_at: dict[int, int] = {}
        self._read_logical_lines(src, lines)
        self.firsts = sorted(self.logical)
        self.stmts: list[StmtInfo] = []
        self.bodies: dict[BodyKey, BodyInfo] = {}
        self.header: dict[int, StmtInfo] = {}
        self.decorator: dict[int, StmtInfo] = {}
        self.clause: dict[int, StmtInfo] = {}
        self.simple: dict[int, list[StmtInfo]] = {}
        self.module = BodyInfo(MODULE_BODY, None)
        self._walk(self.nodes, MODULE_BODY, None)
        self.stmts.sort(key=lambda s: (s.start, -s.end))
        self.decorated = [s for s in self.stmts if getattr(s.node, "decorator_list", None)]

    def _read_logical_lines(self, src: PySource, lines: Sequence[str]) -> None:
        offset = self.first - 1
        start: int | None = None
        head = ""
        last_tok: tokenize.TokenInfo | None = None
        for tok in _tokens(src.path, lines, offset):
            if tok.type in _SKIP:
                continue
            if tok.type == tokenize.ENDMARKER:
                break
            if tok.type == tokenize.NEWLINE:
                if start is not None:
                    opens = last_tok is not None and last_tok.type == tokenize.OP and last_tok.string == ":"
                    self._add(src, start + offset, tok.start[0] + offset, head, opens)
                start = None
                continue
            if start is None:
                start, head = tok.start[0], tok.string
            last_tok = tok
        if start is not None and last_tok is not None:  # no final NEWLINE token
            self._add(src, start + offset, last_tok.end[0] + offset, head, False)

    def _add(self, src: PySource, first: int, last: int, head: str, opens: bool) -> None:
        self.logical[first] = LogicalLine(first, last, head, leading_ws(src.line(first)), opens)
        for row in range(first, last + 1):
            self.ll_at[row] = first

    def _ll_first(self, row: int) -> int:
        return self.ll_at.get(row, row)

    def _ll_last(self, row: int) -> int:
        key = self.ll_at.get(row)
        return self.logical[key].last if key is not None else row

    def _body(self, key: BodyKey, owner: StmtInfo | None) -> BodyInfo:
        if key == MODULE_BODY:
            return self.module
        if key not in self.bodies:
            self.bodies[key] = BodyInfo(key, owner)
        return self.bodies[key]

    def _previous_ll(self, key: int) -> int | None:
        index = bisect.bisect_left(self.firsts, key)
        return self.firsts[index - 1] if index > 0 else None

    def _clause(self, body: list[ast.stmt], owner: StmtInfo) -> None:
        """Register the ``else:`` / ``finally:`` line that opens ``body``."""
        if not body:
            return
        decorators = getattr(body[0], "decorator_list", None) or []
        key = self.ll_at.get(min([d.lineno for d in decorators] + [body[0].lineno]))
        if key is None:
            return
        if self.logical[key].head not in ("else", "finally"):
            key = self._previous_ll(key)
        if key is not None and self.logical[key].head in ("else", "finally"):
            self.clause[key] = owner

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
            head = self.ll_at.get(node.lineno)
            if head is None:
                continue
            for dec in decorators:
                dec_key = self.ll_at.get(dec.lineno)
                if dec_key is not None:
                    self.decorator[dec_key] = info
            if info.compound:
                self.header.setdefault(head, info)
                self._walk_children(node, info)
            else:
                self.simple.setdefault(head, []).append(info)

    def _walk_children(self, node: ast.stmt, info: StmtInfo) -> None:
        if isinstance(node, ast.Match):
            for case in node.cases:
                key = self.ll_at.get(case.pattern.lineno)
                if key is not None:
                    self.clause[key] = info
                self._walk(case.body, (id(case), "body"), info)
            return
        # a compound statement (``info.compound``): every kind but ``match`` has a body
        self._walk(node.body, (id(node), "body"), info)  # type: ignore[attr-defined]
        for handler in getattr(node, "handlers", []):
            key = self.ll_at.get(handler.lineno)
            if key is not None:
                self.clause[key] = info
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
            key = self.ll_at.get(elif_node.lineno)
            if key is not None:
                self.clause[key] = info
            self._walk(elif_node.body, (id(elif_node), "body"), info)
            branch, orelse = elif_node, elif_node.orelse
        self._clause(orelse, info)
        self._walk(orelse, (id(branch), "orelse"), info)
        finalbody = getattr(node, "finalbody", [])
        self._clause(finalbody, info)
        self._walk(finalbody, (id(node), "finalbody"), info)

    def _head_at(self, row: int) -> str:
        key = self.ll_at.get(row)
        return self.logical[key].head if key is not None else ""

    def own_lls(self) -> dict[int, list[int]]:
        """id(statement) -> keys of its own logical lines (header, clauses, decorators)."""
        out: dict[int, list[int]] = {}
        for table in (self.header, self.clause, self.decorator):
            for key, info in table.items():
                out.setdefault(id(info), []).append(key)
        return out


# --------------------------------------------------------------------------- the index


class PySource:
    """The statement structure of one Python text, by line (see the module docstring).

    Built from a text with one tokenize pass (``PySource(path, text)``), or
    from the index of the text an edit started from (``spliced``). Raises
    ``SyntaxError`` (message one line, naming ``path``) when the text does
    not tokenize, or later when a part that is asked about does not parse.
    """

    def __init__(
        self,
        path: str,
        text: str,
        *,
        _raw: list[str] | None = None,
        _spans: list[list[int]] | None = None,
    ) -> None:
        self.path = path
        self.text = split_bom(text)[1]
        self.raw = _raw if _raw is not None else split_lines(self.text)
        if _spans is None:  # the whole text: one window, read on demand
            _spans = [[1, len(self.raw), 1]] if self.raw else []
        # [first, last, is_window]: a window is rows not yet split into statements
        self._spans = _spans
        self._firsts = [s[0] for s in _spans]
        self._chunks: dict[int, _Chunk] = {}
        self._bodies: dict[BodyKey, BodyInfo] = {MODULE_BODY: BodyInfo(MODULE_BODY, None)}
        self.windows: tuple[Window, ...] = ()

    # -- rows

    @property
    def nlines(self) -> int:
        return len(self.raw)

    def line(self, row: int) -> str:
        """Row ``row`` (1-based) without its line ending; ``""`` past the end."""
        return strip_eol(self.raw[row - 1]) if 1 <= row <= len(self.raw) else ""

    def text_of(self, first: int, last: int) -> str:
        return "".join(self.raw[first - 1 : last])

    # -- statement groups

    def _split_window(self, index: int, row: int) -> None:
        """Read window ``index`` into statement groups, as far as the group holding ``row``."""
        first, last, _ = self._spans[index]
        found, resume = cached_top_level_spans(
            self.path, self.raw[first - 1 : last], first - 1, stop_after=row
        )
        spans = [[a, b, 0] for a, b in found]
        if resume is not None:
            spans.append([resume, last, 1])
        self._spans[index : index + 1] = spans
        self._firsts[index : index + 1] = [s[0] for s in spans]

    def _locate(self, row: int) -> int | None:
        """Index of the statement group holding ``row``, or ``None`` between groups."""
        while True:
            index = bisect.bisect_right(self._firsts, row) - 1
            if index < 0 or row > self._spans[index][1]:
                return None
            if not self._spans[index][2]:
                return index
            self._split_window(index, row)

    def _neighbour_index(self, row: int, *, after: bool) -> int | None:
        """Index of the group that ends before ``row`` (starts after it, with ``after``)."""
        while True:
            index = bisect.bisect_right(self._firsts, row) - 1 + (1 if after else 0)
            if not 0 <= index < len(self._spans):
                return None
            if not self._spans[index][2]:
                return index
            self._split_window(index, self._spans[index][0] if after else row)

    def _chunk_at(self, index: int) -> _Chunk:
        first, last, _ = self._spans[index]
        chunk = self._chunks.get(first)
        if chunk is None or chunk.last != last:
            chunk = read_chunk(self, first, last)
            self._chunks[first] = chunk
            self._bodies.update(chunk.bodies)
        return chunk

    def chunk(self, row: int) -> _Chunk | None:
        """The read top-level statement group holding ``row``, if any."""
        index = self._locate(row)
        return self._chunk_at(index) if index is not None else None

    def _neighbour(self, row: int, after: bool) -> _Chunk | None:
        index = self._neighbour_index(row, after=after)
        return self._chunk_at(index) if index is not None else None

    def chunks_overlapping(self, first: int, last: int) -> list[_Chunk]:
        """The read statement groups that share a row with ``first..last``, in order."""
        out: list[_Chunk] = []
        index = max(0, bisect.bisect_right(self._firsts, first) - 1)
        while index < len(self._spans) and self._spans[index][0] <= last:
            if self._spans[index][1] < first:
                index += 1
            elif self._spans[index][2]:
                self._split_window(index, max(first, self._spans[index][0]))
            else:
                out.append(self._chunk_at(index))
                index += 1
        return out

    def top_nodes(self, first: int, last: int) -> list[ast.stmt]:
        """The top-level statements (AST) that lie within rows ``first..last``."""
        return [node for chunk in self.chunks_overlapping(first, last) for node in chunk.nodes]

    # -- logical lines

    def ll_index(self, row: int) -> int | None:
        """The key (first row) of the logical line holding ``row``; ``None`` for a comment/blank line."""
        chunk = self.chunk(row)
        return chunk.ll_at.get(row) if chunk else None

    def logical_line(self, key: int) -> LogicalLine:
        chunk = self.chunk(key)
        assert chunk is not None
        return chunk.logical[key]

    def prev_ll(self, row: int) -> LogicalLine | None:
        """The last logical line that ends before ``row`` (a row in none)."""
        chunk = self.chunk(row)
        if chunk is not None:
            index = bisect.bisect_left(chunk.firsts, row)
            if index > 0:
                return chunk.logical[chunk.firsts[index - 1]]
        before = self._neighbour(chunk.first - 1 if chunk else row, after=False)
        return before.logical[before.firsts[-1]] if before and before.firsts else None

    def next_ll(self, row: int) -> LogicalLine | None:
        """The first logical line that starts after ``row`` (a row in none)."""
        chunk = self.chunk(row)
        if chunk is not None:
            index = bisect.bisect_right(chunk.firsts, row)
            if index < len(chunk.firsts):
                return chunk.logical[chunk.firsts[index]]
        after = self._neighbour(chunk.last if chunk else row, after=True)
        return after.logical[after.firsts[0]] if after and after.firsts else None

    def lls_overlapping(self, first: int, last: int) -> list[LogicalLine]:
        return [
            ll
            for chunk in self.chunks_overlapping(first, last)
            for ll in chunk.logical.values()
            if ll.last >= first and ll.first <= last
        ]

    # -- statements

    def header_at(self, key: int) -> StmtInfo | None:
        chunk = self.chunk(key)
        return chunk.header.get(key) if chunk else None

    def clause_at(self, key: int) -> StmtInfo | None:
        chunk = self.chunk(key)
        return chunk.clause.get(key) if chunk else None

    def decorator_at(self, key: int) -> StmtInfo | None:
        chunk = self.chunk(key)
        return chunk.decorator.get(key) if chunk else None

    def simple_at(self, key: int) -> list[StmtInfo]:
        chunk = self.chunk(key)
        return chunk.simple.get(key, []) if chunk else []

    def decorated_around(self, row: int) -> StmtInfo | None:
        """The decorated statement whose decorators sit above ``row`` and its ``def`` below."""
        chunk = self.chunk(row)
        if chunk is None:
            return None
        return next((s for s in chunk.decorated if s.start <= row < s.node.lineno), None)

    def statement_at(self, row: int) -> StmtInfo | None:
        """The innermost real statement whose rows include ``row``."""
        chunk = self.chunk(row)
        best: StmtInfo | None = None
        for info in chunk.stmts if chunk else ():
            if info.start <= row <= info.end and (best is None or info.start >= best.start):
                best = info
        return best

    def stmts_overlapping(self, first: int, last: int) -> list[StmtInfo]:
        return [
            info
            for chunk in self.chunks_overlapping(first, last)
            for info in chunk.stmts
            if info.start <= last and info.end >= first
        ]

    def own_lls(self, info: StmtInfo) -> list[int]:
        """Keys of ``info``'s own logical lines: its header, clause headers, decorators."""
        chunk = self.chunk(info.start)
        return chunk.own_lls().get(id(info), []) if chunk else []

    # -- bodies

    def body(self, key: BodyKey) -> BodyInfo:
        return self._bodies[key]

    def body_indent(self, key: BodyKey) -> str:
        body = self._bodies.get(key)
        if key == MODULE_BODY or body is None or not body.stmts:
            return ""
        return leading_ws(self.line(body.stmts[0].start))

    def open_bodies_after(self, key: int) -> list[BodyKey]:
        """Statement lists a new statement may continue right after logical line ``key``.

        Innermost first: the list the line's statement is in, then the lists
        enclosing it (a one-line ``if x: y`` closes its own body at once).
        """
        clause, header, simple = self.clause_at(key), self.header_at(key), self.simple_at(key)
        if clause is not None:
            body: BodyKey | None = clause.body
        elif header is not None:
            body = header.body
        elif simple:
            body = simple[0].body
        else:
            body = MODULE_BODY
        chain: list[BodyKey] = []
        while body is not None:
            chain.append(body)
            body = self._bodies[body].parent if body in self._bodies else None
        return chain

    # -- the module's future features

    def _leading_nodes(self) -> Iterator[ast.stmt]:
        """Top-level statements from the start of the file, read one group at a time."""
        index = 0
        while index < len(self._spans):
            if self._spans[index][2]:
                self._split_window(index, self._spans[index][0])
                continue
            yield from self._chunk_at(index).nodes
            index += 1

    def future_flags(self) -> int:
        """Compiler flags of the ``from __future__`` imports at the top of the file."""
        flags = 0
        for node in self._leading_nodes():
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                for alias in node.names:
                    feature = getattr(__future__, alias.name, None)
                    flags |= getattr(feature, "compiler_flag", 0)
            elif not _is_docstring(node):
                break
        return flags

    def first_statement_row(self) -> int:
        """Row of the first top-level statement that is neither the docstring nor a future import."""
        for position, node in enumerate(self._leading_nodes()):
            future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
            if not future and not (position == 0 and _is_docstring(node)):
                return node.lineno
        return self.nlines + 1

    # -- edited texts

    def spliced(
        self,
        path: str,
        text: str,
        splices: Sequence[tuple[int, int, int]],
        lines: list[str] | None = None,
    ) -> PySource:
        """The index of ``text`` (whose lines are ``lines``, if given), made from this one's by ``splices``.

        Each splice is ``(start, end, count)`` in this text's rows: rows
        ``start..end`` (none when ``end == start - 1``) became ``count`` new
        rows. The new index shares nothing mutable with this one.
        """
        windows: list[list[int]] = []
        for start, end, _ in sorted(splices):
            first = self._group_edge(start - 1, after=False)
            last = self._group_edge(end + 1, after=True)
            if windows and first <= windows[-1][1] + 1:
                windows[-1][1] = max(windows[-1][1], last)
            else:
                windows.append([first, last])
        shifts = sorted((end, count - (end - start + 1)) for start, end, count in splices)
        ends = [e for e, _ in shifts]
        cumulative: list[int] = []
        total = 0
        for _, delta in shifts:
            total += delta
            cumulative.append(total)

        def moved(row: int) -> int:
            """The new row of old row ``row``, which no splice replaced."""
            index = bisect.bisect_left(ends, row) - 1
            return row + (cumulative[index] if index >= 0 else 0)

        spans: list[list[int]] = []
        out_windows: list[Window] = []
        at = 0
        for first, last in windows:
            while at < len(self._spans) and self._spans[at][1] < first:
                a, b, w = self._spans[at]
                spans.append([moved(a), moved(b), w])
                at += 1
            while at < len(self._spans) and self._spans[at][0] <= last:
                at += 1  # inside the window
            new_first = 1 if first == 1 else moved(first)
            new_last = moved(last + 1) - 1
            if new_last >= new_first:
                spans.append([new_first, new_last, 1])
            out_windows.append(Window(first, last, new_first, new_last))
        while at < len(self._spans):
            a, b, w = self._spans[at]
            spans.append([moved(a), moved(b), w])
            at += 1
        index = PySource(path, text, _raw=lines, _spans=spans)
        index.windows = tuple(out_windows)
        return index

    def _group_edge(self, row: int, *, after: bool) -> int:
        """The first (last) row of the statement group holding or preceding (following) ``row``."""
        if row < 1:
            return 1
        if row > len(self.raw):
            return len(self.raw)
        index = self._locate(row)
        if index is None:
            index = self._neighbour_index(row, after=after)
        if index is None:
            return len(self.raw) if after else 1
        return self._spans[index][1] if after else self._spans[index][0]
