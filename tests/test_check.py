"""``orch deploy --check`` over real sshd: plan, render, stage, validate — change nothing.

The target is a copy of the REAL ``sglang/srt/server_args.py`` of SGLang
0.5.13 (fetched from the package registry at test time, cached).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.fixtures.forkrun import run_orch
from tests.fixtures.sandbox import sha256
from tests.fixtures.sglang_wheel import sglang_file
from tests.fixtures.sshd import SshdServer, free_port

REPO = Path(__file__).resolve().parents[1]
STORY = REPO / "playbooks" / "speculative-disable.yaml"


def files_only(folder: Path) -> str:
    """The story's playbook without ``server``/``health``: what ``--check`` plans on a box
    whose server is down, with nothing a deploy would refuse."""
    import yaml

    data = yaml.safe_load(STORY.read_text())
    data.pop("server"), data.pop("health")
    path = folder / "files-only.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


class Box:
    """A host dir with the real server_args.py, and the orch CLI pointed at it over sshd."""

    def __init__(self, tmp: Path, sshd: SshdServer) -> None:
        self.tmp = tmp
        self.sshd = sshd
        self.sglang_root = tmp / "host" / "python" / "sglang"
        (self.sglang_root / "srt").mkdir(parents=True)
        self.target = self.sglang_root / "srt" / "server_args.py"
        shutil.copy(sglang_file("0.5.13", "sglang/srt/server_args.py"), self.target)
        self.state_dir = tmp / "state"
        self.inventory(port=sshd.port, known_hosts=str(sshd.known_hosts))

    def inventory(self, **over: object) -> None:
        host = {
            "address": self.sshd.host, "user": self.sshd.user,
            "identity_file": str(self.sshd.client_key),
            "state_dir": str(self.state_dir), "python": sys.executable,
            "vars": {"sglang_root": str(self.sglang_root), "port": free_port()},
        }
        host.update(over)
        (self.tmp / "inventory.yaml").write_text(json.dumps({"hosts": {"gpu": host}}))

    def listing(self) -> list[str]:
        return sorted(os.listdir(self.target.parent))

    def orch(self, *args: str) -> tuple[int, str, dict]:
        proc = run_orch(["deploy", "--check", "--json", "--host", "gpu", "--ssh-config", str(self.sshd.ssh_config),
                         *args], cwd=self.tmp, timeout=120, env=dict(os.environ, COLUMNS="160", NO_COLOR="1"))
        report = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
        return proc.returncode, proc.stderr, report


@pytest.fixture
def box(tmp_path: Path, sshd: SshdServer) -> Box:
    return Box(tmp_path, sshd)


def test_check_plans_the_story_patch_on_real_sglang_and_changes_nothing(box: Box) -> None:
    before_sha, before_ls = sha256(box.target), box.listing()
    code, err, rep = box.orch("--diff", files_only(box.tmp))
    assert code == 0, err
    host = rep["hosts"]["gpu"]
    assert host["outcome"] == "planned"
    assert host["files"] == [str(box.target)]
    # the diff, then the sed -n view: the new call right after the `)` closing
    # --speculative-accept-threshold-acc (lines 5882-5887), before --speculative-token-map
    assert "+        parser.add_argument(" in err
    # (the field's 1 line + 2 markers shift the call from 5882-5887 to 5885-5890)
    assert "sed -n 609,617p" in err and "sed -n 5888,5901p" in err
    lines = [line.strip() for line in err.splitlines()]
    begin = lines.index("❱ 5891         # >>> orch speculative-disable:0.0.argument")
    assert lines[begin - 1] == "5890         )"
    assert lines[begin - 2] == "5889             default=ServerArgs.speculative_accept_threshold_acc,"
    assert lines[begin + 1] == "❱ 5892         parser.add_argument("
    assert lines[begin + 2] == '❱ 5893             "--speculative-disable-batch-threshold",'
    assert lines[begin + 7] == "❱ 5898         # <<< orch speculative-disable:0.0.argument"
    assert lines[begin + 8] == "5899         parser.add_argument("
    assert lines[begin + 9] == '5900             "--speculative-token-map",'
    assert sha256(box.target) == before_sha
    assert box.listing() == before_ls  # nothing staged or compiled is left beside it
    assert not box.state_dir.exists()  # --check creates nothing on the host


def test_check_after_apply_reports_unchanged(box: Box) -> None:
    from orchestrator.core.edits import plan_file
    from orchestrator.core.flags import expand_edits
    from orchestrator.core.rendering import render_playbook
    from orchestrator.shell.config_files import load_playbook, make_renderer

    loaded = load_playbook(REPO / "playbooks" / "speculative-disable.yaml")
    variables = {**loaded.model.vars, "sglang_root": str(box.sglang_root), "python": "python3"}
    renderer = make_renderer(loaded)
    rendered = render_playbook(loaded.model, loaded.locations, variables, renderer)
    text = box.target.read_text()
    edits, _ = expand_edits(str(box.target), rendered.files[0].edits, text, {}, renderer, variables)
    box.target.write_text(plan_file(str(box.target), text, edits[str(box.target)]).result)
    code, err, rep = box.orch(files_only(box.tmp))
    assert code == 0, err
    assert rep["hosts"]["gpu"]["outcome"] == "unchanged"


def write(box: Box, name: str, text: str) -> str:
    path = box.tmp / name
    path.write_text(text)
    return str(path)


PLAYBOOK = """\
name: t
files:
  - path: "{{{{ sglang_root }}}}/srt/server_args.py"
    edits:
      - content: "{content}"
        after: '{anchor}'
    validate: [python-syntax]
