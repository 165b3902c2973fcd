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
   command line restarted, the report's page rewritten to say so;
6. the history: nights beside the rollback, with source and tokens/s.

Everything it started is stopped at the end, Ctrl-C included. Without
``--keep`` it names no file of its sandbox (they are deleted at the end);
with it, the spec is left as it is shipped but for its pin (night 4's crash
switch is taken out again) and README.txt lists next steps that work in
order from the sandbox directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from orchestrator.cli.output import Output
from orchestrator.cli.tables import draw_history
from orchestrator.cli.views import ConsoleReporter, print_summary
from orchestrator.cli.words import line
from orchestrator.core.inventory import resolve_hosts
from orchestrator.core.models import parse_inventory
from orchestrator.core.nightly import manifest_changes
from orchestrator.core.outcomes import ExitCode, demo_exit_code
from orchestrator.demo import free_port, heading, kill_port_owner
from orchestrator.pipeline.inspect import host_history
from orchestrator.pipeline.nightly import NightOptions, NightResult, nightly_host
from orchestrator.pipeline.nightly_report import host_rows, refresh_report, write_report
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


class SandboxMask:
    """The demo's output stream, with the sandbox's path written ``<sandbox>``.

    Without ``--keep`` the sandbox is deleted at the end: the nights' own
    lines (``building <sandbox>/builds/…``) still say where things go, but
    name no path a person could try to open afterwards. A line that Rich
    folds inside the path (a terminal narrower than it) keeps its pieces.
    """

    def __init__(self, stream: Any, path: str) -> None:
        self._stream, self._path = stream, path

    def write(self, text: str) -> int:
        return int(self._stream.write(text.replace(self._path, "<sandbox>")) or 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def run_nightly_demo(out: Output, *, keep: bool = False) -> int:
    reporter = ConsoleReporter(out, planned_view=False)  # as `orch nightly` shows it
    tmp = Path(tempfile.mkdtemp(prefix="orch-nightly-demo-"))
    state_dir, builds, reports = tmp / "state", tmp / "builds", tmp / "reports"
    port = free_port()
    if not keep:
        out.console.file = SandboxMask(out.console.file, str(tmp))  # type: ignore[assignment]  # a stream
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
    options = ConnectOptions(words=line)  # run.log in the words the console shows
    report = RunReport()
    ok = True

    def night(key: str, title: str) -> NightResult:
        heading(out, title)
        loaded = load_nightly(spec_path)
        result = nightly_host(target, loaded, {}, options, reporter, NightOptions())
        rows, _ = host_rows(target, options)
        files = write_report(reports, result, loaded.model.name, loaded.display, rows)
        report.hosts[key] = result.host_report()
        where = f"; report {files.json}" if keep else ""  # no path to a file the demo deletes
        out.line(f"{result.outcome} (exit {result.exit_code}){where}", "bold")
        return result

    try:
        heading(out, "orch demo nightly: a sandbox host, an upstream git repository, a pinned spec")
        if keep:
            out.line(f"sandbox: {tmp}")
        pin(_git(upstream, "rev-parse", "HEAD"))
        out.line(f"spec: {spec_path.name if not keep else spec_path} "
                 f"(pinned to {_git(upstream, 'rev-parse', 'HEAD')})")
        first = night("night 1", "1. the first night: build, patch, switch, probe")
        second = night("night 2", "2. the same spec again")
        ok &= first.exit_code == ExitCode.OK and second.exit_code == ExitCode.OK
        if first.manifest and second.manifest:
            same = first.manifest.comparable() == second.manifest.comparable()
            ok &= same
            out.line(f"the two manifests are identical but for times, build name and probe: {same}", "bold")

        version = upstream / "python" / "sglang" / "version.py"
        version.write_text(version.read_text().replace("0.0.0-standin", "0.0.1-standin"))
        _git(upstream, "commit", "-qam", "upstream moves on")
        pin(_git(upstream, "rev-parse", "HEAD"))
        third = night("night 3", "3. upstream moved on; the spec pins the new commit")
        ok &= third.exit_code == ExitCode.OK
        if third.manifest and third.last_good:
            for change in manifest_changes(third.last_good, third.manifest):
                out.line(f"  changed since the last good night: {change.text}")

        crashing = 'PYTHONDONTWRITEBYTECODE: "1", STANDIN_CRASH_AT_START: "1"}'
        spec_path.write_text(spec_path.read_text().replace('PYTHONDONTWRITEBYTECODE: "1"}', crashing))
        fourth = night("night 4", "4. a night whose new server crashes at start (a stand-in switch)")
        pin(_git(upstream, "rev-parse", "HEAD"))  # the crash switch out again: the kept spec runs as given
        ok &= fourth.exit_code == ExitCode.FAILED and os.readlink(builds / "current") == third.name
        out.line(f"current -> {os.readlink(builds / 'current')} (night 3) again, its server healthy", "bold")

        heading(out, "5. orch rollback: back to the second night's build")
        back = report.hosts["rollback"] = rollback_host(target, None, options, reporter)
        ok &= back.exit_code == ExitCode.OK and os.readlink(builds / "current") == second.name
        out.line(f"current -> {os.readlink(builds / 'current')} (night 2)", "bold")
        page = refresh_report(reports, target, options)  # as `orch rollback` rewrites the page
        if page is not None:
            for note in page.notes:
                out.line(f"note: {note}", "dim")

        heading(out, "6. orch history")
        draw_history(out, host_history(target, options))
        if keep:
            out.line(f"page: {reports / target.name / 'index.html'}")
            if (reports / target.name / "trend.svg").is_file():
                out.line(f"chart: {reports / target.name / 'trend.svg'}")
        print_summary(out, report)
        out.line("demo finished as expected" if ok else "demo went wrong", "bold green" if ok else "bold red")
        return demo_exit_code(ok)
    except KeyboardInterrupt:
        out.line("interrupted; stopping everything the demo started", "yellow")
        ok = False
        return 1
    finally:
        kill_port_owner(port, state_dir)
        if keep:
            write_kept_nightly(tmp, port)
            out.line(f"sandbox kept in {tmp} (its server is stopped); to go on there:", "bold")
            out.line(f"  cd {tmp} && orch history --host sandbox && orch nightly --host sandbox")
            out.line(f"  more in {tmp / 'README.txt'} and docs/NIGHTLY.md")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        if out.json:
            steps = {k: r.to_json() for k, r in report.hosts.items()}
            if not keep:  # the same words as the lines: no path into the deleted sandbox
                steps = json.loads(json.dumps(steps, default=str).replace(str(tmp), "<sandbox>"))
            out.emit_json({"exit_code": demo_exit_code(ok), "error": None, "hosts": {}, "steps": steps,
                           "sandbox": str(tmp) if keep else None})


KEPT_README = """\
The sandbox of `orch demo nightly --keep`: host `sandbox` (connection: local)
in inventory.yaml, an upstream git repository in upstream/, the nightly spec
in playbooks/nightly.yaml (pinned to upstream's last commit), builds in
builds/ (current -> night 2's build, after the demo's rollback), orch's state
in state/, the reports in reports/sandbox/ (open index.html in a browser).
The server is stopped. From this directory, in this order:

  orch history  --host sandbox     # exit 0: four nights and the rollback
  orch nightly  --host sandbox     # exit 0: a fifth night at the pin; starts the server; page rewritten
  orch status   --host sandbox     # exit 0: healthy, no drift
  orch rollback --host sandbox     # exit 0: back to night 2's build; the page marks it live
  orch history  --host sandbox     # exit 0: the fifth night is undone by the rollback
  ./stop-server.sh                 # exit 0: stops the server orch started

Remove the directory when done: rm -rf {dir}
"""


def write_kept_nightly(tmp: Path, port: int) -> None:
    """README.txt with next steps and a script that stops the server those steps start."""
    stop = tmp / "stop-server.sh"
    stop.write_text(
        "#!/bin/sh\n"
        "# Stop the stand-in server orch started (its pidfile names its process group).\n"
        'cd "$(dirname "$0")" || exit 1\n'
        '[ -f state/server.pid ] && kill -TERM "-$(cat state/server.pid)" 2>/dev/null && '
        'echo "stopped group $(cat state/server.pid)"\n'
        "exit 0\n"
    )
    stop.chmod(0o755)
    (tmp / "README.txt").write_text(KEPT_README.format(dir=tmp, port=port))
