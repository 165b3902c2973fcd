"""What is happening on a host right now: one view, computed once, used by every command.

A journal that says "not finished" means three different things, and
telling them apart decides whether a person should act:

- **in progress** — the lock's helper is alive and still hears its
  controller (its heartbeat is fresh: the helper renews it only while the
  controller pings). Somebody's run is working; `orch rollback` would undo
  a colleague's good deploy mid-start. Nobody may take its lock.
- **controller gone** — no such helper, but the release's watchdog is
  alive (a release armed whose controller died before its commit or
  switch, or an older orch's deploy): the host restores it by
  itself at the watchdog's time (host clock), so it is named as in
  progress, never as an error by itself; `orch rollback` restores it now.
- **unfinished** — helper and watchdog both gone: nothing on the host will
  finish it; `orch rollback` must.

``host_view`` decides this from typed records of what the host reported
(``state_read``: journal, lock, watchdog); ``status``, ``deploy``,
``--check``, ``nightly`` and ``rollback`` all read the same answer and
print the same words. Pure: no I/O, no clock but the times it is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from orchestrator.host.records import FRESH_HEARTBEAT_SECONDS as FRESH_HEARTBEAT_SECONDS
from orchestrator.host.records import HostRecords, Journal, Lock, WatchdogRecord


class HostState(str, Enum):
    IDLE = "idle"  # no run on the host, none left half-done
    IN_PROGRESS = "in_progress"
    CONTROLLER_GONE = "controller_gone"
    UNFINISHED = "unfinished"


# The host's records, defined once in ``host.records``; named here as the view has always named them.
JournalRecord = Journal
LockRecord = Lock


@dataclass(frozen=True)
class HostView:
    """The one answer to "what is going on on this host", and its words."""

    host: str
    state: HostState
    release: str | None = None
    kind: str = "deploy"
    step: str | None = None
    since: float | None = None  # the journal's (or the lock's) time: the run's controller's clock
    holder: str | None = None  # user@controller of the run in progress
    command: str | None = None  # the lock's command (a run that wrote no journal yet)
    restores_at: float | None = None  # the watchdog's time (host clock)
    guard: bool | None = None  # a runner's release: whether its guard lives (None: no runner holds it)

    @property
    def busy(self) -> bool:
        """A run is not finished: nothing new may start on the host."""
        return self.state is not HostState.IDLE

    @property
    def noun(self) -> str:
        """How the run is named: a night as a night, a rollback as one, else the release."""
        return {"night": "night", "rollback": "rollback"}.get(self.kind, "release")

    def words(self) -> str:
        """The sentence status prints and the refusals repeat."""
        if self.state is HostState.IN_PROGRESS:
            return self._in_progress_words()
        if self.state is HostState.CONTROLLER_GONE:
            does = "switches it back" if self.kind == "night" else "restores it"
            when = f"at {clock(self.restores_at)} (host clock)" if self.restores_at else "when its deadline passes"
            return (f"{self.noun} {self.release} in progress, its controller gone (last step {self.step}): the "
                    f"watchdog {does} {when}; `orch rollback --host {self.host}` restores now")
        if self.state is HostState.UNFINISHED:
            what = "night" if self.kind == "night" else self.kind
            return (f"{what} {self.release} stopped at step {self.step} and nothing on the host finishes it "
                    f"(its controller and its watchdog are gone): run `orch rollback --host {self.host}`")
        return "no run in progress"

    def _in_progress_words(self) -> str:
        since = f" since {clock(self.since)}" if self.since else ""
        # a runner whose guard died still finishes; nothing restores if it dies too
        guard = "; no guard" if self.guard is False else ""
        if self.release:
            return (f"{self.noun} {self.release} in progress (step {self.step}{since}, started by "
                    f"{self.holder}{guard})")
        return f"{self.command} in progress (no release yet{since}, started by {self.holder})"

    def refusal(self) -> str:
        """Why ``deploy``/``--check``/``nightly``/``rollback`` refuse this host (exit 2)."""
        if self.state is HostState.IN_PROGRESS:
            return f"{self.host}: {self.words()}; wait for it to end (`orch status --host {self.host}`)"
        if self.state is HostState.UNFINISHED:
            return (f"{self.host}: {self.kind} {self.release} never finished (last step: {self.step}) and nothing "
                    f"on the host finishes it; run `orch rollback --host {self.host}` to finish restoring it")
        return f"{self.host}: {self.words()}"

    def problem(self) -> str | None:
        """What this view adds to ``orch status``'s reasons for exit 3 (None: nothing by itself).
        A release its watchdog still finishes (its controller gone, or an older orch's deploy)
        is in progress, not unfinished: health now decides the exit code."""
        if self.state is HostState.UNFINISHED:
            return f"{self.kind} {self.release} unfinished"
        return None

    def to_json(self) -> dict[str, Any] | None:
        """``in_progress`` in ``--json``: None when the host is idle."""
        if self.state is HostState.IDLE:
            return None
        return {"release": self.release, "kind": self.kind, "step": self.step, "since": self.since,
                "holder": self.holder, "state": self.state.value, "restores_at": self.restores_at,
                "guard": self.guard}


def host_view(
    host: str,
    journal: JournalRecord | None,
    lock: LockRecord | None,
    watchdog: WatchdogRecord | None,
) -> HostView:
    """The host's state from its records: in progress, controller gone, unfinished, or idle.

    ``lock`` must not be the caller's own (a run that holds the lock is not
    "another run in progress").
    """
    open_journal = journal if journal is not None and not journal.finished else None
    if lock is not None and lock.hears_controller:
        if open_journal is not None:
            return HostView(host, HostState.IN_PROGRESS, open_journal.release, open_journal.kind,
                            open_journal.step, open_journal.since, lock.who, lock.command,
                            guard=_runner_guard(open_journal, lock, watchdog))
        return HostView(host, HostState.IN_PROGRESS, None, _kind_of(lock.command), None, lock.started,
                        lock.who, lock.command)
    if open_journal is None:
        return HostView(host, HostState.IDLE)
    ours = watchdog is not None and watchdog.release == open_journal.release
    if ours and watchdog is not None and watchdog.alive:
        return HostView(host, HostState.CONTROLLER_GONE, open_journal.release, open_journal.kind,
                        open_journal.step, open_journal.since, restores_at=watchdog.acts_at)
    return HostView(host, HostState.UNFINISHED, open_journal.release, open_journal.kind, open_journal.step,
                    open_journal.since)


def _runner_guard(journal: JournalRecord, lock: LockRecord, watchdog: WatchdogRecord | None) -> bool | None:
    """Whether the guard of the runner that holds ``lock`` lives; None when no runner holds it.
    The guard is the process the release armed: its ``watchdog.json`` names the guard's pid."""
    if not (lock.controller_id or "").startswith(RUNNER_PREFIX):
        return None
    if watchdog is None or watchdog.release != journal.release or not watchdog.armed:
        return None
    return watchdog.alive


