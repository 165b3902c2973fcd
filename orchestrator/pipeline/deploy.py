"""One deploy on one host, as the contract's nine steps.

1 connect and lock · 2 plan · 3 stage and validate · 4 back up, journal,
arm the watchdog · 5 commit · 6 verification read · 7 restart · 8 health and
confirm · 9 on any failure after 4, restore and restart what ran before.

Each step is one method of ``Deployment`` and (at most) one round trip to
the host's helper. The journal on the host says which step was reached, so
``orch rollback`` can finish a deploy whose controller or link died; the
watchdog on the host restores by itself if nobody confirms in time.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from orchestrator import __version__
from orchestrator.core.regions import view_ranges
from orchestrator.core.releases import FileState, new_release_id, prune_candidates
from orchestrator.core.secrets import redact, redact_argv, redact_env, redact_text
from orchestrator.core.target import HostTarget
from orchestrator.errors import (
    DeployFailedError,
    HostUnsafeError,
    LinkLostError,
    LockHeldError,
    OrchError,
    RemoteError,
    UnfinishedDeployError,
)
from orchestrator.pipeline.events import Reporter, RunLog
from orchestrator.pipeline.plan import (
    HostPlan,
    Staged,
    make_plan,
    server_log,
    server_pidfile,
    stage_and_validate,
)
from orchestrator.pipeline.report import HostReport
from orchestrator.pipeline.session import ConnectOptions, HostSession, controller_id, lock_holder
from orchestrator.shell.agent_client import RemoteStepError
from orchestrator.shell.config_files import LoadedPlaybook

STALE_LOCK_SECONDS = 30.0


def local_pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def open_state(
    session: HostSession, command: str, break_lock: bool, reporter: Reporter
) -> tuple[str, dict[str, Any]]:
    """State dir, lock and records in one round trip (a second one only to take over a lock)."""
    got = session.call("open_state", state_dir=session.target.state_dir, holder=lock_holder(command))
    root = got["root"]
    if not got["lock"]["acquired"]:
        take_over_lock(session, root, command, break_lock, reporter, got["lock"])
        got = session.call("open_state", state_dir=root)
    return root, got["state"]


def take_over_lock(
    session: HostSession,
    state_dir: str,
    command: str,
    break_lock: bool,
    reporter: Reporter,
    refused: dict[str, Any],
) -> None:
    """The lock was held (``refused`` is the helper's answer): take it over, or fail fast naming who holds it.

    A holder on this same machine whose process is gone is provably dead:
    its lock is taken with a note. A holder whose heartbeat stopped but
    which we cannot check (another controller) is only reported as stale,
    and taken with ``--break-lock``.
    """
    label = session.target.name
    h = refused["holder"]
    since = datetime.fromtimestamp(float(h.get("started", 0)), timezone.utc).strftime("%H:%M:%S")
    who = f"{h.get('user', '?')}@{h.get('controller', '?')} pid {h.get('pid', '?')} ({h.get('command', '?')}, since {since} UTC)"
    age = float(h.get("heartbeat_age", 0))
    if h.get("controller_id") == controller_id() and not local_pid_alive(int(h.get("pid", 0))):
        reporter.note(label, f"took the lock left by {who}: that process is gone")
    elif age > STALE_LOCK_SECONDS and not h.get("agent_alive"):
        if not break_lock:
            raise LockHeldError(
                f"{label}: stale lock held by {who}, no heartbeat for {age:.0f} s; "
                "if that deploy is really gone, pass --break-lock"
            )
        reporter.warn(label, f"breaking the stale lock of {who} (no heartbeat for {age:.0f} s)")
    else:
        raise LockHeldError(f"{label}: locked by {who}, heartbeat {age:.0f} s ago")
    again = session.call(
        "lock_acquire", state_dir=state_dir, holder=lock_holder(command), replace_token=h.get("token")
    )
    if not again["acquired"]:
        raise LockHeldError(f"{label}: the lock changed hands while taking it; try again")


def release_lock(session: HostSession, state_dir: str) -> None:
    # Best effort: if this fails, the lock's heartbeat stops when we go anyway.
    with contextlib.suppress(Exception):
        session.call("lock_release", state_dir=state_dir)


def current_release_dir(state: dict[str, Any]) -> str | None:
    """The current release's directory on the host, from a ``state_read`` answer."""
    applied = state["state"].get("applied", [])
    return f"{state['root']}/releases/{applied[-1]}" if applied else None


def refuse_unfinished(label: str, journal: dict[str, Any] | None) -> None:
    if journal and not journal.get("finished"):
        raise UnfinishedDeployError(
            f"{label}: deploy {journal.get('release')} never finished (last step: "
            f"{journal.get('step')}); run `orch rollback --host {label}` to finish restoring it"
        )


def wire_server_start(argv: list[str], cwd: str | None, env: dict[str, str] | None, replace_env: bool) -> dict[str, Any]:
    return {"argv": argv, "cwd": cwd, "env": env or {}, "replace_env": replace_env}


@dataclass
class Deployment:
    """Steps 4–9 for one planned host; ``run`` returns the host's report."""

    session: HostSession
    plan: HostPlan
    staged: list[Staged]
    state_dir: str
    state: dict[str, Any]
    reporter: Reporter
    release_id: str = ""
    release_dir: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    restart_begun: bool = False
    committed: bool = False
    started_at: float = 0.0

    @property
    def label(self) -> str:
        return self.session.target.name

    # ---------------------------------------------------------------- helpers

    def _timed(self, name: str, started: float) -> None:
        self.timings[name] = round(time.time() - started, 3)

    def _secret_values(self) -> list[str]:
        names = self.plan.playbook.secret_names
        return [str(v) for k, v in self.plan.vars.items() if k in names and v is not None]

    def _redact(self, text: str) -> str:
        return redact_text(text, self._secret_values())

    def _shown_argv(self, argv: list[str] | None) -> list[str] | None:
        return redact_argv(argv, self._secret_values()) if argv is not None else None

    def _server_spec(self) -> dict[str, Any] | None:
        rendered = self.plan.playbook.server
        if rendered is None or self.plan.server is None:
            return None
        target = self.session.target
        spec: dict[str, Any] = {
            "manager": rendered.manager,
            "pidfile": server_pidfile(target, self.plan.playbook),
            "log": server_log(target, self.plan.playbook),
            "port": self.plan.server.port,
            "stop_timeout": rendered.stop_timeout,
        }
        if rendered.manager == "commands":
            spec["stop_cmd"] = list(self.plan.server.stop or [])
            spec["start_cmd"] = list(self.plan.server.start or [])
            spec["restore_start_cmd"] = list(self.plan.server.restore_start or [])
        return spec

    def _health_wire(self, *, for_restore: bool) -> dict[str, Any] | None:
        health = self.plan.playbook.health
        if health is None:
            return None
        checks = []
        for c in health.checks:
            check: dict[str, Any] = {
                "method": c.method,
                "path": c.path,
                "json": c.json,
                "status": c.status,
                "headers": dict(c.headers or {}),
            }
            if not for_restore:  # the previous server need not know the new flag
                check["expect"] = dict(c.expect or {})
                check["body"] = c.body
            checks.append(check)
        return {
            "base_url": health.base_url,
            "checks": checks,
            "timeout": health.timeout,
            "interval": health.interval,
        }

    def _health_shown(self) -> dict[str, Any] | None:
        health = self._health_wire(for_restore=True)
        if health is not None:
            for check in health["checks"]:
                check["headers"] = {k: self._redact(v) for k, v in check["headers"].items()}
        return health

    def _restore_plan(self) -> dict[str, Any]:
        """What the watchdog, an automatic rollback or ``orch rollback`` restores."""
        files = [
            FileState(
                f.path,
                f"{self.release_dir}/files/{f.index}.before",
                f.remote.sha256,
                f.remote.mode,
                f.remote.uid,
                f.remote.gid,
            ).to_wire()
            for f in self.plan.changed_files
        ]
        plan: dict[str, Any] = {"files": files, "server": None, "health": None}
        if self.restart_begun:
            plan["server"] = self._server_wire_before()
            before = self.plan.server.before if self.plan.server else None
            if before is not None:
                plan["health"] = self._health_wire(for_restore=True)
        return plan

    def _started_record(self) -> dict[str, Any] | None:
        """The command line this release starts: a later deploy starts it again
        if the server has died by then (restore.json, unmasked)."""
        change = self.plan.server
        if change is None or change.manager != "process" or not change.after_argv:
            return None
        return wire_server_start(change.after_argv, change.after_cwd, change.after_env, change.replace_env)

    def _server_wire_before(self) -> dict[str, Any] | None:
        spec = self._server_spec()
        change = self.plan.server
        if spec is None or change is None:
            return None
        before = change.before
        if spec["manager"] == "commands":
            return {"manager": "commands", "stop": spec["stop_cmd"],
                    "start": spec["restore_start_cmd"] if before else None}
        wire = dict(spec)
        wire["start"] = (
            wire_server_start(before["argv"], before.get("cwd"), before.get("env"), True)
            if before and before.get("argv")
            else None
        )
        return wire

    def _manifest(self) -> dict[str, Any]:
        target = self.session.target
        loaded = self.plan.loaded
        change = self.plan.server
        before = change.before if change else None
        return {
            "id": self.release_id,
            "kind": "deploy",
            "host": target.name,
            "playbook": {"name": self.plan.playbook.name, "path": str(loaded.path), "sha256": loaded.sha256},
            "vars": redact(self.plan.vars, self.plan.playbook.secret_names),
            "files": [
                {
                    "path": f.path,
                    "n": f.index,
                    "existed": True,
                    "mode": f.remote.mode,
                    "uid": f.remote.uid,
                    "gid": f.remote.gid,
                    "sha256_before": f.remote.sha256,
                    "sha256_after": f.new_sha256,
                }
                for f in self.plan.changed_files
            ],
            "server_spec": self._server_spec(),
            "health": self._health_shown(),
            # A record for people: secrets masked. What a restore runs is in restore.json.
            "server_before": (
                {"argv": self._shown_argv(before.get("argv")), "cwd": before.get("cwd"),
                 "env": redact_env(before.get("env")), "pid": before.get("pid"),
                 "found_by": before.get("found_by")}
                if before else None
            ),
            "server_after": (
                {"argv": self._shown_argv(change.after_argv), "cwd": change.after_cwd,
                 "env": redact_env(change.after_env)}
                if change and change.restart else None
            ),
            "restarted": bool(change and change.restart),
            "flag_changes": [self._redact(c) for c in (change.flag_changes if change else [])],
            "orch_version": __version__,
            "controller": lock_holder("deploy"),
            "created": time.time(),
            "outcome": "in_progress",
        }

    def _journal(self, step: str, finished: bool = False) -> dict[str, Any]:
        return {
            "release": self.release_id,
            "playbook": self.plan.playbook.name,
            "step": step,
            "finished": finished,
            "time": time.time(),
            "controller": lock_holder("deploy"),
        }

    def _log_step(self, last: str) -> dict[str, Any]:
        """The op that writes this run's log into the release (secrets redacted)."""
        text = self.reporter.text() if isinstance(self.reporter, RunLog) else ""
        text += f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {'end':8} {last}\n"
        return {"op": "release_log", "args": {"state_dir": self.state_dir, "release_id": self.release_id,
                                              "text": self._redact(text)}}

    def _journal_path(self) -> str:
        return f"{self.state_dir}/journal.json"

    # ---------------------------------------------------------------- the steps

    def run(self) -> HostReport:
        self.started_at = time.time()
        now = datetime.now(timezone.utc)
        self.release_id = new_release_id(now, secrets.token_hex(2))
        self.release_dir = f"{self.state_dir}/releases/{self.release_id}"
        self.back_up_and_arm()  # step 4: from here on, a failure means restore
        try:
            self.commit()
            self.verification_read()
            self.restart_and_check()
            return self.confirm()
        except KeyboardInterrupt:
            return self.roll_back("interrupted (Ctrl-C)")
        except LinkLostError as e:
            raise self.link_lost(e) from None
        except (RemoteError, OrchError) as e:
            return self.roll_back(self._failure_text(e))

    def _failure_text(self, e: Exception) -> str:
        if isinstance(e, RemoteStepError) and e.details.get("log_tail"):
            self.reporter.server_log(self.label, "server log (last 40 lines)", e.details["log_tail"])
        return self._redact(str(e))

    def back_up_and_arm(self) -> None:
        t = time.time()
        health = self.plan.playbook.health
        budget = (health.timeout + health.confirm_timeout) if health else 600.0
        stop_timeout = self.plan.playbook.server.stop_timeout if self.plan.playbook.server else 0.0
        # commit + restart (stop_timeout) + health.timeout + confirm_timeout, and
        # a few seconds for the steps between them.
        deadline = time.time() + budget + stop_timeout + 10.0
        files = [
            {
                "path": f.path,
                "n": f.index,
                "before": base64.b64encode(f.remote.data).decode("ascii"),
                "after": base64.b64encode(f.new_bytes).decode("ascii"),
            }
            for f in self.plan.changed_files
        ]
        self.session.call(
            "batch",
            steps=[
                {"op": "release_create", "args": {"state_dir": self.state_dir, "release_id": self.release_id,
                                                  "manifest": self._manifest(), "files": files}},
                {"op": "put_json", "args": {"path": self._journal_path(), "value": self._journal("backed_up")}},
                {"op": "watchdog_arm", "args": {"state_dir": self.state_dir, "release_dir": self.release_dir,
                                                "deadline": deadline, "plan": self._restore_plan(),
                                                "python": None}},
            ],
        )
        self.deadline = deadline
        self._timed("backup", t)
        self.reporter.step(self.label, f"backed up {len(files)} file(s) into release {self.release_id}")

    def commit(self) -> None:
        if not self.staged:
            return
        t = time.time()
        wire = [{"path": s.file.path, "staged": s.staged, "sha256": s.file.new_sha256} for s in self.staged]
        self.committed = True
        self.session.call("batch", steps=[
            {"op": "commit", "args": {"files": wire}},
            {"op": "put_json", "args": {"path": self._journal_path(), "value": self._journal("committed")}},
        ])
        self._timed("commit", t)
        self.reporter.step(self.label, f"committed {len(wire)} file(s)")

    def verification_read(self) -> None:
        """Step 6: what is on the host now, changed regions with context."""
        changed = self.plan.changed_files
        if not changed:
            return
        infos = self.session.call("read", paths=[f.path for f in changed])
        for f, info in zip(changed, infos, strict=False):
            data = base64.b64decode(info.get("data") or "")
            if info.get("sha256") != f.new_sha256:
                raise RemoteError(
                    f"{f.path} reads back with sha256 {info.get('sha256')}, planned {f.new_sha256}"
                )
            text = data.decode("utf-8")
            ranges = view_ranges(f.plan.changes, len(text.splitlines()), context=3)
            self.reporter.readback(self.label, f.path, text, ranges)

    def restart_and_check(self) -> None:
        change = self.plan.server
        if change is None or not change.restart:
            return
        t = time.time()
        spec = self._server_spec()
        assert spec is not None
        self.restart_begun = True
        steps: list[dict[str, Any]] = [
            {"op": "put_json", "args": {"path": f"{self.release_dir}/restore.json",
                                        "value": {"deadline": self.deadline, "plan": self._restore_plan(),
                                                  "started": self._started_record()}}},
            {"op": "put_json", "args": {"path": self._journal_path(), "value": self._journal("restarting")}},
        ]
        if change.manager == "commands":
            if change.before is not None:
                steps.append({"op": "run_ok", "args": {"argv": spec["stop_cmd"], "timeout": spec["stop_timeout"] + 60}})
            pid_cmd = self.plan.playbook.server.pid if self.plan.playbook.server else None
            steps.append({"op": "commands_start", "args": {"start": spec["start_cmd"], "pid_cmd": pid_cmd}})
        else:
            before = change.before
            if before is not None and before.get("pid"):
                steps.append({"op": "server_stop", "args": {"pid": before["pid"], "pgid": before.get("pgid"),
                                                            "stop_timeout": spec["stop_timeout"],
                                                            "port": spec["port"]}})
            steps.append({"op": "server_start", "args": {"argv": change.after_argv, "cwd": change.after_cwd,
                                                         "env": change.after_env, "log": spec["log"],
                                                         "pidfile": spec["pidfile"],
                                                         "replace_env": change.replace_env}})
        shown = " ".join(self._shown_argv(change.after_argv) or [])
        self.reporter.step(self.label, f"restarting the server: {shown}")
        health = self._health_wire(for_restore=False)
        if health is not None:
            # In the same round trip: poll health while watching the process just started.
            steps.append({"op": "health_wait", "args": dict(health, pid="started")})
        results = self.session.call(
            "batch", steps=steps, on_event=lambda ev: self.reporter.progress(self.label, ev)
        )
        self._timed("restart", t)
        if health is None:
            return
        got = results[-1]
        self.reporter.step(self.label, f"healthy after {got['elapsed']:.1f} s ({got['polls']} polls)")

    def confirm(self) -> HostReport:
        """Step 8: disarm the watchdog (by claiming the release) and make it current."""
        applied = list(self.state.get("state", {}).get("applied", [])) + [self.release_id]
        releases = [r["id"] for r in self.state.get("releases", [])] + [self.release_id]
        keep = self.plan.playbook.keep_releases or self.session.target.keep_releases
        prune = prune_candidates(releases, applied, keep)
        applied = [r for r in applied if r not in prune]
        finished = time.time()
        got = self.session.call(
            "claim_then",
            release_dir=self.release_dir,
            who="confirmed",
            steps=[
                {"op": "release_update", "args": {"state_dir": self.state_dir, "release_id": self.release_id,
                                                  "fields": {"outcome": "deployed", "finished": finished,
                                                             "duration": round(finished - self.started_at, 3),
                                                             "timings": self.timings}}},
                {"op": "put_json", "args": {"path": f"{self.state_dir}/state.json", "value": {"applied": applied}}},
                {"op": "put_json", "args": {"path": self._journal_path(), "value": self._journal("confirmed", True)}},
                {"op": "release_prune", "args": {"state_dir": self.state_dir, "remove": prune}},
                self._log_step(f"release {self.release_id} is current"),
            ],
        )
        if got["holder"] == "watchdog":
            return self._watchdog_outcome()
        self.reporter.step(self.label, f"release {self.release_id} is current")
        return HostReport(
            self.label, "changed", 0, release=self.release_id,
            files=[f.path for f in self.plan.changed_files],
            extra={"flag_changes": self.plan.server.flag_changes if self.plan.server else []},
        )

    def _watchdog_outcome(self) -> HostReport:
        result = self.session.call("get_json", path=f"{self.release_dir}/watchdog.json")
        ok = bool(result and result.get("ok"))
        error = "the watchdog's deadline passed before the deploy could confirm; it restored the host"
        if ok:
            return HostReport(self.label, "rolled_back", 1, release=self.release_id,
                              files=[f.path for f in self.plan.changed_files], error=error)
        raise HostUnsafeError(
            f"{self.label}: the watchdog restored release {self.release_id} and that FAILED "
            f"({(result or {}).get('error', 'still running?')}); run `orch status --host {self.label}`"
        )

    def roll_back(self, reason: str) -> HostReport:
        """Step 9: restore every file, restart what ran before, check it."""
        label = self.label
        self.reporter.warn(label, f"deploy failed: {reason}; rolling back")
        files = [f.path for f in self.plan.changed_files]
        try:
            holder = self.session.call("claim", release_dir=self.release_dir, who="controller")
            if holder == "watchdog":
                return self._watchdog_outcome()
            plan = self._restore_plan()
            if not self.committed:
                plan["files"] = []  # nothing was written: leave the files alone
            self.session.call("put_json", path=self._journal_path(), value=self._journal("rolling_back"))
            self.session.call(
                "apply_state", on_event=lambda ev: self.reporter.progress(label, ev), **plan
            )
            self._cleanup_staged()
            finished = time.time()
            self.session.call(
                "batch",
                steps=[
                    {"op": "release_update", "args": {"state_dir": self.state_dir, "release_id": self.release_id,
                                                      "fields": {"outcome": "rolled_back", "error": reason,
                                                                 "finished": finished, "timings": self.timings,
                                                                 "duration": round(finished - self.started_at, 3)}}},
                    {"op": "put_json", "args": {"path": self._journal_path(),
                                                "value": self._journal("rolled_back", True)}},
                    self._log_step(f"rolled back: {reason}"),
                ],
            )
        except KeyboardInterrupt:
            raise HostUnsafeError(
                f"{label}: interrupted again during the rollback of {self.release_id}; the host may be "
                f"half-restored. The watchdog restores it by {self._deadline_text()}; or run "
                f"`orch rollback --host {label}` now"
            ) from None
        except LinkLostError as e:
            raise self.link_lost(e) from None
        except (RemoteError, OrchError) as e:
            detail = self._failure_text(e)
            try:
                self.session.call("release_update", state_dir=self.state_dir, release_id=self.release_id,
                                  fields={"outcome": "rollback_failed", "error": f"{reason}; restore: {detail}"})
                self.session.call("put_json", path=self._journal_path(), value=self._journal("rollback_failed"))
            except Exception:  # noqa: BLE001
                pass
            raise HostUnsafeError(
                f"{label}: deploy failed ({reason}) and the ROLLBACK FAILED too: {detail}. Files "
                f"{'are restored' if 'restore' not in detail else 'may be half-restored'}; the previous "
                f"server may not be running. Backups are in {self.release_dir}; run "
                f"`orch rollback --host {label}` once the cause is fixed"
            ) from None
        restored = f"{len(files)} file(s) restored" if files and self.committed else "no file to restore"
        healthy = "; the previous server is healthy" if self.restart_begun else ""
        self.reporter.step(label, f"rolled back: {restored}{healthy}")
        return HostReport(label, "rolled_back", 1, release=self.release_id, files=files, error=reason)

    def _cleanup_staged(self) -> None:
        if self.staged and not self.committed:
            self.session.call("remove", paths=[s.staged for s in self.staged])

    def _deadline_text(self) -> str:
        return datetime.fromtimestamp(self.deadline, timezone.utc).strftime("%H:%M:%S UTC")

    def link_lost(self, e: Exception) -> HostUnsafeError:
        label = self.label
        return HostUnsafeError(
            f"{label}: {e} while deploying release {self.release_id}"
            f"{' after the commit' if self.committed else ''}. The host-side watchdog restores it by "
            f"itself at {self._deadline_text()} unless confirmed; run `orch status --host {label}` "
            f"to see, or `orch rollback --host {label}` to restore now"
        )


def deploy_host(
    target: HostTarget,
    loaded: LoadedPlaybook,
    cli_vars: dict[str, Any],
    options: ConnectOptions,
    reporter: Reporter,
    *,
    check: bool = False,
) -> HostReport:
    """The whole story on one host; every error becomes this host's report."""
    label = target.name
    reporter = RunLog(reporter)
    try:
        with HostSession(target, options) as session:
            result = _deploy_in_session(session, target, loaded, cli_vars, options, reporter, check)
            result.extra["round_trips"] = session.round_trips
            result.extra["execs"] = session.execs
            return result
    except HostUnsafeError as e:
        return HostReport(label, "rollback_failed", 3, error=str(e))
    except DeployFailedError as e:
        return HostReport(label, "rolled_back", 1, error=str(e))
    except LinkLostError as e:
        return HostReport(label, "unreachable", 2, error=str(e))
    except OrchError as e:
        outcome = "unreachable" if type(e).__name__ in ("UnreachableError", "HostKeyError") else "failed"
        return HostReport(label, outcome, e.exit_code, error=str(e))  # type: ignore[arg-type]
    except KeyboardInterrupt:
        return HostReport(label, "failed", 1, error="interrupted (Ctrl-C) before anything changed")


def _deploy_in_session(
    session: HostSession,
    target: HostTarget,
    loaded: LoadedPlaybook,
    cli_vars: dict[str, Any],
    options: ConnectOptions,
    reporter: Reporter,
    check: bool,
) -> HostReport:
    label = target.name
    if check:
        return _check(session, loaded, cli_vars, reporter)
    state_dir, state = open_state(session, f"deploy {loaded.display}", options.break_lock, reporter)
    try:
        refuse_unfinished(label, state["journal"])
        if state["journal"] and state["journal"].get("step") == "restored_by_watchdog":
            reporter.note(label, f"the watchdog restored release {state['journal'].get('release')} earlier")
        plan = make_plan(session, loaded, cli_vars, current_release_dir=current_release_dir(state))
        for note in plan.notes:
            reporter.note(label, note)
        reporter.plan(label, plan)
        if not plan.changed:
            reporter.step(label, "unchanged: files and server command line already as planned")
            return HostReport(label, "unchanged", 0)
        staged = stage_and_validate(session, plan, keep=True)
        if staged:
            reporter.step(label, f"staged {len(staged)} file(s) beside their targets; validated")
        deployment = Deployment(session, plan, staged, state_dir, state, reporter)
        return deployment.run()
    finally:
        if session.agent is not None and session.agent._proc is not None:
            release_lock(session, state_dir)


def _check(
    session: HostSession, loaded: LoadedPlaybook, cli_vars: dict[str, Any], reporter: Reporter
) -> HostReport:
    label = session.target.name
    state = session.call("state_read", state_dir=session.target.state_dir)  # reads, creates nothing
    refuse_unfinished(label, state["journal"])  # --check exits 2 where a deploy would refuse
    plan = make_plan(session, loaded, cli_vars, check=True, current_release_dir=current_release_dir(state))
    reporter.plan(label, plan)
    for note in plan.notes:
        reporter.warn(label, note)
    if not plan.changed and plan.refusal is None:
        reporter.step(label, "unchanged: nothing to do")
        return HostReport(label, "unchanged", 0)
    stage_and_validate(session, plan, keep=False)
    if plan.refusal is not None:
        reporter.step(label, "validated on the host; nothing was changed (--check), but a deploy would refuse")
        return HostReport(label, "failed", 2, files=[f.path for f in plan.changed_files],
                          error=plan.refusal)
    reporter.step(label, "validated on the host; nothing was changed (--check)")
    change = plan.server
    return HostReport(
        label, "planned", 0,
        files=[f.path for f in plan.changed_files],
        notes=list(plan.notes),
        extra={"restart": bool(change and change.restart),
               "flag_changes": change.flag_changes if change else []},
    )
