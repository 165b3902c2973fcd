"""Plan a file's edits in memory: original text + edit specs -> ``FilePlan``.

Every edit is applied to the text the previous one produced, as line splices
on a buffer that remembers where each line came from, so the plan can say
which lines of the result are new and which lines of the original went
(``FilePlan.changes``: the verification view and the structural check read
these). Planning is idempotent by construction: each kind of edit recognises
its own result (a marker block that is already there, an unmarked block
already beside its anchor, a replacement already made, a patch whose reverse
applies, a statement already gone), so re-planning an applied playbook is a
no-op that says so — while its anchors still agree: a marked block re-checks
its anchor on every run (0 or several places is the clean file's error), and
a block its anchor no longer points at is moved there (one step: its old
lines removed, the block inserted beside the anchor).

Several inserts at one anchor land in playbook order (each after the blocks
earlier edits put there). Errors name lines of the file on disk, also after
earlier edits moved them (the buffer knows where each line came from).

The buffer is a piece table and the Python index (``core.pyindex``) is
carried from edit to edit, so planning costs one read of the file plus the
statements the edits touch.

Pure: strings in, a ``FilePlan`` out; errors are one-line ``ConfigError``s
located at the playbook key that caused them.
"""

from __future__ import annotations

import bisect
import itertools
import re
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator.core.anchors import (
    Place,
    PySource,
    comment_prefix,
    did_you_mean,
    edit_error,
    is_python,
    leading_ws,
    locate,
    newline_of,
    places_for,
    shorten,
    span_label,
    split_lines,
    strip_eol,
    sub_key,
)
from orchestrator.core.edit_spec import Anchor, Change, EditSpec, FilePlan
from orchestrator.core.patches import PatchError, apply_patch
from orchestrator.core.pyindex import rows_containing, split_bom
from orchestrator.errors import AnchorError, EditError

# ``Change.note`` values: how an edit changed its lines (``core.structure`` reads them).
INSERTED = "inserted"
IN_PLACE = "replaced in place"
MOVED = "moved"
MOVED_NOTE = " moved from "  # in a step's note: a block its anchor no longer points at, moved
ELEMENT = "element"
REPLACED = "replaced"
DELETED = "deleted"
PATCHED = "patched"


def marker_lines(prefix: str, marker_id: str, indent: str) -> tuple[str, str]:
    """The begin/end comment lines that wrap an inserted block."""
    return f"{indent}{prefix} >>> orch {marker_id}", f"{indent}{prefix} <<< orch {marker_id}"


def indent_block(text: str, indent: str) -> list[str]:
    """Flush-left ``text`` indented by ``indent``, relative indentation kept, blank lines empty."""
    body = textwrap.dedent(text.replace("\r\n", "\n"))
    rows = body.split("\n")
    if rows and rows[-1] == "":
        rows.pop()
    return [indent + row if row.strip() else "" for row in rows]


# --------------------------------------------------------------------------- buffer


@dataclass(eq=False)
class _Piece:
    """A run of lines of the text being edited, all of one provenance.

    ``origin`` is the original row of ``lines[0]`` (``None``: an edit wrote
    them); ``edit`` is the edit that wrote them (alive) or removed them
    (dead); ``tag`` says which anchor an inserted block was placed at, so a
    later insert at the same anchor lands after it (playbook order).
    """

    lines: list[str]  # with their line endings
    origin: int | None
    edit: int | None
    alive: bool = True
    tag: tuple[object, ...] | None = None


@dataclass(frozen=True)
class _Splice:
    start: int  # 1-based lines of the current text; end == start - 1 inserts before start
    end: int
    lines: tuple[str, ...]  # without endings
    tag: tuple[object, ...] | None = None


