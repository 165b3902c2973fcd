"""The hosts' CPU: user + system time of everything a host's sshd runs, read from ``/proc``.

How: each fleet host's sshd runs under ``subreaper.py`` (``launcher_script``
makes the executable that ``tests/fixtures/sshd.py`` starts in sshd's place).
Everything a run makes happen on a host is then below that one reaper: the
per-connection sshd processes, the shell, orch's helper and what it runs
(compiles, checks), and what leaves its session (the watchdog the helper
forks, a server a tool starts with ``setsid``), which is re-parented to the
reaper instead of PID 1 and reaped there.

A host's count at a moment (``tree_cpu``) is, over every live process below
the reaper, its own ``utime + stime`` plus its ``cutime + cstime`` (what the
children it reaped spent, theirs included), plus the reaper's own
``cutime + cstime`` (the orphans it reaped). The count only grows (an
exiting process's time moves into its parent's children's time when it is
reaped), so its difference over a run is what the host spent in the run.
Left out: the reaper's own time (the bench's; it sleeps in ``waitpid``), and
the subtree of each pid given in ``exclude`` — the fleet bench passes the
server listening on the host's port after the run: the stand-in's start-up
is the server's cost, not the deploy's, and the same whoever restarts it.

Counts are read when the host has ``settled``: no session left on its sshd
and nothing below the reaper but sshd and the excluded server (the watchdog
has exited), so a session still closing is not cut off half-way.

``/proc`` gives times in clock ticks (10 ms here): a no-op costs a host about
six of them, so one tick either way moved a run's median by 15 %, three times
the difference the bench is asked to decide. Where this process may make
cgroups (root), ``CpuGroups`` gives each host a cgroup of its own, which its
subreaper and sshd join as the host starts: the kernel then counts, in
nanoseconds, the CPU of every process forked below them, the reaped and the
escaped ones too. A server moves itself to a cgroup of servers as its
interpreter starts (``server_site/sitecustomize.py``, put on its
``PYTHONPATH``; orch restarts a server with the environment it had), so it
stays out of its host's count, all but its interpreter's first milliseconds,
which every tool's restart pays alike.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

SUBREAPER = Path(__file__).resolve().with_name("subreaper.py")
SERVER_SITE = Path(__file__).resolve().with_name("server_site")
SERVER_GROUP_ENV = "ORCH_BENCH_SERVER_CGROUP"  # read by server_site/sitecustomize.py
TICK = os.sysconf("SC_CLK_TCK")


def launcher_script(folder: Path, sshd: str) -> Path:
    """An executable that runs ``sshd`` with its arguments under the subreaper (sshd wants
    an absolute path to re-execute itself, which it still gets)."""
    path = folder / "sshd-under-subreaper"
    path.write_text(f'#!/bin/sh\nexec {sys.executable} {SUBREAPER} {sshd} "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@dataclass(frozen=True)
class ProcTimes:
    """One process's line of ``/proc/PID/stat``, the parts this module reads (clock ticks)."""

    pid: int
    ppid: int
    own: int  # utime + stime
    reaped: int  # cutime + cstime


def read_stat(pid: int) -> ProcTimes | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None  # gone meanwhile
    fields = raw[raw.rfind(b")") + 2:].split()  # after "pid (comm) ": state is fields[0]
    return ProcTimes(pid, int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14]))


