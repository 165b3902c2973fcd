"""What one start of orch's helper costs the host, against a baseline revision.

    python bench/bench_helper_start.py --baseline 0d66b46      # 20 starts a side
    python bench/bench_helper_start.py --baseline main --starts 40

A helper start is what every host of a fleet pays on every run before any
work: the interpreter, the bootstrap, loading the helper from the copy kept
(compiled) in the host's state dir, the ready line, then ``bye``. This bench
measures its CPU (user + system of the helper process) for orch of this
checkout and for orch at ``--baseline`` (exported with ``git archive``), in
one run, alternately: start k runs A then B, start k+1 runs B then A.

Each side is a driver process that imports its own orch (``PYTHONPATH``) and
starts the helper through orch's own public controller API, as
``tests/test_agent.py`` does: ``open_transport`` of a ``connection: local``
target and ``Agent(transport, python=..., state_dir=...).start()``, then
``close()``. It knows nothing of the helper's insides (a single module or a
package, how it is shipped and kept), so it measures either. The local
transport runs the helper as the driver's child; the driver waits for it,
and the helper's CPU is the driver's ``getrusage(RUSAGE_CHILDREN)`` after the
start minus before. Each side has its own state dir; two untimed starts per
side first (a host's first start sends the helper and keeps a copy; the
second runs that copy), so every measured start runs the kept copy.

Prints the median, min and max CPU per start for each side and the ratio
this/baseline (issue 18: at most 1.1), and the wall time of a start for
information. Exits 0, or 1 with a message if a side cannot start a helper.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))  # sibling modules, run as a script

from revisions import REPO, export, short_rev  # noqa: E402

LIMIT = 1.1

# One side's driver, run with that side's orch first on PYTHONPATH. One line in ("go", or
# "warm": also ask for the state dir, which some helpers wait for to keep their copy), one
# JSON line out per start: the helper's CPU seconds and the start's wall seconds.
DRIVER = r"""
import json, os, resource, sys, time
from orchestrator.core.target import HostTarget
from orchestrator.shell.agent_client import Agent
from orchestrator.shell.transport import open_transport

state, python = sys.argv[1], sys.argv[2]


def my_children():
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name, "rb") as f:
                    raw = f.read()
            except OSError:
                continue
            if int(raw[raw.rfind(b")") + 2:].split()[1]) == me:
                found.append(int(name))
    return found


def wait_children(timeout=10.0):
    # close() waits for the helper; whatever else it may have left is waited for too
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = my_children()
        if not left:
            return
        for pid in left:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        time.sleep(0.01)
    raise SystemExit("helper still running %.0f s after close" % timeout)


def cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_start(warm):
    transport = open_transport(HostTarget(name="local", connection="local", python=python, state_dir=state))
    transport.connect()
    try:
        before, started = cpu(), time.perf_counter()
        try:
            agent = Agent(transport, python=python, state_dir=state)
        except TypeError:  # an orch from before the kept copy
            agent = Agent(transport, python=python)
        agent.start()
        if warm:
            try:
                agent.call("state_init", state_dir=state)
            except Exception:
                pass  # an orch whose helper keeps its copy without it, or asks differently
        agent.close()
        wait_children()
        return {"cpu": cpu() - before, "wall": time.perf_counter() - started}
    finally:
        transport.close()


for line in sys.stdin:
    print(json.dumps(one_start(line.strip() == "warm")), flush=True)
"""


@dataclass
class Side:
    """One orch: where its package is, its driver, its state dir and what it measured."""

    name: str
    root: Path
    state: Path
    proc: subprocess.Popen[str] | None = None
    cpu: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    first_cpu: float = 0.0  # the untimed first start, which sends the helper

    def start_driver(self, python: str) -> None:
        self.state.mkdir(mode=0o700)
        env = dict(os.environ, PYTHONPATH=str(self.root))
        self.proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(self.state), python], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=self.root)

    def one(self, warm: bool = False) -> dict[str, float]:
        """One helper start; the driver's figures (``SystemExit`` if the driver failed)."""
        assert self.proc is not None and self.proc.stdin and self.proc.stdout
        self.proc.stdin.write("warm\n" if warm else "go\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{self.name}: its driver could not start a helper (exit {self.proc.wait()})")
        return json.loads(line)

    def measure(self) -> None:
        figures = self.one()
        self.cpu.append(figures["cpu"])
        self.wall.append(figures["wall"])

    def kept_files(self) -> int:
        """Files in the state dir: a kept copy of the helper, whatever its shape."""
        return sum(len(files) for _, _, files in os.walk(self.state))

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.stdin:
                self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def alternate(sides: Sequence[Side], starts: int) -> None:
    """``starts`` measured starts a side: A B, then B A, ..."""
    for k in range(starts):
        for side in (sides if k % 2 == 0 else list(reversed(sides))):
            side.measure()


def table(base: Side, this: Side) -> str:
    rows = [("side", "starts", "CPU ms median", "min", "max", "wall ms median")]
    for side in (base, this):
        rows.append((side.name, str(len(side.cpu)), f"{1000 * statistics.median(side.cpu):.1f}",
                     f"{1000 * min(side.cpu):.1f}", f"{1000 * max(side.cpu):.1f}",
                     f"{1000 * statistics.median(side.wall):.1f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", metavar="REV", required=True, help="git revision to compare with")
    p.add_argument("--starts", type=int, default=20, help="measured starts per side (default 20)")
    p.add_argument("--python", default=sys.executable, help="the helper's interpreter (default: this one)")
    args = p.parse_args(argv)
    if args.starts < 1:
        p.error("--starts must be at least 1")
    try:
        rev = short_rev(args.baseline)
    except ValueError as e:
        p.error(str(e))
    with tempfile.TemporaryDirectory(prefix="orch-helper-start-") as tmp:
        work = Path(tmp)
        base = Side(f"orch@{rev}", export(args.baseline, work / "baseline-src"), work / "state-baseline")
        this = Side("orch (this checkout)", REPO, work / "state-this")
        sides = [base, this]
        try:
            for side in sides:
                side.start_driver(args.python)
                side.first_cpu = side.one(warm=True)["cpu"]  # sends the helper; the host keeps a copy
                side.one()  # runs the kept copy (compiles it where the helper leaves that to the next run)
                if not side.kept_files():
                    print(f"note: {side.name} kept nothing in its state dir: each start gets the whole helper")
            alternate(sides, args.starts)
        finally:
            for side in sides:
                side.stop()
    print(f"helper start through the local transport, {args.starts} starts a side, alternately; "
          f"helper python {args.python}")
    print(table(base, this))
    print("first start (the helper sent, not kept yet), untimed: " +
          ", ".join(f"{s.name} {1000 * s.first_cpu:.1f} ms" for s in sides))
    ratio = statistics.median(this.cpu) / statistics.median(base.cpu)
    print(f"CPU per start, this/baseline (medians): {ratio:.3f} "
          f"({'within' if ratio <= LIMIT else 'above'} issue 18's {LIMIT}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
