"""Releases and what "roll back" means, as pure functions over manifests.

A release is one deploy, one night (``orch nightly``) or one rollback
recorded on the host: for every file it touched, the content before and
after (stored beside the manifest as ``files/<n>.before`` /
``files/<n>.after``), and the server's command line before and after; a
night records instead where it pointed the ``builds_dir/current`` link and
where that link pointed before. The host's ``state.json`` keeps
``applied``: the stack of deploy and night releases in effect, oldest
first; its top is the current release. ``orch rollback`` pops it (like
``cap deploy:rollback``: a second rollback goes one further back, it never
toggles); ``--to R`` pops down to R. Deploys and nights that failed are
never pushed, so never current. Retention (what a confirm prunes) and the
releases' order are the host's too, so they are defined in
``host/retention.py`` and re-exported here.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from datetime import datetime, timezone

from orchestrator.errors import ConfigError, RefusedError
from orchestrator.host.records import Manifest, RecordedOutcome, ReleaseFile, ServerProcess

# defined once, with the restore plan they belong to; re-exported for the pipeline
from orchestrator.host.restore_plan import FileState as FileState
from orchestrator.host.restore_plan import LinkState as LinkState

# defined once, in the host package (the host prunes after a confirm it runs itself); re-exported
from orchestrator.host.retention import PrunePlan as PrunePlan
from orchestrator.host.retention import drift_kept as drift_kept
from orchestrator.host.retention import held_note as held_note
from orchestrator.host.retention import ordered_ids as ordered_ids
from orchestrator.host.retention import prune_candidates as prune_candidates
from orchestrator.host.retention import prune_plan as prune_plan
from orchestrator.host.retention import release_order as release_order


def new_release_id(now: datetime, suffix: str) -> str:
    """Readable, short enough to type, stamped with the host's time (milliseconds).

    Not what orders releases: a stepped host clock stamps a later release
    with an earlier time. ``release_order`` uses the host's ``seq``.
    """
    now = now.astimezone(timezone.utc)
    return now.strftime("%Y%m%dT%H%M%S") + f"{now.microsecond // 1000:03d}-{suffix}"


@dataclass(frozen=True)
class TargetState:
    """The state a rollback moves the host to: files, links, plus the server record."""

    undo: tuple[str, ...]  # release ids undone, newest first
    files: tuple[FileState, ...]
    server_before: ServerProcess | None  # the server record to restart, or None
    restart: bool
    new_applied: tuple[str, ...] = field(default_factory=tuple)
    links: tuple[LinkState, ...] = field(default_factory=tuple)


def file_state(release_root: str, entry: ReleaseFile, side: str) -> FileState:
    """Where the ``side`` ("before"/"after") copy of a manifest file entry lives."""
    if side == "before" and not entry.existed:
        return FileState(entry.path, None, None)
    return FileState(
        path=entry.path,
        source=posixpath.join(release_root, "files", f"{entry.n}.{side}"),
        sha256=entry.sha256_before if side == "before" else entry.sha256_after,
        mode=entry.mode,
        uid=entry.uid,
        gid=entry.gid,
    )


def resolve_release(ref: str, applied: list[str], releases: dict[str, Manifest]) -> str:
    """A full id, a unique prefix, or the suffix every view prints (``ba72``); else exit 2.

    A string that is the prefix of one release and the suffix of another is
    ambiguous and refused with both named: guessing would undo the wrong one.
    """
    if ref in releases:
        return ref
    hits = sorted(r for r in releases if ref and (r.startswith(ref) or r.endswith(ref)))
    if len(hits) == 1:
        return hits[0]
    if not hits:
        latest = ordered_ids(releases.values())[-3:]
        known = (f"the latest: {', '.join(reversed(latest))}; `orch history` lists them all"
                 if latest else "no release was ever recorded here")
        raise ConfigError(f"no release {ref!r} on this host ({known})", key="--to")
    raise ConfigError(f"{ref!r} names several releases: {', '.join(hits)}", key="--to")


def describe_release(manifest: Manifest, applied: list[str]) -> str:
    """What became of a release, in the words ``orch history`` prints.

    ``current``, ``deployed`` (in effect, under the current one), ``undone by
    R``, ``rolled back`` (by the deploy itself: its controller or its runner), ``rolled back
    (guard)`` (the runner died or outlived its backstop), ``rolled back (watchdog)`` (an older orch's);
    for a rollback record, ``undid R…``. Never "deployed" for a release that
    is no longer in effect.
    """
    outcome = manifest.outcome or "?"
    if manifest.kind == "night":
        return _describe_night(manifest, applied)
    if manifest.kind == "rollback":
        if outcome == RecordedOutcome.DONE:
            return "undid " + ", ".join(manifest.undid)
        return outcome.replace("_", " ")
    if outcome == RecordedOutcome.DEPLOYED:
        if applied and manifest.id == applied[-1]:
            return "current"
        if manifest.undone_by:
            return f"undone by {manifest.undone_by}"
        if manifest.id not in applied:
            return "not in effect"
        return "deployed"
    if outcome == RecordedOutcome.ROLLED_BACK:
        by = manifest.restored_by
        return f"rolled back ({by})" if by in ("watchdog", "guard") else "rolled back"
    return outcome.replace("_", " ")


def _describe_night(manifest: Manifest, applied: list[str]) -> str:
    """A night in the same words, but for nights: ``good`` (in effect under the current
    one), ``switched back`` (by its own run, the watchdog, or ``orch rollback``)."""
    outcome = manifest.outcome or "?"
    if outcome == RecordedOutcome.DEPLOYED:
        if applied and manifest.id == applied[-1]:
            return "current"
        if manifest.undone_by:
            return f"undone by {manifest.undone_by}"
        return "good" if manifest.id in applied else "not in effect"
    if outcome == RecordedOutcome.ROLLED_BACK:
        by = manifest.restored_by
        return "switched back" + (f" ({by})" if by in ("watchdog", "guard", "rollback") else "")
    if outcome == RecordedOutcome.ROLLBACK_FAILED:
        return "switch back failed"
    return outcome.replace("_", " ")


def rollback_to(ref: str, applied: list[str], releases: dict[str, Manifest]) -> str:
    """The release ``--to ref`` names, checked to be in effect; exit 2 otherwise, in every state.

    Checked before anything else a rollback does, so an unknown or undone
    release is refused the same way whether or not a release is current.
    """
    rid = resolve_release(ref, applied, releases)
    if rid not in applied:
        state = describe_release(releases[rid], applied)
        raise RefusedError(
            f"--to: release {rid} is not in effect on this host ({state}); "
            "--to takes the current release or one before it (see `orch history`)"
        )
    return rid


def rollback_target(
    applied: list[str],
    releases: dict[str, Manifest],
    releases_dir: str,
    to: str | None = None,
) -> TargetState:
    """What ``orch rollback [--to R]`` must restore.

    Undoing releases newest first, each file ends as it was before the
    *oldest* undone release that touched it, and the server as it ran
    before that oldest release — i.e. the state right after ``R`` (or
    right before the current release when no ``--to``).
    """
    if to is not None:
        rid = rollback_to(to, applied, releases)
        undo = applied[applied.index(rid) + 1 :][::-1]
        if not undo:
            raise RefusedError(f"release {rid} is already current: nothing to do")
    elif not applied:
        raise RefusedError("nothing to roll back: no release is current on this host")
    else:
        undo = [applied[-1]]
    missing = [r for r in undo if r not in releases]
    if missing:
        raise RefusedError(f"release {missing[0]} has been pruned from the host; cannot undo it")
    files: dict[str, FileState] = {}
    links: dict[str, LinkState] = {}
    server_before: ServerProcess | None = None
    restart = False
    for rid in undo:  # newest first: older releases overwrite, the oldest wins
        manifest = releases[rid]
        root = posixpath.join(releases_dir, rid)
        for entry in manifest.files:
            files[entry.path] = file_state(root, entry, "before")
        link = manifest.link  # a night: builds_dir/current, before and after its switch
        if link:
            newest = links.get(link["path"])
            expect = newest.expect if newest else link.get("after")  # where the newest night left it
            links[link["path"]] = LinkState(link["path"], link.get("before"), expect)
        if manifest.restarted:
            restart = True
            server_before = manifest.server_before
    remaining = tuple(applied[: len(applied) - len(undo)])
    return TargetState(tuple(undo), tuple(files.values()), server_before, restart, remaining,
                       tuple(links.values()))
