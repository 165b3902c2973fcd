"""Run one tool and measure its whole process tree: wall time, CPU, peak memory.

    python bench/measure.py OUT.json [--sample S] -- ARGV...

Why a wrapper process of its own: CPU and memory must cover everything the
controller starts — Ansible's forked workers, its ``ssh`` clients and the
``ControlPersist`` masters that daemonize away from Ansible, pyinfra's and
Fabric's threads — and nothing else (not the bench's own sshd and servers).

- The wrapper makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``):
  a descendant that is orphaned (a daemonized ``ssh`` master) is re-parented to
  the wrapper instead of PID 1, so it stays in the tree and is reaped here.
- **Wall** time is from the start of ARGV to its exit (what a user waits for).
- **CPU** is ``getrusage(RUSAGE_CHILDREN)`` (user + system) after ARGV has exited
  and every descendant still alive then has been ended (SIGTERM, then SIGKILL)
  and reaped: the kernel adds a process's CPU, and that of every child it
  reaped, to its parent when the parent reaps it — so this is the whole tree's.
  The wrapper's own CPU (sampling) is not in it.
- **Memory** is sampled every S seconds (0.1 by default): the sum of ``Pss``
  (from ``/proc/PID/smaps_rollup``) over every process whose parent chain leads
  to the wrapper; the peak is reported, with the peak sum of ``Rss`` beside it.
  PSS splits shared pages between the processes that share them, so forked
  workers are not counted twice (RSS would). A sampler can miss a peak shorter
  than S; the figure is a lower bound, within one sample.

Writes OUT.json: ``{"rc", "wall", "cpu_user", "cpu_sys", "peak_pss_kb",
"peak_rss_kb", "peak_procs", "samples", "stdout", "stderr"}`` (output tails).
Exits 0 when it could measure (whatever ARGV's exit code, which is in ``rc``).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass

PR_SET_CHILD_SUBREAPER = 36
TAIL = 4000


@dataclass
class Measured:
    rc: int
    wall: float
    cpu_user: float
    cpu_sys: float
    peak_pss_kb: int
    peak_rss_kb: int
    peak_procs: int
    samples: int
    stdout: str
    stderr: str


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def parents() -> dict[int, int]:
    """pid -> ppid for every process now (processes that vanish while read are skipped)."""
    out: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces or parentheses, so split after the last ')'
        fields = stat[stat.rfind(b")") + 2:].split()
        out[int(name)] = int(fields[1])
    return out


def descendants(root: int, ppid_of: dict[int, int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in ppid_of.items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def memory_kb(pid: int) -> tuple[int, int]:
    """(Pss, Rss) of one process in kB; (0, 0) if it is gone or a zombie."""
    pss = rss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    pss = int(line.split()[1])
                elif line.startswith(b"Rss:"):
                    rss = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return pss, rss


class Sampler(threading.Thread):
    """Samples the tree under this process until stopped; keeps the peaks."""

    def __init__(self, interval: float) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.stopped = threading.Event()
        self.peak_pss = self.peak_rss = self.peak_procs = self.samples = 0

    def run(self) -> None:
        me = os.getpid()
        while not self.stopped.is_set():
            pids = descendants(me, parents())
            pss = rss = 0
            for pid in pids:
                p, r = memory_kb(pid)
                pss += p
                rss += r
            self.peak_pss = max(self.peak_pss, pss)
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_procs = max(self.peak_procs, len(pids))
            self.samples += 1
            self.stopped.wait(self.interval)


def end_leftovers(grace: float = 5.0) -> None:
    """End every descendant still alive (ARGV has exited), then reap all of them."""
    me = os.getpid()
    left = descendants(me, parents())
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # nothing left to reap
        if pid == 0:
            if not descendants(me, parents()):
                break
            time.sleep(0.02)
    for pid in descendants(me, parents()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def tail(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read()
    return data[-TAIL:].decode(errors="replace")


def measure(argv: list[str], sample: float) -> Measured:
    become_subreaper()
    with tempfile.TemporaryDirectory(prefix="orch-measure-") as tmp:
        out_path, err_path = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            sampler = Sampler(sample)
            start = time.perf_counter()
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
            sampler.start()
            rc = proc.wait()
            wall = time.perf_counter() - start
            sampler.stopped.set()
            sampler.join()
        end_leftovers()
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return Measured(rc, wall, usage.ru_utime, usage.ru_stime, sampler.peak_pss, sampler.peak_rss,
                        sampler.peak_procs, sampler.samples, tail(out_path), tail(err_path))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(args: list[str]) -> int:
    if "--" not in args or args.index("--") < 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    split = args.index("--")
    opts, argv = args[:split], args[split + 1:]
    out_file = opts[0]
    sample = float(opts[opts.index("--sample") + 1]) if "--sample" in opts else 0.1
    # The bench ends a run by SIGTERM on timeout or Ctrl-C: leave no tree behind then either.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        result = measure(argv, sample)
    except KeyboardInterrupt:
        end_leftovers(grace=2.0)
        return 130
    with open(out_file, "w") as f:
        json.dump(asdict(result), f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
