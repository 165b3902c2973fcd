"""Frozen value classes for what the helper reads and sends, without ``dataclasses``.

``@value(frozen=True)`` is ``dataclasses.dataclass(frozen=True)`` as the type
checker sees it (``field``, ``replace`` and ``fields`` likewise), so a wrong
field name or type fails in mypy, not on a host. At run time it is a small
class decorator: the fields are the class's annotations (its bases' first,
``ClassVar`` ones excepted), ``__init__`` takes them by position or keyword,
``==``, ``hash`` and ``repr`` compare and show them, and assignment is refused.

Why not the real thing: a helper that arms a release imports the records
(``records.py``), and ``dataclasses`` brings ``inspect`` with it (``ast``,
``dis``, ``tokenize``) and compiles six methods per class: the helper's import
with every op's module (what it loaded to arm, then) took 81 ms of CPU with them and take 58 without (median of 30
starts, alternately, on a 2-core box).

Standard library only, Python 3.8 syntax: this module is shipped to the host.
"""

from __future__ import annotations

TYPE_CHECKING = False  # what ``typing.TYPE_CHECKING`` says, without importing typing on the host
if TYPE_CHECKING:
    from dataclasses import dataclass as value
    from dataclasses import field as field
    from dataclasses import fields as fields
    from dataclasses import replace as replace
    from typing import Any


MISSING = object()
"""A field's default when it has none: the argument is required."""


class Field:
    """One field of a value class: its name and its default (``MISSING``: required)."""

    __slots__ = ("name", "default")

    def __init__(self, name: str, default: Any) -> None:
        self.name = name
        self.default = default

    @property
    def required(self) -> bool:
        return self.default is MISSING


def fields_of(kind: Any) -> tuple[Field, ...]:
    """The fields of a value class (or of one of its values), in order; ``()`` for another class."""
    return getattr(kind, "__fields__", ())  # type: ignore[no-any-return]


# ---------------------------------------------------------------- reading a record's fields


def _dict(data: Any) -> dict[str, Any]:
    return data if isinstance(data, dict) else {}


def _opt_float(value: Any) -> float | None:
    try:
        return float(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# ---------------------------------------------------------------- the value classes at run time


if not TYPE_CHECKING:
    class _Factory:
        """A default made afresh for each value (``field(default_factory=list)``)."""

        __slots__ = ("make",)

        def __init__(self, make):
            self.make = make

    def field(*, default_factory):
        return _Factory(default_factory)

    def fields(kind):
        return fields_of(kind)

    def replace(obj, **changes):
        """A copy of ``obj`` with ``changes``, as ``dataclasses.replace``."""
        values = {f.name: getattr(obj, f.name) for f in fields_of(obj)}
        for key in changes:
            if key not in values:
                raise TypeError("%s has no field %r" % (type(obj).__name__, key))
        values.update(changes)
        return type(obj)(**values)

    def value(frozen=True):
        """The class decorator (``frozen`` is always so: these values are never changed)."""
        return _value

    def _value(cls):
        own = cls.__dict__.get("__annotations__", {})
        inherited = []
        for base in reversed(cls.__mro__[1:]):
            for f in base.__dict__.get("__fields__", ()):
                inherited = [g for g in inherited if g.name != f.name] + [f]
        mine = [Field(name, cls.__dict__.get(name, MISSING)) for name, hint in own.items()
                if not str(hint).startswith(("ClassVar", "typing.ClassVar"))]
        names = set(f.name for f in mine)
        cls.__fields__ = tuple([f for f in inherited if f.name not in names] + mine)
        cls.__field_names__ = frozenset(f.name for f in cls.__fields__)  # a keyword's check, in one step
        for name, method in _METHODS.items():
            setattr(cls, name, method)
        return cls

    def _init(self, *args, **kwargs):
        fields = self.__fields__
        name = type(self).__name__
        if len(args) > len(fields):
            raise TypeError("%s() takes %d arguments, %d given" % (name, len(fields), len(args)))
        values = dict((f.name, a) for f, a in zip(fields, args))
        for key, given in kwargs.items():
            if key in values or key not in self.__field_names__:
                raise TypeError("%s() got an unexpected or repeated argument %r" % (name, key))
            values[key] = given
        for f in fields:
            if f.name not in values:
                if f.default is MISSING:
                    raise TypeError("%s() missing required argument %r" % (name, f.name))
                values[f.name] = f.default.make() if isinstance(f.default, _Factory) else f.default
        for key, given in values.items():
            object.__setattr__(self, key, given)

    def _frozen(self, key, *given):
        raise AttributeError("%s is frozen: cannot assign %r" % (type(self).__name__, key))

    def _as_tuple(self):
        return tuple(getattr(self, f.name) for f in self.__fields__)

    def _eq(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return _as_tuple(self) == _as_tuple(other)

    def _hash(self):
        return hash((type(self),) + _as_tuple(self))

    def _repr(self):
        return "%s(%s)" % (type(self).__name__,
                           ", ".join("%s=%r" % (f.name, getattr(self, f.name)) for f in self.__fields__))

    _METHODS = {"__init__": _init, "__setattr__": _frozen, "__delattr__": _frozen, "__eq__": _eq,
                "__hash__": _hash, "__repr__": _repr}
