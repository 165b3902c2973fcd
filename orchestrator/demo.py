"""``orch demo``: the whole story on this machine, in under a minute.

A sandbox in a temp dir: a local-connection host, a miniature SGLang-like
tree, and the stand-in server started "by hand" (as a user's would be).
Then: deploy the speculation playbook; deploy a flag the server rejects
at start and watch the automatic rollback; ``orch rollback``; the history.
Everything it started is stopped at the end, Ctrl-C included.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.rule import Rule

from orchestrator.cli.views import RichReporter, history_table, print_summary
from orchestrator.core.inventory import resolve_hosts
from orchestrator.core.models import parse_inventory
from orchestrator.pipeline.deploy import deploy_host
from orchestrator.pipeline.inspect import history_rows, read_state
from orchestrator.pipeline.report import RunReport
from orchestrator.pipeline.rollback import rollback_host
from orchestrator.pipeline.session import ConnectOptions
from orchestrator.shell.config_files import find_playbook, load_playbook
from orchestrator.standin import launch_argv, launch_env, make_tree

BAD_FLAG_PLAYBOOK = """\
# A flag this server does not know: it exits at start with
# `error: unrecognized arguments`, and orch rolls back on its own.
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


def kill_port_owner(port: int, state_dir: Path) -> None:
    """Stop whatever server the demo left: by orch's pidfile, else by hand-start pid."""
    pidfile = state_dir / "server.pid"
    pids = []
    if pidfile.exists():
        with contextlib.suppress(ValueError):
            pids.append(int(pidfile.read_text().strip()))
    for pid in pids:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.5)


def run_demo(*, keep: bool = False) -> int:
    console = Console(highlight=False)
    reporter = RichReporter(console)
    tmp = Path(tempfile.mkdtemp(prefix="orch-demo-"))
    port = free_port()
    state_dir = tmp / "state"
    root = make_tree(tmp / "sglang")
    target_file = root / "srt" / "server_args.py"
    original_sha = sha256(target_file)
    (tmp / "bad-flag.yaml").write_text(BAD_FLAG_PLAYBOOK)
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
    options = ConnectOptions()
    env = dict(os.environ, **launch_env(tmp / "sglang"), STANDIN_STARTUP_DELAY="1")
    with open(tmp / "hand-started.log", "wb") as log:
        hand = subprocess.Popen(
            launch_argv(sys.executable, tmp / "sglang", port=port), env=env,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    ok = True
    try:
        console.print(Rule("orch demo: a sandbox host with the stand-in server"))
        console.print(f"sandbox: {tmp}\nstand-in server started by hand: pid {hand.pid}, port {port}")
        if not wait_healthy(port):
            console.print("[red]the stand-in server did not come up[/]")
            return 1

        console.print(Rule("1. deploy the speculation playbook"))
        spec = load_playbook(find_playbook("speculative-disable"))
        first = deploy_host(target, spec, {}, options, reporter)
        ok &= first.outcome == "changed"
        import json
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_server_info", timeout=5) as r:
            info = json.load(r)
        console.print(f"/get_server_info: speculative_disable_batch_threshold = "
                      f"[bold]{info.get('speculative_disable_batch_threshold')}[/]")
        ok &= info.get("speculative_disable_batch_threshold") == 32

        console.print(Rule("2. deploy a flag the server rejects at start"))
        bad = load_playbook(tmp / "bad-flag.yaml")
        second = deploy_host(target, bad, {"port": port}, options, reporter)
        ok &= second.outcome == "rolled_back"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_server_info", timeout=5) as r:
            info = json.load(r)
        console.print(f"after the automatic rollback the server runs again with threshold "
                      f"{info.get('speculative_disable_batch_threshold')}")

        console.print(Rule("3. orch rollback"))
        third = rollback_host(target, None, options, reporter)
        ok &= third.exit_code == 0 and sha256(target_file) == original_sha
        console.print(f"server_args.py sha256 equals the original: {sha256(target_file) == original_sha}")

        console.print(Rule("4. orch history"))
        console.print(history_table(target.name, history_rows(read_state(target, options))))
        report = RunReport({"deploy": first, "bad deploy": second, "rollback": third})
        print_summary(console, report)
        console.print("[bold green]demo finished as expected[/]" if ok else "[bold red]demo went wrong[/]")
        return 0 if ok else 1
    except KeyboardInterrupt:
        console.print("[yellow]interrupted; stopping everything the demo started[/]")
        return 1
    finally:
        kill_port_owner(port, state_dir)
        if hand.poll() is None:
            os.killpg(hand.pid, signal.SIGKILL)
        hand.wait()
        if keep:
            console.print(f"sandbox kept in {tmp}")
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
