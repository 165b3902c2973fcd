"""``add_flag`` and orch's own earlier declarations (issue 20, item 2), through the real CLI
over sshd on the stand-in tree.

A first playbook (``provider``) declares the story's flag; the shipped story playbook
deployed next finds that declaration in provider's marker block. The same declaration
is satisfied by it (nothing written, the release records who provides it); one with
``type: str`` is refused naming ``type``; a plain ``insert:`` of the same flag is refused
naming the release; and while the story's release is in effect, redeploying provider
with a changed help is refused naming the release that relies on it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.fixtures.sandbox import SHIPPED_SPEC, Sandbox, get_json, quick_stability, sha256

REPO = Path(__file__).resolve().parents[1]
FLAG = "--speculative-disable-batch-threshold"
FIELD = "speculative_disable_batch_threshold"
HELP = "Disable speculation when decode batch size exceeds this threshold."
STABLE = "0.2s"  # every restart here waits out the stability window: 0.2 s, not the sandbox's 1 s


def variant(name: str, *, threshold: int = 32, type_: str = "int", help_: str = HELP) -> str:
    """The shipped story playbook under another name, with another threshold, type or help."""
    text = quick_stability(SHIPPED_SPEC, STABLE).replace("name: speculative-disable\n", f"name: {name}\n", 1)
    text = text.replace("  threshold: 32\n", f"  threshold: {threshold}\n", 1)
    text = text.replace("          type: int\n", f"          type: {type_}\n", 1)
    return text.replace(f'          help: "{HELP}"\n', f'          help: "{help_}"\n', 1)


def write(box: Sandbox, name: str, text: str) -> str:
    path = box.root / f"{name}.yaml"
    path.write_text(text)
    return str(path)


def manifests(box: Sandbox) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in box.state_dir.glob("releases/*/manifest.json")}


def applied(box: Sandbox) -> list[str]:
    return list(json.loads((box.state_dir / "state.json").read_text())["applied"])


def deploy(box: Sandbox, *args: str) -> tuple[int, str]:
    proc = box.orch("deploy", "--host", "gpu", *args)
    return proc.returncode, proc.stdout + proc.stderr


def test_the_same_declaration_from_a_second_playbook_is_provided_by_the_first(sandbox: Sandbox) -> None:
    box = sandbox
    box.root.joinpath("playbooks", "speculative-disable.yaml").write_text(quick_stability(SHIPPED_SPEC, STABLE))
    box.start_by_hand()
    code, out = deploy(box, write(box, "provider", variant("provider", threshold=8)))
    assert code == 0, out
    (provider,) = applied(box)
    assert manifests(box)[provider]["declares"] == [
        {"flag": FLAG, "path": str(box.server_args), "marker": "provider:0.0.field"},
        {"flag": FLAG, "path": str(box.server_args), "marker": "provider:0.0.argument"},
    ]
    patched = sha256(box.server_args)

    # the story's playbook (the sandbox's copy of the shipped one) after it: satisfied, nothing written
    code, out = deploy(box, "speculative-disable")
    assert code == 0, out
    words = f"declaration provided by release {provider} (playbook provider)"
    assert f"add_flag {FLAG}: {words}; nothing to add" in out
    assert sha256(box.server_args) == patched, "a second block was written"
    assert box.server_args.read_text().count(f"    {FIELD}: ") == 1
    assert get_json(box.port, "/get_server_info")[FIELD] == 32
    dependent = applied(box)[-1]
    record = manifests(box)[dependent]
    assert record["playbook"]["name"] == "speculative-disable"
    assert record["declares"] == [] and record["files"] == []
    assert record["provided_by"] == [{
        "flag": FLAG, "release": provider, "playbook": "provider",
        "blocks": [{"path": str(box.server_args), "marker": "provider:0.0.field"},
                   {"path": str(box.server_args), "marker": "provider:0.0.argument"}],
    }]

    # the same again: unchanged (the flag is already 32), still provided
    code, out = deploy(box, "--check", "speculative-disable")
    assert code == 0, out
    assert words in out and "unchanged" in out

    # while it is in effect, provider's block may not change: a new help is refused, naming it
    pid = box.server_pid()
    changed_help = write(box, "provider", variant("provider", threshold=8, help_="Turn speculation off above N."))
    for args in (("--check", changed_help), (changed_help,)):
        code, out = deploy(box, *args)
        assert code == 2, out
        assert (f"would change orch's block provider:0.0.argument in {box.server_args}, the declaration of "
                f"{FLAG} that release {dependent} (playbook speculative-disable) relies on") in out
        assert f"roll back {dependent} first" in out
    assert sha256(box.server_args) == patched and box.server_pid() == pid
    assert applied(box) == [provider, dependent]

    # rollback never undoes the provider first: once the dependent is undone, the change is planned
    assert box.orch("rollback", "--host", "gpu").returncode == 0
    assert applied(box) == [provider]
    code, out = deploy(box, "--check", "--diff", changed_help)
    assert code == 0, out
    assert '+            help="Turn speculation off above N.",' in out


def test_a_different_declaration_or_a_plain_insert_of_the_flag_is_refused_naming_the_release(
    sandbox: Sandbox,
) -> None:
    box = sandbox
    box.start_by_hand()
    code, out = deploy(box, write(box, "provider", variant("provider", threshold=8)))
    assert code == 0, out
    (provider,) = applied(box)
    patched, pid = sha256(box.server_args), box.server_pid()
    declared = (f"{FLAG} is already declared by release {provider} (playbook provider) "
                f"in {box.server_args} (line ")

    # type: str instead of int: refused at plan time, naming the release, the playbook and `type`
    code, out = deploy(box, write(box, "as-str", variant("as-str", type_="str")))
    assert code == 2, out
    assert declared in out
    assert re.search(r"as-str\.yaml:\d+: files\[0\]\.edits\[0\]\.add_flag: ", out), out
    assert "differently: type: 'int' there, 'str' here; nothing changed" in out
    assert "default:" not in out and "help:" not in out.partition("differently")[2]

    # a changed help alone is named as help
    code, out = deploy(box, "--check", write(box, "other-help", variant("other-help", help_="Another help.")))
    assert code == 2, out
    assert "differently: help: 'Disable speculation when decode batch size exceeds this threshold.' there, " \
           "'Another help.' here" in out

    # the shipped site.yaml (plain inserts of the same field and parser call): refused the same way
    site = (REPO / "playbooks" / "site.yaml").read_text()
    code, out = deploy(box, "--check", write(box, "site", site))
    assert code == 2, out
    assert declared in out and "this insert would declare it a second time" in out
    code, out = deploy(box, write(box, "site", site))
    assert code == 2, out
    assert declared in out
    assert sha256(box.server_args) == patched and box.server_pid() == pid
    assert applied(box) == [provider]


# --------------------------------------------------------------------------- each layout, pure


def _declare(tree: Path, marker: str, known: tuple = (), **changes: object) -> tuple[dict, list]:
    """``add_flag`` of the story's flag (with ``changes``) planned on ``tree``, as ``plan`` does."""
    from orchestrator.core.edits import plan_file
    from orchestrator.core.flags import FlagRequest, expand_edits
    from orchestrator.core.templating import Renderer
    from orchestrator.host import facts
    from orchestrator.shell.config_files import packaged_dir, template_lookup

    target = tree / "python" / "sglang" / "srt" / "server_args.py"
    near = "speculative_accept_threshold_acc"
    related = {i["path"]: Path(i["path"]).read_text() for i in facts.follow_imports(str(target), [near])}
    fields = {"name": FIELD, "type": "int", "default": None, "help": HELP, "near": (near,), "marker_id": marker}
    request = FlagRequest(**{**fields, **changes})  # type: ignore[arg-type]
    renderer = Renderer(template_lookup((packaged_dir("templates"),)))
    edits, plans = expand_edits(str(target), [request], target.read_text(), related, renderer, {}, known)
    for path, specs in edits.items():
        if specs:
            Path(path).write_text(plan_file(path, Path(path).read_text(), specs).result)
    return edits, plans


