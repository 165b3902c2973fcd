"""Finding and reading the inventory, playbooks and templates on the controller.

The only config code that touches the local disk: it reads files and hands
their text to the pure parsers in ``core``. A user's own ``playbooks/`` and
``templates/`` in the current directory come before the ones shipped in the
package, so ``orch demo`` works from a plain ``pip install`` and a user can
still shadow any shipped file.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Any

import orchestrator
from orchestrator.core.models import Inventory, Locations, Playbook, parse_inventory, parse_playbook
from orchestrator.core.settings import ConfigFile, parse_config_file
from orchestrator.core.templating import Lookup, Renderer
from orchestrator.core.yamlsrc import load_yaml
from orchestrator.errors import ConfigError, TemplateError

DEFAULT_INVENTORY = "inventory.yaml"
DEFAULT_PLAYBOOK = "site.yaml"


def packaged_dir(name: str) -> Path:
    """The shipped ``playbooks`` or ``templates`` folder.

    From a wheel they live at ``orchestrator/_data/<name>``; from a source
    checkout (or an editable install) at the repository root.
    """
    package = Path(orchestrator.__file__).resolve().parent
    installed = package / "_data" / name
    return installed if installed.is_dir() else package.parent / name


def display_path(path: Path) -> str:
    """``path`` as error messages show it: relative to the current directory when inside it."""
    try:
        return os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd()) else str(path)
    except (OSError, ValueError):
        return str(path)


def read_text_file(path: Path, shown: str) -> str:
    """A config file's text; one located error when it is not readable UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError("not UTF-8 text", file=shown) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", file=shown) from None


def load_inventory(path: str | None) -> tuple[Inventory, str]:
    """The inventory at ``path`` (must exist), or ``./inventory.yaml``, or an empty one.

    Returns the model and the file name errors should name.
    """
    if path is None:
        default = Path(DEFAULT_INVENTORY)
        if not default.is_file():
            return Inventory(), DEFAULT_INVENTORY
        target, shown = default, DEFAULT_INVENTORY
    else:
        target, shown = Path(path).expanduser(), path
        if not target.is_file():
            raise ConfigError(f"inventory not found: {path}", key="-i")
    return parse_inventory(read_text_file(target, shown), shown), shown


def ssh_host_aliases(ssh_config_path: str | None) -> list[str]:
    """The literal ``Host`` names of the ssh_config the SSH transport will read.

    That is ``ssh_config_path`` when given, else ``~/.ssh/config`` and
    ``/etc/ssh/ssh_config``, read by Fabric exactly as a connection reads
    them. Patterns (``*``, ``gpu-?``, ``!name``) are not aliases: a typo
    would match them too. Fabric is imported here, only when a ``--host``
    needs this.
    """
    import fabric

    try:
        config = fabric.Config(runtime_ssh_path=ssh_config_path) if ssh_config_path else fabric.Config()
    except Exception as exc:  # unreadable or unparsable: the transport would refuse it too
        raise ConfigError(f"cannot read the ssh config: {' '.join(str(exc).split())}",
                          file=ssh_config_path) from exc
    names = config.base_ssh_config.get_hostnames()
    return sorted(n for n in names if not any(c in n for c in "*?!"))


def read_retry_file(path: str) -> str:
    """The text of a retry file named by ``--limit @FILE`` (``ConfigError`` if it cannot be read)."""
    try:
        return Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"cannot read retry file {path}: {reason}", key="--limit") from None


def _with_suffix(name: str) -> str:
    return name if name.endswith((".yaml", ".yml")) else name + ".yaml"


def find_playbook(arg: str | None) -> Path:
    """Where playbook ``arg`` is: a path, else ``./playbooks/``, else the shipped ones.

    Without ``arg`` the default is ``playbooks/site.yaml`` of the working
    directory, and only then the shipped one (``is_shipped`` tells which).
    """
    name = arg or DEFAULT_PLAYBOOK
    candidates = [
        *([Path(name).expanduser()] if arg else []),
        Path("playbooks") / _with_suffix(name),
        packaged_dir("playbooks") / _with_suffix(name),
    ]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    looked = ", ".join(dict.fromkeys(display_path(c) for c in candidates))
    raise ConfigError(f"playbook '{name}' not found (looked for: {looked})")


def is_shipped(path: Path) -> bool:
    """True when ``path`` is one of the playbooks installed with orch (not the user's)."""
    try:
        return path.resolve().is_relative_to(packaged_dir("playbooks").resolve()) and not (
            path.resolve().is_relative_to(Path.cwd().resolve())
        )
    except OSError:
        return False


