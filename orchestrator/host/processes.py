"""Server processes: find them (pidfile, listening port), record them, stop
and start them; and running a command (``run_argv``)."""

import errno
import os
import shutil
import signal
import subprocess
import time

from .files import write_atomic
from .sockets import listening_inodes
from .wire import AgentError, expand


def stat_fields(stat):
    """The fields of a ``/proc/<pid>/stat`` line after the command's name (which may hold
    spaces and parentheses): the state is ``[0]``, the start time ``[19]``."""
    return stat.rsplit(b")", 1)[1].split()


def ended(stat):
    """Whether a ``/proc/<pid>/stat`` line is a process that has ended (a zombie)."""
    try:
        return stat_fields(stat)[0] in (b"Z", b"X")
    except IndexError:
        return True


def proc_starttime(pid):
    """When the process started, in clock ticks since boot: with the pid it
    names one process, even after the pid has been reused."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return int(stat_fields(f.read())[19])
    except (OSError, IndexError, ValueError, TypeError):
        return None


def proc_start_epoch(pid):
    """The process's start as a Unix time (to within a clock tick), or None."""
    ticks = proc_starttime(pid)
    if ticks is None:
        return None
    try:
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - uptime + ticks / float(os.sysconf("SC_CLK_TCK"))


def same_process(pid, starttime):
    """``pid`` is alive and is the process that was recorded (not a reused pid)."""
    if not pid or not pid_alive(pid):
        return False
    return starttime is None or proc_starttime(pid) == starttime


def pid_alive(pid):
    if not pid or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            state = stat_fields(f.read())[0]
        if state in (b"Z", b"X"):
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            return False
    except (OSError, IndexError):
        pass
    return True


class ProcessWatch:
    """Whether one recorded process (pid and start time) lives, asked often: its
    ``/proc/<pid>/stat`` opened once, when the start time there is the recorded one,
    then read again at each call. The open file stays the file of that one process:
    once it has ended a read fails (ESRCH), even when its pid has been given to another.
    ``alive`` is None while it cannot be opened (the caller asks another way)."""

    def __init__(self):
        self.fd = None

    def alive(self, pid, starttime):
        """True or False; None while the process cannot be opened. ``pid`` and
        ``starttime`` are read only until it is (once open, the file names it)."""
        if self.fd is None:
            self.fd = self._open(pid, starttime)
            if self.fd is None:
                return None
        try:
            return not ended(os.pread(self.fd, 1024, 0))
        except OSError:
            return False

    @staticmethod
    def _open(pid, starttime):
        if not isinstance(pid, int) or not isinstance(starttime, int) or pid <= 0:
            return None
        try:
            fd = os.open("/proc/%d/stat" % pid, os.O_RDONLY)
        except OSError:
            return None
        try:
            if int(stat_fields(os.pread(fd, 1024, 0))[19]) == starttime:
                return fd  # that process, whatever its state: ``alive`` reads it
        except (OSError, IndexError, ValueError):
            pass
        os.close(fd)
        return None

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def run_argv(argv, cwd=None, env=None, timeout=600.0, stdin=None, limit=64 * 1024):
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    try:
        proc = subprocess.run(argv, cwd=cwd, env=full_env, input=stdin, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout)
    except FileNotFoundError:
        return {"rc": 127, "stdout": "", "stderr": "command not found: %s" % argv[0]}
    except subprocess.TimeoutExpired:
        return {"rc": 124, "stdout": "", "stderr": "timed out after %ss" % timeout}
    return {"rc": proc.returncode,
            "stdout": proc.stdout[-limit:].decode("utf-8", "replace"),
            "stderr": proc.stderr[-limit:].decode("utf-8", "replace")}


def pid_listening_on(port):
    inodes = listening_inodes(port)
    if not inodes:
        return None
    targets = set("socket:[%s]" % i for i in inodes)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fd_dir = "/proc/%s/fd" % name
        try:
            for fd in os.listdir(fd_dir):
                try:
                    if os.readlink(os.path.join(fd_dir, fd)) in targets:
                        return int(name)
                except OSError:
                    continue
        except OSError:
            continue
    return None


def port_busy(port):
    return bool(listening_inodes(port))


def process_record(pid):
    """argv, cwd and environment of a running process: what rollback restarts."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = [a.decode("utf-8", "surrogateescape") for a in f.read().split(b"\0")[:-1]]
        if not argv:  # a kernel thread, or a process in mid-exec: nothing a rollback could start again
            raise AgentError("server", "process %d has no command line (a kernel thread, or one in mid-exec): "
                                       "orch records no server it could not start again" % pid)
        cwd = os.readlink("/proc/%d/cwd" % pid)
        with open("/proc/%d/environ" % pid, "rb") as f:
            env = {}
            for item in f.read().split(b"\0"):
                if b"=" in item:
                    k, v = item.split(b"=", 1)
                    env[k.decode("utf-8", "surrogateescape")] = v.decode("utf-8", "surrogateescape")
    except OSError as e:
        raise AgentError("server", "cannot read process %d: %s" % (pid, e))
    # started_at: the start on the host's wall clock, to tell whether a release's files came after it
    return {"pid": pid, "pgid": os.getpgid(pid), "sid": os.getsid(pid), "argv": argv, "cwd": cwd, "env": env,
            "starttime": proc_starttime(pid), "started_at": proc_start_epoch(pid)}


def read_pidfile(pidfile):
    if not pidfile:
        return None
    try:
        with open(expand(pidfile)) as f:
            pid = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) and not kernel_thread(pid) else None


def kernel_thread(pid):
    """Whether ``pid`` is a kernel thread (no command line, parent kthreadd): a stale pidfile's
    pid taken by one names no server, so the server is looked for by its port."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            ppid = int(stat_fields(f.read())[1])
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return ppid in (0, 2) and not f.read()
    except (OSError, IndexError, ValueError):
        return False


