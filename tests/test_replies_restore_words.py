"""Issue 16 items 10 and 13 (words): what a failed restore and its re-run say.

Through the real CLI over real sshd behind the latency proxy (test_faults'
``link``), faults from outside: a killed process, a damaged backup file.

- A failed restore says whether a server listens on the health port now
  (and its pid), or that nothing does — not only the file it could not restore.
- ``orch rollback`` finishing a restore that had already written a file back
  says that file was restored (by the earlier restore), never "untouched
  (never written)".
"""

from __future__ import annotations

import json

from tests.fixtures.sandbox import sha256, wait_until
from tests.test_faults import (
    Link,
    finish,
    hold_ready,
    kill_the_restored_server,
    link,
    release_dirs,
    story,
)

__all__ = ["link"]  # the fixture, used by name


def test_a_restore_whose_server_died_says_nothing_listens_and_the_rerun_says_restored(link: Link) -> None:
    box = link.box
    gate = hold_ready(box)
    original = sha256(box.server_args)
    code, rep, text = kill_the_restored_server(box)
    assert code == 3, text
    assert rep["outcome"] == "rollback_failed"
    assert f"files restored: {box.server_args}" in rep["error"]
    assert f"nothing is listening on port {box.port}: the server is down" in rep["error"]
    assert sha256(box.server_args) == original

    gate.write_text("")
    back = box.orch("rollback", "--host", "gpu", "--json")
    assert back.returncode == 0, back.stdout + back.stderr
    restore = json.loads(back.stdout)["hosts"]["gpu"]["restore"]
    assert f"files restored: {box.server_args} (by the runner's earlier restore)" in back.stderr, back.stderr
    said = [f for f in restore["files"] if f["path"] == str(box.server_args)]
    assert said and said[0]["earlier"] == "runner", restore
    assert "never written" not in back.stdout + back.stderr
    assert sha256(box.server_args) == original


def test_a_restore_that_cannot_restore_a_file_names_the_server_still_listening(link: Link) -> None:
    box = link.box
    box.start_by_hand()
    gate = box.root / "go"
    # the new server listens at once, is healthy only once the test says so, then flaps: the deploy fails
    proc = box.start_orch("deploy", "--host", "gpu", "--json",
                          str(story(box, env={"STANDIN_READY_FILE": str(gate), "STANDIN_FLAP": "0.3"})))
    wait_until(lambda: box.journal().get("step") == "restarting", "the restart")
    backup = release_dirs(box)[-1] / "files" / "0.before"
    backup.write_text("garbage\n")
    gate.write_text("")
    code, rep, text = finish(proc)
    assert code == 3, text
    assert rep["outcome"] == "rollback_failed"
    assert f"backup {backup} is damaged" in rep["error"] and str(box.server_args) in rep["error"]
    listening = box.server_pid()
    assert listening is not None
    assert f"a server is listening on port {box.port} (pid {listening})" in rep["error"], rep["error"]
