"""The layout matrix: the shipped flag playbooks on the REAL files of eleven releases.

SGLang 0.4.3 (classic, beside ``--speculative-num-draft-tokens``: no
``--speculative-accept-threshold-acc`` yet), 0.4.10.post2 and 0.5.13
(classic), 0.5.14 and 0.5.18 (annotated, NS() from 0.5.18), 0.5.23 (spec);
vLLM 0.6.6, 0.7.3 and 0.8.0 (EngineArgs, beside ``--num-speculative-tokens``:
no ``--speculative-config`` yet), 0.8.5.post1 and 0.33.0. The playbooks'
``near:`` lists the neighbours in order; the first the file declares wins.
SGLang 0.3.6 and 0.4.0 declare none of them (no speculative decoding at
all): the playbook is refused there, naming the names it looked for. The
files come from the registry (``tests.fixtures.registry``, pinned, cached).
For each: the unchanged shipped playbook (``speculative-disable.yaml`` on
SGLang, ``vllm-add-flag.yaml`` on vLLM) is rendered and planned through
orch's own code, the layout is recognised, the declarations land beside
the neighbour (the parser call after the neighbour's *complete* call), the
result passes the structural check and compiles, re-planning is a no-op —
and the release's own parser, built from the patched file without torch
(``tests.fixtures.flag_probe``), parses ``--speculative-disable-batch-threshold
32`` to the int 32, while the unpatched file's parser refuses it.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.core.edit_spec import Anchor, EditSpec, FilePlan
from orchestrator.core.edits import plan_file
from orchestrator.core.facts import Facts
from orchestrator.core.flags import FlagPlan, expand_edits
from orchestrator.core.hints import anchor_hints
from orchestrator.core.layouts import LayoutError, find_layout
from orchestrator.core.models import parse_playbook
from orchestrator.core.rendering import render_playbook
from orchestrator.core.structure import check_structure
from orchestrator.core.templating import Renderer
from orchestrator.errors import AnchorError, EditError
from orchestrator.host import facts
from orchestrator.shell.config_files import load_playbook, make_renderer
from tests.fixtures.flag_probe import TolerantParser, load_tolerant, parse
from tests.fixtures.forkrun import run_orch
from tests.fixtures.registry import sglang_tree, vllm_file
from tests.fixtures.sandbox import listening_pid
from tests.fixtures.sshd import SshdServer, free_port

REPO = Path(__file__).resolve().parents[1]
FLAG = "--speculative-disable-batch-threshold"
FIELD = "speculative_disable_batch_threshold"


@dataclass(frozen=True)
class Release:
    product: str  # sglang or vllm
    version: str
    layout: str
    near: str
    quote: str = '"'  # how the release quotes its flags

    @property
    def id(self) -> str:
        return f"{self.product}-{self.version}"


SGLANG_NEAR = ("speculative_accept_threshold_acc", "speculative_num_draft_tokens")
VLLM_NEAR = ("speculative_config", "num_speculative_tokens")

RELEASES = [
    Release("sglang", "0.4.3", "classic", "speculative_num_draft_tokens"),
    Release("sglang", "0.4.10.post2", "classic", "speculative_accept_threshold_acc"),
    Release("sglang", "0.5.13", "classic", "speculative_accept_threshold_acc"),
    Release("sglang", "0.5.14", "annotated", "speculative_accept_threshold_acc"),
    Release("sglang", "0.5.18", "annotated", "speculative_accept_threshold_acc"),
    Release("sglang", "0.5.23", "spec", "speculative_accept_threshold_acc"),
    Release("vllm", "0.6.6", "vllm", "num_speculative_tokens", "'"),
    Release("vllm", "0.7.3", "vllm", "num_speculative_tokens", "'"),
    Release("vllm", "0.8.0", "vllm", "num_speculative_tokens", "'"),
    Release("vllm", "0.8.5.post1", "vllm", "speculative_config", "'"),
    Release("vllm", "0.33.0", "vllm", "speculative_config"),
]
REFUSED = [  # no name of the playbook's near: list: not covered (docs/FLAGS.md says so)
    Release("sglang", "0.3.6", "classic", ""),
    Release("sglang", "0.4.0", "classic", ""),
]


def release_of(product: str, version: str) -> Release:
    return next(r for r in RELEASES if (r.product, r.version) == (product, version))


def target_of(release: Release) -> Path:
    if release.product == "sglang":
        return sglang_tree(release.version) / "sglang" / "srt" / "server_args.py"
    return vllm_file(release.version)


def root_var(release: Release) -> dict[str, str]:
    target = target_of(release)
    if release.product == "sglang":
        return {"sglang_root": str(target.parent.parent)}
    return {"vllm_root": str(target.parent.parent)}


def companions(path: Path, names: list[str]) -> dict[str, str]:
    """What the helper on the host sends along: the modules ``path`` imports that mention ``names``."""
    return {
        info["path"]: bytes(info["data"].data).decode("utf-8")  # a Blob: sent as blob lines
        for info in facts.follow_imports(str(path), names)
    }


@dataclass
class Applied:
    flags: list[FlagPlan]
    plans: dict[str, FilePlan]
    edits: dict[str, list[EditSpec]]


def apply_shipped(release: Release) -> Applied:
    """The shipped playbook, rendered and planned by orch's own code (no host)."""
    book = "speculative-disable.yaml" if release.product == "sglang" else "vllm-add-flag.yaml"
    loaded = load_playbook(REPO / "playbooks" / book)
    renderer = make_renderer(loaded)
    variables = {**loaded.model.vars, **root_var(release), "python": "python3", "facts": {"packages": {}}}
    rendered = render_playbook(loaded.model, loaded.locations, variables, renderer)
    target = target_of(release)
    assert rendered.files[0].path == str(target)
    text = target.read_text()
    related = companions(target, [release.near])
    edits, flags = expand_edits(str(target), rendered.files[0].edits, text, related, renderer, variables)
    plans = {}
    for path, specs in edits.items():
        if not specs:
            continue
        original = text if path == str(target) else related[path]
        plan = plan_file(path, original, specs)
        check_structure(plan, specs)
        plans[path] = plan
    return Applied(flags, plans, edits)


