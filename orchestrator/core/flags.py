"""``add_flag``: one playbook edit that declares a server flag the way the file's release does.

The playbook says *what* (``name``, ``type``, ``default``, ``help``) and
*beside which flag* (``near``); ``core.layouts`` reads the file to learn
*where* and *how* its release declares flags; this module renders the
declarations through the templates in ``templates/flags/`` (so a person can
read and change what is written) and turns them into ordinary inserts with
structural anchors — the edit engine, markers, re-runs and the structural
check then treat them like any other insert.

A flag the file (or the module that holds the fields) already declares
outside orch's own blocks is refused: adding it twice would only move the
error to the server's start. One declared inside the block of another
playbook's release is that release's (``core.declarations``): the same
declaration is satisfied by it, a different one is refused naming what differs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.core.declarations import (
    Declaration,
    OrchBlock,
    Provided,
    ReleaseRecord,
    already_declared,
    declared_names,
    differences,
    flag_declarations,
    release_of,
)
from orchestrator.core.edit_spec import Anchor, EditSpec
from orchestrator.core.layouts import SPEC, Layout, LayoutError, NoNeighbour, find_layout, flag_name
from orchestrator.core.templating import Renderer
from orchestrator.errors import EditError

TEMPLATES = {
    "field": "flags/field.py.j2",
    "annotated_field": "flags/annotated_field.py.j2",
    "argument": "flags/argument.py.j2",
}
"""The template each kind of declaration is rendered from (looked up like any ``insert:``)."""


@dataclass(frozen=True)
class FlagRequest:
    """An ``add_flag`` edit with its values rendered, and where it came from in the playbook."""

    name: str  # the field name: speculative_disable_batch_threshold
    type: str  # int, float, str or bool
    default: Any
    help: str
    near: tuple[str, ...]  # the neighbours' field names, tried in order (the first the file declares wins)
    markers: bool = True
    marker_id: str = ""
    file: str | None = None
    line: int | None = None
    key: str | None = None

    @property
    def flag(self) -> str:
        return flag_name(self.name)

    def error(self, message: str) -> EditError:
        return EditError(message, file=self.file, line=self.line, key=self.key)


class NeighbourNotFound(EditError):
    """No name of the request's ``near`` is a flag of ``path``. On the spec layout the message
    has no "did you mean" yet: the fields live in modules only a wider read finds
    (``wider_refusal``)."""

    request: FlagRequest | None = None
    path: str = ""
    text: str = ""
    kind: str | None = None  # a copy made by ``located()`` has none: no wider read then


def neighbour_not_found(request: FlagRequest, path: str, text: str, exc: NoNeighbour) -> NeighbourNotFound:
    error = NeighbourNotFound(str(exc), file=request.file, line=request.line, key=request.key)
    error.request, error.path, error.text, error.kind = request, path, text, exc.kind
    return error


def wants_wider_read(error: NeighbourNotFound) -> bool:
    """The spec layout: the closest names are in field modules the first read did not follow."""
    return error.kind == SPEC and error.request is not None


def wider_refusal(error: NeighbourNotFound, companions: Mapping[str, str]) -> EditError:
    """``error`` again, with the closest names found in ``companions`` (more of the package's modules)."""
    if error.request is None:
        return error
    try:
        find_layout(error.path, error.text, error.request.near, companions)
    except LayoutError as exc:
        return error.request.error(str(exc))
    return error  # the wider read found it after all: still refused, the first read decides


@dataclass(frozen=True)
class FlagPlan:
    """What ``add_flag`` will write: the layout it recognised, and one insert per declaration."""

    request: FlagRequest
    layout: Layout
    edits: tuple[tuple[str, EditSpec], ...]  # (file path, insert); none when ``provided``
    provided: Provided | None = None  # satisfied by another release's identical declaration


# --------------------------------------------------------------------------- Python literals


def py_string(value: str, quote: str = '"') -> str:
    """``value`` as a Python string literal in ``quote``."""
    if quote == '"':
        return json.dumps(value, ensure_ascii=False)
    body = json.dumps(value, ensure_ascii=False)[1:-1].replace('\\"', '"').replace("'", "\\'")
    return f"'{body}'"


def py_literal(value: Any, quote: str = '"') -> str:
    if isinstance(value, str):
        return py_string(value, quote)
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    raise ValueError(f"cannot write {value!r} as a Python literal")


def type_hint(kind: str, default: Any, optional: str) -> str:
    if kind == "bool" or default is not None:
        return kind
    return f"Optional[{kind}]" if optional == "Optional" else f"{kind} | None"


def template_context(request: FlagRequest, layout: Layout) -> dict[str, Any]:
    """What the ``flags/*`` templates see as ``flag``."""
    style = layout.style
    default = False if request.type == "bool" and request.default is None else request.default
    keywords: dict[str, str] = {
        "type": request.type,
        "default": f"{layout.cls}.{request.name}",
        "help": py_string(request.help, style.quote),
    }
    ordered = [(k, keywords[k]) for k in style.keywords if k in keywords]
    if request.type == "bool":
        ordered = [("action", py_string("store_true", style.quote)) if k == "type" else (k, v) for k, v in ordered]
    return {
        "name": request.name,
        "flag": request.flag,
        "type": request.type,
        "default": default,
        "help": request.help,
        "near": layout.near,
        "layout": layout.kind,
        "cls": layout.cls,
        "type_hint": type_hint(request.type, default, style.optional),
        "default_literal": py_literal(default, style.quote),
        "help_literal": py_string(request.help, style.quote),
        "flag_literal": py_string(request.flag, style.quote),
        "alias": style.alias,
        "metadata": list(style.metadata),
        "one_line": style.one_line,
        "receiver": style.receiver,
        "keywords": ordered,
    }


# --------------------------------------------------------------------------- planning


def wanted_parts(request: FlagRequest) -> dict[str, Any]:
    """The parts of the declaration ``request`` would write, as a declaration in a file says them."""
    default = False if request.type == "bool" and request.default is None else request.default
    return {"type": request.type, "default": default, "help": request.help}


def provided_by_release(
    request: FlagRequest, layout: Layout, others: list[Declaration], known: Sequence[ReleaseRecord]
) -> FlagPlan:
    """``request`` is declared in another playbook's orch block: satisfied when the release in
    effect that wrote it declares the same flag; refused (nothing changed) otherwise."""
    first = others[0]
    assert first.block is not None
    release = release_of(first.block, known)
    message = already_declared(request.flag, first, release)
    if release is None:
        raise request.error(f"{message}; there is nothing to add")
    diffs = differences(others, wanted_parts(request))
    if diffs:
        raise request.error(f"{message}, differently: {'; '.join(diffs)}; nothing changed")
    blocks = tuple(dict.fromkeys((d.block.path, d.block.marker) for d in others if d.block is not None))
    return FlagPlan(request, layout, (), Provided(request.flag, release.id, release.playbook, blocks))


def of_same_playbook(block: OrchBlock, marker_id: str) -> bool:
    """``block`` was written by the playbook whose edit has ``marker_id`` (its other edits
    may declare the same flag: a field and its parser call are two inserts)."""
    if ":" not in marker_id:
        return block.marker == marker_id
    return block.playbook == marker_id.rpartition(":")[0]


def refuse_redeclaring(
    path: str, text: str, companions: Mapping[str, str], spec: EditSpec, known: Sequence[ReleaseRecord]
) -> None:
    """An ``insert:`` in a Python file whose statement declares a flag an orch release (of
    another block) already declared: refused, as ``add_flag`` is, before anything is staged."""
    if spec.kind != "insert" or not path.endswith(".py") or not spec.text:
        return
    for name in declared_names(spec.text):
        for where, body in {path: text, **companions}.items():
            for found in flag_declarations(where, body, name):
                if found.block is not None and not of_same_playbook(found.block, spec.marker_id):
                    message = already_declared(flag_name(name), found, release_of(found.block, known))
                    raise EditError(f"{message}; this insert would declare it a second time",
                                    file=spec.file, line=spec.line, key=spec.key)


def plan_flag(
    request: FlagRequest,
    path: str,
    text: str,
    companions: Mapping[str, str],
    renderer: Renderer,
    variables: Mapping[str, Any],
    known: Sequence[ReleaseRecord] = (),
) -> FlagPlan:
    """The inserts that declare ``request`` in the layout of ``path`` (or of the module holding
    its fields, one of ``companions``). Raises ``EditError`` at the playbook key. ``known``:
    the releases in effect on the host, newest first (who wrote an orch block found there)."""
    try:
        layout = find_layout(path, text, request.near, companions)
    except NoNeighbour as exc:
        raise neighbour_not_found(request, path, text, exc) from None
    except LayoutError as exc:
        raise request.error(str(exc)) from None
    texts = {path: text, **companions}
    found = [d for target in layout.paths for d in flag_declarations(target, texts[target], request.name)]
    for d in found:
        if d.block is None:
            raise request.error(
                f"{d.path} already declares {request.name} (line {d.line}); "
                f"{request.flag} exists there, there is nothing to add"
            )
    others = [d for d in found if d.block is not None and not d.block.marker.startswith(f"{request.marker_id}.")]
    if others:
        return provided_by_release(request, layout, others, known)
    context = {**variables, "flag": template_context(request, layout)}
    edits: list[tuple[str, EditSpec]] = []
    for declaration in layout.declarations:
        body = renderer.render_template(
            TEMPLATES[declaration.what], context, file=request.file, line=request.line, key=request.key
        )
        anchor = Anchor(
            "after", declaration.anchor, kind=declaration.anchor_kind, arg=declaration.arg  # type: ignore[arg-type]
        )
        spec = EditSpec(
            kind="insert",
            text=body,
            anchor=anchor,
            markers=request.markers,
            marker_id=f"{request.marker_id}.{declaration.what}",
            file=request.file,
            line=request.line,
            key=request.key,
        )
        edits.append((declaration.path, spec))
    return FlagPlan(request, layout, tuple(edits))


def expand_edits(
    path: str,
    edits: Sequence[EditSpec | FlagRequest],
    text: str,
    companions: Mapping[str, str],
    renderer: Renderer,
    variables: Mapping[str, Any],
    known: Sequence[ReleaseRecord] = (),
) -> tuple[dict[str, list[EditSpec]], list[FlagPlan]]:
    """A file entry's edits as plain inserts per file, in playbook order: each ``add_flag``
    becomes the inserts of its layout (in ``path`` or in one of ``companions``), none when
    another release's identical declaration provides it. ``known``: see ``plan_flag``."""
    out: dict[str, list[EditSpec]] = {path: []}
    plans: list[FlagPlan] = []
    for edit in edits:
        if isinstance(edit, EditSpec):
            refuse_redeclaring(path, text, companions, edit, known)
            out[path].append(edit)
            continue
        flag = plan_flag(edit, path, text, companions, renderer, variables, known)
        plans.append(flag)
        for target, spec in flag.edits:
            out.setdefault(target, []).append(spec)
    return out, plans
