"""Nightly builds and the link switch (``orch nightly``).

They touch nothing else: a night builds into a fresh directory beside the
live one, and only ``op_nightly_link_swap`` changes what is live, by one rename.
"""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from .files import fsync_dir, point_link, read_json, write_atomic
from .processes import run_argv
from .wire import LOG_TAIL_LINES, AgentError, expand, sha256_bytes


def nightly_stop_reason(s):
    """Why a build or a probe must stop now (Ctrl-C on the controller, or the
    controller gone), or None: the same two causes ``check_cancel`` raises for."""
    if not s.stop_asked():
        return None
    return "cancelled by the controller" if s.cancel_requested else "the controller went away"


def nightly_git_env():
    """Never prompt for credentials on the host: a night runs unattended."""
    return {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "/bin/true", "LC_ALL": "C"}


def stream_argv(s, argv, cwd=None, env=None, log=None, timeout=3600.0):
    """Run ``argv``, sending each output line as a progress event and to ``log``.

    The build's own output is what a person watches during a night, and what
    they read the next morning in the log; the last lines come back with a
    failure. Cancel (Ctrl-C on the controller) and ``timeout`` end the whole
    process group.
    """
    full_env = dict(os.environ)
    full_env.update(env or {})
    tail = []
    log_file = open(log, "ab") if log else None
    try:
        if log_file is not None:
            log_file.write(("$ %s\n" % " ".join(argv)).encode())
            log_file.flush()
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env=full_env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True)
        except OSError as e:
            raise AgentError("build", "cannot run %s: %s" % (argv[0], e.strerror or e), argv=argv)

        def pump():
            for raw in iter(proc.stdout.readline, b""):
                if log_file is not None:
                    log_file.write(raw)
                    log_file.flush()
                line = raw.decode("utf-8", "replace").rstrip("\r\n").split("\r")[-1]
                tail.append(line)
                del tail[:-LOG_TAIL_LINES]
                s.event("progress", msg=line, stream="build")

        reader = threading.Thread(target=pump)
        reader.daemon = True
        reader.start()
        deadline = time.monotonic() + timeout
        why = None
        while proc.poll() is None:
            why = nightly_stop_reason(s)
            if why is None and time.monotonic() >= deadline:
                why = "timed out after %ss" % timeout
            if why:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.wait()
                break
            time.sleep(0.05)
        reader.join(5.0)
        if why:
            raise AgentError("build", "%s %s" % (" ".join(argv[:3]), why), log_tail=list(tail), argv=argv)
        if proc.returncode != 0:
            raise AgentError("build", "%s exited %d" % (" ".join(argv[:3]), proc.returncode),
                             log_tail=list(tail), argv=argv, rc=proc.returncode)
        return {"rc": 0, "tail": list(tail)}
    finally:
        if log_file is not None:
            log_file.close()


def capture_argv(argv, cwd=None, env=None, timeout=600.0):
    res = run_argv(argv, cwd=cwd, env=env, timeout=timeout)
    if res["rc"] != 0:
        raise AgentError("build", "%s exited %d: %s" % (" ".join(argv[:3]), res["rc"],
                                                      (res["stderr"] or res["stdout"]).strip()[-300:]))
    return res["stdout"]


def build_path(builds_dir, name):
    """A build's directory: a plain name directly inside ``builds_dir``."""
    if not name or "/" in name or name in (".", "..") or name.startswith("."):
        raise AgentError("build", "not a build name: %r" % name)
    return os.path.join(expand(builds_dir), name)


def read_link(link):
    try:
        return os.readlink(link)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise AgentError("switch", "%s exists and is not a symlink" % link)
        raise


def op_nightly_prepare(s, builds_dir, build):
    """Make ``builds_dir`` (and its ``logs/``), say what ``current`` points to.

    The new build's directory must not exist yet: a night never builds over
    anything.
    """
    root = expand(builds_dir)
    for d in (root, os.path.join(root, "logs")):
        if not os.path.isdir(d):
            os.makedirs(d, 0o755)
    dest = build_path(root, build)
    if os.path.lexists(dest):
        raise AgentError("build", "%s already exists" % dest)
    found = op_nightly_builds(s, root)
    return {"builds_dir": root, "build_dir": dest, "current": found["current"], "builds": found["builds"],
            "complete": found["complete"], "seqs": found["seqs"],
            "log": os.path.join(root, "logs", build + ".log"), "python_version": sys.version.split()[0]}


def op_nightly_builds(s, builds_dir):
    """The builds in ``builds_dir`` and where ``current`` points; reads only
    (``orch rollback`` checks that the build it switches back to is still there)."""
    root = expand(builds_dir)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return {"builds_dir": root, "current": None, "builds": []}
    builds = sorted(n for n in names
                    if not n.startswith(".") and n not in ("current", "logs")
                    and os.path.isdir(os.path.join(root, n)) and not os.path.islink(os.path.join(root, n)))
    # complete: a night confirmed it (its manifest is written by the confirm); the others were
    # built half-way, or never passed, and never count toward keep_builds
    complete = [n for n in builds if os.path.isfile(os.path.join(root, n, "manifest.json"))]
    return {"builds_dir": root, "current": read_link(os.path.join(root, "current")), "builds": builds,
            "complete": complete, "seqs": build_seqs(root, builds)}


def build_seqs(root, builds):
    """Each build's ``seq`` from its own manifest (nights made by older versions have none):
    ``keep_builds`` orders by it, not by the names, which are stamped with a clock."""
    seqs = {}
    for name in builds:
        seq = (read_json(os.path.join(root, name, "manifest.json")) or {}).get("seq")
        if isinstance(seq, int) and not isinstance(seq, bool):
            seqs[name] = seq
    return seqs


