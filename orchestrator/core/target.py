"""One resolved host: everything the shell layer needs to reach it.

Produced by ``core.inventory.resolve_hosts`` from the inventory and a
``--host`` value; consumed by the transports and the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class HostTarget:
    """A host as orch will contact it.

    ``name`` is the inventory name (or the bare address given on the command
    line when no inventory host matches). ``address`` is ``None`` for
    ``connection: local``; for SSH a ``None`` user/port/identity means "let
    ``~/.ssh/config`` and Fabric decide". Paths are already ``~``-expanded
    on the controller side, except ``state_dir``, which is a path on the host
    (``~`` there means the remote user's home).

    ``from_defaults`` names the SSH fields (``user``, ``port``,
    ``identity_file``) whose value came from the inventory's ``defaults``
    rather than the host's own entry: for those, a matching ``~/.ssh/config``
    block wins, because it is more specific to the host than a fleet default.
    ``python`` is the interpreter orch's helper runs with on the host.
    """

    name: str
    connection: Literal["ssh", "local"] = "ssh"
    address: str | None = None
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    become: bool = False
    state_dir: str = "~/.orch"
    keep_releases: int = 10
    vars: dict[str, Any] = field(default_factory=dict)
    python: str = "python3"
    from_defaults: frozenset[str] = frozenset()

    @property
    def label(self) -> str:
        """How messages name the host: ``name`` or ``name (user@address:port)``."""
        if self.connection == "local" or not self.address:
            return self.name
        where = (f"{self.user}@" if self.user else "") + self.address
        if self.port:
            where += f":{self.port}"
        return self.name if where == self.name else f"{self.name} ({where})"
