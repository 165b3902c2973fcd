"""The probe a performance gate builds on: timed requests, raw samples
(the figures they add up to: ``host/figures.py``, pure, read on either side)."""

import json
import threading
import time

from .health import http
from .nightly import nightly_stop_reason
from .wire import AgentError


def probe_tokens(doc):
    """Only what counts output tokens: OpenAI ``usage`` or SGLang ``meta_info``."""
    if isinstance(doc, dict):
        usage = doc.get("usage")
        if isinstance(usage, dict):
            return {"usage": {"completion_tokens": usage.get("completion_tokens")}}
        meta = doc.get("meta_info")
        if isinstance(meta, dict):
            return {"meta_info": [{"completion_tokens": meta.get("completion_tokens")}]}
        return None
    if isinstance(doc, list):
        metas = [d.get("meta_info") for d in doc if isinstance(d, dict) and isinstance(d.get("meta_info"), dict)]
        return {"meta_info": [{"completion_tokens": m.get("completion_tokens")} for m in metas]} if metas else None
    return None


def probe_request(url, payload, headers, timeout, keep_doc=False):
    """One POST, bounded by ``timeout`` (connect, each read, and in total)."""
    started = time.time()
    request = http()
    req = request.Request(url, data=payload, method="POST", headers=headers)
    status, raw, error = None, b"", None
    try:
        with request.urlopen(req, timeout=timeout) as resp:
            status = resp.status
            raw = resp.read(4 << 20)
    except request.HTTPError as e:
        status = e.code
        error = "HTTP %d" % e.code
    except (request.URLError, OSError, ValueError) as e:
        error = str(getattr(e, "reason", e)) or type(e).__name__
    latency = time.time() - started
    if error is None and latency > timeout:
        error = "no answer within %ss" % timeout
    doc = None
    if raw:
        try:
            doc = json.loads(raw.decode("utf-8"))
        except ValueError:
            if error is None:
                error = "the answer is not JSON"
    out = {"latency": latency, "status": status, "error": error, "tokens": probe_tokens(doc)}
    if keep_doc:
        out["doc"] = doc
    return out


def probe_batch(s, url, payload, headers, timeout, count, concurrency):
    """``count`` requests from ``concurrency`` threads; a sample per request, in order."""
    samples = [None] * count
    lock = threading.Lock()
    state = {"next": 0, "done": 0}

    def worker():
        while True:
            with lock:
                i = state["next"]
                if i >= count or nightly_stop_reason(s) is not None:
                    return
                state["next"] = i + 1
            samples[i] = probe_request(url, payload, headers, timeout)
            with lock:
                state["done"] += 1

    threads = [threading.Thread(target=worker) for _ in range(max(1, min(concurrency, count)))]
    started = time.time()
    for t in threads:
        t.daemon = True
        t.start()
    # Every request is bounded by ``timeout``; the batch by the worst case of that. An abort
    # (Ctrl-C, the runner's SIGTERM) stops the wait at once, not after the requests in
    # flight time out: a gate's probe of a server that hangs would hold the restore that long.
    deadline = started + timeout * (count // max(1, concurrency) + 2)
    said = started
    for t in threads:
        while t.is_alive() and time.time() < deadline and nightly_stop_reason(s) is None:
            t.join(0.2)
            if time.time() - said >= 2.0:
                said = time.time()
                s.event("progress", msg="probe: %d/%d requests answered" % (state["done"], count))
    s.check_cancel()
    duration = time.time() - started
    for i, sample in enumerate(samples):
        if sample is None:
            samples[i] = {"latency": duration, "status": None, "error": "no answer before the probe's deadline",
                          "tokens": None}
    return samples, duration


def probe_alone(s, url, payload, headers, timeout):
    """One request (its whole answer kept), waited for in a thread so that an abort stops
    the wait at once: a signal does not end a socket read (PEP 475 retries it), so a
    server that holds the request would hold the runner's abort for ``timeout``."""
    got = []

    def ask():
        try:
            got.append((probe_request(url, payload, headers, timeout, keep_doc=True), None))
        except Exception as e:  # raised where it is waited for, as it was before the thread
            got.append((None, e))

    worker = threading.Thread(target=ask)
    worker.daemon = True
    worker.start()
    while worker.is_alive() and nightly_stop_reason(s) is None:
        worker.join(0.2)
    if not got:
        s.check_cancel()
        raise AgentError("cancelled", "the probe was stopped before its answer came")
    answer, error = got[0]
    if error is not None:
        raise error
    return answer


def op_probe_http(s, base_url, path, body, requests, concurrency, timeout, headers=None, warmup=0,
                  greedy_body=None):
    """Send ``requests`` POSTs of ``body`` to ``path`` at ``concurrency``; time each.

    First ``warmup`` requests (not counted), then, when ``greedy_body`` is
    given, that one request alone (its whole answer comes back: the
    controller fingerprints its text), then the measured batch. Returns the
    raw samples; the figures are computed from them by ``host/figures.py``
    (today on the controller), where they can be tested without a server.
    """
    url = base_url.rstrip("/") + path
    hdrs = {"Content-Type": "application/json"}
    hdrs.update(headers or {})
    payload = json.dumps(body if body is not None else {}).encode("utf-8")
    if warmup:
        s.event("progress", msg="probe: %d warm-up request(s)" % warmup)
        probe_batch(s, url, payload, hdrs, timeout, warmup, concurrency)
    greedy = None
    if greedy_body is not None:
        greedy = probe_alone(s, url, json.dumps(greedy_body).encode("utf-8"), hdrs, timeout)
    s.event("progress", msg="probe: %d request(s) to %s at concurrency %d" % (requests, path, concurrency))
    samples, duration = probe_batch(s, url, payload, hdrs, timeout, requests, concurrency)
    return {"samples": samples, "duration": duration, "greedy": greedy}