class _Buffer:
    """The text being edited, as a piece table: untouched runs of the original stay one piece.

    Applying an edit and listing the changes cost time in the number of
    pieces (the edits), not the number of lines.
    """

    def __init__(self, original: str) -> None:
        self.newline = newline_of(original)
        lines = split_lines(original)
        self.pieces = [_Piece(lines, 1, None)] if lines else []
        self._text: str | None = original

    def text(self) -> str:
        if self._text is None:
            self._text = "".join(
                itertools.chain.from_iterable(p.lines for p in self.pieces if p.alive)
            )
        return self._text

    def _split(self, row: int) -> int:
        """Index of the piece that starts at alive row ``row`` (splitting one if needed).

        ``len(pieces)`` when ``row`` is past the last alive row. Dead pieces
        right before that row stay before it.
        """
        seen = 0
        for index, piece in enumerate(self.pieces):
            if not piece.alive:
                continue
            size = len(piece.lines)
            if seen + size >= row:
                offset = row - seen - 1
                if offset == 0:
                    return index
                head = _Piece(piece.lines[:offset], piece.origin, piece.edit, True, piece.tag)
                piece.lines = piece.lines[offset:]
                if piece.origin is not None:
                    piece.origin += offset
                self.pieces.insert(index, head)
                return index + 1
            seen += size
        return len(self.pieces)

    def apply(self, splices: Sequence[_Splice], edit: int) -> None:
        for splice in sorted(splices, key=lambda s: s.start, reverse=True):
            lines = [line + self.newline for line in splice.lines]
            new = _Piece(lines, None, edit, True, splice.tag)
            if splice.end >= splice.start:
                first = self._split(splice.start)
                after = self._split(splice.end + 1)
                at = after
                for index in range(first, after):
                    piece = self.pieces[index]
                    if piece.alive:
                        piece.alive, piece.edit = False, edit
                        at = index + 1  # right after the last line it replaces
            else:
                at = self._split(splice.start)
            if lines:
                self.pieces.insert(at, new)
        alive = [p for p in self.pieces if p.alive and p.lines]
        for piece in alive[:-1]:  # a line that was last and gained a successor needs an end
            if not piece.lines[-1].endswith("\n"):
                piece.lines = [*piece.lines[:-1], piece.lines[-1] + self.newline]
        self._text = None

    def lines(self) -> list[str]:
        """The current text's lines (the same string objects: no copy of the text)."""
        return list(itertools.chain.from_iterable(p.lines for p in self.pieces if p.alive))

    def line_source(self, row: int) -> tuple[int | None, int | None]:
        """``(original row, None)`` of alive row ``row``, or ``(None, edit)`` for a line an edit wrote."""
        seen = 0
        for piece in self.pieces:
            if not piece.alive:
                continue
            if seen + len(piece.lines) >= row:
                if piece.origin is None:
                    return None, piece.edit
                return piece.origin + row - seen - 1, None
            seen += len(piece.lines)
        return None, None

    def tags_after(self, row: int) -> list[tuple[tuple[object, ...] | None, int]]:
        """``(tag, size)`` of the blocks this plan wrote right after alive row ``row``."""
        out: list[tuple[tuple[object, ...] | None, int]] = []
        for piece in self.pieces[self._split(row + 1) :]:
            if not piece.alive:
                continue
            if piece.origin is not None:
                break
            out.append((piece.tag, len(piece.lines)))
        return out

    def changes(self, kinds: Sequence[str], notes: dict[int, str]) -> list[Change]:
        """Maximal runs of lines one edit wrote or removed, in both coordinates."""
        out: list[Change] = []
        new_line = 0  # result lines passed so far
        old_line = 0  # original lines passed so far
        run: list[_Piece] = []
        run_edit: int | None = None
        run_new0 = run_old0 = 0

        def flush() -> None:
            if run_edit is None or not run:
                return
            dead = [p for p in run if not p.alive and p.origin is not None]
            news = sum(len(p.lines) for p in run if p.alive)
            old_start = dead[0].origin if dead else run_old0 + 1
            old_end = (dead[-1].origin + len(dead[-1].lines) - 1) if dead else old_start - 1  # type: ignore[operator]
            out.append(
                Change(
                    edit_index=run_edit,
                    kind=kinds[run_edit],  # type: ignore[arg-type]
                    old_start=old_start,  # type: ignore[arg-type]
                    old_end=old_end,
                    new_start=run_new0 + 1,
                    new_end=run_new0 + news,
                    note=notes.get(run_edit, ""),
                )
            )

        for piece in self.pieces:
            if not piece.lines or (not piece.alive and piece.origin is None):
                continue  # written by one edit, removed by a later one: in neither text
            touched = piece.edit if (piece.origin is None or not piece.alive) else None
            if touched != run_edit or touched is None:
                flush()
                run, run_edit, run_new0, run_old0 = [], touched, new_line, old_line
            if touched is not None:
                run.append(piece)
            if piece.alive:
                new_line += len(piece.lines)
            if piece.origin is not None:
                old_line = piece.origin + len(piece.lines) - 1
        flush()
        return out


