"""The playbook side of flags across releases: new keys, templated anchors, ``when:``, facts.

Pure tests of the models, rendering and facts, then the helper's
``read_host`` over the local transport (facts gathered by an interpreter,
paths with fact markers, the modules an ``add_flag`` follows), then a
``--check`` over sshd where ``sglang_root`` comes from the facts of the
running server's own interpreter and environment.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from orchestrator.core.edit_spec import Anchor, EditSpec
from orchestrator.core.facts import (
    MARKER,
    Facts,
    VersionString,
    deferred_facts,
    deferred_root_vars,
    packages_named,
)
from orchestrator.core.flags import FlagRequest
from orchestrator.core.models import parse_playbook
from orchestrator.core.rendering import render_paths, render_playbook
from orchestrator.core.target import HostTarget
from orchestrator.core.templating import Renderer
from orchestrator.errors import ConfigError, TemplateError
from orchestrator.pipeline.session import HostSession
from orchestrator.standin import make_tree
from tests.fixtures.forkrun import run_orch
from tests.fixtures.sandbox import Sandbox
from tests.fixtures.sshd import SshdServer, free_port

REPO = Path(__file__).resolve().parents[1]


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as error:
        parse_playbook(text, "p.yaml")
    return str(error.value)


# --------------------------------------------------------------------------- the model


FLAG_BOOK = """\
name: t
vars: {threshold: 32, near: speculative_accept_threshold_acc}
files:
  - path: "{{ sglang_root }}/srt/server_args.py"
    edits:
      - add_flag:
          name: --speculative-disable-batch-threshold
          type: int
          default: "{{ threshold }}"
          help: "Threshold {{ threshold }}."
          near: "{{ near }}"
      - content: "x = 1"
        after_call: "--speculative-accept-threshold-acc"
      - content: '"x"'
        into: ORDER
        after_item: 7
        when: "facts.packages.sglang is defined"
"""


def test_add_flag_and_structural_anchors_render_to_engine_values() -> None:
    pb = parse_playbook(FLAG_BOOK, "p.yaml")
    facts = Facts.from_wire({"packages": {"sglang": {"path": "/s/sglang", "version": "0.5.14"}}})
    variables = {**pb.vars, "sglang_root": "/s/sglang", "facts": facts.as_var()}
    rendered = render_playbook(pb, None, variables, Renderer())
    flag, call, item = rendered.files[0].edits
    assert flag == FlagRequest(
        name="speculative_disable_batch_threshold", type="int", default=32, help="Threshold 32.",
        near=("speculative_accept_threshold_acc",), markers=True, marker_id="t:0.0",
        file="p.yaml", line=6, key="files[0].edits[0].add_flag",
    )
    assert isinstance(call, EditSpec) and call.anchor == Anchor(
        "after", "add_argument", kind="call", arg="--speculative-accept-threshold-acc"
    )
    assert call.key == "files[0].edits[1].after_call"
    assert isinstance(item, EditSpec) and item.anchor == Anchor("after", "ORDER", kind="item", arg="7")
    assert item.key == "files[0].edits[2].into"


def test_when_false_drops_the_edit_and_a_file() -> None:
    text = FLAG_BOOK + """\
  - path: /other.py
    when: "facts.packages.sglang is defined and facts.packages.sglang.version >= '0.5.20'"
    edits:
      - content: "y = 1"
        after: "z"
