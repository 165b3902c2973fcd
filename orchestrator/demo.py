"""``orch demo``: the whole story on this machine, in under a minute.

A sandbox in a temp dir: a local-connection host, a miniature SGLang-like
tree, and the stand-in server started "by hand" (as a user's would be) with
speculative decoding on — the story's box, slow under load. Then: deploy
the speculation patch with a performance gate (the before/after table:
more tokens/s at 32 concurrent requests); deploy a change that halves the
throughput, which the gate rolls back; deploy a misspelt flag, which the
pre-flight refuses before the running server is touched; deploy a server
that crashes at start and watch the automatic rollback; ``orch rollback``;
the history.
Everything it started is stopped at the end, Ctrl-C included. With
``--keep`` the sandbox stays, with ``start-server.sh`` / ``stop-server.sh``
and a README.txt, so a person can go on with ``orch`` there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from orchestrator.cli.output import Output
from orchestrator.cli.tables import draw_history
from orchestrator.cli.views import ConsoleReporter, print_summary
from orchestrator.cli.words import line
from orchestrator.core.inventory import resolve_hosts
from orchestrator.core.models import parse_inventory
from orchestrator.core.outcomes import ExitCode, Outcome, demo_exit_code
from orchestrator.pipeline.deploy import deploy_host
from orchestrator.pipeline.inspect import host_history
from orchestrator.pipeline.report import RunReport
from orchestrator.pipeline.rollback import rollback_host
from orchestrator.pipeline.session import ConnectOptions
from orchestrator.shell.config_files import load_playbook
from orchestrator.standin import launch_argv, launch_env, make_tree

GATED_PLAYBOOK = """\
# The story's patch (as in the shipped speculative-disable.yaml), with a
# performance gate: orch probes the server before stopping it and the new
# one once it is healthy, prints the before/after table, and rolls back when
# a rule fails (docs/GATE.md). The baseline is the current release's
# recorded probe where there is one.
name: speculative-disable-gated
vars: {threshold: 8, port: 30000, slowdown: 1}
files:
  - path: "{{ sglang_root }}/srt/server_args.py"
    edits:
      - add_flag:
          name: speculative_disable_batch_threshold
          type: int
          default: null
          help: "Disable speculation when decode batch size exceeds this threshold."
          near: speculative_accept_threshold_acc
    validate: [python-syntax]
server:
  manager: process
  flags: {"--speculative-disable-batch-threshold": "{{ threshold }}"}
  # The stand-in's switch that makes every decode step N times slower: the
  # demo sets it to 2 to play a change that regresses (orch never reads it).
  env: {STANDIN_SLOWDOWN: "{{ slowdown }}"}
health:
  base_url: "http://127.0.0.1:{{ port }}"
  timeout: 5m
  interval: 0.2s
  stable_for: 1s
  checks:
    - get: /health
    - get: /get_server_info
      expect: {speculative_disable_batch_threshold: "{{ threshold }}"}
gate:
  probes:
    - post: /generate
      json: {text: "The gate's prompt", sampling_params: {max_new_tokens: 8}}
      requests: 32
      concurrency: 32          # under load: where speculation costs throughput
      warmup: 32               # one full batch first, not counted
      rounds: 3                # the median is compared; the rounds' range is the noise
      timeout: 30s
  rules:
    tokens_per_s: {min_ratio: 0.95}
    p99_ms: {max_ratio: 1.10}
    errors: 0
    greedy: same             # the same text at temperature 0
"""

SPECULATION = ["--speculative-algorithm", "EAGLE"]
"""How the demo's server is started by hand: speculative decoding on, as in the story."""


BAD_FLAG_PLAYBOOK = """\
# A flag this server does not know. Before stopping the running server, orch
# runs the server's own parser on the new command line (the pre-flight): it
# says `error: unrecognized arguments`, and the running server is never touched.
name: bad-flag
vars: {port: 30000}
files: []
server:
  manager: process
  flags: {"--speculative-disable-batch-treshold": 8}   # typo: "treshold"
health:
  base_url: "http://127.0.0.1:{{ port }}"
  timeout: 5m
  interval: 0.2s
  checks:
    - get: /health
"""


