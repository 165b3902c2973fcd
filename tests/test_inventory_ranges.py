"""Host ranges in the inventory (``gpu[01:50]``), expanded by the parser (orchestrator/core/models.py)."""

from __future__ import annotations

import pytest

from orchestrator.core.inventory import resolve_hosts
from orchestrator.core.models import parse_inventory
from orchestrator.core.selection import apply_limit
from orchestrator.errors import ConfigError

INVENTORY = """\
defaults:
  user: root
hosts:
  gpu[01:12]:
    vars: {tp: 8}
  head:
    address: 10.1.230.174
groups:
  rack1: ["gpu[01:06]"]
  rack2: ["gpu[07:12]", head]
"""


def test_ranges_expand_in_hosts_and_groups_and_every_name_is_a_host() -> None:
    inv = parse_inventory(INVENTORY, "inventory.yaml")
    assert list(inv.hosts)[:3] == ["gpu01", "gpu02", "gpu03"] and len(inv.hosts) == 13
    assert inv.groups["rack1"] == [f"gpu{i:02d}" for i in range(1, 7)]
    assert inv.groups["rack2"][-1] == "head"
    targets = resolve_hosts(inv, ["rack1"])
    assert [t.name for t in targets] == inv.groups["rack1"]
    assert targets[0].address == "gpu01" and targets[0].vars == {"tp": 8}  # its name is its address
    kept = apply_limit([t.name for t in resolve_hosts(inv, ["all"])], "rack2:&gpu1*:!gpu11",
                       hosts=list(inv.hosts), groups=inv.groups)
    assert kept == ["gpu10", "gpu12"]


@pytest.mark.parametrize(("text", "error"), [
    ("hosts:\n  a:\n  gpu[3:1]:\n", "inventory.yaml:3: hosts.gpu[3:1]: host range '[3:1]' in 'gpu[3:1]': begin is after end"),
    ("hosts:\n  gpu[1:2]: {address: 10.0.0.1}\n",
     "inventory.yaml:2: hosts.gpu[1:2]: host range 'gpu[1:2]' cannot share one address; leave address out "
     "(each name is its own address)"),
    ("hosts:\n  gpu1:\n  gpu[1:2]:\n", "inventory.yaml:3: hosts.gpu[1:2]: host 'gpu1' is named twice (from 'gpu[1:2]')"),
    ("hosts:\n  a:\ngroups:\n  g: [a, \"b[1:2]\"]\n", "inventory.yaml:4: groups.g[1]: group 'g' lists unknown host 'b1'"),
])
def test_a_bad_range_is_one_located_line(text: str, error: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_inventory(text, "inventory.yaml")
    assert str(info.value) == error
