"""Keeping the helper in the host's state dir, compiled, so the next start
costs no transfer and no compile.

The helper arrives as one archive (``agent_client.helper_archive``) named
by its hash, the helper id. Kept, it is ``<state dir>/helper/<id>/``: the
archive's ``orchestrator/host/*.py`` and their ``__pycache__``, which the
next run's bootstrap puts first on ``sys.path`` (``agent_client.BOOTSTRAP``).
"""

import fcntl
import os
import re
import shutil
import time

from .wire import expand

COPY_NAME = re.compile(r"^[0-9a-f]{16}$")
MEMBER = re.compile(r"^orchestrator/(host/)?[A-Za-z_][A-Za-z0-9_]*\.py$")
STALE_TEMP_SECONDS = 600.0  # a temp dir this old is a killed helper's, not a keep under way


def keep_helper(s):
    """Keep this helper where the next run's bootstrap imports it, older versions' copies
    removed. Tried at start and again when ``state_init`` makes the state dir; only into a
    state dir that the login user owns and nobody else can write. A copy that cannot be
    kept costs the next run a transfer and a compile, nothing else.

    ``s.archive`` and ``s.cache`` (state dir, helper id) are set when the bootstrap
    received the archive; a helper imported from its kept copy has no archive and keeps
    nothing.
    """
    if s.kept or not s.cache or not s.cache[0] or not s.archive:
        return
    state_dir, helper_id = s.cache
    if not COPY_NAME.match(helper_id):
        return
    state = expand(state_dir)
    here = os.path.join(state, "helper")
    try:
        if not owned_private(state):
            return
        s.kept = True
        if not os.path.isdir(here):
            os.mkdir(here, 0o700)
        if not owned_private(here):
            return
        remove_other_copies(here, helper_id)
        if not os.path.isdir(os.path.join(here, helper_id)):
            put_in_place(here, helper_id, s.archive)
    except Exception:  # noqa: BLE001 - best effort: see above
        pass


def remove_other_copies(here, helper_id):
    """Other versions' copies (and a single-file helper's, from before the package) go."""
    for entry in os.listdir(here):
        full = os.path.join(here, entry)
        if entry == helper_id:
            continue
        if COPY_NAME.match(entry):
            remove_if_unused(full)
        elif entry == "__pycache__":
            shutil.rmtree(full, ignore_errors=True)
        elif entry.startswith("orch_helper_"):
            os.unlink(full)
        elif entry.startswith(".") and ".tmp-" in entry:
            try:
                if time.time() - os.lstat(full).st_mtime > STALE_TEMP_SECONDS:
                    shutil.rmtree(full, ignore_errors=True)
            except OSError:
                pass


def remove_if_unused(copy):
    """Remove another version's copy unless a helper runs from it: that helper imports a
    module when its op first runs, and holds a shared flock on its copy (the bootstrap's)."""
    try:
        fd = os.open(copy, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return  # in use
    try:
        shutil.rmtree(copy, ignore_errors=True)
    finally:
        os.close(fd)


def put_in_place(here, helper_id, archive):
    """Unpack ``archive`` into a private temp dir, compile every module, and rename the
    dir to ``<id>``: the bootstrap sees a whole copy or none."""
    import importlib.util
    import io
    import py_compile
    import tempfile
    import zipfile

    temp = tempfile.mkdtemp(prefix=".%s.tmp-" % helper_id, dir=here)  # 0700
    try:
        with zipfile.ZipFile(io.BytesIO(archive)) as z:
            for name in sorted(z.namelist()):
                if not MEMBER.match(name):
                    continue
                path = os.path.join(temp, *name.split("/"))
                if not os.path.isdir(os.path.dirname(path)):
                    os.makedirs(os.path.dirname(path), 0o700)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(z.read(name))
                # Compiled now, where the import machinery looks for it: a host whose
                # environment sets PYTHONDONTWRITEBYTECODE would never write it itself.
                py_compile.compile(path, cfile=importlib.util.cache_from_source(path), doraise=True)
        os.rename(temp, os.path.join(here, helper_id))
    finally:
        if os.path.isdir(temp):
            shutil.rmtree(temp, ignore_errors=True)


def owned_private(path):
    """``path`` belongs to this user and nobody else can write it (what the bootstrap checks)."""
    st = os.stat(path)
    return st.st_uid == os.getuid() and not st.st_mode & 0o022
