"""The stand-in server, as real processes on 127.0.0.1: start-up, health, the story's crash.

Each test copies the packaged tree (``make_tree``), maybe patches the copy the
way a playbook would, and runs ``python -m sglang.launch_server`` from it.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.standin import (
    ENV_IGNORE_SIGTERM,
    ENV_NEVER_READY,
    ENV_STARTUP_DELAY,
    READY_LINE,
    TREE,
    launch_argv,
    launch_env,
    make_tree,
    tree_files,
)
from tests.fixtures.sshd import free_port  # reserved: nobody takes it before the server binds

ACC_DEFAULT_LINE = "            default=ServerArgs.speculative_accept_threshold_acc,\n"
ACC_FLAG_LINE = '            "--speculative-accept-threshold-acc",\n'
ACC_FIELD_LINE = "    speculative_accept_threshold_acc: float = 1.0\n"
ACC_CALL_END = ACC_DEFAULT_LINE + "        )\n"
NEW_FIELD = "    speculative_disable_batch_threshold: Optional[int] = None\n"
NEW_CALL = """\
        parser.add_argument(
            "--speculative-disable-batch-threshold",
            type=int,
            default=ServerArgs.speculative_disable_batch_threshold,
            help="Disable speculation when decode batch size exceeds this threshold.",
        )
"""


def http(
    url: str,
    *,
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
    method: str | None = None,
) -> tuple[int, bytes]:
    """One request; HTTP errors are answers too (status, body)."""
    req = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    stdout: Path
    stderr: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        return http(self.base + path, headers=headers)

    def post_json(self, path: str, obj: object) -> tuple[int, bytes]:
        body = json.dumps(obj).encode()
        return http(self.base + path, data=body, headers={"Content-Type": "application/json"})

    def info(self, headers: dict[str, str] | None = None) -> dict[str, object]:
        status, body = self.get("/get_server_info", headers)
        assert status == 200, body
        return json.loads(body)

    def first_health(self, deadline: float = 5.0) -> int:
        """The status of the first /health answer (polling through connection refused)."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            assert self.proc.poll() is None, self.stderr.read_text()
            try:
                return self.get("/health")[0]
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.02)
        raise AssertionError(f"no answer on port {self.port}")

    def wait_healthy(self, deadline: float = 10.0) -> None:
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if self.first_health(deadline) == 200:
                return
            time.sleep(0.05)
        raise AssertionError(f"never healthy: {self.stderr.read_text()}")


