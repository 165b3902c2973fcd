# Stand-in server: SGLang's native HTTP endpoints, standard library only.
# ruff: noqa: UP006, UP007, UP035, UP045
"""The HTTP front end of the stand-in server.

It answers the endpoints orch's health checks and probes use, the way SGLang
answers them: the port is bound at once, ``/health`` is 503 while the server
is starting (``STANDIN_STARTUP_DELAY`` seconds, default 0.5; forever with
``STANDIN_NEVER_READY=1``; ``STANDIN_WORKER=1`` starts a child worker process
that outlives the server unless its stopper takes children too) and 200 once "The server is fired up and ready to
roll!" was printed; ``/get_server_info`` returns every ``ServerArgs`` field as
a top-level key, so a field added by a patch shows up by itself; ``--api-key``
guards everything except ``/health*`` and ``/metrics``. SIGTERM and SIGINT
stop it cleanly (exit 0) unless ``STANDIN_IGNORE_SIGTERM=1``, which makes a
manager fall back to SIGKILL.

``/generate``, ``/v1/completions`` and ``/v1/chat/completions`` decode on a
modelled clock (``sglang.srt.standin_speed``): one decode loop advances every
request in flight together, one step at a time, and sleeps each step's
modelled time, computed from the batch size and from whether the step
speculated; so concurrency, speculation and the batch threshold show in the
throughput a probe measures, the same on every machine. A greedy request
(temperature 0) gets text that is a function of its prompt alone
(``STANDIN_GREEDY_SALT`` changes it); other requests get the fixed hello text.
``STANDIN_SLOWDOWN=F`` makes every step F times slower;

Fault switches (environment variables), so tests can make the server fail
the ways real ones do without an unknown flag:
``STANDIN_SAY=TEXT`` prints TEXT verbatim at start (escape sequences
included: a hostile log); ``STANDIN_CRASH_AT_START=1`` raises at start, before binding (a traceback,
exit 1); ``STANDIN_EXIT_AFTER_READY=S`` exits (code 1) S seconds after it
became healthy; ``STANDIN_EXIT_AFTER_ANSWERED=S`` exits (code 1) S seconds
after it first answered ``POST /generate`` (the last of a health poll's
checks: whoever polled has seen it healthy, however late it looked); ``STANDIN_FLAP=S`` answers health 200 for S seconds, then
503 for S seconds, and so on; ``STANDIN_HANG=1`` accepts connections and
never answers; ``STANDIN_TRICKLE=S`` sends health answers one byte every S
seconds; ``STANDIN_READY_FILE=PATH`` becomes healthy only once PATH exists
(so a test decides the moment, instead of racing a delay);
``STANDIN_GENERATE_HOLD_FILE=PATH`` holds every generation request
(``/generate``, ``/v1/completions``, ``/v1/chat/completions``) until PATH
exists, so a test can hold a gate's probe of this server open from outside.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import secrets
import shlex
import signal
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional, Tuple

from sglang.srt.server_args import ServerArgs
from sglang.srt.standin_speed import SpeedModel, greedy_salt
from sglang.version import __version__

logger = logging.getLogger(__name__)
access_logger = logging.getLogger("sglang.access")

DEFAULT_STARTUP_DELAY = 0.5
DEFAULT_MAX_NEW_TOKENS = 128
BATCH_WINDOW_S = 0.02
MAX_LAG_S = 0.5
HEALTH_PATHS = ("/health", "/health_generate", "/ping")
GENERATION_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
FLUSH_CACHE_MESSAGE = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)
_WORDS = (" The", " stand", "-in", " server", " says", " hello", ".")
_VOCAB = (
    " the", " a", " model", " token", " batch", " draft", " verify", " server", " fast",
    " slow", " night", " build", " patch", " flag", " GPU", " probe", " is", " and", ".", ",",
)


class BadRequest(Exception):
    """A request SGLang would answer with 400."""


@dataclasses.dataclass
class Reply:
    status: int
    body: bytes = b""
    content_type: str = "application/json"

    @classmethod
    def json(cls, obj: Any, status: int = 200) -> Reply:
        return cls(status, json.dumps(obj).encode("utf-8"))


class ServerState:
    """What the handlers share: the arguments, readiness, and the in-flight count."""

    def __init__(self, server_args: ServerArgs, launch_command: str):
        self.server_args = server_args
        self.launch_command = launch_command
        self.ready = threading.Event()
        self.shutting_down = threading.Event()
        self.lock = threading.Lock()
        self.in_flight = 0
        self.ready_since: Optional[float] = None
        self.generated_at: Optional[float] = None  # the first answered /generate
        self.worker = _make_spec_worker(server_args)
        self.engine = DecodeEngine(SpeedModel.for_server(server_args), self.worker)

    def healthy(self) -> bool:
        if not self.ready.is_set() or self.shutting_down.is_set():
            return False
        flap = _env_float("STANDIN_FLAP", 0.0)
        if flap > 0 and self.ready_since is not None:
            return int((time.monotonic() - self.ready_since) / flap) % 2 == 0
        return True


def _make_spec_worker(server_args: ServerArgs):
    """Build the EAGLE worker when speculative decoding is on, as SGLang's scheduler does.

    Importing it here (at start) means a broken patch to the worker's file ends
    the server before it binds its port, like SGLang's scheduler start-up.
    """
    if server_args.speculative_algorithm is None:
        return None
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    return EAGLEWorkerV2(server_args)


class _Job:
    """One request in the decode loop."""

    def __init__(self, max_new_tokens: int):
        self.max_new_tokens = max_new_tokens
        self.tokens = 0
        self.spec_verify_ct = 0
        self.done = threading.Event()


class DecodeEngine:
    """Continuous batching on a modelled clock.

    One thread runs decode steps over every request in flight: requests that
    arrived since the last step join the batch (a prefill, via the worker's
    extend branch), the speculative worker (if any) decides whether this step
    drafts for this batch size, the thread sleeps the step's modelled time,
    and every request gets its tokens. A request leaves when it has
    ``max_new_tokens``.
    """

    def __init__(self, model: SpeedModel, worker):
        self.model = model
        self.worker = worker
        self.cond = threading.Condition()
        self.pending: List[_Job] = []
        self.active: List[_Job] = []
        self.thread: Optional[threading.Thread] = None
        self.clock = 0.0  # when the last step ends on the modelled timeline (monotonic)

    def run(self, max_new_tokens: int) -> _Job:
        """Decode one request; returns when it is finished."""
        job = _Job(max_new_tokens)
        if max_new_tokens <= 0:
            job.done.set()
            return job
        with self.cond:
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name="decode", daemon=True)
                self.thread.start()
            self.pending.append(job)
            self.cond.notify()
        job.done.wait()
        return job

    def _loop(self) -> None:
        while True:
            with self.cond:
                idle = not self.active
                while not self.pending and not self.active:
                    self.cond.wait()
            if idle:  # the scheduler's first poll: requests sent together start together
                time.sleep(BATCH_WINDOW_S)
                self.clock = time.monotonic()
            with self.cond:
                joined, self.pending = self.pending, []
                self.active.extend(joined)
                batch = list(self.active)
            self._step(batch, len(joined))
            with self.cond:
                for job in batch:
                    if job.tokens >= job.max_new_tokens:
                        self.active.remove(job)
                        job.done.set()

    def _step(self, batch: List[_Job], joined: int) -> None:
        size = len(batch)
        tokens, speculative = 1, False
        if self.worker is not None:
            from sglang.srt.speculative.eagle_worker_v2 import ForwardMode, ScheduleBatch

            if joined:
                self.worker.forward_batch_generation(ScheduleBatch.of(ForwardMode.EXTEND, joined))
            out = self.worker.forward_batch_generation(ScheduleBatch.of(ForwardMode.DECODE, size))
            speculative = bool(getattr(out, "verified", False))
            tokens = max(1, int(out.num_new_tokens))
        # Steps follow the modelled timeline: a step that woke late (a busy
        # machine) is caught up by the next ones instead of adding up, unless
        # it fell so far behind that the timeline restarts from now.
        self.clock += self.model.step_seconds(size, speculative, joined)
        now = time.monotonic()
        if self.clock > now:
            time.sleep(self.clock - now)
        elif now - self.clock > MAX_LAG_S:
            self.clock = now
        for job in batch:
            job.tokens = min(job.max_new_tokens, job.tokens + tokens)
            job.spec_verify_ct += 1 if speculative else 0


def _greedy(params: Any, key: str = "temperature") -> bool:
    value = params.get(key) if isinstance(params, dict) else None
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def _greedy_text(prompt: Any, max_new_tokens: int) -> str:
    """What greedy decoding of ``prompt`` gives: a function of the prompt alone."""
    seed = hashlib.sha256((greedy_salt() + "\x00" + json.dumps(prompt)).encode("utf-8")).digest()
    words = []
    for i in range(max_new_tokens):
        if i % 32 == 0:
            seed = hashlib.sha256(seed).digest()
        words.append(_VOCAB[seed[i % 32] % len(_VOCAB)])
    return "".join(words)


def _generate_one(
    state: ServerState, prompt: Any, prompt_tokens: int, max_new_tokens: int, greedy: bool = False
) -> Dict[str, Any]:
    """Decode one request in the modelled batch; deterministic text."""
    tic = time.time()
    with state.lock:
        state.in_flight += 1
    try:
        job = state.engine.run(max_new_tokens)
        if greedy:
            text = _greedy_text(prompt, max_new_tokens)
        else:
            text = "".join(_WORDS[i % len(_WORDS)] for i in range(max_new_tokens))
    finally:
        with state.lock:
            state.in_flight -= 1
    meta_info: Dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "finish_reason": {"type": "length", "length": max_new_tokens},
        "prompt_tokens": prompt_tokens,
        "completion_tokens": max_new_tokens,
        "cached_tokens": 0,
        "e2e_latency": round(time.time() - tic, 6),
    }
    if state.worker is not None:
        meta_info["spec_verify_ct"] = job.spec_verify_ct
    return {"text": text, "output_ids": list(range(max_new_tokens)), "meta_info": meta_info}


def _count_tokens(text: Any) -> int:
    return max(1, len(str(text).split()))


def _max_new_tokens(params: Any, key: str = "max_new_tokens") -> int:
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise BadRequest("sampling_params must be an object")
    value = params.get(key, DEFAULT_MAX_NEW_TOKENS)
    if value is None:
        value = DEFAULT_MAX_NEW_TOKENS
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(f"{key} must be a non-negative integer, got {value!r}")
    return value


def _json_body(body: bytes) -> Dict[str, Any]:
    try:
        obj = json.loads(body.decode("utf-8") or "null")
    except (UnicodeDecodeError, ValueError) as e:
        raise BadRequest(f"invalid JSON body: {e}") from None
    if not isinstance(obj, dict):
        raise BadRequest("the request body must be a JSON object")
    return obj


# ---- endpoints -------------------------------------------------------------


def health(state: ServerState, body: bytes) -> Reply:
    text = b"healthy\n" * 16 if os.environ.get("STANDIN_TRICKLE") else b""
    return Reply(200 if state.healthy() else 503, text, content_type="text/plain")


def server_info(state: ServerState, body: bytes) -> Reply:
    info: Dict[str, Any] = dataclasses.asdict(state.server_args)
    info.update(
        {
            "internal_states": [{}],
            "version": __version__,
            "launch_command": state.launch_command,
        }
    )
    return Reply.json(info)


def model_info(state: ServerState, body: bytes) -> Reply:
    args = state.server_args
    return Reply.json(
        {
            "model_path": args.model_path,
            "tokenizer_path": args.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": None,
            "architectures": None,
        }
    )


def models(state: ServerState, body: bytes) -> Reply:
    name = state.server_args.served_model_name
    card = {
        "id": name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "standin",
        "root": name,
        "max_model_len": state.server_args.context_length or 4096,
    }
    return Reply.json({"object": "list", "data": [card]})


def generate(state: ServerState, body: bytes) -> Reply:
    req = _json_body(body)
    max_new_tokens = _max_new_tokens(req.get("sampling_params"))
    greedy = _greedy(req.get("sampling_params"))
    if req.get("text") is not None:
        prompts = req["text"]
        counts = [_count_tokens(p) for p in prompts] if isinstance(prompts, list) else None
        single = None if counts is not None else _count_tokens(prompts)
    elif req.get("input_ids") is not None:
        ids = req["input_ids"]
        if not isinstance(ids, list):
            raise BadRequest("input_ids must be a list")
        batched = bool(ids) and isinstance(ids[0], list)
        counts = [len(x) for x in ids] if batched else None
        single = None if batched else len(ids)
    else:
        raise BadRequest("Either text, input_ids or input_embeds should be provided.")
    prompt = req.get("text") if req.get("text") is not None else req.get("input_ids")
    if counts is not None:
        return Reply.json(
            [
                _generate_one(state, p, n, max_new_tokens, greedy)
                for p, n in zip(prompt, counts)
            ]
        )
    return Reply.json(_generate_one(state, prompt, single or 0, max_new_tokens, greedy))


def _usage(prompt_tokens: int, completion_tokens: int) -> Dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completions(state: ServerState, body: bytes) -> Reply:
    req = _json_body(body)
    n = _max_new_tokens(req, "max_tokens")
    prompt_tokens = _count_tokens(req.get("prompt", ""))
    out = _generate_one(state, req.get("prompt", ""), prompt_tokens, n, _greedy(req))
    return Reply.json(
        {
            "id": out["meta_info"]["id"],
            "object": "text_completion",
            "created": int(time.time()),
            "model": req.get("model") or state.server_args.served_model_name,
            "choices": [
                {"index": 0, "text": out["text"], "logprobs": None, "finish_reason": "length"}
            ],
            "usage": _usage(prompt_tokens, n),
        }
    )


def chat_completions(state: ServerState, body: bytes) -> Reply:
    req = _json_body(body)
    messages = req.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    n = _max_new_tokens(req, "max_tokens")
    prompt_tokens = sum(
        _count_tokens(m.get("content", "")) for m in messages if isinstance(m, dict)
    )
    out = _generate_one(state, messages, prompt_tokens, n, _greedy(req))
    return Reply.json(
        {
            "id": out["meta_info"]["id"],
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.get("model") or state.server_args.served_model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": out["text"]},
                    "finish_reason": "length",
                }
            ],
            "usage": _usage(prompt_tokens, n),
        }
    )


def flush_cache(state: ServerState, body: bytes) -> Reply:
    return Reply(200, FLUSH_CACHE_MESSAGE.encode("utf-8"), "text/plain")


Endpoint = Callable[[ServerState, bytes], Reply]
ROUTES: Dict[str, Tuple[Tuple[str, ...], Endpoint]] = {
    "/health": (("GET",), health),
    "/health_generate": (("GET",), health),
    "/ping": (("GET",), health),
    "/get_server_info": (("GET",), server_info),
    "/server_info": (("GET",), server_info),
    "/get_model_info": (("GET",), model_info),
    "/model_info": (("GET",), model_info),
    "/v1/models": (("GET",), models),
    "/generate": (("POST", "PUT"), generate),
    "/v1/completions": (("POST",), completions),
    "/v1/chat/completions": (("POST",), chat_completions),
    "/flush_cache": (("GET", "POST"), flush_cache),
}


def _authorized(api_key: Optional[str], method: str, path: str, header: Optional[str]) -> bool:
    """SGLang's rule: with --api-key, all but /health* and /metrics need ``Bearer <key>``."""
    if not api_key or method == "OPTIONS":
        return True
    if path.startswith("/health") or path.startswith("/metrics"):
        return True
    if not header:
        return False
    parts = header.split(" ", 1)
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return False
    return secrets.compare_digest(parts[1], api_key)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "standin"
    sys_version = ""
    timeout = 60
    state: ServerState  # set on the subclass made by launch_server

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True
            return b""
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _dispatch(self, method: str) -> None:
        if os.environ.get("STANDIN_HANG") == "1":
            while not self.state.shutting_down.wait(1.0):
                pass  # a hung server: the connection stays open, no answer ever comes
            return
        try:
            body = self._read_body()
        except ValueError:
            self._send(Reply.json({"detail": "bad Content-Length"}, 400))
            return
        path = self.path.split("?", 1)[0]
        if not _authorized(
            self.state.server_args.api_key, method, path, self.headers.get("Authorization")
        ):
            self._send(Reply.json({"error": "Unauthorized"}, 401))
            return
        route = ROUTES.get(path)
        if route is None:
            self._send(Reply.json({"detail": "Not Found"}, 404))
            return
        methods, endpoint = route
        if method not in methods:
            self._send(Reply.json({"detail": "Method Not Allowed"}, 405))
            return
        if path in GENERATION_PATHS and not self._held_until_released():
            return  # shutting down while held: no answer, as a server that stops mid-request
        try:
            reply = endpoint(self.state, body)
        except BadRequest as e:
            logger.error(f"[http_server] Error: {e}")
            reply = Reply.json(
                {"error": {"message": str(e), "type": "BadRequestError", "code": 400}}, 400
            )
        except Exception as e:  # a patched worker that raises: SGLang answers 500
            logger.exception("[http_server] Internal error")
            reply = Reply.json({"error": {"message": repr(e), "code": 500}}, 500)
        self._send(reply)
        if path == "/generate" and reply.status == 200 and self.state.generated_at is None:
            self.state.generated_at = time.monotonic()

    def _held_until_released(self) -> bool:
        """Wait while ``STANDIN_GENERATE_HOLD_FILE`` names a file that does not exist yet;
        False when the server shuts down first."""
        hold = os.environ.get("STANDIN_GENERATE_HOLD_FILE")
        while hold and not os.path.exists(hold):
            if self.state.shutting_down.wait(0.05):
                return False
        return True

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        trickle = _env_float("STANDIN_TRICKLE", 0.0)
        if trickle > 0 and self.path.split("?", 1)[0] in HEALTH_PATHS:
            for i in range(len(reply.body)):  # a byte at a time: every read is "in time"
                self.wfile.write(reply.body[i : i + 1])
                self.wfile.flush()
                if self.state.shutting_down.wait(trickle):
                    return
            return
        self.wfile.write(reply.body)

    def log_request(self, code: Any = "-", size: Any = "-") -> None:
        """One access line per request, shaped like uvicorn's under SGLang."""
        try:
            phrase = self.responses[int(code)][0]
        except (KeyError, ValueError, TypeError):
            phrase = ""
        host, port = self.client_address[:2]
        access_logger.info(f'INFO:     {host}:{port} - "{self.requestline}" {code} {phrase}')

    def log_message(self, format: str, *args: Any) -> None:
        logger.warning(format % args)