@pytest.fixture(scope="module", params=RELEASES, ids=lambda r: r.id)
def applied(request: pytest.FixtureRequest) -> tuple[Release, Applied]:
    return request.param, apply_shipped(request.param)


# --------------------------------------------------------------------------- placement


def _statement_end(text: str, predicate) -> int:  # type: ignore[no-untyped-def]
    """Last line of the one statement of ``text`` that ``predicate`` picks."""
    found = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.stmt) and predicate(n)]
    assert len(found) == 1, found
    return found[0].end_lineno  # type: ignore[return-value]


def _is_field(name: str):  # type: ignore[no-untyped-def]
    return lambda n: isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == name


def _is_call_of(flag: str):  # type: ignore[no-untyped-def]
    def pick(n: ast.stmt) -> bool:
        if not isinstance(n, ast.Expr) or not isinstance(n.value, ast.Call):
            return False
        args = n.value.args
        return bool(args) and isinstance(args[0], ast.Constant) and args[0].value == flag

    return pick


def test_the_layout_is_recognised(applied: tuple[Release, Applied]) -> None:
    release, done = applied
    assert [f.layout.kind for f in done.flags] == [release.layout]
    # the first name of the playbook's near: list that the release declares
    names = SGLANG_NEAR if release.product == "sglang" else VLLM_NEAR
    assert done.flags[0].request.near == names
    assert done.flags[0].layout.near == release.near
    text = target_of(release).read_text()
    for earlier in names[: names.index(release.near)]:  # an older release: the newer name is absent
        assert f"--{earlier.replace('_', '-')}" not in text and f"{earlier}:" not in text
    paths = list(done.plans)
    if release.layout == "spec":  # the field moved to the namespace module server_args.py imports
        assert [Path(p).name for p in paths] == ["spec.py"]
        assert Path(paths[0]).parent.name == "fields"
    else:
        assert paths == [str(target_of(release))]


