"""``orch rollback``: undo the current release (or down to ``--to R``), or
finish a deploy that never did.

A rollback is recorded on the host like a release (kind ``rollback``), with
the live content it replaced kept as its own "before" — so even a rollback
over hand edits (drift) loses nothing.
"""

from __future__ import annotations

import secrets
import time
from datetime import datetime, timezone
from typing import Any

from orchestrator import __version__
from orchestrator.core.releases import new_release_id, rollback_target, rollback_to
from orchestrator.core.target import HostTarget
from orchestrator.errors import HostUnsafeError, OrchError, RefusedError, RemoteError
from orchestrator.pipeline.deploy import open_state, release_lock
from orchestrator.pipeline.events import Reporter
from orchestrator.pipeline.report import HostReport
from orchestrator.pipeline.session import ConnectOptions, HostSession, lock_holder
from orchestrator.shell.agent_client import RemoteStepError


def rollback_host(
    target: HostTarget, to: str | None, options: ConnectOptions, reporter: Reporter
) -> HostReport:
    label = target.name
    try:
        with HostSession(target, options) as session:
            state_dir, state = open_state(session, "rollback", options.break_lock, reporter)
            try:
                applied = list(state["state"].get("applied", []))
                # an unknown or undone --to is refused (exit 2) whatever the host's state
                rid = rollback_to(to, applied, {r["id"]: r for r in state["releases"]}) if to else None
                journal = state["journal"]
                if journal and not journal.get("finished"):
                    return finish_unfinished(session, state_dir, state, reporter)
                if rid is not None and rid == applied[-1]:
                    reporter.step(label, f"release {rid} is already current: nothing to do")
                    return HostReport(label, "unchanged", 0, release=rid)
                return undo_releases(session, state_dir, state, to, reporter)
            finally:
                release_lock(session, state_dir)
    except HostUnsafeError as e:
        return HostReport(label, "rollback_failed", 3, error=str(e))
    except OrchError as e:
        outcome = "unreachable" if type(e).__name__ in ("UnreachableError", "HostKeyError") else "failed"
        return HostReport(label, outcome, e.exit_code, error=str(e))  # type: ignore[arg-type]


def _events(reporter: Reporter, label: str) -> Any:
    return lambda ev: reporter.progress(label, ev)


def finish_unfinished(
    session: HostSession, state_dir: str, state: dict[str, Any], reporter: Reporter
) -> HostReport:
    """The journal shows a deploy that died mid-way: restore its release's plan."""
    label = session.target.name
    journal = state["journal"]
    rid = journal["release"]
    release_dir = f"{state_dir}/releases/{rid}"
    reporter.step(label, f"finishing the unfinished deploy {rid} (last step: {journal.get('step')})")
    holder = session.call("claim", release_dir=release_dir, who="controller")
    if holder == "watchdog":
        result = session.call("get_json", path=f"{release_dir}/watchdog.json")
        if result is None:
            raise RefusedError(f"{label}: the watchdog is restoring {rid} right now; run again in a minute")
        if not result.get("ok"):
            reporter.warn(label, f"the watchdog's restore failed ({result.get('error')}); restoring again")
        else:
            session.call("put_json", path=f"{state_dir}/journal.json",
                         value=dict(journal, step="restored_by_watchdog", finished=True))
            reporter.step(label, f"the watchdog had already restored {rid}")
            return HostReport(label, "rolled_back", 0, release=rid)
    spec = session.call("get_json", path=f"{release_dir}/restore.json")
    if spec is None:
        # Died before the backup finished: nothing was committed.
        session.call("put_json", path=f"{state_dir}/journal.json",
                     value=dict(journal, step="abandoned", finished=True))
        reporter.step(label, f"deploy {rid} had not changed anything; journal closed")
        return HostReport(label, "unchanged", 0, release=rid)
    try:
        session.call("apply_state", on_event=_events(reporter, label), **spec["plan"])
    except RemoteStepError as e:
        if e.details.get("log_tail"):
            reporter.server_log(label, "server log (last 40 lines)", e.details["log_tail"])
        raise HostUnsafeError(f"{label}: restoring the unfinished deploy {rid} failed: {e}") from None
    session.call("batch", steps=[
        {"op": "release_update", "args": {"state_dir": state_dir, "release_id": rid,
                                          "fields": {"outcome": "rolled_back",
                                                     "error": "unfinished; restored by orch rollback"}}},
        {"op": "put_json", "args": {"path": f"{state_dir}/journal.json",
                                    "value": dict(journal, step="rolled_back", finished=True)}},
    ])
    reporter.step(label, f"restored the state before {rid}")
    return HostReport(label, "rolled_back", 0, release=rid,
                      files=[f["path"] for f in spec["plan"]["files"]])