@pytest.mark.parametrize("layout", ["classic", "annotated", "spec"])
def test_each_layout_tells_the_same_declaration_from_a_different_one(tmp_path: Path, layout: str) -> None:
    from orchestrator.core.declarations import ReleaseRecord, declared_blocks
    from orchestrator.errors import EditError
    from orchestrator.standin import make_tree

    tree = tmp_path / "tree"
    make_tree(tree, layout=layout)
    edits, _ = _declare(tree, "provider:0.0")
    blocks = [(d["path"], d["marker"]) for path, specs in edits.items()
              for d in declared_blocks(path, Path(path).read_text(), specs)]
    assert blocks, "the provider's blocks declare nothing"
    known = (ReleaseRecord("R1", "provider", tuple({p for p, _ in blocks}), tuple(blocks)),)
    files = {p: Path(p).read_bytes() for p, _ in blocks}

    edits, plans = _declare(tree, "story:0.0", known, help="  Disable speculation when decode batch size\n"
                                                             "exceeds this threshold. ")
    assert not any(edits.values()), "a second declaration was planned"
    assert plans[0].provided is not None and plans[0].provided.words() == \
        "declaration provided by release R1 (playbook provider)"
    assert {p: Path(p).read_bytes() for p in files} == files

    for changes, differs in (({"type": "str"}, "type: 'int' there, 'str' here"),
                             ({"default": 4}, "default: None there, 4 here"),
                             ({"help": "Other."}, f"help: {HELP!r} there, 'Other.' here")):
        with pytest.raises(EditError) as refused:
            _declare(tree, "story:0.0", known, **changes)
        message = str(refused.value)
        assert f"{FLAG} is already declared by release R1 (playbook provider) in " in message
        assert message.endswith(f"differently: {differs}; nothing changed"), message
    # no release in effect records the block: refused, naming the block
    with pytest.raises(EditError, match=r"orch's block provider:0\.0\.\w+ \(playbook provider; no release in effect"):
        _declare(tree, "story:0.0", ())


