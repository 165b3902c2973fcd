"""After the commit the host carries the release to its verdict by itself: the runner and its guard.

Three processes, each with one job:

- The **guard** is forked off the helper when the release is armed
  (``backstop.op_release_arm``) and holds the read end of a pipe whose
  write end the helper keeps. The commit's batch ends with
  ``op_release_run``, which writes "run" into it: the guard then forks the
  **runner** and waits on it. Without that word (the controller died
  before its commit, or a night fed by its controller) the guard is the
  watchdog it always was: it restores when the backstop's deadline passes.
- The **runner** owns the host's lock from the commit on (its pid, its
  heartbeat, ``controller_id: runner@<host>``: no controller takes a lock
  whose holder lives), runs the release's program (``executor``) from the
  read-back to the confirm, and ends in one verdict: confirmed, restored
  (``op_restore_release`` with ``by: runner``) or restore failed. Its steps
  and their answers go to the release's event log, masked, never to a
  controller: whether one is listening changes nothing.
- The guard restores at once if the runner dies before its verdict (``kill
  -9``, the OOM killer), and at the backstop's deadline (host monotonic
  clock) it kills the runner's process group and restores. Its restore
  says ``by: guard``.

A controller follows the log (``op_release_follow``) and prints it; a
Ctrl-C there becomes an abort of the runner (SIGTERM: it stops its step and
restores), never a second restore from the controller.

Standard library only, Python 3.8 syntax: this module is shipped to the host.
"""

import json
import os
import select
import signal
import socket
import sys
import threading
import time

from . import eventlog
from .executor import op_release_steps, program_of
from .files import read_json, read_record, write_json
from .processes import ProcessWatch, proc_starttime, same_process
from .protocol_verdict import AnswersEvent, RestoringEvent, StepFailure, VerdictEvent
from .session import Session, drain, wake_pipe
from .state import release_own_lock
from .wire import AgentError, expand

RUNNER_FILE = "runner.json"  # the runner's and the guard's pids and start times, for status and the follower
VERDICT = VerdictEvent.KIND  # the event that ends a release's log
FOLLOW_POLL_SECONDS = 0.1  # without a doorbell (``eventlog.Doorbell``)
FOLLOW_IDLE_SECONDS = 1.0  # with one: how often a follower looks whether the runner still lives
GUARD_GRACE_SECONDS = 0.6  # how long a follower gives the guard to write the verdict of a runner that died
RUNNER_START_SECONDS = 30.0  # the commit's batch waits this long for the runner to hold the lock


class RunnerSession(Session):
    """The runner's session: no controller to hear or lose, and every event it would send
    goes to the release's log instead (masked), where a follower finds it."""

    def __init__(self, release_dir, mask):
        Session.__init__(self, open(os.devnull, "wb"))
        self.release_dir = release_dir
        self.mask = [str(m) for m in mask or [] if m]

    def silent(self):
        return False  # nobody pings a runner: silence is not a reason to stop

    def hears_controller(self):
        return True  # the lock's heartbeat runs as long as the runner does

    def event(self, kind, **fields):
        if kind in ("tick", "step"):
            return  # steps: the executor logs them itself (``record_event``)
        fields["event"] = kind
        eventlog.append(self.release_dir, fields, self.mask)

    def answered(self, step, answers, judged=None):
        eventlog.append(self.release_dir, AnswersEvent(step, answers, judged).to_wire(), self.mask)


def verdict_of(release_dir):
    """The release's verdict, once its log has one (None before)."""
    for wire in reversed(eventlog.lines(release_dir)):
        if wire.get("event") == VERDICT:
            return wire
    return None


# ---------------------------------------------------------------- the commit's side


def op_release_run(s, release_dir, state_dir):
    """Hand the committed release to its runner: the guard forks it, the runner takes the
    lock; from then on this helper holds nothing (it never gives back a lock it handed on)."""
    release_dir = expand(release_dir)
    go = s.guards.pop(release_dir, None)
    if go is None:
        raise AgentError("runner", "release %s was not armed by this helper" % os.path.basename(release_dir))
    try:
        os.write(go, b"run\n")
    finally:
        os.close(go)
    lock_path = os.path.join(expand(state_dir), "lock.json")
    waited_until = time.monotonic() + RUNNER_START_SECONDS
    while True:
        runner = read_record(os.path.join(release_dir, RUNNER_FILE)) or {}
        pid = runner.get("pid")
        held = (read_record(lock_path) or {}).get("agent_pid")
        if pid and (held == pid or verdict_of(release_dir) is not None):
            break
        if time.monotonic() > waited_until:
            raise AgentError("runner", "the runner of release %s did not start within %g s"
                             % (os.path.basename(release_dir), RUNNER_START_SECONDS))
        time.sleep(0.02)
    if s.lock is not None:
        try:
            os.close(s.lock[1])  # the file this fd names was replaced by the runner's: nothing to remove
        except OSError:
            pass
        s.lock = None
    return {"pid": pid, "guard": runner.get("guard")}


