"""Issue 21's table, rows "``history`` on a terminal" (what ``keep_releases`` pruned is said,
never dropped silently) and "``rollback`` summary" (what was undone and what is current now,
not the rollback's own record).

The real ``orch`` in a subprocess over real sshd, against the stand-in server.
"""

from __future__ import annotations

import re

from tests.fixtures.sandbox import REPO, Sandbox
from tests.test_cli import as_json, run, run_in_pty

PRUNED = "3 older records pruned (keep_releases 2)"


def deployed(box: Sandbox, playbook: str) -> str:
    proc = run(box, "deploy", "--host", "gpu", playbook, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(as_json(proc)["hosts"]["gpu"]["release"])


def rolled_back(box: Sandbox, *args: str) -> str:
    """``orch rollback``'s summary line, as a pipe shows it."""
    text = run(box, "rollback", "--host", "gpu", *args)
    assert text.returncode == 0, text.stdout + text.stderr
    summary = [line for line in text.stdout.splitlines() if line.startswith("gpu: rolled_back")]
    assert len(summary) == 1, text.stdout
    return summary[0]


def test_history_on_a_terminal_says_how_many_older_records_were_pruned(sandbox: Sandbox) -> None:
    # a files-only playbook (no server to restart) that keeps 2 releases
    shipped = (REPO / "playbooks" / "local-logging.yaml").read_text()
    (sandbox.root / "playbooks" / "local-logging.yaml").write_text(shipped + "keep_releases: 2\n")

    first = deployed(sandbox, "local-logging")
    # one run for both: under --json the human output (the same lines) goes to stderr
    listed = run(sandbox, "history", "--host", "gpu", "--json")
    history = as_json(listed)
    assert history["pruned"] == {"gpu": 0}, history  # counted from the first deploy on: none yet
    assert first in listed.stderr and "pruned" not in listed.stderr  # none: nothing said

    # deploy, roll back, two more times: every release but the last is out of effect,
    # so each deploy's keep_releases 2 prunes the oldest (d1; rb1, d2: three in all)
    last = first
    for _ in range(2):
        roll = run(sandbox, "rollback", "--host", "gpu")
        assert roll.returncode == 0, roll.stdout + roll.stderr
        last = deployed(sandbox, "local-logging")

    text = run(sandbox, "history", "--host", "gpu", "--json")  # the human lines: on stderr
    assert text.returncode == 0, text.stderr
    lines = text.stderr.splitlines()
    assert lines[-1] == PRUNED, text.stderr  # after the list
    assert len([line for line in lines if re.match(r"\d{8}T\d{9}-[0-9a-f]{4} ", line)]) == 2, text.stderr

    report = as_json(text)
    assert report["pruned"] == {"gpu": 3}
    assert [r["id"] for r in report["hosts"]["gpu"]][-1] == last and len(report["hosts"]["gpu"]) == 2

    code, screen = run_in_pty(sandbox, "history", "--host", "gpu", columns=80)
    assert code == 0, screen
    assert PRUNED in screen and first not in screen, screen

    # a state dir an older orch pruned has no count: unknown, so nothing is said
    (sandbox.state_dir / "pruned.json").unlink()
    text = run(sandbox, "history", "--host", "gpu", "--json")
    assert last in text.stderr and "pruned" not in text.stderr, text.stderr
    assert as_json(text)["pruned"] == {"gpu": None}
    # and the next prune does not start a count it cannot know (releases are missing from seq)
    run(sandbox, "rollback", "--host", "gpu")
    deployed(sandbox, "local-logging")
    assert not (sandbox.state_dir / "pruned.json").exists()


def test_rollback_summary_says_what_was_undone_and_what_is_current(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    r1 = deployed(sandbox, "local-logging")
    r2 = deployed(sandbox, "speculative-disable")

    line = rolled_back(sandbox)
    assert line == f"gpu: rolled_back: undid {r2} (speculative-disable); current: {r1} (local-logging)", line

    roll = run(sandbox, "rollback", "--host", "gpu", "--json")
    assert roll.returncode == 0, roll.stdout + roll.stderr
    host = as_json(roll)["hosts"]["gpu"]
    assert host["undid"] == [r1] and host["current"] is None, host  # --json keeps its fields
    assert host["release"] not in (r1, r2)  # the rollback's own record, which the line no longer names
    # the summary line's facts, as fields (its words are the CLI's)
    assert host["summary"] == {"undid": [{"release": r1, "playbook": "local-logging"}], "current": None}

    r3 = deployed(sandbox, "local-logging")
    line = rolled_back(sandbox)
    assert line == f"gpu: rolled_back: undid {r3} (local-logging); current: none (the state before any release)"
