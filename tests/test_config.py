"""Configuration: YAML with lines, the models' one-line errors, vars, rendering, files on disk."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import orchestrator
from orchestrator.core.durations import parse_duration
from orchestrator.core.edit_spec import Anchor
from orchestrator.core.models import parse_inventory, parse_playbook
from orchestrator.core.rendering import (
    builtin_vars,
    merge_vars,
    parse_cli_vars,
    render_playbook,
    render_validate,
    yaml_scalar,
)
from orchestrator.core.secrets import redact, redact_text, secret_names
from orchestrator.core.templating import Renderer
from orchestrator.core.yamlsrc import key_path, load_yaml
from orchestrator.errors import ConfigError, TemplateError
from orchestrator.shell import config_files
from orchestrator.shell.config_files import (
    find_playbook,
    load_inventory,
    load_playbook,
    make_renderer,
    packaged_dir,
)

PB = "playbooks/x.yaml"


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def playbook_error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_playbook(dedent(text), PB)
    message = str(info.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------ yamlsrc


def test_line_of_keys_and_items_and_fallback() -> None:
    doc = load_yaml(
        dedent(
            """
            name: x
            files:
              - path: a
                edits:
                  - insert: t.j2
                    after: foo
            """
        ),
        "f.yaml",
    )
    assert doc.data["files"][0]["edits"][0]["after"] == "foo"
    assert doc.line_of(("name",)) == 1
    assert doc.line_of(("files", 0)) == 3
    assert doc.line_of(("files", 0, "edits", 0, "after")) == 6
    assert doc.line_of(("files", 0, "edits", 0, "nope", "deeper")) == 5  # nearest parent
    assert key_path(("files", 0, "edits", 1, "after")) == "files[0].edits[1].after"


def test_block_scalar_content_starts_on_next_line() -> None:
    doc = load_yaml("a: 1\nc: |\n  x\n  y\nd: plain\n", "f.yaml")
    assert doc.line_of(("c",)) == 2
    assert doc.content_line_of(("c",)) == 3
    assert doc.content_line_of(("d",)) == 5


def test_safe_loader_semantics_and_merge_keys() -> None:
    doc = load_yaml("base: &b {u: 1, v: 2}\nx:\n  <<: *b\n  v: 3\non: yes\n", "f.yaml")
    assert doc.data["x"] == {"u": 1, "v": 3}
    assert doc.data[True] is True  # YAML 1.1 as SafeLoader reads it
    with pytest.raises(ConfigError, match=r"^f.yaml:1: malformed YAML: could not determine"):
        load_yaml("a: !!python/name:os.system x\n", "f.yaml")


def test_malformed_yaml_names_file_and_line() -> None:
    text = "name: x\nfiles:\n  - path: a\n    b: c: d\n"
    with pytest.raises(ConfigError) as info:
        load_yaml(text, PB)
    assert str(info.value) == f"{PB}:4: malformed YAML: mapping values are not allowed here"


def test_duplicate_key_is_an_error_at_its_line() -> None:
    message = playbook_error(
        """
        name: x
        files:
          - path: a
            edits:
              - insert: t.j2
                after: b
              - insert: t.j2
                after: b
                after: c
        """
    )
    assert message == f"{PB}:9: files[0].edits[1]: duplicate key 'after'"


def test_empty_document() -> None:
    doc = load_yaml("", "f.yaml")
    assert doc.data is None
    assert parse_inventory("", "inventory.yaml").hosts == {}


# ------------------------------------------------------------------ models

GOOD = """
name: speculative-disable
vars: {threshold: 32}
files:
  - path: "{{ sglang_root }}/srt/server_args.py"
    edits:
      - insert: sglang/field.py.j2
        after: "speculative_accept_threshold_acc:"
      - content: |
          parser.add_argument(
              "--x-{{ threshold }}",
          )
        after: '"--speculative-accept-threshold-acc"'
        markers: false
      - replace: "old"
        with: "new {{ threshold }}"
        count: 2
      - delete_regex: "^x = \\\\d+$"
      - patch: fix.diff
    validate: [python-syntax, "{{ python }} -m mytool {{ staged }}"]
