"""Planning a 50 MB target: time and peak memory, this checkout against an older engine.

Issue 6, defect 14: planning the story's two edits on a 50 MB ``.py`` target
took 224 s and 4.7 GB, because the file was parsed and tokenized three
times over (planning, then twice more in the structural check). This bench
builds such a target — filler functions, then the stand-in's
``server_args.py`` at the END (the worst case: everything before the change
must be read to know where statements start) — and, in a fresh process per
engine, plans both edits with ``plan_file`` and runs ``check_structure``,
exactly what ``orch deploy --check`` does with the text on the controller.

The old engine is the ``orchestrator/`` package of ``--baseline`` (default:
the merge-base with ``main``), taken out of git with ``git archive`` into a
temporary directory; both run the same story (text anchors, which both
understand). It prints seconds and peak RSS per engine and the ratios.

    python bench/bench_bigfile.py                  # 50 MB, baseline = merge-base with main
    python bench/bench_bigfile.py --size-mb 10 --baseline 86c5fa6
    python bench/bench_bigfile.py --no-baseline    # only this checkout

Writes nothing outside a temporary directory; exits 0 unless an engine fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STANDIN = REPO / "orchestrator" / "standin" / "tree" / "python" / "sglang" / "srt" / "server_args.py"
FILLER = (
    "\n\ndef helper_{i}(parser, group):\n"
    "    parser.add_argument(\n"
    "        '--option-{i}',\n"
    "        type=int,\n"
    "        default={i},\n"
    "        help='Filler option {i}: a multi-line call like the real file has.',\n"
    "    )\n"
    "    return group\n"
)

# Run in the child: one engine (whichever ``orchestrator`` is first on sys.path), one plan.
CHILD = r"""
import json, resource, sys, time
from orchestrator.core.edit_spec import Anchor, EditSpec
from orchestrator.core.edits import plan_file
from orchestrator.core.structure import check_structure
path = sys.argv[1]
text = open(path, encoding="utf-8").read()
edits = [
    EditSpec(kind="insert", text="speculative_disable_batch_threshold: Optional[int] = None\n",
             anchor=Anchor("after", "speculative_accept_threshold_acc:"), marker_id="field"),
    EditSpec(kind="insert",
             text='parser.add_argument(\n    "--speculative-disable-batch-threshold",\n    type=int,\n'
                  '    default=ServerArgs.speculative_disable_batch_threshold,\n    help="x",\n)\n',
             anchor=Anchor("after", '"--speculative-accept-threshold-acc"'), marker_id="argument"),
]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
plan = plan_file(path, text, edits)
planned = time.perf_counter()
check_structure(plan, edits)
done = time.perf_counter()
assert plan.changed and len(plan.changes) == 2
print(json.dumps({
    "plan_s": planned - started, "check_s": done - planned, "total_s": done - started,
    "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "text_mb": len(text.encode()) / 1e6,
}))
"""


def build_target(folder: Path, size_mb: float) -> Path:
    # (its future import would not be at the top of the big file: leave it out)
    tail = "\n\n" + STANDIN.read_text().replace("from __future__ import annotations\n", "")
    one = len(FILLER.format(i=100000).encode())
    count = max(0, int((size_mb * 1e6 - len(tail.encode())) / one))
    path = folder / "big_server_args.py"
    with open(path, "w", encoding="utf-8") as out:
        for start in range(0, count, 10000):
            out.write("".join(FILLER.format(i=i) for i in range(start, min(count, start + 10000))))
        out.write(tail)
    return path


def baseline_ref() -> str:
    done = subprocess.run(["git", "merge-base", "HEAD", "main"], cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit("no merge-base with main: pass --baseline REF")
    return done.stdout.strip()


def export(ref: str, folder: Path) -> Path:
    """``orchestrator/`` of ``ref`` under ``folder`` (what the child imports for the old engine)."""
    archive = subprocess.run(["git", "archive", ref, "orchestrator"], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def run(engine_root: Path, target: Path) -> dict[str, float]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(target)],
        cwd=engine_root, env={"PYTHONPATH": str(engine_root), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"engine at {engine_root} failed: {done.stderr.strip().splitlines()[-1:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall_s"] = time.perf_counter() - started
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=50.0)
    parser.add_argument("--baseline", help="git ref of the older engine (default: merge-base with main)")
    parser.add_argument("--no-baseline", action="store_true", help="measure this checkout only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="orch-bigfile-") as tmp:
        folder = Path(tmp)
        target = build_target(folder, args.size_mb)
        lines = target.read_text(encoding="utf-8").count("\n")
        print(f"target: {target.stat().st_size / 1e6:.1f} MB, {lines:,} lines; the change is at the end")
        engines = {"this checkout": REPO}
        if not args.no_baseline:
            ref = args.baseline or baseline_ref()
            old = folder / "baseline"
            old.mkdir()
            engines = {f"baseline {ref[:10]}": export(ref, old), **engines}
        results = {}
        for name, root in engines.items():
            results[name] = run(root, target)
            r = results[name]
            print(f"{name:>22}: plan {r['plan_s']:7.1f} s  check {r['check_s']:7.1f} s  "
                  f"total {r['total_s']:7.1f} s  peak {r['peak_mb']:7.0f} MB")
        if len(results) == 2:
            (_, old_r), (_, new_r) = results.items()
            print(f"{'ratio (baseline/this)':>22}: time {old_r['total_s'] / new_r['total_s']:.1f}x  "
                  f"memory {old_r['peak_mb'] / new_r['peak_mb']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
