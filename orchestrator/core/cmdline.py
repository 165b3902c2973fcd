"""Command lines as lists of words, never as strings to be pasted together.

A command in a playbook is split into words like a shell would (shlex)
*before* any variable is rendered, and each word is rendered on its own: a
variable's value becomes exactly one argv element whatever it contains, so a
value can never add words or shell syntax (``a; rm -rf /`` stays one word).
Flags are edited on the word list the same way: ``--f v`` replaces any
``--f x`` or ``--f=x`` in place.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

from orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from orchestrator.core.templating import Renderer

FlagValue = Union[str, int, float, bool, list[Union[str, int, float]], None]  # noqa: UP007
"""What a ``server.flags`` entry may map to (see ``apply_flags``)."""

_SPAN = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", re.DOTALL)
_MARK = "\x00"
_SHORT_OPTION = re.compile(r"-[A-Za-z]")


def split_words(command: str) -> list[str]:
    """Split ``command`` like a POSIX shell, keeping Jinja spans inside one word.

    ``{{ x | default("a b") }}`` contains spaces and quotes that shlex would
    otherwise cut or eat; each span is swapped for a placeholder, the text
    split, and the spans put back. ``ConfigError`` (without a location; the
    caller adds it) on unbalanced quotes.
    """
    if _MARK in command:
        raise ConfigError("command contains a NUL character")
    spans: list[str] = []

    def protect(match: re.Match[str]) -> str:
        spans.append(match.group(0))
        return f"{_MARK}{len(spans) - 1}{_MARK}"

    protected = _SPAN.sub(protect, command)
    try:
        words = shlex.split(protected, comments=False, posix=True)
    except ValueError as exc:
        raise ConfigError(f"cannot split command into words: {exc}") from None
    restore = re.compile(re.escape(_MARK) + r"(\d+)" + re.escape(_MARK))
    return [restore.sub(lambda m: spans[int(m.group(1))], word) for word in words]


def render_words(
    command: str,
    vars: Mapping[str, Any],
    renderer: Renderer,
    *,
    file: str | None = None,
    line: int | None = None,
    key: str | None = None,
) -> list[str]:
    """Split ``command`` into words, then render each word into exactly one argv element."""
    try:
        words = split_words(command)
    except ConfigError as exc:
        raise exc.located(file=file, line=line, key=key) from None
    if not words:
        raise ConfigError("command is empty", file=file, line=line, key=key)
    return [renderer.render_string(word, vars, file=file, line=line, key=key) for word in words]


def quote_argv(argv: Sequence[str]) -> str:
    """One string a POSIX shell splits back into exactly ``argv``."""
    return shlex.join(argv)


def is_option(word: str) -> bool:
    """True for ``--long``, ``--`` and ``-x`` words; ``-1`` and ``-0.5`` are values."""
    return word.startswith("--") or bool(_SHORT_OPTION.match(word))


def _flag_words(name: str, value: FlagValue) -> list[str]:
    if value is None or value is False:
        return []
    if value is True:
        return [name]
    if isinstance(value, list | tuple):
        return [name, *(_scalar(v) for v in value)]
    text = _scalar(value)
    if is_option(text):  # `--f -x` would read as two options; `--f=-x` cannot
        return [f"{name}={text}"]
    return [name, text]


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass
class _Item:
    """One option with the words that are its values, or one positional word."""

    words: list[str]
    name: str | None  # None: a positional word


def _items(argv: Sequence[str]) -> list[_Item]:
    """``argv[1:]`` cut into options (each with its values) and positional words."""
    items: list[_Item] = []
    index = 1
    while index < len(argv):
        word = argv[index]
        if word == "--":
            items.append(_Item(list(argv[index:]), "--"))  # the rest is positional
            break
        if not is_option(word):
            items.append(_Item([word], None))
            index += 1
        elif word.startswith("--") and "=" in word:
            items.append(_Item([word], word.partition("=")[0]))
            index += 1
        else:
            end = index + 1
            while end < len(argv) and not is_option(argv[end]):
                end += 1
            items.append(_Item(list(argv[index:end]), word))
            index = end
    return items


def _takes_followers(item: _Item) -> bool:
    """Would positional words right after ``item`` read as its values?"""
    return item.name not in (None, "--") and "=" not in item.words[0]


def apply_flags(argv: Sequence[str], flags: Mapping[str, FlagValue]) -> list[str]:
    """Return ``argv`` with each flag set as ``flags`` says.

    ``"--f": v`` gives ``--f v``, replacing every ``--f x…`` or ``--f=x``
    (the first occurrence keeps its position, later ones are dropped);
    ``True`` a bare ``--f``; ``False``/``None`` remove it; a list gives
    ``--f a b c``. A flag not yet present is appended. An existing flag's
    values are the words after it up to the next option word, so negative
    numbers count as values. ``argv[0]`` (the program) is never touched, nor
    anything after ``--``. When a positional word would follow a set flag in
    place (``--f=x model``), the flag goes to the end instead, so that word
    never turns into its value.
    """
    if not argv:
        return []
    layout: list[_Item] = []
    placed: set[str] = set()
    for item in _items(argv):
        name = item.name
        if name is not None and name in flags and name != "--":
            if name not in placed:
                placed.add(name)
                layout.append(_Item(_flag_words(name, flags[name]), name))
            continue
        layout.append(item)
    tail = [_Item(_flag_words(n, v), n) for n, v in flags.items() if n not in placed]
    layout = [item for item in layout if item.words]
    ends_with_rest = bool(layout) and layout[-1].name == "--"
    rest = [layout.pop()] if ends_with_rest else []
    moved: list[_Item] = []
    position = 0
    while position < len(layout):  # a set flag right before a positional word moves to the end
        item = layout[position]
        follower = layout[position + 1] if position + 1 < len(layout) else None
        if (
            item.name in flags
            and follower is not None
            and follower.name is None
            and _takes_followers(item)
        ):
            moved.append(layout.pop(position))
            position = max(position - 1, 0)
            continue
        position += 1
    final = layout + moved + [item for item in tail if item.words] + rest
    return [argv[0], *(word for item in final for word in item.words)]


def parse_flags(argv: Sequence[str]) -> dict[str, list[str]]:
    """Map each option of ``argv[1:]`` to its values (first occurrence wins; stops at ``--``)."""
    found: dict[str, list[str]] = {}
    for item in _items(argv):
        if item.name is None or item.name == "--":
            continue
        if "=" in item.words[0] and item.words[0].startswith("--"):
            found.setdefault(item.name, [item.words[0].partition("=")[2]])
        else:
            found.setdefault(item.name, item.words[1:])
    return found


def _describe(values: list[str] | None) -> str:
    if values is None:
        return "(absent)"
    if not values:
        return "(on)"
    return " ".join(values)


def flag_changes(before: Sequence[str], after: Sequence[str]) -> list[str]:
    """Human summary of what changed between two command lines, for the history.

    e.g. ``--speculative-disable-batch-threshold: (absent) -> 32``. A change
    of the program or positional words is one ``command: … -> …`` line.
    With no ``before`` (no server was running) there is nothing to compare:
    the caller says the server is being started, with its command line.
    """
    if not before:  # nothing ran to compare with: the whole new argv is not a "change" of flags
        return []
    old, new = parse_flags(before), parse_flags(after)
    lines: list[str] = []
    old_head = list(before[:1]) + [w for w in _positionals(before)]
    new_head = list(after[:1]) + [w for w in _positionals(after)]
    if old_head != new_head:
        lines.append(f"command: {quote_argv(old_head)} -> {quote_argv(new_head)}")
    for name in [*new, *(n for n in old if n not in new)]:
        if old.get(name) != new.get(name):
            lines.append(f"{name}: {_describe(old.get(name))} -> {_describe(new.get(name))}")
    return lines


def _value(values: list[str] | None) -> str | bool | None:
    """A flag's value as a field: None absent, True a switch given without a value, else its words."""
    if values is None:
        return None
    if not values:
        return True
    return " ".join(values)


