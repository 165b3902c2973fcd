"""Ansible's habits (issue 21, item 3): settings from flag > environment > config file,
``orch config``, ``--var @file.yaml``, ``--list-hosts``, and ``--to`` by the printed suffix.

Each test runs the real ``orch`` in a subprocess from a directory of its own, with
``XDG_CONFIG_HOME`` pointed into it, so no file of the machine's user leaks in.
``--list-hosts`` runs name hosts on loopback ports where nothing listens: an exit 0
with the selection printed shows nothing was contacted (a connection would fail).
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import options
from orchestrator.core.releases import resolve_release
from orchestrator.core.settings import ConfigFile, Setting, parse_config_file, resolve_settings
from orchestrator.errors import ConfigError
from orchestrator.host import wire
from orchestrator.host.records import Manifest
from tests.fixtures.forkrun import run_orch
from tests.fixtures.sshd import free_port

INVENTORY = """\
defaults:
  port: {port}
hosts:
  gpu1: {{address: 127.0.0.1}}
  gpu2: {{address: 127.0.0.2}}
  gpu3: {{address: 127.0.0.3}}
  gpu4: {{address: 127.0.0.4}}
  gpu5: {{address: 127.0.0.5}}
  local-box:
    connection: local
groups:
  rack: [gpu1, gpu2, gpu3]
