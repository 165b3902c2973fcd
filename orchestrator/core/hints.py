""""Did you mean": for an anchor that matches nothing, the places it most likely *means*.

A release that moved things breaks anchors in telling ways: the story's
``after: '"--speculative-accept-threshold-acc"'`` matches nothing on SGLang
0.5.14 because that release has no parser call for the flag any more — only
the field of the same name, written ``A[...]``; on 0.5.23 the field is not
even in ``server_args.py``. Similar *text* (difflib) then points at an
unrelated ``aliases=`` line. So candidates are ranked by meaning first: the
field of the anchor's name, the parser call for its flag (in either quote),
an element of that name in a literal, the field in another module of the
package; similar lines only when none of those exist. When the file's
layout is recognisable the hint says which, and what to use instead. Pure.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Callable, Mapping

from orchestrator.core.anchors import (
    call_statements,
    did_you_mean,
    field_statements,
    literal_statements,
    shorten,
)
from orchestrator.core.edit_spec import Anchor
from orchestrator.core.edits import HintSource
from orchestrator.core.layouts import LAYOUT_NAMES, describe_file_layout, flag_name
from orchestrator.core.pyindex import PySource

_IDENT = re.compile(r"^-{0,2}[A-Za-z_][\w-]*$")


def anchor_stem(anchor: Anchor) -> str | None:
    """The name an anchor is about (``speculative_accept_threshold_acc``), if it names one."""
    if anchor.kind == "field":
        text = anchor.pattern.rpartition(".")[2]
    elif anchor.kind in ("call", "item"):
        text = anchor.arg or ""
    elif anchor.regex:
        return None
    else:
        text = anchor.pattern.strip().strip("\"'").rstrip(":=(,").strip().strip("\"'")
    if not _IDENT.match(text):
        return None
    return text.lstrip("-").replace("-", "_")


def _meanings(path: str, src: PySource, stem: str, label: Callable[[int], str]) -> list[str]:
    found: list[str] = []
    for info in field_statements(src, stem):
        owner = info.owner.node.name if info.owner and isinstance(info.owner.node, ast.ClassDef) else "?"
        found.append(
            f"{label(info.start)}: {shorten(src.line(info.start))} "
            f"(the field; after_field: {owner}.{stem})"
        )
    flag = flag_name(stem)
    for info in call_statements(src, "add_argument", flag):
        found.append(
            f"{label(info.start)}: {shorten(src.line(info.start))} "
            f"(the parser call for {flag}; after_call: {flag})"
        )
    for rx_row, line in enumerate(src.raw, 1):
        if f'"{stem}"' not in line and f"'{stem}'" not in line:
            continue
        at_row = src.statement_at(rx_row)
        if at_row is None or not isinstance(at_row.node, ast.Assign | ast.AnnAssign):
            continue
        for stmt, _ in literal_statements(src, _assigned(at_row.node)):
            if stmt is at_row:
                found.append(
                    f"{label(rx_row)}: {shorten(line)} (an element; into: {_assigned(at_row.node)}, "
                    f"after_item: {stem})"
                )
    return found


def _assigned(node: ast.stmt) -> str:
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return ast.unparse(targets[0]) if targets and targets[0] is not None else ""


def anchor_hints(companions: Mapping[str, str]) -> HintSource:
    """The hint builder for one file; ``companions`` are other modules of its package (path -> text)."""

    def hint(
        path: str, text: str, src: PySource | None, anchor: Anchor, label: Callable[[int], str]
    ) -> str:
        stem = anchor_stem(anchor)
        found: list[str] = []
        if stem and src is not None:
            found = _meanings(path, src, stem, label)
            for other, other_text in companions.items():
                other_src = PySource(other, other_text)
                for info in field_statements(other_src, stem):
                    owner = info.owner.node.name if info.owner and isinstance(info.owner.node, ast.ClassDef) else "?"
                    found.append(
                        f"{other} line {info.start}: {shorten(other_src.line(info.start))} "
                        f"(the field {owner}.{stem}, in another module)"
                    )
        if not found and anchor.kind == "text" and not anchor.regex:
            found = [f"{label(r)}: {shorten(t)}" for r, t in did_you_mean(text, anchor.pattern)]
        out = "; did you mean: " + "; ".join(found[:4]) if found else ""
        layout = describe_file_layout(text) if src is not None else None
        if layout is not None and stem:
            out += (
                f"; {os.path.basename(path)} uses {LAYOUT_NAMES[layout]}: use add_flag "
                f"(near: {stem}), or anchor on the field"
            )
        return out

    return hint
