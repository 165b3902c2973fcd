"""Does the running server predate a release's files? (issue 21, first row)

A release that changes files and does not restart the server leaves a server
that started before the commit running the code it loaded then: ``deploy``
and ``status`` say so rather than only "current" / "ok". Pure: the lookup of
where the server is and the comparison of times; the reading is the caller's.
Every time here is on the host's clock (``ServerProcess.started_at`` from
/proc, a release's steps from ``HostSession.host_time``).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from orchestrator.core.target import HostTarget
from orchestrator.host.records import HostRecords, ServerProcess


def server_whereabouts(state: HostRecords, target: HostTarget) -> tuple[str, int | None]:
    """Where to look for a server a files-only release does not name: the pidfile and port
    of the newest release that knew the server (as ``status`` does); else the default
    pidfile under the state dir and the host's ``port`` variable, if it is a number."""
    known = next((m.process_server for m in state.newest_first() if m.process_server is not None), None)
    if known is not None and (known.pidfile or known.port):
        return known.pidfile or default_pidfile(target), known.port
    port = target.vars.get("port")
    return default_pidfile(target), port if isinstance(port, int) and not isinstance(port, bool) else None


def default_pidfile(target: HostTarget) -> str:
    return f"{target.state_dir.rstrip('/')}/server.pid"


def commit_time(steps: list[dict[str, Any]]) -> float | None:
    """When a release's commit step ended, on the host's clock (None: no commit recorded)."""
    for step in steps:
        if step.get("step") == "commit" and isinstance(step.get("at"), (int, float)):
            return float(step["at"]) + float(step.get("seconds") or 0.0)
    return None


def server_predates(server: ServerProcess | None, committed: float | None) -> bool | None:
    """True: the server started before the commit (it runs the code it loaded before);
    False: no server runs, or it started after; None: cannot be told (no commit time,
    or a helper that does not send the start time)."""
    if server is None:
        return False if committed is not None else None
    if committed is None or server.started_at is None:
        return None
    return server.started_at < committed


def predates_note(server: ServerProcess) -> str:
    """The one line a person reads when ``server_predates`` is True."""
    started = datetime.fromtimestamp(server.started_at or 0.0, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (f"the running server (pid {server.pid}, started {started}) still runs the code it loaded "
            "before this release; restart it to use the change")
