"""orch's marker blocks in a file (``core.declarations``): rows as the rest of orch counts
them (``str.splitlines``), bodies, and one walk of a text however often a plan asks."""

from __future__ import annotations

import uuid

import pytest

from orchestrator.core import declarations
from orchestrator.core.declarations import OrchBlock, block_text, orch_blocks

TEXT = (
    "x = 1\r\n"
    "# >>> orch site:a.py.0\n"
    "y = 2\x0c"  # a form feed ends a line for splitlines, so for orch's rows
    "    # >>> orch site:a.py.1  \n"
    "z = 3\n"
    "    # <<< orch site:a.py.1\n"
    "# <<< orch site:a.py.0\n"
    "# <<< orch other:b.py.0\n"  # unpaired: not a block
    "# >>> orch left:open\n"  # unpaired: not a block
)


def test_blocks_are_paired_markers_at_splitlines_rows() -> None:
    assert orch_blocks("a.py", TEXT) == [OrchBlock("a.py", "site:a.py.1", 4, 6), OrchBlock("a.py", "site:a.py.0", 2, 7)]
    assert orch_blocks("a.sh", TEXT.replace("# ", "; ")) == []  # another language's comment: no marker
    assert block_text("a.py", TEXT, "site:a.py.1") == "z = 3"
    assert block_text("a.py", TEXT, "site:a.py.0") == "y = 2\n    # >>> orch site:a.py.1  \nz = 3\n    # <<< orch site:a.py.1"
    assert block_text("a.py", TEXT, "left:open") is None


def test_a_fleets_equal_texts_are_walked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan asks three times of each host's copy of a file, and a fleet's copies are equal."""
    text = f"# {uuid.uuid4()}\n" + "".join(f"v{i} = {i}\n" for i in range(2000)) + "# >>> orch p:f.0\nw = 1\n# <<< orch p:f.0\n"
    walks: list[str] = []
    walk = declarations._blocks
    monkeypatch.setattr(declarations, "_blocks", lambda path, text: walks.append(path) or walk(path, text))
    for _host in range(25):
        copy = "".join([text[:10], text[10:]])  # each host's copy is its own string
        assert copy is not text
        assert orch_blocks("f.py", copy) == [OrchBlock("f.py", "p:f.0", 2002, 2004)]
        assert block_text("f.py", copy, "p:f.0") == "w = 1"
        orch_blocks("f.py", copy).clear()  # a caller's list is its own: the kept answer is untouched
    assert walks == ["f.py"]