"""
    pb = parse_playbook(text, "p.yaml")
    facts = Facts.from_wire({"packages": {"sglang": {"path": "/s/sglang", "version": "0.5.9"}}})
    rendered = render_playbook(pb, None, {**pb.vars, "sglang_root": "/s", "facts": facts.as_var()}, Renderer())
    assert [f.index for f in rendered.files] == [0]  # 0.5.9 < 0.5.20 as versions ("0.5.9" > "0.5.20" as text)
    none = Facts.from_wire({"packages": {}})
    rendered = render_playbook(pb, None, {**pb.vars, "sglang_root": "/s", "facts": none.as_var()}, Renderer())
    assert [f.index for f in rendered.files] == [0]
    assert len(rendered.files[0].edits) == 2  # the item edit's `when` is false without sglang


def test_a_when_that_fails_names_its_key() -> None:
    pb = parse_playbook(FLAG_BOOK.replace("facts.packages.sglang is defined", "facts.packages.sglang.version > '1'"), "p.yaml")
    with pytest.raises(TemplateError) as error:
        render_playbook(pb, pb.locations, {**pb.vars, "sglang_root": "/s", "facts": Facts().as_var()}, Renderer())
    assert str(error.value).startswith("p.yaml:17: files[0].edits[2].when: 'dict object' has no attribute 'sglang'")


def test_templated_anchors() -> None:
    pb = parse_playbook(
        "name: t\nvars: {flag: --accept}\nfiles:\n  - path: /m.py\n    edits:\n"
        "      - content: x = 1\n        after: '\"{{ flag }}\"'\n"
        "      - delete: 'old = {{ 1 + 1 }}'\n",
        "p.yaml",
    )
    rendered = render_playbook(pb, None, pb.vars, Renderer())
    assert [e.anchor.pattern for e in rendered.files[0].edits] == ['"--accept"', "old = 2"]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("{add_flag: {name: x, near: y}, after: z}", "after is only for insert and content, not add_flag"),
        ("{add_flag: {name: 'bad name', near: y}}", "add_flag.name: expected a field name or a --flag (got: 'bad name')"),
        ("{add_flag: {name: x, type: int, default: two, near: y}}", "add_flag: default 'two' is not a int"),
        ("{add_flag: {name: x, type: long, near: y}}", "add_flag.type: expected one of int, float, str, bool (got: long)"),
        ("{add_flag: {name: x}}", "add_flag.near: field required"),
        ("{content: x, after_item: a}", "after_item needs into: (the list, tuple, set or dict it is an element of)"),
        ("{content: x, after: a, into: L}", "into is only with after_item or before_item"),
        ("{content: x, after_call: {func: f, argh: a}}", "after_call.argh: extra key not permitted (did you mean 'arg'?)"),
        ("{content: x, after_field: a, before_field: b}", "content needs exactly one of after, before"),
    ],
)
def test_shape_errors_are_one_line_at_their_key(edit: str, message: str) -> None:
    got = error_of(f"name: x\nfiles:\n  - path: a\n    edits:\n      - {edit}\n")
    assert message in got and got.startswith("p.yaml:5: files[0].edits[0]") and "\n" not in got


def test_server_preflight_is_a_command_line() -> None:
    pb = parse_playbook("name: t\nserver:\n  preflight: 'check {{ argv }}'\n", "p.yaml")
    assert pb.server is not None and pb.server.preflight == "check {{ argv }}"


# --------------------------------------------------------------------------- facts


def test_versions_compare_as_versions() -> None:
    v = VersionString("0.5.9")
    assert v < "0.5.14" and v >= "0.5.9" and v == "0.5.9.0" and v != "0.5.10"
    assert VersionString("0.4.10.post2") < "0.5" and VersionString("0.5.23") > "0.5.20"
    with pytest.raises(ValueError, match="cannot compare versions '0.0.0-standin'"):
        _ = VersionString("0.0.0-standin") < "1"


def test_packages_named_in_the_playbook_are_looked_up() -> None:
    assert packages_named(["when: facts.packages.flashinfer.version > '1'", "facts.packages['my-ext'].path"]) == [
        "sglang", "vllm", "flashinfer", "my-ext",
    ]


def test_paths_render_with_deferred_facts_as_markers() -> None:
    pb = parse_playbook("name: t\nfiles:\n  - path: '{{ sglang_root }}/srt/x.py'\n    edits: [{content: a, after: b}]\n"
                        "  - path: '{{ facts.packages.vllm.path }}/y.py'\n    edits: [{content: a, after: b}]\n", "p.yaml")
    variables = {"facts": deferred_facts(), **deferred_root_vars(["sglang", "vllm"])}
    assert render_paths(pb, None, variables, Renderer()) == [
        MARKER.format("packages.sglang.path") + "/srt/x.py",
        MARKER.format("packages.vllm.path") + "/y.py",
    ]
    bad = parse_playbook("name: t\nfiles:\n  - path: \"{{ 'a' if facts.packages.sglang.version > '1' else 'b' }}\"\n"
                         "    edits: [{content: a, after: b}]\n", "p.yaml")
    with pytest.raises(TemplateError, match="only known once the host is read"):
        render_paths(bad, None, {"facts": deferred_facts()}, Renderer())


def test_root_vars_default_to_installed_packages_and_lose_to_vars() -> None:
    from orchestrator.core.rendering import merge_vars

    facts = Facts.from_wire({"packages": {"sglang": {"path": "/site/sglang", "version": "0.5.14"}}})
    assert merge_vars({}, {}, {}, {"python": "p", **facts.root_vars()})["sglang_root"] == "/site/sglang"
    assert merge_vars({}, {"sglang_root": "/src/sglang"}, {}, {"python": "p", **facts.root_vars()})["sglang_root"] == "/src/sglang"
    assert "vllm_root" not in facts.root_vars()


# --------------------------------------------------------------------------- the helper's read_host, for real


def test_read_host_gathers_facts_fills_paths_and_follows_imports(tmp_path: Path) -> None:
    import pytest as installed

    root = make_tree(tmp_path / "tree", layout="spec")
    server_args = root / "srt" / "server_args.py"
    with HostSession(HostTarget(name="local", connection="local", python=sys.executable)) as host:
        got = host.call(
            "read_host",
            paths=[MARKER.format("packages.pytest.path") + "/__init__.py", str(server_args)],
            packages=["pytest", "json", "no_such_package_x"],
            python=sys.executable,
            follow=[{"index": 1, "names": ["speculative_accept_threshold_acc"]}],
        )
    facts = Facts.from_wire(got["facts"])
    assert facts.packages["pytest"].version == installed.__version__
    assert facts.packages["json"].version is None and facts.packages["json"].path.endswith("/json")
    assert "no_such_package_x" not in facts.packages
    assert got["paths"][0] == str(Path(installed.__file__).parent / "__init__.py")
    assert got["files"][0]["exists"] and got["files"][1]["exists"]
    followed = [Path(info["path"]).relative_to(root).as_posix() for info in got["companions"]["1"]]
    assert followed == ["srt/arg_groups/fields/spec.py"]
    assert b"class Spec(Struct)" in got["companions"]["1"][0]["data"]  # file contents arrive as bytes


def test_check_takes_sglang_root_from_the_running_servers_facts(tmp_path: Path, sshd: SshdServer) -> None:
    """No sglang_root var: the hand-started server's interpreter and PYTHONPATH say where sglang is."""
    root = make_tree(tmp_path / "box", layout="annotated")
    box = Sandbox(tmp_path, sshd, free_port(), root, tmp_path / "state")
    inventory = box.write_inventory()
    data = json.loads(inventory.read_text())
    del data["hosts"]["gpu"]["vars"]["sglang_root"]
    inventory.write_text(json.dumps(data))
    book = tmp_path / "facts.yaml"
    book.write_text(
        (REPO / "playbooks" / "speculative-disable.yaml").read_text()
        + "\n# facts-only edits\n"
    )
    extra = tmp_path / "when.yaml"
    extra.write_text(
        "name: when\nfiles:\n  - path: '{{ sglang_root }}/srt/server_args.py'\n    edits:\n"
        "      - content: 'HERE = 1'\n        after: 'logger = logging.getLogger(__name__)'\n"
        "        when: facts.packages.sglang is defined and facts.packages.sglang.version is none\n"
        "      - content: 'NOT_HERE = 1'\n        after: 'logger = logging.getLogger(__name__)'\n"
        "        when: facts.packages.vllm is defined\n"
        "server: {manager: process}\n"
        "health: {base_url: 'http://127.0.0.1:{{ port }}', checks: [{get: /health}]}\n"
    )
    try:
        box.start_by_hand()
        for playbook, needle in ((book, "speculative_disable_batch_threshold: A["), (extra, "+HERE = 1")):
            proc = run_orch(["deploy", "--check", "--diff", "--json", "--host", "gpu",
                 "--ssh-config", str(sshd.ssh_config), str(playbook)], cwd=tmp_path, timeout=240,
                env=dict(os.environ, COLUMNS="200", NO_COLOR="1"))
            assert proc.returncode == 0, proc.stderr
            host = json.loads(proc.stdout)["hosts"]["gpu"]
            assert host["outcome"] == "planned"
            assert host["files"] == [str(root / "srt" / "server_args.py")]
            assert needle in proc.stderr and "NOT_HERE" not in proc.stderr
    finally:
        box.stop_all()


