"""Big targets: planned reading only around the change, and carried over the link whole.

Planning and the structural check read a big target once, and only around the change.

Not a timing (figures are in ``bench/bench_bigfile.py``): the mechanism. A
module of ~4,000 top-level functions with the stand-in's ``server_args.py``
at its END (the worst case: everything before the change must be read to
know where statements begin). The story's two edits are planned and
checked while ``tokenize`` and ``ast.parse`` are counted: the file is
tokenized once in all (the lines fed to the tokenizer add up to the file
plus the statement group the edits touch, re-read as it changes), and no
parse or compile ever sees more than that group.

Then end to end, over the real sshd (issue 16): a 50 MB target deployed and
rolled back, and a 1 MB one through a proxy forwarding 100 KB/s each way,
where each of the file's three transfers (one to the controller, two to
the host) spans several blob lines and the controller's pings. Contents travel
as bounded blob lines and any arriving byte counts as life; the file is
byte-identical (sha256) after the rollback. (One transfer longer than the
30 s either end allows for silence, each way: ``test_link_silence.py``.)
"""

from __future__ import annotations

import ast
import hashlib
import json
import tokenize
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.core.edit_spec import Anchor, EditSpec
from orchestrator.core.edits import plan_file
from orchestrator.core.regions import count_lines, lines_between
from orchestrator.core.structure import check_structure
from orchestrator.standin import TREE
from tests.fixtures.proxy import TcpProxy
from tests.fixtures.sandbox import Sandbox, sha256