# --------------------------------------------------------------------------- planning


@dataclass
class _Step:
    splices: list[_Splice]
    note: str
    mode: str


HintSource = Callable[[str, str, "PySource | None", Anchor, Callable[[int], str]], str]
"""``(path, text, index, anchor, label) -> "; did you mean: …"`` for an anchor that matches nothing."""


class _StrippedRows(Sequence[str]):
    """The lines of a text without their endings, stripped only when looked at."""

    def __init__(self, lines: Sequence[str]) -> None:
        self._lines = lines

    def __len__(self) -> int:
        return len(self._lines)

    def __getitem__(self, index):  # type: ignore[no-untyped-def, override]
        if isinstance(index, slice):
            return [strip_eol(line) for line in self._lines[index]]
        return strip_eol(self._lines[index])


class _Planner:
    def __init__(
        self,
        path: str,
        comment: str | None,
        edits: Sequence[EditSpec],
        buffer: _Buffer,
        hints: HintSource | None = None,
    ) -> None:
        self.path = path
        self.edits = edits
        self.buffer = buffer
        self.hints = hints
        self.comment = comment_prefix(path, comment)
        self.python = is_python(path)
        self._src: PySource | None = None
        self.original_src: PySource | None = None
        self.lines: list[str] = []  # the current text's lines, set before each step

    def source(self, text: str) -> PySource | None:
        """The Python index of the current text (``None`` for other files).

        The original is indexed once (one tokenize pass); each later text is
        indexed from the previous one by ``spliced`` (``applied``), so only the
        rows an edit touched are ever read again.
        """
        if not self.python:
            return None
        if self._src is None:
            self._src = PySource(self.path, text, _raw=self.lines)
            self.original_src = self._src
        return self._src

    def applied(self, text: str, lines: list[str], splices: Sequence[_Splice]) -> None:
        """The buffer now holds ``text``, made by ``splices``: keep the index in step."""
        self.lines = lines
        if self._src is not None:
            self._src = self._src.spliced(
                self.path, text, [(s.start, s.end, len(s.lines)) for s in splices], lines
            )

    # -- naming lines in messages

    def label(self, row: int) -> str:
        """How a message names row ``row`` of the current text: its line on disk, or its origin."""
        origin, edit = self.buffer.line_source(row)
        if origin is not None:
            return f"line {origin}"
        return f"a line edit {edit + 1} inserts" if edit is not None else f"line {row}"

    def _locate(
        self, text: str, spec: EditSpec, src: PySource | None, **kw: object
    ) -> Place | None:
        return locate(
            self.path, text, spec, src, label=self.label, hint=self._hint(text, src), **kw  # type: ignore[arg-type]
        )

    def _hint(self, text: str, src: PySource | None) -> Callable[[Anchor], str] | None:
        if self.hints is None:
            return None
        hints = self.hints
        return lambda anchor: hints(self.path, text, src, anchor, self.label)

    # -- insert

    def insert(self, text: str, spec: EditSpec, index: int) -> _Step:
        if not spec.text.strip():
            raise edit_error(spec, "insert text is empty")
        if spec.anchor is None:
            raise AnchorError(
                "insert needs an anchor (after: or before:)",
                file=spec.file,
                line=spec.line,
                key=spec.key,
            )
        lines = self.lines
        src = self.source(text)
        moved: tuple[int, int] | None = None
        if spec.markers:
            marker_id = spec.marker_id or f"edit-{index + 1}"
            block = self._find_block(text, lines, marker_id, spec)
            # Applied or not, the anchor must name exactly one place (the
            # block's own lines do not count): a re-run re-checks it.
            place = self._locate(text, spec, src, exclude=block)
            assert place is not None
            if block is not None:
                first, last = block
                if self._marked_block_beside(lines, place, block, spec.anchor.side, src):
                    indent = place.indent if place.statement else leading_ws(lines[first - 1])
                    new = self._wrapped(spec, marker_id, indent, place.element)
                    if [strip_eol(line) for line in lines[first - 1 : last]] == new:
                        return _Step([], f"already applied (block orch:{marker_id})", "")
                    return _Step(
                        [_Splice(first, last, tuple(new))],
                        f"block orch:{marker_id} replaced in place (lines {first}-{last})",
                        IN_PLACE,
                    )
                moved = block
            new = self._wrapped(spec, marker_id, place.indent, place.element)
        else:
            found = self._unmarked_place(text, lines, spec, src)
            if found is None:
                return _Step([], "already applied", "")
            place = found
            new = self._block_lines(spec.text, place.indent, place.element)
        side = spec.anchor.side
        tag = self._tag(place, side)
        if side == "after":
            # After blocks earlier edits of this plan put at the same anchor: playbook order.
            at = place.end + 1 + sum(size for t, size in self.buffer.tags_after(place.end) if t == tag)
            splice = _Splice(at, at - 1, tuple(new), tag)
        else:
            splice = _Splice(place.start, place.start - 1, tuple(new), tag)
        what = "element" if place.element else ("statement" if place.statement else "line")
        span = span_label(self.label, place.start, place.end)
        if moved is not None:
            was = span_label(self.label, moved[0], moved[1])
            return _Step(
                [_Splice(moved[0], moved[1], ()), splice],
                f"block orch:{spec.marker_id or f'edit-{index + 1}'}{MOVED_NOTE}{was} to "
                f"{side} the {what} at {span} (its anchor no longer points at it)",
                MOVED,
            )
        return _Step([splice], f"inserted {side} the {what} at {span}", ELEMENT if place.element else INSERTED)

    def _tag(self, place: Place, side: str) -> tuple[object, ...]:
        """What identifies the anchor of an insert, so later inserts there keep playbook order.

        The anchor's first and last lines on disk: a class and its last field
        end on the same line but are different anchors.
        """
        first, _ = self.buffer.line_source(place.start)
        last, _ = self.buffer.line_source(place.end)
        if first is None or last is None:
            return (side, object())  # an anchor on inserted lines: no ordering promise
        return (side, place.element, first, last)

    def _block_lines(self, text: str, indent: str, element: bool) -> list[str]:
        """The inserted lines; an element block ends with a comma (it sits among elements)."""
        rows = indent_block(text, indent)
        if element:
            last = max((k for k, row in enumerate(rows) if row.strip() and not row.strip().startswith("#")), default=None)
            if last is not None and not rows[last].rstrip().endswith(","):
                rows[last] = rows[last].rstrip() + ","
        return rows

    def _unmarked_texts(self, but: EditSpec | None = None) -> list[str]:
        """The texts of this plan's unmarked inserts (blocks that may sit between an anchor and
        its block), except ``but``'s."""
        return [
            other.text
            for other in self.edits
            if other is not but and other.kind == "insert" and not other.markers and other.text.strip()
        ]

    def _marked_block_beside(
        self,
        lines: Sequence[str],
        place: Place,
        block: tuple[int, int],
        side: str,
        src: PySource | None,
    ) -> bool:
        """The block sits where its anchor puts it: only comments, blank lines and other
        orch blocks between them."""
        rows = _StrippedRows(lines)
        after = side == "after"
        at = place.end + 1 if after else place.start - 1
        target = block[0] if after else block[1]
        indent = place.indent if place.statement else None
        while 1 <= at <= len(rows):
            if at == target:
                return True
            skip = self._marker_block_len(rows, at, after)
            if not skip:
                skip = next(
                    (len(indent_block(o, "")) for o in self._unmarked_texts() if _block_at(rows, at, o, indent, after)),
                    0,
                )
            if not skip and not rows[at - 1].strip():
                skip = 1
            if not skip and src is not None and src.ll_index(at) is None:
                skip = 1  # a comment line
            if not skip:
                return False
            at = at + skip if after else at - skip
        return False

    def _wrapped(
        self, spec: EditSpec, marker_id: str, indent: str, element: bool = False
    ) -> list[str]:
        begin, end = marker_lines(self.comment, marker_id, indent)
        return [begin, *self._block_lines(spec.text, indent, element), end]

    def _find_block(
        self, text: str, lines: Sequence[str], marker_id: str, spec: EditSpec
    ) -> tuple[int, int] | None:
        """Rows of the begin and end marker of block ``marker_id``, if it exists."""
        if f"orch {marker_id}" not in text:
            return None
        prefix = re.escape(self.comment)
        name = re.escape(marker_id)
        begin_rx = re.compile(rf"^[ \t]*{prefix} >>> orch {name}[ \t]*$")
        end_rx = re.compile(rf"^[ \t]*{prefix} <<< orch {name}[ \t]*$")
        begins = [n for n in rows_containing(lines, [f">>> orch {marker_id}"]) if begin_rx.match(strip_eol(lines[n - 1]))]
        ends = [n for n in rows_containing(lines, [f"<<< orch {marker_id}"]) if end_rx.match(strip_eol(lines[n - 1]))]
        label = f"{self.comment} >>> orch {marker_id}"
        if not begins and not ends:
            return None
        if len(begins) > 1:
            rows = ", ".join(str(n) for n in begins)
            raise edit_error(
                spec,
                f"begin marker '{label}' found {len(begins)} times in {self.path} "
                f"(lines {rows}); expected one block",
            )
        if not begins:
            raise edit_error(
                spec,
                f"end marker '{self.comment} <<< orch {marker_id}' at line {ends[0]} of "
                f"{self.path} has no begin marker '{label}'",
            )
        later = [n for n in ends if n > begins[0]]
        if not later or len(ends) > 1:
            problem = "has no end marker" if not later else f"has {len(ends)} end markers"
            raise edit_error(
                spec,
                f"begin marker '{label}' at line {begins[0]} of {self.path} {problem} "
                f"'{self.comment} <<< orch {marker_id}'",
            )
        return begins[0], later[0]

    def _unmarked_place(
        self, text: str, lines: Sequence[str], spec: EditSpec, src: PySource | None
    ) -> Place | None:
        """The anchor's place, or ``None`` when the same block already sits beside it.

        Beside means right after (before) the place, or past comments and other
        blocks this plan inserts there (their text, or any marker block): two unmarked
        inserts at one anchor both stay recognised. Applied or not, the anchor
        must name exactly one place (the block's own lines do not count).
        """
        assert spec.anchor is not None
        try:
            places = places_for(self.path, text, spec.anchor, src)
        except ValueError:
            places = []
        rows = _StrippedRows(lines)
        after = spec.anchor.side == "after"
        others = self._unmarked_texts(spec)
        for place in places:
            # A statement fixes the block's indentation; a comment line's may
            # legitimately differ once the block is there, so any is accepted.
            indent = place.indent if place.statement else None
            text_there = spec.text
            if place.element:  # an element block got its comma when inserted
                text_there = "\n".join(self._block_lines(spec.text, "", True)) + "\n"
            found = self._beside(rows, place, text_there, others, indent, after, src)
            if found is not None:
                self._locate(text, spec, src, exclude=found)  # raises unless one place is left
                return None
        return self._locate(text, spec, src)

    def _beside(
        self,
        rows: Sequence[str],
        place: Place,
        text: str,
        others: Sequence[str],
        indent: str | None,
        after: bool,
        src: PySource | None,
    ) -> tuple[int, int] | None:
        """Rows of ``text``'s block if it sits beside ``place`` (see ``_unmarked_place``)."""
        size = len(indent_block(text, ""))
        at = place.end + 1 if after else place.start - 1  # first row after / last row before
        while 1 <= at <= len(rows) + 1:
            if _block_at(rows, at, text, indent, after):
                return (at, at + size - 1) if after else (at - size + 1, at)
            skip = self._marker_block_len(rows, at, after)
            if not skip:
                skip = next(
                    (
                        len(indent_block(o, ""))
                        for o in others
                        if _block_at(rows, at, o, indent, after)
                    ),
                    0,
                )
            if not skip and src is not None and 1 <= at <= len(rows) and src.ll_index(at) is None:
                skip = 1  # a comment or blank line (a later delete may have bared one)
            if not skip:
                return None
            at = at + skip if after else at - skip
        return None

    def _marker_block_len(self, rows: Sequence[str], at: int, after: bool) -> int:
        """Length of a marker block starting (ending) at row ``at``, else 0."""
        if not 1 <= at <= len(rows):
            return 0
        prefix = re.escape(self.comment)
        edge = re.match(
            rf"^[ \t]*{prefix} {'>>>' if after else '<<<'} orch (\S+)[ \t]*$", rows[at - 1]
        )
        if not edge:
            return 0
        other = re.compile(
            rf"^[ \t]*{prefix} {'<<<' if after else '>>>'} orch {re.escape(edge.group(1))}[ \t]*$"
        )
        span = range(at + 1, len(rows) + 1) if after else range(at - 1, 0, -1)
        for row in span:
            if other.match(rows[row - 1]):
                return abs(row - at) + 1
        return 0

    # -- replace

    def replace(self, text: str, spec: EditSpec) -> _Step:
        key = "replace_regex" if spec.regex else "replace"
        if not spec.pattern:
            raise edit_error(spec, "replace needs a pattern", key)
        try:
            found = _matches(text, spec)
        except (re.error, IndexError) as exc:
            raise edit_error(spec, f"bad regex or replacement: {exc}", key) from None
        starts = _line_starts(text)
        if _already_replaced(text, spec, found):
            return _Step([], "already applied (the replacement is there, the pattern is not)", "")
        if len(found) != spec.count:
            rows = sorted({_line_of(starts, m[0]) for m in found})
            where = f" (lines {', '.join(str(r) for r in rows[:20])})" if rows else ""
            hint = ""
            if not found and not spec.regex and "\n" not in spec.pattern:
                close = did_you_mean(text, spec.pattern)
                if close:
                    hint = "; did you mean: " + "; ".join(
                        f"line {r}: {shorten(t)}" for r, t in close
                    )
            plural = "match" if len(found) == 1 else "matches"
            raise edit_error(
                spec,
                f"expected {spec.count} of {shorten(spec.pattern, 60)!r} in {self.path}, "
                f"found {len(found)} {plural}{where}{hint}",
                key,
            )
        splices = _replacement_splices(text, starts, found)
        spans = ", ".join(f"{s.start}-{s.end}" if s.end > s.start else str(s.start) for s in splices)
        return _Step(splices, f"replaced {len(found)} time(s) (lines {spans})", REPLACED)

    # -- delete

    def delete(self, text: str, spec: EditSpec) -> _Step:
        src = self.source(text)
        place = self._locate(text, spec, src, allow_missing=True)
        if place is None:
            return _Step([], "already absent", "")
        span = (
            f"lines {place.start}-{place.end}" if place.end > place.start else f"line {place.start}"
        )
        return _Step([_Splice(place.start, place.end, ())], f"deleted {span}", DELETED)

    # -- patch

    def patch(self, text: str, spec: EditSpec) -> _Step:
        try:
            outcome = apply_patch(text, spec.text)
        except PatchError as exc:
            raise EditError(
                f"patch refused for {self.path}: {exc}",
                file=spec.file,
                line=spec.line,
                key=sub_key(spec, "patch"),
            ) from None
        if outcome.already_applied:
            return _Step([], "already applied (its reverse applies)", "")
        splices = [_Splice(s.start, s.end, s.lines) for s in outcome.splices]
        drift = [o for o in outcome.offsets if o]
        note = f"patched ({len(splices)} hunk(s)"
        note += f", offset {', '.join(str(o) for o in drift)})" if drift else ")"
        return _Step(splices, note, PATCHED)