@dataclass(frozen=True)
class LoadedPlaybook:
    """A playbook as read from disk: its text and digest (for the release manifest), its model."""

    path: Path
    text: str
    sha256: str
    model: Playbook
    locations: Locations
    template_dirs: tuple[Path, ...]

    @property
    def display(self) -> str:
        """The playbook's name in messages (relative to the current directory when inside it)."""
        return self.locations.file

    @property
    def filename(self) -> str:
        return self.locations.file

    @cached_property
    def renderer(self) -> Renderer:
        """The playbook's one renderer for the run: every host shares its Jinja environment
        and the templates it compiled (Jinja's environment is safe to share between threads)."""
        return _new_renderer(self)


def template_dirs_for(playbook_path: Path) -> tuple[Path, ...]:
    """The playbook's folder, ``../templates`` beside it, the shipped templates (no repeats)."""
    folder = playbook_path.resolve().parent
    dirs = [folder, folder.parent / "templates", packaged_dir("templates").resolve()]
    return tuple(dict.fromkeys(dirs))


def load_playbook(path: Path | str) -> LoadedPlaybook:
    """Read and parse the playbook at ``path``."""
    path = Path(path)
    shown = display_path(path)
    text = read_text_file(path, shown)
    model = parse_playbook(text, shown)
    return LoadedPlaybook(
        path=path,
        text=text,
        sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        model=model,
        locations=model.locations,
        template_dirs=template_dirs_for(path),
    )


def find_template(dirs: tuple[Path, ...], name: str) -> Path | None:
    """The first of ``dirs`` holding template ``name``.

    Names are relative paths below the folders; ``..`` or an absolute path is
    refused, so a playbook cannot read arbitrary files of the controller.
    """
    parts = PurePosixPath(name).parts
    if not name or PurePosixPath(name).is_absolute() or ".." in parts or "\\" in name:
        raise TemplateError(
            f"template name must be a relative path inside the template folders (got: {name!r})"
        )
    for folder in dirs:
        candidate = folder.joinpath(*parts)
        if candidate.is_file():
            return candidate
    return None


def template_lookup(dirs: tuple[Path, ...]) -> Lookup:
    """A ``Renderer`` lookup over ``dirs`` (see ``find_template``)."""

    def lookup(name: str) -> str | None:
        found = find_template(dirs, name)
        if found is None:
            return None
        try:
            return read_text_file(found, display_path(found))
        except ConfigError as exc:  # located by the renderer at the playbook key
            raise TemplateError(f"{exc.file}: {exc.message}") from None

    return lookup


def make_renderer(loaded: LoadedPlaybook) -> Renderer:
    """The sandboxed renderer reading templates from the playbook's template folders
    (one per loaded playbook, shared by its hosts)."""
    return loaded.renderer


def _new_renderer(loaded: LoadedPlaybook) -> Renderer:
    dirs = loaded.template_dirs

    def describe(name: str) -> str:
        try:
            found = find_template(dirs, name)
        except TemplateError:
            found = None
        return display_path(found) if found else name

    return Renderer(
        template_lookup(dirs), searched=[display_path(d) for d in dirs], describe=describe
    )


# ------------------------------------------------------------ orch's settings

CONFIG_NAMES = ("orch.yaml",)


@dataclass(frozen=True)
class FoundConfig:
    """The config file in effect (if any), and a warning about one that was skipped."""

    path: str | None
    model: ConfigFile | None
    warning: str | None = None


def config_candidates(env: Mapping[str, str]) -> list[Path]:
    """Where orch looks for its config file, first wins: ``./orch.yaml``, then the XDG one."""
    xdg = env.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return [Path("orch.yaml"), Path(xdg) / "orch" / "config.yaml"]


def find_config(env: Mapping[str, str]) -> FoundConfig:
    """The first config file found, read and checked; the other is ignored, as ansible.cfg's are.

    A ``./orch.yaml`` in a directory anyone can write is ignored with a
    warning: another user could have put it there to point orch at their
    inventory (Ansible refuses ``ansible.cfg`` there for the same reason).
    """
    warning = None
    for candidate in config_candidates(env):
        if not candidate.is_file():
            continue
        folder = candidate.resolve().parent
        if candidate == Path("orch.yaml") and folder.stat().st_mode & stat.S_IWOTH:
            warning = (f"ignoring ./orch.yaml: its directory {folder} is world-writable "
                       "(anyone could have written it)")
            continue
        shown = str(candidate) if candidate.is_absolute() else f"./{candidate}"
        return FoundConfig(shown, parse_config_file(read_text_file(candidate, shown), shown), warning)
    return FoundConfig(None, None, warning)


def read_var_file(name: str) -> dict[str, Any]:
    """``--var @file.yaml``: a mapping of variables, read under the YAML alias budget."""
    path = Path(name).expanduser()
    if not path.is_file():
        raise ConfigError(f"variables file not found: {name}", key=f"--var @{name}")
    doc = load_yaml(read_text_file(path, name), name)
    if doc.data is None:
        return {}
    if not isinstance(doc.data, dict) or not all(isinstance(k, str) for k in doc.data):
        raise ConfigError("expected a mapping of variable names to values at the top level",
                          file=name, line=1, key=f"--var @{name}")
    return dict(doc.data)