BAD_PATCH_PLAYBOOK = """\
# A patch that compiles, passes the structural check and the pre-flight (the
# parser never imports this module), and still breaks the server at start:
# orch sees the new server exit, shows its log, restores the file and
# restarts the previous command line by itself.
name: bad-patch
files:
  - path: "{{ sglang_root }}/srt/entrypoints/http_server.py"
    edits:
      - content: |
          raise RuntimeError("this patch breaks the server at start")
        after: "logger = logging.getLogger(__name__)"
    validate: [python-syntax]
server:
  manager: process
health:
  base_url: "http://127.0.0.1:{{ port }}"
  timeout: 5m
  interval: 0.2s
  stable_for: 1s           # the restored server, too, must stay healthy this long
  checks:
    - get: /health
"""


def gate_row(gate: dict[str, Any] | None, rule: str) -> dict[str, Any] | None:
    """The row of ``rule`` in a host report's ``gate`` object."""
    return next((c for c in (gate or {}).get("checks", []) if c.get("rule") == rule), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wait_healthy(port: int, timeout: float = 30.0) -> bool:
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def listening_pid(port: int) -> int | None:
    """The pid listening on ``port`` (read from /proc, as orch's helper finds a server)."""
    from orchestrator.host.processes import pid_listening_on

    return pid_listening_on(port)


def stop_release_processes(state_dir: Path) -> None:
    """Kill the guards and runners a release left in ``state_dir`` (a demo or a test cut
    short mid-release), by the pids their release recorded. They go before the server: a
    runner at work would start a server again (its restore) after it was stopped. The guard
    before its runner, so that it does not restore when the runner dies; the runner with its
    process group (what its step runs)."""
    for pidfile in state_dir.glob("releases/*/watchdog.pid"):
        with contextlib.suppress(ProcessLookupError, PermissionError, ValueError, OSError):
            os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)
    for record in state_dir.glob("releases/*/runner.json"):
        with contextlib.suppress(ProcessLookupError, PermissionError, ValueError, KeyError, TypeError, OSError):
            os.killpg(int(json.loads(record.read_text())["pid"]), signal.SIGKILL)


def kill_port_owner(port: int, state_dir: Path, also: tuple[int, ...] = (), term_seconds: float = 10.0) -> None:
    """Stop whatever the demo left — a release's guard and runner, then the server (by orch's
    pidfile and by its port) — and wait until it is gone: "everything it started is stopped"
    holds when the demo returns.

    ``also``: more servers to stop with it (a test's server started by hand). Each gets
    SIGTERM, ``term_seconds`` to go, then SIGKILL to its whole group (a worker it left
    there goes too); a pid that leads no group gets the signals itself."""
    stop_release_processes(state_dir)
    pids = set(also)
    pidfile = state_dir / "server.pid"
    if pidfile.exists():
        with contextlib.suppress(ValueError):
            pids.add(int(pidfile.read_text().strip()))
    listening = listening_pid(port)
    if listening:
        pids.add(listening)
    for sig, grace in ((signal.SIGTERM, term_seconds), (signal.SIGKILL, 10.0)):
        for pid in pids:
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        deadline = time.time() + grace
        while time.time() < deadline and any(alive(pid) for pid in pids):
            time.sleep(0.05)


def alive(pid: int) -> bool:
    """Running (a zombie is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def heading(out: Output, title: str) -> None:
    """A section title: a rule on a terminal, a plain ``== title ==`` line elsewhere."""
    if out.terminal:
        from rich.rule import Rule

        out.console.print(Rule(title))
    else:
        out.line(f"== {title} ==", "bold")


WAIT_HEALTHY = """\
import sys, time, urllib.request
for _ in range(600):
    try:
        urllib.request.urlopen("http://127.0.0.1:{port}/health", timeout=2)
        print("healthy on port {port}")
        sys.exit(0)
    except OSError:
        time.sleep(0.2)
sys.exit("not healthy after 2 minutes: see server-by-hand.log")
"""
"""What ``start-server.sh`` runs after the start: the README's next step needs a healthy server."""