Starter = Callable[..., Server]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Starter]:
    """Start stand-in servers from a tree copy; every one is killed at teardown."""
    started: list[subprocess.Popen[bytes]] = []

    def _start(
        dest: Path | None = None,
        extra: Sequence[str] = (),
        env: dict[str, str] | None = None,
        healthy: bool = True,
    ) -> Server:
        dest = dest or tmp_path / f"tree{len(started)}"
        if not dest.exists():
            make_tree(dest)
        port = free_port()
        out = tmp_path / f"server{len(started)}.out"
        err = tmp_path / f"server{len(started)}.err"
        full_env = {**os.environ, **launch_env(dest), ENV_STARTUP_DELAY: "0", **(env or {})}
        with out.open("wb") as o, err.open("wb") as e:
            proc = subprocess.Popen(
                launch_argv(sys.executable, dest, port=port, extra=extra),
                stdout=o,
                stderr=e,
                env=full_env,
                cwd=tmp_path,
            )
        started.append(proc)
        server = Server(proc, port, out, err)
        if healthy:
            server.wait_healthy()
        return server

    yield _start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def run_to_exit(
    dest: Path, extra: Sequence[str] = (), timeout: float = 20
) -> tuple[int, str, float]:
    """Run a copy that is expected to end by itself: (exit code, stderr, seconds)."""
    tic = time.monotonic()
    done = subprocess.run(
        launch_argv(sys.executable, dest, port=free_port(), extra=extra),
        env={**os.environ, **launch_env(dest)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done.returncode, done.stderr, time.monotonic() - tic


def patch_file(path: Path, anchor: str, insert: str, *, before: bool = False) -> None:
    text = path.read_text()
    assert text.count(anchor) == 1, anchor
    path.write_text(text.replace(anchor, insert + anchor if before else anchor + insert))


# ---- start-up, readiness, shutdown --------------------------------------------


def test_starts_503_then_200_serves_and_exits_0_on_sigterm(start: Starter) -> None:
    server = start(env={ENV_STARTUP_DELAY: "1.0"}, healthy=False)
    assert server.first_health() == 503
    assert server.get("/health_generate")[0] == 503
    assert READY_LINE not in server.stdout.read_text()
    server.wait_healthy()
    assert server.get("/health_generate")[0] == 200
    assert server.get("/ping")[0] == 200
    assert READY_LINE in server.stdout.read_text()

    info = server.info()
    assert info["speculative_accept_threshold_acc"] == 1.0
    assert info["port"] == server.port
    assert info["model_path"] == "/models/standin"
    assert info["internal_states"] == [{}]
    assert info["version"] == "0.0.0-standin"
    assert f"--port {server.port}" in str(info["launch_command"])
    assert server.get("/server_info")[0] == 200

    status, body = server.post_json(
        "/generate", {"text": "ping", "sampling_params": {"max_new_tokens": 4}}
    )
    assert status == 200
    out = json.loads(body)
    assert isinstance(out["text"], str) and out["text"]
    assert out["meta_info"]["completion_tokens"] == 4
    assert out["meta_info"]["prompt_tokens"] == 1

    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0


def test_sigint_also_exits_0(start: Starter) -> None:
    server = start()
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(timeout=5) == 0


def test_never_ready_keeps_health_503(start: Starter) -> None:
    server = start(env={ENV_NEVER_READY: "1"}, healthy=False)
    assert server.first_health() == 503
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        assert server.get("/health")[0] == 503
        time.sleep(0.1)
    assert server.get("/ping")[0] == 503
    assert server.get("/get_server_info")[0] == 200  # the process is up, just never healthy
    assert READY_LINE not in server.stdout.read_text()
    assert server.proc.poll() is None


def test_ignore_sigterm_needs_sigkill(start: Starter) -> None:
    server = start(env={ENV_IGNORE_SIGTERM: "1"})
    server.proc.send_signal(signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        server.proc.wait(timeout=0.7)
    assert server.get("/health")[0] == 200
    server.proc.kill()
    assert server.proc.wait(timeout=5) == -signal.SIGKILL


# ---- what a patch does to it --------------------------------------------------


@pytest.mark.parametrize(
    ("anchor", "message"),
    [
        # the story: the new call landed between the previous call's default= line and its ")"
        (ACC_DEFAULT_LINE, "SyntaxError"),
        # a naive "insert after the anchor line" right after the flag's name
        (ACC_FLAG_LINE, "SyntaxError: invalid syntax. Perhaps you forgot a comma?"),
    ],
    ids=["inside-call-before-paren", "after-flag-name-line"],
)
def test_insert_inside_a_call_crashes_start_up(tmp_path: Path, anchor: str, message: str) -> None:
    dest = tmp_path / "tree"
    root = make_tree(dest)
    patch_file(root / "srt" / "server_args.py", anchor, NEW_CALL)
    code, stderr, _ = run_to_exit(dest)
    assert code == 1, stderr
    assert message in stderr
    assert "server_args.py" in stderr


def test_unknown_flag_exits_2(tmp_path: Path) -> None:
    dest = tmp_path / "tree"
    make_tree(dest)
    code, stderr, _ = run_to_exit(dest, ["--foo", "3"])
    assert code == 2
    assert "error: unrecognized arguments: --foo 3" in stderr


def test_a_correct_patch_adds_a_flag_reported_by_server_info(
    tmp_path: Path, start: Starter
) -> None:
    dest = tmp_path / "patched"
    root = make_tree(dest)
    server_args = root / "srt" / "server_args.py"
    patch_file(server_args, ACC_FIELD_LINE, NEW_FIELD)
    patch_file(server_args, ACC_CALL_END, NEW_CALL)

    server = start(dest, extra=["--speculative-disable-batch-threshold", "32"])
    info = server.info()
    assert info["speculative_disable_batch_threshold"] == 32
    assert info["speculative_accept_threshold_acc"] == 1.0

    # the unpatched tree refuses the same flag, like an unpatched SGLang
    clean = tmp_path / "clean"
    make_tree(clean)
    code, stderr, _ = run_to_exit(clean, ["--speculative-disable-batch-threshold", "32"])
    assert code == 2 and "unrecognized arguments" in stderr


# ---- the HTTP surface ---------------------------------------------------------


def test_endpoints_answer_like_sglang(start: Starter) -> None:
    server = start(extra=["--tp", "8", "--speculative-algorithm", "EAGLE"])
    info = server.info()
    assert info["tp_size"] == 8
    assert info["speculative_num_steps"] == 3  # resolved by __post_init__, like SGLang

    status, body = server.get("/get_model_info")
    assert status == 200
    model = json.loads(body)
    assert model["model_path"] == "/models/standin" and model["is_generation"] is True

    status, body = server.get("/v1/models")
    assert status == 200 and json.loads(body)["data"][0]["id"] == "/models/standin"

    status, body = server.post_json(
        "/generate", {"text": "a b c", "sampling_params": {"max_new_tokens": 8}}
    )
    meta = json.loads(body)["meta_info"]
    assert status == 200 and meta["completion_tokens"] == 8 and meta["prompt_tokens"] == 3
    assert meta["spec_verify_ct"] == 2  # 8 tokens, 4 per verify step

    status, body = server.post_json(
        "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    )
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 2

    assert http(server.base + "/generate", data=b"{not json", method="POST")[0] == 400
    assert server.post_json("/generate", {"sampling_params": {}})[0] == 400
    assert server.get("/nowhere")[0] == 404
    assert server.get("/generate")[0] == 405
    assert server.get("/flush_cache")[0] == 200
    assert http(server.base + "/flush_cache", data=b"", method="POST")[0] == 200
    assert '"POST /generate HTTP/1.1" 400' in server.stderr.read_text()


def test_api_key_guards_all_but_health(start: Starter) -> None:
    server = start(extra=["--api-key", "s3cret"])
    assert server.get("/health")[0] == 200
    assert server.get("/health_generate")[0] == 200
    assert server.get("/get_server_info")[0] == 401
    assert server.get("/get_server_info", {"Authorization": "Bearer wrong"})[0] == 401
    assert server.info({"Authorization": "Bearer s3cret"})["api_key"] == "s3cret"


# ---- the tree itself ------------------------------------------------------------


def test_make_tree_copies_a_clean_runnable_tree(tmp_path: Path, start: Starter) -> None:
    dest = tmp_path / "copy"
    root = make_tree(dest)
    assert root == dest / "python" / "sglang"
    copied = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert copied == sorted(rel for rel, _ in tree_files())
    assert {"python/sglang/launch_server.py", "python/sglang/srt/server_args.py"} <= set(copied)
    assert launch_env(dest)["PYTHONPATH"] == str(dest / "python")
    assert launch_argv("py", dest, port=1234, extra=["--tp", "2"]) == [
        "py",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/standin",
        "--port",
        "1234",
        "--tp",
        "2",
    ]
    server = start(dest)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=5) == 0
    assert not list(dest.rglob("__pycache__"))  # the copy stays exactly what was written


def test_tree_is_stdlib_only_python38_source() -> None:
    files = sorted(TREE.rglob("*.py"))
    assert len(files) >= 5
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path), feature_version=(3, 8))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top == "sglang" or top in sys.stdlib_module_names, f"{path}: {name}"


def test_server_args_keeps_the_real_0_5_13_layout() -> None:
    text = (TREE / "python" / "sglang" / "srt" / "server_args.py").read_text()
    assert (
        "    speculative_accept_threshold_single: float = 1.0\n"
        "    speculative_accept_threshold_acc: float = 1.0\n"
        "    speculative_token_map: Optional[str] = None\n"
    ) in text
    assert (
        "        parser.add_argument(\n"
        '            "--speculative-accept-threshold-acc",\n'
        "            type=float,\n"
        '            help="The accept probability of a draft token is raised from its target probability p to min(1, p / threshold_acc).",\n'
        "            default=ServerArgs.speculative_accept_threshold_acc,\n"
        "        )\n"
        "        parser.add_argument(\n"
        '            "--speculative-token-map",\n'
        "            type=str,\n"
        '            help="The path of the draft model\'s small vocab table.",\n'
        "            default=ServerArgs.speculative_token_map,\n"
        "        )\n"
    ) in text
    assert text.count("speculative_accept_threshold_acc:") == 1
    assert text.count('"--speculative-accept-threshold-acc"') == 1


# ---- the layouts -----------------------------------------------------------------


@pytest.mark.parametrize("layout", ["annotated", "spec"])
def test_each_layout_is_a_runnable_tree_with_the_same_server_args(
    tmp_path: Path, start: Starter, layout: str
) -> None:
    dest = tmp_path / layout
    make_tree(dest, layout=layout)
    copied = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert copied == sorted(rel for rel, _ in tree_files(layout))
    assert "python/sglang/srt/arg_groups/arg_utils.py" in copied
    assert ("python/sglang/srt/arg_groups/fields/spec.py" in copied) == (layout == "spec")
    classic = start(extra=["--tp-size", "2", "--speculative-accept-threshold-acc", "0.5"]).info()
    server = start(dest, extra=["--tp-size", "2", "--speculative-accept-threshold-acc", "0.5"])
    info = server.info()
    for key in ("version", "launch_command", "random_seed", "port"):
        classic.pop(key), info.pop(key)
    assert info == classic  # the same flags, the same resolved arguments, whatever the layout


@pytest.mark.parametrize("layout", ["classic", "annotated", "spec"])
def test_an_unknown_flag_ends_each_layout_in_argparse(tmp_path: Path, layout: str) -> None:
    dest = tmp_path / layout
    make_tree(dest, layout=layout)
    code, err, _ = run_to_exit(dest, extra=["--speculative-disable-batch-threshold", "8"])
    assert code == 2
    assert "sglang serve: error: unrecognized arguments: --speculative-disable-batch-threshold 8" in err


def test_on_the_annotated_layout_only_an_annotated_field_is_a_flag(tmp_path: Path, start: Starter) -> None:
    dest = tmp_path / "annotated"
    root = make_tree(dest, layout="annotated")
    args = root / "srt" / "server_args.py"
    anchor = '    speculative_token_map: A['
    patch_file(args, anchor, "    speculative_plain: Optional[int] = None\n", before=True)
    code, err, _ = run_to_exit(dest, extra=["--speculative-plain", "3"])
    assert code == 2 and "unrecognized arguments: --speculative-plain 3" in err  # compiles, is no flag
    patch_file(args, anchor, '    speculative_real: A[Optional[int], "A real one."] = None\n', before=True)
    assert start(dest, extra=["--speculative-real", "3"]).info()["speculative_real"] == 3


def test_an_unknown_layout_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown stand-in layout 'modern'"):
        make_tree(tmp_path / "x", layout="modern")
