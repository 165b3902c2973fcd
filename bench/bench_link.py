"""A link that goes silent mid-deploy: how long until orch says so, and until the host is free again.

    python bench/bench_link.py [--baseline REV] [--rounds N]
    python bench/bench_link.py --dead-controller [--baseline REV] [--rounds N]

Issue 6 measured a stalled link reported after ~65 s (30 s of silence, then
30 s releasing the lock over the dead link, then 5 s closing) where ~30 s
was promised, and a host that stayed locked until the helper's long wait
ended. The fault suite checks the mechanism (no request waits on a dead
link; the helper gives the lock back by itself); this script gives the
figures, side by side with an earlier commit in one run.

Each round, for this checkout and for ``--baseline`` (default: the last
commit before issue 6, checked out into a temporary git worktree): a real
``sshd`` on loopback behind a TCP proxy with 20 ms each way, the stand-in
server started by hand, a flag-only deploy whose new server never becomes
healthy (health timeout 5 minutes); when the journal says ``restarting``,
the proxy stops forwarding. Measured from the stall: **reported**, when
the controller exits; **host free**, when the host's lock file is gone
(the next deploy can start). Prints the medians and the ratios; asserts
nothing. Everything listens on 127.0.0.1 and is stopped at the end.

``--dead-controller`` (issue 19): the story's patch (a file committed, the
server restarted with the new flag) on the stand-in, health timeout 20 s,
the new server ready 3 s after its start. Each round deploys twice per
variant: with the controller alive, and with it killed (``kill -9``) 1 s
after the new server started. Measured on the bench's clock, from the
moment the journal says ``committed`` to the moment the release's
manifest leaves ``in_progress``: **commit → verdict**, and the verdict
itself (``deployed``: the release stands; ``rolled_back``: a good deploy
thrown away). Prints medians; asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.standin import launch_argv, launch_env, make_tree  # noqa: E402
from tests.fixtures.proxy import TcpProxy  # noqa: E402
from tests.fixtures.sandbox import listening_pid, wait_healthy  # noqa: E402
from tests.fixtures.sshd import free_port, start_sshd  # noqa: E402

BASELINE = "86c5fa6"  # the last commit before issue 6's restore machine
GIVE_UP = 400.0  # seconds: a variant that takes longer is reported as such

PLAYBOOK = """\
name: silent-link
vars: {{port: {port}}}
files: []
server:
  manager: process
  flags: {{"--speculative-accept-threshold-acc": 0.5}}
  env: {{STANDIN_NEVER_READY: "1"}}
  stop_timeout: 5s
health:
  base_url: "http://127.0.0.1:{{{{ port }}}}"
  timeout: 5m
  checks: [{{get: /health}}]
