"""A night's report on the controller: one JSON per night, a page, a chart, a notification.

``reports/<host>/<night>.json`` is the record of one night (its manifest,
outcome, probe figures and what changed since the last good night); the
build's log sits beside it. ``index.html`` is rewritten from all of them:
the latest night, what changed since the last good one (source, spec,
stack, templates, patched files, command line, probe figures with their
change in %), every night in a table, and ``trend.svg``: tokens/s and p99
latency over the nights, drawn with matplotlib from the JSON files alone.
matplotlib is the optional extra ``orch[report]``; without it the page is
written without the chart and one line says how to get it.

A night's JSON is written once; what became of it later (a night after it,
an ``orch rollback``) is the host's to say. ``host/history.json`` (a folder
of its own: ``*.json`` beside the page stays one file per night) keeps the host's words for each night as ``orch history`` prints
them (``current``, ``good``, ``undone by R``, ``switched back``, ``failed``),
read from the host after each night and after each ``orch rollback``; the
page and the chart are drawn from it, so they never call an undone night
good or miss which build is live.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.cmdline import split_words
from orchestrator.core.nightly import FigureChange, NightManifest, manifest_changes, probe_changes
from orchestrator.core.outcomes import Outcome
from orchestrator.pipeline.nightly import NightResult

if TYPE_CHECKING:
    from orchestrator.core.target import HostTarget
    from orchestrator.pipeline.session import ConnectOptions

CHART_MISSING = "no chart: matplotlib is not installed; pip install 'orch[report]'"
HISTORY_FILE = "host/history.json"
IN_EFFECT = ("current", "good")
"""The history words of a night whose build is (or is under) what ``current`` points to."""


@dataclass(frozen=True)
class ReportFiles:
    json: Path
    index: Path
    chart: Path | None
    log: Path | None
    notes: tuple[str, ...] = ()


def night_json(result: NightResult, spec_name: str, spec_path: str) -> dict[str, Any]:
    """The JSON of one night; ``changes`` compares with the last good night."""
    changes: list[str] = []
    figures: list[FigureChange] = []
    if result.manifest is not None and result.last_good is not None:
        changes = [c.text for c in manifest_changes(result.last_good, result.manifest)]
        figures = probe_changes(result.last_good.probe, result.manifest.probe)
    return {
        "format": 1,
        "host": result.host,
        "night": result.name,
        "seq": result.seq,
        "spec": {"name": spec_name, "path": spec_path},
        "outcome": result.outcome,
        "exit_code": result.exit_code,
        "error": result.error,
        "ending": result.ending.to_json() if result.ending is not None else None,
        "started": result.started,  # the host's clock
        "finished": result.finished,
        "source": result.manifest.source.label if result.manifest else None,
        "manifest": result.manifest.model_dump() if result.manifest else None,
        "probe": (result.manifest.probe or {}).get("summary") if result.manifest else None,
        "last_good": result.last_good.build if result.last_good else None,
        "changes": changes,
        "probe_changes": [{"name": f.name, "before": f.before, "after": f.after, "percent": f.percent}
                          for f in figures],
    }


def load_nights(folder: Path) -> list[dict[str, Any]]:
    """Every night's JSON in ``folder``, oldest first (unreadable files skipped).

    Oldest by the host's ``seq``, not by the time in the names: two controllers,
    or a host whose clock was stepped, name nights out of order. Nights without
    one (from older versions, or that never reached the host) come first, by name.
    """
    nights = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("night"):
            data["_file"] = path.name
            nights.append(data)
    return sorted(nights, key=night_order)


def night_order(night: dict[str, Any]) -> tuple[int, int, str]:
    """Sort key of a night's JSON (``load_nights``)."""
    seq = night.get("seq")
    if isinstance(seq, int) and not isinstance(seq, bool):
        return (1, seq, str(night["night"]))
    return (0, 0, str(night["night"]))


