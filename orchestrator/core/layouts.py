"""How a release declares its server flags: the layouts ``add_flag`` recognises.

SGLang changed how a flag is declared twice, and vLLM has its own shape;
a patch written for one is wrong (or silently a no-op) on another. Read off
the real files (see the layout tests), a flag is:

- **classic** (SGLang ≤ 0.5.13): a ``@dataclass ServerArgs`` field
  (``name: Optional[int] = None``) *and* a hand-written
  ``parser.add_argument("--name", type=..., default=ServerArgs.name, help=...)``;
- **annotated** (SGLang 0.5.14–0.5.19): one ``ServerArgs`` field written
  ``name: A[type, "help", NS("group")] = default`` — only those become flags
  (``add_cli_args_from_dataclass``); a plain field compiles and is not one;
- **spec** (SGLang ≥ 0.5.20): the same ``A[...]`` field, in a namespace class of
  ``sglang/srt/arg_groups/fields/*.py`` that ``server_args.py`` imports;
- **vLLM** (``vllm/engine/arg_utils.py``): an ``EngineArgs`` field plus
  ``<group>.add_argument("--name", ...)`` on the group of its neighbours.

``find_layout`` recognises which one a file uses from its AST — the place of
the neighbouring flag ``near`` — and returns where the new declarations go
and in which style (quotes, ``Optional[X]`` or ``X | None``, the ``A`` alias
and ``NS(...)`` marker, the argument group variable, keyword order). Pure:
texts in, a ``Layout`` out; ``LayoutError`` says what was looked for.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.core.anchors import (
    call_matches,
    call_statements,
    field_statements,
    first_string_arg,
)
from orchestrator.core.pyindex import PySource, StmtInfo

CLASSIC = "classic"
ANNOTATED = "annotated"
SPEC = "spec"
VLLM = "vllm"

LAYOUT_NAMES = {
    CLASSIC: "the classic layout (SGLang ≤ 0.5.13: a dataclass field and a parser.add_argument call)",
    ANNOTATED: "the annotated layout (SGLang 0.5.14–0.5.19: fields written A[type, help])",
    SPEC: "the spec layout (SGLang ≥ 0.5.20: A[type, help] fields in arg_groups/fields/)",
    VLLM: "vLLM's EngineArgs layout (a field and group.add_argument)",
}


class LayoutError(ValueError):
    """The file's flag layout is not one ``add_flag`` knows, or the neighbour is not where it can use it."""


def field_name(flag: str) -> str:
    """``--speculative-accept-threshold-acc`` or the field itself -> ``speculative_accept_threshold_acc``."""
    return flag.strip().lstrip("-").replace("-", "_")


def flag_name(name: str) -> str:
    """A field name (or a flag) -> ``--the-flag``."""
    return "--" + field_name(name).replace("_", "-")


@dataclass(frozen=True)
class Style:
    """How the neighbours are written, for the templates."""

    quote: str = '"'  # the quote of string literals
    optional: str = "Optional"  # "Optional" (Optional[X]) or "|" (X | None)
    alias: str = "A"  # the Annotated alias of A[...] fields
    metadata: tuple[str, ...] = ()  # markers copied from the neighbour's A[...], e.g. NS("spec")
    one_line: bool = False  # the neighbour's A[...] annotation fits on its line
    receiver: str = "parser"  # the argument group the parser call goes on
    func: str = "parser.add_argument"  # the neighbour's call, as written
    keywords: tuple[str, ...] = ("type", "default", "help")  # keyword order of the neighbour's call


@dataclass(frozen=True)
class Declaration:
    """One thing to write: ``what`` (``field`` / ``annotated_field`` / ``argument``) in ``path``,
    after the neighbour named by the structural anchor ``anchor_kind``/``anchor``/``arg``."""

    what: str
    path: str
    anchor_kind: str  # "field" or "call"
    anchor: str
    arg: str | None = None


