"""What a restore did, in words: the host's record (``host.restore_plan.RestoreRecord``)
said for a person, exactly — what was put back, what was not and why, whether a server
listens. The pipeline carries the record as fields (``core.events.RestoreAccount``); the
console, the run log and an ending's words say it through here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.core.events import RestoreAccount
from orchestrator.core.restore import RestoreRecord


def restore_done(account: RestoreAccount) -> str:
    """The words of ``account``: what a failed commit had written first, then what the restore did."""
    done = describe_restore(account.record, account.planned)
    if account.written:
        return f"written by the commit before it failed: {', '.join(account.written)}; {done}"
    return done


def describe_restore(record: RestoreRecord, planned: Sequence[str] = ()) -> str:
    """One line for a person: exactly what was restored and what was not.

    ``planned``: every path the plan covers, so that files the restore
    never reached (it stopped on an earlier one) are named too.
    """
    parts: list[str] = []
    by_action: dict[str, list[str]] = {}
    for f in record.files:
        by_action.setdefault(f.action, []).append(f.shown)
    if by_action.get("restored") or by_action.get("removed"):
        parts.append("files restored: " + ", ".join(by_action.get("restored", []) + by_action.get("removed", [])))
    if by_action.get("unchanged"):
        # "never written" only where the commit provably never began
        said = "untouched (never written)" if record.committed is False else "already as before (not rewritten)"
        parts.append(f"{said}: " + ", ".join(by_action["unchanged"]))
    if by_action.get("left"):
        parts.append("changed by someone else, left as is: " + ", ".join(by_action["left"]))
    if not record.files and not planned and not record.links:
        parts.append("no file to restore")
    reached = {f.path for f in record.files}
    missed = [p for p in planned if p not in reached]
    if missed:
        parts.append("NOT restored: " + ", ".join(missed))
    for f in record.drift:
        parts.append(f"drift: {f.path} held content orch did not write; kept in {f.drift}")
    for f in record.files:
        # a security event, named even when the restore succeeded
        parts.extend(f"REFUSED a planted file or link: {why}" for why in f.refused)
    for link in record.links:
        if link.get("action") == "restored":
            parts.append(f"{link['path']} points at {link['target']} again")
        elif link.get("action") == "removed":
            parts.append(f"{link['path']} removed (there was none before)")
        if link.get("drift"):
            parts.append(f"drift: {link['path']} pointed at {link['drift']}, not where orch had pointed it")
    if record.server:
        parts.append(_describe_server(record.server, record.health))
    if record.error:
        parts.append(f"FAILED: {record.error}")
        if record.listening:
            parts.append(_describe_listening(record.listening))
    return "; ".join(parts) or "nothing needed restoring"


def _describe_listening(listening: dict[str, Any]) -> str:
    """Whether the host still serves after a failed restore: said, never left to guess."""
    port = listening.get("port")
    if listening.get("listening") is None:
        return f"whether a server listens on port {port} is not known"
    if not listening.get("listening"):
        return f"nothing is listening on port {port}: the server is down"
    pid = listening.get("pid")
    return f"a server is listening on port {port}" + (f" (pid {pid})" if pid else " (pid not visible)")


def _describe_server(server: dict[str, Any], health: dict[str, Any] | None) -> str:
    action = server.get("action")
    pid = server.get("pid")
    if action == "untouched":
        return f"the running server (pid {pid}) was never stopped" if pid else "the server was not touched"
    if action == "already running":
        return "the previous server command line already runs"
    if action == "stopped":
        return "the server started by the deploy is stopped (none ran before)"
    if action == "restarted":
        where = f" (pid {pid})" if pid else ""
        return f"the previous server was restarted{where}" + (" and is healthy" if health else "")
    return f"server: {action}"
