"""Flags orch itself declared earlier: which release and playbook wrote them, and whether a
new declaration is the same one.

A flag can reach a file through an earlier release of *another* playbook (``gated.yaml``
then ``speculative-disable``): its declaration sits inside orch's marker block there.
Refusing it as "already declared" would be wrong (it is orch's own), and writing it
again would break the server's parser. So a planned declaration is compared with the
one in the block — the parts that make a flag (type, default, help; whitespace and
markers ignored):

- the same: the edit is satisfied by that release ("declaration provided by release R
  (playbook P)"), and nothing is written;
- different: refused, naming the release, the playbook and the parts that differ.

The release comes from the host's records: each deploy's manifest lists the blocks it
leaves that declare flags (``declares``), and the releases that rely on another's block
(``provided_by``). An older manifest without ``declares`` is matched by its playbook's
name (the marker id's prefix) and the files it changed. Pure: texts and manifests in.
"""

from __future__ import annotations

import ast
import re
import textwrap
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.core.anchors import (
    call_statements,
    comment_prefix,
    field_statements,
    first_string_arg,
)
from orchestrator.core.kept import Kept
from orchestrator.core.layouts import field_name, flag_name
from orchestrator.core.pyindex import PySource

PARTS = ("type", "default", "help")
"""What makes two declarations of one flag the same flag (its name aside)."""


class _Missing:
    def __repr__(self) -> str:
        return "(none)"


MISSING: Any = _Missing()
"""A part a declaration does not say (a parser call's ``default=ServerArgs.x`` defers to the field)."""


@dataclass(frozen=True)
class Source:
    """A part written as an expression orch does not evaluate: compared as its source."""

    text: str

    def __repr__(self) -> str:
        return self.text


# --------------------------------------------------------------------------- marker blocks


@dataclass(frozen=True)
class OrchBlock:
    """One of orch's marked blocks in a file: its id and the rows of its two marker lines."""

    path: str
    marker: str
    first: int
    last: int

    @property
    def playbook(self) -> str:
        """The playbook that wrote it, from the default id ``<playbook>:<file>.<edit>[.<what>]``."""
        return self.marker.rpartition(":")[0]

    def body(self, lines: Sequence[str]) -> list[str]:
        return [line.rstrip("\r\n") for line in lines[self.first: self.last - 1]]


_BLOCKS: Kept[tuple[str, str], tuple[OrchBlock, ...]] = Kept(16)
_BODIES: Kept[tuple[str, str], Mapping[str, str]] = Kept(16)
"""The answers below, once per text: a plan asks three times of each host's copy of a file
(4,000 lines in the fleet bench), and a fleet's copies are the same text."""


def orch_blocks(path: str, text: str) -> list[OrchBlock]:
    """Every complete marker block of ``text`` (an unpaired marker is the edit engine's to refuse)."""
    return list(_BLOCKS.get((path, text), lambda: _blocks(path, text)))


def _blocks(path: str, text: str) -> tuple[OrchBlock, ...]:
    prefix = re.escape(comment_prefix(path))
    begin = re.compile(rf"^\s*{prefix} >>> orch (\S+)\s*$")
    end = re.compile(rf"^\s*{prefix} <<< orch (\S+)\s*$")
    opened: dict[str, int] = {}
    out: list[OrchBlock] = []
    for row, line in enumerate(text.splitlines(), 1):
        if ">>> orch " in line and (m := begin.match(line)):
            opened[m.group(1)] = row
        elif "<<< orch " in line and (m := end.match(line)) and m.group(1) in opened:
            out.append(OrchBlock(path, m.group(1), opened.pop(m.group(1)), row))
    return tuple(out)


def block_around(blocks: Sequence[OrchBlock], first: int, last: int) -> OrchBlock | None:
    """The innermost block holding rows ``first``–``last``."""
    holding = [b for b in blocks if b.first < first and last < b.last]
    return min(holding, key=lambda b: b.last - b.first) if holding else None


def block_text(path: str, text: str, marker: str) -> str | None:
    """The body of block ``marker`` in ``text``, or None when the file has no such block."""
    return _BODIES.get((path, text), lambda: _bodies(path, text)).get(marker)


def _bodies(path: str, text: str) -> Mapping[str, str]:
    """Each marker's body (the first block of a marker that occurs twice)."""
    lines = text.splitlines()
    bodies: dict[str, str] = {}
    for block in orch_blocks(path, text):
        bodies.setdefault(block.marker, "\n".join(block.body(lines)))
    return types.MappingProxyType(bodies)


# --------------------------------------------------------------------------- declarations


@dataclass(frozen=True)
class Declaration:
    """One statement declaring a flag (a class field or a parser call), what it says of the
    flag's parts, and the orch block it sits in (None: the file's own)."""

    path: str
    line: int
    block: OrchBlock | None
    parts: tuple[tuple[str, Any], ...]  # (part, value) for the parts this statement says


