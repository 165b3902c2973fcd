"""``--host`` selectors -> HostTargets: names, groups, all, bare addresses, precedence."""

from __future__ import annotations

import os

import pytest

from orchestrator.core.inventory import parse_bare, resolve_hosts
from orchestrator.core.models import Inventory, parse_inventory
from orchestrator.errors import ConfigError

INV_TEXT = """
defaults:
  user: root
  port: 22
  identity_file: ~/.ssh/id_ed25519
  known_hosts: ~/.ssh/known_hosts
  state_dir: ~/.orch
  vars: {sglang_root: /root/sglang/python/sglang, model: /models/glm, tp: 1}
hosts:
  blackwell-1:
    address: 10.1.230.174
    vars: {tp: 8}
  blackwell-2:
    address: 10.1.230.175
    user: ubuntu
    port: 2200
    become: true
    keep_releases: 3
    python: /usr/bin/python3.11
  sandbox:
    connection: local
  alias-only:
groups:
  blackwell: [blackwell-1, blackwell-2]
"""


@pytest.fixture
def inv() -> Inventory:
    return parse_inventory(INV_TEXT, "inventory.yaml")


def names(targets: list) -> list[str]:
    return [t.name for t in targets]


def test_host_name(inv: Inventory) -> None:
    (t,) = resolve_hosts(inv, ["blackwell-1"], filename="inventory.yaml")
    assert t.name == "blackwell-1"
    assert t.connection == "ssh"
    assert (t.address, t.user, t.port) == ("10.1.230.174", "root", 22)
    assert t.identity_file == os.path.expanduser("~/.ssh/id_ed25519")
    assert t.known_hosts == os.path.expanduser("~/.ssh/known_hosts")
    assert t.state_dir == "~/.orch"  # a path on the host: not expanded here
    assert t.vars == {"sglang_root": "/root/sglang/python/sglang", "model": "/models/glm", "tp": 8}
    assert t.from_defaults == frozenset({"user", "port", "identity_file"})
    assert (t.become, t.keep_releases, t.python) == (False, 10, "python3")


def test_host_entry_beats_defaults(inv: Inventory) -> None:
    (t,) = resolve_hosts(inv, ["blackwell-2"], filename="inventory.yaml")
    assert (t.user, t.port) == ("ubuntu", 2200)
    assert t.from_defaults == frozenset({"identity_file"})
    assert (t.become, t.keep_releases, t.python) == (True, 3, "/usr/bin/python3.11")
    assert t.vars["tp"] == 1


def test_group_all_and_dedupe_keep_order(inv: Inventory) -> None:
    assert names(resolve_hosts(inv, ["blackwell"])) == ["blackwell-1", "blackwell-2"]
    assert names(resolve_hosts(inv, ["all"])) == [
        "blackwell-1",
        "blackwell-2",
        "sandbox",
        "alias-only",
    ]
    assert names(resolve_hosts(inv, ["blackwell-2", "blackwell", "blackwell-1"])) == [
        "blackwell-2",
        "blackwell-1",
    ]


def test_local_and_address_less_hosts(inv: Inventory) -> None:
    local, alias = resolve_hosts(inv, ["sandbox", "alias-only"])
    assert (local.connection, local.address) == ("local", None)
    assert local.label == "sandbox"
    assert (alias.connection, alias.address) == ("ssh", "alias-only")  # ~/.ssh/config alias


def test_bare_address_of_an_inventory_host_is_that_host(inv: Inventory) -> None:
    (t,) = resolve_hosts(inv, ["10.1.230.174"])
    assert t.name == "blackwell-1"
    assert t.vars["tp"] == 8
    (t,) = resolve_hosts(inv, ["admin@10.1.230.174:2222"])
    assert (t.name, t.user, t.port, t.address) == ("blackwell-1", "admin", 2222, "10.1.230.174")
    assert t.from_defaults == frozenset({"identity_file"})  # user/port came from the selector
    assert names(resolve_hosts(inv, ["blackwell-1", "10.1.230.174"])) == ["blackwell-1"]


def test_bare_unmatched_gets_defaults(inv: Inventory) -> None:
    (t,) = resolve_hosts(inv, ["10.9.9.9"])
    assert (t.name, t.address, t.user, t.port) == ("10.9.9.9", "10.9.9.9", "root", 22)
    assert t.vars == {"sglang_root": "/root/sglang/python/sglang", "model": "/models/glm", "tp": 1}
    assert t.from_defaults == frozenset({"user", "port", "identity_file"})


def test_bare_user_at_address_port(inv: Inventory) -> None:
    (t,) = resolve_hosts(inv, ["deploy@gpu7.example:2022"])
    assert (t.name, t.address, t.user, t.port) == ("gpu7.example", "gpu7.example", "deploy", 2022)
    assert t.from_defaults == frozenset({"identity_file"})
    assert t.label == "gpu7.example (deploy@gpu7.example:2022)"


def test_ipv6() -> None:
    empty = Inventory()
    (t,) = resolve_hosts(empty, ["[::1]:2222"])
    assert (t.name, t.address, t.port, t.user) == ("::1", "::1", 2222, None)
    assert t.from_defaults == frozenset()
    (t,) = resolve_hosts(empty, ["root@[fe80::1]"])
    assert (t.address, t.port, t.user) == ("fe80::1", None, "root")
    (t,) = resolve_hosts(empty, ["::1"])
    assert (t.address, t.port) == ("::1", None)


