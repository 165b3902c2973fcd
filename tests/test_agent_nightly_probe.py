"""The helper's nightly ops, its probe, its host facts and its protocol's error paths.

As in ``tests/test_agent.py``: the real helper over the local transport, real files,
real ``git``, a real HTTP server on loopback for the probe. Each test asks the helper
through its protocol and checks what it answered and what it left on disk.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from orchestrator.shell.agent_client import Agent, RemoteStepError


@pytest.fixture
def agent(local_agent: Agent) -> Agent:
    return local_agent


def git(*args: str, cwd: Path) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@x", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@x")
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def a_repo(root: Path) -> tuple[Path, list[str]]:
    """A git repository with two commits; returns it and their ids, oldest first."""
    repo = root / "src"
    repo.mkdir()
    git("init", "-q", cwd=repo)
    commits = []
    for n in (1, 2):
        (repo / "version.txt").write_text(f"{n}\n")
        git("add", "version.txt", cwd=repo)
        git("commit", "-q", "-m", f"v{n}", cwd=repo)
        commits.append(git("rev-parse", "HEAD", cwd=repo))
    return repo, commits


def test_a_night_prepares_its_build_dir_and_lists_builds_current_and_complete_ones(
        agent: Agent, tmp_path: Path) -> None:
    builds = tmp_path / "builds"
    assert agent.call("nightly_builds", builds_dir=str(builds)) == {
        "builds_dir": str(builds), "current": None, "builds": []}
    first = agent.call("nightly_prepare", builds_dir=str(builds), build="n1")
    assert first["build_dir"] == str(builds / "n1") and first["log"] == str(builds / "logs" / "n1.log")
    assert (builds / "logs").is_dir() and not (builds / "n1").exists()
    (builds / "n1").mkdir()
    (builds / "n1" / "manifest.json").write_text(json.dumps({"seq": 7}))
    (builds / "n2").mkdir()
    (builds / "current").symlink_to("n1")

    listed = agent.call("nightly_builds", builds_dir=str(builds))

    assert (listed["current"], listed["builds"], listed["complete"], listed["seqs"]) == (
        "n1", ["n1", "n2"], ["n1"], {"n1": 7})
    with pytest.raises(RemoteStepError) as exists:
        agent.call("nightly_prepare", builds_dir=str(builds), build="n2")
    assert exists.value.kind == "build" and "already exists" in exists.value.message
    with pytest.raises(RemoteStepError) as bad:
        agent.call("nightly_prepare", builds_dir=str(builds), build="../escape")
    assert bad.value.kind == "build" and "not a build name" in bad.value.message


def test_a_night_checks_out_exactly_the_commit_from_a_cached_mirror(agent: Agent, tmp_path: Path) -> None:
    repo, (old, new) = a_repo(tmp_path)
    builds = tmp_path / "builds"
    log = tmp_path / "night.log"
    agent.call("nightly_prepare", builds_dir=str(builds), build="b1")

    got = agent.call("nightly_fetch_git", repo=str(repo), commit=old, builds_dir=str(builds), build="b1",
                     log=str(log))

    assert got["commit"] == old and Path(got["cache"]).is_dir()
    assert (builds / "b1" / "version.txt").read_text() == "1\n"
    assert "$ git clone --mirror" in log.read_text()
    # the next night fetches into the cache it already has
    again = agent.call("nightly_fetch_git", repo=str(repo), commit=new, builds_dir=str(builds), build="b2",
                       log=str(log))
    assert again["cache"] == got["cache"] and (builds / "b2" / "version.txt").read_text() == "2\n"
    assert "fetch --quiet --prune origin" in log.read_text()
    with pytest.raises(RemoteStepError) as missing:
        agent.call("nightly_fetch_git", repo=str(repo), commit="0" * 40, builds_dir=str(builds), build="b3",
                   log=str(log))
    assert missing.value.kind == "build" and "git -C" in missing.value.message
    assert not (builds / "b3").exists()


def test_a_night_s_install_command_streams_its_output_and_a_failure_brings_its_tail(
        agent: Agent, tmp_path: Path) -> None:
    log = tmp_path / "install.log"
    events: list[dict] = []
    ok = agent.call("nightly_run", argv=["sh", "-c", "echo one; echo two"], cwd=str(tmp_path), log=str(log),
                    env={"X": "1"}, on_event=events.append)
    assert ok == {"rc": 0, "tail": ["one", "two"]}
    assert [e["msg"] for e in events if e.get("stream") == "build"] == ["one", "two"]
    assert log.read_text() == "$ sh -c echo one; echo two\none\ntwo\n"

    with pytest.raises(RemoteStepError) as failed:
        agent.call("nightly_run", argv=["sh", "-c", "echo building; echo broke >&2; exit 4"], cwd=str(tmp_path))
    assert failed.value.kind == "build" and "exited 4" in failed.value.message
    assert failed.value.details["log_tail"] == ["building", "broke"] and failed.value.details["rc"] == 4

    with pytest.raises(RemoteStepError) as slow:
        agent.call("nightly_run", argv=["sleep", "60"], cwd=str(tmp_path), timeout=0.5)
    assert "timed out after 0.5s" in slow.value.message
    with pytest.raises(RemoteStepError) as absent:
        agent.call("nightly_run", argv=["/nonexistent/tool"], cwd=str(tmp_path))
    assert "cannot run /nonexistent/tool" in absent.value.message


def test_removing_and_pruning_builds_never_touch_the_current_one(agent: Agent, tmp_path: Path) -> None:
    builds = tmp_path / "builds"
    (builds / "logs").mkdir(parents=True)
    for name in ("old1", "old2", "live", "half"):
        (builds / name).mkdir()
        (builds / "logs" / f"{name}.log").write_text("log\n")
    (builds / "current").symlink_to("live")

    with pytest.raises(RemoteStepError) as refused:
        agent.call("nightly_remove_build", builds_dir=str(builds), build="live")
    assert "current points to it" in refused.value.message
    assert agent.call("nightly_remove_build", builds_dir=str(builds), build="half") is True
    assert agent.call("nightly_remove_build", builds_dir=str(builds), build="half") is False
    assert agent.call("nightly_prune", builds_dir=str(builds), remove=["old1", "live", "gone", "old2"]) == [
        "old1", "old2"]
    assert sorted(p.name for p in builds.iterdir()) == ["current", "live", "logs"]
    assert sorted(p.name for p in (builds / "logs").iterdir()) == ["half.log", "live.log"]


def test_the_link_switch_is_a_compare_and_swap(agent: Agent, tmp_path: Path) -> None:
    link = tmp_path / "current"
    assert agent.call("nightly_link_swap", link=str(link), to="b1", expect=None) == {"changed": True, "was": None}
    assert os.readlink(link) == "b1"
    with pytest.raises(RemoteStepError) as moved:
        agent.call("nightly_link_swap", link=str(link), to="b2", expect="b0")
    assert moved.value.kind == "switch" and "points to b1, expected b0" in moved.value.message
    assert agent.call("nightly_link_swap", link=str(link), to="b2", expect="b1") == {"changed": True, "was": "b1"}
    assert agent.call("nightly_link_swap", link=str(link), to="b2", expect="b1") == {"changed": False, "was": "b2"}
    assert agent.call("nightly_link_swap", link=str(link), to=None, expect="b2") == {"changed": True, "was": "b2"}
    assert not link.is_symlink()
    plain = tmp_path / "plain"
    plain.write_text("a file, not a link\n")
    with pytest.raises(RemoteStepError) as not_link:
        agent.call("nightly_link_swap", link=str(plain), to="b1", expect=None)
    assert "is not a symlink" in not_link.value.message


class Model(BaseHTTPRequestHandler):
    """A stand-in completion endpoint: ``/ok`` answers with usage, others fail in their way."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/ok":
            reply = {"text": "hello " + str(body.get("n", "")), "usage": {"completion_tokens": 3}}
            self._answer(200, json.dumps(reply).encode())
        elif self.path == "/sglang":
            self._answer(200, json.dumps([{"meta_info": {"completion_tokens": 5}}, {"x": 1}]).encode())
        elif self.path == "/text":
            self._answer(200, b"not json")
        else:
            self._answer(503, b"{}")

    def _answer(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def model() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Model)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_probe_times_each_request_and_keeps_only_token_counts(agent: Agent, model: str) -> None:
    events: list[dict] = []
    got = agent.call("probe_http", base_url=model + "/", path="/ok", body={"n": 1}, requests=5, concurrency=2,
                     timeout=30.0, warmup=2, greedy_body={"n": 2}, headers={"X-Test": "1"},
                     on_event=events.append)

    assert len(got["samples"]) == 5
    assert all(s["status"] == 200 and s["error"] is None for s in got["samples"])
    assert all(s["tokens"] == {"usage": {"completion_tokens": 3}} for s in got["samples"])
    assert got["greedy"]["doc"]["text"] == "hello 2"
    assert got["duration"] >= max(s["latency"] for s in got["samples"])
    assert any("2 warm-up request(s)" in str(e.get("msg")) for e in events)


