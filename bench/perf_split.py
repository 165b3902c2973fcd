"""Where the hosts' CPU of a deploy goes, by process: ``bench_fleet.py`` under ``perf record``.

    python bench/perf_split.py --baseline 172d043 --ns 1 --rounds 4

Runs ``bench_fleet.py`` with the arguments given (a ``--baseline`` run: orch at
REV and this checkout, alternately) and records every measured run
system-wide with ``perf record -e cpu-clock -F 1999`` (root, ``perf`` on
PATH). Then prints, for each side's deploys (not the no-op re-runs, not the
untimed warm-up), the median milliseconds of CPU sampled in each of orch's
host processes by name: ``orch-helper`` (the helper and, until they exec,
the commands it starts), ``orch-runner``, ``orch-watchdog`` (the guard, or
an older version's watchdog). A sample is 1/1999 s of one CPU.

``bench_fleet.py``'s own table gives the totals (``hostcpu.py``: in
nanoseconds by a cgroup per host as root, else in clock ticks); this gives
the split by process, which a per-process change needs to be seen at all.
"""

from __future__ import annotations

import itertools
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import bench_fleet  # noqa: E402

HZ = 1999
PROCESSES = ("orch-helper", "orch-runner", "orch-watchdog")


def samples_by_name(data: Path) -> dict[str, int]:
    """Samples per process name in one ``perf.data``."""
    out = subprocess.run(["perf", "report", "-i", str(data), "--sort", "comm", "-q", "--stdio",
                          "-F", "sample,comm"], capture_output=True, text=True, check=True).stdout
    counts: dict[str, int] = {}
    for line in out.splitlines():
        words = line.split()
        if len(words) == 2 and words[0].isdigit():
            counts[words[1]] = int(words[0])
    return counts


def main(argv: list[str]) -> int:
    work = Path(tempfile.mkdtemp(prefix="perf-split-"))
    runs: list[tuple[str, Path]] = []  # (side, its perf.data), in the order they ran
    counter = itertools.count()
    measured = bench_fleet.measured

    def recorded(inv: bench_fleet.Invocation, outdir: Path, timeout: float, sample: float) -> object:
        side = "baseline" if "baseline" in str((inv.env or {}).get("PYTHONPATH", "")) else "this"
        data = work / f"{next(counter):03d}.data"
        perf = subprocess.Popen(["perf", "record", "-a", "-q", "-e", "cpu-clock", "-F", str(HZ), "-o", str(data)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # perf is recording before the run starts
        try:
            return measured(inv, outdir, timeout, sample)
        finally:
            time.sleep(1.0)  # the runner and the guard end just after the controller
            perf.send_signal(signal.SIGINT)
            perf.wait()
            runs.append((side, data))

    bench_fleet.measured = recorded
    code = bench_fleet.main(argv)
    # Per side, in order: the warm-up's deploy, then each round's deploy and its no-op re-run.
    by_side: dict[str, list[Path]] = defaultdict(list)
    for side, data in runs:
        by_side[side].append(data)
    print(f"\nCPU per deploy by host process, ms (median over the rounds; perf, {HZ} Hz, files in {work}):")
    print(f"{'side':10} " + " ".join(f"{p:>14}" for p in PROCESSES) + f" {'sum':>8}")
    for side, files in sorted(by_side.items()):
        deploys = files[1::2]  # after the warm-up: deploy, no-op, deploy, no-op ...
        per = {p: [samples_by_name(f).get(p, 0) * 1000 / HZ for f in deploys] for p in PROCESSES}
        cells = {p: statistics.median(v) if v else 0.0 for p, v in per.items()}
        print(f"{side:10} " + " ".join(f"{cells[p]:14.1f}" for p in PROCESSES) + f" {sum(cells.values()):8.1f}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
