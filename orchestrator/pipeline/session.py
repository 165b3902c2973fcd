"""One host for one run: its transport, its helper, its state directory.

Everything a step does on the host goes through ``HostSession.agent``; the
session is a context manager so the helper and the connection are closed
whatever happens.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from orchestrator import __version__
from orchestrator.core.events import Event, plain
from orchestrator.core.secrets import Masker
from orchestrator.core.target import HostTarget
from orchestrator.shell import ops
from orchestrator.shell.agent_client import LINK_TIMEOUT, Agent, EventHandler
from orchestrator.shell.ops import BatchResults, Op
from orchestrator.shell.replies import Malformed
from orchestrator.shell.transport import Transport, open_transport


@dataclass(frozen=True)
class ConnectOptions:
    accept_new_host_key: bool = False
    ssh_config_path: str | None = None
    connect_timeout: float = 10.0
    # the link's silence limit (the ``link_timeout`` setting), which the helper keeps too
    link_timeout: float = LINK_TIMEOUT
    break_lock: bool = False
    # the run's secrets (``core.secrets``): the pipeline masks its records and run.log with it,
    # and teaches it what it finds (a server's env, a restore plan), which the console then masks too
    masker: Masker = field(default_factory=Masker, compare=False)
    # how a run's events read in its ``run.log`` (``pipeline.events.RunLog``): the CLI's words
    # (``cli.words.line``), passed in because the pipeline does not import the CLI
    words: Callable[[Event], str] = field(default=plain, compare=False)


def controller_id() -> str:
    """Names this machine, so a lock's holder can be checked for being alive."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            mid = Path(path).read_text().strip()
        except OSError:
            continue
        if mid:
            return f"{socket.gethostname()}/{mid}"
    return socket.gethostname()


def lock_holder(command: str) -> dict[str, Any]:
    return {
        "user": getpass.getuser(),
        "controller": socket.gethostname(),
        "controller_id": controller_id(),
        "pid": os.getpid(),
        "started": time.time(),
        "command": command,
        "orch_version": __version__,
    }


@dataclass
class HostSession:
    target: HostTarget
    options: ConnectOptions = field(default_factory=ConnectOptions)
    transport: Transport | None = None
    agent: Agent | None = None
    state_dir: str = ""
    earlier_calls: int = 0  # round trips of connections lost before this one (``reconnect``)
    earlier_execs: int = 0

    def __enter__(self) -> HostSession:
        self.transport = open_transport(
            self.target,
            accept_new_host_key=self.options.accept_new_host_key,
            ssh_config_path=self.options.ssh_config_path,
            connect_timeout=self.options.connect_timeout,
        )
        try:
            self.transport.connect()
            self.agent = Agent(self.transport, python=self.target.python, state_dir=self.target.state_dir,
                               link_timeout=self.options.link_timeout).start()
        except BaseException:
            self.transport.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.agent is not None:
            self.agent.close()
        if self.transport is not None:
            self.transport.close()

    def reconnect(self) -> None:
        """A new connection and helper in place of a lost one (the old ones closed as they can
        be: a dead link is not waited on). Raises what connecting raises."""
        self.earlier_calls, self.earlier_execs = self.round_trips, self.execs
        with contextlib.suppress(Exception):
            self.__exit__(None, None, None)
        self.agent = None
        self.transport = None
        self.__enter__()

    def call(self, op: str, **args: Any) -> Any:
        assert self.agent is not None
        return self.agent.call(op, **args)

    def run(self, op: Op, on_event: EventHandler | None = None) -> Any:
        """One typed op, one round trip; the answer read by the op's ``parse``."""
        assert self.agent is not None
        answer = self.agent.call(op.name, on_event=on_event, **op.args)
        try:
            return op.read(answer)
        except Malformed as e:  # one line naming the host and what was wrong; the link is not used again
            raise self.agent.malformed(op.name, e) from None

    def batch(self, steps: Sequence[Op], on_event: EventHandler | None = None) -> BatchResults:
        """Several typed ops in one round trip, run in order until the first failure;
        each answer read by the ``Op`` that asked for it (``results[op]``)."""
        answers: BatchResults = self.run(ops.batch(steps), on_event)
        return answers

    def host_time(self) -> float:
        """The host's wall clock now, as its helper's hello gave it, moved on by this
        controller's monotonic clock since: what release ids, night names and every
        time orch records are stamped with. The controller's own wall clock may be
        hours off the host's, and another controller's differently: stamping with it
        misordered the records and made every deadline wrong. Off by at most the
        hello's one-way latency; the controller's clock where the helper sent no time.
        """
        agent = self.agent
        if agent is None or not isinstance(agent.info.get("time"), (int, float)):
            return time.time()
        return float(agent.info["time"]) + (time.monotonic() - agent.info_monotonic)

    @property
    def link_alive(self) -> bool:
        return self.agent is not None and self.agent.dead is None

    @property
    def round_trips(self) -> int:
        """Every round trip of the run, those of a connection lost and made again included."""
        return self.earlier_calls + (self.agent.calls if self.agent else 0)

    @property
    def execs(self) -> int:
        return self.earlier_execs + (self.transport.exec_count if self.transport else 0)


def at(when: float) -> str:
    """A moment on the host's clock (``HostSession.host_time``), said so."""
    return datetime.fromtimestamp(when, timezone.utc).strftime("%H:%M:%S UTC (host clock)")

