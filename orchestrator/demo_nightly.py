"""``orch demo nightly``: four nights of the stand-in on this machine, in about a minute.

A sandbox in a temp dir: a local-connection host, a git repository holding
the stand-in's SGLang-like tree (the "upstream"), and the shipped nightly
spec (``playbooks/nightly.yaml``) pinned to its commit. Then:

1. the first night: build at the pin, patch with the stack (the story's
   speculation patch and a local one), start the server from ``current/``,
   probe it;
2. the same spec again: a second build whose manifest equals the first but
   for times, the build's name and the probe figures;
3. upstream moves on, the spec pins the new commit: the report names the
   change, and the trend chart has three points;
4. a night whose new server crashes at start: switched back, the previous
   night serves again.

Everything it started is stopped at the end, Ctrl-C included.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.rule import Rule

from orchestrator.cli.views import RichReporter, history_table
from orchestrator.core.inventory import resolve_hosts
from orchestrator.core.models import parse_inventory
from orchestrator.demo import free_port
from orchestrator.pipeline.inspect import history_rows, read_state
from orchestrator.pipeline.nightly import NightOptions, NightResult, nightly_host
from orchestrator.pipeline.nightly_report import write_report
from orchestrator.pipeline.session import ConnectOptions
from orchestrator.shell.config_files import packaged_dir
from orchestrator.shell.nightly_files import load_nightly
from orchestrator.standin import make_tree

PIN = "0123456789abcdef0123456789abcdef01234567"
GIT_ENV = {"GIT_AUTHOR_NAME": "orch demo", "GIT_AUTHOR_EMAIL": "demo@orch.invalid",
           "GIT_COMMITTER_NAME": "orch demo", "GIT_COMMITTER_EMAIL": "demo@orch.invalid"}


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
                          env={**os.environ, **GIT_ENV})
    return done.stdout.strip()


def _stop_server(state_dir: Path) -> None:
    pidfile = state_dir / "server.pid"
    with contextlib.suppress(OSError, ValueError):
        pid = int(pidfile.read_text().strip())
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.5)


def run_nightly_demo(*, keep: bool = False) -> int:
    console = Console(highlight=False)
    reporter = RichReporter(console)
    tmp = Path(tempfile.mkdtemp(prefix="orch-nightly-demo-"))
    state_dir, builds, reports = tmp / "state", tmp / "builds", tmp / "reports"
    port = free_port()
    upstream = tmp / "upstream"
    make_tree(upstream)
    _git(upstream, "init", "-q")
    _git(upstream, "add", "-A")
    _git(upstream, "commit", "-qm", "the stand-in tree")
    spec_dir = tmp / "playbooks"
    shutil.copytree(packaged_dir("playbooks"), spec_dir)
    spec_path = spec_dir / "nightly.yaml"
    shipped = spec_path.read_text()

    def pin(commit: str) -> None:
        spec_path.write_text(shipped.replace(PIN, commit))

    inventory = (
        "hosts:\n  sandbox:\n    connection: local\n"
        f"    state_dir: {state_dir}\n    python: {sys.executable}\n"
        f"    vars: {{source_repo: {upstream}, builds_root: {builds}, model: /models/standin, port: {port}}}\n"
    )
    target = resolve_hosts(parse_inventory(inventory, "inventory.yaml"), ["sandbox"], filename="inventory.yaml")[0]
    options = ConnectOptions()
    ok = True

    def night(title: str) -> NightResult:
        console.print(Rule(title))
        loaded = load_nightly(spec_path)
        result = nightly_host(target, loaded, {}, options, reporter, NightOptions())
        files = write_report(reports, result, loaded.model.name, loaded.display)
        console.print(f"[bold]{result.outcome}[/] (exit {result.exit_code}); report {files.json}")
        return result

    try:
        console.print(Rule("orch demo nightly: a sandbox host, an upstream git repository, a pinned spec"))
        console.print(f"sandbox: {tmp}\nspec: {spec_path} (pinned to {_git(upstream, 'rev-parse', 'HEAD')})")
        pin(_git(upstream, "rev-parse", "HEAD"))
        first = night("1. the first night: build, patch, switch, probe")
        second = night("2. the same spec again")
        ok &= first.exit_code == 0 and second.exit_code == 0
        if first.manifest and second.manifest:
            same = first.manifest.comparable() == second.manifest.comparable()
            ok &= same
            console.print(f"the two manifests are identical but for times, build name and probe: [bold]{same}[/]")
        version = upstream / "python" / "sglang" / "version.py"
        version.write_text(version.read_text().replace("0.0.0-standin", "0.0.1-standin"))
        _git(upstream, "commit", "-qam", "upstream moves on")
        pin(_git(upstream, "rev-parse", "HEAD"))
        third = night("3. upstream moved on; the spec pins the new commit")
        ok &= third.exit_code == 0
        if third.manifest and third.last_good:
            from orchestrator.core.nightly import manifest_changes

            for change in manifest_changes(third.last_good, third.manifest):
                console.print(f"  changed since the last good night: {change.text}")
        crashing = 'PYTHONDONTWRITEBYTECODE: "1", STANDIN_CRASH_AT_START: "1"}'
        spec_path.write_text(spec_path.read_text().replace('PYTHONDONTWRITEBYTECODE: "1"}', crashing))
        fourth = night("4. a night whose new server crashes at start (a stand-in switch)")
        ok &= fourth.exit_code == 1
        console.print(Rule("orch history"))
        console.print(history_table(target.name, history_rows(read_state(target, options))))
        console.print(f"page: {reports / target.name / 'index.html'}\nchart: {reports / target.name / 'trend.svg'}")
        console.print("[bold green]demo finished as expected[/]" if ok else "[bold red]demo went wrong[/]")
        return 0 if ok else 1
    except KeyboardInterrupt:
        console.print("[yellow]interrupted; stopping everything the demo started[/]")
        return 1
    finally:
        _stop_server(state_dir)
        if keep:
            console.print(f"sandbox kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
