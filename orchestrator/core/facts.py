"""Host facts: what is installed where, as playbooks see it (``facts.packages.sglang.version``).

One playbook serves many releases: ``when: "facts.packages.sglang.version >= '0.5.20'"``
picks edits by the version the host runs, and ``sglang_root`` defaults to
the installed package's directory. The facts are gathered on the host by
the server's own interpreter, in the same round trip as the file reads
(``host.facts``'s ``read_host``); versions compare as versions
(``packaging.version``), never as strings: ``"0.5.9" < "0.5.14"``.

File paths are needed *before* that round trip, and may depend on a fact
(``sglang_root``). They are rendered with ``deferred_facts()``, whose values
render as markers the helper replaces once it knows the facts; everything
else renders after the round trip with the real ``Facts``. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from packaging.version import InvalidVersion, Version

DEFAULT_PACKAGES = ("sglang", "vllm")
"""Always looked up: the servers orch knows."""

ROOT_VARS = {"sglang_root": "sglang", "vllm_root": "vllm"}
"""Variables that default to an installed package's directory."""

MARKER = "\x00orch-fact:{}\x00"
"""How a deferred fact renders in a path; the helper on the host replaces it."""


class VersionString(str):
    """A version as text that compares as a version (``packaging.version``) with strings or others."""

    def _key(self, other: object) -> tuple[Version, Version] | None:
        try:
            return Version(str(self)), Version(str(other))
        except InvalidVersion:
            return None

    def _cmp(self, other: object, op: str) -> bool:
        if not isinstance(other, str):
            return NotImplemented  # type: ignore[return-value]
        pair = self._key(other)
        if pair is None:
            raise ValueError(f"cannot compare versions {str(self)!r} and {str(other)!r}")
        a, b = pair
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b}[op]

    def __lt__(self, other: object) -> bool:
        return self._cmp(other, "<")

    def __le__(self, other: object) -> bool:
        return self._cmp(other, "<=")

    def __gt__(self, other: object) -> bool:
        return self._cmp(other, ">")

    def __ge__(self, other: object) -> bool:
        return self._cmp(other, ">=")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str) and self._key(other) is not None:
            return self._cmp(other, "==")
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__


class FactError(ValueError):
    """A test needs a fact the host does not have; the message is the whole refusal."""


class NoVersion:
    """``facts.packages.X.version`` of a package without version metadata (a source tree on
    ``PYTHONPATH``). A version test on it is an error, never a silent false: a ``when:`` that
    skipped a file because the version was unknown would deploy a half-applied patch.
    ``is none`` (and ``== none``) tell it apart, so a playbook can guard on it."""

    def __init__(self, package: str) -> None:
        self.package = package

    def refuse(self, *_: Any) -> bool:
        raise FactError(f"facts.packages.{self.package} has no version (no installed metadata: a source tree on PYTHONPATH?)")

    __lt__ = __le__ = __gt__ = __ge__ = refuse

    def __eq__(self, other: object) -> bool:
        if other is None or isinstance(other, NoVersion):
            return True
        return self.refuse()

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return ""

    def __repr__(self) -> str:
        return "none"

    __hash__ = object.__hash__


class Unknown:
    """A value ``orch lint`` cannot know without a host: ``facts``, ``sglang_root`` when no var
    sets it, a var an absent inventory would give. Any attribute, item, operation or
    comparison of it is unknown too; as a condition it is true, so what it guards is still
    checked; it renders as ``<name>``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, name: str) -> Unknown:
        if name.startswith("_"):
            raise AttributeError(name)
        return Unknown(f"{self.name}.{name}")

    def __getitem__(self, key: Any) -> Unknown:
        return Unknown(f"{self.name}[{key!r}]")

    def __call__(self, *_: Any, **__: Any) -> Unknown:
        return self

    def _same(self, *_: Any) -> Unknown:
        return self

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __mod__ = _same

    def _true(self, *_: Any) -> bool:
        return True

    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = __contains__ = __bool__ = _true  # type: ignore[assignment]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(())

    def __str__(self) -> str:
        return f"<{self.name}>"

    __repr__ = __str__
    __hash__ = object.__hash__


def is_none(value: Any) -> bool:
    """The ``none`` Jinja test, true also for a version that is not there (``NoVersion``)."""
    return value is None or isinstance(value, NoVersion)


def version_of(value: Any) -> Any:
    """The ``version()`` Jinja global: text that compares as a version (a missing one still refuses)."""
    return value if isinstance(value, NoVersion | Unknown) else VersionString(str(value))


def version_test(value: Any, other: str, op: str = ">=") -> bool:
    """The ``version`` Jinja test: ``facts.packages.sglang.version is version('0.5.14', '>=')``.

    Agrees with the comparison form: a missing version is an error in both."""
    if isinstance(value, NoVersion):
        return value.refuse()
    if isinstance(value, Unknown):  # orch lint: the guarded part is checked
        return True
    if value is None:
        raise FactError("version test on none (no version to compare)")
    ops = {"<", "<=", ">", ">=", "==", "!=", "lt", "le", "gt", "ge", "eq", "ne"}
    if op not in ops:
        raise ValueError(f"version test: unknown operator {op!r}")
    op = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}.get(op, op)
    return VersionString(str(value))._cmp(other, op)


@dataclass(frozen=True)
class Package:
    """An importable package on the host, for the server's interpreter."""

    name: str
    path: str  # the package directory (``…/site-packages/sglang``)
    version: VersionString | None  # from its installed metadata; None for a source tree on PYTHONPATH

    def as_var(self) -> dict[str, Any]:
        """As templates see it: a missing version is ``NoVersion``, which refuses any version test."""
        return {"name": self.name, "path": self.path, "version": self.version or NoVersion(self.name)}


