"""orch's own settings: what the config file, the environment and the flags say.

Ansible users expect three habits: an environment variable per setting
(``ORCH_INVENTORY`` as ``ANSIBLE_INVENTORY``), a small config file found
in a fixed order (``./orch.yaml``, then ``$XDG_CONFIG_HOME/orch/config.yaml``,
as ``ansible.cfg``), and a flag that beats both. This module is the pure
half: the file's model and the precedence rule, fed values, returning
each setting with where it came from (``orch config`` prints that).
Finding and reading the file is ``shell.config_files``'s job.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, PositiveInt

from orchestrator.core.models import _Model, _parse
from orchestrator.errors import ConfigError
from orchestrator.host.wire import LINK_TIMEOUT_FLOOR, SILENCE_SECONDS

ENV_NAMES = {"inventory": "ORCH_INVENTORY", "ssh_config": "ORCH_SSH_CONFIG", "forks": "ORCH_FORKS",
             "link_timeout": "ORCH_LINK_TIMEOUT"}
"""The environment variable of each setting that has one (colour has ``NO_COLOR``)."""

DEFAULT_FORKS = 10
DEFAULT_LINK_TIMEOUT = SILENCE_SECONDS
"""Seconds of silence after which either end of a helper's link takes it for dead."""


class ConfigFile(_Model):
    """``orch.yaml``: the keys a user sets once instead of on every command."""

    inventory: str | None = None
    ssh_config: str | None = None
    forks: PositiveInt | None = None
    link_timeout: Annotated[float, Field(ge=LINK_TIMEOUT_FLOOR, allow_inf_nan=False)] | None = None
    color: bool | None = None


def parse_config_file(text: str, filename: str) -> ConfigFile:
    """The config file's text, checked like every other config file (one located line)."""
    return _parse(ConfigFile, text, filename)


@dataclass(frozen=True)
class Setting:
    """One value in effect, and what set it: a flag, a variable, a file or ``default``."""

    value: Any
    source: str


@dataclass(frozen=True)
class Settings:
    """Every setting orch takes from flag, environment or file."""

    inventory: Setting
    ssh_config: Setting
    forks: Setting
    link_timeout: Setting
    color: Setting

    def rows(self) -> list[tuple[str, Any, str]]:
        """(name, value, source) for ``orch config``, in a fixed order."""
        return [(name, getattr(self, name).value, getattr(self, name).source)
                for name in ("inventory", "ssh_config", "forks", "link_timeout", "color")]


def resolve_settings(
    flags: Mapping[str, Any],
    env: Mapping[str, str],
    file: ConfigFile | None,
    file_path: str | None,
) -> Settings:
    """Each setting from the first of: its flag, its environment variable, the file, the default.

    ``flags`` holds only the flags the user gave (absent or ``None``: not
    given). A relative path in the file is relative to the file, as
    ``ansible.cfg``'s are, so one ``orch.yaml`` works from any directory.
    ``NO_COLOR`` (any non-empty value) beats the file's ``color``;
    ``--color/--no-color`` beat both.
    """

    def from_file(key: str) -> Setting | None:
        value = getattr(file, key) if file is not None else None
        if value is None:
            return None
        if key in ("inventory", "ssh_config"):
            value = posixpath.join(posixpath.dirname(file_path or ""), posixpath.expanduser(value))
        return Setting(value, f"{file_path}: {key}")

    def pick(key: str, flag: str, default: Any) -> Setting:
        if flags.get(key) is not None:
            return Setting(flags[key], flag)
        name = ENV_NAMES.get(key)
        if name and env.get(name):
            return Setting(_env_value(key, name, env[name]), name)
        return from_file(key) or Setting(default, "default")

    if flags.get("color") is not None:
        color = Setting(flags["color"], "--color" if flags["color"] else "--no-color")
    elif env.get("NO_COLOR"):
        color = Setting(False, "NO_COLOR")
    else:
        color = from_file("color") or Setting(None, "default")
    return Settings(
        inventory=pick("inventory", "-i", None),
        ssh_config=pick("ssh_config", "--ssh-config", None),
        forks=pick("forks", "--forks", DEFAULT_FORKS),
        link_timeout=pick("link_timeout", "--link-timeout", DEFAULT_LINK_TIMEOUT),
        color=color,
    )


def _env_value(key: str, name: str, text: str) -> Any:
    """An environment variable's value as its setting needs it; one line when it cannot be."""
    if key == "link_timeout":
        return _env_seconds(name, text)
    if key != "forks":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{name}={text!r}: expected a whole number of hosts, 1 or more", key=name)
    return value


def _env_seconds(name: str, text: str) -> float:
    """``ORCH_LINK_TIMEOUT``'s seconds, no fewer than ``LINK_TIMEOUT_FLOOR``; one line when not."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not LINK_TIMEOUT_FLOOR <= value < float("inf"):
        raise ConfigError(f"{name}={text!r}: expected seconds, {LINK_TIMEOUT_FLOOR:g} or more", key=name)
    return value
