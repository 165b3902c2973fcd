"""The verification view: which lines of the edited file to read back and show.

After the commit orch reads the changed regions back from the host, each
with a few lines of context, the way the engineer in the story checked the
fix with ``sed -n A,Bp`` before restarting. Pure: changes in, line ranges out.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from orchestrator.core.edit_spec import Change


@dataclass(frozen=True)
class ViewRange:
    """Lines ``start..end`` (1-based, inclusive) of the result; ``highlight`` are the changed ones."""

    start: int
    end: int
    highlight: tuple[int, ...]

    @property
    def sed(self) -> str:
        """The ``sed -n`` script that prints this range."""
        return f"{self.start},{self.end}p"


LINE_BREAK = re.compile("\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
"""Where ``str.splitlines`` breaks a line: the view's line numbers are its line numbers."""
RARE_BREAK = re.compile("[\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def count_lines(text: str) -> int:
    """``len(text.splitlines())`` without the list: a 50 MB file is a million and more
    line objects, which the verification view does not need to draw a few of them."""
    if not text:
        return 0
    if RARE_BREAK.search(text) is None:
        return text.count("\n") + (not text.endswith("\n"))
    return sum(1 for _ in _line_spans(text))


def lines_between(text: str, start: int, end: int) -> list[str]:
    """``text.splitlines()[start - 1 : end]``, reading ``text`` only up to line ``end``."""
    out: list[str] = []
    for n, (a, b) in enumerate(_line_spans(text), start=1):
        if n > end:
            break
        if n >= start:
            out.append(text[a:b])
    return out


def _line_spans(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each line of ``text`` as ``splitlines`` cuts it, breaks left out."""
    plain = RARE_BREAK.search(text) is None
    pos = 0
    while pos < len(text):
        if plain:
            cut = text.find("\n", pos)
            stop, after = (len(text), len(text)) if cut < 0 else (cut, cut + 1)
        else:
            found = LINE_BREAK.search(text, pos)
            stop, after = (len(text), len(text)) if found is None else found.span()
        yield pos, stop
        pos = after


def view_ranges(changes: Sequence[Change], total_lines: int, context: int = 3) -> list[ViewRange]:
    """Each change with ``context`` lines around it, clipped, overlapping/adjacent ones merged.

    A pure deletion highlights nothing but still shows the lines around the
    spot where the deleted lines were.
    """
    spans: list[tuple[int, int, tuple[int, ...]]] = []
    for change in changes:
        if change.new_end >= change.new_start:
            first, last = change.new_start, change.new_end
            marked = tuple(range(first, last + 1))
        else:  # nothing left in the result: the spot is just before new_start
            first, last = change.new_start, change.new_start - 1
            marked = ()
        start = max(1, first - context)
        end = min(total_lines, last + context)
        if start > end:
            continue
        spans.append((start, end, tuple(n for n in marked if 1 <= n <= total_lines)))
    spans.sort()
    merged: list[ViewRange] = []
    for start, end, marked in spans:
        if merged and start <= merged[-1].end + 1:
            prev = merged[-1]
            merged[-1] = ViewRange(
                prev.start, max(prev.end, end), tuple(sorted(set(prev.highlight) | set(marked)))
            )
        else:
            merged.append(ViewRange(start, end, marked))
    return merged


def text_changes(before: str, after: str) -> list[Change]:
    """The changed regions between two whole texts (a release's before and after copies).

    For a release recorded earlier, where the plan's own changes are no
    longer at hand: ``orch history --release`` shows its ``sed -n`` view
    from the two backups alone.
    """
    old, new = before.splitlines(), after.splitlines()
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    return [
        Change(edit_index=0, kind="replace", old_start=i1 + 1, old_end=i2, new_start=j1 + 1, new_end=j2)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"
    ]
