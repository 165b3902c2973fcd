"""The fast scans of ``core.pyindex`` against their plain definitions.

``rows_containing`` and ``split_lines`` replaced per-line Python loops and a
regex search (a fleet plans every host's copy of a 4,000-line file); these
properties pin that they answer exactly what the loops did, and the caches
that a fleet's hosts share keep answers by content, never by path.
"""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.kept import Kept
from orchestrator.core.pyindex import PySource, rows_containing, split_lines
from tests.fixtures.at_once import ask_at_once

# Lines made of a few letters and every line break Python knows, so that
# needles hit often and split_lines meets each of its cases.
CHARS = st.sampled_from(list("ab:x \t") + ["\n", "\r", "\r\n", "\x0c", "\x0b", "\x85", "\u2028"])
TEXTS = st.lists(CHARS, max_size=60).map("".join)
NEEDLES = st.lists(st.sampled_from(["a", "ab", "x:", "b\n", "", "\n", "zz"]), min_size=1, max_size=3)


def plain_split(text: str) -> list[str]:
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


@settings(max_examples=400, deadline=None)
@given(TEXTS)
def test_split_lines_splits_on_newline_only(text: str) -> None:
    assert split_lines(text) == plain_split(text)


@settings(max_examples=400, deadline=None)
@given(TEXTS, NEEDLES)
def test_rows_containing_is_the_per_line_test(text: str, needles: list[str]) -> None:
    lines = plain_split(text)
    expected = [n for n, line in enumerate(lines, 1) if any(needle in line for needle in needles)]
    assert rows_containing(lines, needles) == expected


def test_the_same_text_at_two_paths_is_read_alike_and_errors_name_their_own_path() -> None:
    text = "import os\n\n\nclass A:\n    x: int = 1\n\n\ndef f():\n    return 2\n"
    one, two = PySource("/host1/server_args.py", text), PySource("/host2/server_args.py", text)
    assert one.statement_at(5) is not None and two.statement_at(5) is not None
    assert (one.statement_at(5).start, one.statement_at(9).start) == (two.statement_at(5).start, two.statement_at(9).start)
    broken = text + "def g(:\n"
    for path in ("/host1/server_args.py", "/host2/server_args.py"):
        with pytest.raises(SyntaxError, match=path):
            PySource(path, broken).statement_at(10)


def test_a_fleets_threads_asking_at_once_wait_for_one_computation() -> None:
    """At N = 25 every host tokenized the same file at once: the cache let them all compute."""
    kept: Kept[str, list[int]] = Kept(4)
    calls: list[int] = []
    release = threading.Event()

    def make() -> list[int]:
        calls.append(1)
        release.wait(30)
        return [len(calls)]

    answers = ask_at_once(8, lambda: kept.get("k", make), Kept.get.__code__, release)
    assert calls == [1] and answers == [[1]] * 8
    assert kept.get("k", lambda: [99]) == [1]  # and kept


def test_a_failed_computation_is_not_kept_and_each_waiter_computes_its_own() -> None:
    kept: Kept[str, list[int]] = Kept(4)
    release = threading.Event()
    calls: list[str] = []

    def make() -> list[int]:
        calls.append(threading.current_thread().name)
        if len(calls) == 1:  # the first to compute fails (an error names its path: never kept)
            release.wait(30)
            raise ValueError("first.py does not parse")
        return [2]

    answers = ask_at_once(8, lambda: kept.get("k", make), Kept.get.__code__, release)
    assert [a for a in answers if isinstance(a, ValueError)] and answers.count([2]) == 7
    assert len(calls) == 8 and kept.get("k", lambda: [3]) == [3]  # nothing was kept
