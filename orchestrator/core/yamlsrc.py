"""YAML that remembers where each key and item sits in the file.

Every config error orch reports names ``file:line: key.path``. PyYAML's
``safe_load`` throws the marks away, so we compose the node tree ourselves,
record the line of every mapping key and sequence item by its path, refuse
duplicate keys (``safe_load`` silently keeps the last one, which hides typos
like two ``after:`` in one edit), and then construct plain Python values with
SafeLoader semantics. Pure: text in, values out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from orchestrator.errors import ConfigError

Loc = tuple[str | int, ...]

_MERGE_TAG = "tag:yaml.org,2002:merge"


def key_path(loc: Sequence[str | int]) -> str:
    """Render a location as users write it: ``files[0].edits[1].after``."""
    out = ""
    for part in loc:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


@dataclass(frozen=True)
class SourceDoc:
    """A parsed YAML document plus the line of each key and item.

    ``lines`` maps a path to the 1-based line of that mapping key (or of the
    first line of that sequence item); ``content_lines`` maps the path of a
    scalar value to the line its text starts on (the line after ``|`` for a
    block scalar), so an error inside an inline template can point at the
    right line of the playbook.
    """

    filename: str
    data: Any
    lines: dict[Loc, int] = field(default_factory=dict)
    content_lines: dict[Loc, int] = field(default_factory=dict)

    def line_of(self, loc: Sequence[str | int]) -> int | None:
        """Line of ``loc``, or of its nearest parent that has one."""
        path = tuple(loc)
        while True:
            if path in self.lines:
                return self.lines[path]
            if not path:
                return None
            path = path[:-1]

    def content_line_of(self, loc: Sequence[str | int]) -> int | None:
        """Line where the scalar text at ``loc`` starts (falls back to ``line_of``)."""
        return self.content_lines.get(tuple(loc)) or self.line_of(loc)


def load_yaml(text: str, filename: str) -> SourceDoc:
    """Parse ``text``; raise ``ConfigError`` naming the file and line on any problem."""
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
            if node is None:
                return SourceDoc(filename, None, {(): 1})
            lines: dict[Loc, int] = {}
            content: dict[Loc, int] = {}
            _walk(loader, node, (), lines, content, filename)
            data = loader.construct_document(node)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            problem = exc.problem or exc.context or "unreadable"
            raise ConfigError(
                f"malformed YAML: {problem}",
                file=filename,
                line=mark.line + 1 if mark else None,
            ) from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"malformed YAML: {_one_line(str(exc))}", file=filename) from None
    finally:
        loader.dispose()
    return SourceDoc(filename, data, lines, content)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _walk(
    loader: yaml.SafeLoader,
    node: Node,
    path: Loc,
    lines: dict[Loc, int],
    content: dict[Loc, int],
    filename: str,
) -> None:
    """Record lines under ``node`` and refuse duplicate keys."""
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, ScalarNode):
        start = node.start_mark.line + 1
        content[path] = start + 1 if node.style in ("|", ">") else start
        return
    if isinstance(node, SequenceNode):
        for index, item in enumerate(node.value):
            child = (*path, index)
            lines[child] = item.start_mark.line + 1
            _walk(loader, item, child, lines, content, filename)
        return
    if isinstance(node, MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                continue  # `<<: *base` — merged keys may be overridden on purpose
            key = _key_value(loader, key_node)
            if _hashable(key) and key in seen:
                raise ConfigError(
                    f"duplicate key '{key}'",
                    file=filename,
                    line=key_node.start_mark.line + 1,
                    key=key_path(path) or None,
                )
            if _hashable(key):
                seen.add(key)
            child = (*path, key)
            lines[child] = key_node.start_mark.line + 1
            _walk(loader, value_node, child, lines, content, filename)


def _key_value(loader: yaml.SafeLoader, key_node: Node) -> Any:
    """The Python value of a mapping key (scalars only; others by their text)."""
    if isinstance(key_node, ScalarNode):
        return loader.construct_object(key_node)
    return f"<{key_node.id}>"


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
