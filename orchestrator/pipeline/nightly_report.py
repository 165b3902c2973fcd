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
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from orchestrator.core.cmdline import split_words
from orchestrator.core.nightly import FigureChange, NightManifest, manifest_changes, probe_changes
from orchestrator.pipeline.nightly import NightResult

CHART_MISSING = "trend chart not drawn: matplotlib is missing; install it with: pip install 'orch[report]'"


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


def write_report(reports_dir: Path, result: NightResult, spec_name: str, spec_path: str) -> ReportFiles:
    """Write this night's JSON (and log), then rewrite the page and the chart from all nights."""
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
    nights = load_nights(folder)
    notes: list[str] = []
    chart = folder / "trend.svg"
    try:
        draw_trend(nights, chart)
    except ImportError:
        chart = None  # type: ignore[assignment]
        notes.append(CHART_MISSING)
    index = folder / "index.html"
    _write_atomic(index, render_index(result.host, nights, chart is not None))
    return ReportFiles(json_path, index, chart, log_path, tuple(notes))


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _when(night: dict[str, Any]) -> str:
    return datetime.fromtimestamp(float(night.get("started") or 0), timezone.utc).strftime("%m-%d %H:%M:%S")


def draw_trend(nights: Sequence[dict[str, Any]], out: Path) -> int:
    """tokens/s and p99 over the nights that have a probe; returns how many points.

    The SVG's lines carry ids (``tokens_per_s``, ``p99_ms``) and its text stays
    text, so it can be read back; no date or random ids are embedded, so
    the same nights draw the same file.
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib import pyplot as plt

    probed = [n for n in nights if isinstance(n.get("probe"), dict)]
    labels = [f"{_when(n)}\n{n['night'].rsplit('-', 1)[-1]}" for n in probed]
    xs = list(range(len(probed)))
    tokens = [n["probe"].get("output_tokens_per_s") for n in probed]
    p99 = [n["probe"].get("p99_ms") for n in probed]
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "orch-nightly"}):
        fig, left = plt.subplots(figsize=(8, 3.6), dpi=100)
        try:
            (line,) = left.plot(xs, [t if t is not None else float("nan") for t in tokens], marker="o",
                                color="#1f6feb", label="output tokens/s")
            line.set_gid("tokens_per_s")
            left.set_ylabel("output tokens/s", color="#1f6feb")
            left.set_ylim(bottom=0)
            right = left.twinx()
            (line2,) = right.plot(xs, [v if v is not None else float("nan") for v in p99], marker="s",
                                  color="#d1242f", linestyle="--", label="p99 latency (ms)")
            line2.set_gid("p99_ms")
            right.set_ylabel("p99 latency (ms)", color="#d1242f")
            right.set_ylim(bottom=0)
            left.set_xticks(xs, labels, fontsize=7)
            left.margins(x=0.08)
            left.set_title(f"{probed[0]['host'] if probed else ''}: nightly probe, {len(probed)} night(s)")
            left.grid(alpha=0.3)
            left.legend(handles=[line, line2], loc="lower center", fontsize=8, ncols=2)
            fig.tight_layout()
            fig.savefig(out, format=out.suffix.lstrip(".") or "svg", metadata={"Date": None}
                        if out.suffix == ".svg" else None)
        finally:
            plt.close(fig)
    return len(probed)


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>orch nightly: {{ host }}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; max-width: 70em; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: left; }
.good { color: #1a7f37; } .bad { color: #cf222e; } code { font-size: 12px; }
</style></head><body>
<h1>orch nightly: {{ host }}</h1>
{% if latest %}
<h2>Latest night: {{ latest.night }} <span class="{{ 'good' if latest.exit_code == 0 else 'bad' }}">{{ latest.outcome }}</span></h2>
{% if latest.error %}<p class="bad">{{ latest.error }}</p>{% endif %}
<p>source: {{ latest.source or '-' }}; spec: {{ latest.spec.name }} ({{ latest.spec.path }}){% if latest.log %}; build log: <a href="{{ latest.log }}">{{ latest.log }}</a>{% endif %}</p>
<h3>What changed since the last good night{% if latest.last_good %} ({{ latest.last_good }}){% endif %}</h3>
{% if latest.changes %}<ul>{% for c in latest.changes %}<li>{{ c }}</li>{% endfor %}</ul>
{% elif latest.last_good %}<p>Nothing: same source, spec, stack, patched files and command line.</p>
{% else %}<p>No earlier good night to compare with.</p>{% endif %}
{% if latest.probe_changes %}<table><tr><th>probe figure</th><th>last good</th><th>this night</th><th>change</th></tr>
{% for f in latest.probe_changes %}<tr><td>{{ f.name }}</td><td>{{ f.before }}</td><td>{{ f.after }}</td><td>{{ '%+.1f %%'|format(f.percent) if f.percent is not none else '-' }}</td></tr>{% endfor %}
</table>{% endif %}
{% endif %}
<h2>Trend</h2>
{% if chart %}<img src="trend.svg" alt="output tokens/s and p99 latency per night">{% else %}<p>{{ missing }}</p>{% endif %}
<h2>Every night</h2>
<table><tr><th>night</th><th>outcome</th><th>source</th><th>tokens/s</th><th>p99 ms</th><th>errors</th><th>greedy</th></tr>
{% for n in nights|reverse %}<tr><td><a href="{{ n._file }}">{{ n.night }}</a></td><td class="{{ 'good' if n.exit_code == 0 else 'bad' }}">{{ n.outcome }}</td><td>{{ n.source or '-' }}</td>
<td>{{ n.probe.output_tokens_per_s if n.probe else '-' }}</td><td>{{ n.probe.p99_ms if n.probe else '-' }}</td><td>{{ n.probe.errors if n.probe else '-' }}</td><td><code>{{ (n.probe.greedy_sha256 or '-')[:12] if n.probe else '-' }}</code></td></tr>{% endfor %}
</table>
</body></html>
"""


def render_index(host: str, nights: Sequence[dict[str, Any]], chart: bool) -> str:
    """The page, with HTML escaping on (error messages and paths are text, not markup)."""
    import jinja2

    env = jinja2.Environment(autoescape=True, undefined=jinja2.ChainableUndefined)
    latest = nights[-1] if nights else None
    return env.from_string(_PAGE).render(host=host, nights=list(nights), latest=latest, chart=chart,
                                         missing=CHART_MISSING)


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


__all__ = ["CHART_MISSING", "NightManifest", "ReportFiles", "draw_trend", "load_nights", "notify",
           "render_index", "summary_line", "write_report"]