def snapshot() -> dict[int, ProcTimes]:
    """Every process of this machine, as close to one moment as a walk of ``/proc`` gets."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            times = read_stat(int(name))
            if times is not None:
                table[times.pid] = times
    return table


def children(table: dict[int, ProcTimes]) -> dict[int, list[int]]:
    below: dict[int, list[int]] = {}
    for p in table.values():
        below.setdefault(p.ppid, []).append(p.pid)
    return below


def tree_cpu(table: dict[int, ProcTimes], reaper: int, exclude: Collection[int] = ()) -> float:
    """CPU seconds spent so far below ``reaper`` (see the module's docstring), ``exclude``'s subtrees left out."""
    root = table.get(reaper)
    if root is None:
        return 0.0
    below = children(table)
    ticks = root.reaped
    todo = [c for c in below.get(reaper, []) if c not in exclude]
    while todo:
        p = table[todo.pop()]
        ticks += p.own + p.reaped
        todo.extend(c for c in below.get(p.pid, []) if c not in exclude)
    return ticks / TICK


def unsettled(table: dict[int, ProcTimes], reaper: int, sshd: int, keep: Collection[int] = ()) -> list[int]:
    """Pids that show the host is still busy: sshd's sessions, and anything else below
    the reaper than sshd and ``keep`` (a watchdog, an orphan not yet reaped)."""
    below = children(table)
    return [*below.get(sshd, []), *(p for p in below.get(reaper, []) if p != sshd and p not in keep)]


def wait_settled(hosts: Iterable[tuple[int, int, Collection[int]]], timeout: float = 15.0) -> list[int]:
    """Wait until every ``(reaper, sshd, keep)`` host has settled; the pids still busy at the timeout."""
    hosts = list(hosts)
    deadline = time.monotonic() + timeout
    while True:
        table = snapshot()
        busy = [p for reaper, sshd, keep in hosts for p in unsettled(table, reaper, sshd, keep)]
        if not busy or time.monotonic() > deadline:
            return busy
        time.sleep(0.05)


def sshd_pid_below(reaper: int, timeout: float = 10.0) -> int:
    """The sshd the reaper started (its one child once sshd is listening)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = children(snapshot()).get(reaper, [])
        if found:
            return min(found)
        time.sleep(0.02)
    raise RuntimeError(f"no sshd below reaper {reaper}")


def listening_pids(ports: Collection[int]) -> dict[int, int]:
    """``{port: pid}`` of the processes listening on these TCP ports, in one walk of
    ``/proc`` for all of them (a fleet's N servers: N walks would take seconds at N=50)."""
    wanted = {f":{port:04X}": port for port in ports}
    by_inode: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                parts = line.split()
                port = wanted.get(parts[1][parts[1].rfind(":"):])
                if port is not None and parts[3] == "0A":  # LISTEN
                    by_inode[f"socket:[{parts[9]}]"] = port
    found: dict[int, int] = {}
    if not by_inode:
        return found
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{name}/fd"):
                port = by_inode.get(os.readlink(f"/proc/{name}/fd/{fd}"))
                if port is not None:
                    found.setdefault(port, int(name))
        except OSError:
            continue
        if len(found) == len(set(by_inode.values())):
            break
    return found


# -- the cgroup clock ---------------------------------------------------------------


def cgroup_mounts() -> list[tuple[int, Path]]:
    """``(version, mount)`` of the hierarchies that count CPU: cgroup v1's ``cpuacct``
    (nanoseconds) first, then cgroup v2 (microseconds)."""
    found: list[tuple[int, Path]] = []
    with open("/proc/self/mounts") as f:
        for line in f:
            _dev, mount, fstype, options = line.split()[:4]
            if fstype == "cgroup" and "cpuacct" in options.split(","):
                found.append((1, Path(mount)))
            elif fstype == "cgroup2":
                found.append((2, Path(mount)))
    return sorted(found)


@dataclass(frozen=True)
class CpuGroups:
    """A cgroup for each host and one for the servers, under ``top`` (made by ``make``)."""

    top: Path
    version: int

    @classmethod
    def make(cls, name: str) -> CpuGroups | None:
        """``top`` = ``<mount>/<name>``, or None where no hierarchy lets this process make
        one (not root): the hosts are then counted from ``/proc`` in clock ticks."""
        for version, mount in cgroup_mounts():
            top = mount / name
            try:
                top.mkdir()
                groups = cls(top, version)
                groups.seconds(top)  # the counter is there and readable
                groups.group("servers").mkdir()  # a server moves itself there as it starts
            except OSError:
                with contextlib.suppress(OSError):
                    top.rmdir()
                continue
            return groups
        return None

    def group(self, name: str) -> Path:
        """The cgroup ``name`` under ``top`` (a host's is made when it is joined)."""
        return self.top / name

    def join(self, group: Path, pids: Iterable[int]) -> None:
        """Move ``pids`` into ``group``, made if need be: what they fork from now on is counted there."""
        group.mkdir(exist_ok=True)
        for pid in pids:
            (group / "cgroup.procs").write_text(f"{pid}\n")

    def seconds(self, group: Path) -> float:
        """CPU seconds spent in ``group`` since it was made, exited processes included."""
        if self.version == 1:
            return int((group / "cpuacct.usage").read_text()) / 1e9
        for line in (group / "cpu.stat").read_text().splitlines():
            key, value = line.split()
            if key == "usage_usec":
                return int(value) / 1e6
        raise OSError(f"{group / 'cpu.stat'}: no usage_usec")

    def holds(self, group: Path, pid: int) -> bool:
        """Whether ``pid`` is in ``group`` now."""
        try:
            return str(pid) in (group / "cgroup.procs").read_text().split()
        except OSError:
            return False

    def remove(self, timeout: float = 15.0) -> None:
        """Remove the cgroups once the processes in them have ended: a process killed a moment
        ago (a server, an sshd) holds its cgroup until it is reaped. What still holds one at
        the timeout is said on stderr, and the cgroup stays."""
        deadline = time.monotonic() + timeout
        while True:
            left = [p for p in self.top.iterdir() if p.is_dir()] if self.top.is_dir() else []
            for path in [*left, self.top]:
                with contextlib.suppress(OSError):
                    path.rmdir()
            if not self.top.exists():
                return
            if time.monotonic() > deadline:
                held = {p.name: (p / "cgroup.procs").read_text().split() for p in left if p.exists()}
                print(f"hostcpu: cannot remove {self.top}: processes still in it {held}", file=sys.stderr)
                return
            time.sleep(0.1)