class _Server(ThreadingHTTPServer):
    # A probe opens dozens of connections at once; socketserver's default
    # listen backlog of 5 would drop or reset most of them.
    request_queue_size = 1024


def _server_class(host: str):
    if ":" in host:

        class V6Server(_Server):
            address_family = socket.AF_INET6

        return V6Server
    return _Server


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        return float(raw) if raw.strip() else default
    except ValueError:
        logger.warning(f"{name}={raw!r} is not a number; using {default}")
        return default


def _install_signal_handlers(stop: threading.Event, received: List[int]) -> None:
    """Only record the signal: logging from a handler could interleave with the main thread."""

    def _on_signal(signum, frame):
        received.append(signum)
        stop.set()

    if os.environ.get("STANDIN_IGNORE_SIGTERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)


def _announce_ready() -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with contextlib.suppress(OSError):  # stdout closed: the log line is lost, not the server
        print(f"[{stamp}] The server is fired up and ready to roll!", flush=True)


def launch_server(server_args: ServerArgs, argv: Optional[List[str]] = None) -> None:
    """Serve until SIGTERM/SIGINT; return normally so the process exits 0."""
    access_level = (server_args.log_level_http or server_args.log_level).upper()
    access_logger.setLevel(getattr(logging, access_level, logging.INFO))
    logger.info(f"server_args={server_args!r}")
    if os.environ.get("STANDIN_SAY"):
        print(os.environ["STANDIN_SAY"], flush=True)  # verbatim: control characters and all
    if os.environ.get("STANDIN_CRASH_AT_START") == "1":
        raise RuntimeError("STANDIN_CRASH_AT_START=1: the server fails at start")
    args = list(argv if argv is not None else sys.argv[1:])
    launch_command = " ".join(
        shlex.quote(w) for w in [sys.executable, "-m", "sglang.launch_server"] + args
    )
    state = ServerState(server_args, launch_command)
    handler = type("BoundHandler", (Handler,), {"state": state})

    stop = threading.Event()
    received: List[int] = []
    _install_signal_handlers(stop, received)
    try:
        httpd = _server_class(server_args.host)((server_args.host, server_args.port), handler)
    except OSError as e:
        logger.error(
            f"[Errno {e.errno}] error while attempting to bind on address "
            f"({server_args.host!r}, {server_args.port}): {e.strerror}"
        )
        sys.exit(1)
    httpd.daemon_threads = True
    serving = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1})
    serving.daemon = True
    serving.start()
    logger.info(f"Stand-in server listening on {server_args.url()} (starting)")

    if os.environ.get("STANDIN_WORKER") == "1":
        # Like SGLang's scheduler: a child process. This one is not stopped on
        # shutdown, so whoever stops the server must take its children too.
        import subprocess

        worker = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
        logger.info(f"worker process started: pid {worker.pid}")

    never_ready = os.environ.get("STANDIN_NEVER_READY") == "1"
    ready_at = time.monotonic() + _env_float("STANDIN_STARTUP_DELAY", DEFAULT_STARTUP_DELAY)
    exit_after = _env_float("STANDIN_EXIT_AFTER_READY", 0.0)
    exit_after_answered = _env_float("STANDIN_EXIT_AFTER_ANSWERED", 0.0)
    try:
        while not stop.wait(0.05):
            ready_file = os.environ.get("STANDIN_READY_FILE")
            gate_open = not ready_file or os.path.exists(ready_file)
            if not never_ready and not state.ready.is_set() and time.monotonic() >= ready_at and gate_open:
                state.ready_since = time.monotonic()
                state.ready.set()
                _announce_ready()
            if exit_after > 0 and state.ready_since is not None and time.monotonic() - state.ready_since >= exit_after:
                logger.error("the stand-in dies now (STANDIN_EXIT_AFTER_READY)")
                os._exit(1)
            answered = state.generated_at
            if exit_after_answered > 0 and answered is not None and time.monotonic() - answered >= exit_after_answered:
                logger.error("the stand-in dies now (STANDIN_EXIT_AFTER_ANSWERED)")
                os._exit(1)
    finally:
        if received:
            logger.info(f"Received {signal.Signals(received[0]).name}; shutting down.")
        state.shutting_down.set()
        httpd.shutdown()
        httpd.server_close()
        logger.info("Stand-in server stopped.")
