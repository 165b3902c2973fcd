"""Drift under the current build: files a night patched that changed on the host since.

``orch status`` names them, and ``orch nightly`` refuses to build over them
without ``--force`` (a new night would silently drop those hand edits). The
host's ``nightly.json`` says where the builds are; the current build's own
``manifest.json`` says what each patched file's sha256 was when the night
made it.
"""

from __future__ import annotations

from orchestrator.core.nightly import NightManifest
from orchestrator.pipeline.session import HostSession


def night_drift(session: HostSession, state_dir: str) -> list[str]:
    """Paths (under ``builds_dir/current/``) whose sha256 is not the current night's."""
    nightly = session.call("get_json", path=f"{state_dir.rstrip('/')}/nightly.json")
    if not nightly or not nightly.get("builds_dir"):
        return []
    current = f"{nightly['builds_dir']}/current"
    data = session.call("get_json", path=f"{current}/manifest.json")
    if not data:
        return []
    manifest = NightManifest.model_validate(data)
    paths = {f"{current}/{f.path}": f.sha256_after for f in manifest.files}
    if not paths:
        return []
    shas = session.call("sha256", paths=list(paths))
    return [p for p, want in paths.items() if shas.get(p) != want]