def test_declarations_land_beside_the_neighbour(applied: tuple[Release, Applied]) -> None:
    release, done = applied
    (path, plan), = done.plans.items()
    original = plan.original.splitlines()
    result = plan.result.splitlines()
    field_end = _statement_end(plan.original, _is_field(release.near))
    # the field block starts right after the neighbour field, at its indentation
    assert result[field_end].strip().startswith("# >>> orch speculative-disable:0.0.") or result[
        field_end
    ].strip().startswith("# >>> orch vllm-add-flag:0.0.")
    assert result[field_end + 1].startswith(f"    {FIELD}:")
    assert result[: field_end] == original[:field_end]
    if release.layout in ("classic", "vllm"):
        neighbour = "--" + release.near.replace("_", "-")
        call_end = _statement_end(plan.original, _is_call_of(neighbour))
        shift = len(result) - len(original) - 8  # the call block is 8 lines; the rest is the field's
        # the parser call starts after the line closing the neighbour's whole call, never inside it
        assert result[call_end + shift - 1] == original[call_end - 1]
        assert result[call_end + shift].strip().endswith(".argument")
        call = result[call_end + shift + 1]
        assert call.endswith(".add_argument(") and call.strip().startswith(("parser.", "speculative_group.", "vllm_group."))
        assert result[call_end + shift + 2].strip() == f"{release.quote}{FLAG}{release.quote},"
    else:  # one A[...] field, the style of its neighbours; NS() copied on 0.5.18
        block = "\n".join(result[field_end : field_end + 8])
        assert f"{FIELD}: A[" in block and "Optional[int]," in block
        assert ('NS("spec")' in block) == (release.version == "0.5.18")
    if release.version == "0.33.0":
        assert f"{FIELD}: int | None = None" in plan.result  # X | None, like its neighbours


def test_the_result_compiles_and_replanning_is_a_no_op(applied: tuple[Release, Applied]) -> None:
    _, done = applied
    for path, plan in done.plans.items():
        compile(plan.result, path, "exec", dont_inherit=True)
        again = plan_file(path, plan.result, done.edits[path])
        assert not again.changed
        assert all("already applied" in note for note in again.notes)


# --------------------------------------------------------------------------- the flag parses


def build_parser(release: Release, texts: dict[str, str]) -> TolerantParser:
    """The release's own parser, from ``texts`` (path -> content; patched or not)."""
    target = str(target_of(release))
    parser = TolerantParser(prog="sglang serve" if release.product == "sglang" else "vllm serve")
    if release.product == "vllm":
        module = load_tolerant(texts[target], functions=["add_cli_args"], filename=target)
        module.EngineArgs.add_cli_args(parser)
        return parser
    root = sglang_tree(release.version) / "sglang" / "srt"
    if release.layout == "classic":
        module = load_tolerant(texts[target], functions=["add_cli_args"], filename=target)
        module.ServerArgs.add_cli_args(parser)
        return parser
    keep = ["msgspec"]
    arg_utils = load_tolerant((root / "arg_groups" / "arg_utils.py").read_text(), keep=keep)
    if release.layout == "annotated":
        module = load_tolerant(
            texts[target],
            real={"sglang.srt.arg_groups.arg_utils": arg_utils},
            functions=["add_cli_args"],
            filename=target,
        )
        module.ServerArgs.add_cli_args(parser)
        return parser
    spec = str(root / "arg_groups" / "fields" / "spec.py")
    choices = load_tolerant((root / "arg_groups" / "choices.py").read_text())
    namespace = load_tolerant(
        texts.get(spec) or Path(spec).read_text(),
        keep=keep,
        real={
            "sglang.srt.arg_groups.arg_utils": arg_utils,
            "sglang.srt.arg_groups.choices": choices,
        },
        filename=spec,
    )
    arg_utils.add_cli_args_from_dataclass(parser, namespace.Spec)
    return parser


