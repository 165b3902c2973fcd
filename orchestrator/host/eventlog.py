"""A release's event log (``events.jsonl``): what its runner did, line by line, on a full disk too.

The log is the only channel from a runner to whoever follows it — a
controller, ``orch status`` — so it is written into space reserved when the
release is armed (``reserve``: the file is allocated ahead and its unwritten
part is NUL bytes). A disk that fills up during the restart still takes the
runner's steps and its verdict; only a log longer than the reserve needs new
space. Writers (the runner, its guard, a helper fed step by step) take an
``flock`` and write after the last line; readers stop at the first NUL.

Standard library only, Python 3.8 syntax: this module is shipped to the host.
"""

import fcntl
import json
import os
import stat

from .session import drain

EVENTS_FILE = "events.jsonl"
RESERVE_BYTES = 512 * 1024


def reserve(release_dir):
    """Allocate the log's space now, while the disk has room (best effort)."""
    fd = os.open(os.path.join(release_dir, EVENTS_FILE), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        if os.fstat(fd).st_size == 0:
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            except (OSError, AttributeError):
                pass  # no room even now, or no fallocate here: the log grows as it is written
    finally:
        os.close(fd)


PIECE_BYTES = 16 * 1024
DURABLE = ("verdict", "restoring")  # the lines that say how a release ends: on disk before ``append`` returns


def written(fd, offset=0):
    """The part of the log that holds lines (before the reserved NULs), from byte
    ``offset`` on, read a piece at a time: a log is a few KB at the start of its 512 KB
    reserve, and it is read at every append and every poll of a follower (reading the
    whole reserve each time cost the runner and the helper following it more CPU than
    the rest of a deploy's logging)."""
    pieces = []
    while True:
        piece = os.pread(fd, PIECE_BYTES, offset)
        end = piece.find(b"\0")
        if end >= 0:
            pieces.append(piece[:end])
            break
        pieces.append(piece)
        if len(piece) < PIECE_BYTES:
            break
        offset += len(piece)
    return b"".join(pieces)


def append(release_dir, wire, mask=()):
    """One line after the last, masked (every secret value of ``mask`` as ``***``).

    A follower reads it at once. It is on disk before this returns where it
    says how the release ends (``DURABLE``: the verdict, a restore begun),
    and with it every line before it; a step or a progress line reaches the
    disk with the next of those. A crash of the host in between costs the
    log its last lines, never a line in the middle (a reader stops at the
    first NUL of the reserve), and a restore never reads this log: it reads
    the journal and ``restore.json``. A fsync per line cost the runner about
    20 of them per deploy, each a trip to the disk's queue.
    """
    data = line_bytes(wire, mask)
    fd = os.open(os.path.join(release_dir, EVENTS_FILE), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.pwrite(fd, data, len(written(fd)))
        if wire.get("event") in DURABLE:
            os.fsync(fd)
    finally:
        os.close(fd)
    ring(release_dir)


def line_bytes(wire, mask=()):
    """``wire`` as the log's line: JSON, each secret value of ``mask`` as ``***``."""
    line = json.dumps(wire, sort_keys=True)
    for secret in mask:
        line = line.replace(json.dumps(secret)[1:-1], "***")
    return (line + "\n").encode()


def lines(release_dir, start=0):
    """The log's whole lines from line ``start`` on, as dicts (a line cut short by a crash
    is not one; a line that is not JSON is ``{"event": "unreadable"}``)."""
    reader = Reader(release_dir)
    try:
        return reader.new_lines()[start:]
    finally:
        reader.close()


def parsed(raw):
    """One line of the log as a dict; a line that is not JSON is ``{"event": "unreadable"}``."""
    try:
        wire = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        wire = None
    return wire if isinstance(wire, dict) else {"event": "unreadable"}


class Reader:
    """The log as a follower reads it, every 0.1 s for as long as a release runs (a
    model's load can take many minutes): the file kept open and read on from the end of
    the last whole line, so that a poll that finds nothing new is one ``pread``, not an
    open, a read of the whole log and a split of every line already seen."""

    def __init__(self, release_dir):
        self.path = os.path.join(release_dir, EVENTS_FILE)
        self.fd = None
        self.offset = 0  # where the first line not yet returned begins

    def new_lines(self):
        """The whole lines written since the last call, as dicts (as ``lines`` gives them)."""
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_RDONLY)
            except OSError:
                return []
        try:
            data = written(self.fd, self.offset)
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
        self.offset += end
        return [parsed(raw) for raw in data[:end].split(b"\n")[:-1]]

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# ---------------------------------------------------------------- the followers' doorbells

DOORBELLS = "followers"  # in the release dir: one FIFO per follower, rung at every line


class Doorbell:
    """A follower's FIFO in the release dir, readable when a line was appended: a follower
    waits on it (``select``) instead of reading the log ten times a second for as long as a
    release runs. ``fd`` is None where no FIFO can be made (a full disk, a file system
    without them): that follower polls as before."""

    def __init__(self, release_dir):
        self.path = None
        self.fd = None
        folder = os.path.join(release_dir, DOORBELLS)
        try:
            try:
                os.mkdir(folder, 0o700)
            except FileExistsError:
                pass
            path = os.path.join(folder, "%d-%s" % (os.getpid(), os.urandom(4).hex()))
            os.mkfifo(path, 0o600)
            self.path = path
            # read and write: no writer is ever missing, so the FIFO is never at its end
            self.fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:
            self.close()

    def drain(self):
        """Forget the rings heard so far (the log is read next)."""
        if self.fd is not None:
            drain(self.fd)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.path is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass
            self.path = None


def ring(release_dir):
    """Wake every follower of this release: a byte into each doorbell that has a reader.
    One left by a follower that was killed has none (ENXIO) and is passed over; anything
    there that is not a FIFO is never written."""
    folder = os.path.join(release_dir, DOORBELLS)
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        try:
            fd = os.open(os.path.join(folder, name), os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, b"!")
        except OSError:
            pass  # full: that follower has a ring waiting already
        finally:
            os.close(fd)
