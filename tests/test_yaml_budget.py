"""YAML anchors and aliases are budgeted before anything expands them (issue 6, defect 12).

A composed tree shares each anchored node, so counting costs nothing; every
later pass (line walk, constructor, schema) visits an alias as a full copy.
These tests check the mechanism, not a duration: bombs are refused at the
line of the alias that crosses the budget, ordinary aliases still work.
"""

from __future__ import annotations

import pytest

from orchestrator.core import yamlsrc
from orchestrator.core.models import parse_playbook
from orchestrator.core.yamlsrc import MAX_ALIAS_NODES, MAX_ALIASES, load_yaml
from orchestrator.errors import ConfigError


def wide_bomb(levels: int = 9, width: int = 9) -> str:
    """The classic "billion laughs": each level lists the previous one ``width`` times."""
    rows = ['a0: &a0 ["lol"]']
    for n in range(1, levels + 1):
        rows.append(f"a{n}: &a{n} [" + ", ".join([f"*a{n - 1}"] * width) + "]")
    return "\n".join(rows) + "\n"


def deep_bomb(levels: int = 40) -> str:
    """Only two aliases per level, so few aliases in all, yet 2**levels nodes expanded."""
    rows = ['b0: &b0 "x"']
    for n in range(1, levels + 1):
        rows.append(f"b{n}: &b{n} [*b{n - 1}, *b{n - 1}]")
    return "\n".join(rows) + "\n"


def test_a_wide_bomb_is_refused_with_one_line_at_the_alias() -> None:
    text = wide_bomb()
    assert len(text) < 600  # a few hundred bytes; hundreds of millions of nodes expanded
    with pytest.raises(ConfigError) as info:
        load_yaml(text, "bomb.yaml")
    message = str(info.value)
    assert message.startswith("bomb.yaml:")
    assert "\n" not in message
    assert f"more than {MAX_ALIAS_NODES} nodes" in message
    line = info.value.line
    assert line is not None and text.splitlines()[line - 1].startswith("a")  # an aliasing row


def test_a_deep_bomb_with_few_aliases_is_refused_by_its_expanded_size() -> None:
    text = deep_bomb(40)
    assert text.count("*") < MAX_ALIASES  # the alias count alone would let it through
    with pytest.raises(ConfigError) as info:
        load_yaml(text, "deep.yaml")
    assert "expand to more than" in str(info.value)
    # refused at the first level whose expansion crosses the budget, not at the end
    assert info.value.line is not None and info.value.line < 20


def test_too_many_aliases_are_refused() -> None:
    rows = ["base: &b 1"] + [f"k{n}: *b" for n in range(MAX_ALIASES + 1)]
    with pytest.raises(ConfigError) as info:
        load_yaml("\n".join(rows) + "\n", "many.yaml")
    assert f"more than {MAX_ALIASES} YAML aliases" in str(info.value)
    assert info.value.line == MAX_ALIASES + 2  # the row of the alias over the count


def test_a_recursive_alias_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        load_yaml("a: &a [1, *a]\n", "loop.yaml")
    assert str(info.value) == "loop.yaml:1: alias *a refers to a node that contains it"


def test_the_budget_is_checked_before_the_tree_is_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The line walk (which expands aliases) never runs on a refused document."""
    walked: list[object] = []
    real_walk = yamlsrc._walk

    def spy(*args: object, **kwargs: object) -> None:
        walked.append(args)
        real_walk(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(yamlsrc, "_walk", spy)
    with pytest.raises(ConfigError):
        load_yaml(wide_bomb(), "bomb.yaml")
    assert walked == []


PLAYBOOK_WITH_ALIASES = """\
name: aliases
vars: {port: 30000}
files:
  - path: /srv/a.py
    edits:
      - &ins
        content: "x = 1"
        after: "import os"
    validate: &checks [python-syntax]
  - path: /srv/b.py
    edits: [*ins]
    validate: *checks
health:
  base_url: http://127.0.0.1:30000
  checks:
    - &probe {get: /health}
    - <<: *probe
      status: 200
"""


def test_a_playbook_with_a_few_aliases_and_a_merge_key_still_loads() -> None:
    pb = parse_playbook(PLAYBOOK_WITH_ALIASES, "aliases.yaml")
    assert [f.path for f in pb.files] == ["/srv/a.py", "/srv/b.py"]
    assert pb.files[1].edits[0].content == "x = 1"
    assert [c.path for c in pb.health.checks] == ["/health", "/health"]


def test_a_bomb_inside_a_playbook_is_refused_the_same_way() -> None:
    text = "name: t\nfiles: []\nvars:\n" + "".join(f"  {row}\n" for row in wide_bomb().splitlines())
    with pytest.raises(ConfigError) as info:
        parse_playbook(text, "pb.yaml")
    assert str(info.value).startswith("pb.yaml:") and "alias bomb" in str(info.value)
