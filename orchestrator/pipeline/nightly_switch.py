"""The one place a night changes what is live: the switch, and its undo.

Everything before the switch happens in a fresh build directory that
nothing runs from. The switch is: stop the old server, point
``builds_dir/current`` at the new build (compare-and-swap on the symlink,
renamed over the old one), start the server once from ``current/``, and wait
for it to be healthy while watching the process. Its undo points the link
back and starts the previous command line again.

Both are driven by one ``SwitchRecord``, written to the host *before*
anything live is touched, and ``switch_back`` reads it back from the host's
disk before acting: whoever restores a night (this run, the host's watchdog,
``orch rollback``) needs nothing but that file. Built on the helper's
existing ops (``server_stop``, ``server_start``, ``health_wait``,
``apply_state`` with no files) plus ``nightly_link_swap``.

Interface, kept small on purpose (the restore machinery will call it):

- ``SwitchRecord``: what to switch from and to (JSON on the host);
- ``switch(session, record, record_path, on_event)``: write the record, then
  stop / swap / start / health in one round trip; raises on failure, leaving
  the record for ``switch_back``;
- ``switch_back(session, record_path, on_event)``: link back, previous
  server started and health-checked; raises when that fails.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.errors import RemoteError
from orchestrator.pipeline.session import HostSession

EventHandler = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class ServerStart:
    """A command line as the helper's ``server_start`` takes it (unmasked)."""

    argv: list[str]
    cwd: str | None = None
    env: dict[str, str] | None = None
    replace_env: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "cwd": self.cwd, "env": dict(self.env or {}),
                "replace_env": self.replace_env}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any] | None) -> ServerStart | None:
        if not data or not data.get("argv"):
            return None
        return cls(list(data["argv"]), data.get("cwd"), dict(data.get("env") or {}),
                   bool(data.get("replace_env")))


@dataclass(frozen=True)
class SwitchRecord:
    """Everything the switch and its undo need, from the host's disk alone.

    ``link`` is ``builds_dir/current``; ``new_build``/``previous_build`` are
    the names it points to after/before (``previous_build`` None on a first
    night). ``previous_start`` is the command line that ran before (the
    running process as recorded, or the previous night's), None if nothing
    did. ``health`` is checked after the switch, ``restore_health`` (the same
    requests without expectations) after the undo.
    """

    link: str
    new_build: str
    previous_build: str | None
    new_start: ServerStart
    previous_start: ServerStart | None
    previous_pid: int | None
    previous_pgid: int | None
    pidfile: str
    log: str
    port: int | None
    stop_timeout: float
    health: dict[str, Any]
    restore_health: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["new_start"] = self.new_start.to_wire()
        data["previous_start"] = self.previous_start.to_wire() if self.previous_start else None
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SwitchRecord:
        new_start = ServerStart.from_wire(data["new_start"])
        assert new_start is not None
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        fields["new_start"] = new_start
        fields["previous_start"] = ServerStart.from_wire(data.get("previous_start"))
        return cls(**fields)

    def server_wire(self, start: ServerStart | None) -> dict[str, Any]:
        """``apply_state``'s ``server``: stop what runs (by pidfile or port), start ``start``."""
        return {"manager": "process", "pidfile": self.pidfile, "log": self.log, "port": self.port,
                "stop_timeout": self.stop_timeout, "start": start.to_wire() if start else None}


def switch(session: HostSession, record: SwitchRecord, record_path: str,
           on_event: EventHandler | None = None) -> dict[str, Any]:
    """Write ``record``, then stop the old server, swap the link, start once, wait for health.

    One round trip. Returns ``health_wait``'s answer; raises the helper's
    error (a server that exits during start carries its log tail) and leaves
    the host for ``switch_back``.
    """
    steps: list[dict[str, Any]] = [
        {"op": "put_json", "args": {"path": record_path, "value": record.to_json()}},
    ]
    if record.previous_pid:
        steps.append({"op": "server_stop", "args": {"pid": record.previous_pid, "pgid": record.previous_pgid,
                                                    "stop_timeout": record.stop_timeout,
                                                    "port": record.port}})
    steps.append({"op": "nightly_link_swap", "args": {"link": record.link, "to": record.new_build,
                                                      "expect": record.previous_build}})
    start = record.new_start
    steps.append({"op": "server_start", "args": {"argv": start.argv, "cwd": start.cwd, "env": start.env,
                                                 "log": record.log, "pidfile": record.pidfile,
                                                 "replace_env": start.replace_env}})
    steps.append({"op": "health_wait", "args": dict(record.health, pid="started")})
    results = session.call("batch", steps=steps, on_event=on_event)
    return dict(results[-1])


def switch_back(session: HostSession, record_path: str, on_event: EventHandler | None = None) -> SwitchRecord:
    """Undo a switch from the record on the host: link back, previous server, health.

    Idempotent: a link already back is left alone, and whatever server runs
    is stopped before the previous command line starts. Raises when the
    record is missing or the previous server does not come back healthy.
    """
    data = session.call("get_json", path=record_path)
    if not data:
        raise RemoteError(f"no switch record at {record_path}: cannot switch back")
    record = SwitchRecord.from_json(data)
    session.call("nightly_link_swap", link=record.link, to=record.previous_build, expect=record.new_build)
    start = record.previous_start
    session.call("apply_state", files=[], server=record.server_wire(start),
                 health=record.restore_health if start else None, on_event=on_event)
    return record