def _block_at(rows: Sequence[str], at: int, text: str, indent: str | None, after: bool) -> bool:
    """``text``, indented, starts at row ``at`` (``after``) or ends there (not ``after``).

    ``indent`` ``None`` takes the indentation the rows themselves have.
    """
    flush = indent_block(text, "")
    size = len(flush)
    first = at if after else at - size + 1
    if first < 1 or first - 1 + size > len(rows):
        return False
    region = list(rows[first - 1 : first - 1 + size])
    if indent is None:
        lead = next((k for k, row in enumerate(flush) if row), None)
        if lead is None:
            return region == flush
        relative = leading_ws(flush[lead])
        have = leading_ws(region[lead])
        if not have.endswith(relative):
            return False
        indent = have[: len(have) - len(relative)]
    return region == indent_block(text, indent)


# --------------------------------------------------------------------------- replace helpers

_Match = tuple[int, int, str]  # start offset, end offset, replacement


def _matches(text: str, spec: EditSpec) -> list[_Match]:
    """Non-overlapping matches; a regex is Python ``re`` with MULTILINE (``^``/``$`` per line)."""
    if spec.regex:
        rx = re.compile(spec.pattern, re.MULTILINE)
        return [(m.start(), m.end(), m.expand(spec.text)) for m in rx.finditer(text)]
    out: list[_Match] = []
    at = text.find(spec.pattern)
    while at >= 0:
        out.append((at, at + len(spec.pattern), spec.text))
        at = text.find(spec.pattern, at + len(spec.pattern))
    return out


