"""Reading and writing files on the host without following what another user planted.

``write_atomic`` writes through a private directory of ours beside the
target; a name taken by somebody else is refused, never followed, and each
refusal is noted in the caller's ``planted`` list (a restore reports them
per file).
"""

import base64
import errno
import fcntl
import json
import os

from .wire import LOG_TAIL_LINES, AgentError, Blob, expand, named, sha256_bytes, sha256_file

TMP_MARK = ".orch-tmp-"
"""Temp directories are ``.<name>.orch-tmp-<16 random hex>`` (``private_dir``):
unpredictable, and recognisable, so the next run can remove what a killed
helper left (``remove_leftovers``; older helpers made flat temp files named
``.<name>.orch-tmp-<pid>``, removed the same way)."""


WRITE_ATTEMPTS = 8


class PlantedError(OSError):
    """A name orch writes was taken by a file or link orch did not make: refused, never followed."""

    def __init__(self, message):
        OSError.__init__(self, errno.EEXIST, message)


def note_planted(planted, message):
    """Say that a name orch writes was taken by somebody else, in ``planted`` (a list) when the caller keeps one."""
    if planted is not None:
        planted.append(message)


def tmp_name(directory, base):
    return os.path.join(directory, ".%s%s%s" % (base, TMP_MARK, base64.b16encode(os.urandom(8)).decode().lower()))


def same_file(path, fd):
    """``path`` (not followed) names the file open as ``fd``: nobody swapped the name."""
    try:
        there, mine = os.lstat(path), os.fstat(fd)
    except OSError:
        return False
    return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)


