"""The nightly spec, the night's manifest, and what changed between two nights.

A nightly spec says how to rebuild one server from a pin: the source (a git
repository at a full 40-hex commit, or a pip requirements file where every
line is ``name==version --hash=sha256:…``), the commands that install it,
the ordered stack of playbooks whose file edits patch it, and the server,
health checks and probe of the result. Anything not pinned exactly is
refused here, before any host is touched: a branch name or a short commit
id moves, and a night that moved is not a measurement.

The manifest is what a night proves it ran: every input's sha256, the
resolved source, each patched file's sha256 before and after (paths
relative to the build directory), the command line, orch's and the host's
Python versions, and the probe figures. Two nights from one spec have the
same manifest except ``VARYING`` (times, the build's name, the probe).

Pure: text in, models out; the same ``file:line: key: message`` errors as
playbooks (``models._parse``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from orchestrator.core.cmdline import flag_changes
from orchestrator.core.models import (
    Health,
    LocatedProblem,
    Locations,
    Server,
    _Model,
    _parse,
)
from orchestrator.core.probe import ProbeConfig
from orchestrator.errors import ConfigError
from orchestrator.host.records import Manifest

# a night's builds are pruned by the retention both sides run (``host.retention``); re-exported
from orchestrator.host.retention import build_order as build_order
from orchestrator.host.retention import builds_to_prune as builds_to_prune

_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


# ------------------------------------------------------------------ the spec


class GitSource(_Model):
    """A git repository (URL or a path on the host) at one exact commit."""

    repo: str = Field(min_length=1)
    commit: str

    @field_validator("repo")
    @classmethod
    def _not_an_option(cls, value: str) -> str:
        templated = "{{" in value
        if value.startswith("-") or (not templated and any(c.isspace() for c in value)):
            raise ValueError(f"a repository URL or path (got: {value!r})")
        return value

    @field_validator("commit", mode="before")
    @classmethod
    def _full_commit(cls, value: Any) -> Any:
        text = str(value).strip().lower() if isinstance(value, str) else value
        if not isinstance(text, str) or not _COMMIT.fullmatch(text):
            raise ValueError(
                f"a full 40-hex commit id (got: {value!r}); a branch, tag or short id can move, "
                "so a night built from it proves nothing"
            )
        return text


class PipSource(_Model):
    """A fresh venv with ``pip install --require-hashes -r requirements``.

    ``requirements`` is a file on the controller, relative to the spec's
    folder; it travels to the build directory. ``find_links``/``index_url``/
    ``no_index`` say where pip looks, on the host.
    """

    requirements: str = Field(min_length=1)
    python: str = Field("python3", min_length=1)
    find_links: list[str] = Field(default_factory=list)
    index_url: str | None = Field(default=None, min_length=1)
    no_index: bool = False


class Source(_Model):
    git: GitSource | None = None
    pip: PipSource | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Source:
        given = [k for k in ("git", "pip") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"expected exactly one of git, pip (got: {', '.join(given) or 'none'})")
        return self

    @property
    def kind(self) -> Literal["git", "pip"]:
        return "git" if self.git is not None else "pip"


class NightlySpec(_Model):
    """``playbooks/nightly.yaml``: one reproducible night on a host."""

    name: str = Field(min_length=1)
    source: Source
    builds_dir: str = Field(min_length=1)
    install: list[str] = Field(default_factory=list)
    vars: dict[str, Any] = Field(default_factory=dict)
    secrets: list[str] = Field(default_factory=list)
    stack: list[str] = Field(default_factory=list)
    server: Server
    health: Health
    probe: ProbeConfig | None = None
    keep_builds: int = Field(5, ge=2)
    notify: str | None = Field(default=None, min_length=1)

    _locations: Locations | None = PrivateAttr(default=None)

    @property
    def locations(self) -> Locations:
        return self._locations or Locations(file="<nightly spec>", doc=None)

    @field_validator("builds_dir")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not (value.startswith("/") or value.startswith("~") or value.startswith("{{")):
            raise ValueError(f"an absolute path on the host (got: {value!r})")
        return value.rstrip("/") or "/"

    @field_validator("install", "stack")
    @classmethod
    def _no_blank(cls, value: list[str]) -> list[str]:
        for item in value:
            if not item.strip():
                raise ValueError("an entry is empty")
        return value

    @model_validator(mode="after")
    def _server_from_current(self) -> NightlySpec:
        if self.server.manager != "process":
            raise LocatedProblem(
                ("server", "manager"),
                "a nightly switches servers with the process manager (manager: process)",
            )
        if not self.server.command:
            raise LocatedProblem(
                ("server",),
                "command is required: a night starts its server from builds_dir/current, "
                "with the same command line every night",
            )
        return self


def parse_nightly(text: str, filename: str) -> NightlySpec:
    """Parse a nightly spec; one ``ConfigError`` for the first problem, located."""
    return _parse(NightlySpec, text, filename)


# ------------------------------------------------------- pinned requirements

_REQ = re.compile(
    r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[A-Za-z0-9._,\s-]*\])?\s*==\s*"
    r"(?P<version>[A-Za-z0-9][A-Za-z0-9.+!_-]*)\s*(?:;.*)?$"
)
_HASH = re.compile(r"--hash[=\s]sha256:(?P<hex>[0-9a-fA-F]+)$")


@dataclass(frozen=True)
class PinnedRequirement:
    """One ``name==version --hash=sha256:…`` requirement (``line``: where it starts)."""

    name: str
    version: str
    hashes: tuple[str, ...]
    line: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "hashes": list(self.hashes)}


def canonical_name(name: str) -> str:
    """PEP 503: ``Foo.Bar_baz`` and ``foo-bar-baz`` are one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_requirements(text: str, filename: str) -> list[PinnedRequirement]:
    """Every requirement of a hash-locked file, or ``ConfigError`` at the first unpinned one.

    Comments, blank lines and ``\\`` continuations (as ``pip-compile
    --generate-hashes`` writes them) are fine; anything that is not an exact
    ``==`` version with at least one sha256 hash is refused, naming the line.
    """
    out: list[PinnedRequirement] = []
    logical, start = "", 0
    key = "source.pip.requirements"
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not logical:
            start = number
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        entry, logical = logical.strip(), ""
        if not entry:
            continue
        out.append(_requirement(entry, filename, start, key))
    if logical.strip():
        out.append(_requirement(logical.strip(), filename, start, key))
    if not out:
        raise ConfigError("no requirements: a pip source pins at least one package", file=filename, key=key)
    seen: dict[str, int] = {}
    for req in out:
        name = canonical_name(req.name)
        if name in seen:
            raise ConfigError(
                f"{req.name} is pinned twice (also line {seen[name]})", file=filename, line=req.line, key=key
            )
        seen[name] = req.line
    return out