"""


def orch(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("ORCH_") and k not in ("NO_COLOR", "FORCE_COLOR")}
    environ.update(XDG_CONFIG_HOME=str(cwd / "xdg"), COLUMNS="80", **(env or {}))
    return run_orch([*args], cwd=cwd, env=environ, timeout=120)


def config_json(cwd: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = orch(cwd, "config", "--json", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "work").mkdir(mode=0o755)
    (tmp_path / "work" / "xdg").mkdir()
    return tmp_path / "work"


def test_flag_beats_environment_beats_file_beats_default(home: Path) -> None:
    assert config_json(home)["settings"]["forks"] == {"value": 10, "source": "default"}
    (home / "orch.yaml").write_text("forks: 3\ninventory: inv/fleet.yaml\n")
    got = config_json(home)
    assert got["config_file"] == "./orch.yaml"
    assert got["settings"]["forks"] == {"value": 3, "source": "./orch.yaml: forks"}
    got = config_json(home, env={"ORCH_FORKS": "5", "ORCH_INVENTORY": "/etc/orch/hosts.yaml"})
    assert got["settings"]["forks"] == {"value": 5, "source": "ORCH_FORKS"}
    assert got["settings"]["inventory"] == {"value": "/etc/orch/hosts.yaml", "source": "ORCH_INVENTORY"}


def test_the_first_config_file_found_is_used_and_its_paths_are_relative_to_it(home: Path) -> None:
    xdg = home / "xdg" / "orch"
    xdg.mkdir(parents=True)
    (xdg / "config.yaml").write_text("inventory: hosts.yaml\nssh_config: ../ssh/config\nforks: 7\n")
    got = config_json(home)
    assert got["config_file"] == str(xdg / "config.yaml")
    assert got["settings"]["inventory"]["value"] == str(xdg / "hosts.yaml")
    assert os.path.normpath(got["settings"]["ssh_config"]["value"]) == str(home / "xdg" / "ssh" / "config")
    # ./orch.yaml comes first; the XDG one is then ignored entirely (its forks too)
    (home / "orch.yaml").write_text("inventory: here.yaml\n")
    got = config_json(home)
    assert got["config_file"] == "./orch.yaml"
    assert got["settings"]["forks"] == {"value": 10, "source": "default"}


def test_a_config_file_in_a_world_writable_directory_is_ignored_with_a_warning(home: Path) -> None:
    (home / "orch.yaml").write_text("forks: 3\n")
    home.chmod(0o777)
    try:
        proc = orch(home, "config", "--json")
    finally:
        home.chmod(0o755)
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["settings"]["forks"]["value"] == 10
    assert "warning: ignoring ./orch.yaml" in proc.stderr and "world-writable" in proc.stderr


def test_colour_no_color_beats_the_file_and_the_flags_beat_both(home: Path) -> None:
    (home / "orch.yaml").write_text("color: true\n")
    assert config_json(home)["settings"]["color"] == {"value": True, "source": "./orch.yaml: color"}
    assert config_json(home, env={"NO_COLOR": "1"})["settings"]["color"] == {"value": False,
                                                                              "source": "NO_COLOR"}
    got = config_json(home, "--color", env={"NO_COLOR": "1"})["settings"]["color"]
    assert got == {"value": True, "source": "--color"}


def test_a_bad_config_file_or_variable_is_one_line_and_exit_2(home: Path) -> None:
    (home / "orch.yaml").write_text("forks: 3\nfroks: 4\n")
    proc = orch(home, "config")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "orch.yaml:2" in proc.stderr and "froks" in proc.stderr
    (home / "orch.yaml").unlink()
    proc = orch(home, "config", env={"ORCH_FORKS": "many"})
    assert proc.returncode == 2 and "ORCH_FORKS" in proc.stderr


def test_resolve_settings_is_pure_and_keeps_sources() -> None:
    got = resolve_settings({"forks": 2}, {"ORCH_FORKS": "9"}, ConfigFile(forks=4), "/etc/x/orch.yaml")
    assert (got.forks.value, got.forks.source) == (2, "--forks")
    got = resolve_settings({}, {}, ConfigFile(inventory="~/inv.yaml"), "/etc/x/orch.yaml")
    assert got.inventory.value == os.path.expanduser("~/inv.yaml")


def test_link_timeout_resolves_like_the_other_settings_and_refuses_too_short_a_limit(home: Path) -> None:
    """``link_timeout``: --link-timeout > ORCH_LINK_TIMEOUT > the config file > 30 s; under the
    floor (3 s: pings and ticks come at a third of it), or not a number, it is one line naming
    where it came from, exit 2."""
    file = ConfigFile(link_timeout=12)
    assert resolve_settings({}, {}, None, None).link_timeout == Setting(30.0, "default")
    assert resolve_settings({}, {}, file, "/etc/x/orch.yaml").link_timeout == Setting(12.0, "/etc/x/orch.yaml: link_timeout")
    env = {"ORCH_LINK_TIMEOUT": "6"}
    assert resolve_settings({}, env, file, "/etc/x/orch.yaml").link_timeout == Setting(6.0, "ORCH_LINK_TIMEOUT")
    flags = {"link_timeout": 9.5}
    assert resolve_settings(flags, env, file, "/etc/x/orch.yaml").link_timeout == Setting(9.5, "--link-timeout")
    for text in ("2.9", "0", "-6", "six", "nan", "inf", ""):
        if not text:  # empty: not set, as for every ORCH_ variable
            assert resolve_settings({}, {"ORCH_LINK_TIMEOUT": text}, None, None).link_timeout.source == "default"
            continue
        with pytest.raises(ConfigError, match="^ORCH_LINK_TIMEOUT: ORCH_LINK_TIMEOUT=.*: expected seconds, 3 or more$"):
            resolve_settings({}, {"ORCH_LINK_TIMEOUT": text}, None, None)
    with pytest.raises(ConfigError, match=r"^orch\.yaml:2: link_timeout: must be >= 3"):
        parse_config_file("forks: 2\nlink_timeout: 1\n", "orch.yaml")
    assert options.LINK_TIMEOUT_FLOOR == wire.LINK_TIMEOUT_FLOOR == 3.0  # the flag's range is the helper's floor

    got = config_json(home, env={"ORCH_LINK_TIMEOUT": "6"})["settings"]["link_timeout"]
    assert got == {"value": 6.0, "source": "ORCH_LINK_TIMEOUT"}
    (home / "orch.yaml").write_text("link_timeout: 2\n")
    proc = orch(home, "config")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert "orch.yaml:1" in proc.stderr and "link_timeout" in proc.stderr
    (home / "orch.yaml").unlink()
    proc = orch(home, "status", "--host", "gpu1", "--link-timeout", "1")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert "'--link-timeout'" in proc.stderr


def test_orch_inventory_and_the_config_file_pick_the_inventory_of_every_host_command(home: Path) -> None:
    port = free_port()
    (home / "inv").mkdir()
    (home / "inv" / "fleet.yaml").write_text(INVENTORY.format(port=port))
    proc = orch(home, "status", "--host", "rack", "--list-hosts", "--json",
                env={"ORCH_INVENTORY": str(home / "inv" / "fleet.yaml")})
    assert proc.returncode == 0, proc.stderr
    assert list(json.loads(proc.stdout)["hosts"]) == ["gpu1", "gpu2", "gpu3"]
    (home / "orch.yaml").write_text("inventory: inv/fleet.yaml\n")
    proc = orch(home, "history", "--host", "gpu4", "--list-hosts")
    assert proc.returncode == 0, proc.stderr
    assert "gpu4" in proc.stdout and "nothing contacted" in proc.stdout
    proc = orch(home, "history", "--host", "gpu9", "--list-hosts")
    assert proc.returncode == 2 and "gpu9" in proc.stderr


def test_list_hosts_shows_the_batches_of_serial_and_contacts_nothing(home: Path) -> None:
    port = free_port()
    (home / "inventory.yaml").write_text(INVENTORY.format(port=port))
    proc = orch(home, "deploy", "--host", "all", "--limit", "gpu*:!gpu5", "--serial", "1,50%",
                "--list-hosts", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["batches"] == [["gpu1"], ["gpu2", "gpu3"], ["gpu4"]]
    assert report["hosts"]["gpu3"] == {"address": "127.0.0.3", "batch": 2}
    assert report["exit_code"] == 0
    proc = orch(home, "deploy", "--host", "all", "--serial", "2", "--list-hosts")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "batch 1 (2 hosts):"
    assert "6 hosts selected; nothing contacted" in lines[-1]
    proc = orch(home, "rollback", "--host", "local-box", "--list-hosts")
    assert proc.returncode == 0 and "local-box  local" in proc.stdout
    assert not (home / ".orch").exists()


def test_var_files_replace_top_level_keys_in_command_line_order(home: Path) -> None:
    port = free_port()
    (home / "inventory.yaml").write_text(INVENTORY.format(port=port))
    (home / "a.yaml").write_text("threshold: 8\nmodel: {path: /models/a, tp: 8}\n")
    (home / "b.yaml").write_text("model: {path: /models/b}\n")
    (home / "playbooks").mkdir()
    # renders only when threshold is 16 and model has no tp (b.yaml replaced a.yaml's whole key)
    (home / "playbooks" / "show.yaml").write_text(textwrap.dedent("""\
        name: show
        files:
          - path: "{{ model.path if (threshold == 16 and model.tp is not defined) else not_set }}/x.py"
            edits: [{content: "X = 1", after: "x"}]
        """))

    def lint(*var_args: str) -> subprocess.CompletedProcess[str]:
        args = [a for v in var_args for a in ("--var", v)]
        return orch(home, "lint", "show", *args)

    assert lint("@a.yaml", "@b.yaml", "threshold=16").returncode == 0
    failed = lint("@a.yaml", "threshold=16")  # a.yaml's model still has tp
    assert failed.returncode == 2 and "not_set" in failed.stdout + failed.stderr
    assert lint("threshold=16", "@a.yaml", "@b.yaml").returncode == 2  # the file's 8 came later


def test_a_var_file_is_read_under_the_yaml_budgets_and_must_be_a_mapping(home: Path) -> None:
    port = free_port()
    (home / "inventory.yaml").write_text(INVENTORY.format(port=port))
    (home / "list.yaml").write_text("- a\n- b\n")
    proc = orch(home, "deploy", "--check", "--host", "gpu1", "--var", "@list.yaml")
    assert proc.returncode == 2 and "list.yaml" in proc.stderr and "mapping" in proc.stderr
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(8))
    (home / "bomb.yaml").write_text(bomb)
    proc = orch(home, "deploy", "--check", "--host", "gpu1", "--var", "@bomb.yaml")
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "bomb.yaml" in proc.stderr
    proc = orch(home, "deploy", "--check", "--host", "gpu1", "--var", "@missing.yaml")
    assert proc.returncode == 2 and "missing.yaml" in proc.stderr


def test_to_takes_a_full_id_a_unique_prefix_or_the_printed_suffix() -> None:
    ids = ["20261201T101010123-ba72", "20261201T111111456-c0de", "20261202T090909789-ba7f"]
    releases = {rid: Manifest.from_wire({"id": rid, "seq": n}) for n, rid in enumerate(ids, 1)}
    assert resolve_release("20261201T101010123-ba72", [], releases) == "20261201T101010123-ba72"
    assert resolve_release("20261202", [], releases) == "20261202T090909789-ba7f"
    assert resolve_release("ba72", [], releases) == "20261201T101010123-ba72"
    assert resolve_release("c0de", [], releases) == "20261201T111111456-c0de"
    with pytest.raises(ConfigError) as err:
        resolve_release("20261201", [], releases)
    assert "20261201T101010123-ba72" in str(err.value) and "20261201T111111456-c0de" in str(err.value)
    with pytest.raises(ConfigError):
        resolve_release("zzzz", [], releases)