def op_release_follow(s, release_dir, after=0, abort_on_cancel=True):
    """The release's log from line ``after`` on, as events, until its verdict (the answer).

    A ``cancel`` (Ctrl-C on the controller) asks the runner to abort, and the
    log is followed on to the verdict of that. The controller going away ends
    this call and nothing else: the runner does not hear of it.
    """
    release_dir = expand(release_dir)
    if not os.path.exists(os.path.join(release_dir, RUNNER_FILE)) and verdict_of(release_dir) is None:
        raise AgentError("norunner", "release %s has no runner" % os.path.basename(release_dir))
    seen = 0
    skip = int(after or 0)  # lines the follower has had already
    aborted = False
    # the doorbell before the first read: a line appended after that read rings it
    bell = eventlog.Doorbell(release_dir)
    log, runner = eventlog.Reader(release_dir), RunnerWatch(release_dir)
    try:
        while True:
            for wire in log.new_lines():
                seen += 1
                if seen <= skip:
                    continue
                if wire.get("event") == VERDICT:
                    return {"verdict": wire, "lines": seen}
                kind = wire.pop("event", "unreadable")
                wire["line"] = seen  # where a follower that lost its link goes on (``after``)
                s.event(kind, **wire)
            if s.cancel_requested and not abort_on_cancel:
                raise AgentError("cancelled", "stopped following (the runner goes on)")
            if s.cancel_requested and not aborted:
                s.cancel_requested = False
                aborted = abort_runner(release_dir)
                s.event("progress", msg="aborting: the runner stops its step and restores the release")
            if s.eof or s.silent():
                raise AgentError("cancelled", "the controller went away (the runner goes on)")
            if not runner.alive() and verdict_of(release_dir) is None:
                time.sleep(GUARD_GRACE_SECONDS)
                if verdict_of(release_dir) is None and not guard_alive(release_dir):
                    raise AgentError("unfinished", "release %s has no runner and no guard, and no verdict"
                                     % os.path.basename(release_dir))
            if bell.fd is None:
                time.sleep(FOLLOW_POLL_SECONDS)
            elif s.pause(FOLLOW_IDLE_SECONDS, [bell.fd]):
                bell.drain()
    finally:
        bell.close()
        log.close()
        runner.close()


def op_release_abort(s, release_dir):
    """Ask a live runner to stop its step and restore (``orch rollback --abort``)."""
    return {"aborted": abort_runner(expand(release_dir))}


def abort_runner(release_dir):
    pid = live(release_dir, "pid", "starttime")
    if pid is None:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return False
    return True


def runner_alive(release_dir):
    return live(release_dir, "pid", "starttime") is not None


class RunnerWatch:
    """Whether the runner lives, as a follower asks at every poll (ten times a second, for
    as long as the release runs): ``processes.ProcessWatch`` on the process ``runner.json``
    records, so a poll reads one open file. Until that can be opened (``runner.json`` not
    written yet) each poll asks ``runner_alive`` as before."""

    def __init__(self, release_dir):
        self.release_dir = release_dir
        self.watch = ProcessWatch()

    def alive(self):
        opened = self.watch.fd is not None  # then runner.json is not read again
        runner = {} if opened else read_record(os.path.join(self.release_dir, RUNNER_FILE)) or {}
        alive = self.watch.alive(runner.get("pid"), runner.get("starttime"))
        return runner_alive(self.release_dir) if alive is None else alive

    def close(self):
        self.watch.close()


def guard_alive(release_dir):
    return live(release_dir, "guard", "guard_starttime") is not None


def live(release_dir, pid_key, start_key):
    """The pid ``runner.json`` records under ``pid_key`` if that process still lives (pid and
    start time: a reused pid is not it); None otherwise."""
    runner = read_record(os.path.join(release_dir, RUNNER_FILE)) or {}
    pid = runner.get(pid_key)
    return pid if pid and same_process(pid, runner.get(start_key)) else None


# ---------------------------------------------------------------- the guard


