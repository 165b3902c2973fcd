"""Health checks: bounded HTTP requests, and the wait for a server to be
healthy and stay healthy."""

import json
import re
import socket
import threading
import time

from .files import tail_lines
from .processes import exit_code_of
from .wire import AgentError


def http():
    """``urllib.request`` (its ``HTTPError``/``URLError`` too), imported when first
    needed: it is half of the helper's start-up, and a no-op or a --check never uses it."""
    import urllib.request

    return urllib.request


BODY_LIMIT = 1 << 20  # a health answer larger than this is cut: nothing we check needs more


def fetch(url, method, body, headers, timeout):
    """One HTTP request: (status, text), or (None, reason). Bounded by the
    socket timeout per read; ``bounded_fetch`` bounds the whole of it."""
    got = fetch_plain(url, method, body, headers, timeout)
    if got is not None:
        return got
    return fetch_urllib(url, method, body, headers, timeout)


def fetch_urllib(url, method, body, headers, timeout):
    """``fetch`` through ``urllib``: what the plain client leaves to it (https, a redirect,
    a chunked answer, a name in the URL's user part, an IPv6 literal)."""
    request = http()
    req = request.Request(url, data=body, method=method, headers=headers)
    try:
        with request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read(BODY_LIMIT).decode("utf-8", "replace")
    except request.HTTPError as e:
        try:
            text = e.read(BODY_LIMIT).decode("utf-8", "replace")
        except Exception:
            text = ""
        return e.code, text
    except (request.URLError, OSError, ValueError) as e:
        return None, str(getattr(e, "reason", e))


HEAD_LIMIT = 64 * 1024


CONTENT_LENGTH = re.compile(br"(?im)^content-length:[ \t]*(\d+)[ \t]*$")


def lookup_word(host):
    """``host`` as ``getaddrinfo`` takes it: bytes when it is ASCII (an address, a plain
    name), which the resolver reads as they are. A str goes through the ``idna`` codec,
    whose first use imports ``encodings.idna``, ``stringprep`` and ``unicodedata``: about
    4 ms of a runner's CPU per release, to spell ``127.0.0.1``. A name that is not ASCII
    still needs that codec, and gets it."""
    return host.encode("ascii") if host.isascii() else host


def fetch_plain(url, method, body, headers, timeout, deadline=None):
    """``fetch`` of a plain ``http://host:port/path`` over a socket; None for
    anything it does not expect, which then goes to ``urllib`` as before.

    ``deadline`` (``time.monotonic()``): no wait goes past it, each read's
    timeout being what is left, and an answer not complete by then is
    ``(None, "no complete answer within <timeout> s")``, as ``bounded_fetch``
    says it. ``bounded_fetch`` gives one only for a host given as an address:
    looking a name up has no timeout to cut.

    Importing ``urllib.request`` (with ``http.client``, ``email`` and
    ``ssl``) cost a host 30 ms of CPU per deploy, more than all its health
    checks; a fleet pays it on every host. The request is HTTP/1.0, so the
    server sends no chunked body and closes after its answer: what arrives
    is the answer (cut at ``Content-Length`` when one is given). https, a
    user in the URL, IPv6 literals, a redirect (``urllib`` follows it) and a
    chunked answer are left to ``urllib``.
    """
    if not url.startswith("http://"):
        return None
    where, _, path = url[len("http://"):].partition("/")
    if not where or "@" in where or where.startswith("["):
        return None
    host, _, port = where.partition(":")
    try:
        port = int(port) if port else 80
    except ValueError:
        return None
    lines = ["%s /%s HTTP/1.0" % (method, path), "Host: %s" % where, "Accept-Encoding: identity",
             "Connection: close"]
    if body is not None:
        lines.append("Content-Length: %d" % len(body))
    for key, value in (headers or {}).items():
        if any(c in "%s%s" % (key, value) for c in "\r\n"):
            return None
        lines.append("%s: %s" % (key, value))
    try:
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
    except UnicodeEncodeError:
        return None
    raw = bytearray()
    head = None
    length = -1  # no Content-Length: the answer ends where the server closes
    late = no_complete_answer(timeout)
    try:
        with socket.create_connection((lookup_word(host), port), timeout=time_left(timeout, deadline)) as sock:
            sock.settimeout(time_left(timeout, deadline))
            sock.sendall(request)
            while len(raw) <= HEAD_LIMIT + BODY_LIMIT:
                if deadline is not None and time.monotonic() >= deadline:
                    return late  # bytes keep coming, but too slowly to make an answer in time
                sock.settimeout(time_left(timeout, deadline))
                data = sock.recv(65536)
                if not data:
                    break
                raw += data
                if head is None and b"\r\n\r\n" in raw:
                    head = bytes(raw).partition(b"\r\n\r\n")[0]
                    found = CONTENT_LENGTH.search(head)
                    length = int(found.group(1)) if found else -1
                if head is not None and 0 <= length <= len(raw) - len(head) - 4:
                    break  # all of it, even from a server that keeps the connection open
    except OSError as e:
        if deadline is not None and time.monotonic() >= deadline:
            return late
        return None, str(e)
    if head is None:
        return None
    rest = bytes(raw[len(head) + 4:])
    status = re.match(br"HTTP/1\.[01] (\d{3})[ \r]", head + b"\r")
    if not status or re.search(br"(?im)^transfer-encoding:", head):
        return None
    code = int(status.group(1))
    if 300 <= code < 400:
        return None
    if length >= 0:
        rest = rest[:length]
    return code, rest[:BODY_LIMIT].decode("utf-8", "replace")