def _requirement(entry: str, filename: str, line: int, key: str) -> PinnedRequirement:
    if entry.startswith("-"):
        raise ConfigError(
            f"only pinned requirements are allowed, not options (got: {entry.split()[0]})",
            file=filename, line=line, key=key,
        )
    head, _, options = entry.partition(" --")
    options = "--" + options if options else ""
    match = _REQ.match(head.strip())
    if match is None or "*" in match.group("version"):
        shown = head.strip()
        raise ConfigError(
            f"not pinned exactly: {shown!r}; write name==version --hash=sha256:…",
            file=filename, line=line, key=key,
        )
    hashes: list[str] = []
    for option in options.replace("--hash ", "--hash=").split():
        found = _HASH.match(option)
        if option.startswith("--hash") and found is None:
            raise ConfigError(f"{match.group('name')}: only sha256 hashes are accepted (got: {option})",
                              file=filename, line=line, key=key)
        if found is None:
            raise ConfigError(f"{match.group('name')}: unexpected option {option}", file=filename,
                              line=line, key=key)
        digest = found.group("hex").lower()
        if not _SHA256.fullmatch(digest):
            raise ConfigError(f"{match.group('name')}: a sha256 hash has 64 hex digits (got: {digest})",
                              file=filename, line=line, key=key)
        hashes.append(digest)
    if not hashes:
        raise ConfigError(
            f"{match.group('name')}=={match.group('version')} has no --hash=sha256:…; every line needs one",
            file=filename, line=line, key=key,
        )
    return PinnedRequirement(match.group("name"), match.group("version"), tuple(hashes), line)


