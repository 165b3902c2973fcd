"""The unified diff of a planned file, cut along the edits orch planned.

``difflib`` aligns lines by similarity, so an inserted ``parser.add_argument(``
call that ends like its neighbour is often shown as starting *inside* the
previous call (the ``)`` lines match up) — the very picture of the bug orch
exists to prevent, drawn by orch itself. The edit engine already knows the
exact lines each edit wrote and removed (``FilePlan.changes``), so the hunks
are built from those: every ``+`` block is a whole inserted statement. When
the changes do not account for the whole difference (they always should),
``difflib`` is the fallback, so the diff is never wrong, only less tidy.
Pure: text in, text out.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from orchestrator.core.edit_spec import Change


def unified_diff(
    original: str,
    result: str,
    changes: Sequence[Change],
    *,
    fromfile: str,
    tofile: str,
    context: int = 3,
) -> str:
    """``original`` → ``result`` as a unified diff whose hunks follow ``changes``."""
    old = original.splitlines(keepends=True)
    new = result.splitlines(keepends=True)
    ordered = sorted(changes, key=lambda c: (c.old_start, c.new_start))
    if not ordered or not _accounts_for(old, new, ordered):
        return "".join(difflib.unified_diff(old, new, fromfile=fromfile, tofile=tofile, n=context))
    out = [f"--- {fromfile}\n", f"+++ {tofile}\n"]
    for group in _groups(ordered, context):
        out.extend(_hunk(old, new, group, context))
    return "".join(out)


def _accounts_for(old: list[str], new: list[str], changes: Sequence[Change]) -> bool:
    """True when the lines between the changes are the same in both texts."""
    o = n = 1
    for c in changes:
        if c.old_start < o or c.new_start < n or c.old_start - o != c.new_start - n:
            return False
        if old[o - 1 : c.old_start - 1] != new[n - 1 : c.new_start - 1]:
            return False
        o, n = c.old_end + 1, c.new_end + 1
    return len(old) - o == len(new) - n and old[o - 1 :] == new[n - 1 :]


def _groups(changes: Sequence[Change], context: int) -> list[list[Change]]:
    """Changes close enough that their context overlaps share a hunk."""
    groups: list[list[Change]] = []
    for c in changes:
        if groups and c.old_start - groups[-1][-1].old_end - 1 <= 2 * context:
            groups[-1].append(c)
        else:
            groups.append([c])
    return groups


def _hunk(old: list[str], new: list[str], group: list[Change], context: int) -> list[str]:
    first, last = group[0], group[-1]
    old_from = max(1, first.old_start - context)
    old_to = min(len(old), last.old_end + context)
    new_from = first.new_start - (first.old_start - old_from)
    body: list[str] = []
    at = old_from
    for c in group:
        body += [" " + line for line in old[at - 1 : c.old_start - 1]]
        body += ["-" + line for line in old[c.old_start - 1 : c.old_end]]
        body += ["+" + line for line in new[c.new_start - 1 : c.new_end]]
        at = c.old_end + 1
    body += [" " + line for line in old[at - 1 : old_to]]
    old_count = old_to - old_from + 1
    new_count = old_count + sum((c.new_end - c.new_start + 1) - (c.old_end - c.old_start + 1)
                                for c in group)
    header = f"@@ -{_span(old_from, old_count)} +{_span(new_from, new_count)} @@\n"
    return [header, *(_ended(line) for line in body)]


def _span(start: int, count: int) -> str:
    if count == 1:
        return str(start)
    return f"{start if count else start - 1},{count}"


def _ended(line: str) -> str:
    return line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