def test_the_patched_file_parses_the_flag_and_the_original_refuses_it(
    applied: tuple[Release, Applied],
) -> None:
    release, done = applied
    target = str(target_of(release))
    patched = {path: plan.result for path, plan in done.plans.items()}
    patched.setdefault(target, Path(target).read_text())
    parser = build_parser(release, patched)
    assert all(FLAG not in args for args, _ in parser.skipped), parser.skipped
    namespace, error = parse(parser, [FLAG, "32"])
    assert namespace is not None, error
    assert getattr(namespace, FIELD) == 32 and type(getattr(namespace, FIELD)) is int
    default, _ = parse(parser, [])
    assert default is not None and getattr(default, FIELD) is None

    original = {path: plan.original for path, plan in done.plans.items()}
    original.setdefault(target, Path(target).read_text())
    refused, message = parse(build_parser(release, original), [FLAG, "32"])
    assert refused is None
    assert f"error: unrecognized arguments: {FLAG} 32" in message


def test_vllm_0_6_6_skips_the_config_field_of_the_newer_name_for_the_older_flag(tmp_path: Path) -> None:
    """On a host, the helper follows arg_utils.py's import of vllm/config.py, where
    ``VllmConfig.speculative_config`` is a plain field (no flag): the newer name is skipped,
    not blamed, and the flag goes beside --num-speculative-tokens."""
    root = tmp_path / "vllm"
    (root / "engine").mkdir(parents=True)
    shutil.copy(vllm_file("0.6.6"), root / "engine" / "arg_utils.py")
    shutil.copy(vllm_file("0.6.6", "vllm/config.py"), root / "config.py")
    target = root / "engine" / "arg_utils.py"
    related = companions(target, list(VLLM_NEAR))
    assert list(related) == [str(root / "config.py")]
    layout = find_layout(str(target), target.read_text(), VLLM_NEAR, related)
    assert (layout.kind, layout.near, layout.cls) == ("vllm", "num_speculative_tokens", "EngineArgs")
    with pytest.raises(LayoutError) as error:  # the newer name alone: refused, saying why
        find_layout(str(target), target.read_text(), "speculative_config", related)
    message = str(error.value)
    assert message.startswith(f"near: speculative_config is no flag of {target} or of the 1 module(s) it imports "
                              f"(speculative_config: only a field of VllmConfig in {root / 'config.py'} (line 2971)")
    assert "it uses vLLM's EngineArgs layout" in message
    assert "did you mean: speculative_config" not in message


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.id)
def test_a_misspelt_near_names_the_layout_and_the_closest_flags(release: Release) -> None:
    """What the deploy says for a typo: the layout it recognised and the closest flags, on
    every real file. On the spec layout the pipeline reads the field modules (those with
    ``A[``) once more for this message; here they are given the same way."""
    target = target_of(release)
    typo = release.near.replace("tokens", "tokns").replace("threshold", "treshold").replace("config", "confg")
    assert typo != release.near
    related = companions(target, ["A["] if release.layout == "spec" else [typo])
    with pytest.raises(LayoutError) as error:
        find_layout(str(target), target.read_text(), typo, related)
    message = str(error.value)
    described = "vLLM's EngineArgs layout" if release.layout == "vllm" else f"the {release.layout} layout"
    assert f"near: {typo} is no flag of {target}" in message
    assert f"; it uses {described}" in message
    assert f"; did you mean: {release.near}" in message and "\n" not in message


@pytest.mark.parametrize("release", REFUSED, ids=lambda r: r.id)
def test_a_release_without_any_near_name_is_refused_naming_the_names(release: Release) -> None:
    """SGLang 0.3.6 and 0.4.0 have no speculative flags at all: no neighbour, no guess."""
    with pytest.raises(EditError) as error:
        apply_shipped(release)
    message = str(error.value)
    assert message.startswith("playbooks/speculative-disable.yaml:") or "speculative-disable.yaml:" in message
    assert "files[0].edits[0].add_flag: near: none of " + ", ".join(SGLANG_NEAR) + " is a flag of " in message
    assert "it uses the classic layout (SGLang ≤ 0.5.13" in message
    assert "\n" not in message
    # the release's own parser has no such flag, and none of the neighbours
    target = str(target_of(release))
    parser = build_parser(release, {target: Path(target).read_text()})
    refused, said = parse(parser, [FLAG, "32"])
    assert refused is None and f"unrecognized arguments: {FLAG} 32" in said
    assert all(f"--{n.replace('_', '-')}" not in parser._option_string_actions for n in SGLANG_NEAR)  # noqa: SLF001