def guard_main(release_dir, fire_at, go_fd):
    """The forked process ``op_release_arm`` leaves: runner's guard after "run", else watchdog."""
    from .backstop import watchdog_main

    signal.signal(signal.SIGTERM, lambda *a: sys.exit(os.EX_OK))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    word = read_go(go_fd, fire_at, release_dir)
    if word != b"run":
        return watchdog_main(release_dir, fire_at)
    ended = runner_end_pipe()  # before the fork: a runner that dies at once still wakes the guard
    pid = os.fork()
    if pid == 0:
        from .backstop import exit_child
        from .main import name_process

        def runner():
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(ended[0])
            os.close(ended[1])
            os.setpgid(0, 0)  # its own group: what it runs dies with it (``guard_wait``)
            name_process("orch-runner")
            return runner_main(release_dir)

        exit_child("runner", runner)
    write_json(os.path.join(release_dir, RUNNER_FILE),
               {"pid": pid, "starttime": proc_starttime(pid), "guard": os.getpid(),
                "guard_starttime": proc_starttime(os.getpid()), "started": time.time()}, durable=False)
    return guard_wait(release_dir, pid, fire_at, ended[0])


def runner_end_pipe():
    """A pipe that a byte enters when a child of this process ends (SIGCHLD, through
    ``signal.set_wakeup_fd``): the guard sleeps on it until its runner ends or the
    deadline comes, instead of asking five times a second for a model's whole load."""
    r, w = wake_pipe()
    signal.signal(signal.SIGCHLD, lambda *a: None)  # handled, so that the wakeup fd hears it
    signal.set_wakeup_fd(w)
    return r, w


def read_go(fd, fire_at, release_dir):
    """The word the helper writes when the commit is done; b"" when it closed the pipe
    without it (gone before its commit), or when the watchdog has something to do (or
    nothing any more) before it comes: the deadline passed, a restore's claim ran out, the
    release was confirmed or restored by its controller (a night's, fed step by step)."""
    from .backstop import watchdog_due

    data = b""
    try:
        while not data.endswith(b"\n"):
            if not select.select([fd], [], [], 0.5)[0]:
                claim = read_record(os.path.join(release_dir, "claim.json")) or {}
                done = read_record(os.path.join(release_dir, "restored.json")) or {}
                if claim.get("by") == "confirmed" or done.get("completed") or watchdog_due(claim, fire_at):
                    return b""
                continue
            piece = os.read(fd, 16)
            if not piece:
                break
            data += piece
    finally:
        os.close(fd)
    return data.strip()


def guard_wait(release_dir, pid, fire_at, ended):
    """Wait on the runner; restore if it ends without a verdict or outlives the backstop.
    ``ended``: readable when the runner may have ended (``runner_end_pipe``)."""
    why = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            try:
                os.killpg(pid, signal.SIGKILL)  # what it ran (a hook, a pre-flight) dies with it; servers have their own
            except OSError:
                pass
            if os.WIFSIGNALED(status):
                why = "the runner was killed (signal %d) before its verdict" % os.WTERMSIG(status)
            else:
                why = "the runner ended (exit %d) before its verdict" % os.WEXITSTATUS(status)
            break
        if time.monotonic() >= fire_at:
            why = "the backstop's deadline passed before the runner's verdict"
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            os.waitpid(pid, 0)
            break
        # 60 s at most: the deadline is looked at again even if a wake were lost
        if select.select([ended], [], [], max(0.0, min(fire_at - time.monotonic(), 60.0)))[0]:
            drain(ended)
    signal.set_wakeup_fd(-1)  # the restore below starts servers of its own: their ends are not news here
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if verdict_of(release_dir) is not None:
        return 0
    print("%s guard: %s; restoring" % (time.strftime("%Y-%m-%dT%H:%M:%S"), why))
    sys.stdout.flush()
    spec = read_json(os.path.join(release_dir, "restore.json")) or {}
    s = RunnerSession(release_dir, spec.get("mask"))
    verdict = restore_verdict(s, release_dir, "guard", why, None)
    eventlog.append(release_dir, verdict, s.mask)
    give_back_lock(release_dir, pid)
    return 0 if verdict["verdict"] != "restore_failed" else 1


def give_back_lock(release_dir, runner_pid):
    """Remove the host's lock if the runner ``runner_pid`` holds it (it died holding it)."""
    path = os.path.join(os.path.dirname(os.path.dirname(release_dir)), "lock.json")
    if (read_record(path) or {}).get("agent_pid") == runner_pid:
        try:
            os.unlink(path)
        except OSError:
            pass


# ---------------------------------------------------------------- the runner


