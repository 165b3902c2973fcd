"""Stage, validate and commit: new contents beside their targets, checked,
then renamed into place as a compare-and-swap on content.

A staged copy this helper wrote is held open (``Session.staged_fds``): a
name swapped under it is caught before a validator reads it or the commit
renames it."""

import errno
import fcntl
import hashlib
import os
import re
import shutil
import sys
import time

from .files import (
    TMP_MARK,
    PlantedError,
    checked_real,
    create_exclusive,
    fsync_dir,
    live_sha256,
    real_path,
    same_file,
    same_stat,
    set_owner_mode,
    write_fd,
    write_mark,
)
from .processes import run_argv
from .wire import AgentError, expand, named, payload, sha256_bytes

SYNTAX_CHECK = (
    "def syntax_problem(staged, shown):\n"
    "    src = open(staged, 'rb').read()\n"
    "    try:\n"
    "        compile(src, shown, 'exec', dont_inherit=True)\n"
    "    except SyntaxError as e:\n"
    "        lines = src.decode('utf-8', 'replace').splitlines()\n"
    "        n = e.lineno or 0\n"
    "        line = lines[n - 1].strip() if 0 < n <= len(lines) else ''\n"
    "        return '%s:%s: SyntaxError: %s%s' % (shown, e.lineno, e.msg, (' :: ' + line) if line else '')\n"
    "    return None\n"
)
"""``python-syntax``: one source for both ways it runs (``syntax_check``)."""


PYTHON_SYNTAX_CHECK = SYNTAX_CHECK + (
    "import sys\n"
    "problem = syntax_problem(sys.argv[1], sys.argv[2])\n"
    "if problem:\n"
    "    print(problem)\n"
    "    sys.exit(1)\n"
)


def staged_name(path, token):
    """The staged copy of ``path``: a hidden sibling of the real file, same
    extension, named with this run's random ``token`` — so it, and whatever a
    validator derives from its name, is provably orch's own."""
    directory, base = os.path.split(real_path(path))
    stem, ext = os.path.splitext(base)
    return os.path.join(directory, ".%s.orch-staged-%s%s" % (stem, token, ext))


def leftover_patterns(path):
    """The exact names orch gives its temp files and staged copies beside
    ``path``'s real file: only these are ever cleaned up there."""
    directory, base = os.path.split(real_path(path))
    stem, ext = os.path.splitext(base)
    tmp = re.compile(r"^\.%s%s[0-9a-f]+$" % (re.escape(base), re.escape(TMP_MARK)))
    staged = re.compile(r"^\.%s\.orch-staged-[A-Za-z0-9_-]+%s$" % (re.escape(stem), re.escape(ext)))
    return directory, (tmp, staged)