def write_kept_sandbox(tmp: Path, port: int) -> None:
    """Scripts and a note that let a person go on using the sandbox after the demo."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in launch_env(tmp / "sglang").items())
    argv = shlex.join(launch_argv(sys.executable, tmp / "sglang", port=port, extra=SPECULATION))
    start = tmp / "start-server.sh"
    start.write_text(
        "#!/bin/sh\n"
        "# Start the stand-in server by hand, as a user's own server would be started.\n"
        'cd "$(dirname "$0")" || exit 1\n'
        f"{env} STANDIN_STARTUP_DELAY=1 setsid {argv} > server-by-hand.log 2>&1 < /dev/null &\n"
        "echo $! > server-by-hand.pid\n"
        f'echo "stand-in server started by hand: pid $!, port {port}, log server-by-hand.log"\n'
        "# Wait until it answers, so the next command (orch status) finds it healthy.\n"
        f"{shlex.quote(sys.executable)} -c {shlex.quote(WAIT_HEALTHY.format(port=port))} || exit 1\n"
    )
    stop = tmp / "stop-server.sh"
    stop.write_text(
        "#!/bin/sh\n"
        "# Stop the stand-in: the one started by hand, or the one orch restarted (its pidfile).\n"
        'cd "$(dirname "$0")" || exit 1\n'
        "for f in server-by-hand.pid state/server.pid; do\n"
        '  [ -f "$f" ] && kill -TERM "-$(cat "$f")" 2>/dev/null && echo "stopped group $(cat "$f")"\n'
        "done\n"
        "exit 0\n"
    )
    for script in (start, stop):
        script.chmod(0o755)
    (tmp / "README.txt").write_text(KEPT_README.format(dir=tmp, port=port))


KEPT_README = """\
The sandbox of `orch demo --keep`: host `sandbox` (connection: local) in
inventory.yaml, a miniature SGLang-like tree in sglang/, orch's state in
state/ (the demo's history). From this directory, in this order (each
comment says the exit code and what you should see):

  ./start-server.sh                                  # the stand-in, started by hand, port {port}; waits until it answers
  orch status   --host sandbox                       # exit 0: healthy, no release in effect
  orch deploy   --host sandbox --check --diff speculative-disable   # exit 0: the plan and its diff; nothing changed
  orch deploy   --host sandbox gated.yaml            # exit 0: threshold 8, gated: the before/after table
  orch status   --host sandbox --probe               # exit 0: probe now, against the release's record (inconclusive within the noise; exit 1 only if slower beyond it)
  orch deploy   --host sandbox --var slowdown=2 --var threshold=16 gated.yaml   # exit 1: rolled back by the gate
  orch deploy   --host sandbox speculative-disable   # exit 0: threshold 32, no gate; the flag's declaration is provided by gated.yaml's release
  orch deploy   --host sandbox --check bad-flag.yaml # exit 2: --check runs the pre-flight too: it refuses the flag; nothing changed
  orch deploy   --host sandbox bad-flag.yaml         # exit 1: the pre-flight refuses the flag; the running server is untouched
  orch deploy   --host sandbox bad-patch.yaml        # exit 1: crashes at start, rolled back by itself
  orch rollback --host sandbox                       # exit 0: back to threshold 8 (gated.yaml's release)
  orch rollback --host sandbox                       # exit 0: again: no flag, the original files
  orch history  --host sandbox                       # exit 0: every release above and the demo's
  ./stop-server.sh