def runner_main(release_dir):
    release_dir = expand(release_dir)
    spec = read_json(os.path.join(release_dir, "restore.json")) or {}
    s = RunnerSession(release_dir, spec.get("mask"))

    aborted = []

    def abort(*_):
        if aborted:
            return  # once: its own group's SIGTERM (below) comes back here
        aborted.append(True)
        s.cancel_requested = True  # the step under way stops at its next check; the runner restores
        s.wake()
        try:
            os.killpg(os.getpgrp(), signal.SIGTERM)  # what it runs now (a hook, the pre-flight) stops too
        except OSError:
            pass

    signal.signal(signal.SIGTERM, abort)
    signal.signal(signal.SIGINT, abort)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    take_lock(s, os.path.dirname(os.path.dirname(release_dir)))
    threading.Thread(target=s.background, name="orch-runner-heartbeat", daemon=True).start()
    try:
        verdict = run_to_verdict(s, release_dir)
        eventlog.append(release_dir, verdict, s.mask)
    finally:
        s.stopping = True
        release_own_lock(s)
    return 0 if verdict["verdict"] in ("confirmed",) else 1


def take_lock(s, state_dir):
    """The host's lock, rewritten as the runner's: its pid and start time (a live holder is
    never taken over), ``controller_id: runner@<host>`` (no controller is "the same" as it),
    a token of its own; every other field (who started the run, the format) kept."""
    path = os.path.join(state_dir, "lock.json")
    lock = read_record(path) or {}
    pid = os.getpid()
    lock.update(agent_pid=pid, agent_starttime=proc_starttime(pid), runner_pid=pid,
                controller_id="runner@%s" % socket.gethostname(),
                token="runner-%s-%d-%d" % (socket.gethostname(), pid, int(time.time() * 1000)))
    tmp = "%s.runner-%d" % (path, pid)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, (json.dumps(lock, indent=1, sort_keys=True) + "\n").encode())
    os.fsync(fd)
    os.rename(tmp, path)  # the helper's fd now names the file it wrote: it can never remove this one
    s.lock = (path, fd)


def run_to_verdict(s, release_dir):
    """The program from the read-back to the confirm, and the verdict it ends in."""
    try:
        answer = op_release_steps(s, release_dir, "confirm")
    except AgentError as e:
        step = e.details.get("program_step")
        failed = StepFailure(e.kind, e.message, step if isinstance(step, str) else None,
                             {k: v for k, v in e.details.items() if k not in ("results", "step_done")})
        results = e.details.get("results") or {}
        if program_of(release_dir).kind == "rollback":
            return VerdictEvent(VerdictEvent.ROLLBACK_FAILED, failed, results).to_wire()
        s.cancel_requested = False  # an abort stopped the step; the restore must run whole
        reason = "aborted after the commit (Ctrl-C)" if failed.aborted else e.message
        # a follower says why now, not after the restore
        eventlog.append(release_dir, RestoringEvent(failed, "runner").to_wire(), s.mask)
        return restore_verdict(s, release_dir, "runner", reason, failed, results)
    confirm = (answer["results"].get("confirm") or [{}])[-1]
    if isinstance(confirm, dict) and confirm.get("confirmed") is False:
        restored, claim = confirm.get("restored"), confirm.get("claim")
        return VerdictEvent(VerdictEvent.NOT_CONFIRMED, results=answer["results"], judged=answer.get("judged"),
                            restore=restored if isinstance(restored, dict) else None,
                            claim=claim if isinstance(claim, dict) else None).to_wire()
    return VerdictEvent(VerdictEvent.CONFIRMED, results=answer["results"], judged=answer.get("judged"),
                        at=time.time()).to_wire()


def restore_verdict(s, release_dir, by, reason, failed, results=None):
    """Restore through the one restore machine; the verdict says how it went."""
    from .restore import op_restore_release

    try:
        record = op_restore_release(s, release_dir, by, reason=reason)
    except AgentError as e:
        if e.kind == "confirmed":  # the runner died after its claim: the release stands
            return VerdictEvent(VerdictEvent.CONFIRMED, failed, results or {}, note=e.message,
                                at=time.time()).to_wire()
        return VerdictEvent(VerdictEvent.RESTORE_FAILED, failed, results or {},
                            error={"kind": e.kind, "message": e.message}).to_wire()
    ok = bool(record.get("ok"))
    return VerdictEvent(VerdictEvent.RESTORED if ok else VerdictEvent.RESTORE_FAILED, failed, results or {},
                        restore=record, reason=reason, by=record.get("by", by), at=time.time()).to_wire()
