"""What both ends of the helper's channel agree on: constants, the error an op
raises, and how bytes travel (base64, ``Blob`` in answers, ``payload`` in requests).

File contents never travel as one long line: a line that takes longer to
send than the link's silence limit would pass for a dead link. Bytes go as
``blob`` lines of at most ``BLOB_CHUNK`` bytes (base64), ahead of the line
that uses them, which names them ``{"blob": n}``.
"""

import base64
import hashlib
import os

PROTOCOL = 1


READY_MAGIC = "ORCH-AGENT-READY"


TICK_SECONDS = 5.0


SILENCE_SECONDS = 30.0  # the link's silence limit unless ``hello`` says otherwise (``link_timeout``)


LINK_TIMEOUT_FLOOR = 3.0  # no shorter limit: pings and ticks (a third of it, 1 s at least) must fit


def beat_seconds(limit):
    """How often an end that must be heard within ``limit`` seconds speaks (the controller's
    pings, the helper's ticks): every 5 s, or a third of the limit when that is shorter."""
    return min(TICK_SECONDS, limit / 3.0)


BLOB_CHUNK = 192 * 1024  # bytes per blob line (256 KiB of base64): about a second at 200 KB/s


READ_PIECE = 64 * 1024  # stdin is read in pieces this big, so a long line is heard as it arrives


LOCK_HEARTBEAT_SECONDS = 5.0


HEARD_SECONDS = 12.0  # two missed pings and a margin: past this the lock's heartbeat stops


LOG_TAIL_LINES = 40


class AgentError(Exception):
    """A step failed in a way the controller should report as such."""

    def __init__(self, kind, message, **details):
        Exception.__init__(self, message)
        self.kind = kind
        self.message = message
        self.details = details


def b64e(data):
    return base64.b64encode(data).decode("ascii")


def b64d(text):
    return base64.b64decode(text.encode("ascii"))


class Blob(object):
    """Bytes in an op's answer: ``Session.send`` sends them ahead as bounded blob lines."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data


def payload(s, value):
    """The bytes a request carries: ``{"blob": n}`` (sent ahead in blob lines), ``{"copy_of":
    path, "sha256": ...}`` (a file already on this host, orch's staged copy: not sent again),
    or base64 text (small data from callers that do not use blobs)."""
    if isinstance(value, dict) and "copy_of" in value:
        return copy_of(value["copy_of"], value["sha256"])
    if isinstance(value, dict):
        return s.take_blob(value["blob"])
    return b64d(value)


def copy_of(path, sha256):
    """The content of ``path``, which must be exactly the planned content ``sha256``."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise AgentError("backup", "cannot read %s: %s" % (path, e.strerror or e), path=path)
    got = sha256_bytes(data)
    if got != sha256:
        raise AgentError("backup", "%s holds sha256 %s, planned %s" % (path, got, sha256), path=path)
    return data


def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def expand(path):
    return os.path.abspath(os.path.expanduser(path))


def named(error, path):
    """``error`` saying which file: a failed ``write``/``fsync`` (ENOSPC, EIO, EDQUOT)
    carries no file name, so "No space left on device" alone would not say where."""
    if isinstance(error, OSError) and error.filename is None and error.errno is not None:
        return OSError(error.errno, error.strerror or os.strerror(error.errno), path)
    return error