@dataclass(frozen=True)
class Facts:
    """What the helper found on the host."""

    python: str | None = None  # the interpreter that was asked
    python_version: str | None = None
    packages: dict[str, Package] = field(default_factory=dict)
    error: str | None = None  # the interpreter could not be run: facts are empty, not wrong

    @classmethod
    def from_wire(cls, data: Mapping[str, Any] | None) -> Facts:
        if not data:
            return cls()
        packages = {
            name: Package(
                name,
                str(info["path"]),
                VersionString(info["version"]) if info.get("version") else None,
            )
            for name, info in (data.get("packages") or {}).items()
            if info and info.get("path")
        }
        return cls(data.get("python"), data.get("python_version"), packages, data.get("error"))

    def as_var(self) -> dict[str, Any]:
        """``facts`` as templates see it (absent packages are undefined: ``is defined`` tests it)."""
        return {
            "python": self.python,
            "python_version": VersionString(self.python_version) if self.python_version else None,
            "packages": {name: p.as_var() for name, p in self.packages.items()},
        }

    def root_vars(self) -> dict[str, str]:
        """``sglang_root`` / ``vllm_root`` of the installed packages (defaults, under every var)."""
        return {var: self.packages[pkg].path for var, pkg in ROOT_VARS.items() if pkg in self.packages}


_NAMED = re.compile(r"facts\s*\.\s*packages\s*\.\s*([A-Za-z_][\w]*)|facts\s*\.\s*packages\s*\[\s*['\"]([^'\"]+)['\"]")


def packages_to_gather(text: str, given: Iterable[str]) -> list[str]:
    """The packages whose facts this playbook needs, given the vars already set.

    Facts cost a process on the host (the server's interpreter asked for its
    packages) on every run, a no-op re-run included; a playbook that never
    says ``facts`` and sets its ``sglang_root``/``vllm_root`` itself needs none.
    """
    if "facts" in text:
        return packages_named([text])
    known = set(given)
    return [pkg for var, pkg in ROOT_VARS.items() if var in text and var not in known]


def packages_named(texts: Iterable[str]) -> list[str]:
    """The packages to look up: the known servers and every ``facts.packages.X`` the texts name."""
    names = list(DEFAULT_PACKAGES)
    for text in texts:
        for match in _NAMED.finditer(text):
            name = match.group(1) or match.group(2)
            if name not in names:
                names.append(name)
    return names


# --------------------------------------------------------------------------- before the round trip


class DeferredFact:
    """A fact not known yet: renders as a marker the helper fills in; anything else is refused."""

    def __init__(self, path: str) -> None:
        self._path = path

    def __getattr__(self, name: str) -> DeferredFact:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def __getitem__(self, name: str) -> DeferredFact:
        return DeferredFact(f"{self._path}.{name}" if self._path else name)

    def __str__(self) -> str:
        return MARKER.format(self._path)

    def __bool__(self) -> bool:
        raise ValueError(f"facts.{self._path} is only known once the host is read; a file path may use it as text only")

    def _refuse(self, *_: Any) -> bool:
        raise ValueError(f"facts.{self._path} is only known once the host is read; a file path may use it as text only")

    __lt__ = __le__ = __gt__ = __ge__ = _refuse


def deferred_facts() -> DeferredFact:
    """``facts`` for rendering file paths before the host is read."""
    return DeferredFact("")


def deferred_root_vars(packages: Iterable[str]) -> dict[str, str]:
    """``sglang_root`` & co. as markers (the host's package directory, filled in by the helper)."""
    return {var: MARKER.format(f"packages.{pkg}.path") for var, pkg in ROOT_VARS.items() if pkg in packages}


def has_marker(text: str) -> bool:
    return "\x00orch-fact:" in text