# ---------------------------------------------------------------- manifest


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore")


class InputRecord(_Record):
    """One input file of the night, by what it is and its sha256."""

    kind: Literal["spec", "playbook", "template", "requirements"]
    name: str
    sha256: str


class PackageRecord(_Record):
    name: str
    version: str
    hashes: list[str] = Field(default_factory=list)


class SourceRecord(_Record):
    kind: Literal["git", "pip"]
    repo: str | None = None
    commit: str | None = None
    packages: list[PackageRecord] = Field(default_factory=list)

    @property
    def label(self) -> str:
        """``git 3f2a1b2`` or ``pip 12 packages``: the history's source column."""
        if self.kind == "git":
            return f"git {(self.commit or '?')[:12]}"
        return f"pip {len(self.packages)} package{'s' if len(self.packages) != 1 else ''}"


class FileRecord(_Record):
    """A patched file: ``path`` relative to the build directory."""

    path: str
    sha256_before: str
    sha256_after: str


class StackRecord(_Record):
    playbook: str
    sha256: str
    files: list[FileRecord] = Field(default_factory=list)


class ServerRecord(_Record):
    """The server's command line as started (secrets masked)."""

    argv: list[str]
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)


class NightManifest(_Record):
    """What one night ran; see ``VARYING`` for what may differ between two nights of one spec."""

    format: int = 1
    spec: str
    host: str
    inputs: list[InputRecord]
    source: SourceRecord
    install: list[list[str]] = Field(default_factory=list)
    stack: list[StackRecord] = Field(default_factory=list)
    files: list[FileRecord] = Field(default_factory=list)
    server: ServerRecord
    orch_version: str
    host_python: str
    build: str
    started: float  # the host's clock
    finished: float | None = None
    probe: dict[str, Any] | None = None
    seq: int | None = None  # the host's sequence number of this night's release (what orders nights)

    VARYING: tuple[str, ...] = ("build", "started", "finished", "probe", "seq")

    def comparable(self) -> dict[str, Any]:
        """Everything that two nights of one spec must have equal."""
        return self.model_dump(exclude=set(self.VARYING))


def relative_to_build(value: Any, build_dir: str) -> Any:
    """``value`` with the build's absolute path written as ``{{ build }}`` (recursively).

    A manifest must not name the build it was made in, or two nights could
    never compare equal.
    """
    if isinstance(value, str):
        return value.replace(build_dir.rstrip("/"), "{{ build }}") if build_dir else value
    if isinstance(value, list):
        return [relative_to_build(v, build_dir) for v in value]
    if isinstance(value, dict):
        return {k: relative_to_build(v, build_dir) for k, v in value.items()}
    return value


def build_relative(path: str, build_dir: str) -> str | None:
    """``path`` relative to ``build_dir``, or None when it is outside it."""
    root = build_dir.rstrip("/") + "/"
    return path[len(root):] if path.startswith(root) else None


# ------------------------------------------------------- what changed, and why


@dataclass(frozen=True)
class Change:
    """One difference between two nights, for a person: what and how."""

    what: Literal["source", "spec", "stack", "template", "requirements", "file", "server", "probe", "host"]
    text: str


def input_changes(before: Sequence[InputRecord], after: Sequence[InputRecord]) -> list[Change]:
    """Inputs (spec, playbooks, templates, requirements) added, removed or changed."""
    old = {(i.kind, i.name): i.sha256 for i in before}
    new = {(i.kind, i.name): i.sha256 for i in after}
    out: list[Change] = []
    what = {"spec": "spec", "playbook": "stack", "template": "template", "requirements": "requirements"}
    for key in sorted(set(old) | set(new)):
        kind, name = key
        label = "playbook" if kind == "playbook" else kind
        if key not in old:
            out.append(Change(what[kind], f"{label} {name} added (sha256 {new[key][:12]})"))  # type: ignore[arg-type]
        elif key not in new:
            out.append(Change(what[kind], f"{label} {name} removed"))  # type: ignore[arg-type]
        elif old[key] != new[key]:
            out.append(Change(what[kind], f"{label} {name} changed (sha256 {old[key][:12]} -> {new[key][:12]})"))  # type: ignore[arg-type]
    return out


