"""Hostile input: a tiny YAML alias bomb, this checkout against an earlier commit in one run.

    python bench/bench_inputs.py [--levels N] [--baseline REV]

Issue 6 measured a 416-byte playbook taking 9.4 s and 2.4 GB before it was
refused: orch's line-number walk expanded every alias. The test suite checks
the mechanism (aliases are budgeted while parsing, before anything expands:
tests/test_yaml_budget.py); this script gives the figure. The bomb nests
``--levels`` lists of nine aliases of the level below (9^levels nodes once
expanded). Each variant parses it in a fresh process (from a temporary git
worktree for the baseline) and reports the wall time, the peak memory
(ru_maxrss) and how it ended. Prints figures only; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASELINE = "86c5fa6"  # the last commit before issue 6
TIMEOUT = 300.0

PARSE = """\
import json, resource, sys, time
t = time.perf_counter()
from orchestrator.core.models import parse_playbook
from orchestrator.errors import ConfigError
path = sys.argv[1]
try:
    parse_playbook(open(path).read(), path)
    ended = "parsed"
except ConfigError as e:
    ended = "refused: " + str(e)[:120]
print(json.dumps({"seconds": time.perf_counter() - t, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "ended": ended}))
"""


def bomb(levels: int) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for n in range(1, levels):
        lines.append(f"l{n}: &l{n} [" + ", ".join([f"*l{n - 1}"] * 9) + "]")
    return "name: bomb\nvars:\n" + "".join(f"  {line}\n" for line in lines)


def run(code: Path, path: Path) -> dict[str, object]:
    try:
        done = subprocess.run([sys.executable, "-c", PARSE, str(path)], cwd=path.parent, capture_output=True,
                              text=True, timeout=TIMEOUT, env=dict(os.environ, PYTHONPATH=str(code)))
    except subprocess.TimeoutExpired:
        return {"seconds": TIMEOUT, "peak_mb": float("nan"), "ended": f"still running after {TIMEOUT:.0f} s"}
    if done.returncode != 0:
        return {"seconds": float("nan"), "peak_mb": float("nan"),
                "ended": f"crashed: {(done.stderr.strip().splitlines() or ['?'])[-1][:100]}"}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", type=int, default=7, help="nesting levels (9^levels nodes; default 7)")
    parser.add_argument("--baseline", default=BASELINE)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="orch-bench-inputs-") as tmp:
        work = Path(tmp)
        path = work / "bomb.yaml"
        path.write_text(bomb(args.levels))
        old = work / "baseline"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(old), args.baseline],
                       check=True, capture_output=True)
        try:
            rows = {"this checkout": run(REPO, path), f"baseline {args.baseline}": run(old, path)}
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)], capture_output=True)
        size = path.stat().st_size
    print(f"A {size}-byte YAML alias bomb ({args.levels} levels, 9^{args.levels} = {9 ** args.levels:,} nodes "
          "once expanded):")
    print(f"{'variant':<20} {'seconds':>9} {'peak MB':>9}  ended")
    for name, r in rows.items():
        print(f"{name:<20} {r['seconds']:>9.3f} {r['peak_mb']:>9.1f}  {r['ended']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