"""


def one_round(code: Path, work: Path, sshd_port: int, host_key_pub: str, client_key: Path,
              ssh_config: Path) -> tuple[float, float, int]:
    """(seconds until reported, seconds until the host is free, exit code) for the orch in ``code``."""
    box = Path(tempfile.mkdtemp(prefix="round-", dir=work))
    tree = box / "tree"
    make_tree(tree)
    port = free_port()
    state = box / "state"
    proxy = TcpProxy(sshd_port, delay=0.02)
    known = box / "known_hosts"
    known.write_text(f"[127.0.0.1]:{proxy.port} {host_key_pub}\n")
    inventory = {"hosts": {"gpu": {"address": "127.0.0.1", "port": proxy.port, "user": "root",
                                   "identity_file": str(client_key), "known_hosts": str(known),
                                   "state_dir": str(state), "python": sys.executable}}}
    (box / "inventory.yaml").write_text(json.dumps(inventory))
    (box / "story.yaml").write_text(PLAYBOOK.format(port=port))
    env = dict(os.environ, **launch_env(tree), STANDIN_STARTUP_DELAY="0.2")
    hand = subprocess.Popen(launch_argv(sys.executable, tree, port=port), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True)
    orch = None
    try:
        wait_healthy(port)
        orch = subprocess.Popen([sys.executable, "-m", "orchestrator", "deploy", "--host", "gpu",
                                 "--ssh-config", str(ssh_config), "story.yaml"], cwd=box,
                                env=dict(os.environ, PYTHONPATH=str(code)), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        journal = state / "journal.json"
        deadline = time.time() + 120
        while time.time() < deadline:
            with contextlib.suppress(OSError, ValueError):
                if json.loads(journal.read_text()).get("step") == "restarting":
                    break
            time.sleep(0.02)
        time.sleep(0.5)  # the new server is starting; the helper is in its health wait
        proxy.stall()
        stalled = time.monotonic()
        reported = free = GIVE_UP
        while time.monotonic() - stalled < GIVE_UP:
            if reported == GIVE_UP and orch.poll() is not None:
                reported = time.monotonic() - stalled
            if free == GIVE_UP and not (state / "lock.json").exists():
                free = time.monotonic() - stalled
            if reported < GIVE_UP and free < GIVE_UP:
                break
            time.sleep(0.05)
        return reported, free, orch.returncode if orch.poll() is not None else -1
    finally:
        if orch is not None and orch.poll() is None:
            orch.kill()
        proxy.close()
        for pid in {listening_pid(port), hand.pid}:
            with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
                os.killpg(pid, signal.SIGKILL)
        hand.wait()
        for wd in state.glob("releases/*/watchdog.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(wd.read_text().strip()), signal.SIGKILL)


DEAD_PLAYBOOK_HEALTH = "20s"


def dead_round(code: Path, work: Path, sshd_port: int, host_key_pub: str, client_key: Path,
               ssh_config: Path, kill: bool) -> tuple[float, str]:
    """(seconds from the commit to the verdict, the verdict) for the orch in ``code``."""
    import yaml

    box = Path(tempfile.mkdtemp(prefix="dead-", dir=work))
    tree = box / "tree"
    root = make_tree(tree)
    port = free_port()
    state = box / "state"
    proxy = TcpProxy(sshd_port, delay=0.025)
    known = box / "known_hosts"
    known.write_text(f"[127.0.0.1]:{proxy.port} {host_key_pub}\n")
    inventory = {"hosts": {"gpu": {"address": "127.0.0.1", "port": proxy.port, "user": "root",
                                   "identity_file": str(client_key), "known_hosts": str(known),
                                   "state_dir": str(state), "python": sys.executable,
                                   "vars": {"sglang_root": str(root), "port": port}}}}
    (box / "inventory.yaml").write_text(json.dumps(inventory))
    spec = yaml.safe_load((REPO / "playbooks" / "speculative-disable.yaml").read_text())
    spec["health"].update(timeout=DEAD_PLAYBOOK_HEALTH, stable_for="1s", interval="0.2s")
    spec["server"].update(env={"STANDIN_STARTUP_DELAY": "3"}, stop_timeout="5s", free_timeout="10s")
    (box / "story.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    env = dict(os.environ, **launch_env(tree), STANDIN_STARTUP_DELAY="0.2")
    hand = subprocess.Popen(launch_argv(sys.executable, tree, port=port), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True)
    orch = None
    try:
        wait_healthy(port)
        orch = subprocess.Popen([sys.executable, "-m", "orchestrator", "deploy", "--host", "gpu",
                                 "--ssh-config", str(ssh_config), "story.yaml"], cwd=box,
                                env=dict(os.environ, PYTHONPATH=str(code)), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        journal = state / "journal.json"
        committed = killed = None
        give_up = time.monotonic() + GIVE_UP
        while time.monotonic() < give_up:
            with contextlib.suppress(OSError, ValueError, KeyError):
                if committed is None and json.loads(journal.read_text()).get("step") != "backed_up":
                    committed = time.monotonic()
                if committed is not None:
                    release = json.loads(journal.read_text())["release"]
                    outcome = json.loads((state / "releases" / release / "manifest.json").read_text())["outcome"]
                    if outcome != "in_progress":
                        return time.monotonic() - committed, str(outcome)
            if kill and killed is None and committed is not None:
                pid = listening_pid(port)
                if pid is not None and pid != hand.pid:  # the new server has started
                    time.sleep(1.0)
                    orch.kill()
                    killed = time.monotonic()
            time.sleep(0.02)
        return GIVE_UP, "none"
    finally:
        if orch is not None and orch.poll() is None:
            orch.kill()
        proxy.close()
        for pid in {listening_pid(port), hand.pid}:
            with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
                os.killpg(pid, signal.SIGKILL)
        hand.wait()
        for wd in state.glob("releases/*/watchdog.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(wd.read_text().strip()), signal.SIGKILL)


def dead_controller(args: argparse.Namespace, work: Path, variants: dict[str, Path], sshd: Any) -> None:
    results: dict[tuple[str, bool], list[tuple[float, str]]] = {(n, k): [] for n in variants for k in (False, True)}
    for _ in range(args.rounds):
        for name, code in variants.items():
            for kill in (False, True):
                got = dead_round(code, work, sshd.port, sshd.host_key_pub, sshd.client_key, sshd.ssh_config, kill)
                results[(name, kill)].append(got)
                print(f"  {name}, controller {'killed' if kill else 'alive'}: commit -> verdict {got[0]:.1f} s, "
                      f"{got[1]}", flush=True)
    print(f"\nCommit to verdict, health timeout {DEAD_PLAYBOOK_HEALTH}, 25 ms each way, medians of {args.rounds}:")
    print(f"{'variant':<24} {'alive (s)':>10} {'killed (s)':>11} {'difference':>11}  verdicts when killed")
    for name in variants:
        alive = statistics.median(r[0] for r in results[(name, False)])
        dead = statistics.median(r[0] for r in results[(name, True)])
        verdicts = ", ".join(sorted({r[1] for r in results[(name, True)]}))
        print(f"{name:<24} {alive:>10.1f} {dead:>11.1f} {dead - alive:>11.1f}  {verdicts}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dead-controller", action="store_true",
                        help="commit to verdict with the controller alive and killed after the new server starts")
    parser.add_argument("--baseline", default=BASELINE, help=f"the commit to compare with (default {BASELINE})")
    parser.add_argument("--rounds", type=int, default=1, help="rounds per variant (default 1: each takes minutes)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="orch-bench-link-") as tmp:
        work = Path(tmp)
        old = work / "baseline"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(old), args.baseline],
                       check=True, capture_output=True)
        sshd = start_sshd(work / "sshd")
        variants = {"this checkout": REPO, f"baseline {args.baseline}": old}
        if args.dead_controller:
            try:
                dead_controller(args, work, variants, sshd)
            finally:
                sshd.stop()
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)],
                               capture_output=True)
            return 0
        try:
            results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in variants}
            for _ in range(args.rounds):
                for name, code in variants.items():  # interleaved: the machine's load hits both alike
                    results[name].append(one_round(code, work, sshd.port, sshd.host_key_pub, sshd.client_key,
                                                   sshd.ssh_config))
                    print(f"  {name}: reported after {results[name][-1][0]:.1f} s, host free after "
                          f"{results[name][-1][1]:.1f} s, exit {results[name][-1][2]}", flush=True)
        finally:
            sshd.stop()
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)], capture_output=True)
    print("\nA link that stalls during the health wait (20 ms each way before it), medians:")
    print(f"{'variant':<22} {'reported (s)':>13} {'host free (s)':>14} {'exit':>5}")
    medians = {}
    for name, rows in results.items():
        reported = statistics.median(r[0] for r in rows)
        free = statistics.median(r[1] for r in rows)
        medians[name] = (reported, free)
        print(f"{name:<22} {reported:>13.1f} {free:>14.1f} {rows[-1][2]:>5}")
    now, then = list(medians.values())
    print(f"\nratio this/baseline: reported {now[0] / then[0]:.2f}, host free {now[1] / then[1]:.2f} "
          f"({GIVE_UP:.0f} s means: not within the bench's patience)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