def op_nightly_fetch_git(s, repo, commit, builds_dir, build, log, timeout=3600.0):
    """Fetch ``repo`` into a mirror cache on the host, check out exactly ``commit``.

    The cache (``builds_dir/.cache/git/<hash of the URL>.git``) makes the
    next night a fetch, not a clone; the build itself is a local clone of the
    cache, checked out detached at the commit, and ``HEAD`` is read back.
    """
    root = expand(builds_dir)
    dest = build_path(root, build)
    env = nightly_git_env()
    cache = os.path.join(root, ".cache", "git", sha256_bytes(repo.encode())[:16] + ".git")
    if not os.path.isdir(cache):
        os.makedirs(os.path.dirname(cache), 0o755) if not os.path.isdir(os.path.dirname(cache)) else None
        partial = cache + ".partial-%d" % os.getpid()
        if os.path.isdir(partial):
            shutil.rmtree(partial)
        stream_argv(s, ["git", "clone", "--mirror", "--quiet", "--", repo, partial], env=env, log=log,
                    timeout=timeout)
        os.rename(partial, cache)
    else:
        stream_argv(s, ["git", "-C", cache, "fetch", "--quiet", "--prune", "origin"], env=env, log=log,
                    timeout=timeout)
    have = run_argv(["git", "-C", cache, "cat-file", "-e", commit + "^{commit}"], env=env)
    if have["rc"] != 0:
        stream_argv(s, ["git", "-C", cache, "fetch", "--quiet", "origin", commit], env=env, log=log,
                    timeout=timeout)
        if run_argv(["git", "-C", cache, "cat-file", "-e", commit + "^{commit}"], env=env)["rc"] != 0:
            raise AgentError("source", "commit %s is not in %s" % (commit, repo))
    stream_argv(s, ["git", "clone", "--quiet", "--no-checkout", "--", cache, dest], env=env, log=log,
                timeout=timeout)
    stream_argv(s, ["git", "-C", dest, "checkout", "--quiet", "--detach", commit], env=env, log=log,
                timeout=timeout)
    head = capture_argv(["git", "-C", dest, "rev-parse", "HEAD"], env=env).strip()
    if head != commit:
        raise AgentError("source", "HEAD of %s is %s after checking out %s" % (dest, head, commit))
    return {"commit": head, "cache": cache}


def op_nightly_pip(s, builds_dir, build, requirements, python, pip_args, log, timeout=3600.0):
    """A fresh venv in the build, then ``pip install --require-hashes``.

    ``requirements`` is the hash-locked file's text; it is written into the
    build (``requirements.lock.txt``) so the build says what it was made of.
    Returns every installed distribution's name and version.
    """
    dest = build_path(builds_dir, build)
    os.makedirs(dest, 0o755)
    req = os.path.join(dest, "requirements.lock.txt")
    write_atomic(req, requirements.encode("utf-8"), 0o644)
    venv = os.path.join(dest, ".venv")
    stream_argv(s, [python, "-m", "venv", venv], log=log, timeout=timeout)
    vpython = os.path.join(venv, "bin", "python")
    stream_argv(s, [vpython, "-m", "pip", "install", "--require-hashes", "--no-input",
                 "--disable-pip-version-check", "-r", req] + list(pip_args), cwd=dest, log=log,
                timeout=timeout)
    listed = capture_argv([vpython, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"])
    return {"packages": json.loads(listed), "venv": venv}


def op_nightly_run(s, argv, cwd, env=None, log=None, timeout=3600.0):
    """One ``install`` command in the build's directory, its output streamed."""
    return stream_argv(s, argv, cwd=expand(cwd), env=env, log=log, timeout=timeout)


def op_nightly_remove_build(s, builds_dir, build):
    """Remove a half-built build (never the one ``current`` points to)."""
    root = expand(builds_dir)
    dest = build_path(root, build)
    if read_link(os.path.join(root, "current")) == build:
        raise AgentError("build", "refusing to remove %s: current points to it" % dest)
    if os.path.isdir(dest) and not os.path.islink(dest):
        shutil.rmtree(dest)
        return True
    return False


def op_nightly_prune(s, builds_dir, remove):
    """Remove old builds and their logs; never the one ``current`` points to."""
    root = expand(builds_dir)
    current = read_link(os.path.join(root, "current"))
    removed = []
    for name in remove:
        dest = build_path(root, name)
        if name == current or not os.path.isdir(dest) or os.path.islink(dest):
            continue
        shutil.rmtree(dest)
        try:
            os.unlink(os.path.join(root, "logs", name + ".log"))
        except OSError:
            pass
        removed.append(name)
    return removed


def op_nightly_link_swap(s, link, to, expect):
    """Point the symlink ``link`` at ``to``, only if it points at ``expect`` now.

    Compare-and-swap: ``expect`` None means "no link yet", ``to`` None
    removes the link. A link already at ``to`` is left alone (so a retried
    undo is harmless). The new link is made beside the old one and renamed
    over it: a reader sees the old build or the new one, never no link.
    """
    link = expand(link)
    now = read_link(link)
    if now == to:
        return {"changed": False, "was": now}
    if now != expect:
        raise AgentError("switch", "%s points to %s, expected %s; not switching" % (link, now, expect))
    if to is None:
        os.unlink(link)
        fsync_dir(os.path.dirname(link))
    else:
        point_link(link, to)
    return {"changed": True, "was": now}