def source_changes(before: SourceRecord, after: SourceRecord) -> list[Change]:
    if before.kind != after.kind:
        return [Change("source", f"source {before.label} -> {after.label}")]
    if after.kind == "git":
        out = []
        if before.repo != after.repo:
            out.append(Change("source", f"repository {before.repo} -> {after.repo}"))
        if before.commit != after.commit:
            out.append(Change("source", f"commit {before.commit} -> {after.commit}"))
        return out
    old = {canonical_name(p.name): p for p in before.packages}
    new = {canonical_name(p.name): p for p in after.packages}
    out = []
    for name in sorted(set(old) | set(new)):
        if name not in old:
            out.append(Change("source", f"package {new[name].name}=={new[name].version} added"))
        elif name not in new:
            out.append(Change("source", f"package {old[name].name} removed"))
        elif (old[name].version, old[name].hashes) != (new[name].version, new[name].hashes):
            out.append(Change("source", f"package {name} {old[name].version} -> {new[name].version}"))
    return out


def manifest_changes(before: NightManifest, after: NightManifest) -> list[Change]:
    """What changed from night ``before`` to night ``after`` (probe figures apart)."""
    out = source_changes(before.source, after.source) + input_changes(before.inputs, after.inputs)
    old_files = {f.path: f for f in before.files}
    new_files = {f.path: f for f in after.files}
    for path in sorted(set(old_files) | set(new_files)):
        if path not in old_files:
            out.append(Change("file", f"{path} now patched"))
        elif path not in new_files:
            out.append(Change("file", f"{path} no longer patched"))
        elif old_files[path] != new_files[path]:
            o, n = old_files[path], new_files[path]
            out.append(Change("file", f"{path}: sha256 {o.sha256_before[:12]}→{o.sha256_after[:12]} "
                                      f"now {n.sha256_before[:12]}→{n.sha256_after[:12]}"))
    if before.server.argv != after.server.argv:
        flags = flag_changes(before.server.argv, after.server.argv)
        if flags:
            out.extend(Change("server", f"flag {c}") for c in flags)
        else:
            out.append(Change("server", f"command line: {' '.join(before.server.argv)} -> "
                                        f"{' '.join(after.server.argv)}"))
    if before.server.env != after.server.env or before.server.cwd != after.server.cwd:
        out.append(Change("server", "server environment or working directory changed"))
    if before.install != after.install:
        out.append(Change("spec", "install commands changed"))
    if before.host_python != after.host_python:
        out.append(Change("host", f"host Python {before.host_python} -> {after.host_python}"))
    if before.orch_version != after.orch_version:
        out.append(Change("host", f"orch {before.orch_version} -> {after.orch_version}"))
    return out


@dataclass(frozen=True)
class FigureChange:
    """One probe figure from the last good night to this one."""

    name: str
    before: float | None
    after: float | None

    @property
    def percent(self) -> float | None:
        if self.before in (None, 0) or self.after is None:
            return None
        return round((self.after - self.before) / self.before * 100.0, 1)


def probe_changes(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[FigureChange]:
    """Tokens/s, requests/s, p50, p99 and errors, before and after (from probe summaries)."""
    old = (before or {}).get("summary") or {}
    new = (after or {}).get("summary") or {}
    names = ("output_tokens_per_s", "requests_per_s", "p50_ms", "p99_ms", "errors")
    return [FigureChange(n, old.get(n), new.get(n)) for n in names if old.get(n) is not None or new.get(n) is not None]


# ------------------------------------------------- history and status helpers


def record_source(record: Manifest) -> str | None:
    """A host record's source column: ``git 3f2a…`` / ``pip N packages``, None for deploys."""
    source = record.source
    if source is None:
        return None
    try:
        return SourceRecord.model_validate(source).label
    except ValidationError:
        return None


def record_tokens_per_s(record: Manifest) -> float | None:
    """A host record's probe tokens/s (the median), where it has a probe."""
    probe = record.probe
    summary = probe.get("summary") if probe is not None else None
    value = summary.get("output_tokens_per_s") if isinstance(summary, dict) else None
    return float(value) if isinstance(value, int | float) else None
