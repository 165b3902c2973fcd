"""Issue 21's rows that had no test through the real CLI: history's times in the
controller's zone, ``rollback --to`` by suffix / prefix / refused when ambiguous,
``history --release`` over several hosts, and the demo's help and docs saying what
the demo and a deploy really do.

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

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Kept:
    """The kept demo sandbox, the demo's JSON report and its human output."""

    root: Path
    report: dict[str, Any]
    said: str

    def orch(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """The real CLI in a subprocess on a pipe at 80 columns, from the sandbox's directory."""
        return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=self.root,
                              capture_output=True, text=True, timeout=180,
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
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "demo", "--keep", "--json"], cwd=where,
                          capture_output=True, text=True, timeout=600,
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