Remove the directory when done: rm -rf {dir}
"""


def run_demo(out: Output, *, keep: bool = False) -> int:
    reporter = ConsoleReporter(out, planned_view=False)  # as `orch deploy` shows it
    tmp = Path(tempfile.mkdtemp(prefix="orch-demo-"))
    port = free_port()
    state_dir = tmp / "state"
    root = make_tree(tmp / "sglang")
    target_file = root / "srt" / "server_args.py"
    original_sha = sha256(target_file)
    (tmp / "gated.yaml").write_text(GATED_PLAYBOOK)
    (tmp / "bad-flag.yaml").write_text(BAD_FLAG_PLAYBOOK)
    (tmp / "bad-patch.yaml").write_text(BAD_PATCH_PLAYBOOK)
    inventory_text = (
        "hosts:\n"
        "  sandbox:\n"
        "    connection: local\n"
        f"    state_dir: {state_dir}\n"
        f"    python: {sys.executable}\n"
        f"    vars: {{sglang_root: {root}, model: /models/standin, port: {port}}}\n"
    )
    (tmp / "inventory.yaml").write_text(inventory_text)
    target = resolve_hosts(parse_inventory(inventory_text, str(tmp / "inventory.yaml")),
                           ["sandbox"], filename=str(tmp / "inventory.yaml"))[0]
    options = ConnectOptions(words=line)  # run.log in the words the console shows
    env = dict(os.environ, **launch_env(tmp / "sglang"), STANDIN_STARTUP_DELAY="1")
    with open(tmp / "hand-started.log", "wb") as log:
        hand = subprocess.Popen(
            launch_argv(sys.executable, tmp / "sglang", port=port, extra=SPECULATION), env=env,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    ok = True
    report = RunReport()
    try:
        heading(out, "orch demo: a sandbox host with the stand-in server")
        out.line(f"sandbox: {tmp}")
        out.line(f"stand-in server started by hand: pid {hand.pid}, port {port}, speculative decoding on")
        if not wait_healthy(port):
            out.line("the stand-in server did not come up", "red")
            return 1

        heading(out, "1. deploy the speculation patch, with a performance gate")
        gated = load_playbook(tmp / "gated.yaml")
        first = report.hosts["deploy"] = deploy_host(target, gated, {}, options, reporter)
        ok &= first.outcome == Outcome.CHANGED
        import json
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_server_info", timeout=5) as r:
            info = json.load(r)
        out.line(f"/get_server_info: speculative_disable_batch_threshold = "
                 f"{info.get('speculative_disable_batch_threshold')}", "bold")
        ok &= info.get("speculative_disable_batch_threshold") == 8
        tokens = gate_row(first.extra.get("gate"), "tokens_per_s")
        if tokens:
            out.line(f"tokens/s at 32 concurrent requests: {tokens['before']:.0f} before, {tokens['after']:.0f} "
                     f"after ({tokens['change_pct']:+.0f}%), recorded in release {first.release}", "bold")

        heading(out, "2. deploy a change that halves the throughput: the gate rolls it back")
        slow = report.hosts["regression"] = deploy_host(
            target, gated, {"slowdown": 2, "threshold": 16}, options, reporter)
        ok &= slow.outcome == Outcome.ROLLED_BACK and "tokens_per_s" in (slow.error or "")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_server_info", timeout=5) as r:
            info = json.load(r)
        out.line(f"the gate compared with release {first.release}'s record; the server runs again with "
                 f"threshold {info.get('speculative_disable_batch_threshold')}", "bold")

        heading(out, "3. deploy a misspelt flag: the pre-flight refuses it")
        serving = listening_pid(port)
        bad = load_playbook(tmp / "bad-flag.yaml")
        second = report.hosts["misspelt flag"] = deploy_host(target, bad, {"port": port}, options, reporter)
        ok &= second.outcome == Outcome.ROLLED_BACK and listening_pid(port) == serving
        out.line(f"the running server was never stopped: pid {listening_pid(port)} "
                 f"(was {serving})", "bold")

        heading(out, "4. deploy a patch that breaks the server at start: rolled back by itself")
        crash = load_playbook(tmp / "bad-patch.yaml")
        third = report.hosts["bad patch"] = deploy_host(target, crash, {"port": port}, options, reporter)
        ok &= third.outcome == Outcome.ROLLED_BACK
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_server_info", timeout=5) as r:
            info = json.load(r)
        out.line(f"after the automatic rollback the server runs again with threshold "
                 f"{info.get('speculative_disable_batch_threshold')}", "bold")

        heading(out, "5. orch rollback")
        fourth = report.hosts["rollback"] = rollback_host(target, None, options, reporter)
        ok &= fourth.exit_code == ExitCode.OK and sha256(target_file) == original_sha
        out.line(f"server_args.py sha256 equals the original: {sha256(target_file) == original_sha}")

        heading(out, "6. orch history")
        draw_history(out, host_history(target, options))
        print_summary(out, report)
        out.line("demo finished as expected" if ok else "demo went wrong",
                 "bold green" if ok else "bold red")
        return demo_exit_code(ok)
    except KeyboardInterrupt:
        out.line("interrupted; stopping everything the demo started", "yellow")
        return 1
    finally:
        kill_port_owner(port, state_dir)
        if hand.poll() is None:
            os.killpg(hand.pid, signal.SIGKILL)
        hand.wait()
        if keep:
            write_kept_sandbox(tmp, port)
            out.line(f"sandbox kept in {tmp} (its server is stopped); to go on there:", "bold")
            out.line(f"  cd {tmp} && ./start-server.sh && orch status --host sandbox")
            out.line(f"  more in {tmp / 'README.txt'} and docs/CLI.md")
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        if out.json:
            out.emit_json({"exit_code": demo_exit_code(ok), "error": None, "hosts": {},
                           "steps": {k: r.to_json() for k, r in report.hosts.items()},
                           "sandbox": str(tmp) if keep else None})
