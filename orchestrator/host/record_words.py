"""The words a release's record says it ended with (``manifest.json``'s ``outcome``).

The helper and the controller write them and ``history``, ``status`` and
``orch rollback`` read them, so they are defined here once, as an enum that
both sides write as ``.value`` (never as a literal word). They are the words
of the records on disk since 0.1, so older orch still reads what this one
writes, and this one reads theirs. Where a word is also a run's outcome word
(``failed``, ``rolled_back``, ``rollback_failed``), ``core.outcomes.Outcome``
takes it from here, so the two cannot drift apart. (Kept beside
``records.py``, which re-exports it, only because that module is at its
600-line cap.)

Standard library only, Python 3.8 syntax.
"""

from __future__ import annotations

from enum import Enum

TYPE_CHECKING = False  # ``typing.TYPE_CHECKING``, without importing typing on the host
if TYPE_CHECKING:
    from typing import Any


class RecordedOutcome(str, Enum):
    """What a release's record says became of it. A ``str``: it compares equal to its
    word and is written as its word (``.value``) in JSON."""

    IN_PROGRESS = "in_progress"  # the release is being made (deploy, night, rollback); not finished
    DEPLOYED = "deployed"  # a deploy or a night confirmed: the release took effect
    FAILED = "failed"  # stopped before anything on the host changed (a night's build, a refusal)
    ROLLED_BACK = "rolled_back"  # a deploy or a night restored (by its run, the watchdog or a rollback)
    ROLLBACK_FAILED = "rollback_failed"  # the restore did not finish: a person must act
    DONE = "done"  # a rollback's own record: its restore succeeded

    def __str__(self) -> str:
        return str(self.value)  # the word, in f-strings too (a str Enum's own str is its name since 3.12)


def recorded_outcome(value: Any) -> RecordedOutcome | str | None:
    """A known word as the enum; a word a newer orch wrote, as its word (shown, never acted on);
    None when the record has none."""
    if value is None:
        return None
    try:
        return RecordedOutcome(value)
    except ValueError:
        return str(value)
