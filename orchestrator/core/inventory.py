"""From ``--host`` values to the hosts orch will contact, never by guessing.

A selector is one of:

- an inventory host name, a group name, or ``all``;
- an IP address (``10.1.230.174``, ``[::1]:2222``);
- a ``Host`` alias of the ssh_config in use (``HostName`` and the rest come
  from there);
- an explicit address: ``user@name[:port]`` or ``ssh://[user@]name[:port]``.

Anything else, a bare word in no inventory, is refused with "did you mean"
*before* any name is resolved: a typo (``bxo`` for ``box``) must never reach
DNS or another machine. An address that equals an inventory host's address
*is* that host (its vars, its history), so ``--host 10.1.230.174`` and
``--host blackwell-1`` never become two histories of one box.

Pure: the ssh_config's aliases are passed in (as a function, so the file is
only read when a selector needs it).
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.core.models import HostEntry, Inventory
from orchestrator.core.target import HostTarget
from orchestrator.errors import ConfigError

BUILTIN: dict[str, Any] = {
    "user": None,
    "port": None,
    "identity_file": None,
    "known_hosts": None,
    "become": False,
    "state_dir": "~/.orch",
    "keep_releases": 10,
    "python": "python3",
    "connection": "ssh",
}
"""What a field is when neither the host nor ``defaults`` set it (None: ssh config decides)."""

_SSH_FIELDS = ("user", "port", "identity_file")


SshAliases = Callable[[], Collection[str]]
"""Returns the literal ``Host`` names of the ssh_config in use."""


@dataclass(frozen=True)
class Bare:
    """A ``[user@]address[:port]`` selector, taken apart.

    ``explicit`` is true when the selector says by its form that it is an
    address to use as written (``user@…`` or ``ssh://…``).
    """

    address: str
    user: str | None = None
    port: int | None = None
    explicit: bool = False

    @property
    def is_ip(self) -> bool:
        try:
            ipaddress.ip_address(self.address)
        except ValueError:
            return False
        return True


_BRACKETED = re.compile(r"\[(?P<addr>[^\]]+)\](?::(?P<port>[^:]*))?")


def parse_bare(selector: str) -> Bare:
    """Split ``[user@]address[:port]``; IPv6 with a port as ``[::1]:22``.

    ``ssh://`` in front is accepted (and makes the selector explicit).
    ``ConfigError`` (key ``--host``) when it cannot be an address.
    """
    user: str | None = None
    scheme, has_scheme, after = selector.partition("://")
    if has_scheme and scheme != "ssh":
        raise _bad(selector, f"only ssh:// addresses are understood, not {scheme}://")
    rest = after if has_scheme else selector
    rest = rest.rstrip("/") if has_scheme else rest
    if "@" in rest:
        user, _, rest = rest.rpartition("@")
        if not user:
            raise _bad(selector, "empty user before @")
    port_text: str | None = None
    bracketed = _BRACKETED.fullmatch(rest)
    if bracketed:
        address = bracketed.group("addr")
        port_text = bracketed.group("port")
    elif rest.count(":") == 1:
        address, _, port_text = rest.partition(":")
    else:
        address = rest  # a name, an IPv4 address, or an IPv6 address without a port
    if not address or any(c.isspace() for c in address) or "/" in address:
        raise _bad(selector, "not a host name, a group or an address")
    port: int | None = None
    if port_text is not None:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise _bad(selector, f"bad port '{port_text}'")
        port = int(port_text)
    return Bare(address=address, user=user or None, port=port,
                explicit=bool(has_scheme or user))


def _bad(selector: str, why: str) -> ConfigError:
    return ConfigError(f"bad host '{selector}': {why}", key="--host")


def resolve_hosts(
    inv: Inventory,
    selectors: Sequence[str],
    *,
    filename: str = "inventory.yaml",
    ssh_aliases: SshAliases | None = None,
) -> list[HostTarget]:
    """Resolve every selector, in order, without duplicates.

    Precedence for each field: host entry > ``defaults`` > built-in. A user or
    port in a bare selector overrides both. ``ssh_aliases`` is only called
    when a selector is none of the inventory's names and not an address.
    """
    targets: list[HostTarget] = []
    seen: set[tuple[Any, ...]] = set()
    for selector in selectors:
        for target in _resolve_one(inv, selector.strip(), filename, ssh_aliases):
            identity = (target.name, target.connection, target.address, target.user, target.port)
            if identity not in seen:
                seen.add(identity)
                targets.append(target)
    if not targets:
        given = ", ".join(selectors) if selectors else "nothing"
        raise ConfigError(f"no hosts selected (given: {given})", key="--host")
    return targets


def _resolve_one(
    inv: Inventory, selector: str, filename: str, ssh_aliases: SshAliases | None
) -> list[HostTarget]:
    if not selector:
        raise ConfigError("empty host selector", key="--host")
    if selector in inv.hosts:
        return [host_target(inv, selector)]
    if selector in inv.groups:
        members = inv.groups[selector]
        for member in members:
            if member not in inv.hosts:
                raise ConfigError(
                    f"group '{selector}' lists unknown host '{member}'",
                    file=filename,
                    key=f"groups.{selector}",
                )
        return [host_target(inv, member) for member in members]
    if selector == "all":
        if not inv.hosts:
            raise ConfigError(f"'all' selects nothing: no hosts in {filename}", key="--host")
        return [host_target(inv, name) for name in inv.hosts]
    bare = parse_bare(selector)
    for name, entry in inv.hosts.items():
        if _connection(inv, entry) != "ssh":
            continue
        # ``root@box`` is inventory host ``box`` with another user
        if _address_of(name, entry) == bare.address or (bare.explicit and name == bare.address):
            return [host_target(inv, name, user=bare.user, port=bare.port)]
    if bare.explicit or bare.is_ip:
        return [_bare_target(inv, bare)]
    aliases = set(ssh_aliases()) if ssh_aliases is not None else set()
    if bare.address in aliases:
        return [_bare_target(inv, bare)]
    raise not_in_inventory(inv, selector, bare.address, filename, aliases)


def not_in_inventory(
    inv: Inventory, selector: str, word: str, filename: str, aliases: Collection[str]
) -> ConfigError:
    """The refusal of a bare word, with the nearest names it may have meant."""
    known = [*inv.hosts, *inv.groups, "all", *aliases]
    known += [e.address for e in inv.hosts.values() if e.address]
    close = difflib.get_close_matches(word, list(dict.fromkeys(known)), n=3, cutoff=0.6)
    message = f"'{selector}' is not in the inventory ({filename})"
    if close:
        message += "; did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
    else:
        message += (f" nor a Host of the ssh config; to use it as an address as written, "
                    f"say user@{word} or ssh://{word}")
    return ConfigError(message, key="--host")


def _address_of(name: str, entry: HostEntry) -> str:
    return entry.address or name


def _connection(inv: Inventory, entry: HostEntry | None) -> str:
    if entry is not None and entry.connection:
        return entry.connection
    return inv.defaults.connection or "ssh"


def host_target(
    inv: Inventory, name: str, *, user: str | None = None, port: int | None = None
) -> HostTarget:
    """The ``HostTarget`` for inventory host ``name`` (``user``/``port`` override)."""
    entry = inv.hosts[name]
    values, from_defaults = _layer(inv, entry)
    if user is not None:
        values["user"] = user
        from_defaults.discard("user")
    if port is not None:
        values["port"] = port
        from_defaults.discard("port")
    local = values["connection"] == "local"
    return _target(
        name=name,
        address=None if local else _address_of(name, entry),
        values=values,
        vars={**inv.defaults.vars, **entry.vars},
        from_defaults=from_defaults,
    )


def _bare_target(inv: Inventory, bare: Bare) -> HostTarget:
    values, from_defaults = _layer(inv, None)
    values["connection"] = "ssh"  # an address on the command line is reached over SSH
    if bare.user is not None:
        values["user"] = bare.user
        from_defaults.discard("user")
    if bare.port is not None:
        values["port"] = bare.port
        from_defaults.discard("port")
    return _target(
        name=bare.address,
        address=bare.address,
        values=values,
        vars=dict(inv.defaults.vars),
        from_defaults=from_defaults,
    )


def _layer(inv: Inventory, entry: HostEntry | None) -> tuple[dict[str, Any], set[str]]:
    """Each field from the host entry, else ``defaults``, else built-in; note which came from defaults."""
    values: dict[str, Any] = {}
    from_defaults: set[str] = set()
    for field, builtin in BUILTIN.items():
        own = getattr(entry, field) if entry is not None else None
        default = getattr(inv.defaults, field)
        if own is not None:
            values[field] = own
        elif default is not None:
            values[field] = default
            if field in _SSH_FIELDS:
                from_defaults.add(field)
        else:
            values[field] = builtin
    return values, from_defaults


def _expand(path: str | None) -> str | None:
    """``~`` on the controller (identity and known_hosts files are read here, not on the host)."""
    return os.path.expanduser(path) if path else path


def _target(
    *,
    name: str,
    address: str | None,
    values: dict[str, Any],
    vars: dict[str, Any],
    from_defaults: set[str],
) -> HostTarget:
    return HostTarget(
        name=name,
        connection=values["connection"],
        address=address,
        user=values["user"],
        port=values["port"],
        identity_file=_expand(values["identity_file"]),
        known_hosts=_expand(values["known_hosts"]),
        become=values["become"],
        state_dir=values["state_dir"],
        keep_releases=values["keep_releases"],
        vars=vars,
        python=values["python"],
        from_defaults=frozenset(from_defaults),
    )