@dataclass(frozen=True)
class Layout:
    """Where and how a new flag is declared next to ``near``."""

    kind: str  # CLASSIC, ANNOTATED, SPEC or VLLM
    cls: str  # the class that holds the fields (ServerArgs, Spec, EngineArgs)
    near: str  # the neighbour's field name
    declarations: tuple[Declaration, ...]
    style: Style = field(default_factory=Style)

    @property
    def description(self) -> str:
        return LAYOUT_NAMES[self.kind]

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(d.path for d in self.declarations))


# --------------------------------------------------------------------------- reading the AST


def _annotated_alias(annotation: ast.expr) -> str | None:
    """``A`` in ``A[...]`` (or ``Annotated``/``typing.Annotated``) if the annotation is one."""
    if not isinstance(annotation, ast.Subscript):
        return None
    value = ast.unparse(annotation.value)
    if value in ("A", "Annotated") or value.endswith(".Annotated"):
        return value
    return None


def _annotated_parts(annotation: ast.Subscript) -> list[ast.expr]:
    inner = annotation.slice
    return list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]


def _segment(src: PySource, node: ast.AST) -> str:
    """The source text of ``node`` (one line per row, as written)."""
    first, last = node.lineno, node.end_lineno or node.lineno  # type: ignore[attr-defined]
    rows = [src.line(row) for row in range(first, last + 1)]
    if len(rows) == 1:
        return rows[0][node.col_offset : node.end_col_offset]  # type: ignore[attr-defined]
    rows[0] = rows[0][node.col_offset :]  # type: ignore[attr-defined]
    rows[-1] = rows[-1][: node.end_col_offset]  # type: ignore[attr-defined]
    return "\n".join(rows)


def _quote_of(src: PySource, node: ast.AST | None, default: str = '"') -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = _segment(src, node).lstrip("rbuRBU")
        if text[:1] in ("'", '"'):
            return text[0]
    return default


def _optional_style(src: PySource, info: StmtInfo) -> str:
    """``Optional`` or ``|``: how the class around ``info`` writes an optional type."""
    owner = info.owner
    if owner is None:
        return "Optional"
    text = src.text_of(owner.start, owner.end)
    optional = text.count("Optional[")
    union = len(re.findall(r"\|\s*None\b", text))
    if optional == union == 0:
        return "Optional" if re.search(r"\bOptional\b", src.text[:20000]) else "|"
    return "Optional" if optional >= union else "|"


def _class_of(info: StmtInfo) -> str:
    assert info.owner is not None and isinstance(info.owner.node, ast.ClassDef)
    return info.owner.node.name


def _one(found: Sequence[StmtInfo], what: str, path: str) -> StmtInfo | None:
    if len(found) > 1:
        rows = ", ".join(str(info.start) for info in found)
        raise LayoutError(f"{what} is declared {len(found)} times in {path} (lines {rows})")
    return found[0] if found else None


def _neighbour_call(src: PySource, near: str) -> tuple[StmtInfo, ast.Call] | None:
    """The statement and the ``*.add_argument("--near", ...)`` call that declares ``--near``."""
    flag = flag_name(near)
    found = call_statements(src, "add_argument", flag)
    info = _one(found, f"the parser call for {flag}", src.path)
    if info is None:
        return None
    call = next(
        node
        for node in ast.walk(info.node)
        if isinstance(node, ast.Call)
        and call_matches(node.func, "add_argument")
        and first_string_arg(node) == flag
    )
    return info, call


def _call_style(src: PySource, call: ast.Call) -> dict[str, object]:
    func = ast.unparse(call.func)
    receiver = ast.unparse(call.func.value) if isinstance(call.func, ast.Attribute) else "parser"
    order = [k.arg for k in call.keywords if k.arg in ("type", "default", "help", "action")]
    keywords = tuple(dict.fromkeys([*(k for k in order if k != "action"), "type", "default", "help"]))
    return {
        "receiver": receiver,
        "func": func,
        "keywords": keywords,
        "quote": _quote_of(src, call.args[0] if call.args else None),
    }


