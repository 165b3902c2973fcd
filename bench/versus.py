"""The table of ``bench_fleet.py --baseline REV``: orch of this checkout against orch at REV.

Both ran alternately in one run (round order A B, then B A, ...), so the ratios
are of figures taken under the same load. ``within 5%`` is issue 18's bar:
this checkout's median wall and its hosts' CPU per deploy each at most 1.05 x
the baseline's.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any, Protocol

LIMIT = 1.05


class RowLike(Protocol):
    """What this module reads of ``bench_fleet.Row`` (no import back: bench_fleet imports this)."""

    tool: str
    n: int
    deploys: Sequence[Any]
    noops: Sequence[Any]
    failures: Sequence[str]


def _median(samples: Sequence[Any], figure: Callable[[Any], float]) -> float | None:
    return statistics.median(figure(s) for s in samples) if samples else None


def _ratio(this: float | None, base: float | None) -> float | None:
    return this / base if this is not None and base else None


def _per_host_ms(total: float | None, n: int) -> float | None:
    return None if total is None else 1000 * total / n


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def comparison_rows(rows: Sequence[RowLike], base_tool: str, this_tool: str) -> list[tuple[str, ...]]:
    """One line per N (and one for the no-op re-run): medians of each side and this/base."""
    by = {(r.tool, r.n): r for r in rows}
    out: list[tuple[str, ...]] = [(
        "N", "run", "rounds", f"{base_tool} wall s", "this wall s", "wall this/base",
        f"{base_tool} host ms/host", "this host ms/host", "host CPU this/base", "within 5%",
    )]
    for n in sorted({r.n for r in rows}):
        base, this = by.get((base_tool, n)), by.get((this_tool, n))
        if base is None or this is None:
            continue
        for run, pick in (("deploy", lambda r: r.deploys), ("no-op", lambda r: r.noops)):
            b, t = pick(base), pick(this)
            wall_b, wall_t = _median(b, lambda s: s.wall), _median(t, lambda s: s.wall)
            cpu_b, cpu_t = _per_host_ms(_median(b, lambda s: s.tree_cpu), n), _per_host_ms(_median(t, lambda s: s.tree_cpu), n)
            walls, cpus = _ratio(wall_t, wall_b), _ratio(cpu_t, cpu_b)
            met = "-" if walls is None or cpus is None else ("yes" if max(walls, cpus) <= LIMIT else "no")
            out.append((str(n), run, f"{len(b)}+{len(t)}" if len(b) != len(t) else str(len(t)),
                        _cell(wall_b, ".3f"), _cell(wall_t, ".3f"), _cell(walls, ".3f"),
                        _cell(cpu_b, ".1f"), _cell(cpu_t, ".1f"), _cell(cpus, ".3f"), met))
    return out


HOW = ("Host CPU: user + sys of every process below each host's sshd during the run (the sshd "
       "session processes, the shell, orch's helper and what it runs, the watchdog), each sshd run "
       "under a child subreaper, counted by a cgroup per host in nanoseconds where the bench may "
       "make cgroups (root), else read from /proc in clock ticks (bench/hostcpu.py); the server a "
       "run starts is left out. Per host, median over the rounds.")


def markdown_section(heading: str, command: str, facts: dict[str, str], table: str, notes: Sequence[str]) -> str:
    """What ``--write`` appends: a dated heading naming both revisions, the command, the machine, the table."""
    parts = [f"## {heading}", "", f"Written by `{command}`. {HOW}", ""]
    parts += [f"- {k}: {v}" for k, v in facts.items()]
    parts += ["", "```", table, "```", ""]
    parts += [f"- note: {x}" for x in notes]
    return "\n".join(parts).rstrip("\n") + "\n"
