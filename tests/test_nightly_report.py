"""The nightly report reads at a glance: history's words, the live build, '-' for an
absent figure, every night on the chart with its value, and no path to a file not there.

The page and the chart are read back as a person's browser gets them: the
SVG's ``<text>`` elements (matplotlib keeps text as text) and the HTML.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from orchestrator.pipeline.nightly_report import CHART_MISSING, rewrite_page
from tests.fixtures.forkrun import run_orch
from tests.fixtures.sandbox import wait_until
from tests.test_nightly import NightBox, demo_servers, nightbox  # noqa: F401 - the fixture, shared

SVG = "{http://www.w3.org/2000/svg}"


def svg_texts(svg: Path) -> list[str]:
    """Every text the SVG draws, one string per ``<text>`` element (matplotlib writes one per line)."""
    root = ElementTree.parse(svg).getroot()
    return svg_texts_of(root)


def svg_texts_of(element: ElementTree.Element) -> list[str]:
    return ["".join(t.itertext()) for t in element.iter(f"{SVG}text")]


def svg_ids(svg: Path) -> set[str]:
    return {e.get("id", "") for e in ElementTree.parse(svg).getroot().iter()}


class Rows(HTMLParser):
    """The rows of the page's tables as lists of cell texts, with each row's class."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[str, list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append((dict(attrs).get("class") or "", []))
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self.rows:
            self.rows[-1][1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def night_rows(page: str) -> dict[str, tuple[str, list[str]]]:
    """The "every night" table: night name -> (row class, cells)."""
    parser = Rows()
    parser.feed(page)
    header = next(i for i, (_, cells) in enumerate(parser.rows) if cells[:3] == ["#", "night", "outcome"])
    return {cells[1]: (cls, cells) for cls, cells in parser.rows[header + 1:]}


def record(folder: Path, name: str, outcome: str, started: float, probe: dict[str, Any] | None,
           changes: list[str], last_good: str | None) -> None:
    """One night's JSON as ``write_report`` writes it (the fields the page and chart read)."""
    data = {"format": 1, "host": "gpu", "night": name, "spec": {"name": "test-nightly", "path": "n.yaml"},
            "outcome": outcome, "exit_code": 0 if outcome == "changed" else 1, "error": None,
            "started": started, "finished": started + 60, "source": "git 0123456789ab" if probe else None,
            "manifest": None, "probe": probe, "last_good": last_good, "changes": changes, "probe_changes": []}
    (folder / f"{name}.json").write_text(json.dumps(data))


NIGHTS = [
    ("20261201T020000000-aaaaaaa", "changed", {"output_tokens_per_s": 700.4, "p99_ms": 81.5, "errors": 0,
                                              "greedy_sha256": "ab" * 32}, [], None),
    ("20261202T020000000-aaaaaaa", "changed", {"output_tokens_per_s": 712.0, "p99_ms": None, "errors": 0,
                                              "greedy_sha256": None}, [], "20261201T020000000-aaaaaaa"),
    ("20261203T020000000-bbbbbbb", "changed", {"output_tokens_per_s": 401.0, "p99_ms": 140.0, "errors": 0},
     ["commit aaaaaaa -> bbbbbbb", "flag --speculative-disable-batch-threshold: 16 -> 64"],
     "20261202T020000000-aaaaaaa"),
    ("20261204T020000000-bbbbbbb", "rolled_back", None, ["env STANDIN_CRASH_AT_START: 0 -> 1"],
     "20261203T020000000-bbbbbbb"),
]
ROLLBACK = "20261205T090000000-r1"
WORDS = {"20261201T020000000-aaaaaaa": "good", "20261202T020000000-aaaaaaa": "current",
         "20261203T020000000-bbbbbbb": f"undone by {ROLLBACK}", "20261204T020000000-bbbbbbb": "switched back"}


@pytest.fixture
def after_rollback(tmp_path: Path) -> Path:
    """Four nights' records, then the host's words after an ``orch rollback`` of the third."""
    folder = tmp_path / "gpu"
    folder.mkdir()
    for i, (name, outcome, probe, changes, last_good) in enumerate(NIGHTS):
        record(folder, name, outcome, 1764554400 + i * 86400, probe, changes, last_good)
    (folder / "host").mkdir()
    (folder / "host" / "history.json").write_text(json.dumps(
        {"format": 1, "read": 1764554400 + 5 * 86400, "nights": WORDS, "current": "20261202T020000000-aaaaaaa"}))
    return folder


def test_the_chart_has_every_night_its_value_axis_names_the_bad_nights_mark_and_a_caption(
        after_rollback: Path) -> None:
    _, chart, notes = rewrite_page(after_rollback, "gpu")
    assert chart is not None and notes == ()
    texts = svg_texts(chart)
    joined = "\n".join(texts)
    # both axes named, with units
    assert "output tokens/s" in texts and "p99 latency (ms)" in texts
    assert any(t.startswith("night (") for t in texts)
    # every figure a night has is written at its point; the absent one is not invented
    for _, _, probe, _, _ in NIGHTS:
        for name in ("output_tokens_per_s", "p99_ms"):
            value = (probe or {}).get(name)
            if value is not None:
                assert (f"{value:.0f}" if value >= 100 else f"{value:.3g}") in texts, (name, value)
    # the title counts every night, the failed and undone ones included
    assert f"gpu: nightly probe, {len(NIGHTS)} night(s), 2 failed or undone" in texts
    # the failed night (no figure) and the undone one are marked on both panels, never dropped
    assert texts.count("switched back: -") == 2 and texts.count("undone") == 2
    assert "not_good" in svg_ids(chart) and {"tokens_per_s", "p99_ms", "caption"} <= svg_ids(chart)
    # the live build is named under its tick; the caption lists each night's change and word
    assert any(t.startswith("2 (live)") for t in texts)
    lines = [t for e in ElementTree.parse(chart).getroot().iter() if e.get("id") == "caption"
             for t in svg_texts_of(e)]
    assert len(lines) == len(NIGHTS)
    assert lines[2].startswith(f"3. 20261203T020000000-bbbbbbb (undone by {ROLLBACK}): commit aaaaaaa -> bbbbbbb")
    assert lines[3] == "4. 20261204T020000000-bbbbbbb (switched back): env STANDIN_CRASH_AT_START: 0 -> 1"
    assert "None" not in joined


def ys(d: str) -> list[float]:
    """The y coordinates of an SVG path's points (matplotlib writes them as ``M x y L x y …``)."""
    numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", d)]
    return numbers[1::2]


def frame_and_line(svg: Path, gid: str) -> tuple[tuple[float, float], list[float]]:
    """The (top, bottom) of the panel that draws the line ``gid``, and the line's points' y (SVG y grows down)."""
    root = ElementTree.parse(svg).getroot()
    for axes in root.iter(f"{SVG}g"):
        if not (axes.get("id") or "").startswith("axes_"):
            continue
        line = next((e for e in axes.iter() if e.get("id") == gid), None)
        if line is None:
            continue
        patch = next(e for e in axes.iter() if (e.get("id") or "").startswith("patch_"))
        frame = ys(next(p for p in patch.iter(f"{SVG}path")).get("d", ""))
        points = ys(next(p for p in line.iter(f"{SVG}path")).get("d", ""))
        return (min(frame), max(frame)), points
    raise AssertionError(f"no panel draws {gid} in {svg}")


@pytest.mark.parametrize("gid", ["tokens_per_s", "p99_ms"])
def test_the_chart_y_axes_reach_past_the_largest_value(after_rollback: Path, gid: str) -> None:
    _, chart, _ = rewrite_page(after_rollback, "gpu")
    assert chart is not None
    (top, bottom), points = frame_and_line(chart, gid)
    assert points
    highest = bottom - min(points)  # the largest value's height above the axis (at 0)
    assert highest > 0 and (bottom - top) >= 1.1 * highest  # the axis reaches >= 1.1 x the largest value


def test_the_page_uses_historys_words_marks_the_live_build_and_never_says_none(after_rollback: Path) -> None:
    index, _, _ = rewrite_page(after_rollback, "gpu")
    page = index.read_text()
    assert "None" not in page
    rows = night_rows(page)
    assert set(rows) == set(WORDS)
    for name, word in WORDS.items():
        cls, cells = rows[name]
        assert cells[2] == word  # the outcome column in orch history's words
        assert (cls == "live") == (name == "20261202T020000000-aaaaaaa")
        assert (cells[3] == "live") == (name == "20261202T020000000-aaaaaaa")
        if word not in ("current", "good"):
            assert cls == "notgood"
    # an absent figure is '-': the failed night has no probe, the second night no p99
    assert rows["20261204T020000000-bbbbbbb"][1][5:9] == ["-", "-", "-", "-"]
    assert rows["20261202T020000000-aaaaaaa"][1][6] == "-"
    assert "Live build: 20261202T020000000-aaaaaaa (current)" in re.sub(r"<[^>]+>", "", page)
    # the latest night's "last good" says what became of that night since
    assert f"20261203T020000000-bbbbbbb, the last good night when this one ran (now undone by {ROLLBACK})" in page
    assert f"Every night ({len(NIGHTS)}, 2 failed or undone)" in page


def test_without_historys_words_the_page_words_nights_from_their_own_outcomes(after_rollback: Path) -> None:
    (after_rollback / "host" / "history.json").unlink()
    index, _, _ = rewrite_page(after_rollback, "gpu")
    rows = night_rows(index.read_text())
    assert [rows[n][1][2] for n, *_ in NIGHTS] == ["good", "good", "good", "switched back"]
    assert [n for n, (cls, _) in rows.items() if cls == "live"] == ["20261203T020000000-bbbbbbb"]


def blocked_matplotlib(tmp: Path) -> str:
    """A PYTHONPATH whose first entry makes ``import matplotlib`` fail, as when it is not installed."""
    fake = tmp / "no-matplotlib" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib (blocked by the test)')\n")
    return os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")])


def test_no_chart_drawn_says_so_in_one_line_and_names_no_chart_file(nightbox: NightBox, tmp_path: Path) -> None:  # noqa: F811
    box = nightbox.box
    nightbox.reports.mkdir(parents=True)
    (nightbox.reports / "trend.svg").write_text("<svg/>")  # a chart an earlier run drew
    box.extra_env["PYTHONPATH"] = blocked_matplotlib(tmp_path)
    nightbox.write_spec("f" * 40)  # a commit the repository does not have: the night fails before the switch
    proc, data = nightbox.night()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    host = data["hosts"]["gpu"]
    assert host["outcome"] == "failed"
    said = [line for line in proc.stderr.splitlines() if "matplotlib" in line]
    assert len(said) == 1 and said[0].endswith(CHART_MISSING), said
    assert "trend.svg" not in out and not (nightbox.reports / "trend.svg").exists()
    page = (nightbox.reports / "index.html").read_text()
    assert CHART_MISSING.replace("'", "&#39;") in page and 'src="trend.svg"' not in page
    cls, cells = night_rows(page)[host["build"]]
    assert cells[2] == "failed" and cls == "notgood" and "None" not in page


def readme_steps(readme: str) -> list[tuple[list[str], int]]:
    """The README's command lines and the exit code each one's comment says."""
    steps = []
    for line in readme.splitlines():
        found = re.match(r"^\s+(orch .+?|\./\S+)\s+# exit (\d+)", line)
        if found:
            steps.append((shlex.split(found.group(1)), int(found.group(2))))
    return steps


@pytest.fixture(scope="module")
def kept_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, subprocess.CompletedProcess[str]]]:
    """One kept ``orch demo nightly`` for this file's tests (each leaves it as its next steps say)."""
    tmp_path = tmp_path_factory.mktemp("nightly-demo")
    before = demo_servers(tmp_path)
    proc = run_orch(["demo", "nightly", "--keep", "--json"], cwd=tmp_path, timeout=600,
                          env=dict(os.environ, COLUMNS="120", NO_COLOR="1", TMPDIR=str(tmp_path)))
    sandbox = Path(json.loads(proc.stdout)["sandbox"]) if proc.stdout.strip() else None
    try:
        assert sandbox is not None, proc.stdout + proc.stderr
        yield sandbox, proc
    finally:
        if sandbox is not None:
            subprocess.run(["sh", str(sandbox / "stop-server.sh")], capture_output=True, timeout=60)
            shutil.rmtree(sandbox, ignore_errors=True)
        wait_until(lambda: not demo_servers(tmp_path) - before, "the kept sandbox's server stopped", timeout=60)


