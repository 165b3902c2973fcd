"""The fleet bench's "GPU boxes": N real sshd on loopback, each with its own tree and server.

Host ``i`` (1-based) is ``gpuNN`` at ``127.0.10.i``: its own ``sshd`` (from
``tests/fixtures/sshd.py``'s ``start_sshd``) on its own address and a free
port, its own copy of the stand-in tree, its own state dir, and its own
stand-in server on its own HTTP port, started by hand (as a user's server
would be) with a warm-up (``STANDIN_STARTUP_DELAY``, 1 s by default). All
the sshd share one host key and one authorized client key, so one
``known_hosts`` file serves every tool; nothing else is shared.

As in ``box.py``, sshd logs at ``LogLevel VERBOSE`` (in a ``Match all`` block:
the fixture's config already says ``INFO`` and sshd keeps the first value), so
its log has one ``Starting session:`` line per exec or subsystem channel and
one ``Accepted publickey`` per connection: the channel counter, read from each
host's own log, the same way for every tool. Sessions get ``HOME`` = a bench
home whose ``.bashrc`` sleeps ``--bashrc-delay`` once per exec (0 by default),
so this machine's own ``~/.bashrc`` (``pyenv init``, 0.1-0.7 s) is not paid.

Each sshd runs under ``subreaper.py`` (in place of the fixture's ``SSHD`` while
the fleet starts), so that what a host spends can be counted (``hostcpu.py``);
where the bench may make cgroups (root), each host's subreaper and sshd join a
cgroup of their own and every server one of servers (``hostcpu.CpuGroups``).

Everything is started in parallel (a thread pool) and every start is
registered before it can fail, so ``Fleet.stop`` tears down all of it, on
Ctrl-C too.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from box import CHANNEL_LINE, CONNECTION_LINE, REPO, Counts, slow_bashrc_text
from hostcpu import SERVER_GROUP_ENV, SERVER_SITE, CpuGroups, launcher_script, sshd_pid_below

from orchestrator.standin import launch_argv, launch_env, make_tree
from tests.fixtures import sshd as sshd_fixture
from tests.fixtures.sandbox import Sandbox, health_status, listening_pid
from tests.fixtures.sshd import SshdServer, keygen, start_sshd

__all__ = ["REPO", "Fleet", "FleetHost", "address_of", "end_leftovers", "host_name", "in_parallel", "start_fleet",
           "stop_hosts"]

START_WORKERS = 16
"""Threads that start sshd and servers at once (each start mostly waits on a port)."""
HEALTH_TIMEOUT = 60.0

T = TypeVar("T")
R = TypeVar("R")


def host_name(index: int) -> str:
    """``gpu01`` … ``gpu50``: the names an inventory range ``gpu[01:50]`` gives."""
    return f"gpu{index:02d}"


def address_of(index: int) -> str:
    """Host ``index``'s own loopback address, ``127.0.10.index`` (1 ≤ index ≤ 254)."""
    if not 1 <= index <= 254:
        raise ValueError(f"host index {index} out of 1..254")
    return f"127.0.10.{index}"


def in_parallel(fn: Callable[[T], R], items: Iterable[T], workers: int = START_WORKERS) -> list[R]:
    """``fn`` over ``items`` on a thread pool, results in order; the first exception is raised."""
    items = list(items)
    if not items:
        return []
    pool = ThreadPoolExecutor(max_workers=min(workers, len(items)))
    try:
        return list(pool.map(fn, items))
    finally:
        # On an error or Ctrl-C, start nothing more; what runs finishes (and was registered).
        pool.shutdown(wait=True, cancel_futures=True)