def write_report(reports_dir: Path, result: NightResult, spec_name: str, spec_path: str,
                 history: Sequence[Any] | None = None) -> ReportFiles:
    """Write this night's JSON (and log), then rewrite the page and the chart from all nights.

    ``history``: the host's history rows read after the night (``HistoryRow``),
    stored as ``host/history.json`` so the page words each night as ``orch history``
    does; None when they could not be read (the last stored words are kept).
    """
    folder = reports_dir / result.host
    folder.mkdir(parents=True, exist_ok=True)
    data = night_json(result, spec_name, spec_path)
    log_path = None
    if result.build_log:
        log_path = folder / f"{result.name}.log"
        log_path.write_text(result.build_log, encoding="utf-8")
        data["log"] = log_path.name
    json_path = folder / f"{result.name}.json"
    _write_atomic(json_path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    if history is not None:
        write_history(folder, history)
    index, chart, notes = rewrite_page(folder, result.host)
    return ReportFiles(json_path, index, chart, log_path, notes)


def rewrite_page(folder: Path, host: str) -> tuple[Path, Path | None, tuple[str, ...]]:
    """``index.html`` and ``trend.svg`` from the nights' JSON and ``host/history.json``.

    Returns the page, the chart (None when none was drawn: then no old chart is
    left beside the page either, so no path names a stale file) and notes.
    """
    history = read_history(folder)
    nights = with_words(load_nights(folder), history)
    notes: list[str] = []
    chart: Path | None = folder / "trend.svg"
    try:
        draw_trend(nights, chart)  # type: ignore[arg-type]
    except ImportError:
        with contextlib.suppress(FileNotFoundError):
            (folder / "trend.svg").unlink()
        chart = None
        notes.append(CHART_MISSING)
    index = folder / "index.html"
    _write_atomic(index, render_index(host, nights, chart is not None, history))
    return index, chart, tuple(notes)


def refresh_report(reports_dir: Path, target: HostTarget, options: ConnectOptions) -> ReportFiles | None:
    """After ``orch rollback``: store the host's words for its nights and rewrite the page.

    None when this host has no nightly report in ``reports_dir`` (nothing to
    rewrite, nothing read). The page is only ever written by orch commands:
    a rollback moves ``current``, so it rewrites what says which build is live.
    """
    folder = reports_dir / target.name
    if not any(folder.glob("*.json")):
        return None
    rows, warning = host_rows(target, options)
    if rows is not None:
        write_history(folder, rows)
    index, chart, notes = rewrite_page(folder, target.name)
    return ReportFiles(index, index, chart, None, notes + ((warning,) if warning else ()))


def host_rows(target: HostTarget, options: ConnectOptions) -> tuple[list[Any] | None, str | None]:
    """The host's history rows, or None and why they could not be read (``events.HistoryUnread``)."""
    from orchestrator.errors import OrchError
    from orchestrator.pipeline.inspect import host_history

    try:
        return list(host_history(target, options).rows), None
    except OrchError as e:
        return None, str(e)


def write_history(folder: Path, rows: Sequence[Any]) -> None:
    """``host/history.json``: each night's words as ``orch history`` prints them, and when they were read."""
    data = {"format": 1, "read": time.time(),
            "nights": {r.id: r.outcome for r in rows if r.kind == "night"},
            "current": next((r.id for r in rows if r.current), None)}
    (folder / HISTORY_FILE).parent.mkdir(exist_ok=True)
    _write_atomic(folder / HISTORY_FILE, json.dumps(data, indent=1, sort_keys=True) + "\n")


def read_history(folder: Path) -> dict[str, Any]:
    """What ``write_history`` stored, or an empty record (never read, or unreadable)."""
    try:
        data = json.loads((folder / HISTORY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and isinstance(data.get("nights"), dict) else {}


def night_word(outcome: str) -> str:
    """History's word for a night from its own outcome, for a night the host's words do not cover."""
    words: dict[str, str] = {Outcome.CHANGED: "good", Outcome.ROLLED_BACK: "switched back",
                             Outcome.ROLLBACK_FAILED: "switch back failed"}
    return words.get(outcome, outcome.replace("_", " "))


def with_words(nights: Sequence[dict[str, Any]], history: dict[str, Any]) -> list[dict[str, Any]]:
    """Each night with ``word`` (history's outcome) and ``live`` (its build is what ``current`` points to).

    A night the stored history does not list although it started before the
    history was read had its record pruned: pruning never removes a release in
    effect, so it is ``not in effect``. The live build is the newest night in
    effect (``current``, or ``good`` under a deploy that is current).
    """
    words: dict[str, str] = history.get("nights", {})
    read = float(history.get("read") or 0)
    out = []
    for night in nights:
        n = dict(night)
        if n["night"] in words:
            n["word"] = words[n["night"]]
        elif n.get("outcome") == Outcome.CHANGED and history and float(n.get("started") or 0) < read:
            n["word"] = "not in effect"
        else:
            n["word"] = night_word(str(n.get("outcome") or "?"))
        n["live"] = False
        out.append(n)
    live = next((n for n in reversed(out) if n["word"] in IN_EFFECT), None)
    if live is not None:
        live["live"] = True
    return out


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _when(night: dict[str, Any]) -> str:
    return datetime.fromtimestamp(float(night.get("started") or 0), timezone.utc).strftime("%m-%d %H:%M")


def _figure(night: dict[str, Any], name: str) -> float | None:
    probe = night.get("probe")
    value = probe.get(name) if isinstance(probe, dict) else None
    return float(value) if isinstance(value, int | float) else None


def _short(text: str, width: int = 110) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _value(v: float) -> str:
    """A point's label: whole numbers from 100 up, three significant digits below."""
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def chart_caption(nights: Sequence[dict[str, Any]]) -> list[str]:
    """One line per night, numbered as the x axis: its build, history's word and what changed."""
    lines = []
    for i, n in enumerate(nights, 1):
        changes = n.get("changes") or []
        if changes:
            what = "; ".join(changes)
        elif n.get("last_good"):
            what = "no change since the last good night"
        else:
            what = "no earlier good night to compare with"
        live = ", live" if n.get("live") else ""
        lines.append(_short(f"{i}. {n['night']} ({n.get('word', '?')}{live}): {what}"))
    return lines


def draw_trend(nights: Sequence[dict[str, Any]], out: Path) -> int:
    """tokens/s over p99 latency, one point per night; returns how many nights are drawn.

    Every night has its place on the x axis, numbered as the caption below
    lists them: a night with a figure has a point labelled with its value; a
    failed or undone night (history's word not ``current``/``good``) has a
    red cross and its word, at its value or on the axis when it has none.
    Two panels, so one night's tokens/s is never under its p99. The lines
    carry ids (``tokens_per_s``, ``p99_ms``; the crosses ``not_good``) and
    the text stays text, so it can be read back; no date or random ids are
    embedded, so the same nights draw the same file. matplotlib is imported
    here only: orch's other commands never pay for it.
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib import pyplot as plt

    nights = list(nights)
    xs = list(range(1, len(nights) + 1))
    caption = chart_caption(nights)
    bad = [n.get("word", "good") not in IN_EFFECT for n in nights]
    host = nights[0]["host"] if nights else ""
    failed = sum(bad)
    title = f"{host}: nightly probe, {len(nights)} night(s)" + (f", {failed} failed or undone" if failed else "")
    panels = (("output_tokens_per_s", "tokens_per_s", "output tokens/s", "#1f6feb", "o"),
              ("p99_ms", "p99_ms", "p99 latency (ms)", "#8250df", "s"))
    height = 5.0 + 0.125 * len(caption)
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "orch-nightly"}):
        fig, axes = plt.subplots(2, 1, sharex=True, figsize=(9, height), dpi=100)
        try:
            for ax, (name, gid, label, colour, marker) in zip(axes, panels, strict=True):
                values = [_figure(n, name) for n in nights]
                _draw_panel(ax, xs, values, bad, [n.get("word", "?") for n in nights], gid, colour, marker)
                ax.set_ylabel(label)
            axes[0].set_title(title)
            axes[1].set_xlabel("night (numbered as listed below; UTC start)")
            axes[1].set_xticks(xs, [f"{x}{' (live)' if n.get('live') else ''}\n{_when(n)}"
                                    for x, n in zip(xs, nights, strict=True)], fontsize=7)
            axes[1].set_xlim(0.5, len(xs) + 0.5)
            bottom = (0.12 + 0.125 * len(caption)) / height
            fig.text(0.01, 0.01, "\n".join(caption), fontsize=7, va="bottom", ha="left", gid="caption")
            fig.tight_layout(rect=(0, bottom, 1, 1))
            fig.savefig(out, format=out.suffix.lstrip(".") or "svg", metadata={"Date": None}
                        if out.suffix == ".svg" else None)
        finally:
            plt.close(fig)
    return len(nights)


def _draw_panel(ax: Any, xs: list[int], values: list[float | None], bad: list[bool], words: list[str],
                gid: str, colour: str, marker: str) -> None:
    """One figure over the nights: the line through the values, each labelled; crosses for bad nights."""
    known = [(x, v) for x, v in zip(xs, values, strict=True) if v is not None]
    (line,) = ax.plot([x for x, _ in known], [v for _, v in known], marker=marker, color=colour)
    line.set_gid(gid)
    top = max((v for _, v in known), default=0.0) * 1.2 or 1.0
    ax.set_ylim(0, top)
    for x, v in known:
        ax.annotate(_value(v), (x, v), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    crosses = [(x, v if v is not None else 0.0, w, v) for x, v, b, w in zip(xs, values, bad, words, strict=True)
               if b]
    if crosses:
        (marks,) = ax.plot([c[0] for c in crosses], [c[1] for c in crosses], linestyle="none", marker="X",
                           markersize=9, color="#cf222e")
        marks.set_gid("not_good")
        for x, y, word, value in crosses:
            word = "undone" if word.startswith("undone by") else word  # the caption has the full words
            text = word if value is not None else f"{word}: -"
            ax.annotate(text, (x, y), textcoords="offset points", xytext=(0, -12 if value is not None else 8),
                        ha="center", fontsize=7, color="#cf222e")
    for x, missing in zip(xs, values, strict=True):
        if missing is None and not bad[x - 1]:
            ax.annotate("-", (x, 0), textcoords="offset points", xytext=(0, 8), ha="center", fontsize=7)
    ax.grid(alpha=0.3)


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>orch nightly: {{ host }}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; max-width: 70em; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: left; }
.good { color: #1a7f37; } .bad { color: #cf222e; } code { font-size: 12px; }
tr.live { background: #dafbe1; font-weight: bold; } tr.notgood td.word { font-weight: bold; }
</style></head><body>
<h1>orch nightly: {{ host }}</h1>
{% if live %}<p id="live">Live build: <strong>{{ live.night }}</strong> ({{ live.word }}): what <code>current</code> points to{% if read %}, as the host said at {{ read }}{% endif %}.</p>
{% else %}<p id="live" class="bad">Live build: none of these nights is in effect{% if read %} (as the host said at {{ read }}){% endif %}.</p>{% endif %}
{% if latest %}
<h2>Latest night: {{ latest.night }} <span class="{{ 'good' if latest.word in in_effect else 'bad' }}">{{ latest.word }}</span></h2>
{% if latest.error %}<p class="bad">{{ latest.error }}</p>{% endif %}
<p>source: {{ latest.source|dash }}; spec: {{ latest.spec.name|dash }} ({{ latest.spec.path|dash }}){% if latest.log %}; build log: <a href="{{ latest.log }}">{{ latest.log }}</a>{% endif %}</p>
<h3>What changed since {% if latest.last_good %}{{ latest.last_good }}, the last good night when this one ran{% if words.get(latest.last_good) %} (now {{ words[latest.last_good] }}){% endif %}{% else %}the last good night{% endif %}</h3>
{% if latest.changes %}<ul>{% for c in latest.changes %}<li>{{ c }}</li>{% endfor %}</ul>
{% elif latest.last_good %}<p>Nothing: same source, spec, stack, patched files and command line.</p>
{% else %}<p>No earlier good night to compare with.</p>{% endif %}
{% if latest.probe_changes %}<table><tr><th>probe figure</th><th>last good</th><th>this night</th><th>change</th></tr>
{% for f in latest.probe_changes %}<tr><td>{{ f.name }}</td><td>{{ f.before|dash }}</td><td>{{ f.after|dash }}</td><td>{{ '%+.1f %%'|format(f.percent) if f.percent is number else '-' }}</td></tr>{% endfor %}
</table>{% endif %}
{% endif %}
<h2>Trend</h2>
{% if chart %}<img src="trend.svg" alt="output tokens/s and p99 latency per night">{% else %}<p>{{ missing }}</p>{% endif %}
<h2>Every night ({{ nights|length }}{% if bad %}, {{ bad }} failed or undone{% endif %})</h2>
<p>Outcomes in <code>orch history</code>'s words: current, good (in effect, under the current release), undone by R, switched back, failed.</p>
<table><tr><th>#</th><th>night</th><th>outcome</th><th>live</th><th>source</th><th>tokens/s</th><th>p99 ms</th><th>errors</th><th>greedy</th></tr>
{% for n in nights|reverse %}<tr class="{{ 'live' if n.live else ('notgood' if n.word not in in_effect else '') }}"><td>{{ nights|length - loop.index0 }}</td><td><a href="{{ n._file }}">{{ n.night }}</a></td><td class="word {{ 'good' if n.word in in_effect else 'bad' }}">{{ n.word }}</td><td>{{ 'live' if n.live else '' }}</td><td>{{ n.source|dash }}</td>
<td>{{ n.probe.output_tokens_per_s|dash }}</td><td>{{ n.probe.p99_ms|dash }}</td><td>{{ n.probe.errors|dash }}</td><td><code>{{ n.probe.greedy_sha256|dash(12) }}</code></td></tr>{% endfor %}
</table>
</body></html>
"""


def _dash(value: Any, width: int | None = None) -> str:
    """``-`` for a figure that is absent (None, undefined), never Python's ``None``."""
    if value is None or isinstance(value, jinja_undefined()):
        return "-"
    text = str(value)
    return text[:width] if width else text


def jinja_undefined() -> type:
    import jinja2

    return jinja2.Undefined


def render_index(host: str, nights: Sequence[dict[str, Any]], chart: bool,
                 history: dict[str, Any] | None = None) -> str:
    """The page, with HTML escaping on (error messages and paths are text, not markup).

    ``nights`` carry ``word`` and ``live`` (``with_words``); ``history`` is
    what ``read_history`` returned, for when the host last said it.
    """
    import jinja2

    env = jinja2.Environment(autoescape=True, undefined=jinja2.ChainableUndefined)
    env.filters["dash"] = _dash
    nights = [n if "word" in n else {**n, "word": night_word(str(n.get("outcome") or "?")), "live": False}
              for n in nights]
    latest = nights[-1] if nights else None
    live = next((n for n in nights if n.get("live")), None)
    read = (history or {}).get("read")
    when = datetime.fromtimestamp(float(read), timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if read else None
    return env.from_string(_PAGE).render(
        host=host, nights=nights, latest=latest, chart=chart, missing=CHART_MISSING, live=live, read=when,
        in_effect=IN_EFFECT, words={n["night"]: n["word"] for n in nights},
        bad=sum(n["word"] not in IN_EFFECT for n in nights))


def summary_line(result: NightResult) -> str:
    """One line for a notification: host, outcome, build, tokens/s or the error."""
    line = f"{result.host}: night {result.name} {result.outcome}"
    probe = result.probe
    if probe is not None:
        line += f", {probe.median('output_tokens_per_s')} tok/s, p99 {probe.median('p99_ms')} ms"
    if result.error:
        line += f": {result.error}"
    return line


def notify(command: str, result: NightResult, files: ReportFiles | None) -> str | None:
    """Run the spec's ``notify`` on the controller; returns a warning, or None when it worked.

    The command is split into words (no shell); what happened is in its
    environment: ``ORCH_NIGHT_OUTCOME``, ``ORCH_NIGHT_EXIT_CODE``,
    ``ORCH_NIGHT_HOST``, ``ORCH_NIGHT_BUILD``, ``ORCH_NIGHT_REPORT`` (the JSON),
    ``ORCH_NIGHT_INDEX`` (the page) and ``ORCH_NIGHT_SUMMARY`` (one line).
    """
    env = dict(os.environ)
    env.update({
        "ORCH_NIGHT_OUTCOME": result.outcome,
        "ORCH_NIGHT_EXIT_CODE": str(result.exit_code),
        "ORCH_NIGHT_HOST": result.host,
        "ORCH_NIGHT_BUILD": result.name,
        "ORCH_NIGHT_REPORT": str(files.json.resolve()) if files else "",
        "ORCH_NIGHT_INDEX": str(files.index.resolve()) if files else "",
        "ORCH_NIGHT_SUMMARY": summary_line(result),
    })
    try:
        argv = split_words(command)
        done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=120)
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        return f"notify: {e}"
    except Exception as e:  # noqa: BLE001 - a notification never changes the night's outcome
        return f"notify: {e}"
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()
        return f"notify exited {done.returncode}" + (f": {tail[-1]}" if tail else "")
    return None


__all__ = ["CHART_MISSING", "NightManifest", "ReportFiles", "chart_caption", "draw_trend", "host_rows",
           "load_nights", "notify", "read_history", "refresh_report", "render_index", "rewrite_page",
           "summary_line", "with_words", "write_history", "write_report"]