@pytest.mark.parametrize(("path", "error", "tokens"), [
    ("/fail", "HTTP 503", None),
    ("/text", "the answer is not JSON", None),
    ("/sglang", None, {"meta_info": [{"completion_tokens": 5}]}),
])
def test_the_probe_records_each_kind_of_answer(agent: Agent, model: str, path: str, error: str | None,
                                               tokens: dict | None) -> None:
    got = agent.call("probe_http", base_url=model, path=path, body=None, requests=2, concurrency=4, timeout=30.0)
    assert [(s["error"], s["tokens"]) for s in got["samples"]] == [(error, tokens)] * 2
    assert got["greedy"] is None


def test_the_probe_names_a_server_that_does_not_answer(agent: Agent) -> None:
    got = agent.call("probe_http", base_url="http://127.0.0.1:1", path="/x", body={}, requests=1,
                     concurrency=1, timeout=5.0)
    [sample] = got["samples"]
    assert sample["status"] is None and "refused" in sample["error"].lower()


def test_read_host_fills_facts_into_paths_and_follows_imports_that_mention_the_names(
        agent: Agent, tmp_path: Path) -> None:
    pkg = tmp_path / "site" / "srvpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "args.py").write_text("from srvpkg.fields import Fields\nfrom srvpkg.other import Other\n")
    (pkg / "fields.py").write_text("class Fields:\n    max_batch = 1\n")
    (pkg / "other.py").write_text("class Other:\n    pass\n")
    env_path = str(tmp_path / "site")
    marker = "\x00orch-fact:packages.srvpkg.path\x00/args.py"

    # the facts come from the server's interpreter with its environment: here, this python with PYTHONPATH
    shim = tmp_path / "python3"
    shim.write_text(f"#!/bin/sh\nPYTHONPATH={env_path} exec {sys.executable} \"$@\"\n")
    shim.chmod(0o755)
    got = agent.call("read_host", paths=[marker, str(tmp_path / "absent.py")], packages=["srvpkg", "nope"],
                     python=str(shim), follow=[{"index": 0, "names": ["max_batch"]}, {"index": 1, "names": ["x"]}])

    assert got["facts"]["packages"] == {"srvpkg": {"path": str(pkg), "version": None}}
    assert got["paths"] == [str(pkg / "args.py"), str(tmp_path / "absent.py")]
    assert [f["exists"] for f in got["files"]] == [True, False]
    assert [c["path"] for c in got["companions"]["0"]] == [str(pkg / "fields.py")]
    assert "1" not in got["companions"] and got["server"] is None

    broken = agent.call("read_host", paths=[], packages=["srvpkg"], python="/nonexistent/python")
    assert broken["facts"]["packages"] == {} and broken["facts"]["error"]


