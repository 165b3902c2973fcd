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


AnchorKind = Literal["text", "field", "call", "item"]


@dataclass(frozen=True)
class Anchor:
    """Where an insert (or a delete) lands.

    ``side`` is ``after`` or ``before``. ``kind`` says how the place is named:

    - ``text``: ``pattern`` is literal text (a regex when ``regex``) on a
      line; in a ``.py`` file the edit lands beside the innermost whole
      statement containing that line;
    - ``field``: ``pattern`` names a class field, ``Class.name`` or ``name``:
      the edit lands beside that annotated assignment;
    - ``call``: ``pattern`` is the called function as written
      (``parser.add_argument``; a bare ``add_argument`` matches any
      receiver) and ``arg`` the string its first argument must be: the edit
      lands beside the statement holding that call;
    - ``item``: ``pattern`` names a list/tuple/set/dict literal assigned to
      that name and ``arg`` one of its elements (a string's value, or the
      element's source): the edit is an element, placed beside that one,
      inside the literal.
    """

    side: Literal["after", "before"]
    pattern: str
    regex: bool = False
    kind: AnchorKind = "text"
    arg: str | None = None

    def describe(self) -> str:
        """The anchor as a person would name it in a message."""
        if self.kind == "field":
            return f"field {self.pattern}"
        if self.kind == "call":
            return f"call {self.pattern}({self.arg!r}, …)" if self.arg else f"call {self.pattern}(…)"
        if self.kind == "item":
            return f"element {self.arg!r} of {self.pattern}"
        return f"/{self.pattern}/" if self.regex else repr(self.pattern)


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