def no_complete_answer(timeout):
    """What a request not answered whole within ``timeout`` seconds says."""
    return None, "no complete answer within %.1f s" % timeout


def time_left(timeout, deadline):
    """A socket timeout: ``timeout``, or what is left before ``deadline`` if that is
    less (a moment at least: a timeout of 0 would make the socket non-blocking)."""
    if deadline is None:
        return timeout
    return max(0.001, min(timeout, deadline - time.monotonic()))


def bounded_fetch(url, method, body, headers, timeout):
    """``fetch``, but over in ``timeout`` seconds whatever the server does.

    A socket timeout only bounds each read: a body that trickles a byte a
    second never trips it. To an address (``http://127.0.0.1:30000``, what a
    health check nearly always asks) every wait of the plain client is cut at
    the deadline. Otherwise (a name to look up, which no timeout bounds, or
    what only ``urllib`` reads) the request runs on a thread we stop waiting
    for at the deadline (the thread ends with its socket timeout). A thread
    per request was most of a health poll's CPU on the host (0.13 of 0.30 ms
    here), and a deploy polls dozens of times.
    """
    deadline = time.monotonic() + max(0.0, timeout)
    by_address = to_an_address(url)
    if by_address:
        got = fetch_plain(url, method, body, headers, timeout, deadline)  # says it in these words when late
        if got is not None:
            return got
    box = {}

    def run():
        how = fetch_urllib if by_address else fetch  # the plain client has had its turn
        box["got"] = how(url, method, body, headers, max(0.1, deadline - time.monotonic()))

    worker = threading.Thread(target=run, name="orch-check")
    worker.daemon = True
    worker.start()
    worker.join(max(0.0, deadline - time.monotonic()))
    if "got" not in box:
        return no_complete_answer(timeout)
    return box["got"]


def to_an_address(url):
    """Whether ``url`` is ``http://`` to an IPv4 address (no name to look up)."""
    if not url.startswith("http://"):
        return False
    host = url[len("http://"):].partition("/")[0].rpartition("@")[2].partition(":")[0]
    try:
        socket.inet_pton(socket.AF_INET, host)
    except (OSError, ValueError):
        return False
    return True


def run_check(base_url, check, timeout):
    """One health check against its expectations: (passed, what was seen)."""
    url = base_url.rstrip("/") + check["path"]
    label = "%s %s" % (check["method"].upper(), check["path"])
    body = None
    headers = dict(check.get("headers") or {})
    if check.get("json") is not None:
        body = json.dumps(check["json"]).encode()
        headers.setdefault("Content-Type", "application/json")
    status, text = bounded_fetch(url, check["method"].upper(), body, headers, timeout)
    if status is None:
        return False, "%s: %s" % (label, text)
    want = check.get("status", 200)
    if status != want:
        return False, "%s: HTTP %d (want %d)" % (label, status, want)
    if check.get("body") and not re.search(check["body"], text):
        return False, "%s: body does not match %r" % (label, check["body"])
    expect = check.get("expect") or {}
    if expect:
        try:
            doc = json.loads(text)
        except ValueError:
            return False, "%s: body is not JSON" % label
        for key, value in expect.items():
            if not isinstance(doc, dict) or key not in doc:
                return False, "%s: no key %r" % (label, key)
            if not same_value(doc[key], value):
                return False, "%s: %s is %r (want %r)" % (label, key, doc[key], value)
    return True, "%s: ok" % label


def same_value(got, want):
    if got == want:
        return True
    if isinstance(got, (int, float)) and isinstance(want, (int, float)) and not isinstance(got, bool):
        return float(got) == float(want)
    return False


CHECK_TIMEOUT = 30.0  # one request, at most (and never past the overall deadline)