def undo_releases(
    session: HostSession, state_dir: str, state: dict[str, Any], to: str | None, reporter: Reporter
) -> HostReport:
    label = session.target.name
    applied: list[str] = list(state["state"].get("applied", []))
    releases = {r["id"]: r for r in state["releases"]}
    releases_dir = f"{state_dir}/releases"
    if not applied:
        reporter.step(label, "nothing to roll back: no release is current (there is nothing before)")
        return HostReport(label, "unchanged", 0, notes=["nothing before"])
    target = rollback_target(applied, releases, releases_dir, to)
    newest = releases[target.undo[0]]
    paths = [f.path for f in target.files]
    live = session.call("read", paths=paths)
    expected_after = {}
    for rid in reversed(target.undo):  # oldest first: the newest's "after" wins
        for entry in releases[rid].get("files", []):
            expected_after[entry["path"]] = entry["sha256_after"]
    for info in live:
        want = expected_after.get(info["path"])
        if info.get("sha256") != want:
            reporter.warn(label, f"{info['path']} changed on the host since release {newest['id']} "
                                 "(drift); its current content is kept in the rollback record")
    rid = new_release_id(datetime.now(timezone.utc), secrets.token_hex(2))
    record = {
        "id": rid,
        "kind": "rollback",
        "host": label,
        "undid": list(target.undo),
        "to": target.new_applied[-1] if target.new_applied else None,
        "playbook": {"name": "(rollback)"},
        "files": [
            {"path": info["path"], "n": n, "existed": info["exists"], "mode": info.get("mode"),
             "uid": info.get("uid"), "gid": info.get("gid"), "sha256_before": info.get("sha256"),
             "sha256_after": f.sha256}
            for n, (info, f) in enumerate(zip(live, target.files, strict=False))
        ],
        "server_before": newest.get("server_after"),
        "server_after": target.server_before,
        "restarted": target.restart,
        "flag_changes": [],
        "orch_version": __version__,
        "controller": lock_holder("rollback"),
        "created": time.time(),
        "outcome": "in_progress",
    }
    started = time.time()
    session.call("release_create", state_dir=state_dir, release_id=rid, manifest=record,
                 files=[{"path": i["path"], "n": n, "before": i.get("data") if i["exists"] else None}
                        for n, i in enumerate(live)])
    plan: dict[str, Any] = {"files": [f.to_wire() for f in target.files], "server": None, "health": None}
    if target.restart:
        # The oldest undone release's restore.json says exactly what ran before
        # it (unmasked: the manifest is the masked record for people).
        spec = session.call("get_json", path=f"{releases_dir}/{target.undo[-1]}/restore.json")
        if not spec or not spec["plan"].get("server"):
            raise HostUnsafeError(f"{label}: release {target.undo[-1]} has no restore record for its server")
        plan["server"] = spec["plan"]["server"]
        plan["health"] = spec["plan"].get("health")
    what = ", ".join(target.undo)
    reporter.step(label, f"rolling back {what}" + (" and restarting the previous server" if plan["server"] else ""))
    try:
        session.call("apply_state", on_event=_events(reporter, label), **plan)
    except (RemoteError, OrchError) as e:
        if isinstance(e, RemoteStepError) and e.details.get("log_tail"):
            reporter.server_log(label, "server log (last 40 lines)", e.details["log_tail"])
        session.call("release_update", state_dir=state_dir, release_id=rid,
                     fields={"outcome": "rollback_failed", "error": str(e)})
        raise HostUnsafeError(
            f"{label}: rollback of {what} FAILED: {e}. The host is not known to be healthy; "
            f"backups are under {releases_dir}; fix the cause and run `orch rollback --host {label}` again"
        ) from None
    finished = time.time()
    steps: list[dict[str, Any]] = [
        {"op": "release_update", "args": {"state_dir": state_dir, "release_id": rid,
                                          "fields": {"outcome": "done", "finished": finished,
                                                     "duration": round(finished - started, 3)}}},
        {"op": "put_json", "args": {"path": f"{state_dir}/state.json",
                                    "value": {"applied": list(target.new_applied)}}},
    ]
    for undone in target.undo:
        steps.append({"op": "release_update", "args": {"state_dir": state_dir, "release_id": undone,
                                                       "fields": {"undone_by": rid}}})
    session.call("batch", steps=steps)
    now_current = target.new_applied[-1] if target.new_applied else "none (the state before any release)"
    reporter.step(label, f"rolled back {what}; current release: {now_current}")
    return HostReport(label, "rolled_back", 0, release=rid, files=paths,
                      extra={"undid": list(target.undo), "current": target.new_applied[-1] if target.new_applied else None})

