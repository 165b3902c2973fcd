"""What one helper start costs the host's CPU, with the kept copy: this checkout against another.

    python bench/bench_helper_start.py [--baseline DIR] [--starts N] [--python PY]

Issue 18 split the helper (one 3,500-line module, kept as one cached .pyc)
into the package ``orchestrator/host`` (kept as several); a start must not
cost a host more CPU than before. Each round starts the helper over the
local transport with a state dir that already holds its kept copy, lets it
say hello, and says bye: the helper's user+sys CPU is read with
``getrusage(RUSAGE_CHILDREN)`` around that, in a driver process that
imports the checkout under test. Rounds alternate between this checkout and
``--baseline`` (a source tree, default /work/main: read, never written), so
both see the same machine load. Prints each side's median (ms) and the
ratio; asserts nothing. Only local processes; nothing listens.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

DRIVER = r"""
import json, resource, sys
from orchestrator.core.target import HostTarget
from orchestrator.shell.agent_client import Agent
from orchestrator.shell.transport import open_transport

python, state, starts = sys.argv[1], sys.argv[2], int(sys.argv[3])
transport = open_transport(HostTarget(name="local", connection="local", python=python))
transport.connect()

def one():
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    agent = Agent(transport, python=python, state_dir=state).start()
    agent.close()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

agent = Agent(transport, python=python, state_dir=state).start()  # the first start keeps the copy
agent.call("state_init", state_dir=state)
agent.close()
print(json.dumps([one() for _ in range(starts)]))
"""


def measure(root: Path, python: str, state: str, starts: int) -> list[float]:
    """``starts`` helper starts' CPU seconds with the checkout at ``root``."""
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, "-c", DRIVER, python, state, str(starts)], env=env, cwd=root,
                         capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="/work/main", help="the source tree to compare with")
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4, help="alternations (starts are split among them)")
    parser.add_argument("--python", default=sys.executable, help="the host's interpreter")
    args = parser.parse_args()
    here = Path(__file__).resolve().parent.parent
    sides = {"baseline": Path(args.baseline).resolve(), "this": here}
    got: dict[str, list[float]] = {name: [] for name in sides}
    with tempfile.TemporaryDirectory() as tmp:
        states = {name: os.path.join(tmp, name) for name in sides}
        per_round = max(1, args.starts // args.rounds)
        for _ in range(args.rounds):
            for name, root in sides.items():
                got[name] += measure(root, args.python, states[name], per_round)
    medians = {name: statistics.median(values) * 1000 for name, values in got.items()}
    for name in sides:
        print(f"{name:9} {sides[name]}: median {medians[name]:.1f} ms CPU per helper start "
              f"({len(got[name])} starts, min {min(got[name]) * 1000:.1f}, max {max(got[name]) * 1000:.1f})")
    print(f"ratio this/baseline: {medians['this'] / medians['baseline']:.2f}")


if __name__ == "__main__":
    main()