def test_an_undefined_root_says_no_package_was_found_to_default_it(tmp_path: Path) -> None:
    (tmp_path / "inventory.yaml").write_text(json.dumps({"hosts": {"sandbox": {
        "connection": "local", "state_dir": str(tmp_path / "state"), "python": sys.executable}}}))
    proc = run_orch(["deploy", "--check", "--json", "--host", "sandbox",
         "--var", f"port={free_port()}",  # nothing listens there: no server's facts either
         str(REPO / "playbooks" / "speculative-disable.yaml")], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    error = json.loads(proc.stdout)["hosts"]["sandbox"]["error"]
    assert "files[0].path: 'sglang_root' is undefined (set it, or install sglang for" in error
    assert "\n" not in error


NO_VERSION_BOOK = """\
name: no-version
files:
  - path: '{{ sglang_root }}/srt/server_args.py'
    when: "%s"
    edits:
      - content: 'HERE = 1'
        after: 'logger = logging.getLogger(__name__)'
server: {manager: process}
health: {base_url: 'http://127.0.0.1:{{ port }}', checks: [{get: /health}]}
"""


def test_a_version_test_on_a_package_without_version_metadata_is_an_error_in_both_forms(
    tmp_path: Path, sshd: SshdServer
) -> None:
    """The stand-in runs from a source tree on PYTHONPATH: sglang has a path and no version.
    A `when:` that tests its version is refused (exit 2, one line), never false (a skipped
    file) nor a TypeError; the comparison and the `is version(...)` forms say the same."""
    root = make_tree(tmp_path / "box", layout="classic")
    box = Sandbox(tmp_path, sshd, free_port(), root, tmp_path / "state")
    box.write_inventory()
    server_args = root / "srt" / "server_args.py"
    before = server_args.read_bytes()
    forms = {
        "compare": "facts.packages.sglang.version >= '0.5.20'",
        "test": "facts.packages.sglang.version is version('0.5.20', '>=')",
        "guarded": "facts.packages.sglang.version is not none and facts.packages.sglang.version >= '0.5.20'",
    }
    errors = {}
    try:
        pid = box.start_by_hand()
        for name, when in forms.items():
            book = tmp_path / f"{name}.yaml"
            book.write_text(NO_VERSION_BOOK % when)
            proc = box.orch("deploy", "--json", "--host", "gpu", str(book))
            if name == "guarded":  # `is none` tells a missing version apart: false, nothing to do
                assert proc.returncode == 0, proc.stdout + proc.stderr
                assert json.loads(proc.stdout)["hosts"]["gpu"]["outcome"] == "unchanged"
                continue
            assert proc.returncode == 2, proc.stdout + proc.stderr
            errors[name] = json.loads(proc.stdout)["hosts"]["gpu"]["error"]
        assert box.server_pid() == pid  # the running server was not touched
    finally:
        box.stop_all()
    for name, error in errors.items():
        assert error == (f"{name}.yaml:4: files[0].when: facts.packages.sglang has no version "
                         "(no installed metadata: a source tree on PYTHONPATH?)")
    assert server_args.read_bytes() == before
    assert not (tmp_path / "state" / "releases").exists() or not any((tmp_path / "state" / "releases").iterdir())


def test_versions_missing_refuse_every_version_test() -> None:
    facts = Facts.from_wire({"packages": {"sglang": {"path": "/s/sglang", "version": None},
                                          "vllm": {"path": "/v/vllm", "version": "0.8.0"}}}).as_var()
    renderer = Renderer()
    for expression in ("facts.packages.sglang.version >= '0.5.20'", "'0.5.20' <= facts.packages.sglang.version",
                       "facts.packages.sglang.version is version('0.5.20', '>=')",
                       "version(facts.packages.sglang.version) < '1'", "facts.packages.sglang.version == '0.5'"):
        with pytest.raises(TemplateError) as error:
            renderer.evaluate(expression, {"facts": facts}, file="p.yaml", line=4, key="files[0].when")
        assert str(error.value) == ("p.yaml:4: files[0].when: facts.packages.sglang has no version "
                                    "(no installed metadata: a source tree on PYTHONPATH?)")
    assert renderer.evaluate("facts.packages.sglang.version is none", {"facts": facts}) is True
    assert renderer.evaluate("facts.packages.vllm.version is version('0.8', '>=')", {"facts": facts}) is True
    assert renderer.evaluate("facts.packages.vllm.version >= '0.8'", {"facts": facts}) is True
    assert renderer.evaluate("facts.packages.vllm.version is none", {"facts": facts}) is False
