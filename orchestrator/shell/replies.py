"""What the controller accepts from a host's helper: every line checked before use.

A host is not trusted to answer well: a broken or hostile ``python3`` on its
PATH, a wrapper that prints to stdout, a corrupt ``journal.json`` or
manifest read back from its disk. Whatever comes back must be one host's
error — one line naming the host and what was wrong — never a traceback
that loses the report of every host of a fleet. So, at the boundary:

- ``decode``: a line is JSON nested at most ``MAX_REPLY_DEPTH`` deep. The
  depth is checked *before* ``json.loads`` (whose C decoder recurses once per
  level), by a scan that skips strings; the scan only runs on lines with
  that many brackets at all, so the big lines (files as base64) cost one
  ``bytes.count``.
- ``Envelope.check``: the protocol's envelope (``id``, ``done``, ``ok``,
  ``result`` / ``error``, ``event``) with its types.
- ``check``: an op's ``result`` against the shape the controller reads of
  it (``shell.ops`` gives each op its shape): the keys it reads, their types.

Every refusal is a ``Malformed`` saying where in the answer and what was
found (short: a hostile answer is not echoed whole).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_REPLY_DEPTH = 200
"""JSON nesting a reply may have: a manifest with a playbook's vars (YAML at most 64 deep,
``core.yamlsrc.MAX_DEPTH``) inside a few levels of records, with room to spare; far below
the recursion the decoder would hit."""

_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
"""A JSON string (skipped whole: brackets inside it do not nest) or one bracket."""

PREVIEW = 60


class Malformed(ValueError):
    """An answer the controller cannot use; the message says where and what."""


def preview(data: bytes | str) -> str:
    """The start of a hostile line, printable and short."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    text = " ".join(text.split())
    return repr(text[:PREVIEW] + ("…" if len(text) > PREVIEW else ""))


def too_deep(line: bytes, limit: int = MAX_REPLY_DEPTH) -> bool:
    """``line`` opens more than ``limit`` brackets at once (strings skipped)."""
    if line.count(b"[") + line.count(b"{") <= limit:
        return False
    depth = 0
    for match in _TOKENS.finditer(line):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        elif token in (b"]", b"}"):
            depth -= 1
    return False


def decode(line: bytes) -> Any:
    """One line as JSON, its depth bounded before parsing; ``Malformed`` otherwise."""
    if too_deep(line):
        raise Malformed(f"JSON nested more than {MAX_REPLY_DEPTH} levels deep")
    try:
        return json.loads(line)
    except RecursionError:  # unreachable after ``too_deep``; kept as the last guard
        raise Malformed(f"JSON nested more than {MAX_REPLY_DEPTH} levels deep") from None
    except ValueError:
        raise Malformed(f"not JSON: {preview(line)}") from None


# ------------------------------------------------------------------ shapes

class Opt:
    """A value that may be missing or ``null``."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape


class ListOf:
    """A list whose every item has ``shape``."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape


class DictOf:
    """An object whose every value has ``shape`` (keys are strings in JSON)."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape


class Number:
    """An int or a float (JSON does not tell them apart), never a bool."""


ANY = object()
"""Any JSON value: the controller passes it on without reading into it."""

Shape = Any
"""A Python type (``str``, ``int``, ``bool``, ``dict``, ``list``), ``Number``, ``ANY``,
``Opt``/``ListOf``/``DictOf`` of a shape, a mapping of the keys read to their shapes
(other keys allowed), or a tuple of shapes (any one of them)."""


def _name(shape: Any) -> str:
    if shape is ANY:
        return "any value"
    if shape is Number:
        return "a number"
    if isinstance(shape, Opt):
        return f"{_name(shape.shape)} or null"
    if isinstance(shape, ListOf):
        return "a list"
    if isinstance(shape, DictOf | Mapping) or shape is dict:
        return "an object"
    if isinstance(shape, tuple):
        return " or ".join(_name(s) for s in shape)
    return {str: "a string", int: "an integer", bool: "true or false", list: "a list",
            float: "a number"}.get(shape, getattr(shape, "__name__", str(shape)))


def _found(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return f"the string {preview(value)}"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _fits(value: Any, shape: Any) -> bool:
    """Whether ``value`` has ``shape`` at this level (children are checked by ``check``)."""
    if shape is ANY:
        return True
    if isinstance(shape, Opt):
        return value is None or _fits(value, shape.shape)
    if isinstance(shape, tuple):
        return any(_fits(value, s) for s in shape)
    if shape is Number:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(shape, ListOf) or shape is list:
        return isinstance(value, list)
    if isinstance(shape, DictOf | Mapping) or shape is dict:
        return isinstance(value, dict)
    if shape is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, shape)


def check(value: Any, shape: Any, where: str = "result") -> None:
    """Raise ``Malformed`` naming the first place where ``value`` lacks ``shape``."""
    if not _fits(value, shape):
        raise Malformed(f"{where} is {_found(value)}, expected {_name(shape)}")
    if value is None:
        return
    if isinstance(shape, Opt):
        check(value, shape.shape, where)
    elif isinstance(shape, tuple):
        check(value, next(s for s in shape if _fits(value, s)), where)
    elif isinstance(shape, ListOf):
        for i, item in enumerate(value):
            check(item, shape.shape, f"{where}[{i}]")
    elif isinstance(shape, DictOf):
        for key, item in value.items():
            check(item, shape.shape, f"{where}.{key}")
    elif isinstance(shape, Mapping):
        for key, sub in shape.items():
            if key not in value:
                if isinstance(sub, Opt) or sub is ANY:
                    continue
                raise Malformed(f"{where} has no {key!r}")
            check(value[key], sub, f"{where}.{key}")


# ------------------------------------------------------------------ the envelope

ERROR = {"type": str, "message": str, "details": Opt(dict)}
"""A failed op's ``error``: what ``RemoteStepError`` is made of."""


@dataclass(frozen=True)
class Envelope:
    """One line from the helper, checked: an event of a request, or its end."""

    id: int | None
    done: bool
    ok: bool = False
    result: Any = None
    error: dict[str, Any] | None = None
    event: str | None = None
    raw: dict[str, Any] | None = None

    @classmethod
    def check(cls, msg: Any) -> Envelope:
        """``Malformed`` unless ``msg`` is a well-formed event or end of a request."""
        check(msg, {"id": Opt(int), "done": Opt(bool)}, "the answer")
        if not msg.get("done"):
            check(msg, {"event": str}, "the event")
            return cls(msg.get("id"), False, event=msg["event"], raw=msg)
        check(msg, {"ok": bool}, "the answer")
        if msg["ok"]:
            if "result" not in msg:
                raise Malformed("the answer has no 'result'")
            return cls(msg.get("id"), True, True, result=msg["result"], raw=msg)
        check(msg, {"error": ERROR}, "the answer")
        return cls(msg.get("id"), True, False, error=msg["error"], raw=msg)
