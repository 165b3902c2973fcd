"""Issue 21's rows that had no test through the real CLI: history's times in the
controller's zone, ``rollback --to`` by suffix / prefix / refused when ambiguous,
``history --release`` over several hosts, the demo's help and docs saying what
the demo and a deploy really do, history's paths whole at 200 columns on a
terminal, and ``--list-hosts`` on every command that takes ``--host``.

One ``orch demo --keep --json`` (a ``connection: local`` sandbox: no sshd) gives a
host with five real records — a gated deploy, a gate rollback, a pre-flight
refusal, a crash rolled back by the runner, an ``orch rollback`` — and the demo's
own report; every test here only reads them or is refused before touching them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from tests.fixtures.forkrun import run_orch

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Kept:
    """The kept demo sandbox, the demo's JSON report and its human output."""

    root: Path
    report: dict[str, Any]
    said: str

    def orch(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """The real CLI in a subprocess on a pipe at 80 columns, from the sandbox's directory."""
        return run_orch([*args], cwd=self.root, timeout=180,
                              env=dict(os.environ, COLUMNS="80", NO_COLOR="1", **(env or {})))

    def rows(self) -> list[dict[str, Any]]:
        """``orch history --json``'s rows of the sandbox host, oldest first."""
        done = self.orch("history", "--host", "sandbox", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)["hosts"]["sandbox"]

    def state_dir(self) -> Path:
        return Path(re.search(r"state_dir: (\S+)", (self.root / "inventory.yaml").read_text()).group(1))


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kept]:
    where = tmp_path_factory.mktemp("demo-keep")
    proc = run_orch(["demo", "--keep", "--json"], cwd=where, timeout=600,
                          env=dict(os.environ, COLUMNS="80", NO_COLOR="1", TMPDIR=str(where)))
    report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    root = Path(report["sandbox"]) if report.get("sandbox") else None
    try:
        assert proc.returncode == 0 and root is not None, proc.stdout + proc.stderr
        yield Kept(root, report, proc.stderr)
    finally:
        if root is not None:
            subprocess.run(["sh", str(root / "stop-server.sh")], capture_output=True, timeout=60)
            shutil.rmtree(root, ignore_errors=True)


def files_of(folder: Path) -> list[tuple[str, int, float]]:
    """Every file and link under ``folder`` with its size and mtime: what "touched nothing" compares."""
    return sorted((str(p.relative_to(folder)), p.lstat().st_size, p.lstat().st_mtime)
                  for p in folder.rglob("*") if not p.is_dir() or p.is_symlink())


