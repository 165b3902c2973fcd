"""What a restore writes into the release's records: ``restored.json``, the manifest's
outcome, the journal's step.

Each record is parsed into its type (``records.py``) before the restore sets its own
fields in it, so a newer orch's record is never rewritten and every other field stays
as it was. A module of its own, imported only when a restore ends: parsing records
needs ``dataclasses``, whose import would cost every deploy's confirm (which imports
``restore.py``) about 17 ms of host CPU.

Standard library only, Python 3.8 syntax: this module is shipped to the host.
"""

import os
import time

from .files import read_json, try_write_json
from .records import Journal, JournalStep, Manifest, RecordedOutcome, UnknownRecordFormat

JOURNAL_STEP_BY = {"controller": JournalStep.ROLLED_BACK, "watchdog": JournalStep.RESTORED_BY_WATCHDOG,
                   "rollback": JournalStep.ROLLED_BACK}
"""The journal's step once a deploy's or a night's restore succeeded, by who restored it."""


def finish_records(release_dir, spec, record, reason):
    """Write what the restore did into the release and the journal (best
    effort: on a full disk the record still reaches the controller)."""
    problems = []
    err = try_write_json(os.path.join(release_dir, "restored.json"), record)
    if err:
        problems.append(err)
    drift = [f["path"] for f in record["files"] if f.get("drift")]
    manifest_path = os.path.join(release_dir, "manifest.json")
    manifest = read_json(manifest_path)
    kind = (manifest or {}).get("kind", spec.get("kind", "deploy"))
    problems += update_record(manifest_path, manifest,
                              lambda: restored_manifest(release_dir, manifest, kind, record, reason, drift))
    journal_path = os.path.join(os.path.dirname(os.path.dirname(release_dir)), "journal.json")
    journal = read_json(journal_path)
    problems += update_record(journal_path, journal, lambda: restored_journal(release_dir, journal, kind, record, drift))
    return problems


def update_record(path, raw, fields_of):
    """Set ``fields_of()``'s fields in the record ``raw`` read from ``path``, every other field
    kept as it was; the problems met (a newer orch's record is never rewritten). No record
    (the release always has its manifest; the journal may be gone): nothing to finish."""
    if not isinstance(raw, dict):
        return []
    try:
        fields = fields_of()
    except UnknownRecordFormat as e:
        return [str(e)]
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # unreadable: every reader refuses it too
        return ["%s: unreadable record, left as it is (%s: %s)" % (path, type(e).__name__, e)]
    err = try_write_json(path, dict(raw, **fields)) if fields else None
    return [err] if err else []


def restored_manifest(release_dir, raw, kind, record, reason, drift):
    """The fields of the release's ``manifest.json`` the restore sets: its outcome (a
    rollback's own record: done; a deploy's or a night's: rolled back, and by whom), the
    drift it kept and a failed restore's error."""
    manifest = Manifest.from_wire(dict(raw, id=raw.get("id") or os.path.basename(release_dir)))
    ok = record["ok"]
    fields = {}
    if kind == "rollback":
        fields["outcome"] = (RecordedOutcome.DONE if ok else RecordedOutcome.ROLLBACK_FAILED).value
    else:
        fields["outcome"] = (RecordedOutcome.ROLLED_BACK if ok else RecordedOutcome.ROLLBACK_FAILED).value
        fields["restored_by"] = record["by"]
        if reason and not manifest.error:
            fields["error"] = reason
    if drift:
        fields["drift"] = drift
    if not ok:
        fields["restore_error"] = record["error"]
    return fields


def restored_journal(release_dir, raw, kind, record, drift):
    """The fields of ``journal.json`` the restore sets when the journal is this release's
    (none otherwise): the step it reached, finished when it succeeded, the drift kept."""
    journal = Journal.from_wire(raw)
    if journal is None or journal.release != os.path.basename(release_dir):
        return {}
    if record["ok"]:
        step = JournalStep.DONE if kind == "rollback" else JOURNAL_STEP_BY.get(record["by"], JournalStep.ROLLED_BACK)
        fields = {"step": step.value, "finished": True}
    else:
        step = JournalStep.RESTORE_FAILED if record["completed"] else JournalStep.RESTORE_INTERRUPTED
        fields = {"step": step.value}
    fields.update(drift=drift, time=time.time())
    return fields