def test_no_inventory_uses_builtins() -> None:
    (t,) = resolve_hosts(Inventory(), ["127.0.0.1"])
    assert (t.user, t.port, t.identity_file, t.known_hosts) == (None, None, None, None)
    assert (t.become, t.state_dir, t.keep_releases, t.python) == (False, "~/.orch", 10, "python3")
    assert t.vars == {}


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("h:abc", "--host: bad host 'h:abc': bad port 'abc'"),
        ("h:0", "--host: bad host 'h:0': bad port '0'"),
        ("@h", "--host: bad host '@h': empty user before @"),
        ("a b", "--host: bad host 'a b': not a host name, a group or an address"),
        ("", "--host: empty host selector"),
    ],
)
def test_bad_selectors(selector: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_bare(selector) if selector else resolve_hosts(Inventory(), [selector])
    assert str(info.value) == message


def test_empty_selection_is_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_hosts(Inventory(), [])
    assert str(info.value) == "--host: no hosts selected (given: nothing)"
    with pytest.raises(ConfigError) as info:
        resolve_hosts(Inventory(), ["all"], filename="inventory.yaml")
    assert str(info.value) == "--host: 'all' selects nothing: no hosts in inventory.yaml"


def test_unknown_group_member_in_a_built_inventory() -> None:
    inv = Inventory.model_construct(hosts={}, groups={"g": ["ghost"]})
    with pytest.raises(ConfigError) as info:
        resolve_hosts(inv, ["g"], filename="inv.yaml")
    assert str(info.value) == "inv.yaml: groups.g: group 'g' lists unknown host 'ghost'"


def test_unknown_group_member_in_the_file() -> None:
    with pytest.raises(ConfigError) as info:
        parse_inventory("hosts: {a: {}}\ngroups:\n  g: [a, ghost]\n", "inventory.yaml")
    assert str(info.value) == "inventory.yaml:3: groups.g[1]: group 'g' lists unknown host 'ghost'"


# ------------------------------------------------ host selection never guesses


def test_a_typo_is_refused_with_did_you_mean(inv: Inventory) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_hosts(inv, ["blackwel-1"], filename="inventory.yaml")
    assert str(info.value) == (
        "--host: 'blackwel-1' is not in the inventory (inventory.yaml); "
        "did you mean 'blackwell-1' or 'blackwell-2' or 'blackwell'?"
    )


def test_a_name_that_would_resolve_is_still_refused(inv: Inventory) -> None:
    """``localhost`` resolves everywhere: it must not become an address by accident."""
    asked: list[bool] = []

    def aliases() -> list[str]:
        asked.append(True)
        return ["jump", "gpu-box"]

    with pytest.raises(ConfigError) as info:
        resolve_hosts(inv, ["localhost"], ssh_aliases=aliases)
    message = str(info.value)
    assert "'localhost' is not in the inventory" in message
    assert "say user@localhost or ssh://localhost" in message
    assert asked == [True]


def test_an_ssh_config_alias_is_a_host(inv: Inventory) -> None:
    (t,) = resolve_hosts(inv, ["gpu-box"], ssh_aliases=lambda: ["gpu-box", "jump"])
    assert (t.name, t.address, t.connection) == ("gpu-box", "gpu-box", "ssh")
    assert t.vars == {"sglang_root": "/root/sglang/python/sglang", "model": "/models/glm", "tp": 1}
    with pytest.raises(ConfigError) as info:
        resolve_hosts(inv, ["gpu-bx"], ssh_aliases=lambda: ["gpu-box"])
    assert "did you mean 'gpu-box'?" in str(info.value)


def test_the_ssh_config_is_read_only_when_a_selector_needs_it(inv: Inventory) -> None:
    def boom() -> list[str]:
        raise AssertionError("the ssh config was read")

    selected = resolve_hosts(
        inv, ["blackwell", "sandbox", "10.9.9.9", "u@gpu7.example", "ssh://gpu8.example:2200"],
        ssh_aliases=boom,
    )
    assert names(selected) == ["blackwell-1", "blackwell-2", "sandbox", "10.9.9.9",
                               "gpu7.example", "gpu8.example"]
    assert selected[-1].port == 2200


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("ssh://gpu9", ("gpu9", None, None)),
        ("ssh://admin@gpu9:2022/", ("gpu9", "admin", 2022)),
        ("ssh://[fe80::2]:22", ("fe80::2", None, 22)),
        ("admin@gpu9", ("gpu9", "admin", None)),
    ],
)
def test_explicit_addresses(selector: str, expected: tuple[object, ...]) -> None:
    (t,) = resolve_hosts(Inventory(), [selector])
    assert (t.address, t.user, t.port) == expected


def test_user_at_an_inventory_name_is_that_host(inv: Inventory) -> None:
    (t,) = resolve_hosts(inv, ["admin@blackwell-1"])
    assert (t.name, t.address, t.user) == ("blackwell-1", "10.1.230.174", "admin")
    assert t.vars["tp"] == 8


def test_other_schemes_are_refused() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_hosts(Inventory(), ["http://gpu9"])
    assert "only ssh:// addresses" in str(info.value)


def test_a_bare_name_with_a_port_is_not_an_address(inv: Inventory) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_hosts(inv, ["gpu7.example:2022"])
    assert "say user@gpu7.example or ssh://gpu7.example" in str(info.value)
