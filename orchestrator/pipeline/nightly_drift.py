"""Drift under the current build: files a night patched that changed on the host since.

``orch status`` names them, and ``orch nightly`` refuses to build over them
without ``--force`` (a new night would silently drop those hand edits). The
newest night in effect (on the host's ``applied`` stack) says where the
builds are; the current build's own ``manifest.json`` says what each
patched file's sha256 was when the night made it. A file that a later
release in effect (a deploy on top of the night) wrote is that release's,
and its own drift check covers it.
"""

from __future__ import annotations

from orchestrator.core.nightly import NightManifest
from orchestrator.host.records import HostRecords
from orchestrator.pipeline.session import HostSession
from orchestrator.shell import ops


def night_drift(session: HostSession, state: HostRecords) -> list[str]:
    """Paths (under ``builds_dir/current/``) whose sha256 is not the current night's.

    ``state``: the host's records, as ``state_read`` answers.
    """
    applied = state.applied
    releases = state.by_id
    nights = [rid for rid in applied if rid in releases and releases[rid].kind == "night"]
    builds_dir = releases[nights[-1]].builds_dir if nights else None
    if not builds_dir:
        return []
    current = f"{builds_dir}/current"
    later = {f.path for rid in applied[applied.index(nights[-1]) + 1:] if rid in releases
             for f in releases[rid].files}
    data = session.run(ops.get_json(f"{current}/manifest.json"))
    if not data:
        return []
    manifest = NightManifest.model_validate(data)
    paths = {f"{current}/{f.path}": f.sha256_after for f in manifest.files if f"{current}/{f.path}" not in later}
    if not paths:
        return []
    shas = session.run(ops.sha256(list(paths)))
    return [p for p, want in paths.items() if shas.get(p) != want]