def create_exclusive(path, mode=0o600):
    """A new file at ``path``, opened read-write and flocked, or None.

    ``O_EXCL|O_NOFOLLOW``: whatever already sits at the name (a link another
    user planted, in a directory they can write) is never followed nor
    truncated (``FileExistsError``). The flock marks the file as live: the
    next run's clean-up (``remove_abandoned``) removes only files nobody
    holds. None: the clean-up took the name between the create and the
    flock (try another name).
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        pass
    if same_file(path, fd):
        return fd
    os.close(fd)
    return None


def write_fd(fd, data, durable=True):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    if durable:
        os.fsync(fd)


def set_owner_mode(fd, mode=None, uid=None, gid=None):
    """Owner, then mode, on the open file (never a name that could be swapped
    for a link); owner first, as a chown clears set-id bits."""
    if uid is not None and gid is not None:
        try:
            os.fchown(fd, uid, gid)
        except PermissionError:
            pass
    if mode is not None:
        os.fchmod(fd, mode)


def private_dir(dfd, base, planted=None):
    """``(name, fd)`` of a new directory of our own (0700) beside the target,
    in the directory open as ``dfd``: nobody else can put anything inside
    it, so a file renamed out of it through ``fd`` is the file orch wrote,
    whatever happens to the names around it. A name taken already
    (planted) is refused and another one drawn."""
    for _ in range(WRITE_ATTEMPTS):
        name = os.path.basename(tmp_name(".", base))
        try:
            os.mkdir(name, 0o700, dir_fd=dfd)
        except FileExistsError:
            note_planted(planted, "%s existed before orch made it: refused, not followed" % name)
            continue
        try:
            pfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
        except OSError:
            note_planted(planted, "%s was swapped right after orch made it: refused, not followed" % name)
            continue
        st = os.fstat(pfd)
        if st.st_uid == os.getuid() and not st.st_mode & 0o077:
            return name, pfd
        os.close(pfd)
        note_planted(planted, "%s was swapped right after orch made it: refused, not followed" % name)
    raise PlantedError("another user keeps taking orch's temp names beside %s" % base)


def drop_private_dir(dfd, name, pfd, planted=None):
    """Remove our (now empty) private directory, if the name is still ours."""
    try:
        if same_stat(os.stat(name, dir_fd=dfd, follow_symlinks=False), os.fstat(pfd)):
            os.rmdir(name, dir_fd=dfd)
        else:
            note_planted(planted, "%s was renamed or replaced by another user while orch wrote: not followed, "
                         "orch's file was written through its own directory" % name)
    except OSError:
        pass
    finally:
        os.close(pfd)


def open_dir(directory):
    """A descriptor of ``directory`` to create and rename relative to; a
    directory this user may write but not list (no read bit) is opened as
    O_PATH (it then just is not fsynced)."""
    try:
        return os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except PermissionError:
        return os.open(directory, getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY)


def same_stat(a, b):
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def write_atomic(path, data, mode=None, uid=None, gid=None, planted=None, durable=True):
    """Write ``data`` to ``path`` by a rename from a sibling, fsynced (unless not ``durable``:
    see ``write_json``).

    A reader (or the server starting) sees the old file or the new one,
    never half of one; mode and owner are set before the rename.

    The directory may be one another user can write (a shared source tree):
    the new file is made inside a private directory of ours beside the
    target (``.<name>.orch-tmp-<random>``, 0700, see ``private_dir``),
    ``O_EXCL|O_NOFOLLOW``, owner and mode set through its descriptor, and
    renamed onto ``path`` relative to directory descriptors — so no name
    another user can swap is ever followed, written through or renamed.
    What was refused on the way is added to ``planted`` (a list), if given.
    In a directory only this user may write (``only_mine``: orch's state dir)
    and with no owner to give, the temp file is made beside the target instead.
    """
    directory = os.path.dirname(path) or "."
    base = os.path.basename(path)
    dfd = open_dir(directory)
    try:
        if uid is None and only_mine(dfd):
            return write_beside(dfd, path, data, mode, durable)
        for _ in range(WRITE_ATTEMPTS):
            name, pfd = private_dir(dfd, base, planted)
            try:
                try:
                    fd = os.open("new", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=pfd)
                except FileNotFoundError:
                    continue  # a clean-up took our empty directory: draw again
                if not write_and_rename(fd, pfd, "new", dfd, base, data, mode, uid, gid, durable):
                    continue
            finally:
                drop_private_dir(dfd, name, pfd, planted)
            if durable:
                fsync_quietly(dfd)
            return
        raise PlantedError("cannot write %s: its temp files keep disappearing" % path)
    except PlantedError:
        raise
    except OSError as e:
        raise named(e, path) from e  # ENOSPC and the like say which file
    finally:
        os.close(dfd)


def write_and_rename(fd, src_dfd, name, dfd, base, data, mode, uid, gid, durable):
    """The temp file just created exclusively as ``name`` in ``src_dfd`` (open as ``fd``,
    closed here): flocked (live: a clean-up leaves it alone), written, given its owner and
    mode, renamed onto ``base`` in ``dfd``; removed if any of that fails. False when a
    clean-up took it between its create and the flock (draw another name)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_nlink == 0:
            return False
        write_fd(fd, data, durable)
        set_owner_mode(fd, mode, uid, gid)
        os.replace(name, base, src_dir_fd=src_dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            os.unlink(name, dir_fd=src_dfd)
        except OSError:
            pass
        raise
    finally:
        os.close(fd)
    return True


def only_mine(dfd):
    """Nobody but this user (and root) can add, rename or remove a name in the directory
    open as ``dfd``: it is ours, and neither its group nor others may write it (an ACL
    that lets another user write shows in the group bits). Then a temp file beside the
    target is as safe as one in a private directory, and costs no ``mkdir`` and ``rmdir``
    (orch's own records, about twenty a deploy, are all written in such directories)."""
    try:
        st = os.fstat(dfd)
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def write_beside(dfd, path, data, mode, durable):
    """``write_atomic`` in a directory ``only_mine``: ``.<name>.orch-tmp-<random>``
    created exclusively beside the target, then ``write_and_rename``. A killed writer's
    temp file is what ``staging.remove_leftovers`` removes."""
    base = os.path.basename(path)
    for _ in range(WRITE_ATTEMPTS):
        name = os.path.basename(tmp_name(".", base))
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
        except FileExistsError:
            continue
        if not write_and_rename(fd, dfd, name, dfd, base, data, mode, None, None, durable):
            continue
        if durable:
            fsync_quietly(dfd)
        return
    raise PlantedError("cannot write %s: its temp files keep disappearing" % path)


def fsync_quietly(fd):
    """Flush a directory's entries to disk where the filesystem allows: a rename is
    already done and visible; a filesystem that cannot fsync a directory changes nothing."""
    try:
        os.fsync(fd)
    except OSError:
        pass


def fsync_dir(directory):
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        fsync_quietly(fd)
    finally:
        os.close(fd)


def write_json(path, value, durable=True):
    """A record, whole or not at all. ``durable=False`` for a record of live processes
    (their pids and start times): after a crash of the host it names nothing, so it need
    not wait for the disk (two fsyncs, about half a millisecond of the host's CPU each
    time, at every deploy)."""
    write_atomic(path, record_text(value).encode(), 0o600, durable=durable)


def record_text(value):
    """A record as its file holds it: a dict one key to a line, sorted, each value on its
    line in compact JSON. ``json.dumps`` with an ``indent`` runs its pure-Python encoder
    (0.14 ms for a release's manifest, 0.28 for its program, here); without one, its C
    encoder (0.04 and 0.05), and a deploy writes about twenty records."""
    if isinstance(value, dict) and value:
        items = ["%s: %s" % (_encode(key), _encode(value[key])) for key in sorted(value)]
        return "{\n " + ",\n ".join(items) + "\n}\n"
    return _encode(value) + "\n"


_encode = json.JSONEncoder(sort_keys=True).encode  # one encoder: ``json.dumps`` with an option makes one a call


def try_write_json(path, value):
    """``write_json`` for records that must not stop a restore (a full disk):
    returns the error as text, or None when written."""
    try:
        write_json(path, value)
        return None
    except OSError as e:
        return "cannot write %s: %s" % (path, e.strerror or e)


def real_path(path):
    """The file ``path`` names, symlinks followed: orch writes the real file
    and leaves a link pointing at it as it was."""
    return os.path.realpath(expand(path))


def read_json(path, default=None):
    try:
        return json.loads(read_nofollow(path).decode())
    except FileNotFoundError:
        return default


def read_record(path):
    """A small record the restore machine polls or re-reads: absent or
    unreadable (a half-written file on a full disk) both read as None."""
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def tail_lines(path, count=LOG_TAIL_LINES):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[-count:]


def file_info(path, with_data=True):
    """A file as the controller plans with it; a symlink is read through
    (``real`` names the file that is actually written)."""
    path = expand(path)
    real = checked_real(path)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return {"path": path, "real": real, "exists": False}
    with open(real, "rb") as f:
        data = f.read()
    info = {"path": path, "real": real, "exists": True, "mode": st.st_mode & 0o7777, "uid": st.st_uid,
            "gid": st.st_gid, "sha256": sha256_bytes(data), "size": len(data)}
    if with_data:
        info["data"] = Blob(data)
    return info


def op_read(s, paths, with_data=True):
    return [file_info(p, with_data) for p in paths]


def op_sha256(s, paths):
    out = {}
    for p in paths:
        try:
            out[p] = sha256_file(real_path(p))
        except FileNotFoundError:
            out[p] = None
    return out


def live_sha256(path):
    try:
        return sha256_file(path)
    except FileNotFoundError:
        return None


def write_mark(path, text=""):
    """A small marker file in the release, created or truncated without following a link."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def op_get_json(s, path, default=None):
    return read_json(expand(path), default)


def op_put_json(s, path, value, best_effort=None):
    """True once written. ``best_effort``: a record nothing depends on (that a verdict was
    reported): a full disk gives False instead of failing the batch it ends, whose answers
    (the verdict itself) the controller needs."""
    if best_effort:
        return try_write_json(expand(path), value) is None
    write_json(expand(path), value)
    return True


def op_log_tail(s, path, lines=LOG_TAIL_LINES):
    return tail_lines(expand(path), lines)


def followable(path):
    """``(real file, None)``, or ``(None, why)`` when ``path`` is a symlink that
    another user made to somebody else's file (``fs.protected_symlinks``'s
    rule, on any directory): orch, running as root, must not write through it."""
    try:
        link = os.lstat(path)
    except OSError:
        return os.path.realpath(path), None
    real = os.path.realpath(path)
    if not os.path.islink(path) or link.st_uid == os.getuid():
        return real, None
    try:
        owner = os.stat(real).st_uid
    except OSError:
        owner = None
    if owner is not None and owner != link.st_uid:
        return None, ("%s is a link made by uid %d to %s, a file of uid %d's: refused, not followed" % (
            path, link.st_uid, real, owner))
    return real, None


def checked_real(path):
    """The file ``path`` names, for orch to read and write: a link another
    user planted at it (``followable``) stops the step instead."""
    real, refused = followable(expand(path))
    if refused:
        raise AgentError("planted", refused, path=path)
    return real


def read_nofollow(path):
    """A file orch wrote (a backup, a restored target), read without following a link put in its place."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def point_link(path, target, planted=None):
    """Make the symlink ``path`` point at ``target``, atomically (rename over).

    Made in a private directory of ours (``private_dir``) and renamed from
    there: a link planted at any name orch might use is never replaced nor
    followed."""
    directory = os.path.dirname(path) or "."
    dfd = open_dir(directory)
    try:
        name, pfd = private_dir(dfd, os.path.basename(path), planted)
        try:
            os.symlink(target, "new", dir_fd=pfd)
            os.replace("new", os.path.basename(path), src_dir_fd=pfd, dst_dir_fd=dfd)
        finally:
            drop_private_dir(dfd, name, pfd, planted)
        fsync_quietly(dfd)
    finally:
        os.close(dfd)


def op_mark(s, path):
    """An empty marker file (``server.touched``): creating one needs no data blocks."""
    write_mark(expand(path))
    return True
