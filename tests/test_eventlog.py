"""A release's event log (``host/eventlog.py``) on a real file: lines after the last one, in
its reserve, read back a piece at a time however long the log grows."""

from __future__ import annotations

import os
import select
from pathlib import Path

import pytest

from orchestrator.host import eventlog


def log_of(release: Path) -> Path:
    return release / eventlog.EVENTS_FILE


def written_part(release: Path) -> bytes:
    """The log's bytes before its reserved NULs, read the plain way."""
    return log_of(release).read_bytes().split(b"\0", 1)[0]


def test_lines_go_after_the_last_one_inside_the_reserve_and_read_back_in_order(tmp_path: Path) -> None:
    eventlog.reserve(str(tmp_path))
    reserved = log_of(tmp_path).stat().st_size
    for n in range(5):
        eventlog.append(str(tmp_path), {"event": "step", "n": n})
    assert [w["n"] for w in eventlog.lines(str(tmp_path))] == [0, 1, 2, 3, 4]
    assert [w["n"] for w in eventlog.lines(str(tmp_path), 3)] == [3, 4]
    data = log_of(tmp_path).read_bytes()
    assert len(data) == reserved  # written into the reserve, not after it
    assert data.count(b"\n") == 5 and data.rstrip(b"\0").endswith(b"}\n")


@pytest.mark.parametrize("reserved", [True, False], ids=["reserved", "growing"])
def test_a_log_many_pieces_long_reads_whole_and_takes_its_next_line_at_the_end(
        tmp_path: Path, reserved: bool) -> None:
    if reserved:
        eventlog.reserve(str(tmp_path))
    filler = "x" * 1000
    count = 3 * eventlog.PIECE_BYTES // 1000 + 7  # lines that cross several pieces' edges
    for n in range(count):
        eventlog.append(str(tmp_path), {"event": "progress", "n": n, "msg": filler})
    got = eventlog.lines(str(tmp_path))
    assert [w["n"] for w in got] == list(range(count))
    assert all(w["msg"] == filler for w in got)
    assert len(written_part(tmp_path)) > 3 * eventlog.PIECE_BYTES


@pytest.mark.parametrize("reserved", [True, False], ids=["reserved", "growing"])
def test_lines_that_end_exactly_at_a_pieces_edge_are_all_read(tmp_path: Path, reserved: bool) -> None:
    if reserved:
        eventlog.reserve(str(tmp_path))
    first = {"event": "progress", "msg": ""}
    size = len(eventlog.line_bytes(first))
    first["msg"] = "y" * (eventlog.PIECE_BYTES - size)  # one line of exactly one piece
    eventlog.append(str(tmp_path), first)
    assert len(written_part(tmp_path)) == eventlog.PIECE_BYTES
    assert eventlog.lines(str(tmp_path)) == [first]
    eventlog.append(str(tmp_path), {"event": "verdict", "verdict": "confirmed"})
    assert [w["event"] for w in eventlog.lines(str(tmp_path))] == ["progress", "verdict"]


def test_a_line_cut_short_by_a_crash_is_not_a_line_and_secrets_are_masked(tmp_path: Path) -> None:
    eventlog.reserve(str(tmp_path))
    eventlog.append(str(tmp_path), {"event": "health", "msg": "token s3cret-value"}, mask=["s3cret-value"])
    with open(log_of(tmp_path), "r+b") as f:  # a writer killed half-way through its line
        f.seek(len(written_part(tmp_path)))
        f.write(b'{"event": "ver')
    assert eventlog.lines(str(tmp_path)) == [{"event": "health", "msg": "token ***"}]
    assert b"s3cret" not in log_of(tmp_path).read_bytes()


def test_no_log_yet_has_no_lines(tmp_path: Path) -> None:
    assert eventlog.lines(str(tmp_path)) == []