def test_on_the_annotated_layout_a_plain_field_compiles_and_is_not_a_flag() -> None:
    """The trap add_flag avoids: only A[...] fields become flags from 0.5.14 on."""
    release = release_of("sglang", "0.5.14")
    target = target_of(release)
    text = target.read_text()
    plain = EditSpec(
        kind="insert",
        text=f"{FIELD}: Optional[int] = None\n",
        anchor=Anchor("after", f"ServerArgs.{release.near}", kind="field"),
    )
    plan = plan_file(str(target), text, [plain])
    check_structure(plan, [plain])  # compiles, is structurally right...
    refused, message = parse(build_parser(release, {str(target): plan.result}), [FLAG, "32"])
    assert refused is None and f"unrecognized arguments: {FLAG} 32" in message  # ...and is no flag


# --------------------------------------------------------------------------- messages on real files


def test_the_storys_anchor_on_the_annotated_layout_says_what_it_means() -> None:
    release = release_of("sglang", "0.5.14")
    target = target_of(release)
    story = EditSpec(
        kind="insert",
        text="x = 1\n",
        anchor=Anchor("after", '"--speculative-accept-threshold-acc"'),
        file="playbooks/site.yaml",
        line=11,
        key="files[0].edits[1]",
    )
    with pytest.raises(AnchorError) as error:
        plan_file(str(target), target.read_text(), [story], hints=anchor_hints({}))
    message = str(error.value)
    assert message.startswith("playbooks/site.yaml:11: files[0].edits[1].after: anchor matches 0 places")
    field_line = _statement_end(target.read_text(), _is_field(release.near)) - 3
    assert f"did you mean: line {field_line}: speculative_accept_threshold_acc: A[" in message
    assert "after_field: ServerArgs.speculative_accept_threshold_acc" in message
    assert "server_args.py uses the annotated layout (SGLang 0.5.14–0.5.19" in message
    assert "use add_flag" in message
    assert "aliases=" not in message  # what difflib pointed at before
    assert "\n" not in message


def test_on_the_spec_layout_the_hint_names_the_field_in_its_module() -> None:
    release = release_of("sglang", "0.5.23")
    target = target_of(release)
    story = EditSpec(kind="insert", text="x = 1\n", anchor=Anchor("after", "speculative_accept_threshold_acc:"))
    related = companions(target, [release.near])
    with pytest.raises(AnchorError) as error:
        plan_file(str(target), target.read_text(), [story], hints=anchor_hints(related))
    message = str(error.value)
    spec = next(iter(related))
    assert f"{spec} line 113: speculative_accept_threshold_acc: A[" in message
    assert "(the field Spec.speculative_accept_threshold_acc, in another module)" in message
    assert "uses the spec layout (SGLang ≥ 0.5.20" in message


def test_error_lines_are_the_files_on_disk_after_earlier_edits() -> None:
    """vLLM 0.8.5: '--speculative-config' is on lines 749 and 1065 of the file on disk."""
    target = vllm_file("0.8.5.post1")
    text = target.read_text()
    lines = text.splitlines()
    assert "'--speculative-config'" in lines[748] and "'--speculative-config'" in lines[1064]
    edits = [
        EditSpec(kind="insert", text="a: int = 1\nb: int = 2\n", anchor=Anchor("after", "EngineArgs.speculative_config", kind="field"), marker_id="m"),
        EditSpec(kind="insert", text="x = 1\n", anchor=Anchor("after", "'--speculative-config'"), file="p.yaml", line=9, key="files[0].edits[1]"),
    ]
    with pytest.raises(AnchorError) as error:
        plan_file(str(target), text, edits)
    message = str(error.value)
    assert "anchor matches 2 places" in message
    assert "line 749: '--speculative-config'," in message
    assert "line 1065: # '--speculative-config' and must be passed" in message
    assert "line 753" not in message and "line 1069" not in message