def check_all(base_url, checks, interval, deadline):
    """Every check once, each bounded by the overall ``deadline``: (passed, last seen)."""
    last = ""
    for check in checks:
        per_check = min(max(interval, 1.0) * 5, CHECK_TIMEOUT)
        if deadline is not None:
            per_check = min(per_check, max(0.1, deadline - time.monotonic()))
        ok, last = run_check(base_url, check, per_check)
        if not ok:
            return False, last
    return True, last


def watch_process(s, pid, log, polls, phase):
    """Fail at once when the watched server has exited."""
    if pid is None:
        return
    code = exit_code_of(s, pid)
    if code is not None:
        why = "code %s" % code if code != "unknown" else "not started by orch's helper: exit code unknown"
        raise AgentError("server_exited", "server exited %s (%s)" % (phase, why),
                         code=code, log_tail=tail_lines(log) if log else [], polls=polls)


def sleep_watching(s, seconds):
    """Sleep ``seconds``, or less: a cancel (an abort, in the runner) ends it at once."""
    wake = time.monotonic() + seconds
    while True:
        s.check_cancel()
        left = wake - time.monotonic()
        if left <= 0:
            return
        s.pause(left)


def op_health_wait(s, base_url, checks, timeout, interval, pid=None, log=None, stable_for=0.0):
    """Poll every check until all pass, then keep them passing for ``stable_for``.

    Every request is bounded by the overall deadline (``timeout``), however
    slowly a server answers. The process is watched between polls: if it
    exits, this fails at once with its exit code and the tail of its log —
    the SyntaxError is on screen seconds after the start, not after a
    fifteen-minute timeout. After the first pass the server must stay
    healthy, and alive, for ``stable_for`` seconds: a server that dies two
    seconds after answering is not a success. ``timeout`` 0 checks once.
    """
    if pid == "started":  # in a batch right after server_start
        pid, log = s.last_started.get("pid"), s.last_started.get("log")
    if timeout <= 0:
        ok, last = check_all(base_url, checks, interval, None)
        if not ok:
            raise AgentError("health_timeout", "not healthy: %s" % last, polls=1, last=last)
        return {"elapsed": 0.0, "polls": 1, "last": last, "stable_for": 0.0}
    s.event("progress", step="health_wait", msg="waiting up to %.0f s for %s to be healthy" % (timeout, base_url))
    start = time.monotonic()
    deadline = start + timeout
    last = said = ""
    said_at = 0.0
    polls = 0
    while True:
        s.check_cancel()
        watch_process(s, pid, log, polls, "during start")
        ok, last = check_all(base_url, checks, interval, deadline)
        polls += 1
        if ok:
            break  # it answered healthy: an exit from now on is "after it became healthy"
        watch_process(s, pid, log, polls, "during start")
        # Say what we wait for when it changes, and every 10 s: not at every poll.
        now = time.monotonic()
        if last != said or now - said_at >= 10.0:
            said, said_at = last, now
            s.event("health", msg=last, elapsed=round(now - start, 1), polls=polls)
        if now >= deadline:
            raise AgentError("health_timeout", "not healthy after %ss: %s" % (timeout, last),
                             log_tail=tail_lines(log) if log else [], polls=polls, last=last)
        # Poll quickly at first (a small server is up in a fraction of a
        # second), backing off to ``interval``: 0.05, 0.1, 0.2 … s.
        sleep_watching(s, min(interval, 0.05 * (2 ** min(polls, 10)), max(0.0, deadline - now)))
    healthy_after = time.monotonic() - start
    if stable_for > 0:
        s.event("progress", msg="healthy after %.1f s; checking it stays healthy for %.0f s"
                      % (healthy_after, stable_for))
        stable_until = time.monotonic() + stable_for
        while time.monotonic() < stable_until:
            sleep_watching(s, min(interval, 1.0, max(0.0, stable_until - time.monotonic())))
            watch_process(s, pid, log, polls, "%.1f s after it became healthy" % (time.monotonic() - start - healthy_after))
            ok, seen = check_all(base_url, checks, interval, max(stable_until, time.monotonic() + 1.0))
            polls += 1
            if not ok:
                # A server that died closes its port a moment before its exit can be seen:
                # give the exit that moment, so the message says it died (and its code).
                for _ in range(10):
                    watch_process(s, pid, log, polls, "%.1f s after it became healthy"
                                  % (time.monotonic() - start - healthy_after))
                    if pid is None:
                        break
                    time.sleep(0.05)
                raise AgentError("unstable", "server became unhealthy %.1f s after it first passed its checks: %s"
                                 % (time.monotonic() - start - healthy_after, seen),
                                 log_tail=tail_lines(log) if log else [], polls=polls, last=seen)
    return {"elapsed": healthy_after, "polls": polls, "last": last, "stable_for": stable_for}