def flag_change_fields(before: Sequence[str], after: Sequence[str]) -> list[dict[str, str | bool | None]]:
    """``flag_changes`` as fields, for ``--json``: ``{"flag", "from", "to"}`` per change, in the
    order of ``flag_changes``' lines.

    ``from``/``to``: None where the flag is absent on that side, True for a switch given
    without a value, else the value's words joined by a space. A change of the program or
    positional words is ``{"flag": "command", …}`` with the whole words. Nothing to compare
    without a ``before`` (no server ran), as for ``flag_changes``.
    """
    if not before:
        return []
    old, new = parse_flags(before), parse_flags(after)
    fields: list[dict[str, str | bool | None]] = []
    old_head = list(before[:1]) + [w for w in _positionals(before)]
    new_head = list(after[:1]) + [w for w in _positionals(after)]
    if old_head != new_head:
        fields.append({"flag": "command", "from": quote_argv(old_head), "to": quote_argv(new_head)})
    for name in [*new, *(n for n in old if n not in new)]:
        if old.get(name) != new.get(name):
            fields.append({"flag": name, "from": _value(old.get(name)), "to": _value(new.get(name))})
    return fields


def flag_change_from_line(line: str) -> dict[str, str | bool | None]:
    """One recorded ``flag_changes`` line (``--tp: 8 -> 4``) read back as ``flag_change_fields``'
    object: the releases on a host keep the lines, written by this and earlier versions."""
    name, _, change = line.partition(": ")
    old, _, new = change.partition(" -> ")
    words: dict[str, str | bool | None] = {"(absent)": None, "(on)": True}
    return {"flag": name, "from": words.get(old, old), "to": words.get(new, new)}


def _positionals(argv: Sequence[str]) -> list[str]:
    """Words of ``argv[1:]`` before the first option (e.g. a subcommand)."""
    words: list[str] = []
    for word in argv[1:]:
        if is_option(word):
            break
        words.append(word)
    return words
