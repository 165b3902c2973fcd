"""A whole deploy of the UNCHANGED shipped speculation playbook on the stand-in in each layout.

Over the real sshd, with the real CLI and a hand-started stand-in server: the
classic tree gets a field and a parser call in ``server_args.py``, the
annotated tree one ``A[...]`` field there, the spec tree one field in
``arg_groups/fields/spec.py`` (a file the playbook does not name: backed up,
committed, read back and restorable like any other). Each ends with the
restarted server reporting the flag in ``/get_server_info``; a second run is
``unchanged``; ``orch rollback`` restores every file it wrote.

Then, on one layout, applied blocks whose anchors changed (issue 9): an
anchor that now matches several places is refused as on a clean file, and a
block its anchor no longer points at is a planned move in ``--check --json``
and moved by ``deploy`` as a new release.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.standin import make_tree
from tests.fixtures.sandbox import Sandbox, cmdline, get_json, health_status, sha256
from tests.fixtures.sshd import SshdServer, free_port

REPO = Path(__file__).resolve().parents[1]
PLAYBOOK = str(REPO / "playbooks" / "speculative-disable.yaml")
FLAG = "--speculative-disable-batch-threshold"

WRITES = {
    "classic": "srt/server_args.py",
    "annotated": "srt/server_args.py",
    "spec": "srt/arg_groups/fields/spec.py",
}


def sandbox_for(tmp_path: Path, sshd: SshdServer, layout: str) -> Sandbox:
    root = make_tree(tmp_path / "box", layout=layout)
    box = Sandbox(tmp_path, sshd, free_port(), root, tmp_path / "state")
    box.write_inventory()
    return box


@pytest.fixture(params=sorted(WRITES))
def layout_box(request: pytest.FixtureRequest, tmp_path: Path, sshd: SshdServer) -> Iterator[tuple[str, Sandbox]]:
    box = sandbox_for(tmp_path, sshd, request.param)
    try:
        yield request.param, box
    finally:
        box.stop_all()


def deploy(box: Sandbox, *args: str) -> tuple[int, dict, str]:
    proc = box.orch("deploy", "--host", "gpu", "--json", *args)
    report = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
    return proc.returncode, report, proc.stderr


def test_the_shipped_playbook_deploys_on_each_layout(layout_box: tuple[str, Sandbox]) -> None:
    layout, box = layout_box
    written = box.sglang_root / WRITES[layout]
    before = {p: sha256(p) for p in (box.server_args, written)}
    old_pid = box.start_by_hand()

    code, report, err = deploy(box, PLAYBOOK)
    assert code == 0, err
    host = report["hosts"]["gpu"]
    assert host["outcome"] == "changed"
    assert host["files"] == [str(written)]
    assert "speculative_disable_batch_threshold" in written.read_text()
    if layout != "classic":  # one field, no parser call: the flag comes from A[...]
        assert FLAG not in written.read_text()
    info = get_json(box.port, "/get_server_info")
    assert info["speculative_disable_batch_threshold"] == 32
    new_pid = box.server_pid()
    assert new_pid is not None and new_pid != old_pid
    assert cmdline(new_pid)[-2:] == [FLAG, "32"]

    code, report, err = deploy(box, PLAYBOOK)
    assert code == 0, err
    assert report["hosts"]["gpu"]["outcome"] == "unchanged"
    assert box.server_pid() == new_pid

    back = box.orch("rollback", "--host", "gpu")
    assert back.returncode == 0, back.stdout + back.stderr
    assert {p: sha256(p) for p in before} == before
    assert health_status(box.port) == 200
    assert "speculative_disable_batch_threshold" not in get_json(box.port, "/get_server_info")


# --------------------------------------------------------------------------- applied blocks re-check their anchors

MOVING = """\
name: moving
vars: {{port: 30000}}
files:
  - path: "{{{{ sglang_root }}}}/srt/server_args.py"
    edits:
      - content: "STANDIN_NOTE = {{'layout': 'classic'}}"
        after: "{anchor}"
    validate: [python-syntax]
