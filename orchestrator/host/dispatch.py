"""The request loop: the op table, ``serve``, ``batch``, ``hello``, ``bye``.

The op table is a constant: op name -> (module, function). A module is
imported when one of its ops first runs, so a start pays only for what
the run uses (a night's and a probe's code is never loaded by a deploy).
Every op takes the ``Session`` as its first argument.
"""

import json
import os
import shutil
import socket
import sys
import threading
import time

from .wire import LINK_TIMEOUT_FLOOR, PROTOCOL, READY_MAGIC, AgentError

OPS = {
    "bye": ("dispatch", "op_bye"),
    "batch": ("dispatch", "op_batch"),
    "hello": ("dispatch", "op_hello"),
    "read": ("files", "op_read"),
    "sha256": ("files", "op_sha256"),
    "stage": ("staging", "op_stage"),
    "run": ("staging", "op_run"),
    "validate": ("staging", "op_validate"),
    "remove": ("staging", "op_remove"),
    "commit": ("staging", "op_commit"),
    "state_init": ("state", "op_state_init"),
    "lock_acquire": ("state", "op_lock_acquire"),
    "open_state": ("state", "op_open_state"),
    "lock_release": ("state", "op_lock_release"),
    "get_json": ("files", "op_get_json"),
    "put_json": ("files", "op_put_json"),
    "state_read": ("state", "op_state_read"),
    "release_create": ("state", "op_release_create"),
    "release_update": ("state", "op_release_update"),
    "release_prune": ("state", "op_release_prune"),
    "release_log": ("state", "op_release_log"),
    "server_find": ("processes", "op_server_find"),
    "process": ("processes", "op_process"),
    "server_stop": ("processes", "op_server_stop"),
    "server_start": ("processes", "op_server_start"),
    "run_ok": ("processes", "op_run_ok"),
    "commands_start": ("processes", "op_commands_start"),
    "health_wait": ("health", "op_health_wait"),
    "log_tail": ("files", "op_log_tail"),
    "restore_release": ("restore", "op_restore_release"),
    "confirm_release": ("restore", "op_confirm_release"),
    "program_write": ("executor", "op_program_write"),
    "release_steps": ("executor", "op_release_steps"),
    "mark": ("files", "op_mark"),
    "release_arm": ("backstop", "op_release_arm"),
    "release_run": ("runner", "op_release_run"),
    "release_follow": ("runner", "op_release_follow"),
    "release_abort": ("runner", "op_release_abort"),
    "release_stamp": ("stamp", "op_release_stamp"),
    "read_host": ("facts", "op_read_host"),
    "preflight": ("facts", "op_preflight"),
    "nightly_prepare": ("nightly", "op_nightly_prepare"),
    "nightly_builds": ("nightly", "op_nightly_builds"),
    "nightly_fetch_git": ("nightly", "op_nightly_fetch_git"),
    "nightly_pip": ("nightly", "op_nightly_pip"),
    "nightly_run": ("nightly", "op_nightly_run"),
    "nightly_remove_build": ("nightly", "op_nightly_remove_build"),
    "nightly_prune": ("nightly", "op_nightly_prune"),
    "nightly_link_swap": ("nightly", "op_nightly_link_swap"),
    "probe_http": ("probe", "op_probe_http"),
}
"""Op name -> (module of this package, function): what a request may ask for."""


def find_op(name):
    """The function of op ``name`` (its module imported now if it was not yet), or None."""
    where = OPS.get(name) if isinstance(name, str) else None
    if where is None:
        return None
    return package_attr(where[0], where[1])


def package_attr(module, name):
    """``from .module import name``, at run time. Not through ``importlib``: importing it
    would cost every start of the helper, and most starts need only a few modules."""
    return getattr(__import__(module, globals(), {}, [name], 1), name)


def check_request(request):
    """Refuse, in one line naming the op and the field, a request that its type in
    ``protocol`` does not describe (a batch's steps included): nothing of it runs."""
    from .protocol import ProtocolError, parse_request

    try:
        parse_request(request)
    except ProtocolError as e:
        raise AgentError("protocol", str(e))