def _annotated_style(src: PySource, info: StmtInfo, alias: str) -> dict[str, object]:
    node = info.node
    assert isinstance(node, ast.AnnAssign) and isinstance(node.annotation, ast.Subscript)
    parts = _annotated_parts(node.annotation)
    help_node: ast.expr | None = next((p for p in parts[1:] if isinstance(p, ast.Constant)), None)
    if help_node is None:  # A[T, Arg(help="…")]
        arg = next((p for p in parts[1:] if isinstance(p, ast.Call)), None)
        help_node = next((k.value for k in arg.keywords if k.arg == "help"), None) if arg else None
    metadata = tuple(
        _segment(src, p)
        for p in parts[1:]
        if isinstance(p, ast.Call) and ast.unparse(p.func).rpartition(".")[2] == "NS"
    )
    return {
        "alias": alias,
        "metadata": metadata,
        "quote": _quote_of(src, help_node),
        "one_line": node.annotation.lineno == node.annotation.end_lineno,
    }


# --------------------------------------------------------------------------- the layouts


class NoNeighbour(LayoutError):
    """No name of ``near`` is a flag of the file; ``kind`` is the layout the file seems to use.

    The spec layout keeps its fields in modules the misspelt name does not lead to, so the
    caller may look through more of them (``find_layout`` again, wider ``companions``) for
    the closest names."""

    def __init__(self, message: str, kind: str | None) -> None:
        super().__init__(message)
        self.kind = kind


class _Miss(LayoutError):
    """``near`` names no flag here (not found, or found as something that is no flag): the next name is tried."""


def find_layout(
    path: str, text: str, near: str | Sequence[str], companions: Mapping[str, str] | None = None
) -> Layout:
    """The layout of ``path`` around the neighbour flag ``near``.

    ``near`` is one name or a list of them, tried in order: old releases lack
    the newest neighbour, so a playbook lists the older ones after it, and the
    first that is a flag of the file (or of a companion) wins.
    ``companions`` are other modules of the package (path -> text), where
    the spec layout keeps its fields; the first one declaring the name is it.
    Raises ``LayoutError`` naming what was looked for; when nothing matches,
    it names the layout the file seems to use and the closest names in it.
    """
    names = list(dict.fromkeys(field_name(n) for n in ([near] if isinstance(near, str) else near)))
    src = PySource(path, text)
    misses: list[str] = []
    for name in names:
        try:
            return _layout_of(src, name, companions or {})
        except _Miss as miss:
            misses.append(str(miss))
    raise NoNeighbour(_nothing_near(path, text, names, misses, companions or {}), describe_file_layout(text))


def _layout_of(src: PySource, near: str, companions: Mapping[str, str]) -> Layout:
    """The layout at the one neighbour ``near``; ``_Miss`` when it is no flag of these files."""
    info = _one(field_statements(src, near), f"the field {near}", src.path)
    if info is not None:
        return _layout_at(src, info, near)
    for other, other_text in companions.items():
        other_src = PySource(other, other_text)
        found = _one(field_statements(other_src, near), f"the field {near}", other)
        if found is None:
            continue
        node = found.node
        alias = _annotated_alias(node.annotation) if isinstance(node, ast.AnnAssign) else None
        if alias is None:
            raise _Miss(
                f"{near}: only a field of {_class_of(found)} in {other} (line {found.start}), "
                "without A[...]: not a flag"
            )
        style = Style(optional=_optional_style(other_src, found), **_annotated_style(other_src, found, alias))  # type: ignore[arg-type]
        cls = _class_of(found)
        return Layout(SPEC, cls, near, (Declaration("annotated_field", other, "field", f"{cls}.{near}"),), style)
    raise _Miss(f"{near}: no class field of that name")


