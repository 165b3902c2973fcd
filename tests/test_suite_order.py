"""The suite's own order: ``conftest.LONGEST_FIRST`` names files that exist, and the
collected tests follow it (under ``--dist loadfile`` that order is the workers' schedule)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import LONGEST_FIRST

TESTS = Path(__file__).resolve().parent


def test_every_file_named_longest_first_is_a_test_file_of_the_suite() -> None:
    missing = [name for name in LONGEST_FIRST if not (TESTS / name).is_file()]
    assert not missing, f"conftest.LONGEST_FIRST names files that are gone: {missing}"
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)


def test_collection_puts_the_longest_files_first_then_the_rest_in_their_own_order() -> None:
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             "tests/test_words_rows21.py", "tests/test_cli.py", "tests/test_agent.py",
                             "tests/test_faults.py", "tests/test_check.py"],
                            cwd=TESTS.parent, capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    files: list[str] = []
    for line in listed.stdout.splitlines():
        if "::" in line:
            name = line.split("::", 1)[0].rsplit("/", 1)[-1]
            if not files or files[-1] != name:
                files.append(name)
    # each file's tests together; the named ones by length, then the others as collected
    assert files == ["test_faults.py", "test_cli.py", "test_words_rows21.py", "test_agent.py", "test_check.py"], files
