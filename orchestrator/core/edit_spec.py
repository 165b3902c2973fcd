"""Data that travels between the config layer and the edit engine.

The config layer turns a playbook's ``files[].edits`` into ``EditSpec`` values
(templates already rendered, so the engine sees only strings); the engine
(``core.edits``) turns a file's text plus its specs into a ``FilePlan``.
All frozen dataclasses: they are values, compared and hashed freely.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

EditKind = Literal["insert", "replace", "delete", "patch"]


@dataclass(frozen=True)
class Anchor:
    """Where an insert (or a delete) lands.

    ``side`` is ``after`` or ``before``; ``pattern`` is literal text unless
    ``regex`` is true. In a ``.py`` file the anchor names a line and the edit
    lands beside the innermost whole statement containing that line.
    """

    side: Literal["after", "before"]
    pattern: str
    regex: bool = False


@dataclass(frozen=True)
class EditSpec:
    """One rendered edit.

    - insert: ``text`` (flush-left, rendered) placed at ``anchor``.
    - replace: ``pattern`` (literal, or regex when ``regex``) replaced by
      ``text``; exactly ``count`` matches expected.
    - delete: the statement (``.py``) or line at ``anchor`` is removed.
    - patch: ``text`` is a unified diff, applied exactly.

    ``where`` is the location used in error messages, e.g.
    ``playbooks/site.yaml:14: files[0].edits[1]`` split into its parts.
    ``marker_id`` names the begin/end marker comments of an insert when
    ``markers`` is true.
    """

    kind: EditKind
    text: str = ""
    anchor: Anchor | None = None
    pattern: str = ""
    regex: bool = False
    count: int = 1
    markers: bool = True
    marker_id: str = ""
    file: str | None = None
    line: int | None = None
    key: str | None = None


@dataclass(frozen=True)
class Change:
    """One changed region of the result, for the verification view and the checks.

    Line numbers are 1-based and inclusive, in the *result* text
    (``new_start..new_end``) and in the original (``old_start..old_end``).
    An empty range has ``end == start - 1`` (pure insertion / pure deletion).
    """

    edit_index: int
    kind: EditKind
    old_start: int
    old_end: int
    new_start: int
    new_end: int
    note: str = ""


@dataclass(frozen=True)
class FilePlan:
    """The result of planning every edit of one file."""

    path: str
    original: str
    result: str
    changes: tuple[Change, ...] = field(default_factory=tuple)
    notes: tuple[str, ...] = field(default_factory=tuple)
    # The planner's index of ``original`` (a ``core.pyindex.PySource``), so the
    # structural check reads the file once, not again; not part of the value.
    index: Any = field(default=None, compare=False, repr=False)

    @property
    def changed(self) -> bool:
        return self.original != self.result
