"""Another revision's ``orchestrator/`` package, for a bench that runs it beside this checkout.

``bench_bigfile.py``, ``bench_fleet.py --baseline`` and ``bench_helper_start.py``
compare this checkout's orch with an older one in the same run (same machine,
same load), so they need that older package (and the templates it ships) as a
directory to put first on ``PYTHONPATH``. ``git archive`` gives exactly the
tracked files of that revision, without touching the work tree or the index.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def baseline_ref() -> str:
    """The merge-base of HEAD with ``main``: what a branch is measured against by default."""
    done = subprocess.run(["git", "merge-base", "HEAD", "main"], cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit("no merge-base with main: pass --baseline REF")
    return done.stdout.strip()


def short_rev(ref: str) -> str:
    """``ref`` as a short commit hash (``ValueError`` naming it when git does not know it)."""
    done = subprocess.run(["git", "rev-parse", "--short", f"{ref}^{{commit}}"], cwd=REPO,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise ValueError(f"--baseline {ref}: not a commit of this repository")
    return done.stdout.strip()


SHIPPED = ("orchestrator", "templates", "playbooks")
"""What a source checkout runs orch from: the package, and the templates and playbooks it
ships (``packaged_dir`` finds them beside the package)."""


def export(ref: str, folder: Path) -> Path:
    """``ref``'s ``SHIPPED`` folders (those it has) under ``folder``: put ``folder`` first on
    ``PYTHONPATH`` to run that orch."""
    folder.mkdir(parents=True, exist_ok=True)
    listed = subprocess.run(["git", "ls-tree", "--name-only", ref], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.split()
    paths = [p for p in SHIPPED if p in listed]
    archive = subprocess.run(["git", "archive", ref, *paths], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder
