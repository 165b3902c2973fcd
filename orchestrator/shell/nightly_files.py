"""Reading a nightly spec and everything it names from the controller's disk.

The spec's stack entries and its requirements file are found relative to
the spec's own folder first (so a spec and its playbooks travel together),
then as ``orch deploy`` finds playbooks (a path, ``./playbooks/``, the
shipped ones). Every input's sha256 is taken here, once: the spec, each
playbook, each template a playbook's edits name, and the requirements file.
Those digests are what ``--frozen`` compares and what the manifest records.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.flags import TEMPLATES as FLAG_TEMPLATES
from orchestrator.core.nightly import (
    InputRecord,
    NightlySpec,
    PinnedRequirement,
    parse_nightly,
    parse_requirements,
)
from orchestrator.errors import ConfigError
from orchestrator.shell.config_files import (
    LoadedPlaybook,
    display_path,
    find_playbook,
    find_template,
    load_playbook,
    read_text_file,
)

DEFAULT_SPEC = "nightly"


@dataclass(frozen=True)
class LoadedRequirements:
    path: Path
    text: str
    sha256: str
    pins: tuple[PinnedRequirement, ...]


@dataclass(frozen=True)
class LoadedNightly:
    """A spec as read from disk, with its stack and its inputs' digests."""

    path: Path
    text: str
    sha256: str
    model: NightlySpec
    stack: tuple[LoadedPlaybook, ...]
    requirements: LoadedRequirements | None
    inputs: tuple[InputRecord, ...]

    @property
    def display(self) -> str:
        return self.model.locations.file

    @property
    def stack_names(self) -> tuple[str, ...]:
        return tuple(self.model.stack)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def find_nightly(arg: str | None) -> Path:
    """The spec at ``arg`` (a path or a name), default ``playbooks/nightly.yaml``."""
    return find_playbook(arg or DEFAULT_SPEC)


def _stack_path(spec_path: Path, entry: str, where: dict[str, object]) -> Path:
    candidate = Path(entry).expanduser()
    if candidate.is_absolute():
        if candidate.is_file():
            return candidate
        raise ConfigError(f"playbook not found: {entry}", **where)  # type: ignore[arg-type]
    beside = spec_path.resolve().parent / candidate
    if beside.is_file():
        return beside
    try:
        return find_playbook(entry)
    except ConfigError as exc:
        raise ConfigError(exc.message, **where) from None  # type: ignore[arg-type]


def _template_inputs(loaded: LoadedPlaybook) -> list[InputRecord]:
    """The templates (and patch files) this playbook's edits name, by content.

    An ``add_flag`` edit renders one of ``core.flags.TEMPLATES``, chosen by the
    layout of the file on the host; all of them are inputs, since which one a
    night uses is only known there.
    """
    out: list[InputRecord] = []
    for entry in loaded.model.files:
        for edit in entry.edits:
            flag_templates = list(FLAG_TEMPLATES.values()) if edit.add_flag is not None else []
            for name in (edit.insert, edit.patch, *flag_templates):
                if not name:
                    continue
                found = find_template(loaded.template_dirs, name)
                if found is not None:  # not found: rendering says so, located
                    out.append(InputRecord(kind="template", name=name, sha256=sha256_text(read_text_file(found, name))))
    return out


def load_nightly(path: Path | str) -> LoadedNightly:
    """Read and parse the spec at ``path`` and everything it names."""
    path = Path(path)
    shown = display_path(path)
    text = read_text_file(path, shown)
    spec = parse_nightly(text, shown)
    locations = spec.locations
    inputs: list[InputRecord] = [InputRecord(kind="spec", name=spec.name, sha256=sha256_text(text))]
    stack: list[LoadedPlaybook] = []
    for i, entry in enumerate(spec.stack):
        found = _stack_path(path, entry, locations.where(("stack", i)))
        loaded = load_playbook(found)
        stack.append(loaded)
        inputs.append(InputRecord(kind="playbook", name=entry, sha256=loaded.sha256))
        inputs.extend(_template_inputs(loaded))
    requirements = None
    if spec.source.pip is not None:
        rel = spec.source.pip.requirements
        where = locations.where(("source", "pip", "requirements"))
        candidate = Path(rel).expanduser()
        if not candidate.is_absolute():
            beside = path.resolve().parent / candidate
            candidate = beside if beside.is_file() else candidate
        if not candidate.is_file():
            raise ConfigError(f"requirements file not found: {rel}", **where)
        req_text = read_text_file(candidate, display_path(candidate))
        pins = parse_requirements(req_text, display_path(candidate))
        requirements = LoadedRequirements(candidate, req_text, sha256_text(req_text), tuple(pins))
        inputs.append(InputRecord(kind="requirements", name=rel, sha256=requirements.sha256))
    unique = {(i.kind, i.name): i for i in inputs}
    return LoadedNightly(path, text, sha256_text(text), spec, tuple(stack), requirements,
                         tuple(unique.values()))