def _core_type(node: ast.expr) -> tuple[str, ast.expr | None]:
    """The flag type an annotation names, and the ``A[...]``/``Annotated[...]`` help if any."""
    if isinstance(node, ast.Subscript):
        head = ast.unparse(node.value).rpartition(".")[2]
        inner = node.slice
        if head in ("A", "Annotated") and isinstance(inner, ast.Tuple) and inner.elts:
            helps = [e for e in inner.elts[1:] if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            return _core_type(inner.elts[0])[0], helps[0] if helps else None
        if head == "Optional":
            return _core_type(inner)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [s for s in (node.left, node.right) if not (isinstance(s, ast.Constant) and s.value is None)]
        if len(sides) == 1:
            return _core_type(sides[0])
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string annotation
        try:
            return _core_type(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            pass
    return ast.unparse(node), None


def _value(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return Source(ast.unparse(node))


def field_parts(node: ast.AnnAssign) -> dict[str, Any]:
    """What a field ``name: T = default`` (or ``A[T, "help"]``, ``field(default=...)``) says."""
    kind, help_node = _core_type(node.annotation)
    parts: dict[str, Any] = {"type": kind}
    if help_node is not None:
        parts["help"] = _value(help_node)
    value = node.value
    if isinstance(value, ast.Call) and ast.unparse(value.func).rpartition(".")[2] == "field":
        given = {k.arg: k.value for k in value.keywords}
        value = given.get("default")
    if value is not None:
        parts["default"] = _value(value)
    return parts


def call_parts(call: ast.Call, name: str) -> dict[str, Any]:
    """What ``add_argument("--name", type=..., default=..., help=...)`` says; a default
    that is the field itself (``Cls.name``) says nothing of its own."""
    given = {k.arg: k.value for k in call.keywords if k.arg}
    parts: dict[str, Any] = {}
    action = given.get("action")
    if action is not None and _value(action) == "store_true":
        parts["type"] = "bool"
    elif "type" in given:
        parts["type"] = ast.unparse(given["type"])
    if "help" in given:
        parts["help"] = _value(given["help"])
    default = given.get("default")
    if default is not None and not (isinstance(default, ast.Attribute) and default.attr == name):
        parts["default"] = _value(default)
    return parts


def flag_declarations(path: str, text: str, name: str) -> list[Declaration]:
    """Every field ``name`` and every ``add_argument("--name", …)`` in ``text``, with its block."""
    if f"{name}" not in text and flag_name(name) not in text:
        return []
    src = PySource(path, text)
    blocks = orch_blocks(path, text)
    out: list[Declaration] = []
    for info in field_statements(src, name):
        assert isinstance(info.node, ast.AnnAssign)
        out.append(Declaration(path, info.start, block_around(blocks, info.start, info.end),
                               tuple(field_parts(info.node).items())))
    for info in call_statements(src, "add_argument", flag_name(name)):
        for node in ast.walk(info.node):
            if isinstance(node, ast.Call) and first_string_arg(node) == flag_name(name):
                out.append(Declaration(path, info.start, block_around(blocks, info.start, info.end),
                                       tuple(call_parts(node, name).items())))
                break
    return sorted(out, key=lambda d: (d.path, d.line))


def _same(part: str, found: Any, wanted: Any) -> bool:
    if part == "help" and isinstance(found, str) and isinstance(wanted, str):
        return " ".join(found.split()) == " ".join(wanted.split())
    if isinstance(found, bool) != isinstance(wanted, bool):
        return False
    return bool(found == wanted)


def differences(found: Sequence[Declaration], wanted: Mapping[str, Any]) -> list[str]:
    """The parts (``type``, ``default``, ``help``) in which ``found`` is not ``wanted``, each
    as ``part: X there, Y here``; a part none of them says counts as different."""
    out = []
    for part in PARTS:
        values = [dict(d.parts)[part] for d in found if part in dict(d.parts)]
        unlike = [v for v in values if not _same(part, v, wanted[part])] if values else [MISSING]
        if unlike:
            out.append(f"{part}: {unlike[0]!r} there, {wanted[part]!r} here")
    return out


def declared_names(text: str) -> list[str]:
    """Field names of the flags an inserted statement declares: a field ``name: T…`` or an
    ``add_argument("--name", …)`` call. Text that is no whole statement declares nothing."""
    try:
        tree = ast.parse(textwrap.dedent(text))
    except SyntaxError:
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
        elif isinstance(node, ast.Call) and ast.unparse(node.func).rpartition(".")[2] == "add_argument":
            arg = first_string_arg(node)
            if arg and arg.startswith("--"):
                names.append(field_name(arg))
    return list(dict.fromkeys(names))


# --------------------------------------------------------------------------- releases


@dataclass(frozen=True)
class ReleaseRecord:
    """A release in effect on the host, as far as flag declarations go (from its manifest)."""

    id: str
    playbook: str
    files: tuple[str, ...]
    declares: tuple[tuple[str, str], ...] | None  # (path, marker) of its blocks; None: an older manifest
    provided_by: tuple[Mapping[str, Any], ...] = ()


def releases_in_effect(manifests: Iterable[Mapping[str, Any]], applied: Sequence[str]) -> tuple[ReleaseRecord, ...]:
    """The releases of ``applied`` (the host's state), newest first."""
    by_id = {m.get("id"): m for m in manifests}
    out = []
    for rid in reversed(list(applied)):
        m = by_id.get(rid)
        if not m:
            continue
        declares = m.get("declares")
        out.append(ReleaseRecord(
            str(rid),
            str((m.get("playbook") or {}).get("name") or "?"),
            tuple(str(f.get("path")) for f in m.get("files") or []),
            tuple((str(d.get("path")), str(d.get("marker"))) for d in declares) if declares is not None else None,
            tuple(m.get("provided_by") or ()),
        ))
    return tuple(out)


def release_of(block: OrchBlock, releases: Sequence[ReleaseRecord]) -> ReleaseRecord | None:
    """The newest release in effect that left ``block``: by its ``declares``, or (an older
    manifest) by the playbook the marker names and the files it changed."""
    for r in releases:
        if r.declares is not None:
            if (block.path, block.marker) in r.declares:
                return r
        elif r.playbook == block.playbook and block.path in r.files:
            return r
    return None


def provider_words(block: OrchBlock, release: ReleaseRecord | None) -> str:
    """``release R (playbook P)``, or the block's own name where no release in effect records it."""
    if release is None:
        return f"orch's block {block.marker} (playbook {block.playbook or '?'}; no release in effect records it)"
    return f"release {release.id} (playbook {release.playbook})"


def already_declared(flag: str, found: Declaration, release: ReleaseRecord | None) -> str:
    """The one message for a flag an orch release already declared (``add_flag`` and ``insert:``)."""
    assert found.block is not None
    return (f"{flag} is already declared by {provider_words(found.block, release)} "
            f"in {found.path} (line {found.line}, block {found.block.marker})")


@dataclass(frozen=True)
class Provided:
    """An ``add_flag`` satisfied by another release's identical declaration."""

    flag: str
    release: str | None
    playbook: str
    blocks: tuple[tuple[str, str], ...]  # (path, marker)

    def record(self) -> dict[str, Any]:
        """The manifest's ``provided_by`` entry."""
        return {"flag": self.flag, "release": self.release, "playbook": self.playbook,
                "blocks": [{"path": p, "marker": m} for p, m in self.blocks]}

    def words(self) -> str:
        return f"declaration provided by release {self.release} (playbook {self.playbook})"


def blocks_relied_on(releases: Sequence[ReleaseRecord]) -> list[tuple[ReleaseRecord, Mapping[str, Any], str, str]]:
    """(dependent release, its ``provided_by`` entry, path, marker) for every block a release
    in effect relies on without having written it."""
    out = []
    for r in releases:
        for entry in r.provided_by:
            for b in entry.get("blocks") or []:
                out.append((r, entry, str(b.get("path")), str(b.get("marker"))))
    return out


def relied_on_refusal(dependent: ReleaseRecord, entry: Mapping[str, Any], path: str, marker: str,
                      removed: bool) -> str:
    """Why a deploy may not change a block another release in effect relies on."""
    what = "remove" if removed else "change"
    return (f"this deploy would {what} orch's block {marker} in {path}, the declaration of "
            f"{entry.get('flag')} that release {dependent.id} (playbook {dependent.playbook}) relies on "
            f"(declaration provided by release {entry.get('release')} (playbook {entry.get('playbook')})); "
            f"roll back {dependent.id} first (`orch rollback`), or leave that declaration as it is")


def declared_blocks(path: str, result: str, edits: Sequence[Any]) -> list[dict[str, Any]]:
    """The manifest's ``declares`` entries of one planned file: each marked insert whose
    statement declares a flag and whose block is in the file as planned."""
    if not path.endswith(".py"):
        return []
    out = []
    for spec in edits:
        if getattr(spec, "kind", None) != "insert" or not spec.markers or not spec.marker_id or not spec.text:
            continue
        names = declared_names(spec.text)
        if names and block_text(path, result, spec.marker_id) is not None:
            out += [{"flag": flag_name(n), "path": path, "marker": spec.marker_id} for n in names]
    return out


def relied_on_change(files: Sequence[tuple[str, str, str]], releases: Sequence[ReleaseRecord]) -> str | None:
    """Why a plan that turns each ``(path, before, after)`` may not run: it changes or removes a
    block a release in effect relies on (``blocks_relied_on``). None: it touches none."""
    changed = {path: (before, after) for path, before, after in files if before != after}
    for dependent, entry, path, marker in blocks_relied_on(releases):
        if path not in changed:
            continue
        before, after = changed[path]
        was, now = block_text(path, before, marker), block_text(path, after, marker)
        if was is not None and now != was:
            return relied_on_refusal(dependent, entry, path, marker, removed=now is None)
    return None
