"""The collector's schedule in a run of ``orch`` (``orchestrator.heap``): paused while orch
loads, back once a transport is open, everything frozen at exit.

Each check runs in an interpreter of its own: the collector's state is the process's, and
the pytest worker's must not change under the other tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.fixtures.sshd import SshdServer

REPO = Path(__file__).resolve().parents[1]

WATCHED = """
import atexit, gc, json, sys
seen = []  # per collection: had anything been frozen yet (was orch loaded)?
gc.callbacks.append(lambda phase, info: phase == "start" and seen.append(gc.get_freeze_count() > 0))
def report():
    print(json.dumps({"collections": seen, "enabled": gc.isenabled(), "frozen_at_exit": gc.get_freeze_count(),
                      "objects_not_frozen": len(gc.get_objects())}), file=sys.stderr)
atexit.register(report)
sys.argv[0] = "orch"
from orchestrator.cli.entry import main
seen.clear()  # the collections of this script's own imports
main()
"""


def run_watched(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    """``orch ARGS`` through the console script's entry, with the collections it ran counted."""
    done = subprocess.run([sys.executable, "-c", WATCHED, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO), NO_COLOR="1"))
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "{}"
    return done, json.loads(last)


def test_loading_pauses_loaded_freezes_and_resumes_once_and_exiting_freezes_the_rest() -> None:
    code = """
import gc
from orchestrator import heap
heap.loading()
paused = not gc.isenabled()
heap.loaded()
frozen = gc.get_freeze_count()
resumed = gc.isenabled()
made = [[i] for i in range(1000)]
heap.loaded()  # a second transport: nothing more is frozen
again = gc.get_freeze_count()
heap.exiting()
print(paused, resumed, frozen > 0, again == frozen, gc.get_freeze_count() >= frozen + 1000)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.stdout.split() == ["True"] * 5, done.stdout + done.stderr


def test_loaded_leaves_a_collector_it_did_not_pause_alone() -> None:
    code = """
import gc
from orchestrator import heap
heap.loaded()
print(gc.isenabled(), gc.get_freeze_count())
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.stdout.split() == ["True", "0"], done.stdout + done.stderr


def test_a_run_over_ssh_collects_nothing_while_loading_and_freezes_all_at_exit(
        tmp_path: Path, sshd: SshdServer) -> None:
    host = {"address": sshd.host, "port": sshd.port, "user": sshd.user, "identity_file": str(sshd.client_key),
            "known_hosts": str(sshd.known_hosts),
            "state_dir": str(tmp_path / "state"), "python": sys.executable}
    (tmp_path / "inventory.yaml").write_text(json.dumps({"hosts": {"gpu": host}}))
    done, gc_seen = run_watched("history", "--host", "gpu", "--json", "--ssh-config", str(sshd.ssh_config),
                                cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["hosts"]["gpu"] == []  # it did reach the host: no release there
    assert gc_seen["collections"], "the run made no collection at all: was the collector ever back?"
    assert all(gc_seen["collections"]), f"a collection ran before orch had loaded: {gc_seen['collections']}"
    assert gc_seen["enabled"] is True
    assert gc_seen["objects_not_frozen"] < 2_000, gc_seen  # the run's objects frozen too, not just the imports'


def test_a_run_that_opens_no_transport_collects_nothing_and_freezes_all_at_exit(tmp_path: Path) -> None:
    (tmp_path / "inventory.yaml").write_text(json.dumps({"hosts": {"gpu": {"address": "127.0.0.1"}}}))
    done, gc_seen = run_watched("history", "--host", "gpu", "--list-hosts", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gpu" in done.stdout
    assert gc_seen["collections"] == []
    assert gc_seen["objects_not_frozen"] < 2_000, gc_seen