def _nothing_near(
    path: str, text: str, names: list[str], misses: list[str], companions: Mapping[str, str]
) -> str:
    """The refusal when no name of ``near`` is a flag: what was looked for, the layout the
    file seems to use, and the names in it closest to those asked for."""
    kind = describe_file_layout(text)
    wanted = ", ".join(names)
    looked = f" or of the {len(companions)} module(s) it imports" if companions else ""
    subject = f"near: {wanted} is no flag" if len(names) == 1 else f"near: none of {wanted} is a flag"
    why = "; ".join(m for m in misses if "no class field" not in m)
    why = f" ({why})" if why else ""
    close = close_flag_names(names, [text, *companions.values()])
    hint = f"; did you mean: {', '.join(close)}" if close else ""
    if kind is None:
        return (
            f"cannot tell how {path} declares flags: {subject} in it{looked}{why}; looked for "
            f"a dataclass field with a parser.add_argument call (SGLang ≤ 0.5.13, vLLM), an A[type, help] "
            f"field (SGLang 0.5.14–0.5.19), and A[...] fields in the modules it imports (SGLang ≥ 0.5.20){hint}"
        )
    return f"{subject} of {path}{looked}{why}; it uses {LAYOUT_NAMES[kind]}{hint}"


_ANNOTATED_ROW = re.compile(r"^[ \t]+([A-Za-z_]\w*)[ \t]*:[ \t]*(?:A|Annotated)\[", re.MULTILINE)
_FLAG_STRING = re.compile(r"[\"']--([A-Za-z][\w-]*)[\"']")


def close_flag_names(names: Sequence[str], texts: Sequence[str], limit: int = 3) -> list[str]:
    """The flags of ``texts`` (``"--x"`` strings, ``A[...]`` fields) closest to ``names`` (difflib),
    best first; never one of ``names`` (those were looked for and are no flag)."""
    known: set[str] = set()
    for text in texts:
        known.update(_ANNOTATED_ROW.findall(text))
        known.update(field_name(flag) for flag in _FLAG_STRING.findall(text))
    known -= set(names)
    scored: dict[str, float] = {}
    for name in names:
        for match in difflib.get_close_matches(name, sorted(known), n=limit, cutoff=0.6):
            ratio = difflib.SequenceMatcher(None, name, match).ratio()
            scored[match] = max(scored.get(match, 0.0), ratio)
    return sorted(scored, key=lambda m: -scored[m])[:limit]


def _layout_at(src: PySource, info: StmtInfo, near: str) -> Layout:
    path = src.path
    node = info.node
    assert isinstance(node, ast.AnnAssign)
    cls = _class_of(info)
    optional = _optional_style(src, info)
    alias = _annotated_alias(node.annotation)
    if alias is not None:
        style = Style(optional=optional, **_annotated_style(src, info, alias))  # type: ignore[arg-type]
        return Layout(
            ANNOTATED, cls, near, (Declaration("annotated_field", path, "field", f"{cls}.{near}"),), style
        )
    found = _neighbour_call(src, near)
    if found is None:
        raise _Miss(
            f"{near}: {cls}.{near} (line {info.start}) is a plain field and no add_argument call "
            f"declares {flag_name(near)}: not a flag"
        )
    call_info, call = found
    style = Style(optional=optional, **_call_style(src, call))  # type: ignore[arg-type]
    kind = VLLM if cls == "EngineArgs" else CLASSIC
    declarations = (
        Declaration("field", path, "field", f"{cls}.{near}"),
        Declaration("argument", path, "call", style.func, flag_name(near)),
    )
    return Layout(kind, cls, near, declarations, style)


# --------------------------------------------------------------------------- a quick look, for messages


def describe_file_layout(text: str) -> str | None:
    """Which layout a whole file seems to use, from its text (for "did you mean" messages)."""
    if "add_cli_args_from_dataclass" in text:
        if re.search(r"^\s+\w+: A\[", text, re.MULTILINE) and "arg_groups.fields" not in text:
            return ANNOTATED
        if "arg_groups.fields" in text:
            return SPEC
        return ANNOTATED
    if "class EngineArgs" in text and ".add_argument(" in text:
        return VLLM
    if "add_argument(" in text and "dataclass" in text:
        return CLASSIC
    return None