_GROUP_REF = re.compile(r"\\(?:\d|g<)")


def _already_replaced(text: str, spec: EditSpec, found: Sequence[_Match]) -> bool:
    """Every match (if any) sits inside the replacement text, present ``count`` times.

    A replacement that contains its own pattern (``foo`` -> ``foo_bar``) is
    thus recognised; an empty replacement with no match left is done. A regex
    replacement with group references cannot be checked this way.
    """
    if spec.regex and _GROUP_REF.search(spec.text):
        return False
    if not spec.text:
        return not found
    spans: list[tuple[int, int]] = []
    at = text.find(spec.text)
    while at >= 0:
        spans.append((at, at + len(spec.text)))
        at = text.find(spec.text, at + len(spec.text))
    if len(spans) < spec.count:
        return False
    return all(any(a <= s and e <= b for a, b in spans) for s, e, _ in found)


def _line_starts(text: str) -> list[int]:
    starts = [0]
    at = text.find("\n")
    while at >= 0:
        starts.append(at + 1)
        at = text.find("\n", at + 1)
    return starts


def _line_of(starts: Sequence[int], offset: int) -> int:
    return bisect.bisect_right(starts, offset)


def _replacement_splices(
    text: str, starts: Sequence[int], found: Sequence[_Match]
) -> list[_Splice]:
    """Whole-line splices that carry out the replacements (matches may span lines)."""
    n_lines = len(split_lines(text))
    groups: list[tuple[int, int, list[_Match]]] = []
    for match in found:
        first = _line_of(starts, match[0])
        last = _line_of(starts, max(match[0], match[1] - 1))
        if groups and first <= groups[-1][1]:
            groups[-1] = (groups[-1][0], max(last, groups[-1][1]), [*groups[-1][2], match])
        else:
            groups.append((first, last, [match]))
    splices: list[_Splice] = []
    merged: list[tuple[int, int, list[_Match]]] = []
    for first, last, matches in groups:
        # A replacement that eats a line's end joins the next line into the region.
        while True:
            new = _region_text(text, starts, first, last, matches)
            if new.endswith("\n") or last >= n_lines or first > n_lines:
                break
            last += 1
        if merged and first <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(last, merged[-1][1]), [*merged[-1][2], *matches])
        else:
            merged.append((first, last, list(matches)))
    for first, last, matches in merged:
        if first > n_lines:  # a zero-width match at the very end of the text
            new_text = "".join(m[2] for m in matches)
            splices.append(
                _Splice(n_lines + 1, n_lines, tuple(strip_eol(r) for r in split_lines(new_text)))
            )
            continue
        new_text = _region_text(text, starts, first, last, matches)
        splices.append(_Splice(first, last, tuple(strip_eol(r) for r in split_lines(new_text))))
    return splices


