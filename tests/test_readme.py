"""The README is a front page: short, its two set-up commands first, and every page it
links to is there (issue 21, item 6)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_readme_is_a_front_page_of_at_most_250_lines() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    first_block = text.split("```sh\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(first_block) == 2 and "orch demo" in first_block[0] and "pytest" in first_block[1]


def test_every_relative_link_of_the_readme_and_docs_names_a_file_that_is_there() -> None:
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which is not there"


def test_the_readmes_departures_are_one_line_each_with_a_link() -> None:
    """Each departure is one line of the README with a link to its reasons in full."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Departures from DESIGN.md, and why\n", 1)[1].split("\n## ", 1)[0]
    items = section.split("\n- ")[1:]
    assert len(items) >= 5, section
    for item in items:
        line = item.strip()
        assert "\n" not in line, f"a departure over several lines: {line!r}"
        assert re.search(r"\]\([^)]+\)", line), f"a departure without a link: {line!r}"