def test_only_the_lines_that_end_a_release_wait_for_the_disk(tmp_path: Path, fsynced: list[int]) -> None:
    """Steps and progress are read by followers at once and reach the disk with the next
    restore or verdict line, which is synced before ``append`` returns."""
    eventlog.reserve(str(tmp_path))
    eventlog.append(str(tmp_path), {"event": "step", "state": "began", "step": "health"})
    eventlog.append(str(tmp_path), {"event": "progress", "msg": "waiting"})
    assert fsynced == []
    eventlog.append(str(tmp_path), {"event": "restoring", "by": "runner"})
    assert len(fsynced) == 1
    eventlog.append(str(tmp_path), {"event": "verdict", "verdict": "restored"})
    assert len(fsynced) == 2
    assert [w["event"] for w in eventlog.lines(str(tmp_path))] == ["step", "progress", "restoring", "verdict"]


@pytest.mark.parametrize("reserved", [True, False], ids=["reserved", "growing"])
def test_a_reader_gives_each_line_once_as_lines_gives_it_and_waits_for_a_line_cut_short(
        tmp_path: Path, reserved: bool) -> None:
    """What a follower polls: the log kept open, read on from the end of the last whole line."""
    release = str(tmp_path)
    reader = eventlog.Reader(release)
    try:
        assert reader.new_lines() == []  # no log yet
        if reserved:
            eventlog.reserve(release)
        filler = "x" * 1000
        got: list[dict[str, object]] = []
        for n in range(3 * eventlog.PIECE_BYTES // 1000 + 7):  # across several pieces' edges
            eventlog.append(release, {"event": "step", "n": n, "pad": filler})
            if n % 5 == 0:
                got += reader.new_lines()
        got += reader.new_lines()
        assert got == eventlog.lines(release) and reader.new_lines() == []
        with open(log_of(tmp_path), "r+b") as f:  # a line half written when the poll comes
            f.seek(len(written_part(tmp_path)))
            f.write(b'{"event": "verd')
            f.flush()
            assert reader.new_lines() == []
            f.write(b'ict"}\nnot json\n')
        assert reader.new_lines() == [{"event": "verdict"}, {"event": "unreadable"}]
    finally:
        reader.close()


def readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def test_a_line_appended_rings_every_followers_doorbell_and_a_closed_one_leaves_nothing(
        tmp_path: Path) -> None:
    """A follower waits on its doorbell instead of reading the log ten times a second: every
    append rings it (before ``append`` returns), and a follower that ends takes its FIFO away."""
    eventlog.reserve(str(tmp_path))
    bells = [eventlog.Doorbell(str(tmp_path)) for _ in range(2)]
    for bell in bells:
        assert bell.fd is not None and not readable(bell.fd)
    eventlog.append(str(tmp_path), {"event": "step", "n": 1})
    for bell in bells:
        assert readable(bell.fd)
        bell.drain()
        assert not readable(bell.fd)  # heard once; the log is read next
    bells[0].close()
    eventlog.append(str(tmp_path), {"event": "step", "n": 2})
    assert readable(bells[1].fd)
    bells[1].close()
    assert list((tmp_path / eventlog.DOORBELLS).iterdir()) == []


def test_a_doorbell_without_a_follower_and_what_is_not_a_doorbell_are_passed_over(tmp_path: Path) -> None:
    """A FIFO left by a follower that was killed has no reader: the append neither blocks nor
    fails. A file or a link in the doorbells' folder is never written through."""
    eventlog.reserve(str(tmp_path))
    folder = tmp_path / eventlog.DOORBELLS
    folder.mkdir()
    os.mkfifo(folder / "orphan")
    (folder / "plain").write_bytes(b"keep")
    target = tmp_path / "elsewhere"
    target.write_bytes(b"keep")
    (folder / "link").symlink_to(target)
    live = eventlog.Doorbell(str(tmp_path))
    eventlog.append(str(tmp_path), {"event": "step"})
    assert readable(live.fd)
    assert (folder / "plain").read_bytes() == b"keep" and target.read_bytes() == b"keep"
    assert [w["event"] for w in eventlog.lines(str(tmp_path))] == ["step"]
    live.close()


def test_no_doorbell_where_no_fifo_can_be_made_and_the_follower_polls(tmp_path: Path) -> None:
    gone = tmp_path / "no-such-release"
    bell = eventlog.Doorbell(str(gone))
    assert bell.fd is None and bell.path is None
    bell.drain()
    bell.close()
    eventlog.append(str(tmp_path), {"event": "step"})  # no doorbells' folder: nothing to ring
    assert [w["event"] for w in eventlog.lines(str(tmp_path))] == ["step"]
