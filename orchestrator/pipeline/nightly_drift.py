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

from typing import Any

from orchestrator.core.nightly import NightManifest
from orchestrator.pipeline.session import HostSession
from orchestrator.shell import ops


def night_drift(session: HostSession, state: dict[str, Any]) -> list[str]:
    """Paths (under ``builds_dir/current/``) whose sha256 is not the current night's.

    ``state``: the host's records, as ``state_read`` answers.
    """
    applied: list[str] = list(state["state"].get("applied", []))
    releases = {m["id"]: m for m in state["releases"]}
    nights = [rid for rid in applied if releases.get(rid, {}).get("kind") == "night"]
    if not nights or not releases[nights[-1]].get("builds_dir"):
        return []
    current = f"{releases[nights[-1]]['builds_dir']}/current"
    later = {f["path"] for rid in applied[applied.index(nights[-1]) + 1:]
             for f in releases.get(rid, {}).get("files", [])}
    data = session.run(ops.get_json(f"{current}/manifest.json"))
    if not data:
        return []
    manifest = NightManifest.model_validate(data)
    paths = {f"{current}/{f.path}": f.sha256_after for f in manifest.files if f"{current}/{f.path}" not in later}
    if not paths:
        return []
    shas = session.run(ops.sha256(list(paths)))
    return [p for p, want in paths.items() if shas.get(p) != want]