# --------------------------------------------------------------------------- orch deploy --check over sshd


def check_over_ssh(tmp: Path, sshd: SshdServer, release: Release) -> tuple[int, str, dict]:
    """``orch deploy --check`` with the unchanged shipped playbook on a host holding the release's files."""
    source = target_of(release)
    if release.product == "sglang":
        host_root = tmp / "host" / "sglang"
        shutil.copytree(source.parent.parent.parent / "sglang", host_root)
        var = {"sglang_root": str(host_root)}
        book = "speculative-disable.yaml"
    else:
        host_root = tmp / "host" / "vllm"
        (host_root / "engine").mkdir(parents=True)
        shutil.copy(source, host_root / "engine" / "arg_utils.py")
        var = {"vllm_root": str(host_root)}
        book = "vllm-add-flag.yaml"
    # A server must be running where the playbook's health port says (the real one needs
    # GPUs): any process listening there is what --check records and applies the flag to.
    port = free_port()
    var["port"] = port
    host = {
        "address": sshd.host, "port": sshd.port, "user": sshd.user,
        "identity_file": str(sshd.client_key), "known_hosts": str(sshd.known_hosts),
        "state_dir": str(tmp / "state"), "python": sys.executable, "vars": var,
    }
    (tmp / "inventory.yaml").write_text(json.dumps({"hosts": {"gpu": host}}))
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                              cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while listening_pid(port) is None and time.time() < deadline:
            time.sleep(0.05)
        proc = run_orch(["deploy", "--check", "--json", "--host", "gpu",
             "--ssh-config", str(sshd.ssh_config), str(REPO / "playbooks" / book)], cwd=tmp, timeout=300,
            env=dict(os.environ, COLUMNS="200", NO_COLOR="1"))
    finally:
        server.terminate()
        server.wait(10)
    report = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
    return proc.returncode, proc.stderr, report


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.id)
def test_check_with_the_shipped_playbook_plans_the_right_place(
    tmp_path: Path, sshd: SshdServer, release: Release
) -> None:
    code, err, report = check_over_ssh(tmp_path, sshd, release)
    assert code == 0, err
    host = report["hosts"]["gpu"]
    assert host["outcome"] == "planned"
    expected = {
        "classic": ["srt/server_args.py"],
        "annotated": ["srt/server_args.py"],
        "spec": ["srt/arg_groups/fields/spec.py"],
        "vllm": ["engine/arg_utils.py"],
    }[release.layout]
    assert [f.split("/host/")[1].split("/", 1)[1] for f in host["files"]] == expected
    assert any(f"uses {'vLLM' if release.layout == 'vllm' else 'the ' + release.layout}" in n for n in host["notes"]), host["notes"]
    # the read-back preview: the new declaration right after the neighbour
    assert "❱" in err and FIELD in err
    assert not (tmp_path / "state").exists()  # --check creates nothing on the host


@pytest.mark.parametrize("release", REFUSED, ids=lambda r: r.id)
def test_check_on_a_release_without_any_near_name_exits_2_naming_them(
    tmp_path: Path, sshd: SshdServer, release: Release
) -> None:
    before = target_of(release).read_bytes()
    code, err, report = check_over_ssh(tmp_path, sshd, release)
    assert code == 2, err
    error = report["hosts"]["gpu"]["error"] if report.get("hosts") else report["error"]
    assert "near: none of speculative_accept_threshold_acc, speculative_num_draft_tokens is a flag of " in error
    assert error.endswith("server_args.py; it uses the classic layout (SGLang ≤ 0.5.13: a dataclass field and a parser.add_argument call)")
    host_file = tmp_path / "host" / "sglang" / "srt" / "server_args.py"
    assert host_file.read_bytes() == before  # nothing changed
    assert not (tmp_path / "state").exists()


