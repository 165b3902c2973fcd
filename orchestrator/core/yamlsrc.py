"""YAML that remembers where each key and item sits in the file.

Every config error orch reports names ``file:line: key.path``. PyYAML's
``safe_load`` throws the marks away, so we compose the node tree ourselves,
record the line of every mapping key and sequence item by its path, refuse
duplicate keys (``safe_load`` silently keeps the last one, which hides typos
like two ``after:`` in one edit), and then construct plain Python values with
SafeLoader semantics. Pure: text in, values out.

Anchors and aliases are budgeted while the document is composed, from the
parser's events, before anything walks or constructs it: a composed node
tree shares each anchored node, but every later pass (the line walk, the
constructor, the schema) visits an alias as a full copy, so a few hundred
bytes of nested aliases (an "alias bomb") would otherwise cost minutes and
gigabytes. A document is refused once its aliases would add more than
``MAX_ALIAS_NODES`` nodes, or number more than ``MAX_ALIASES``.

Nesting is budgeted the same way: PyYAML's composer (and every later pass)
recurses once per level, so ``[[[[…]]]]`` 100,000 deep ends in a
``RecursionError`` traceback instead of a config error. A collection
opened deeper than ``MAX_DEPTH`` is refused at its line while composing,
before the recursion gets anywhere near Python's limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.events import AliasEvent, CollectionStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from orchestrator.errors import ConfigError

Loc = tuple[str | int, ...]

_MERGE_TAG = "tag:yaml.org,2002:merge"

MAX_ALIASES = 100
"""More ``*alias`` uses than any hand-written config needs."""

MAX_ALIAS_NODES = 10_000
"""Nodes the aliases of one document may add once expanded (a playbook has a few hundred)."""

MAX_DEPTH = 64
"""Nested mappings/sequences one document may open (a playbook needs under ten; the
composer, the line walk, the constructor and the schema each recurse once per level)."""


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


class _AliasBudget(yaml.SafeLoader):
    """A SafeLoader whose composer counts what each alias would expand to.

    Every composed node gets its expanded size (itself plus its children,
    an alias counting as the full size of its anchored node); an alias adds
    that size to the document's budget. Counting is linear in the text: no
    node is ever copied or revisited.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.aliases = 0
        self.alias_nodes = 0
        self.depth = 0
        self._sizes: dict[int, int] = {}

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if self.check_event(CollectionStartEvent):
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH:
                    line = self.peek_event().start_mark.line + 1
                    raise _BudgetError(f"YAML nested more than {MAX_DEPTH} levels deep", line)
                return self._compose_sized(parent, index)
            finally:
                self.depth -= 1
        return self._compose_sized(parent, index)

    def _compose_sized(self, parent: Node | None, index: Any) -> Node:
        if self.check_event(AliasEvent):
            event = self.peek_event()
            anchored = self.anchors.get(event.anchor)
            if anchored is not None:  # an undefined alias: PyYAML's own error follows
                self._spend(event, anchored)
            return self._composed(parent, index)
        node = self._composed(parent, index)
        self._sizes[id(node)] = 1 + sum(self._sizes[id(child)] for child in _children(node))
        return node

    def _composed(self, parent: Node | None, index: Any) -> Node:
        node = super().compose_node(parent, index)
        assert node is not None  # PyYAML's stubs allow None; within a document it composes a node
        return node

    def _spend(self, event: AliasEvent, anchored: Node) -> None:
        line = event.start_mark.line + 1 if event.start_mark is not None else 0
        size = self._sizes.get(id(anchored))
        if size is None:  # the anchored node is still open: it would contain itself
            raise _BudgetError(f"alias *{event.anchor} refers to a node that contains it", line)
        self.aliases += 1
        self.alias_nodes += size
        if self.aliases > MAX_ALIASES:
            raise _BudgetError(
                f"more than {MAX_ALIASES} YAML aliases; write the values out", line
            )
        if self.alias_nodes > MAX_ALIAS_NODES:
            raise _BudgetError(
                f"YAML aliases expand to more than {MAX_ALIAS_NODES} nodes by *{event.anchor} "
                "(an alias bomb?); write the values out or use fewer, smaller aliases",
                line,
            )


class _BudgetError(Exception):
    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def load_yaml(text: str, filename: str) -> SourceDoc:
    """Parse ``text``; raise ``ConfigError`` naming the file and line on any problem."""
    loader = _AliasBudget(text)
    try:
        try:
            node = loader.get_single_node()
            if node is None:
                return SourceDoc(filename, None, {(): 1})
            lines: dict[Loc, int] = {}
            content: dict[Loc, int] = {}
            _walk(loader, node, (), lines, content, filename)
            data = loader.construct_document(node)
        except _BudgetError as exc:
            raise ConfigError(exc.message, file=filename, line=exc.line) from None
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


def load_value(text: str, key: str) -> Any:
    """A short YAML text (a ``--var`` value) under the same budgets as a file.

    A budget crossed is a ``ConfigError`` naming ``key``; malformed YAML
    raises PyYAML's ``YAMLError`` as ``yaml.safe_load`` would.
    """
    loader = _AliasBudget(text)
    try:
        return loader.get_single_data()
    except _BudgetError as exc:
        raise ConfigError(exc.message, key=key) from None
    finally:
        loader.dispose()


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
    return f"<{getattr(key_node, 'id', 'node')}>"  # each kind of node has its id ("mapping", …)


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