def serve(s, stdin):
    """Answer requests until ``bye`` or the end of the controller (see ``Session``)."""
    ticker = threading.Thread(target=s.background, daemon=True)
    ticker.start()
    s.send(  # with hello's answer: the controller needs no round trip for it
        {"ready": READY_MAGIC, "protocol": PROTOCOL, "pid": os.getpid(), "python": sys.version.split()[0],
         "hello": op_hello(s)}
    )
    threading.Thread(target=s.reader, args=(stdin,), daemon=True).start()
    while True:
        line = s.next_request()
        if not line:
            break
        try:
            request = json.loads(line.decode())
        except ValueError:
            s.send({"id": None, "done": True, "ok": False,
                          "error": {"type": "protocol", "message": "bad request line"}})
            continue
        rid = request.get("id")
        s.current_id = rid
        try:
            check_request(request)
            fn = find_op(request.get("op"))
            if fn is None:
                raise AgentError("protocol", "unknown op %r" % request.get("op"))
            result = fn(s, **(request.get("args") or {}))
            reply = {"id": rid, "done": True, "ok": True, "result": result}
        except AgentError as e:
            reply = {"id": rid, "done": True, "ok": False,
                     "error": {"type": e.kind, "message": e.message, "details": e.details}}
        except Exception as e:  # reported, not fatal: the controller decides
            reply = {"id": rid, "done": True, "ok": False,
                     "error": {"type": "internal", "message": "%s: %s" % (type(e).__name__, e)}}
        with s.cond:
            s.blobs.clear()  # what this request sent and no op took: not kept for ever
        s.current_id = None
        s.send(reply)
        if request.get("op") == "bye":
            # Leave at once: a normal interpreter exit would wait on the reader
            # thread blocked in stdin (a second of stall per run, measured).
            give_back_lock(s)
            sys.stdout.flush()
            os._exit(os.EX_OK)
    # The controller is gone (it died or the link dropped): whatever op was
    # running has finished. Leave nothing half-done behind: staged copies it
    # never committed go, and the host's lock is given back by us, so nobody
    # has to wait for a heartbeat to go stale.
    for staged in list(s.staged):
        if staged in s.staged_fds:
            package_attr("staging", "forget_staged")(s, staged)
            continue
        try:
            os.unlink(staged)
        except OSError:
            pass
    give_back_lock(s)
    s.stopping = True
    leave(s.gone)


def give_back_lock(s):
    """The host's lock, if this session took it (the state module is loaded only then)."""
    if s.lock is not None:
        package_attr("state", "release_own_lock")(s)


def leave(reason):
    """End the helper now, saying why on stderr in one line.

    Not a normal interpreter exit: with the reader thread blocked in stdin,
    that can die in a "Fatal Python error" dump whose last line, ``<no
    Python frame>``, is what the controller would show as the reason.
    """
    try:
        if reason:
            sys.stderr.write("orch-helper: %s; stopped\n" % reason)
            sys.stderr.flush()
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    os._exit(os.EX_OK)


def op_bye(s):
    return True


def op_batch(s, steps):
    """Several ops in one round trip; stops at the first failure."""
    results = []
    for i, step in enumerate(steps):
        fn = find_op(step["op"])
        if fn is None:
            raise AgentError("protocol", "unknown op %r" % step["op"])
        try:
            results.append(fn(s, **(step.get("args") or {})))
        except AgentError as e:
            e.details["step"] = i
            e.details["done"] = results
            raise
        except Exception as e:  # unanticipated: the results of the steps before it still reach the controller
            raise AgentError("internal", "%s: %s" % (type(e).__name__, e), step=i, done=results)
    return results


def op_hello(s, link_timeout=30.0):
    """Who and where this helper is. ``link_timeout``: the controller's silence limit, which
    this end keeps from now on (``Session.follow_link_timeout``); the ready line's hello,
    which no request asked for, leaves the default."""
    if isinstance(link_timeout, bool) or not isinstance(link_timeout, (int, float)) \
            or not LINK_TIMEOUT_FLOOR <= link_timeout < float("inf"):
        raise AgentError("protocol", "hello: link_timeout must be %g s or more, got %r"
                         % (LINK_TIMEOUT_FLOOR, link_timeout))
    s.follow_link_timeout(link_timeout)
    return {
        "protocol": PROTOCOL,
        "pid": os.getpid(),
        "python": sys.executable,
        "python_version": sys.version.split()[0],
        "hostname": socket.gethostname(),
        "uid": os.getuid(),
        "home": os.path.expanduser("~"),
        "nvidia_smi": shutil.which("nvidia-smi"),
        "time": time.time(),
    }