@dataclass
class FleetHost:
    """One host: its sshd, its box (tree, state dir, server port) and its pristine file."""

    index: int
    sshd: SshdServer
    box: Sandbox
    pristine: bytes = b""
    sshd_pid: int = 0  # sshd itself; ``sshd.process`` is the subreaper it runs under (hostcpu.py)
    groups: CpuGroups | None = None  # the hosts' and the servers' cgroups, if the bench may make them
    _reapers: list[threading.Thread] = field(default_factory=list, repr=False)

    @property
    def name(self) -> str:
        return host_name(self.index)

    @property
    def address(self) -> str:
        return self.sshd.host

    @property
    def port(self) -> int:
        """The stand-in server's HTTP port (on 127.0.0.1, the host's own localhost)."""
        return self.box.port

    @property
    def target_file(self) -> Path:
        return self.box.server_args

    @property
    def tree(self) -> Path:
        return self.box.sglang_root.parent.parent

    @property
    def reaper_pid(self) -> int:
        assert self.sshd.process is not None
        return self.sshd.process.pid

    @property
    def baseline_state_dir(self) -> Path:
        """The state dir of the other orch of ``bench_fleet.py --baseline``: each orch keeps
        its own copy of its helper, and a helper removes another version's copy."""
        return self.box.root / "state-baseline"

    @property
    def state_dirs(self) -> list[Path]:
        return [self.box.state_dir, self.baseline_state_dir]

    # -- counting -----------------------------------------------------------------

    @property
    def cpu_group(self) -> Path | None:
        """This host's cgroup: its subreaper, its sshd and all they fork (hostcpu.py)."""
        return None if self.groups is None else self.groups.group(self.name)

    @property
    def server_group(self) -> Path | None:
        """Where every host's server moves itself as it starts (``server_site``)."""
        return None if self.groups is None else self.groups.group("servers")

    def log_mark(self) -> int:
        try:
            return self.sshd.log.stat().st_size
        except OSError:
            return 0

    def counts_since(self, mark: int) -> Counts:
        with open(self.sshd.log, "rb") as f:
            f.seek(mark)
            text = f.read().decode(errors="replace")
        return Counts(text.count(CONNECTION_LINE), text.count(CHANNEL_LINE))

    # -- the server -----------------------------------------------------------------

    def server_env(self, delay: float) -> dict[str, str]:
        env = {**launch_env(self.tree), "STANDIN_STARTUP_DELAY": f"{delay:g}"}
        if self.server_group is not None:  # the server leaves its host's count as it starts
            env["PYTHONPATH"] += os.pathsep + str(SERVER_SITE)
            env[SERVER_GROUP_ENV] = str(self.server_group)
        return env

    def server_argv(self, *extra: str) -> list[str]:
        return launch_argv(sys.executable, self.tree, port=self.port, extra=list(extra))

    def start_server(self, delay: float) -> None:
        """Start the stand-in by hand with its original flags; wait until it is healthy.

        The bench reaps it as soon as it ends (a thread waits on it): otherwise a
        tool's ``while kill -0 $pid`` would wait for a zombie (see box.py).
        """
        env = dict(os.environ, **self.server_env(delay))
        self.box.hand_argv = self.server_argv()
        with open(self.box.root / "hand.log", "wb") as log:
            self.box.hand = subprocess.Popen(
                self.box.hand_argv, env=env, cwd=self.box.root, stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        reaper = threading.Thread(target=self.box.hand.wait, daemon=True)
        reaper.start()
        self._reapers.append(reaper)
        self.wait_healthy()

    def wait_healthy(self, timeout: float = HEALTH_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if health_status(self.port) == 200:
                return
            if self.box.hand is not None and self.box.hand.poll() is not None and listening_pid(self.port) is None:
                raise RuntimeError(f"{self.name}: server exited with {self.box.hand.returncode}; "
                                   f"see {self.box.root / 'hand.log'}")
            time.sleep(0.05)
        raise RuntimeError(f"{self.name}: server on port {self.port} not healthy after {timeout:g} s")

    def stop_server(self) -> None:
        """Stop whatever listens on the port (whoever started it) and any orch watchdog."""
        for wd in (w for d in self.state_dirs for w in d.glob("releases/*/watchdog.pid")):
            with contextlib.suppress(ProcessLookupError, ValueError, OSError):
                os.kill(int(wd.read_text().strip()), signal.SIGKILL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            pid = listening_pid(self.port)
            if pid is None:
                break
            sig = signal.SIGTERM if time.monotonic() < deadline - 5 else signal.SIGKILL
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            time.sleep(0.1)
        if self.box.hand is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.box.hand.wait(5)

    # -- the box ------------------------------------------------------------------

    def reset(self, delay: float) -> None:
        """Back to the start, locally and untimed: pristine file, no backups, no orch state,
        the server started by hand with its original flags."""
        self.stop_server()
        self.restore_files()
        self.start_server(delay)

    def restore_files(self) -> None:
        target = self.target_file
        target.write_bytes(self.pristine)
        for leftover in target.parent.iterdir():
            if leftover.name != target.name and leftover.name.startswith(target.name):
                leftover.unlink()  # .bak, Ansible's timestamped backups, a staged copy
        shutil.rmtree(target.parent / "__pycache__", ignore_errors=True)
        self.clear_state()

    def clear_state(self) -> None:
        """orch's releases, journal, lock and pidfile go; its copy of the helper
        (``state/helper``) stays, as on any host orch has deployed to before: only
        a host's first run pays the helper's transfer and compile."""
        for state_dir in self.state_dirs:
            if not state_dir.is_dir():
                continue
            for entry in state_dir.iterdir():
                if entry.name == "helper":
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)

    def file_sha(self) -> str:
        return hashlib.sha256(self.target_file.read_bytes()).hexdigest()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.stop_server()
        with contextlib.suppress(Exception):
            self.box.stop_all()
        self.sshd.stop()


def leftovers(workdir: Path) -> list[int]:
    """Pids of processes that belong to this fleet by their command line or environment.

    Host-side work that outlives its tool: a minimal-Fabric script still in its
    health loop when the bench was interrupted (its SSH session gone, the shell
    goes on), or a server a tool started that had not bound its port yet. They
    name the fleet's unique work dir in their argv or (servers) ``PYTHONPATH``.
    """
    mark = str(workdir).encode()
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if mark in cmdline or mark in environ:
            found.append(int(name))
    return found


def end_leftovers(workdir: Path) -> int:
    """SIGTERM, then SIGKILL, what ``leftovers`` finds; how many there were."""
    pids = leftovers(workdir)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.05)
    return len(pids)


def _alive(pid: int) -> bool:
    """Running (a zombie is not: it is only waiting for its parent)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] != b"Z"


@dataclass
class Fleet:
    """The hosts, the shared keys, and one ``known_hosts`` naming every host."""

    workdir: Path
    hosts: list[FleetHost]
    client_key: Path
    known_hosts: Path
    ssh_config: Path  # empty: no tool reads ~/.ssh/config
    startup_delay: float
    groups: CpuGroups | None = None  # hostcpu.py: how the hosts' CPU is counted

    def first(self, n: int) -> list[FleetHost]:
        return self.hosts[:n]

    def reset(self, hosts: Sequence[FleetHost], workers: int = START_WORKERS) -> None:
        in_parallel(lambda h: h.reset(self.startup_delay), hosts, workers)

    def stop(self) -> None:
        stop_hosts(self.hosts)
        end_leftovers(self.workdir)


def stop_hosts(hosts: Sequence[FleetHost]) -> None:
    """Stop ``hosts`` (a fleet's, or the registry of a start that failed), then remove
    their cgroups."""
    in_parallel(lambda h: h.stop(), hosts, START_WORKERS)
    for groups in {h.groups for h in hosts if h.groups is not None}:
        groups.remove()


def padded(source: str, lines: int) -> str:
    """``source`` grown to about ``lines`` lines with valid, never-called ``add_argument`` calls.

    The stand-in's ``server_args.py`` is ~440 lines; SGLang's is 3,900 to 8,200.
    What orch does per host (read, plan, AST check, verification views) grows
    with the file, so the bench pads each host's copy to a real size. The
    padding is a function nobody calls, appended at the end: the server starts
    as before and the story's anchors still match exactly once.
    """
    have = source.count("\n")
    calls = max(0, (lines - have - 3) // 7)
    if calls == 0:
        return source
    out = [source.rstrip("\n"), "", "", "def _orch_bench_padding(parser):  # bench/fleet.py --file-lines"]
    for i in range(calls):
        out += [
            "    parser.add_argument(",
            f'        "--orch-bench-padding-{i:04d}",',
            "        type=int,",
            "        default=0,",
            '        help="Padding: the bench makes this file as long as a real server_args.py.",',
            "    )",
            "",
        ]
    return "\n".join(out).rstrip("\n") + "\n"


PORT_RANGE = (20000, 32000)
"""Where the fleet's ports come from: below Linux's ephemeral range (32768-60999).

Other test runs on the machine take ports with ``bind(0)``, i.e. from the
ephemeral range, and some of their clean-ups stop "whatever listens on port
P" whatever the address (``tests/fixtures/sandbox.py``'s ``listening_pid``).
A fleet sshd on 127.0.10.14:44341 was killed so once, by a test whose server
had port 44341 on 127.0.0.1. Ports outside that range cannot collide so."""


def port_plan(count: int, seed: int | None = None) -> list[tuple[int, int]]:
    """``(sshd port, HTTP port)`` for hosts 1..count: all different, in ``PORT_RANGE``, and
    reserved for this process until its servers bind them.

    Each port is taken on every address (``tests.fixtures.sshd.reserve_port``): a
    test fleet or another bench picking ports meanwhile (``bench_fleet.py --quick``
    runs beside the suite's own fleets) cannot take one of ours in the minutes
    before our host starts, while our sshd and stand-in still bind it. The scan
    starts at a random place so two benches at once rarely try the same ports.
    """
    low, high = PORT_RANGE
    span = high - low
    offset = random.Random(seed).randrange(span)
    candidates = (low + (offset + k) % span for k in range(span))
    plan: list[tuple[int, int]] = []
    for _ in range(count):
        ssh = next(p for p in candidates if sshd_fixture.reserve_port(p) is not None)
        http = next(p for p in candidates if sshd_fixture.reserve_port(p) is not None)
        plan.append((ssh, http))
    return plan


def start_fleet(workdir: Path, count: int, *, startup_delay: float, bashrc_delay: float,
                file_lines: int, registry: list[FleetHost]) -> Fleet:
    """Start ``count`` hosts in parallel; each is appended to ``registry`` as soon as its
    sshd runs, so the caller can stop what was started even if a later start fails.
    Each host's ``server_args.py`` is padded to ``file_lines`` lines (see ``padded``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    home = workdir / "home"
    home.mkdir(exist_ok=True)
    (home / ".bashrc").write_text(slow_bashrc_text(bashrc_delay))
    host_key = workdir / "ssh_host_ed25519_key"
    keygen(host_key, "orch-bench-host")
    client_key = workdir / "client_ed25519"
    keygen(client_key, "orch-bench-client")
    lock = threading.Lock()
    ports = port_plan(count)
    # Each sshd runs under a subreaper, so that all a host spends can be counted (hostcpu.py).
    launcher = launcher_script(workdir, sshd_fixture.SSHD)
    groups = CpuGroups.make(f"orch-bench-{os.getpid()}-{workdir.name}")

    def start_one(index: int) -> FleetHost:
        hdir = workdir / host_name(index)
        address = address_of(index)
        ssh_port, http_port = ports[index - 1]
        sshd = start_sshd(
            hdir / "sshd", port=ssh_port, host_key=host_key, client_key=client_key, addresses=[address],
            extra_config=[f"SetEnv HOME={home}", "Match all", "    LogLevel VERBOSE"],
        )
        root = hdir / "box"
        root.mkdir(parents=True, exist_ok=True)
        box = Sandbox(root, sshd, http_port, make_tree(root / "tree"), root / "state")
        host = FleetHost(index, sshd, box, groups=groups)
        with lock:
            registry.append(host)
        host.sshd_pid = sshd_pid_below(host.reaper_pid)
        if host.cpu_group is not None and groups is not None:  # before any session: all is counted
            groups.join(host.cpu_group, [host.reaper_pid, host.sshd_pid])
        host.target_file.write_text(padded(host.target_file.read_text(), file_lines))
        host.pristine = host.target_file.read_bytes()
        host.start_server(startup_delay)
        return host

    real_sshd, sshd_fixture.SSHD = sshd_fixture.SSHD, str(launcher)  # what start_sshd runs
    try:
        hosts = in_parallel(start_one, range(1, count + 1))
    finally:
        sshd_fixture.SSHD = real_sshd
    known_hosts = workdir / "known_hosts"
    known_hosts.write_text("".join(h.sshd.known_hosts_line(h.address) for h in hosts))
    ssh_config = workdir / "ssh_config"
    ssh_config.write_text("# orch bench: this file replaces ~/.ssh/config\n")
    return Fleet(workdir, hosts, client_key, known_hosts, ssh_config, startup_delay, groups)