def test_preflight_returns_the_parser_s_own_error_line(agent: Agent, tmp_path: Path) -> None:
    parser = "import argparse; p = argparse.ArgumentParser(prog='srv'); p.add_argument('--tp'); p.parse_args()"
    ok = agent.call("preflight", argv=[sys.executable, "-c", parser, "--tp", "2"], cwd=str(tmp_path))
    assert ok["rc"] == 0 and ok["error_line"] is None
    bad = agent.call("preflight", argv=[sys.executable, "-c", parser, "--pt", "2"], env={"A": "1"})
    assert bad["rc"] == 2 and bad["message"] == "unrecognized arguments: --pt 2"
    assert bad["error_line"] == "srv: error: unrecognized arguments: --pt 2"
    exact = agent.call("preflight", argv=[sys.executable, "-c", "import os; print(sorted(os.environ))"],
                       env={"ONLY": "1"}, replace_env=True)
    assert exact["rc"] == 0 and "'ONLY'" in exact["stdout"] and "'PATH'" not in exact["stdout"]
    missing = agent.call("preflight", argv=["/nonexistent/srv"], env={}, replace_env=True)
    assert missing["rc"] == 127 and "cannot run /nonexistent/srv" in missing["stderr"]


def test_an_unknown_op_or_bad_arguments_fail_that_request_and_the_helper_serves_on(agent: Agent) -> None:
    with pytest.raises(RemoteStepError) as unknown:
        agent.call("no_such_op")
    assert unknown.value.kind == "protocol" and "unknown op 'no_such_op'" in unknown.value.message
    with pytest.raises(RemoteStepError) as wrong:
        agent.call("sha256", files=["x"])
    # refused by its protocol type before anything runs, in one line naming the op and the field
    assert wrong.value.kind == "protocol" and wrong.value.message == "op 'sha256': unknown field 'files'"
    with pytest.raises(RemoteStepError) as missing:
        agent.call("sha256")
    assert missing.value.kind == "protocol" and missing.value.message == "op 'sha256': missing field 'paths'"
    with pytest.raises(RemoteStepError) as batch:
        agent.call("batch", steps=[{"op": "hello"}, {"op": "nightly_builds", "args": {"builds_dir": 5}}])
    assert batch.value.kind == "internal" and batch.value.details["step"] == 1
    assert len(batch.value.details["done"]) == 1
    with pytest.raises(RemoteStepError) as inner:
        agent.call("batch", steps=[{"op": "hello"}, {"op": "nope"}])
    assert inner.value.kind == "protocol" and inner.value.message == "batch.steps[1]: unknown op 'nope'"
    assert "done" not in inner.value.details  # nothing of a bad batch ran
    assert agent.call("hello")["pid"] > 0  # still serving
