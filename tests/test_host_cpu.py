"""What a release costs the host's CPU beyond its work (issue 18's hosts' CPU per deploy).

Long waits wake for news, not on a clock: a helper's pause ends at a cancel or at the end
of its link, a follower's at a line in the release's log (``eventlog.Doorbell``), the
guard's when its runner ends. Records of live processes do not wait for the disk. Each is
asserted by what became readable or what was synced, never by how long something took."""

from __future__ import annotations

import io
import json
import os
import select
import signal
from pathlib import Path

import pytest

from orchestrator.host import files, health, runner
from orchestrator.host import session as session_module
from orchestrator.host.session import Session
from orchestrator.host.wire import AgentError


def readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def test_a_cancel_or_the_end_of_the_link_wakes_the_helpers_pause() -> None:
    s = Session(io.BytesIO())
    assert not readable(s.wake_r)
    s.take_line(b'{"op":"cancel"}\n')
    assert s.cancel_requested and readable(s.wake_r)
    assert s.pause(1000.0) == []  # woken, and the wake is used up
    assert not readable(s.wake_r)
    s.reader(io.BytesIO(b""))  # the controller's end of the link closes
    assert s.eof and readable(s.wake_r)


def test_a_pause_gives_back_the_descriptors_that_became_readable() -> None:
    s = Session(io.BytesIO())
    r, w = os.pipe()
    try:
        assert s.pause(0.0, [r]) == []
        os.write(w, b"x")
        assert s.pause(1000.0, [r]) == [r]
    finally:
        os.close(r)
        os.close(w)


def test_a_health_wait_sleeps_in_one_piece_and_a_cancel_ends_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Between two polls the health wait sleeps once (it woke ten times a second to look
    for a cancel before, for as long as a model loads); a cancel still ends it."""
    s = Session(io.BytesIO())
    waits: list[float] = []
    real = session_module.select.select

    def counted(r: list[int], w: list[int], x: list[int], timeout: float) -> object:
        waits.append(timeout)
        return real(r, w, x, timeout)

    monkeypatch.setattr(session_module.select, "select", counted)
    health.sleep_watching(s, 0.3)
    assert 1 <= len(waits) <= 3, waits  # one wait (and a remainder, if the clock rounds)
    s.take_line(b'{"op":"cancel"}\n')
    with pytest.raises(AgentError, match="cancelled"):
        health.sleep_watching(s, 1000.0)


def test_the_guards_pipe_hears_its_child_end() -> None:
    """The guard sleeps on this pipe until its runner ends: SIGCHLD puts a byte into it."""
    old_handler = signal.getsignal(signal.SIGCHLD)
    old_fd = signal.set_wakeup_fd(-1)
    r, w = runner.runner_end_pipe()
    try:
        assert not readable(r)
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        assert select.select([r], [], [], 60)[0] == [r]
        assert os.waitpid(pid, 0)[0] == pid
    finally:
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGCHLD, old_handler)
        os.close(r)
        os.close(w)


def test_records_of_live_processes_do_not_wait_for_the_disk_and_the_rest_do(
        tmp_path: Path, fsynced: list[int]) -> None:
    files.write_json(str(tmp_path / "runner.json"), {"pid": 1}, durable=False)
    assert fsynced == [] and json.loads((tmp_path / "runner.json").read_text()) == {"pid": 1}
    files.write_json(str(tmp_path / "restore.json"), {"files": []})
    assert len(fsynced) >= 1  # the file (and its directory, where that can be synced)
    assert json.loads((tmp_path / "restore.json").read_text()) == {"files": []}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["restore.json", "runner.json"]  # no temp left