def test_a_store_true_flag_is_the_same_bool_declaration(tmp_path: Path) -> None:
    """``type: bool`` is written as ``action="store_true"`` and a ``False`` field: read back as bool, False."""
    from orchestrator.core.declarations import ReleaseRecord, declared_blocks
    from orchestrator.standin import make_tree

    tree = tmp_path / "tree"
    make_tree(tree)
    edits, _ = _declare(tree, "provider:0.0", type="bool")
    blocks = tuple((d["path"], d["marker"]) for path, specs in edits.items()
                   for d in declared_blocks(path, Path(path).read_text(), specs))
    known = (ReleaseRecord("R1", "provider", (), blocks),)
    edits, plans = _declare(tree, "story:0.0", known, type="bool", default=False)
    assert not any(edits.values()) and plans[0].provided is not None
    with pytest.raises(Exception, match=r"differently: type: 'bool' there, 'int' here; default: False there, None here; "):
        _declare(tree, "story:0.0", known)


def test_the_release_of_a_block_comes_from_declares_or_an_older_manifests_playbook_and_files() -> None:
    """Newest release in effect first; a manifest without ``declares`` (before this change) is
    matched by the playbook its marker names and the files it changed; an undone one never."""
    from orchestrator.core.declarations import OrchBlock, release_of, releases_in_effect

    path = "/srv/sglang/srt/server_args.py"
    manifests = [
        {"id": "R1", "playbook": {"name": "gated"}, "files": [{"path": path}]},  # older: no declares
        {"id": "R2", "playbook": {"name": "story"}, "files": [], "declares": [],
         "provided_by": [{"flag": FLAG, "release": "R1", "playbook": "gated", "blocks": []}]},
        {"id": "R3", "playbook": {"name": "other"}, "files": [{"path": path}],
         "declares": [{"flag": "--x", "path": path, "marker": "other:0.0.field"}]},
        {"id": "R4", "playbook": {"name": "gated"}, "files": [{"path": path}], "declares": []},  # undone
    ]
    known = releases_in_effect(manifests, ["R1", "R2", "R3"])
    assert [r.id for r in known] == ["R3", "R2", "R1"]
    assert known[1].provided_by[0]["release"] == "R1"
    assert release_of(OrchBlock(path, "gated:0.0.argument", 350, 358), known).id == "R1"
    assert release_of(OrchBlock(path, "other:0.0.field", 82, 84), known).id == "R3"
    assert release_of(OrchBlock(path, "other:0.1", 90, 92), known) is None  # R3 lists its blocks
    assert release_of(OrchBlock("/elsewhere.py", "gated:0.0.field", 1, 3), known) is None
