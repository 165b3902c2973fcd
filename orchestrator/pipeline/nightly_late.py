"""A night's report written late: by the next controller that learns the verdict of a night whose
own controller died (``kill -9``, a laptop that slept) after its switch.

After the switch a night belongs to its runner on the host, which confirms it or switches it
back by itself (``host/runner.py``); its report (``pipeline/nightly_report.py``: the night's
JSON, the page, the chart) is the controller's to write. The night's own controller writes it
as it always did; when it is gone, whoever follows that verdict next — ``orch status
--follow`` or the next ``orch nightly`` — writes the same report from the host's records: the
release's record (spec, seq, times), the build's ``manifest.json`` (with the probe the host
summed up, ``host/stamp.py``), the last good night's manifest (what ``current`` pointed at
before), the build's log. ``reported.json`` in the release marks that it was written.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.core.events import RestoreAccount
from orchestrator.core.nightly import NightManifest
from orchestrator.core.restore import RestoreRecord
from orchestrator.errors import OrchError
from orchestrator.host.records import HostRecords, Manifest
from orchestrator.pipeline.follow import report_of, reported_op, verdict_reads
from orchestrator.pipeline.nightly import NightResult
from orchestrator.pipeline.session import HostSession
from orchestrator.shell import ops
from orchestrator.shell.agent_client import wire_bytes
from orchestrator.shell.program import RunVerdict, release_follow


@dataclass(frozen=True)
class LateNight:
    """A night whose verdict no controller has reported: its result and the spec it came from."""

    result: NightResult
    spec_name: str
    spec_path: str


def unreported_night(state: HostRecords) -> Manifest | None:
    """The newest release, if it is a night (the only one a late report can be owed for)."""
    newest = state.newest_first()
    return newest[0] if newest and newest[0].kind == "night" else None


def unreported_reads(state: HostRecords, night: Manifest) -> tuple[ops.Op, ops.Op]:
    """The two reads that say whether ``night`` is owed a report (``follow.verdict_reads``)."""
    return verdict_reads(state.paths.release(night.id))


def owed(runner: Any, reported: Any) -> bool:
    return runner is not None and reported is None


def follow_unreported(session: HostSession, state: HostRecords, night: Manifest, command: str) -> LateNight | None:
    """Read the verdict of ``night`` (finished: its log ends in it; the lock proved nothing is
    in progress), mark it reported, and make its result. None when it has no verdict."""
    release_dir = state.paths.release(night.id)
    follow = release_follow(release_dir, 0, abort_on_cancel=False)
    try:
        v: RunVerdict = session.batch([follow, reported_op(release_dir, command)])[follow]
    except OrchError:
        return None
    return late_night(session, night, v)


def late_night(session: HostSession, night: Manifest, v: RunVerdict) -> LateNight:
    """The night's result as its own controller would have reported it, from the host's records."""
    label = session.target.name
    verdict = report_of(label, night.id, v, words=session.options.words)  # its outcome, exit code and error, as ``status --follow`` says them
    builds_dir = night.builds_dir or ""
    before = (night.link or {}).get("before")
    asked = [ops.get_json(f"{builds_dir}/{night.id}/manifest.json")]
    if before:
        asked.append(ops.get_json(f"{builds_dir}/{before}/manifest.json"))
    log = ops.read([f"{builds_dir}/logs/{night.id}.log"])
    got: Any = {}
    with contextlib.suppress(OrchError):
        got = session.batch([*asked, log])
    manifest = _manifest(got[asked[0]]) if got else None
    last_good = _manifest(got[asked[1]]) if got and before else None
    build_log = ""
    if got:
        info = got[log][0]
        if info.get("exists"):
            build_log = session.options.masker.text(wire_bytes(info.get("data")).decode("utf-8", "replace"))
    finished = manifest.finished if manifest is not None and manifest.finished else session.host_time()
    result = NightResult(label, night.id, verdict.outcome, verdict.exit_code, night.created, finished or 0.0,
                         error=verdict.error, ending=verdict.ending, manifest=manifest, last_good=last_good, build_log=build_log, seq=night.seq)
    if v.restore:
        result.restore = RestoreAccount(RestoreRecord.from_wire(v.restore))
    result.notes.append(f"reported late: night {night.id} ended without its controller")
    playbook = night.playbook or {}
    return LateNight(result, str(playbook.get("name") or "?"), str(playbook.get("path") or "?"))


def _manifest(data: Any) -> NightManifest | None:
    if not isinstance(data, dict):
        return None
    try:
        return NightManifest.model_validate(data)
    except ValueError:
        return None


def write_late(reports_dir: Path, late: LateNight, rows: list[Any] | None) -> Path:
    """The night's report, as ``orch nightly`` writes it (``nightly_report.write_report``)."""
    from orchestrator.pipeline.nightly_report import write_report

    return write_report(reports_dir, late.result, late.spec_name, late.spec_path, rows).json


__all__ = ["LateNight", "follow_unreported", "late_night", "owed", "unreported_night", "unreported_reads",
           "write_late"]