STANDIN = (TREE / "python" / "sglang" / "srt" / "server_args.py").read_text()
FILLER = "\n\ndef helper_{i}(parser):\n    parser.add_argument(\n        '--x{i}',\n        type=int,\n    )\n    return parser\n"


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    seen: dict[str, list[int]] = {"tokenized_lines": [], "parsed_lines": [], "compiled_lines": []}
    real_tokens, real_parse, real_compile = tokenize.generate_tokens, ast.parse, compile

    def tokens(readline):  # type: ignore[no-untyped-def]
        count = [0]

        def counting() -> str:
            line = readline()
            count[0] += bool(line)
            return line

        try:
            yield from real_tokens(counting)
        finally:
            seen["tokenized_lines"].append(count[0])

    def parse(source, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen["parsed_lines"].append(source.count("\n") if isinstance(source, str) else -1)
        return real_parse(source, *args, **kwargs)

    def compile_(source, *args, **kwargs):  # type: ignore[no-untyped-def]
        if isinstance(source, ast.Module):
            rows = [n.end_lineno - n.lineno + 1 for n in source.body]  # type: ignore[operator]
            seen["compiled_lines"].append(sum(rows))
        elif isinstance(source, str):
            seen["compiled_lines"].append(source.count("\n"))
        return real_compile(source, *args, **kwargs)

    monkeypatch.setattr(tokenize, "generate_tokens", tokens)
    monkeypatch.setattr(ast, "parse", parse)
    import builtins

    monkeypatch.setattr(builtins, "compile", compile_)
    return seen


def test_a_big_target_is_tokenized_once_and_parsed_only_around_the_change(counted: dict[str, list[int]]) -> None:
    text = "".join(FILLER.format(i=i) for i in range(4000)) + "\n\n" + STANDIN
    total = text.count("\n")
    edits = [
        EditSpec(kind="insert", text="speculative_disable_batch_threshold: Optional[int] = None\n",
                 anchor=Anchor("after", "ServerArgs.speculative_accept_threshold_acc", kind="field"), marker_id="f"),
        EditSpec(kind="insert", text='parser.add_argument(\n    "--speculative-disable-batch-threshold",\n    type=int,\n)\n',
                 anchor=Anchor("after", "parser.add_argument", kind="call", arg="--speculative-accept-threshold-acc"), marker_id="a"),
    ]
    plan = plan_file("big.py", text, edits)
    check_structure(plan, edits)
    assert plan.changed and len(plan.changes) == 2

    group = len(STANDIN.splitlines())  # the class ServerArgs and its neighbours: the changed statement group
    assert group * 10 < total  # the file is much bigger than what changes
    assert max(counted["tokenized_lines"]) <= total  # one pass reads the file (at most)
    assert sum(counted["tokenized_lines"]) <= total + 8 * group  # then only the group, as it changes
    assert counted["parsed_lines"] and max(counted["parsed_lines"]) <= group  # never the whole file
    assert counted["compiled_lines"] and max(counted["compiled_lines"]) <= group


def test_the_same_plan_reads_a_small_edit_at_the_top_without_reading_the_rest(counted: dict[str, list[int]]) -> None:
    text = STANDIN + "".join(FILLER.format(i=i) for i in range(4000))
    total = text.count("\n")
    edits = [EditSpec(kind="insert", text="X = 1\n", anchor=Anchor("after", "logger = logging.getLogger(__name__)"), marker_id="x")]
    plan = plan_file("big.py", text, edits)
    check_structure(plan, edits)
    assert sum(counted["tokenized_lines"]) < total // 10  # reading stops after the statements it needs


def test_plans_on_several_threads_at_once_never_trip_over_each_other() -> None:
    """A fleet plans hosts on threads; CPython 3.11's AST machinery is not thread-safe
    (it raised "SystemError: AST constructor recursion depth mismatch" in a 50-host run),
    so every parse goes through one lock (``core.pyindex.AST_LOCK``)."""
    import threading

    base = (TREE / "python" / "sglang" / "srt" / "server_args.py").read_text()
    errors: list[BaseException] = []

    def plan_many(n: int) -> None:
        try:
            for i in range(15):
                text = base + f"\nX_{n}_{i} = [{', '.join(f'({j}, [{j}])' for j in range(60))}]\n"
                spec = EditSpec(kind="insert", text=f"Y_{n} = {i}\n", anchor=Anchor("after", f"X_{n}_{i} = "))
                fplan = plan_file("server_args.py", text, [spec])
                check_structure(fplan, [spec])
        except BaseException as e:  # noqa: BLE001 - collected and reported below
            errors.append(e)

    threads = [threading.Thread(target=plan_many, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert errors == []


# --------------------------------------------------------------------------- the read-back view of a big file

BREAKS = st.sampled_from(["\n", "\r\n", "\r", "\f", "\v", "\x1c", "\x85", "\u2028"])


@given(st.lists(st.tuples(st.sampled_from(["", "x", "  y = 1", "\u00e9"]), BREAKS), max_size=12),
       st.booleans(), st.integers(1, 14), st.integers(0, 6))
def test_the_views_lines_are_the_lines_splitlines_gives(rows: list[tuple[str, str]], last_break: bool,
                                                         start: int, more: int) -> None:
    """The read-back view counts and cuts lines without splitting a whole (big) file,
    and must agree with ``str.splitlines`` exactly: its line numbers are the plan's."""
    text = "".join(line + brk for line, brk in rows)
    if not last_break:
        text += "tail"
    assert count_lines(text) == len(text.splitlines())
    assert lines_between(text, start, start + more) == text.splitlines()[start - 1 : start + more]


# --------------------------------------------------------------------------- big files over the link, end to end

BIG_PLAYBOOK = """\
name: big-target
files:
  - path: "{path}"
    edits:
      - content: "BIG_NOTE = 'orch was here'"
        after: "import os"
"""


def write_big_target(path: Path, size: int) -> str:
    """A Python module of ``size`` bytes whose anchor is at the top (planning stays cheap);
    lines differ (a counter and its hash) so it is not one repeated block. Returns its sha256."""
    lines = ["import os\n"]
    total = len(lines[0])
    n = 0
    while total < size:
        line = f"VALUE_{n} = '{hashlib.sha256(str(n).encode()).hexdigest()}'\n"
        lines.append(line)
        total += len(line)
        n += 1
    path.write_text("".join(lines))
    return sha256(path)


def deploy_and_roll_back(box: Sandbox, size: int) -> dict[str, Any]:
    """Deploy the edit to a ``size``-byte target, check it landed, roll back, check the bytes."""
    target = box.root / "big" / "big_module.py"
    target.parent.mkdir()
    original = write_big_target(target, size)
    playbook = box.root / "big.yaml"
    playbook.write_text(BIG_PLAYBOOK.format(path=target))
    done = box.orch("deploy", "--host", "gpu", "--json", str(playbook), timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(done.stdout)["hosts"]["gpu"]
    assert report["outcome"] == "changed", report
    assert report["round_trips"] <= 7, report
    text = target.read_text()
    assert "\nBIG_NOTE = 'orch was here'\n" in text[:200] and sha256(target) != original
    assert len(text) > size
    assert not [p for p in target.parent.iterdir() if p.name != target.name]  # no staged copy left
    back = box.orch("rollback", "--host", "gpu", "--json", timeout=900)
    assert back.returncode == 0, back.stdout[-2000:] + back.stderr[-2000:]
    assert sha256(target) == original  # byte-identical to the file before the deploy
    return report


def test_a_50_mb_target_deploys_over_sshd_and_rolls_back_byte_identical(sandbox: Sandbox) -> None:
    """Issue 16: a 50 MB target failed (its content went as one line of ~70 MB; each end took
    the time that line took for a dead link). Now contents go in bounded blob lines."""
    deploy_and_roll_back(sandbox, 50 * 1000 * 1000)


def test_a_1_mb_target_deploys_over_a_100_kb_per_s_link_and_rolls_back(sandbox: Sandbox) -> None:
    """Issue 16: at 200 KB/s a 2.9 MB file failed every time (its backups, one ~8 MB line, took
    longer than the 30 s of silence either end allows). Through a proxy that forwards 100 KB/s
    each way, the whole deploy and the rollback go through; each of the three transfers of the
    file's 1.33 MB of base64 takes ~13 s: seven blob lines, with pings between them."""
    proxy = TcpProxy(sandbox.sshd.port, delay=0.02, bandwidth=100_000)
    known = sandbox.root / "known_hosts_proxy"
    known.write_text(f"[127.0.0.1]:{proxy.port} {sandbox.sshd.host_key_pub}\n")
    sandbox.write_inventory(port=proxy.port, known_hosts=str(known))
    try:
        deploy_and_roll_back(sandbox, 1000 * 1000)
    finally:
        proxy.close()