def _region_text(
    text: str, starts: Sequence[int], first: int, last: int, matches: Sequence[_Match]
) -> str:
    begin = starts[first - 1] if first - 1 < len(starts) else len(text)
    end = starts[last] if last < len(starts) else len(text)
    pieces: list[str] = []
    at = begin
    for start, stop, replacement in matches:
        pieces.append(text[at:start])
        pieces.append(replacement)
        at = stop
    pieces.append(text[at:end])
    return "".join(pieces)


# --------------------------------------------------------------------------- entry point


def _check_marker_ids(edits: Sequence[EditSpec]) -> None:
    """Two marked inserts of one file with one id would overwrite each other's block."""
    seen: dict[str, int] = {}
    for index, spec in enumerate(edits):
        if spec.kind != "insert" or not spec.markers:
            continue
        marker_id = spec.marker_id or f"edit-{index + 1}"
        if marker_id in seen:
            raise edit_error(
                spec,
                f"marker id {marker_id!r} is already used by edit {seen[marker_id] + 1} of this "
                "file; give each insert its own id",
            )
        seen[marker_id] = index


def plan_file(
    path: str,
    original: str,
    edits: Sequence[EditSpec],
    *,
    comment: str | None = None,
    hints: HintSource | None = None,
) -> FilePlan:
    """Apply ``edits`` in order to ``original`` (the text of ``path``), in memory.

    ``comment`` is the marker comment leader (default ``#``, ``//`` for C-like
    files). A marked insert without ``marker_id`` uses ``edit-N`` (its 1-based
    position). A UTF-8 byte order mark stays where it is, before line 1, and
    line numbers do not count it. ``hints`` ranks "did you mean" candidates
    for an anchor that matches nothing (default: similar lines). Line
    numbers in errors are the original file's. Raises ``AnchorError`` /
    ``EditError`` naming the playbook key.
    """
    _check_marker_ids(edits)
    bom, body = split_bom(original)
    buffer = _Buffer(body)
    planner = _Planner(path, comment, edits, buffer, hints)
    planner.lines = buffer.lines()
    notes: list[str] = []
    modes: dict[int, str] = {}
    last_changed: int | None = None
    for index, spec in enumerate(edits):
        text = buffer.text()
        try:
            step = _step(planner, text, spec, index)
        except SyntaxError as exc:
            where = f" (after edit {last_changed})" if last_changed else ""
            raise edit_error(spec, f"{exc.msg}{where}") from None
        if step.splices:
            buffer.apply(step.splices, index)
            planner.applied(buffer.text(), buffer.lines(), step.splices)
            modes[index] = step.mode
            last_changed = index + 1
        notes.append(f"edit {index + 1}: {step.note}")
    kinds = [spec.kind for spec in edits]
    result = buffer.text()
    changes = buffer.changes(kinds, modes) if result != body else []
    return FilePlan(
        path=path,
        original=original,
        result=bom + result,
        changes=tuple(changes),
        notes=tuple(notes),
        index=planner.original_src,
    )


def _step(planner: _Planner, text: str, spec: EditSpec, index: int) -> _Step:
    if spec.kind == "insert":
        return planner.insert(text, spec, index)
    if spec.kind == "replace":
        return planner.replace(text, spec)
    if spec.kind == "delete":
        return planner.delete(text, spec)
    if spec.kind == "patch":
        return planner.patch(text, spec)
    raise edit_error(spec, f"unknown edit kind {spec.kind!r}")