def test_demo_nightly_keep_next_steps_work_in_order(kept_demo: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    sandbox, demo = kept_demo
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert f"sandbox kept in {sandbox}" in demo.stderr and str(sandbox / "README.txt") in demo.stderr
    # the kept spec is the shipped one but for its pin: night 4's crash switch is out again
    assert "STANDIN_CRASH_AT_START" not in (sandbox / "playbooks" / "nightly.yaml").read_text()
    steps = readme_steps((sandbox / "README.txt").read_text())
    assert [s[0][:2] for s in steps] == [["orch", "history"], ["orch", "nightly"], ["orch", "status"],
                                         ["orch", "rollback"], ["orch", "history"], ["./stop-server.sh"]]
    # the terminal's next-step hint, as `demo --keep` has: the README's first steps, from the sandbox
    hint = re.search(r"to go on there:\n\s+cd (\S+) && (.+)", demo.stderr)
    assert hint and Path(hint.group(1)) == sandbox, demo.stderr
    assert [shlex.split(c) for c in hint.group(2).split(" && ")] == [s[0] for s in steps[:2]]
    env = dict(os.environ, COLUMNS="200", NO_COLOR="1")
    outputs = []
    for argv, code in steps:
        done = (run_orch(argv[1:], cwd=sandbox, env=env, timeout=600) if argv[0] == "orch" else
                subprocess.run(argv, cwd=sandbox, env=env, capture_output=True, text=True, timeout=600))
        assert done.returncode == code, (argv, done.stdout + done.stderr)
        outputs.append(done.stdout + done.stderr)
    fifth = re.search(r"changed release (\S+)", outputs[1])
    assert fifth, outputs[1]
    live = os.readlink(sandbox / "builds" / "current")
    # the rollback rewrote the page: the fifth night undone, night 2's build live, history's words
    assert "nightly page rewritten: reports/sandbox/index.html" in outputs[3]
    page = (sandbox / "reports" / "sandbox" / "index.html").read_text()
    rows = night_rows(page)
    assert len(rows) == 5 and "None" not in page
    assert rows[fifth.group(1)][1][2].startswith("undone by ") and rows[fifth.group(1)][0] == "notgood"
    assert [n for n, (cls, _) in rows.items() if cls == "live"] == [live]
    history = outputs[4]
    for name, (_, cells) in rows.items():
        assert re.search(rf"^{re.escape(name)}\s.*\s{re.escape(cells[2])}\s", history, re.M), (name, cells[2])
    texts = svg_texts(sandbox / "reports" / "sandbox" / "trend.svg")
    assert "sandbox: nightly probe, 5 night(s), 3 failed or undone" in texts
    assert texts.count("switched back: -") == 2  # night 4 crashed at start: no figure, marked on both panels


def test_rollback_to_row_an_ambiguous_night_suffix_is_refused_and_the_page_is_left_alone(
        kept_demo: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    """Two nights of one commit share the suffix their names print: ``--to`` with it is
    refused (exit 2) listing both, and nothing moves: the build in effect, the page."""
    sandbox, _ = kept_demo
    env = dict(os.environ, COLUMNS="80", NO_COLOR="1")

    def orch(*args: str) -> subprocess.CompletedProcess[str]:
        return run_orch([*args], cwd=sandbox, env=env, timeout=300)

    rows = json.loads(orch("history", "--host", "sandbox", "--json").stdout)["hosts"]["sandbox"]
    by_suffix: dict[str, list[str]] = {}
    for r in rows:
        if r["kind"] == "night":
            by_suffix.setdefault(r["id"].rsplit("-", 1)[1], []).append(r["id"])
    suffix, same = next((s, ids) for s, ids in by_suffix.items() if len(ids) > 1)
    page = sandbox / "reports" / "sandbox" / "index.html"
    before = (page.read_bytes(), page.stat().st_mtime_ns, os.readlink(sandbox / "builds" / "current"))
    done = orch("rollback", "--host", "sandbox", "--to", suffix)
    said = done.stdout + done.stderr
    assert done.returncode == 2, said
    assert f"--to: '{suffix}' names several releases: {', '.join(same)}" in said
    assert "nightly page rewritten" not in said and "Traceback" not in said
    assert (page.read_bytes(), page.stat().st_mtime_ns, os.readlink(sandbox / "builds" / "current")) == before