"""


@pytest.mark.parametrize(
    ("name", "content", "anchor", "needle"),
    [
        ("anchor", "x = 1", "no_such_line_anywhere", "t.yaml:6: files[0].edits[0].after: anchor matches 0 places"),
        ("syntax", "x = {{ 1 +", "speculative_accept_threshold_acc:", "t.yaml:5: files[0].edits[0].content:"),
        ("undefined", "x = {{ nope }}", "speculative_accept_threshold_acc:", "'nope' is undefined"),
        ("pysyntax", "x = (", "speculative_accept_threshold_acc:", "does not parse: line 613: '(' was never closed"),
    ],
)
def test_bad_playbooks_are_one_line_errors_and_touch_nothing(
    box: Box, name: str, content: str, anchor: str, needle: str
) -> None:
    before_sha, before_ls = sha256(box.target), box.listing()
    code, err, rep = box.orch(write(box, "t.yaml", PLAYBOOK.format(content=content, anchor=anchor)))
    assert code == 2, err
    error = rep["hosts"]["gpu"]["error"] if rep else err.strip().splitlines()[-1]
    assert needle in error, error
    assert "\n" not in error and "Traceback" not in err
    assert sha256(box.target) == before_sha
    assert box.listing() == before_ls


def test_malformed_yaml_is_refused_before_any_host(box: Box) -> None:
    code, err, _ = box.orch(write(box, "bad.yaml", "name: t\nfiles:\n  - path: [unclosed\n"))
    assert code == 2
    last = err.strip().splitlines()
    assert len(last) == 1 and last[0].startswith("orch: error: bad.yaml:")
    assert "malformed YAML" in last[0]


def test_unreachable_host_is_one_line_exit_2(box: Box) -> None:
    box.inventory(port=free_port(), known_hosts=str(box.sshd.known_hosts))
    code, err, rep = box.orch(str(REPO / "playbooks" / "speculative-disable.yaml"))
    assert code == 2
    assert rep["hosts"]["gpu"]["outcome"] == "unreachable"
    assert "connection refused" in rep["hosts"]["gpu"]["error"]
    assert "\n" not in rep["hosts"]["gpu"]["error"]


def test_unknown_host_key_is_refused_and_nothing_changes(box: Box) -> None:
    empty = box.tmp / "known_hosts"
    empty.write_text("")
    box.inventory(port=box.sshd.port, known_hosts=str(empty))
    before = sha256(box.target)
    code, err, rep = box.orch(str(REPO / "playbooks" / "speculative-disable.yaml"))
    assert code == 2
    assert "unknown host key" in rep["hosts"]["gpu"]["error"]
    assert "--accept-new-host-key" in rep["hosts"]["gpu"]["error"]
    assert empty.read_text() == ""
    assert sha256(box.target) == before
    code, err, rep = box.orch("--accept-new-host-key", files_only(box.tmp))
    assert code == 0, err
    assert f"[127.0.0.1]:{box.sshd.port} ssh-ed25519" in empty.read_text()


def test_check_over_the_local_transport(tmp_path: Path) -> None:
    root = tmp_path / "python" / "sglang"
    (root / "srt").mkdir(parents=True)
    target = root / "srt" / "server_args.py"
    shutil.copy(sglang_file("0.5.13", "sglang/srt/server_args.py"), target)
    (tmp_path / "inventory.yaml").write_text(json.dumps({"hosts": {"sandbox": {
        "connection": "local", "state_dir": str(tmp_path / "state"), "python": sys.executable,
        "vars": {"sglang_root": str(root)}}}}))
    before = sha256(target)
    proc = run_orch(["deploy", "--check", "--json", "--host", "sandbox", files_only(tmp_path)], cwd=tmp_path,
                    timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["hosts"]["sandbox"]["outcome"] == "planned"
    assert sha256(target) == before
    assert sorted(os.listdir(target.parent)) == ["server_args.py"]


VALIDATOR = """\
name: t
files:
  - path: "{{ sglang_root }}/srt/server_args.py"
    edits:
      - content: "x = 1"
        after: "speculative_accept_threshold_acc:"
    validate:
      - python-syntax
      - "{{ python }} -c 'import sys, pathlib; p = pathlib.Path(sys.argv[1]); p.with_suffix(\\".tmp\\").write_text(\\"x\\"); sys.exit(\\"mytool: refused \\" + p.name)' {{ staged }}"
"""


def test_failing_validator_runs_on_the_staged_copy_and_leaves_nothing(box: Box) -> None:
    before_sha, before_ls = sha256(box.target), box.listing()
    code, err, rep = box.orch(write(box, "t.yaml", VALIDATOR))
    assert code == 2, err
    error = rep["hosts"]["gpu"]["error"]
    assert "files[0].validate" in error and "mytool: refused .server_args.orch-staged-" in error
    assert sha256(box.target) == before_sha
    assert box.listing() == before_ls  # the staged copy and what the validator derived from its name are gone
