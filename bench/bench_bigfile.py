"""A 50 MB target: planning it, and deploying it over SSH (fast and slow link), against an older engine.

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

Issue 16, item 2: the whole deploy of such a target, end to end. A 50 MB
target failed ``--check`` after 120-135 s even on loopback, and at 200 KB/s
a 2.9 MB target failed every time: a file's content went as ONE protocol
line, and each end took the time that line took for a dead link. Two more
cases, each run by the real CLI (``orch deploy`` of the same two edits, no
validator, then ``orch rollback``) over a real ``sshd`` on 127.0.0.1:
``sshd`` (``--size-mb``, direct) and ``slow`` (``--slow-size-mb``, default 3,
through ``tests/fixtures/proxy.py`` at ``--bandwidth`` bytes/s each way,
default 200,000, 20 ms each way). For each engine: the deploy's exit code,
wall seconds and the orch process's peak RSS (``wait4``); for a deploy that
succeeded, the rollback's too and whether the file is byte-identical after it.

    python bench/bench_bigfile.py                  # 50 MB, baseline = merge-base with main
    python bench/bench_bigfile.py --size-mb 10 --baseline 86c5fa6
    python bench/bench_bigfile.py --no-baseline    # only this checkout
    python bench/bench_bigfile.py --cases sshd,slow  # only the deploys

Writes nothing outside a temporary directory; exits 0 unless an engine fails.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))  # sibling modules, whatever the working directory

from revisions import baseline_ref, export  # noqa: E402

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


# The deploy: the plan bench's two edits, as a playbook of the real CLI (JSON is YAML).
PLAYBOOK = {
    "name": "big-target",
    "files": [{"path": None, "edits": [
        {"content": "speculative_disable_batch_threshold: Optional[int] = None",
         "after": "speculative_accept_threshold_acc:"},
        {"content": 'parser.add_argument(\n    "--speculative-disable-batch-threshold",\n    type=int,\n)',
         "after": '"--speculative-accept-threshold-acc"'},
    ]}],
}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def run_cli(engine_root: Path, box: Path, *args: str, timeout: float = 1800.0) -> dict[str, Any]:
    """One ``orch`` command of the engine in ``engine_root``: exit code, wall s, peak RSS (MB), last line."""
    env = dict(os.environ, PYTHONPATH=str(engine_root), NO_COLOR="1", COLUMNS="200")
    started = time.perf_counter()
    with open(box / "orch.out", "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", *args], cwd=box, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
        deadline = started + timeout
        while True:  # wait4: the rusage of this one child, whatever ran before
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
            time.sleep(0.1)
    proc.returncode = os.waitstatus_to_exitcode(status)
    text = (box / "orch.out").read_text(errors="replace").strip().splitlines()
    return {"rc": proc.returncode, "wall_s": time.perf_counter() - started, "peak_mb": usage.ru_maxrss / 1024,
            "last": text[-1] if text else ""}


def deploy_case(engine_root: Path, work: Path, name: str, size_mb: float, bandwidth: int | None) -> dict[str, Any]:
    """Deploy the two edits to a fresh ``size_mb`` target over sshd (through a proxy at ``bandwidth``
    bytes/s when given), then roll back; the figures and whether the bytes came back."""
    from tests.fixtures.proxy import TcpProxy
    from tests.fixtures.sshd import start_sshd

    box = work / name
    box.mkdir()
    target = build_target(box, size_mb)
    original = sha256(target)
    sshd = start_sshd(box / "sshd")
    proxy = TcpProxy(sshd.port, delay=0.02, bandwidth=bandwidth) if bandwidth else None
    try:
        port = proxy.port if proxy else sshd.port
        known = box / "known_hosts"
        known.write_text(f"[127.0.0.1]:{port} {sshd.host_key_pub}\n")
        inventory = {"hosts": {"gpu": {"address": "127.0.0.1", "port": port, "user": sshd.user,
                                       "identity_file": str(sshd.client_key), "known_hosts": str(known),
                                       "state_dir": str(box / "state"), "python": sys.executable}}}
        (box / "inventory.yaml").write_text(json.dumps(inventory))
        playbook = json.loads(json.dumps(PLAYBOOK))
        playbook["files"][0]["path"] = str(target)
        (box / "big.yaml").write_text(json.dumps(playbook))
        ssh = ("--ssh-config", str(sshd.ssh_config))
        result = {"size_mb": target.stat().st_size / 1e6, "deploy": run_cli(engine_root, box, "deploy", "--host",
                                                                              "gpu", *ssh, "big.yaml")}
        if result["deploy"]["rc"] == 0:
            result["changed"] = sha256(target) != original
            result["rollback"] = run_cli(engine_root, box, "rollback", "--host", "gpu", *ssh)
            result["identical"] = sha256(target) == original
        return result
    finally:
        if proxy:
            proxy.close()
        sshd.stop()


def show_deploy(name: str, engine: str, r: dict[str, Any]) -> None:
    d = r["deploy"]
    line = (f"{name:>5} {engine:>22}: {r['size_mb']:5.1f} MB  deploy exit {d['rc']}  {d['wall_s']:6.1f} s  "
            f"peak {d['peak_mb']:5.0f} MB")
    if "rollback" in r:
        b = r["rollback"]
        line += (f"  | rollback exit {b['rc']}  {b['wall_s']:6.1f} s  peak {b['peak_mb']:5.0f} MB  "
                 f"byte-identical: {'yes' if r['identical'] else 'NO'}")
    else:
        line += f"  | {d['last'][:110]}"
    print(line, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=50.0)
    parser.add_argument("--slow-size-mb", type=float, default=3.0, help="the slow link's target (default 3)")
    parser.add_argument("--bandwidth", type=int, default=200_000, help="the slow link, bytes/s each way")
    parser.add_argument("--cases", default="plan,sshd,slow", help="any of plan,sshd,slow (default: all)")
    parser.add_argument("--baseline", help="git ref of the older engine (default: merge-base with main)")
    parser.add_argument("--no-baseline", action="store_true", help="measure this checkout only")
    args = parser.parse_args()
    cases = {c.strip() for c in args.cases.split(",") if c.strip()}
    with tempfile.TemporaryDirectory(prefix="orch-bigfile-") as tmp:
        folder = Path(tmp)
        engines = {"this checkout": REPO}
        if not args.no_baseline:
            ref = args.baseline or baseline_ref()
            old = folder / "baseline"
            old.mkdir()
            engines = {f"baseline {ref[:10]}": export(ref, old), **engines}
        for case, size, bandwidth in (("sshd", args.size_mb, None), ("slow", args.slow_size_mb, args.bandwidth)):
            if case not in cases:
                continue
            for name, root in engines.items():
                work = folder / f"{case}-{len(name)}-{time.monotonic_ns()}"
                work.mkdir()
                show_deploy(case, name, deploy_case(root, work, case, size, bandwidth))
        if "plan" not in cases:
            return 0
        target = build_target(folder, args.size_mb)
        lines = target.read_text(encoding="utf-8").count("\n")
        print(f"plan target: {target.stat().st_size / 1e6:.1f} MB, {lines:,} lines; the change is at the end")
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
