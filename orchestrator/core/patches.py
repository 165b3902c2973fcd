"""Unified diffs, applied exactly or refused.

A ``patch:`` edit is the one kind of edit whose author already decided every
line, so orch applies it the way ``patch`` does at fuzz 0: the context and
removed lines must match exactly, at the hunk's stated line or, failing that,
at one unique offset. A patch whose reverse applies is already applied
(re-running a playbook is a no-op). Anything else is refused with the first
hunk that failed and why. Pure: text in, splices out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.core.anchors import shorten, split_lines, strip_eol

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(ValueError):
    """The diff is malformed or does not apply; the message is one line."""


@dataclass(frozen=True)
class Hunk:
    number: int  # 1-based, for messages
    header: str
    old_start: int
    new_start: int
    old: tuple[str, ...]  # context + removed lines, without endings
    new: tuple[str, ...]  # context + added lines

    def reversed(self) -> Hunk:
        return Hunk(self.number, self.header, self.new_start, self.old_start, self.new, self.old)


@dataclass(frozen=True)
class Splice:
    """Replace lines ``start..end`` (1-based, inclusive; ``end == start - 1`` inserts)."""

    start: int
    end: int
    lines: tuple[str, ...]  # without endings


@dataclass(frozen=True)
class PatchOutcome:
    splices: tuple[Splice, ...]
    already_applied: bool
    offsets: tuple[int, ...] = ()


def _looks_like_hunk_body(row: str) -> bool:
    if row.startswith(("--- ", "+++ ", "-- ")) or row == "--":
        return False
    return row[:1] in ("+", "-") or (row.startswith(" ") and bool(row.strip()))


def parse_patch(diff: str) -> list[Hunk]:
    """The hunks of a one-file unified diff (``---``/``+++`` headers optional)."""
    rows = [strip_eol(line) for line in split_lines(diff)]
    hunks: list[Hunk] = []
    i = 0
    files = 0
    while i < len(rows):
        row = rows[i]
        if row.startswith("--- ") and i + 1 < len(rows) and rows[i + 1].startswith("+++ "):
            files += 1
            if files > 1:
                raise PatchError("the patch touches more than one file")
            i += 2
            continue
        match = _HUNK.match(row)
        if not match:
            if hunks and _looks_like_hunk_body(row):
                raise PatchError(
                    f"line {i + 1} of the patch is outside every hunk (are hunk {len(hunks)}'s "
                    f"line counts right?): {shorten(row)}"
                )
            i += 1  # "diff --git", "index …", a signature: not ours to read
            continue
        old_len = int(match.group(2)) if match.group(2) is not None else 1
        new_len = int(match.group(4)) if match.group(4) is not None else 1
        old: list[str] = []
        new: list[str] = []
        i += 1
        while (len(old) < old_len or len(new) < new_len) and i < len(rows):
            line = rows[i]
            if line.startswith("\\"):  # "\ No newline at end of file"
                i += 1
                continue
            tag, body = (line[:1] or " "), line[1:]
            if tag == " ":
                old.append(body)
                new.append(body)
            elif tag == "-":
                old.append(body)
            elif tag == "+":
                new.append(body)
            else:
                break
            i += 1
        while i < len(rows) and rows[i].startswith("\\"):
            i += 1
        if len(old) != old_len or len(new) != new_len:
            raise PatchError(
                f"hunk {len(hunks) + 1} ({row}) is truncated: expected {old_len} old and "
                f"{new_len} new lines, found {len(old)} and {len(new)}"
            )
        old_start = int(match.group(1))
        new_start = int(match.group(3))
        hunks.append(
            Hunk(
                number=len(hunks) + 1,
                header=match.group(0),
                # ``-a,0`` means "after line a": the old lines start at a + 1.
                old_start=old_start + 1 if old_len == 0 else old_start,
                new_start=new_start + 1 if new_len == 0 else new_start,
                old=tuple(old),
                new=tuple(new),
            )
        )
    if not hunks:
        raise PatchError("the patch has no hunks (no @@ lines)")
    return hunks


def _matches_at(lines: Sequence[str], want: Sequence[str], start: int) -> bool:
    """``want`` equals ``lines`` from 1-based line ``start``."""
    if start < 1 or start - 1 + len(want) > len(lines):
        return False
    return all(lines[start - 1 + k] == w for k, w in enumerate(want))


def _why_not(lines: Sequence[str], hunk: Hunk, start: int) -> str:
    if start - 1 + len(hunk.old) > len(lines):
        return f"the file has {len(lines)} lines, the hunk needs lines {start}-{start + len(hunk.old) - 1}"
    for k, want in enumerate(hunk.old):
        have = lines[start - 1 + k] if 0 <= start - 1 + k < len(lines) else ""
        if have != want:
            return f"line {start + k} reads {shorten(have, 60)!r} where the patch expects {shorten(want, 60)!r}"
    return "it does not match"


def _place(lines: Sequence[str], hunks: Sequence[Hunk], *, exact: bool) -> list[int] | str:
    """1-based start line of each hunk, or the reason the first failing hunk fails."""
    starts: list[int] = []
    delta = 0
    floor = 1
    for hunk in hunks:
        expected = hunk.old_start + delta
        if _matches_at(lines, hunk.old, expected) and expected >= floor:
            start = expected
        elif exact or not hunk.old:
            return f"hunk {hunk.number} ({hunk.header}) does not apply: {_why_not(lines, hunk, expected)}"
        else:
            found = [
                s
                for s in range(floor, len(lines) - len(hunk.old) + 2)
                if _matches_at(lines, hunk.old, s)
            ]
            if len(found) != 1:
                where = (
                    _why_not(lines, hunk, expected)
                    if not found
                    else "its lines match at several places (lines "
                    + ", ".join(str(s) for s in found[:5])
                    + ")"
                )
                return f"hunk {hunk.number} ({hunk.header}) does not apply: {where}"
            start = found[0]
        starts.append(start)
        delta = start - hunk.old_start  # the file's drift from the diff's, carried on
        floor = start + len(hunk.old)
    return starts


def _trimmed(start: int, hunk: Hunk) -> Splice:
    """The hunk's splice without its leading and trailing context: only changed lines."""
    old, new = list(hunk.old), list(hunk.new)
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    kept = new[head : len(new) - tail]
    first = start + head
    return Splice(first, first + (len(old) - head - tail) - 1, tuple(kept))


def apply_patch(text: str, diff: str) -> PatchOutcome:
    """Splices (in ``text``'s line numbers) that apply ``diff``; or already applied.

    Raises ``PatchError`` naming the first hunk that failed and why.
    """
    hunks = parse_patch(diff)
    lines = [strip_eol(line) for line in split_lines(text)]
    reverse = [h.reversed() for h in hunks]
    # A file in the patched state at the stated lines: already applied.
    if isinstance(_place(lines, reverse, exact=True), list):
        return PatchOutcome((), True)
    forward = _place(lines, hunks, exact=False)
    if isinstance(forward, list):
        splices = tuple(_trimmed(start, h) for start, h in zip(forward, hunks, strict=True))
        offsets = tuple(start - h.old_start for start, h in zip(forward, hunks, strict=True))
        return PatchOutcome(splices, False, offsets)
    if isinstance(_place(lines, reverse, exact=False), list):
        return PatchOutcome((), True)
    raise PatchError(f"{forward} (nor is it already applied: its reverse does not apply either)")