# --------------------------------------------------------------------------- an element of a tuple (0.5.23's field order)


def test_an_after_on_an_element_of_positional_field_order_is_refused_with_the_fix() -> None:
    path = sglang_tree("0.5.23") / "sglang" / "srt" / "arg_groups" / "field_order.py"
    text = path.read_text()
    row = text.splitlines().index('    "speculative_accept_threshold_acc",') + 1
    spec = EditSpec(kind="insert", text="x = 1\n", anchor=Anchor("after", '"speculative_accept_threshold_acc",'))
    with pytest.raises(AnchorError) as error:
        plan_file(str(path), text, [spec])
    message = str(error.value)
    assert f"line {row} is an element of the tuple POSITIONAL_FIELD_ORDER" in message
    assert "into: POSITIONAL_FIELD_ORDER with after_item: 'speculative_accept_threshold_acc'" in message


def test_into_positional_field_order_lands_inside_the_tuple() -> None:
    path = sglang_tree("0.5.23") / "sglang" / "srt" / "arg_groups" / "field_order.py"
    text = path.read_text()
    spec = EditSpec(
        kind="insert",
        text=f'"{FIELD}"\n',
        anchor=Anchor("after", "POSITIONAL_FIELD_ORDER", kind="item", arg="speculative_accept_threshold_acc"),
        marker_id="order",
    )
    plan = plan_file(str(path), text, [spec])
    check_structure(plan, [spec])
    before: dict = {}
    after: dict = {}
    exec(compile(text, str(path), "exec"), before)  # noqa: S102 - a stdlib-only module of constants
    exec(compile(plan.result, str(path), "exec"), after)  # noqa: S102
    old, new = before["POSITIONAL_FIELD_ORDER"], after["POSITIONAL_FIELD_ORDER"]
    at = old.index("speculative_accept_threshold_acc") + 1
    assert new == old[:at] + (FIELD,) + old[at:]
    assert not plan_file(str(path), plan.result, [spec]).changed


def test_the_docs_field_order_example_appends_as_sglangs_docstring_asks() -> None:
    """docs/FLAGS.md's `when:` example, run on 0.5.23's field_order.py: its docstring says
    "Append new built-in fields to this tuple; inserting or regrouping changes existing
    calls" — the old order stays a prefix (the positional constructor is unchanged)."""
    root = sglang_tree("0.5.23") / "sglang"
    path = root / "srt" / "arg_groups" / "field_order.py"
    text = path.read_text()
    assert "Append new built-in fields to this tuple; inserting or regrouping changes existing\ncalls." in text
    docs = (REPO / "docs" / "FLAGS.md").read_text()
    blocks = [b.split("```")[0] for b in docs.split("```yaml\n")[1:]]
    block = next(b for b in blocks if "into: POSITIONAL_FIELD_ORDER" in b)
    book = parse_playbook("name: order\n" + block, "FLAGS.md")
    edits: list[EditSpec] = []
    for version, applies in (("0.5.18", False), ("0.5.23", True)):
        facts = Facts.from_wire({"packages": {"sglang": {"path": str(root), "version": version}}})
        variables = {"sglang_root": str(root), "facts": facts.as_var()}
        rendered = render_playbook(book, None, variables, Renderer())
        assert bool(rendered.files) is applies
        edits = [e for f in rendered.files for e in f.edits if isinstance(e, EditSpec)]
    assert [f.path for f in rendered.files] == [str(path)] and len(edits) == 1
    plan = plan_file(str(path), text, edits)
    check_structure(plan, edits)
    before: dict = {}
    after: dict = {}
    exec(compile(text, str(path), "exec"), before)  # noqa: S102 - a stdlib-only module of constants
    exec(compile(plan.result, str(path), "exec"), after)  # noqa: S102
    assert after["POSITIONAL_FIELD_ORDER"] == before["POSITIONAL_FIELD_ORDER"] + (FIELD,)