@pytest.mark.parametrize("zone", ["Asia/Kolkata", "America/St_Johns", "UTC"])
def test_history_row_times_are_the_hosts_shown_in_the_controllers_zone_with_its_utc_offset(
        kept: Kept, zone: str) -> None:
    rows = kept.rows()
    done = kept.orch("history", "--host", "sandbox", env={"TZ": zone})
    assert done.returncode == 0, done.stdout + done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line[:1].isdigit()}
    assert set(lines) == {r["id"] for r in rows}, done.stdout
    for r in rows:
        shown = datetime.fromtimestamp(r["when"], ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M:%S %z")
        assert shown in lines[r["id"]], (zone, shown, lines[r["id"]])
    # JSON keeps the host's epoch seconds, whatever the controller's zone
    again = json.loads(kept.orch("history", "--host", "sandbox", "--json", env={"TZ": zone}).stdout)
    assert [r["when"] for r in again["hosts"]["sandbox"]] == [r["when"] for r in rows]


def test_rollback_to_row_an_ambiguous_id_is_refused_listing_the_matches_and_touches_nothing(kept: Kept) -> None:
    rows = kept.rows()
    before = files_of(kept.state_dir())
    common = os.path.commonprefix([r["id"] for r in rows])
    assert len(common) >= 4, common  # the demo's releases all start with today's date
    done = kept.orch("rollback", "--host", "sandbox", "--to", common[:4])
    assert done.returncode == 2, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert f"--to: '{common[:4]}' names several releases: " in said, said
    for r in rows:
        assert r["id"] in said, (r["id"], said)
    assert "Traceback" not in said
    report = json.loads(kept.orch("rollback", "--host", "sandbox", "--to", common[:4], "--json").stdout)
    assert report["exit_code"] == 2 and "names several releases" in report["hosts"]["sandbox"]["error"]
    assert files_of(kept.state_dir()) == before


def test_rollback_to_row_the_printed_suffix_and_a_unique_prefix_name_the_release(kept: Kept) -> None:
    rows = kept.rows()
    undone = next(r for r in rows if r["kind"] == "deploy" and r["outcome"].startswith("undone by"))
    suffix = undone["id"].rsplit("-", 1)[1]
    assert len(suffix) == 4 and suffix in kept.said  # the 4 characters the demo printed
    before = files_of(kept.state_dir())
    for given in (suffix, undone["id"][:18], undone["id"]):
        done = kept.orch("rollback", "--host", "sandbox", "--to", given)
        # found by what was given: refused only because it is undone, named in full
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"release {undone['id']} is not in effect on this host (undone by " in done.stdout + done.stderr
    assert files_of(kept.state_dir()) == before


def two_hosts(kept: Kept, folder: Path) -> Path:
    """An inventory of the sandbox and a second local host that orch never deployed to."""
    inventory = folder / "two.yaml"
    inventory.write_text(json.dumps({"hosts": {
        "sandbox": {"connection": "local", "state_dir": str(kept.state_dir()), "python": sys.executable},
        "spare": {"connection": "local", "state_dir": str(folder / "spare-state"), "python": sys.executable},
    }}))
    return inventory


def test_history_release_item2_each_host_that_has_it_prints_it_in_full_the_others_say_no_release(
        kept: Kept, tmp_path: Path) -> None:
    inventory = two_hosts(kept, tmp_path)
    rows = kept.rows()
    gated = next(r for r in rows if r["kind"] == "deploy" and r["outcome"].startswith("undone by"))
    crashed = next(r for r in rows if r["kind"] == "deploy" and "exited during start" in (r["error"] or ""))
    suffix = gated["id"].rsplit("-", 1)[1]

    done = kept.orch("history", "-i", str(inventory), "--host", "all", "--release", suffix)
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout
    assert f"release {gated['id']} on sandbox" in text
    assert f"spare: no release {suffix}" in text.splitlines()
    # in full: outcome, health, the gate's figures, timings, before/after sha256 and argv, the sed -n view
    assert re.search(rf"outcome\s+{re.escape(gated['outcome'])}", text), text
    assert re.search(r"health\s+GET /health", text) and "performance gate: pass" in text
    assert re.search(r"tokens_per_s\s+\d", text) and re.search(r"timings\s+.*gate \d", text)
    assert "sha256 before" in text and "sha256 after" in text and "argv before" in text and "sed -n " in text
    report = json.loads(kept.orch("history", "-i", str(inventory), "--host", "all", "--release", suffix,
                                  "--json").stdout)
    assert report["exit_code"] == 0 and report["hosts"]["sandbox"]["gate"]["verdict"] == "pass"

    # who restored: the runner put the crashed release's file back
    crash = kept.orch("history", "-i", str(inventory), "--host", "sandbox", "--release", crashed["id"])
    assert crash.returncode == 0 and re.search(r"restored by\s+runner", crash.stdout), crash.stdout
    assert json.loads(kept.orch("history", "--host", "sandbox", "--release", crashed["id"], "--json").stdout
                      )["hosts"]["sandbox"]["restored_by"] == "runner"

    # the host without it alone: exit 2, and reading it created nothing there
    alone = kept.orch("history", "-i", str(inventory), "--host", "spare", "--release", suffix)
    assert alone.returncode == 2 and alone.stdout.strip() == f"spare: no release {suffix}", alone.stdout
    assert not (tmp_path / "spare-state").exists()


NUMBERS = {"four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}


def test_demo_help_row_help_and_docs_say_the_steps_the_demo_runs_and_the_round_trips_a_deploy_makes(
        kept: Kept) -> None:
    ran = re.findall(r"^== (\d+)\. ", kept.said, re.M)
    assert ran == [str(i) for i in range(1, len(ran) + 1)] and len(ran) >= 4, kept.said
    helped = kept.orch("demo", "--help")
    said = re.search(r"in (\w+) steps", " ".join(helped.stdout.split()))
    assert said and NUMBERS[said.group(1)] == len(ran), helped.stdout
    cli_md = " ".join((REPO / "docs" / "CLI.md").read_text().split())
    assert re.search(r"`orch demo` runs the whole story .*? (\w+) steps", cli_md).group(1).lower() in \
        [w for w, n in NUMBERS.items() if n == len(ran)]
    # the round trips the docs state are those the demo's first deploy reports in --json
    trips = kept.report["steps"]["deploy"]["round_trips"]
    guide = " ".join((REPO / "docs" / "GUIDE.md").read_text().split())
    fleets = " ".join((REPO / "docs" / "FLEETS.md").read_text().split())
    assert re.search(r"A deploy costs (\d+) round trips", guide).group(1) == str(trips)
    assert re.search(r"a deploy makes (\d+) ", fleets).group(1) == str(trips)
    assert f'"round_trips": {trips}' in cli_md


def in_pty(kept: Kept, *args: str, columns: int) -> tuple[int, str]:
    """``orch ARGS`` under a pseudo-terminal ``columns`` wide: its exit code and the screen's text
    (colours and cursor moves taken out)."""
    from tests.test_cli import orch_in_pty, screen_text

    code, raw = orch_in_pty(list(args), kept.root, columns, lines=50)
    return code, screen_text(raw)


def test_history_row_on_a_terminal_at_200_columns_paths_are_whole_never_shortened(kept: Kept) -> None:
    rows = kept.rows()
    paths = {p for r in rows for p in r["files"]}
    assert paths, rows
    code, text = in_pty(kept, "history", "--host", "sandbox", columns=200)
    assert code == 0, text
    assert all(len(line) <= 200 for line in text.splitlines()), text
    assert "…" not in text, text
    for path in paths:  # at 200 columns each path fits on its line: shown whole, on one line
        assert any(path in line for line in text.splitlines()), (path, text)
    for r in rows:
        assert any(line.startswith(r["id"]) for line in text.splitlines()), (r["id"], text)


INVENTORY = """\
defaults:
  port: {port}
hosts:
  gpu1: {{address: 127.0.0.1}}
  gpu2: {{address: 127.0.0.2}}
  gpu3: {{address: 127.0.0.3}}
"""


@pytest.mark.parametrize("command", ["deploy", "rollback", "status", "history", "nightly"])
def test_list_hosts_item3_every_command_that_takes_host_prints_the_batches_and_contacts_nothing(
        tmp_path: Path, command: str) -> None:
    from tests.fixtures.sshd import free_port

    (tmp_path / "inventory.yaml").write_text(INVENTORY.format(port=free_port()))  # nothing listens there
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "xdg"), COLUMNS="80", NO_COLOR="1")

    def orch(*args: str) -> subprocess.CompletedProcess[str]:
        return run_orch([command, *args], cwd=tmp_path, env=env, timeout=120)

    serial = ["--serial", "1"] if command == "deploy" else []  # only a deploy goes in batches
    done = orch("--host", "all", "--limit", "!gpu2", *serial, "--list-hosts", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    batches = [["gpu1"], ["gpu3"]] if serial else [["gpu1", "gpu3"]]
    assert report["exit_code"] == 0 and report["batches"] == batches
    assert report["hosts"] == {"gpu1": {"address": "127.0.0.1", "batch": 1},
                               "gpu3": {"address": "127.0.0.3", "batch": 2 if serial else 1}}
    plain = orch("--host", "all", "--list-hosts")
    assert plain.returncode == 0 and "3 hosts selected; nothing contacted" in plain.stdout, plain.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inventory.yaml"]  # no state, retry file or report


def test_quiet_row_keeps_the_outcome_line_plus_warnings_and_errors(tmp_path: Path) -> None:
    """``-q`` is the outcome line per host, and still every warning and error (docs/CLI.md)."""
    home = tmp_path / "shared"
    home.mkdir()
    home.chmod(0o777)  # a ./orch.yaml here is ignored with a warning: the warning -q must keep
    (home / "orch.yaml").write_text("forks: 3\n")
    (home / "inventory.yaml").write_text(json.dumps(
        {"hosts": {"box": {"connection": "local", "state_dir": str(tmp_path / "state"), "python": sys.executable}}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "xdg"), COLUMNS="80", NO_COLOR="1")

    def quiet(*args: str) -> subprocess.CompletedProcess[str]:
        return run_orch([*args, "-q"], cwd=home, env=env, timeout=120)

    warning = f"orch: warning: ignoring ./orch.yaml: its directory {home} is world-writable"
    history = quiet("history", "--host", "box")
    assert history.returncode == 0, history.stdout + history.stderr
    assert history.stdout.splitlines() == [f"box: no releases: orch has never deployed to box (no {tmp_path / 'state'})"]
    assert [line for line in history.stderr.splitlines() if line.startswith(warning)] == history.stderr.splitlines()
    assert len(history.stderr.splitlines()) == 1
    wrong = quiet("history", "--host", "nope")
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert wrong.stderr.splitlines()[0].startswith(warning)
    assert wrong.stderr.splitlines()[1].startswith("orch: error: --host: 'nope' is not in the inventory")
    assert not (tmp_path / "state").exists()


def test_ctrl_c_row_status_says_it_in_exactly_one_line_at_every_moment(kept: Kept) -> None:
    """SIGINT to ``orch status`` at T + 0.02 … 1 s (T: a bare interpreter's start, measured):
    the interruption is said once, as the last line, with the signal table's exit 1 and the
    JSON report under ``--json``; a run that finished first keeps its own code."""

    from tests.test_ctrl_c_early import (
        DELAYS,
        bare_start,
        before_orch,
        orch_command,
        sigint_after_start,
    )

    def interrupted(args: list[str], after: float) -> subprocess.CompletedProcess[str]:
        proc = subprocess.Popen([*orch_command(), *args], cwd=kept.root, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, COLUMNS="80", NO_COLOR="1"))
        sigint_after_start(proc, after)
        out, err = proc.communicate(timeout=120)
        return subprocess.CompletedProcess(args, proc.returncode, out, err)

    t = bare_start()
    for delay in DELAYS:
        for json_flag in ([], ["--json"]):
            args = ["status", "--host", "sandbox", *json_flag]
            for attempt in range(5):  # a signal inside the interpreter's own start-up is Python's, not orch's
                got = interrupted(args, t * (1 + attempt) + delay)
                if not before_orch(got.stdout + got.stderr):
                    break
            human = (got.stderr if json_flag else got.stdout + got.stderr).splitlines()
            assert "Traceback" not in got.stderr and "KeyboardInterrupt" not in got.stderr, got.stderr
            assert got.returncode in (1, 3), (delay, json_flag, human)  # 3: finished first (server stopped)
            if got.returncode == 1:
                said = [line for line in human if "interrupted" in line]
                assert len(said) == 1 and human[-1] == said[0], (delay, json_flag, human)
            if json_flag:
                report = json.loads(got.stdout)
                assert report["exit_code"] == got.returncode
                assert report.get("interrupted", False) is (got.returncode == 1)