def remove_abandoned(full, dir_fd=None):
    """Remove ``full`` if it is a regular file of this uid's that no live
    helper holds (``create_exclusive``'s flock). A link, another user's
    file, or one in use is never touched; nothing is followed."""
    import stat

    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return False  # a symlink (ELOOP), gone, or unreadable
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_nlink != 1:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # a running helper's (a --check under way)
        if not same_stat(os.stat(full, dir_fd=dir_fd, follow_symlinks=False), st):
            return False
        os.unlink(full, dir_fd=dir_fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def remove_abandoned_dir(full):
    """Remove a temp directory a killed helper left (``private_dir``): only
    one of this uid's, 0700, holding nothing but an abandoned ``new`` file."""
    try:
        pfd = os.open(full, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False  # a link, or not a directory
    try:
        st = os.fstat(pfd)
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            return False
        names = os.listdir(pfd)
        if any(name != "new" for name in names):
            return False
        if names and not remove_abandoned("new", pfd):
            return False
        if not same_stat(os.lstat(full), st):
            return False
        os.rmdir(full)
        return True
    except OSError:
        return False
    finally:
        os.close(pfd)


def remove_leftovers(path):
    """Temp files and staged copies a killed helper, a Ctrl-C or a stale lock
    left beside ``path`` (run by a deploy, which holds the host's lock)."""
    directory, patterns = leftover_patterns(path)
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if any(p.match(name) for p in patterns):
            full = os.path.join(directory, name)
            if remove_abandoned(full) or remove_abandoned_dir(full):
                removed.append(full)
    return removed


def remove_stale_staged(path):
    """Kept for callers of the old name: see ``remove_leftovers``."""
    return remove_leftovers(path)


def create_staged(s, staged, data, mode):
    """The staged copy, created at its (predictable) name exclusively: a file
    or link already there is refused, never followed nor replaced — the
    validator must read the file orch wrote. Owned by this uid until the
    commit gives it the target's owner (so a leftover is recognisably orch's)."""
    try:
        fd = create_exclusive(staged, 0o600)
    except FileExistsError:
        fd = None
    if fd is None:
        raise PlantedError("%s already exists and orch did not make it (a planted file or link?): refused, "
                           "not followed" % staged)
    try:
        write_fd(fd, data)
        os.fchmod(fd, mode & 0o777)
    except BaseException:
        forget_staged(s, staged, fd)
        raise
    return fd


def fd_sha256(fd):
    h = hashlib.sha256()
    os.lseek(fd, 0, 0)
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return h.hexdigest()
        h.update(chunk)


def forget_staged(s, staged, fd=None, remove=True):
    """Close a staged copy's descriptor; remove the name if it is still ours."""
    fd = s.staged_fds.pop(staged, fd)
    if fd is None:
        return
    try:
        if remove and same_file(staged, fd):
            os.unlink(staged)
    except OSError:
        pass
    finally:
        os.close(fd)


def staged_intact(s, staged):
    """The staged name still names the file this helper wrote (not swapped)."""
    fd = s.staged_fds.get(staged)
    return fd is None or same_file(staged, fd)


def op_stage(s, files, token, clean_stale=False):
    """Write each new content to a hidden sibling of its target.

    Same directory as the real file, so the final rename is atomic and a
    validator sees the file where it will live (relative imports, config
    lookups). A deploy (``clean_stale``) first removes the siblings a dead
    run left.
    """
    out = []
    try:
        for f in files:
            out.append(stage_one(s, f, token, clean_stale))
    except BaseException:
        for done in out:  # a failed stage leaves nothing behind
            forget_staged(s, done["staged"])
        raise
    return out


def stage_one(s, f, token, clean_stale):
    """One file staged: a hidden sibling of the real file, read back by sha256."""
    path = expand(f["path"])
    real = real_path(path)
    data = payload(s, f["data"])
    staged = staged_name(path, token)
    if clean_stale:
        remove_leftovers(path)
    try:
        mode = os.stat(real).st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    try:
        fd = create_staged(s, staged, data, mode)
    except PlantedError as e:
        raise AgentError("planted", "cannot stage %s: %s" % (path, e.strerror), path=path)
    except OSError as e:
        raise AgentError("stage", "cannot stage %s: %s" % (path, e.strerror or e), path=path)
    s.staged_fds[staged] = fd
    got = fd_sha256(fd)
    if got != sha256_bytes(data):
        forget_staged(s, staged)
        raise AgentError("stage", "staged copy of %s reads back wrong (sha256 %s)" % (path, got))
    s.staged.add(staged)
    return {"path": path, "real": real, "staged": staged, "sha256": got}


def op_run(s, argv, cwd=None, env=None, timeout=600.0, stdin=None):
    return run_argv(argv, cwd and expand(cwd), env, timeout, bytes(payload(s, stdin)) if stdin else None)


def derived_files(staged):
    """What a validator may have made from the staged copy's exact name
    (e.g. ``__pycache__/.x.orch-staged-1a2b.cpython-311.pyc``). Only these are
    ever removed: anything else in the directory may be somebody's."""
    directory, base = os.path.split(staged)
    stem = os.path.splitext(base)[0]
    out = []
    for sub in (directory, os.path.join(directory, "__pycache__")):
        try:
            names = os.listdir(sub)
        except OSError:
            continue
        for name in names:
            full = os.path.join(sub, name)
            if name.startswith(stem) and full != staged and os.path.isfile(full) and not os.path.islink(full):
                try:
                    if os.lstat(full).st_uid == os.getuid():  # another user's file is theirs
                        out.append(full)
                except OSError:
                    pass
    return out


def op_validate(s, checks, token, keep_staged=True, timeout=600.0):
    """Run each file's validators on its staged copy, then clean up after them.

    The clean-up removes only files derived from the staged copy's exact
    name (its bytecode), and a ``__pycache__`` directory only when it was
    made during this run and is empty again: a colleague's file that
    appears in the directory meanwhile is never touched (``--check`` holds
    no lock).
    """
    results = []
    for check in checks:
        target = expand(check["target"])
        staged = staged_name(target, token)
        directory = os.path.dirname(staged)
        cache = os.path.join(directory, "__pycache__")
        cache_existed = os.path.isdir(cache)
        refuse_if_swapped(s, staged, "before its validators ran")
        for argv in check["argvs"]:
            here = False
            if argv == ["python-syntax"]:
                python = check.get("python") or sys.executable
                argv = [python, "-c", PYTHON_SYNTAX_CHECK, staged, target]
                here = is_this_interpreter(python)
            if here:
                res = syntax_check(staged, target)
            else:
                res = run_argv(argv, cwd=directory, env={"PYTHONDONTWRITEBYTECODE": "1"}, timeout=timeout)
            res["argv"] = argv
            res["target"] = target
            results.append(res)
            if res["rc"] != 0:
                break
        refuse_if_swapped(s, staged, "while its validators ran; their verdict is void")
        for extra in derived_files(staged):
            try:
                os.unlink(extra)
            except OSError:
                pass
        if not cache_existed:
            try:
                os.rmdir(cache)  # only succeeds when empty
            except OSError:
                pass
        if results and results[-1]["rc"] != 0:
            break
    if not keep_staged:
        for check in checks:
            staged = staged_name(check["target"], token)
            if staged in s.staged_fds:
                forget_staged(s, staged)
                continue
            try:
                os.unlink(staged)
            except OSError:
                pass
    return results


def refuse_if_swapped(s, staged, when):
    """A validator must judge the file orch wrote: a staged name that now
    names another file (a link planted by another user) stops the deploy."""
    if not staged_intact(s, staged):
        raise AgentError("planted", "%s was replaced by a file orch did not write %s: refused (another user "
                         "can write in that directory)" % (staged, when), path=staged)


def is_this_interpreter(python):
    """``python`` (a path or a name on PATH) is the binary this helper runs on.

    The same binary compiles a text alike wherever it is started from, so
    the syntax check then runs in this process: no second interpreter start
    per host and deploy (15 ms of the host's CPU, measured on the fleet
    bench). Another binary (the server's own, another version) runs it.
    """
    found = python if os.sep in python else shutil.which(python)
    try:
        return bool(found) and os.path.realpath(found) == os.path.realpath(sys.executable)
    except (OSError, ValueError):
        return False


def syntax_check(staged, shown):
    """``PYTHON_SYNTAX_CHECK`` in this process, with the answer ``run_argv`` would give."""
    scope = {}
    exec(SYNTAX_CHECK, scope)
    try:
        problem = scope["syntax_problem"](staged, shown)
    except Exception as e:  # noqa: BLE001 - the script would die with this and exit 1
        return {"rc": 1, "stdout": "", "stderr": "%s: %s" % (type(e).__name__, e)}
    return {"rc": 1 if problem else 0, "stdout": problem + "\n" if problem else "", "stderr": ""}


def op_remove(s, paths):
    removed = []
    for p in paths:
        if expand(p) in s.staged_fds:  # a staged copy: removed only if the name is still ours
            forget_staged(s, expand(p))
            removed.append(p)
            continue
        try:
            os.unlink(expand(p))
            removed.append(p)
        except FileNotFoundError:
            pass
    return removed


def op_commit(s, files, release_dir=None):
    """Move each staged copy over its target: compare-and-swap on content.

    Every target must still hold exactly the content that was planned
    (``before``): a file edited by hand since, or during validation, is
    never overwritten — the commit refuses and writes nothing. Then
    ``commit.started`` is marked in the release (so a restore knows these
    files may hold orch's content), and each file is renamed into place,
    mode and owner kept, symlinks followed (the link stays a link). The
    whole file is re-read and must have the planned sha256 (``after``).
    On any failure the staged copies not yet moved are removed.
    """
    renamed = []
    try:
        checked = []
        for f in files:
            real = checked_real(f["path"])
            live = live_sha256(real)
            if live != f["before"]:
                raise AgentError(
                    "changed", "%s changed on the host since it was planned (sha256 %s, planned over %s); "
                    "nothing was written" % (f["path"], live, f["before"]), path=f["path"], committed=[])
            checked.append((f, real))
        if release_dir:
            started = os.path.join(expand(release_dir), "commit.started")
            try:
                write_mark(started, "%f\n" % time.time())
            except OSError as e:
                raise named(e, started) from e
        for f, real in checked:
            try:
                fd = staged_fd(s, f["staged"], f["path"])
            except AgentError as e:
                e.details["committed"] = list(renamed)
                raise
            try:
                st = os.stat(real)
                set_owner_mode(fd, st.st_mode & 0o7777, st.st_uid, st.st_gid)
            except FileNotFoundError:
                pass
            try:
                os.replace(f["staged"], real)
            except OSError as e:
                raise AgentError("commit", "cannot commit %s: %s" % (f["path"], e.strerror or e),
                                 committed=list(renamed), path=f["path"])
            renamed.append(f["path"])
            s.staged.discard(f["staged"])
            fsync_dir(os.path.dirname(real))
            if not same_file(real, fd):
                raise AgentError("planted", "%s was swapped for a file orch did not write just before the commit "
                                 "renamed it onto %s: refused; the restore puts the file back" % (
                                     f["staged"], f["path"]), committed=list(renamed), path=f["path"])
            got = fd_sha256(fd)
            forget_staged(s, f["staged"], remove=False)
            if got != f["after"]:
                raise AgentError("commit", "%s reads back with sha256 %s, planned %s" % (f["path"], got, f["after"]),
                                 committed=list(renamed), path=f["path"])
        return renamed
    except (AgentError, OSError) as e:
        for f in files:
            if f["staged"] in s.staged_fds:
                forget_staged(s, f["staged"], remove=f["path"] not in renamed)
            elif f["path"] not in renamed:
                try:
                    os.unlink(f["staged"])
                except OSError:
                    pass
        if isinstance(e, OSError):
            raise AgentError("commit", "cannot commit: %s" % (e.strerror or e), committed=list(renamed))
        raise


def staged_fd(s, staged, path):
    """The descriptor of the staged copy this helper wrote, checked to be still
    at its name; a copy staged by another helper is opened without following
    a link and must be a regular file of this uid's."""
    import stat

    fd = s.staged_fds.get(staged)
    if fd is None:
        try:
            fd = os.open(staged, os.O_RDWR | os.O_NOFOLLOW)
        except OSError as e:
            raise AgentError("planted" if e.errno == errno.ELOOP else "commit",
                             "cannot commit %s: its staged copy %s: %s" % (path, staged, e.strerror or e), path=path)
        s.staged_fds[staged] = fd
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            raise AgentError("planted", "cannot commit %s: %s is not a file orch wrote: refused" % (path, staged),
                             path=path)
    if not same_file(staged, fd):
        raise AgentError("planted", "cannot commit %s: its staged copy %s was replaced by a file orch did not "
                         "write: refused, not followed" % (path, staged), path=path)
    return fd