def op_server_find(s, pidfile=None, port=None):
    """The running server, by its pidfile or by the process listening on the port."""
    pid = read_pidfile(pidfile)
    how = "pidfile"
    if pid is None and port:
        pid, how = pid_listening_on(port), "port"
    if pid is None:
        return None
    rec = process_record(pid)
    rec["found_by"] = how
    return rec


def op_process(s, pid):
    """The record of a pid a ``commands`` manager's ``pid`` command printed."""
    if not pid_alive(pid):
        return None
    rec = process_record(pid)
    rec["found_by"] = "pid command"
    return rec


def process_table():
    """``{pid: (ppid, pgrp)}`` of every live process, from one pass over ``/proc``: a
    stop needs both the server's process group and its descendants, and a GPU box
    runs thousands of processes, so each ``stat`` is read once for both."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                fields = stat_fields(f.read())
            if fields[0] not in (b"Z", b"X"):
                table[int(name)] = (int(fields[1]), int(fields[2]))
        except (OSError, IndexError, ValueError):
            continue
    return table


def descendants(pid, table):
    """Every live process below ``pid`` in ``table``: a server's workers (SGLang's
    scheduler and detokenizer) must go with it, or they keep the GPUs."""
    children = {}
    for child, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(child)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.append(child)
                todo.append(child)
    return out


def group_members(pgid, table):
    """The live processes of process group ``pgid`` in ``table``."""
    return [pid for pid, (_, pgrp) in table.items() if pgrp == pgid]


def gpu_pids():
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    res = run_argv([exe, "--query-compute-apps=pid", "--format=csv,noheader"], timeout=30)
    if res["rc"] != 0:
        return None
    return set(int(x) for x in res["stdout"].split() if x.strip().isdigit())


def op_server_stop(s, pid, pgid=None, stop_timeout=30.0, port=None, free_timeout=120.0):
    """SIGTERM the whole process group, SIGKILL after ``stop_timeout``.

    Then wait for the port to be free and, where nvidia-smi exists, for the
    old processes to leave the GPUs: starting a new server while the old one
    still holds GPU memory is a guaranteed out-of-memory at load.
    """
    own = os.getpgid(0)
    use_group = pgid is not None and pgid not in (own, 0, 1) and pgid == pid
    table = process_table()
    targets = group_members(pgid, table) if use_group else [pid]
    if pid not in targets and pid_alive(pid):
        targets.append(pid)
    for child in descendants(pid, table):
        if child not in targets:
            targets.append(child)

    def signal_all(sig):
        if use_group:
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
        for p in targets:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass

    signal_all(signal.SIGTERM)
    s.event("progress", msg="SIGTERM sent to %s" % ("group %d" % pgid if use_group else "pid %d" % pid))
    killed = False
    deadline = time.monotonic() + stop_timeout
    # Polls start at 10 ms and back off to 100 ms: a server that leaves at
    # once costs the restart no 100 ms sleep, one that takes a minute no CPU.
    pause = 0.01
    while any(pid_alive(p) for p in targets):
        reap_children(s)
        if time.monotonic() >= deadline:
            if killed:
                break
            signal_all(signal.SIGKILL)
            s.event("progress", msg="still running after %ss: SIGKILL" % stop_timeout)
            killed = True
            deadline = time.monotonic() + 10.0
        time.sleep(pause)
        pause = min(0.1, pause * 2)
    reap_children(s)
    left = [p for p in targets if pid_alive(p)]
    if left:
        raise AgentError("server", "server processes %s did not exit" % left)
    deadline = time.monotonic() + free_timeout
    pause = 0.01
    while port and port_busy(port):
        if time.monotonic() >= deadline:
            raise AgentError("server", "port %d still in use %ss after the server stopped" % (port, free_timeout))
        time.sleep(pause)
        pause = min(0.1, pause * 2)
    while True:
        on_gpu = gpu_pids()
        if not on_gpu or not (on_gpu & set(targets)):
            break
        if time.monotonic() >= deadline:
            raise AgentError("server", "old server processes still hold GPUs: %s" % sorted(on_gpu & set(targets)))
        time.sleep(0.5)
    return {"stopped": targets, "killed": killed}


def reap_children(s):
    for pid, proc in list(s.children.items()):
        if proc.poll() is not None:
            pass


def op_server_start(s, argv, cwd=None, env=None, log=None, pidfile=None, replace_env=False):
    """Start the server detached: own session, output to its log, a pidfile.

    ``replace_env``: the environment is exactly ``env`` (a recorded one, so
    rollback restarts exactly what ran), else the agent's plus ``env``.
    """
    full_env = dict(env or {}) if replace_env else dict(os.environ, **(env or {}))
    cwd = expand(cwd) if cwd else None
    log_path = expand(log) if log else os.devnull
    if log:
        d = os.path.dirname(log_path)
        if not os.path.isdir(d):
            os.makedirs(d, 0o755)
        if os.path.exists(log_path):
            os.replace(log_path, log_path + ".1")
    try:
        # not through a link: one sitting here now was put there after the rotation (another user's);
        # 0600: a server logs its own secrets (SGLang prints its ServerArgs, api_key included)
        out = os.fdopen(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600), "ab")
    except OSError as e:
        raise AgentError("planted" if e.errno == errno.ELOOP else "server", "cannot open the server's log %s: %s" % (
            log_path, "a link sits there: refused, not followed" if e.errno == errno.ELOOP else e.strerror or e))
    missing = not_startable(argv[0], cwd, full_env)
    if missing:
        out.close()
        raise AgentError("server", "cannot start %s: %s" % (argv[0], missing))
    try:
        proc, go = spawn_held(argv, cwd, full_env, out)
    except OSError as e:
        raise AgentError("server", "cannot start %s: %s" % (argv[0], e.strerror or e))
    finally:
        out.close()
    try:
        s.children[proc.pid] = proc
        s.last_started = {"pid": proc.pid, "log": log_path}
        if pidfile:
            # Best effort: the server runs either way, and is found by its port
            # when its pidfile cannot be written (a full disk must not turn a
            # started server into a failed restore).
            p = expand(pidfile)
            try:
                d = os.path.dirname(p)
                if not os.path.isdir(d):
                    os.makedirs(d, 0o755)
                write_atomic(p, ("%d\n" % proc.pid).encode(), 0o644, durable=False)  # a live process's pid
            except OSError as e:
                s.event("progress", msg="could not write the pidfile %s: %s" % (p, e.strerror or e))
        os.write(go, b"go\n")  # only now does the server's own program run
    finally:
        os.close(go)
    s.event("progress", msg="started pid %d, log %s" % (proc.pid, log_path))
    return {"pid": proc.pid, "pgid": proc.pid, "argv": argv, "cwd": cwd, "log": log_path}


HELD_START = 'IFS= read -r go || exit 125; exec "$@" </dev/null'
"""The shell a server is started through: it waits for "go" on its stdin (a pipe), then
becomes the server (``exec``: same pid, the server's own argv, stdin from /dev/null). The
one who started it writes "go" only once the pidfile names that pid; if it dies first (a
runner killed right after the fork) the pipe ends, the shell exits 125, and no server runs
that nobody can find."""


def spawn_held(argv, cwd, env, out):
    """The server's process, held before its program runs, and the pipe end that lets it go."""
    r, w = os.pipe()
    try:
        proc = subprocess.Popen(["/bin/sh", "-c", HELD_START, "orch-start"] + list(argv), cwd=cwd, env=env,
                                stdin=r, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    except BaseException:
        os.close(w)
        raise
    finally:
        os.close(r)
    return proc, w


def not_startable(program, cwd, env):
    """Why ``program`` cannot be run (as ``execvp`` would look it up), or None: said at once,
    as a failed start, rather than as the shell's exit 127 in the server's log."""
    if os.sep in program:
        path = program if os.path.isabs(program) else os.path.join(cwd or os.getcwd(), program)
        if not os.path.exists(path):
            return os.strerror(errno.ENOENT)
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            return os.strerror(errno.EACCES)
        return None
    if shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        return os.strerror(errno.ENOENT)
    return None


def run_server_cmd(argv, timeout=600.0):
    """A user's server command (``commands`` manager) that must succeed."""
    res = run_argv(argv, timeout=timeout)
    if res["rc"] != 0:
        raise AgentError("server", "%s exited %d: %s" % (
            " ".join(argv), res["rc"], (res["stderr"] or res["stdout"]).strip()[-300:]))
    return res


def op_run_ok(s, argv, timeout=600.0):
    """A user's server command (``commands`` manager) that must succeed."""
    return run_server_cmd(argv, timeout)


def op_commands_start(s, start, pid_cmd=None, timeout=600.0):
    """The ``commands`` manager's start, then its ``pid`` command, so the
    health wait can watch that process (``health_wait(pid="started")``)."""
    run_server_cmd(start, timeout)
    s.last_started = {}
    if pid_cmd:
        got = run_argv(pid_cmd, timeout=60.0)
        words = got["stdout"].split()
        if got["rc"] == 0 and words and words[0].isdigit():
            s.last_started = {"pid": int(words[0]), "log": None}
            s.event("progress", msg="started pid %s" % words[0])
    return dict(s.last_started)


def exit_code_of(s, pid):
    """The exit code if ``pid`` has ended, else None."""
    proc = s.children.get(pid)
    if proc is not None:
        return proc.poll()
    return None if pid_alive(pid) else "unknown"
