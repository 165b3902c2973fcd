"""Retention: which releases (and a night's builds) are removed once a release is confirmed.

Both sides need it: the controller prunes in the round trip that confirms a
release today, and the host will when it runs a release's program itself
and prunes after its confirm. So it is written once, here, over the host's
own records (``host/records.py``'s ``Manifest``) and names, with nothing of
the controller's; ``core.releases`` and ``core.nightly`` re-export these
names for the controller.

Order is the host's, never a clock: a release's ``seq`` (taken under the
host's lock when it is created), a build's night's ``seq``; records made
before ``seq`` existed come first, by id or name, as those versions
ordered them. Standard library only, Python 3.8 syntax (annotations are
never evaluated). Pure: ids and manifests in, plans out.
"""

from __future__ import annotations

from .records import Manifest
from .values import TYPE_CHECKING, field, value

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

# ---------------------------------------------------------------- order


def release_order(manifest: Manifest) -> tuple[int, int, str]:
    """Sort key of a release: the order the host made them in, never a clock.

    ``seq`` is the host's sequence number, taken under its lock when the
    release is created. Releases recorded by versions before it have none:
    they come first, by id (their time stamp) as those versions ordered them.
    """
    return manifest.order


def ordered_ids(manifests: Iterable[Manifest]) -> list[str]:
    """Release ids, oldest first (``release_order``)."""
    return [m.id for m in sorted(manifests, key=release_order)]


# ---------------------------------------------------------------- releases


@value(frozen=True)
class PrunePlan:
    """What retention removes, and what it keeps beyond ``keep_releases`` because of drift."""

    remove: list[str]
    held: dict[str, list[str]] = field(default_factory=dict)  # release -> paths whose drift it keeps


def drift_kept(manifests: Iterable[Manifest]) -> dict[str, list[str]]:
    """Releases that keep a drift copy still needed (``state_read``'s ``drift_kept``): id -> paths."""
    return {m.id: m.drift_kept_paths for m in manifests if m.drift_kept}


def prune_plan(
    release_ids: Sequence[str], applied: Sequence[str], keep: int,
    holding: Mapping[str, Sequence[str]] | None = None,
) -> PrunePlan:
    """The oldest releases beyond ``keep`` that are no longer in effect, and those held back.

    ``release_ids`` oldest first, as ``ordered_ids`` gives them (the host's
    ``seq``, never a clock). ``keep_releases`` is a soft cap. A release in effect (in ``applied``) is
    never pruned: each is a step ``orch rollback`` can take, and the oldest
    of them holds the only copy of the files as they were before any
    release. Rolled back deploys, undone releases and rollback records go
    first, oldest first — and those are exactly where a restore saves what a
    person wrote over orch's content (drift, ``files/<n>.drift``). So a
    release in ``holding`` (its drift copy neither restored nor removed by a
    person) is never pruned either: it is ``held``, for a note saying so.
    """
    in_effect = set(applied)
    holding = holding or {}
    excess = len(release_ids) - keep
    out: list[str] = []
    held: dict[str, list[str]] = {}
    for rid in release_ids:
        if excess <= 0:
            break
        if rid in in_effect:
            continue
        if rid in holding:
            held[rid] = list(holding[rid])
            continue
        out.append(rid)
        excess -= 1
    return PrunePlan(out, held)


def prune_candidates(
    release_ids: Sequence[str], applied: Sequence[str], keep: int,
    holding: Mapping[str, Sequence[str]] | None = None,
) -> list[str]:
    """``prune_plan``'s releases to remove."""
    return prune_plan(release_ids, applied, keep, holding).remove


def held_note(rid: str, paths: Sequence[str]) -> str:
    """Why a release outlives ``keep_releases``: the only copy of a person's edit is in it."""
    return (f"release {rid} is kept beyond keep_releases: it holds drift (content a person wrote) of "
            f"{', '.join(paths)} in {rid}/files/<n>.drift; it is pruned once that content is back in "
            "place or the copy is removed")


# ---------------------------------------------------------------- a night's builds


def build_order(name: str, seqs: Mapping[str, int]) -> tuple[int, int, str]:
    """Sort key of a build: the host's ``seq`` of its night, never the time in its name
    (a stepped host clock names a later night earlier); builds of nights made before
    ``seq`` existed come first, by name."""
    seq = seqs.get(name)
    return (1, seq, name) if seq is not None else (0, 0, name)


def builds_to_prune(builds: Sequence[str], current: str | None, previous: str | None, keep: int,
                    complete: Sequence[str] | None = None,
                    seqs: Mapping[str, int] | None = None,
                    steps: Sequence[str] | None = None) -> list[str]:
    """The builds to remove so that ``keep`` remain; never ``current`` nor the previous good one.

    Oldest by ``build_order``: ``seqs`` maps a build to its night's ``seq``.
    ``complete``: the builds a night confirmed (``None``: all of them). The
    others — built half-way by a night that was killed, or never passed (a
    failed night) — hold nothing a rollback can switch to: they never count
    toward ``keep`` and always go. ``steps``: the nights in effect (the host's
    ``applied``, deploys among them ignored), the builds ``orch rollback``
    switches back to one by one (``None``: every confirmed build is one). A
    confirmed build that is no step (its night undone by ``orch rollback``) goes
    before any step, whatever its age: a rollback step is only removed when
    more than ``keep`` steps are left, oldest first, so that ``keep`` is the
    depth ``orch rollback`` has (issue 21: two crashed builds once took the
    place of good ones and left a depth of 1).
    """
    protected = {b for b in (current, previous) if b}
    ordered = sorted(set(builds), key=lambda name: build_order(name, seqs or {}))
    whole = set(ordered) if complete is None else set(complete) | protected
    chain = whole if steps is None else (set(steps) & whole) | protected
    out = [name for name in ordered if name not in whole]
    kept = [name for name in ordered if name in whole]
    # what goes first when more than ``keep`` are kept: undone builds, then the oldest steps
    candidates = [name for name in kept if name not in chain] + [name for name in kept if name in chain]
    excess = len(kept) - max(keep, len(protected))
    for name in candidates:
        if excess <= 0:
            break
        if name in protected:
            continue
        out.append(name)
        excess -= 1
    return out