server:
  command: "{{ python }} -m sglang.launch_server --model-path {{ model }} --port 30000"
  flags: {"--speculative-disable-batch-threshold": "{{ threshold }}", "--on": true}
  python: /root/venv/bin/python
  env: {CUDA_VISIBLE_DEVICES: 0}
health:
  base_url: http://127.0.0.1:30000
  timeout: 15m
  checks:
    - get: /health
    - get: /get_server_info
      expect: {speculative_disable_batch_threshold: "{{ threshold }}", version: "0.5.13"}
    - post: /generate
      json: {text: "{{ model }}", sampling_params: {max_new_tokens: 4}}
      body: '"text"'
"""


def test_good_playbook_parses() -> None:
    pb = parse_playbook(GOOD, PB)
    assert pb.name == "speculative-disable"
    assert [e.kind_key for e in pb.files[0].edits] == [
        "insert",
        "content",
        "replace",
        "delete_regex",
        "patch",
    ]
    assert pb.files[0].edits[2].with_ == "new {{ threshold }}"
    assert pb.files[0].validate_ == ["python-syntax", "{{ python }} -m mytool {{ staged }}"]
    assert pb.server is not None and pb.server.stop_timeout == 30.0
    assert pb.server.env == {"CUDA_VISIBLE_DEVICES": "0"}
    assert pb.health is not None and pb.health.timeout == 900.0
    assert pb.health.confirm_timeout == 60.0
    assert pb.health.checks[2].method == "POST"


def test_validate_mapping_forms_are_normalised() -> None:
    pb = parse_playbook(
        dedent(
            """
            name: x
            files:
              - path: a
                edits: [{insert: t, after: b}]
                validate: {commands: ["mytool {{ staged }}"]}
              - path: b
                edits: [{insert: t, after: b}]
                validate: [python-syntax, {commands: [c1, c2]}]
            """
        ),
        PB,
    )
    assert pb.files[0].validate_ == ["mytool {{ staged }}"]
    assert pb.files[1].validate_ == ["python-syntax", "c1", "c2"]


def test_unknown_key_names_it() -> None:
    message = playbook_error(
        """
        name: x
        files:
          - path: a
            edits:
              - insert: t.j2
                aftr: b
        """
    )
    assert message == (
        f"{PB}:6: files[0].edits[0].aftr: extra key not permitted (did you mean 'after'?)"
    )


def test_unknown_key_beats_the_missing_key_it_caused() -> None:
    message = playbook_error("name: x\nfiles:\n  - path: a\n    edtis: []\n")
    assert message.startswith(f"{PB}:4: files[0].edtis: extra key not permitted")


def test_missing_required_key() -> None:
    assert playbook_error("vars: {}\nfiles: []\n") == f"{PB}:1: name: field required"
    message = playbook_error("name: x\nhealth:\n  checks: [{get: /}]\n")
    assert message == f"{PB}:2: health.base_url: field required"


def test_two_edit_kinds_in_one_edit() -> None:
    message = playbook_error(
        """
        name: x
        files:
          - path: a
            edits:
              - insert: t.j2
                after: b
              - insert: t.j2
                replace: b
        """
    )
    assert message == (
        f"{PB}:7: files[0].edits[1]: expected one of insert, content, replace, "
        "replace_regex, delete, delete_regex, patch, add_flag (got: insert and replace)"
    )


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ("{insert: t}", "insert needs exactly one of after, before, after_regex, before_regex"),
        ("{replace: a}", "replace needs with: (the replacement text)"),
        ("{delete: a, after: b}", "after is only for insert and content, not delete"),
        ("{patch: p.diff, count: 2}", "count is only for replace and replace_regex, not patch"),
        ("{}", "expected one of insert, content"),
    ],
)
def test_edit_shape_errors(edit: str, expected: str) -> None:
    message = playbook_error(f"name: x\nfiles:\n  - path: a\n    edits:\n      - {edit}\n")
    assert message.startswith(f"{PB}:5: files[0].edits[0]: {expected}")


def test_bad_regex_is_an_error_at_its_key() -> None:
    message = playbook_error(
        """
        name: x
        files:
          - path: a
            edits:
              - content: "x = 1"
                after_regex: "[a"
        """
    )
    assert message == (
        f"{PB}:6: files[0].edits[0].after_regex: bad regex: unterminated character set at position 0"
    )


def test_bad_duration() -> None:
    message = playbook_error(
        """
        name: x
        health:
          base_url: http://127.0.0.1:1
          timeout: 15x
          checks: [{get: /health}]
        """
    )
    assert message == (
        f"{PB}:4: health.timeout: invalid duration '15x': "
        "use seconds or a number with a unit: 500ms, 90s, 15m, 1h, 1h30m"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "server:\n  manager: proc\n  command: a\n",
            "2: server.manager: expected one of process, commands (got: proc)",
        ),
        ("server:\n  manager: commands\n  start: a\n", "1: server: manager commands needs stop:"),
        (
            "server:\n  manager: commands\n  start: a\n  stop: b\n",
            "1: server: manager commands needs pid: or status:",
        ),
        ("server:\n  pid: x\n", "1: server: pid is only for manager: commands"),
        (
            "server:\n  command: a\n  flags: {x: 1}\n",
            "3: server.flags: a flag name looks like --name (got: 'x')",
        ),
        (
            "server:\n  command: a\n  flags: {--x: {a: 1}}\n",
            "3: server.flags.--x: a flag value is a string",
        ),
        (
            "health: {base_url: ftp://h, checks: [{get: /}]}\n",
            "1: health.base_url: expected an http:// or https:// URL",
        ),
        ("health: {base_url: http://h, checks: []}\n", "1: health.checks: must not be empty"),
        (
            "health: {base_url: http://h, checks: [{get: health}]}\n",
            "1: health.checks[0].get: a path starting with /",
        ),
        (
            "health: {base_url: http://h, checks: [{get: /, post: /}]}\n",
            "1: health.checks[0]: expected one of get, post (got: get and post)",
        ),
        (
            "health: {base_url: http://h, checks: [{get: /, body: '(' }]}\n",
            "1: health.checks[0].body: bad regex",
        ),
        ("keep_releases: abc\n", "1: keep_releases: expected an integer (got: 'abc')"),
        ("keep_releases: 0\n", "1: keep_releases: must be >= 1 (got: 0)"),
        ("files:\n  - path: a\n    edits: []\n", "3: files[0].edits: must not be empty"),
    ],
)
def test_model_errors(text: str, expected: str) -> None:
    message = playbook_error("name: x\n" + text)
    line, _, rest = expected.partition(": ")
    assert message.startswith(f"{PB}:{int(line) + 1}: {rest}")


def test_empty_collections_mean_their_default() -> None:
    pb = parse_playbook("name: x\nvars:\nfiles:\nsecrets:\n", PB)
    assert (pb.vars, pb.files, pb.secrets) == ({}, [], [])
    inv = parse_inventory("defaults:\nhosts:\ngroups:\n", "inventory.yaml")
    assert (inv.hosts, inv.groups, inv.defaults.vars) == ({}, {}, {})
    message = playbook_error("name: x\nfiles:\n  - path: a\n    edits:\n")
    assert message == f"{PB}:4: files[0].edits: expected a list (got: null)"


def test_process_server_without_command_edits_the_running_one() -> None:
    pb = parse_playbook("name: x\nserver:\n  flags: {--a: 1}\n", PB)
    assert pb.server is not None and pb.server.command is None
    rendered = render_playbook(pb, None, {}, Renderer())
    assert rendered.server is not None and rendered.server.argv is None
    assert rendered.server.desired_argv(["srv", "--a", "0"]) == ["srv", "--a", "1"]


def test_not_a_mapping() -> None:
    assert playbook_error("- a\n") == f"{PB}:1: expected a mapping (got: a list)"


def test_inventory_models() -> None:
    inv = parse_inventory(
        dedent(
            """
            defaults: {user: root, vars: {a: 1}}
            hosts:
              b1: {address: 10.0.0.1, vars: {tp: 8}}
              sandbox: {connection: local}
              bare:
            groups: {g: [b1, sandbox]}
            """
        ),
        "inventory.yaml",
    )
    assert inv.hosts["b1"].address == "10.0.0.1"
    assert inv.hosts["sandbox"].connection == "local"
    assert inv.hosts["bare"].address is None
    assert inv.groups == {"g": ["b1", "sandbox"]}


def test_unknown_group_member() -> None:
    text = "hosts:\n  a: {address: 1.2.3.4}\ngroups:\n  g:\n    - a\n    - c\n"
    with pytest.raises(ConfigError) as info:
        parse_inventory(text, "inventory.yaml")
    assert str(info.value) == "inventory.yaml:6: groups.g[1]: group 'g' lists unknown host 'c'"


def test_inventory_unknown_key() -> None:
    with pytest.raises(ConfigError) as info:
        parse_inventory("hosts:\n  a:\n    adress: x\n", "inv.yaml")
    assert (
        str(info.value)
        == "inv.yaml:3: hosts.a.adress: extra key not permitted (did you mean 'address'?)"
    )
    with pytest.raises(ConfigError, match=r"^inv.yaml:2: hosts.a.port: must be <= 65535"):
        parse_inventory("hosts:\n  a: {port: 70000}\n", "inv.yaml")


# --------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (30, 30.0),
        (1.5, 1.5),
        ("90", 90.0),
        ("90s", 90.0),
        ("15m", 900.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("2m 30s", 150.0),
    ],
)
def test_parse_duration(value: object, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["15x", "", "m", "-5s", True, None, [1], "1.5.2s", -1])
def test_parse_duration_refuses(value: object) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(value)


# -------------------------------------------------------------------- vars


def test_var_precedence() -> None:
    merged = merge_vars(
        {"a": "playbook", "b": "playbook", "c": "playbook", "d": "playbook", "python": "nope"},
        {"b": "inventory", "c": "inventory", "d": "inventory"},
        {"d": "cli", "python": "cli"},
        {"python": "/venv/bin/python", "a": "builtin", "e": "builtin"},
    )
    assert merged == {
        "a": "playbook",
        "b": "inventory",
        "c": "inventory",
        "d": "cli",
        "e": "builtin",
        "python": "/venv/bin/python",
    }


def test_inventory_vars_defaults_under_host_through_resolution() -> None:
    from orchestrator.core.inventory import resolve_hosts

    inv = parse_inventory(
        "defaults: {vars: {x: d, y: d}}\nhosts:\n  h: {vars: {y: h}}\n", "inventory.yaml"
    )
    pb = parse_playbook("name: p\nvars: {x: p, y: p, z: p}\n", PB)
    (host,) = resolve_hosts(inv, ["h"], filename="inventory.yaml")
    merged = merge_vars(pb.vars, host.vars, parse_cli_vars(["z=cli"]), builtin_vars(pb))
    assert merged == {"x": "d", "y": "h", "z": "cli", "python": "python3"}


def test_cli_vars_are_yaml_scalars() -> None:
    assert parse_cli_vars(
        ["threshold=64", "f=0.5", "on=true", "s=hello world", "e=", "eq=a=b", "n=null", "l=[1, 2]"]
    ) == {
        "threshold": 64,
        "f": 0.5,
        "on": True,
        "s": "hello world",
        "e": "",
        "eq": "a=b",
        "n": None,
        "l": "[1, 2]",
    }


@pytest.mark.parametrize("item", ["novalue", "=3", "a b=1"])
def test_bad_cli_var(item: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_cli_vars([item])
    assert str(info.value) == f"--var: expected k=v (got: {item!r})"


@pytest.mark.parametrize("item", ["queue=[1", "m={a: 1", "s='open"])
def test_cli_var_that_is_not_yaml_names_its_key(item: str) -> None:
    name = item.partition("=")[0]
    with pytest.raises(ConfigError) as info:
        parse_cli_vars([item])
    assert str(info.value).startswith(f"--var {name}: value ")
    assert "is not valid YAML" in str(info.value) and "\n" not in str(info.value)


def test_yaml_scalar() -> None:
    assert yaml_scalar("32") == 32
    assert yaml_scalar("0.5.13") == "0.5.13"
    assert yaml_scalar("{a: 1}") == "{a: 1}"
    assert yaml_scalar("  ") == "  "


# --------------------------------------------------------------- rendering


def _renderer(files: dict[str, str]) -> Renderer:
    return Renderer(files.get, searched=["playbooks", "templates"])


def test_render_playbook_produces_edit_specs_with_locations() -> None:
    pb = parse_playbook(GOOD, PB)
    files = {
        "sglang/field.py.j2": "speculative_disable_batch_threshold: int = {{ threshold }}\n",
        "fix.diff": "--- a\n+++ b\n@@ {{ not rendered }}\n",
    }
    variables = merge_vars(
        pb.vars, {"sglang_root": "/sg", "model": "/m"}, {"threshold": 64}, builtin_vars(pb)
    )
    rendered = render_playbook(pb, pb.locations, variables, _renderer(files))
    (f,) = rendered.files
    assert f.path == "/sg/srt/server_args.py"
    insert, content, replace, delete, patch = f.edits
    assert insert.kind == "insert"
    assert insert.text == "speculative_disable_batch_threshold: int = 64\n"
    assert insert.anchor == Anchor("after", "speculative_accept_threshold_acc:", False)
    assert (insert.file, insert.line, insert.key) == (PB, 8, "files[0].edits[0].after")
    assert insert.markers is True and insert.marker_id == "speculative-disable:0.0"
    assert content.text == 'parser.add_argument(\n    "--x-64",\n)\n'
    assert content.markers is False
    assert (content.line, content.key) == (13, "files[0].edits[1].after")
    assert (replace.kind, replace.pattern, replace.text, replace.count) == (
        "replace",
        "old",
        "new 64",
        2,
    )
    assert replace.key == "files[0].edits[2].replace"
    assert delete.kind == "delete" and delete.anchor == Anchor("after", r"^x = \d+$", True)
    assert patch.kind == "patch" and patch.text == files["fix.diff"]
    assert [s.builtin for s in f.validate] == ["python-syntax", None]
    argv = render_validate(f.validate[1], variables, "/sg/.staged file.py", _renderer({}))
    assert argv == ["/root/venv/bin/python", "-m", "mytool", "/sg/.staged file.py"]
    assert render_validate(f.validate[0], variables, "x", _renderer({})) == []

    server = rendered.server
    assert server is not None
    assert server.argv == [
        "/root/venv/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/m",
        "--port",
        "30000",
    ]
    assert server.flags == {"--speculative-disable-batch-threshold": "64", "--on": True}
    assert server.desired_argv()[-3:] == ["--speculative-disable-batch-threshold", "64", "--on"]

    health = rendered.health
    assert health is not None
    assert health.checks[1].expect == {
        "speculative_disable_batch_threshold": 64,
        "version": "0.5.13",
    }
    assert health.checks[2].json == {"text": "/m", "sampling_params": {"max_new_tokens": 4}}
    assert health.checks[2].method == "POST" and health.checks[2].body == '"text"'


def test_edit_id_overrides_marker_id_and_file_markers_inherit() -> None:
    pb = parse_playbook(
        "name: p\nfiles:\n  - path: a\n    markers: false\n    edits:\n"
        "      - {content: x, after: y, id: mine}\n      - {content: x, after: y, markers: true}\n",
        PB,
    )
    a, b = render_playbook(pb, None, {}, _renderer({})).files[0].edits
    assert (a.marker_id, a.markers) == ("mine", False)
    assert (b.marker_id, b.markers) == ("p:0.1", True)


def test_undefined_variable_in_inline_content_points_at_its_line() -> None:
    pb = parse_playbook(
        dedent(
            """
            name: p
            files:
              - path: a
                edits:
                  - after: x
                    content: |
                      line one
                      value = {{ threshold }}
            """
        ),
        PB,
    )
    with pytest.raises(TemplateError) as info:
        render_playbook(pb, None, {}, _renderer({}))
    assert str(info.value) == f"{PB}:8: files[0].edits[0].content: 'threshold' is undefined"


def test_undefined_variable_in_server_command() -> None:
    pb = parse_playbook("name: p\nserver:\n  command: run --tp {{ tp }}\n", PB)
    with pytest.raises(TemplateError) as info:
        render_playbook(pb, None, {}, _renderer({}))
    assert str(info.value) == f"{PB}:3: server.command: 'tp' is undefined"


def test_unbalanced_quote_in_command() -> None:
    pb = parse_playbook('name: p\nserver:\n  command: "run \'x"\n', PB)
    with pytest.raises(ConfigError) as info:
        render_playbook(pb, None, {}, _renderer({}))
    assert str(info.value) == (
        f"{PB}:3: server.command: cannot split command into words: No closing quotation"
    )


def test_validate_command_quoting_is_checked_at_render() -> None:
    pb = parse_playbook(
        "name: p\nfiles:\n  - path: a\n    edits: [{content: x, after: y}]\n"
        '    validate:\n      - python-syntax\n      - "tool \'{{ staged }}"\n',
        PB,
    )
    with pytest.raises(ConfigError) as info:
        render_playbook(pb, None, {}, _renderer({}))
    assert str(info.value) == (
        f"{PB}:7: files[0].validate[1]: cannot split command into words: No closing quotation"
    )


# ----------------------------------------------------------------- secrets


def test_secrets() -> None:
    v = {
        "hf_token": "hf_abcdef",
        "db_password": "hunter22",
        "API_KEY": "k",
        "model": "/m",
        "mine": "s3cr3t-value",
    }
    names = secret_names(v, ["mine"])
    assert names == {"hf_token", "db_password", "API_KEY", "mine"}
    assert redact(v, names) == {
        "hf_token": "***",
        "db_password": "***",
        "API_KEY": "***",
        "model": "/m",
        "mine": "***",
    }
    text = "token hf_abcdef and s3cr3t-value, key k"
    assert redact_text(text, [v[n] for n in names]) == "token *** and ***, key k"


# ---------------------------------------------------------- files on disk


def test_packaged_dir_from_source_tree() -> None:
    root = Path(orchestrator.__file__).resolve().parent.parent
    assert packaged_dir("templates") == root / "templates"
    assert packaged_dir("playbooks") == root / "playbooks"
    assert packaged_dir("templates").is_dir()


def test_load_inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    inv, name = load_inventory(None)
    assert inv.hosts == {} and name == "inventory.yaml"
    (tmp_path / "inventory.yaml").write_text("hosts:\n  a: {address: 1.2.3.4}\n")
    inv, name = load_inventory(None)
    assert list(inv.hosts) == ["a"]
    with pytest.raises(ConfigError) as info:
        load_inventory("missing.yaml")
    assert str(info.value) == "-i: inventory not found: missing.yaml"
    (tmp_path / "bad.yaml").write_text("hosts:\n  a: {adress: 1}\n")
    with pytest.raises(ConfigError, match=r"^bad.yaml:2: hosts.a.adress: extra key"):
        load_inventory("bad.yaml")


def test_find_playbook_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "playbooks").mkdir(exist_ok=True)
    (tmp_path / "playbooks" / "mine.yaml").write_text("name: mine\n")
    (tmp_path / "direct.yaml").write_text("name: direct\n")
    assert find_playbook("direct.yaml") == Path("direct.yaml")
    assert find_playbook("mine") == Path("playbooks/mine.yaml")
    assert find_playbook("mine.yaml") == Path("playbooks/mine.yaml")
    with pytest.raises(ConfigError) as info:
        find_playbook("nothere")
    message = str(info.value)
    assert message.startswith("playbook 'nothere' not found (looked for: nothere, ")
    assert "playbooks/nothere.yaml" in message
    assert str(packaged_dir("playbooks") / "nothere.yaml") in message


def test_packaged_playbooks_come_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = tmp_path / "pkg"
    (shipped / "playbooks").mkdir(parents=True)
    (shipped / "playbooks" / "site.yaml").write_text("name: shipped\n")
    (shipped / "playbooks" / "demo.yaml").write_text("name: shipped-demo\n")
    monkeypatch.setattr(config_files, "packaged_dir", lambda name: shipped / name)
    work = tmp_path / "work"
    (work / "playbooks").mkdir(parents=True)
    (work / "playbooks" / "demo.yaml").write_text("name: mine\n")
    monkeypatch.chdir(work)
    assert find_playbook(None) == shipped / "playbooks" / "site.yaml"
    assert find_playbook("demo") == Path("playbooks/demo.yaml")  # the user's own comes first
    assert load_playbook(find_playbook(None)).model.name == "shipped"


def _project(tmp_path: Path) -> Path:
    (tmp_path / "playbooks").mkdir(exist_ok=True)
    (tmp_path / "templates" / "sglang").mkdir(parents=True)
    (tmp_path / "templates" / "sglang" / "f.j2").write_text("x = {{ threshold }}\n")
    (tmp_path / "templates" / "bad.j2").write_text("ok\nok\n{% if %}\n")
    (tmp_path / "playbooks" / "local.j2").write_text("local {{ threshold }}\n")
    (tmp_path / "secret.txt").write_text("do not read")
    return tmp_path / "playbooks"


def test_load_playbook_and_templates_from_dirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    folder = _project(tmp_path)
    (folder / "p.yaml").write_text(
        "name: p\nvars: {threshold: 3}\nfiles:\n  - path: a\n    edits:\n"
        "      - {insert: sglang/f.j2, after: y}\n      - {insert: local.j2, after: y}\n"
    )
    loaded = load_playbook(find_playbook("p"))
    assert loaded.display == "playbooks/p.yaml"
    assert len(loaded.sha256) == 64
    assert loaded.template_dirs[:2] == (folder.resolve(), (tmp_path / "templates").resolve())
    renderer = make_renderer(loaded)
    rendered = render_playbook(loaded.model, loaded.locations, loaded.model.vars, renderer)
    assert [e.text for e in rendered.files[0].edits] == ["x = 3\n", "local 3\n"]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("../secret.txt", "template name must be a relative path inside the template folders"),
        ("/etc/passwd", "template name must be a relative path inside the template folders"),
        ("nope.j2", "template 'nope.j2' not found (looked in: playbooks, templates, "),
    ],
)
def test_template_lookup_refuses_escapes_and_lists_dirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    folder = _project(tmp_path)
    (folder / "p.yaml").write_text(
        f"name: p\nfiles:\n  - path: a\n    edits:\n      - insert: {name}\n        after: y\n"
    )
    loaded = load_playbook(folder / "p.yaml")
    with pytest.raises(TemplateError) as info:
        render_playbook(loaded.model, loaded.locations, {}, make_renderer(loaded))
    assert str(info.value).startswith(f"playbooks/p.yaml:5: files[0].edits[0].insert: {expected}")


def test_template_file_syntax_error_names_the_template_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    folder = _project(tmp_path)
    (folder / "p.yaml").write_text(
        "name: p\nfiles:\n  - path: a\n    edits:\n      - {insert: bad.j2, after: y}\n"
    )
    loaded = load_playbook(folder / "p.yaml")
    with pytest.raises(TemplateError) as info:
        render_playbook(loaded.model, loaded.locations, {}, make_renderer(loaded))
    assert str(info.value) == (
        "templates/bad.j2:3: template syntax error: Expected an expression, got 'end of "
        "statement block' (referenced from playbooks/p.yaml:5 files[0].edits[0].insert)"
    )


def test_unreadable_template_is_one_located_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    folder = _project(tmp_path)
    (tmp_path / "templates" / "latin1.j2").write_bytes(b"caf\xe9\n")
    (folder / "p.yaml").write_text(
        "name: p\nfiles:\n  - path: a\n    edits:\n      - {insert: latin1.j2, after: y}\n"
    )
    loaded = load_playbook(folder / "p.yaml")
    with pytest.raises(TemplateError) as info:
        render_playbook(loaded.model, loaded.locations, {}, make_renderer(loaded))
    assert str(info.value) == (
        "playbooks/p.yaml:5: files[0].edits[0].insert: templates/latin1.j2: not UTF-8 text"
    )
