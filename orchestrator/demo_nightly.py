"""``orch demo nightly``: nights of the stand-in on this machine, in about a minute.

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
4. a night whose new server crashes at start: switched back by the restore
   machine, the previous night serves again;
5. ``orch rollback``: ``current`` back to the second night's build, its
   command line restarted;
6. the history: nights beside the rollback, with source and tokens/s.

Everything it started is stopped at the end, Ctrl-C included.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from orchestrator.cli.output import Output
from orchestrator.cli.tables import draw_history
from orchestrator.cli.views import ConsoleReporter, print_summary
from orchestrator.core.inventory import resolve_hosts
from orchestrator.core.models import parse_inventory
from orchestrator.core.nightly import manifest_changes
from orchestrator.demo import free_port, heading, kill_port_owner
from orchestrator.pipeline.inspect import host_history
from orchestrator.pipeline.nightly import NightOptions, NightResult, nightly_host
from orchestrator.pipeline.nightly_report import write_report
from orchestrator.pipeline.report import RunReport
from orchestrator.pipeline.rollback import rollback_host
from orchestrator.pipeline.session import ConnectOptions
from orchestrator.shell.config_files import packaged_dir
from orchestrator.shell.nightly_files import load_nightly
from orchestrator.standin import make_tree

PIN = "0123456789abcdef0123456789abcdef01234567"
"""The placeholder commit of the shipped spec; the demo pins its own upstream's."""
GIT_ENV = {"GIT_AUTHOR_NAME": "orch demo", "GIT_AUTHOR_EMAIL": "demo@orch.invalid",
           "GIT_COMMITTER_NAME": "orch demo", "GIT_COMMITTER_EMAIL": "demo@orch.invalid"}


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
                          env={**os.environ, **GIT_ENV})
    return done.stdout.strip()


def run_nightly_demo(out: Output, *, keep: bool = False) -> int:
    reporter = ConsoleReporter(out, planned_view=False)  # as `orch nightly` shows it
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
    (tmp / "inventory.yaml").write_text(inventory)
    target = resolve_hosts(parse_inventory(inventory, "inventory.yaml"), ["sandbox"], filename="inventory.yaml")[0]
    options = ConnectOptions()
    report = RunReport()
    ok = True

    def night(key: str, title: str) -> NightResult:
        heading(out, title)
        loaded = load_nightly(spec_path)
        result = nightly_host(target, loaded, {}, options, reporter, NightOptions())
        files = write_report(reports, result, loaded.model.name, loaded.display)
        report.hosts[key] = result.host_report()
        out.line(f"{result.outcome} (exit {result.exit_code}); report {files.json}", "bold")
        return result

    try:
        heading(out, "orch demo nightly: a sandbox host, an upstream git repository, a pinned spec")
        out.line(f"sandbox: {tmp}")
        pin(_git(upstream, "rev-parse", "HEAD"))
        out.line(f"spec: {spec_path} (pinned to {_git(upstream, 'rev-parse', 'HEAD')})")
        first = night("night 1", "1. the first night: build, patch, switch, probe")
        second = night("night 2", "2. the same spec again")
        ok &= first.exit_code == 0 and second.exit_code == 0
        if first.manifest and second.manifest:
            same = first.manifest.comparable() == second.manifest.comparable()
            ok &= same
            out.line(f"the two manifests are identical but for times, build name and probe: {same}", "bold")

        version = upstream / "python" / "sglang" / "version.py"
        version.write_text(version.read_text().replace("0.0.0-standin", "0.0.1-standin"))
        _git(upstream, "commit", "-qam", "upstream moves on")
        pin(_git(upstream, "rev-parse", "HEAD"))
        third = night("night 3", "3. upstream moved on; the spec pins the new commit")
        ok &= third.exit_code == 0
        if third.manifest and third.last_good:
            for change in manifest_changes(third.last_good, third.manifest):
                out.line(f"  changed since the last good night: {change.text}")

        crashing = 'PYTHONDONTWRITEBYTECODE: "1", STANDIN_CRASH_AT_START: "1"}'
        spec_path.write_text(spec_path.read_text().replace('PYTHONDONTWRITEBYTECODE: "1"}', crashing))
        fourth = night("night 4", "4. a night whose new server crashes at start (a stand-in switch)")
        ok &= fourth.exit_code == 1 and os.readlink(builds / "current") == third.name
        out.line(f"current -> {os.readlink(builds / 'current')} (night 3) again, its server healthy", "bold")

        heading(out, "5. orch rollback: back to the second night's build")
        back = report.hosts["rollback"] = rollback_host(target, None, options, reporter)
        ok &= back.exit_code == 0 and os.readlink(builds / "current") == second.name
        out.line(f"current -> {os.readlink(builds / 'current')} (night 2)", "bold")

        heading(out, "6. orch history")
        draw_history(out, host_history(target, options))
        out.line(f"page: {reports / target.name / 'index.html'}")
        out.line(f"chart: {reports / target.name / 'trend.svg'}")
        print_summary(out, report)
        out.line("demo finished as expected" if ok else "demo went wrong", "bold green" if ok else "bold red")
        return 0 if ok else 1
    except KeyboardInterrupt:
        out.line("interrupted; stopping everything the demo started", "yellow")
        ok = False
        return 1
    finally:
        kill_port_owner(port, state_dir)
        if keep:
            out.line(f"sandbox kept in {tmp} (its server is stopped)", "bold")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        if out.json:
            out.emit_json({"exit_code": 0 if ok else 1, "error": None, "hosts": {},
                           "steps": {k: r.to_json() for k, r in report.hosts.items()},
                           "sandbox": str(tmp) if keep else None})