"""


@pytest.fixture
def classic_box(tmp_path: Path, sshd: SshdServer) -> Iterator[Sandbox]:
    box = sandbox_for(tmp_path, sshd, "classic")
    try:
        yield box
    finally:
        box.stop_all()


def write_playbook(box: Sandbox, anchor: str) -> str:
    path = box.root / "moving.yaml"
    path.write_text(MOVING.format(anchor=anchor))
    return str(path)


def test_an_applied_block_whose_anchor_now_matches_twice_is_refused_like_a_clean_file(classic_box: Sandbox) -> None:
    box = classic_box
    book = write_playbook(box, "logger = logging.getLogger(__name__)")
    code, report, err = deploy(box, book)
    assert code == 0, err
    # someone adds a second line the anchor matches
    text = box.server_args.read_text()
    box.server_args.write_text(text + "\nlogger = logging.getLogger(__name__)\n")
    applied = sha256(box.server_args)
    code, report, err = deploy(box, book)
    assert code == 2, err
    error = report["hosts"]["gpu"]["error"]
    assert "files[0].edits[0].after: anchor matches 2 places" in error
    assert sha256(box.server_args) == applied
    # the same error as on the file without the block (whose 3 lines shift the second match)
    clean = box.server_args.read_text().replace(
        "# >>> orch moving:0.0\nSTANDIN_NOTE = {'layout': 'classic'}\n# <<< orch moving:0.0\n", ""
    )
    assert clean != box.server_args.read_text()
    box.server_args.write_text(clean)
    code, again, _ = deploy(box, "--check", book)
    assert code == 2
    found = [int(n) for n in re.findall(r"line (\d+): logger", error)]
    found_clean = [int(n) for n in re.findall(r"line (\d+): logger", again["hosts"]["gpu"]["error"])]
    assert len(found) == 2 and found_clean == [found[0], found[1] - 3]
    assert re.sub(r"line \d+", "line N", again["hosts"]["gpu"]["error"]) == re.sub(r"line \d+", "line N", error)


def test_a_block_its_anchor_no_longer_points_at_is_a_planned_move_then_a_new_release(classic_box: Sandbox) -> None:
    box = classic_box
    box.start_by_hand()
    book = write_playbook(box, "logger = logging.getLogger(__name__)")
    code, report, err = deploy(box, book)
    assert code == 0, err
    first_release = report["hosts"]["gpu"]["release"]
    # the anchor line moves (an upgrade reorders the module): the block stays behind
    lines = box.server_args.read_text().splitlines(keepends=True)
    at = lines.index("logger = logging.getLogger(__name__)\n")
    anchor = lines.pop(at)
    tail = lines.index("def prepare_server_args(argv: List[str]) -> ServerArgs:\n")
    lines.insert(tail, anchor + "\n\n")
    box.server_args.write_text("".join(lines))
    moved_by_hand = sha256(box.server_args)

    check = box.orch("deploy", "--check", "--json", "--host", "gpu", book)
    assert check.returncode == 0, check.stderr
    host = json.loads(check.stdout)["hosts"]["gpu"]
    assert host["outcome"] == "planned"
    assert host["files"] == [str(box.server_args)]
    assert any("block orch:moving:0.0 moved from" in note for note in host["notes"]), host["notes"]
    assert sha256(box.server_args) == moved_by_hand

    code, report, err = deploy(box, book)
    assert code == 0, err
    assert report["hosts"]["gpu"]["outcome"] == "changed"
    assert report["hosts"]["gpu"]["release"] != first_release
    text = box.server_args.read_text()
    assert text.count("STANDIN_NOTE") == 1
    assert "logger = logging.getLogger(__name__)\n# >>> orch moving:0.0\n" in text
    code, report, _ = deploy(box, book)
    assert code == 0 and report["hosts"]["gpu"]["outcome"] == "unchanged"


def test_a_target_with_a_utf8_bom_deploys_and_keeps_its_bom(classic_box: Sandbox) -> None:
    """Python runs a file that starts with a BOM; orch used to refuse it ("invalid character U+FEFF")."""
    box = classic_box
    box.server_args.write_bytes(b"\xef\xbb\xbf" + box.server_args.read_bytes())
    box.start_by_hand()
    code, report, err = deploy(box, PLAYBOOK)
    assert code == 0, err
    data = box.server_args.read_bytes()
    assert data.startswith(b"\xef\xbb\xbf") and data.count(b"\xef\xbb\xbf") == 1
    assert get_json(box.port, "/get_server_info")["speculative_disable_batch_threshold"] == 32
    assert "sed -n 79,87p" in err  # the read-back view counts lines as Python does (the BOM is no line)


# --------------------------------------------------------------------------- a misspelt near:


@pytest.mark.parametrize("layout", sorted(WRITES))
def test_a_misspelt_near_is_one_line_naming_the_layout_and_the_closest_names(
    tmp_path: Path, sshd: SshdServer, layout: str
) -> None:
    box = sandbox_for(tmp_path, sshd, layout)
    book = tmp_path / "typo.yaml"
    book.write_text(Path(PLAYBOOK).read_text().replace(
        "near: [speculative_accept_threshold_acc, speculative_num_draft_tokens]",
        "near: speculative_accept_treshold_acc"))
    before = {p: sha256(p) for p in box.sglang_root.rglob("*.py")}
    proc = box.orch("deploy", "--host", "gpu", "--check", str(book))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "near:" in line]
    assert len(lines) == 1, proc.stdout + proc.stderr
    said = {"classic": "the classic layout (SGLang ≤ 0.5.13", "annotated": "the annotated layout (SGLang 0.5.14",
            "spec": "the spec layout (SGLang ≥ 0.5.20"}[layout]
    assert f"typo.yaml:{_near_line(book)}: files[0].edits[0].add_flag: near: speculative_accept_treshold_acc " \
           f"is no flag of {box.server_args}" in lines[0]
    assert f"it uses {said}" in lines[0]
    # the spec layout's fields are in modules the misspelt name does not lead to: a second read finds them
    assert "did you mean: speculative_accept_threshold_acc" in lines[0]
    assert "cannot tell how" not in lines[0]
    assert {p: sha256(p) for p in before} == before


def _near_line(book: Path) -> int:
    """The playbook line of the add_flag edit (where its errors point)."""
    return next(i for i, line in enumerate(book.read_text().splitlines(), 1) if "add_flag:" in line)