def view_of_state(host: str, state: HostRecords, own_token: str | None = None) -> HostView:
    """``host_view`` over a ``state_read`` answer; ``own_token``: the lock this run holds, not another's."""
    lock = state.lock
    if lock is not None and own_token is not None and lock.token == own_token:
        lock = None
    return host_view(host, state.journal, lock, state.watchdog)


RUNNER_PREFIX = "runner@"
"""A lock a release's runner holds says ``controller_id: runner@<host>`` (``host/runner.py``)."""


class TakeOver(str, Enum):
    """What to do with a lock another run holds."""

    TAKE = "take"  # provably gone: take it with a note
    BREAK = "break"  # stale and --break-lock given: take it with a warning
    STALE = "stale"  # stale, cannot be checked: refuse, point to --break-lock
    HELD = "held"  # its helper lives: refuse


def take_over_decision(lock: LockRecord, *, same_controller: bool, holder_alive_here: bool,
                       break_lock: bool, stale_after: float) -> TakeOver:
    """Whether a lock may be taken over. A lock whose helper is alive on the host is
    never taken — not by the same-controller rule, not with ``--break-lock``: that
    helper is working (or finishing a restore), and gives the lock back itself."""
    if lock.helper_alive:
        return TakeOver.HELD
    if (lock.controller_id or "").startswith(RUNNER_PREFIX):
        return TakeOver.TAKE  # a runner's lock, its runner dead (checked on the host): provably gone
    if same_controller and not holder_alive_here:
        return TakeOver.TAKE
    if lock.heartbeat_age > stale_after:
        return TakeOver.BREAK if break_lock else TakeOver.STALE
    return TakeOver.HELD


def clock(when: float | None) -> str:
    """A time as printed: UTC, to the second."""
    if when is None:
        return "?"
    return datetime.fromtimestamp(float(when), timezone.utc).strftime("%H:%M:%S UTC")


def _kind_of(command: str) -> str:
    word = command.split()[0] if command.split() else "deploy"
    return "night" if word == "nightly" else word
