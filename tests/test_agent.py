"""orch's host-side helper, driven over the local transport (real processes, real files)."""

from __future__ import annotations

import ast
import base64
import fcntl
import glob
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from orchestrator.core.kept import Kept
from orchestrator.core.target import HostTarget
from orchestrator.errors import LinkLostError, OrchError
from orchestrator.shell.agent_client import (
    BOOTSTRAP,
    Agent,
    RemoteStepError,
    helper_archive,
    helper_id,
    shipped_archive,
)
from orchestrator.shell.transport import open_transport
from tests.fixtures.sandbox import wait_until

# GPU boxes run old Pythons: the helper must run on whatever python3 (3.8+) they have.
PYENV = glob.glob("/root/.pyenv/versions/3.*/bin/python3")
INTERPRETERS = sorted({sys.executable, *(p for p in PYENV if not re.search(r"/3\.[67]\.", p))})
"""The hosts' Pythons the helper runs on: 3.8 and newer (the host package's floor)."""
TOO_OLD = sorted(p for p in PYENV if re.search(r"/3\.[67]\.", p))


def start(python: str = sys.executable) -> Agent:
    transport = open_transport(HostTarget(name="local", connection="local", python=python))
    transport.connect()
    return Agent(transport, python=python).start()


HOST = Path(__file__).resolve().parent.parent / "orchestrator" / "host"


@pytest.mark.parametrize("module", sorted(p.name for p in HOST.glob("*.py")))
def test_each_host_module_is_python_3_8_stdlib_only_small_and_stateless(module: str) -> None:
    """The host package runs where orch is not installed, on the box's own Python: 3.8
    syntax, the standard library and its own modules only, no module over 600 lines, no
    ``global`` (the session is passed to every op, so nothing lives at module level)."""
    source = (HOST / module).read_text(encoding="utf-8")
    tree = ast.parse(source, feature_version=(3, 8))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
    assert len(source.splitlines()) <= 600
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Global | ast.Nonlocal)]
    mutable = [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
               if isinstance(t, ast.Name) and isinstance(n.value, ast.List | ast.Set | ast.ListComp | ast.SetComp)]
    assert not mutable, f"module-level mutable state: {mutable}"


def test_vermin_finds_nothing_newer_than_3_8_in_the_host_package() -> None:
    run = "import sys, vermin; sys.argv[0] = 'vermin'; sys.exit(vermin.main())"
    out = subprocess.run([sys.executable, "-c", run, "-t=3.8-", "--violations", "--no-tips", str(HOST)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Minimum required versions" in out.stdout, out.stdout + out.stderr


def test_the_helper_archive_is_the_same_bytes_for_the_same_source() -> None:
    """Named by its hash on every host: the same source must give the same archive, whatever
    the files' times, and it holds the package (and its own stub ``orchestrator``) only."""
    import zipfile

    assert helper_archive() == shipped_archive()
    os.utime(HOST / "wire.py")  # a touched file changes no byte of it
    assert helper_archive() == shipped_archive()
    with zipfile.ZipFile(io.BytesIO(shipped_archive())) as z:
        infos = z.infolist()
    names = [i.filename for i in infos]
    assert names == ["orchestrator/__init__.py"] + sorted(f"orchestrator/host/{p.name}" for p in HOST.glob("*.py"))
    assert {(i.date_time, i.external_attr >> 16, i.compress_type) for i in infos} == {
        ((1980, 1, 1, 0, 0, 0), 0o100644, zipfile.ZIP_DEFLATED)}


def test_a_fleet_s_workers_asking_at_once_build_the_archive_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every worker of a fleet asks for the helper's id as its host starts; the first builds
    the archive, the others wait for it (25 builds cost a 25-host run 0.4 s of CPU)."""
    from orchestrator.shell import agent_client

    builds: list[int] = []
    ready = threading.Barrier(8)

    def slow_build() -> bytes:
        builds.append(1)
        time.sleep(0.2)  # long enough that, without the lock, the others start their own
        return b"archive"

    monkeypatch.setattr(agent_client, "helper_archive", slow_build)
    monkeypatch.setattr(agent_client, "_ARCHIVE", Kept(1))  # put back after: the next caller has the real one
    got: list[bytes] = []
    workers = [threading.Thread(target=lambda: (ready.wait(), got.append(shipped_archive())))
               for _ in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    assert got == [b"archive"] * 8
    assert len(builds) == 1


def test_the_helper_id_names_the_source_and_builds_no_archive(monkeypatch: pytest.MonkeyPatch) -> None:
    """A start on a host that keeps this helper needs only its id: building (compressing) the
    archive for it cost every run 15 ms of CPU. The id still changes with any member's name or bytes."""
    from orchestrator.shell import agent_client

    def no_build() -> bytes:
        raise AssertionError("the archive was built for the id")

    monkeypatch.setattr(agent_client, "helper_archive", no_build)
    monkeypatch.setattr(agent_client, "_ARCHIVE", Kept(1))  # nothing built yet
    name_id = agent_client.helper_id.__wrapped__
    assert name_id() == helper_id() and len(helper_id()) == 16
    members = agent_client.helper_members()
    changed = [members[:-1] + ((members[-1][0], members[-1][1] + b"\n"),),  # one byte more
               members[:-1] + ((members[-1][0] + "x", members[-1][1]),),  # another name
               members[:-1]]  # one member fewer
    for other in changed:
        monkeypatch.setattr(agent_client, "helper_members", lambda other=other: other)
        assert name_id() != helper_id()


def test_a_helper_sent_as_an_archive_runs_from_memory_under_its_package_s_file_names() -> None:
    """No kept copy: the bootstrap imports the package from the archive's bytes, and each
    module's code is named ``orchestrator/host/<module>.py`` (what coverage maps back)."""
    shown = ("import orchestrator.host.main as m, orchestrator.host.files as f\n"
             "print(m.main.__code__.co_filename, f.write_atomic.__code__.co_filename)\n")
    script = BOOTSTRAP.replace("main(archive, (sys.argv[1], sys.argv[2]))\n", shown)
    assert script != BOOTSTRAP
    out = subprocess.run([sys.executable, "-c", script, "", "0" * 16], input=base64.b64encode(shipped_archive()) + b"\n",
                         capture_output=True, timeout=60, env={"PATH": os.environ["PATH"]})
    lines = out.stdout.decode().splitlines()
    assert lines[0] == '{"send": true}', out
    assert lines[1].split() == ["orchestrator/host/main.py", "orchestrator/host/files.py"], out


def test_the_helper_runs_no_site_hook_of_the_host_python_unless_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper starts with ``python -S``: a ``.pth`` hook in the host Python's
    site-packages (a venv's, made here) is not run at its start; with ``ORCH_HELPER_SITE=1``
    in the host's environment it is (what the suite's coverage uses)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=120)
    python = str(tmp_path / "venv" / "bin" / "python")
    site_dir = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"],
                              capture_output=True, text=True, check=True).stdout.strip()
    assert site_dir.startswith(str(tmp_path)), site_dir
    mark = tmp_path / "ran"
    (Path(site_dir) / "orch_test_hook.pth").write_text(
        "import os; open(os.environ['ORCH_TEST_PTH_MARK'], 'a').write('ran\\n')\n")
    monkeypatch.setenv("ORCH_TEST_PTH_MARK", str(mark))
    monkeypatch.delenv("ORCH_HELPER_SITE", raising=False)
    agent = start(python)
    try:
        assert agent.call("hello")["python"]
    finally:
        agent.close()
    assert not mark.exists(), "the host's site hook ran in the helper"
    monkeypatch.setenv("ORCH_HELPER_SITE", "1")
    start(python).close()
    assert mark.read_text().startswith("ran\n")  # ``site.main()`` after ``-S`` reads a venv's .pth twice


def test_a_module_in_the_login_s_home_does_not_shadow_the_standard_library(tmp_path: Path) -> None:
    """The helper starts in the login's home with ``python -c``, which puts that directory
    first on ``sys.path``: a ``json.py`` left there (or ``zipfile.py``, ``random.py``) would
    be imported in place of the standard library's. The bootstrap drops it."""
    for name in ("json", "zipfile", "base64", "fcntl", "random", "socket"):
        (tmp_path / f"{name}.py").write_text("raise SystemExit('the home directory shadowed %s' % __name__)\n")
    shown = "import orchestrator.host.main, json, random, socket\nprint(json.__file__ != None, 'ok')\n"
    script = BOOTSTRAP.replace("main(archive, (sys.argv[1], sys.argv[2]))\n", shown)
    out = subprocess.run([sys.executable, "-S", "-c", script, "", "0" * 16], cwd=tmp_path,
                         input=base64.b64encode(shipped_archive()) + b"\n", capture_output=True, timeout=60,
                         env={"PATH": os.environ["PATH"]})
    assert out.stdout.decode().splitlines() == ['{"send": true}', "True ok"], out


@pytest.mark.parametrize("python", TOO_OLD)
def test_a_host_python_older_than_3_8_is_refused_in_one_line(python: str) -> None:
    with pytest.raises(OrchError) as refused:
        start(python)
    said = str(refused.value)
    assert "orch's helper needs 3.8 or newer" in said and python in said, said
    assert "Traceback" not in said and "SyntaxError" not in said, said


@pytest.mark.parametrize("python", INTERPRETERS)
def test_stage_validate_commit_on_each_interpreter(python: str, tmp_path: Path) -> None:
    target = tmp_path / "mod.py"
    target.write_text("x = 1\n")
    os.chmod(target, 0o640)
    agent = start(python)
    try:
        data = base64.b64encode(b"x = 2\n").decode()
        staged = agent.call("stage", files=[{"path": str(target), "data": data}], token="t")[0]
        results = agent.call("validate", checks=[{"target": str(target), "argvs": [["python-syntax"]],
                                                  "python": python}], token="t")
        assert results[0]["rc"] == 0, results
        before = hashlib.sha256(b"x = 1\n").hexdigest()
        agent.call("commit", files=[{"path": str(target), "staged": staged["staged"], "before": before,
                                     "after": staged["sha256"]}])
    finally:
        agent.close()
    assert target.read_text() == "x = 2\n"
    assert target.stat().st_mode & 0o7777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mod.py"]


def test_validation_failure_names_the_target_and_cleans_up_only_its_own(tmp_path: Path) -> None:
    """The clean-up removes the staged copy's own bytecode, never a file or a
    directory someone else made in the directory while the validator ran."""
    target = tmp_path / "mod.py"
    target.write_text("x = 1\n")
    agent = start()
    try:
        ok = base64.b64encode(b"x = 2\n").decode()
        staged = agent.call("stage", files=[{"path": str(target), "data": ok}], token="t")[0]
        # a validator that compiles the staged copy (bytecode derived from its name) while a
        # colleague writes notes and a checkpoint directory beside it
        meanwhile = (f"import pathlib, py_compile; d = pathlib.Path({str(tmp_path)!r}); "
                     f"py_compile.compile({staged['staged']!r}); (d / 'notes.txt').write_text('mine'); "
                     f"(d / 'ckpt').mkdir(); (d / 'ckpt' / 'step-1').write_text('weights')")
        res = agent.call("validate", checks=[{"target": str(target), "argvs": [
            [sys.executable, "-c", meanwhile]]}], token="t")
        assert res[-1]["rc"] == 0, res
        bad = base64.b64encode(b"x = (\n").decode()
        agent.call("stage", files=[{"path": str(target), "data": bad}], token="u")
        failed = agent.call("validate", checks=[{"target": str(target), "argvs": [["python-syntax"]]}],
                            token="u", keep_staged=False)
        agent.call("remove", paths=[staged["staged"]])
    finally:
        agent.close()
    assert failed[-1]["rc"] == 1
    assert failed[-1]["stdout"].startswith(f"{target}:1: SyntaxError:")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "mod.py", "notes.txt"]
    assert (tmp_path / "ckpt" / "step-1").read_text() == "weights"


def test_commit_refuses_a_file_that_reads_back_wrong(tmp_path: Path) -> None:
    target = tmp_path / "f.txt"
    target.write_text("old\n")
    agent = start()
    try:
        staged = agent.call("stage", files=[{"path": str(target), "data": base64.b64encode(b"new\n").decode()}],
                            token="t")[0]
        with pytest.raises(RemoteStepError) as err:
            agent.call("commit", files=[{"path": str(target), "staged": staged["staged"],
                                         "before": hashlib.sha256(b"old\n").hexdigest(), "after": "0" * 64}])
    finally:
        agent.close()
    assert err.value.kind == "commit" and "planned" in err.value.message


def test_commit_is_a_compare_and_swap_on_the_planned_content(tmp_path: Path) -> None:
    """A file edited by hand after it was planned is never overwritten: the commit writes nothing."""
    one, two = tmp_path / "one.txt", tmp_path / "two.txt"
    one.write_text("old 1\n")
    two.write_text("old 2\n")
    agent = start()
    try:
        staged = agent.call("stage", token="t", files=[
            {"path": str(p), "data": base64.b64encode(b"new\n").decode()} for p in (one, two)])
        two.write_text("a colleague's edit\n")  # after planning, before the commit
        with pytest.raises(RemoteStepError) as err:
            agent.call("commit", files=[
                {"path": str(p), "staged": s["staged"], "before": hashlib.sha256(old).hexdigest(),
                 "after": s["sha256"]}
                for p, s, old in zip((one, two), staged, (b"old 1\n", b"old 2\n"), strict=True)])
    finally:
        agent.close()
    assert err.value.kind == "changed" and str(two) in err.value.message
    assert one.read_text() == "old 1\n" and two.read_text() == "a colleague's edit\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.txt", "two.txt"]  # staged copies removed


def test_commit_follows_a_symlink_and_keeps_it(tmp_path: Path) -> None:
    real = tmp_path / "real.py"
    real.write_text("x = 1\n")
    link = tmp_path / "link.py"
    link.symlink_to(real)
    agent = start()
    try:
        staged = agent.call("stage", files=[{"path": str(link), "data": base64.b64encode(b"x = 2\n").decode()}],
                            token="t")[0]
        assert Path(staged["staged"]).parent == real.parent and staged["real"] == str(real)
        agent.call("commit", files=[{"path": str(link), "staged": staged["staged"],
                                     "before": hashlib.sha256(b"x = 1\n").hexdigest(), "after": staged["sha256"]}])
    finally:
        agent.close()
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() == "x = 2\n"


def test_health_wait_fails_at_once_when_the_server_exits(tmp_path: Path) -> None:
    agent = start()
    log = tmp_path / "server.log"
    try:
        started = agent.call("server_start", argv=[sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"],
                             log=str(log))
        with pytest.raises(RemoteStepError) as err:
            agent.call("health_wait", base_url="http://127.0.0.1:9", timeout=600.0, interval=0.1,
                       checks=[{"method": "GET", "path": "/health"}], pid=started["pid"], log=str(log))
    finally:
        agent.close()
    # the exit was seen (not the 600 s health timeout)
    assert err.value.kind == "server_exited" and "code 3" in err.value.message
    assert err.value.details["log_tail"] == ["boom"]


def test_ctrl_c_cancels_a_long_health_wait_on_the_host() -> None:
    agent = start()
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            agent.call("health_wait", base_url="http://127.0.0.1:9", timeout=600.0, interval=0.2,
                       checks=[{"method": "GET", "path": "/health"}])
        assert agent.call("hello")["protocol"] == 1  # the helper is free for the rollback
    finally:
        timer.cancel()
        agent.close()


def test_server_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    agent = start()
    try:
        # it says when SIGTERM is ignored: a slow interpreter start (coverage's, a loaded box)
        # must not let the SIGTERM land first
        ready = tmp_path / "ignoring"
        code = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                f"open({str(ready)!r}, 'w').close()\nwhile True: time.sleep(1)")
        started = agent.call("server_start", argv=[sys.executable, "-c", code], log=str(tmp_path / "l"))
        wait_until(ready.exists, "the server to ignore SIGTERM", 60)
        res = agent.call("server_stop", pid=started["pid"], pgid=started["pgid"], stop_timeout=1.0)
    finally:
        agent.close()
    assert res["killed"] is True
    assert not Path(f"/proc/{started['pid']}").exists() or "Z" in Path(f"/proc/{started['pid']}/stat").read_text()


def test_helper_exits_when_the_controller_goes_away() -> None:
    agent = start()
    pid = agent.info["pid"]
    assert agent._proc is not None
    agent._proc.close_stdin()
    deadline = time.time() + 10
    while time.time() < deadline and Path(f"/proc/{pid}").exists():
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z":
                break
        except OSError:
            break
        time.sleep(0.05)
    alive = Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]
    agent.close()
    assert not alive
    subprocess.run(["true"])


def test_a_deploy_removes_staged_copies_a_dead_run_left(tmp_path: Path) -> None:
    """Issue 16 item 12: leftovers go at the next deploy whatever their age; a
    copy a live helper holds (a --check under way) stays, whatever its age."""
    target = tmp_path / "mod.py"
    target.write_text("x = 1\n")
    old = tmp_path / ".mod.orch-staged-dead.py"
    old.write_text("x = (\n")  # a dead run's: just made, no helper holds it
    tmp = tmp_path / ".mod.py.orch-tmp-4242"  # a killed helper's temp file (the old pid-named kind)
    tmp.write_text("x = 1\n")
    checking = start()  # a --check under way right now, in another helper
    try:
        data = base64.b64encode(b"x = 3\n").decode()
        checking.call("stage", files=[{"path": str(target), "data": data}], token="running")
        fresh = tmp_path / ".mod.orch-staged-running.py"
        os.utime(fresh, (time.time() - 3600, time.time() - 3600))  # old, but held
        agent = start()
        try:
            data = base64.b64encode(b"x = 2\n").decode()
            agent.call("stage", files=[{"path": str(target), "data": data}], token="new", clean_stale=True)
        finally:
            agent.close()
        assert not old.exists() and not tmp.exists()
        assert fresh.read_text() == "x = 3\n"
        assert (tmp_path / ".mod.orch-staged-new.py").exists()
    finally:
        checking.close()


def test_of_two_take_overs_of_a_stale_lock_exactly_one_wins(tmp_path: Path) -> None:
    """The take-over is a compare-and-swap on the host, not check-then-write."""
    state = tmp_path / "state"
    state.mkdir()
    agents = [start(), start()]
    try:
        for round_ in range(10):
            lock = state / "lock.json"
            lock.unlink(missing_ok=True)
            lock.write_text(json.dumps({"token": f"stale-{round_}", "pid": 1}))
            results: list[bool] = []
            barrier = threading.Barrier(2)

            def take(agent: Agent, barrier: threading.Barrier, token: str, results: list[bool]) -> None:
                barrier.wait()
                got = agent.call("lock_acquire", state_dir=str(state), holder={"pid": os.getpid()},
                                 replace_token=token)
                results.append(bool(got["acquired"]))

            threads = [threading.Thread(target=take, args=(a, barrier, f"stale-{round_}", results))
                       for a in agents]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert sorted(results) == [False, True], (round_, results)
            assert json.loads(lock.read_text())["token"] != f"stale-{round_}"
            for a in agents:
                a.call("lock_release", state_dir=str(state))
            assert not lock.exists()
    finally:
        for a in agents:
            a.close()


def test_after_a_lost_link_no_request_waits_on_it() -> None:
    """A dead link is noticed once: later calls (such as the lock's release) fail at once,
    and closing does not wait for a goodbye nobody can hear."""
    agent = start()
    assert agent._proc is not None
    os.kill(agent.info["pid"], signal.SIGKILL)
    with pytest.raises(LinkLostError):
        agent.call("hello")
    assert agent.dead is not None
    sent = agent.calls
    with pytest.raises(LinkLostError):
        agent.call("lock_release", state_dir="/nonexistent")
    assert agent.calls == sent  # nothing was sent
    agent.close()


@pytest.mark.parametrize("python", INTERPRETERS)
def test_a_host_keeps_the_helper_compiled_and_only_in_a_private_state_dir(
    python: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The first start sends the helper's source and the host keeps a compiled copy in
    its state dir; the next start runs that copy and is sent nothing. A copy in a
    directory someone else could write is never run: the source is sent again."""
    state = tmp_path / "state"

    def start_with_state() -> tuple[bool, dict[str, object]]:
        caplog.clear()
        with caplog.at_level("DEBUG", logger="orchestrator.protocol"):
            transport = open_transport(HostTarget(name="local", connection="local", python=python))
            transport.connect()
            agent = Agent(transport, python=python, state_dir=str(state)).start()
            try:
                root = agent.call("state_init", state_dir=str(state))
                hello = agent.call("hello")
            finally:
                agent.close()
        assert root == str(state)
        sent = any(getattr(r, "orch_dir", "") == "<" and '"send": true' in r.orch_line for r in caplog.records)
        return sent, hello

    assert start_with_state()[0]  # a new host: the archive is sent, then kept once state_init made the dir
    kept = sorted(p.name for p in (state / "helper").iterdir())
    assert kept == [helper_id()], kept
    package = state / "helper" / kept[0] / "orchestrator" / "host"
    assert sorted(p.name for p in package.glob("*.py")) == sorted(p.name for p in HOST.glob("*.py"))
    compiled = {p.name.split(".")[0] for p in (package / "__pycache__").iterdir()}
    assert compiled == {p.stem for p in HOST.glob("*.py")}, "not every module compiled"
    assert (state / "helper").stat().st_mode & 0o777 == 0o700
    assert (state / "helper" / kept[0]).stat().st_mode & 0o777 == 0o700

    sent, hello = start_with_state()
    assert not sent and hello  # the kept copy ran

    os.chmod(state / "helper", 0o770)  # group-writable: not trusted
    assert start_with_state()[0]
    os.chmod(state / "helper", 0o700)
    (state / "helper" / kept[0]).rename(state / "helper" / "0000000000000000")
    (state / "helper" / "orch_helper_1111111111111111.py").write_text("# a single-file helper of an older orch\n")
    assert start_with_state()[0]  # another version's copy is not this helper
    assert sorted(p.name for p in (state / "helper").iterdir()) == kept  # ... and was replaced, old ones gone

    # A helper running from its copy holds it (it imports a module when its op first runs):
    # another version's helper removes only copies nobody holds.
    copy = state / "helper" / kept[0]
    transport = open_transport(HostTarget(name="local", connection="local", python=python))
    transport.connect()
    running = Agent(transport, python=python, state_dir=str(state)).start()
    probe = os.open(copy, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        (state / "helper" / "1111111111111111").mkdir(mode=0o700)  # nobody's: removed
        os.rename(copy, state / "helper" / "2222222222222222")  # held by `running`: an older version's copy
        assert start_with_state()[0]
        assert sorted(p.name for p in (state / "helper").iterdir()) == sorted([kept[0], "2222222222222222"])
        assert running.call("log_tail", path=str(tmp_path / "none")) == []  # ... and it still runs
    finally:
        os.close(probe)
        running.close()


def test_a_watchdog_restores_after_its_kept_copy_is_gone(tmp_path: Path) -> None:
    """The helper imports a module when its op first runs; its watchdog outlives it, and
    a newer orch may replace the kept copy meanwhile: the watchdog has all it may run in
    memory from the fork on."""
    import shutil

    from tests.fixtures.sandbox import wait_until

    state, target = tmp_path / "state", tmp_path / "mod.py"
    target.write_text("new\n")
    transport = open_transport(HostTarget(name="local", connection="local", python=sys.executable))
    transport.connect()
    first = Agent(transport, state_dir=str(state)).start()
    first.call("state_init", state_dir=str(state))
    first.close()
    assert (state / "helper").is_dir()
    release = state / "releases" / "R1"
    (release / "files").mkdir(parents=True)
    (release / "files" / "0.before").write_text("old\n")
    (release / "commit.started").write_text("")
    plan = {"path": str(target), "source": str(release / "files" / "0.before"),
            "sha256": hashlib.sha256(b"old\n").hexdigest(), "expect": hashlib.sha256(b"new\n").hexdigest()}
    (tmp_path / "current").symlink_to("b1")  # a night's restore also switches its link back (nightly.py)
    swap = {"op": "nightly_link_swap", "args": {"link": str(tmp_path / "current"), "to": "b0", "expect": "b1"}}
    (release / "restore.json").write_text(json.dumps({"budget": 3600, "plan": {"files": [plan],
                                                                                "on_success": [swap]}}))
    helper = Agent(transport, state_dir=str(state)).start()  # from its kept copy
    try:
        armed = helper.call("release_arm", state_dir=str(state), release_dir=str(release))
    finally:
        helper.close()
    shutil.rmtree(state / "helper")  # as another version's keep would, once nobody holds it
    # a restore claimed by an (older) controller that has not completed in time: the watchdog acts now
    (release / "claim.json").write_text(json.dumps({"by": "controller", "until": time.time() - 1}))
    wait_until(lambda: (release / "restored.json").exists(), "the watchdog's restore")
    record = json.loads((release / "restored.json").read_text())
    assert record["ok"] and record["by"] == "watchdog", record
    assert target.read_text() == "old\n" and os.readlink(tmp_path / "current") == "b0"
    wait_until(lambda: not Path(f"/proc/{armed['pid']}").exists() or
               Path(f"/proc/{armed['pid']}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", "the watchdog's end")


@pytest.mark.parametrize("text", [b"x = 1\n", b"def f(:\n    pass\n", b"x = (1,\n", b"a = 1\x00\n",
                                  b"\xef\xbb\xbfy = 2\n", b"print 'py2'\n"])
def test_the_syntax_check_answers_alike_in_the_helper_and_in_a_second_interpreter(
    text: bytes, tmp_path: Path
) -> None:
    """The helper checks in its own process when the server's interpreter is its own
    binary; that answer must be the one a second interpreter would have given."""
    from orchestrator.host import processes, staging

    staged = tmp_path / "server_args.py.orch-staged"
    staged.write_bytes(text)
    shown = str(tmp_path / "server_args.py")
    assert staging.is_this_interpreter(sys.executable)
    assert not staging.is_this_interpreter("/bin/sh")
    here = staging.syntax_check(str(staged), shown)
    there = processes.run_argv([sys.executable, "-c", staging.PYTHON_SYNTAX_CHECK, str(staged), shown])
    assert here["rc"] == there["rc"]
    assert here["stdout"] == there["stdout"]
    if here["rc"] and not here["stdout"]:  # died with an exception: the same one is named
        assert here["stderr"].split(":")[0] in there["stderr"]


IMPORTS_TEXT = '''\
"""Doc.

from docs.example import shown_in_a_docstring
"""
from __future__ import annotations
from .import sibling
from . import (a,  # a comment (with parentheses)
               b)
from pkg.mod \\
    import (c,
            d)
import os; from pkg.semi import e
if os.name:
    from pkg.nested import f

def g():
    from ..up import h
'''


@pytest.mark.parametrize("text", [IMPORTS_TEXT, "x = '''\n" + "from x import (a\n" * 300 + "'''\nfrom y import z\n"])
def test_the_helper_finds_every_from_import_a_parse_of_the_whole_module_finds(text: str) -> None:
    """``import_froms`` reads only the lines that can start an import (a no-op's CPU on the
    host): it may also read an import written in a string, never miss a real one, and
    keeps a whole-module walk's outer-first order."""
    from orchestrator.host import facts

    def key(node: ast.ImportFrom) -> tuple[int, str | None, tuple[str, ...]]:
        return (node.level, node.module, tuple(a.name for a in node.names))

    walked = [key(n) for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ImportFrom)]
    found = [key(n) for n in facts.import_froms(text)]
    assert set(walked) <= set(found)
    assert [k for k in found if k in walked] == walked


class _Answers:
    """A real HTTP server on loopback with the answers a health check can meet."""

    def __init__(self) -> None:
        import http.server

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, body: bytes, *extra: tuple[str, str]) -> None:
                self.send_response(code)
                for key, value in extra:
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path == "/ok":
                    self._send(200, b'{"status": "ok"}')
                elif self.path == "/redirect":
                    self._send(302, b"", ("Location", "/ok"))
                elif self.path == "/chunked":
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                     b"5\r\nhello\r\n0\r\n\r\n")
                elif self.path == "/kept-open":  # a server that ignores HTTP/1.0's close
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nopen")
                    self.wfile.flush()
                    time.sleep(3)
                elif self.path == "/trickle":  # an answer that never stops coming, a byte at a time
                    try:
                        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
                        for _ in range(500):
                            self.wfile.write(b".")
                            self.wfile.flush()
                            time.sleep(0.01)
                    except OSError:  # the client gave up: that is the point
                        pass
                else:
                    self._send(404, b"no such page")

            def do_POST(self) -> None:  # noqa: N802
                data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self._send(200, b"echo:" + data + b" type:" + self.headers.get("Content-Type", "").encode())

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"


def test_the_helper_s_plain_http_answers_what_urllib_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Health checks skip urllib's import (30 ms of each host's CPU) for plain http; every
    answer must be urllib's, and what the plain client does not expect goes to urllib."""
    from orchestrator.host import health

    answers = _Answers()
    try:
        cases = [("GET", "/ok", None, {}), ("GET", "/missing", None, {}),
                 ("POST", "/echo", b'{"text": "ping"}', {"Content-Type": "application/json"}),
                 ("GET", "/redirect", None, {}), ("GET", "/chunked", None, {})]
        plain = {path: health.fetch_plain(answers.base + path, m, b, h, 5.0) for m, path, b, h in cases}
        got = {path: health.fetch(answers.base + path, m, b, h, 5.0) for m, path, b, h in cases}
        with monkeypatch.context() as patch:
            patch.setattr(health, "fetch_plain", lambda *args: None)
            by_urllib = {path: health.fetch(answers.base + path, m, b, h, 5.0) for m, path, b, h in cases}
        assert got == by_urllib
        assert got["/ok"] == (200, '{"status": "ok"}') and got["/missing"] == (404, "no such page")
        assert got["/echo"] == (200, 'echo:{"text": "ping"} type:application/json')
        assert got["/redirect"] == got["/ok"] and got["/chunked"] == (200, "hello")
        assert plain["/redirect"] is None and plain["/chunked"] is None  # left to urllib
        assert plain["/ok"] == got["/ok"] and plain["/echo"] == got["/echo"]
        assert health.fetch_plain(answers.base + "/kept-open", "GET", None, {}, 5.0) == (200, "open")
        refused = health.fetch("http://127.0.0.1:9/health", "GET", None, {}, 5.0)
        assert refused[0] is None and "refused" in refused[1]
    finally:
        answers.server.shutdown()


class _Threads:
    """``threading`` for the health module that counts the threads it is asked to start."""

    def __init__(self) -> None:
        self.started = 0

    def Thread(self, *args: object, **kwargs: object) -> threading.Thread:  # noqa: N802 - threading's name
        self.started += 1
        return threading.Thread(*args, **kwargs)  # type: ignore[arg-type]


def test_a_health_request_to_an_address_is_bounded_without_a_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread per request was most of a health poll's CPU on the host. To an address the
    plain client's waits are cut at the deadline instead; a name (whose lookup no timeout
    bounds) and what only urllib reads (a redirect) still get their thread."""
    from orchestrator.host import health

    threads = _Threads()
    monkeypatch.setattr(health, "threading", threads)
    answers = _Answers()
    try:
        assert health.bounded_fetch(answers.base + "/ok", "GET", None, {}, 5.0) == (200, '{"status": "ok"}')
        assert health.bounded_fetch(answers.base + "/missing", "GET", None, {}, 5.0) == (404, "no such page")
        refused = health.bounded_fetch("http://127.0.0.1:9/health", "GET", None, {}, 5.0)
        assert refused[0] is None and "refused" in refused[1]
        assert threads.started == 0
        # an answer that keeps coming, too slowly: cut at the deadline, in the bounded function's words
        assert health.bounded_fetch(answers.base + "/trickle", "GET", None, {}, 0.5) == (
            None, "no complete answer within 0.5 s")
        assert threads.started == 0
        assert health.bounded_fetch(answers.base + "/redirect", "GET", None, {}, 5.0) == (200, '{"status": "ok"}')
        assert threads.started == 1  # urllib follows the redirect, on its thread
        named = answers.base.replace("127.0.0.1", "localhost")
        assert health.bounded_fetch(named + "/ok", "GET", None, {}, 5.0) == (200, '{"status": "ok"}')
        assert threads.started == 2
        assert health.bounded_fetch(named + "/trickle", "GET", None, {}, 0.5) == (
            None, "no complete answer within 0.5 s")
    finally:
        answers.server.shutdown()


def test_only_an_ipv4_address_is_taken_for_one() -> None:
    from orchestrator.host.health import to_an_address

    assert to_an_address("http://127.0.0.1:30000/health") and to_an_address("http://192.0.2.7/x")
    assert to_an_address("http://u@127.0.0.1:1/")  # the user part is urllib's to send; no lookup either way
    for url in ("http://localhost:30000/health", "https://127.0.0.1/health", "http://[::1]:1/",
                "http://127.1:80/", "http://gpu01.example:80/", "http:///nohost"):
        assert not to_an_address(url), url


def test_a_file_planted_at_the_staged_name_is_refused_not_followed(tmp_path: Path) -> None:
    """Issue 16 item 1: the staged copy is created O_EXCL|O_NOFOLLOW; what sits at its name is never written through."""
    target, victim = tmp_path / "mod.py", tmp_path / "victim"
    target.write_text("x = 1\n")
    victim.write_text("secret\n")
    (tmp_path / ".mod.orch-staged-t.py").symlink_to(victim)
    agent = start()
    try:
        with pytest.raises(RemoteStepError) as err:
            agent.call("stage", files=[{"path": str(target), "data": base64.b64encode(b"x = 2\n").decode()}], token="t")
    finally:
        agent.close()
    assert err.value.kind == "planted" and "refused, not followed" in err.value.message
    assert victim.read_text() == "secret\n" and target.read_text() == "x = 1\n"


def test_a_staged_copy_swapped_before_the_commit_is_refused_and_never_renamed(tmp_path: Path) -> None:
    target, victim = tmp_path / "mod.py", tmp_path / "victim"
    target.write_text("x = 1\n")
    victim.write_text("secret\n")
    os.chmod(victim, 0o600)
    agent = start()
    try:
        staged = agent.call("stage", files=[{"path": str(target), "data": base64.b64encode(b"x = 2\n").decode()}],
                            token="t")[0]
        swapped = tmp_path / "swap"
        swapped.symlink_to(victim)
        os.rename(swapped, staged["staged"])  # another user's link in place of the staged copy
        with pytest.raises(RemoteStepError) as err:
            agent.call("commit", files=[{"path": str(target), "staged": staged["staged"],
                                         "before": hashlib.sha256(b"x = 1\n").hexdigest(), "after": staged["sha256"]}])
    finally:
        agent.close()
    assert err.value.kind == "planted" and "replaced by a file orch did not write" in err.value.message
    assert target.read_text() == "x = 1\n" and not target.is_symlink()
    assert victim.read_text() == "secret\n" and victim.stat().st_mode & 0o7777 == 0o600


def test_write_atomic_leaves_no_temp_name_and_keeps_owner_and_mode(tmp_path: Path) -> None:
    """The private temp directory goes once the file is renamed out of it."""
    from orchestrator.host.files import write_atomic

    target = tmp_path / "t.py"
    target.write_text("old\n")
    write_atomic(str(target), b"new\n", 0o640, 1, 1)
    assert target.read_text() == "new\n"
    st = target.stat()
    assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o640, 1, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.py"]


WRITES_SEEN = """
import json, os, sys
from orchestrator.host.files import write_atomic
made = []
sys.addaudithook(lambda event, args: made.append(event) if event == "os.mkdir" else None)
for directory in sys.argv[1:]:
    del made[:]
    write_atomic(os.path.join(directory, "r.json"), b"{}\\n", 0o600)
    print(json.dumps({"mkdirs": len(made), "left": sorted(os.listdir(directory))}))
"""


def test_a_record_in_a_directory_only_orch_s_user_may_write_is_written_beside_it(tmp_path: Path) -> None:
    """In a directory of this user's that nobody else may write (the state dir), the temp
    file is made beside the target: no private directory (``mkdir`` and ``rmdir``, about a
    third of a small record's write). In one others may write, a private directory as
    before; in both, nothing is left beside the file."""
    mine, shared = tmp_path / "mine", tmp_path / "shared"
    mine.mkdir(mode=0o700)
    shared.mkdir()
    shared.chmod(0o777)
    out = subprocess.run([sys.executable, "-c", WRITES_SEEN, str(mine), str(shared)], capture_output=True,
                         text=True, timeout=60, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    seen = [json.loads(line) for line in out.stdout.splitlines()]
    assert seen == [{"mkdirs": 0, "left": ["r.json"]}, {"mkdirs": 1, "left": ["r.json"]}], seen
    assert (mine / "r.json").stat().st_mode & 0o7777 == 0o600


def test_a_write_beside_the_target_that_fails_leaves_nothing_beside_it(tmp_path: Path) -> None:
    from orchestrator.host.files import write_atomic

    home = tmp_path / "mine"
    home.mkdir(mode=0o700)
    (home / "r.json" / "inside").mkdir(parents=True)  # a directory where the record goes: the rename fails
    with pytest.raises(OSError) as failed:
        write_atomic(str(home / "r.json"), b"{}\n", 0o600)
    assert "'r.json'" in str(failed.value)
    assert sorted(p.name for p in home.iterdir()) == ["r.json"]


def test_a_record_is_one_key_a_line_and_reads_back_as_written(tmp_path: Path) -> None:
    from orchestrator.host.files import read_json, write_json

    record = {"z": [1, {"b": 2, "a": None}], "a": "\u00e9", "m": {"y": 1.5, "x": True}}
    write_json(str(tmp_path / "r.json"), record)
    assert read_json(str(tmp_path / "r.json")) == record
    assert (tmp_path / "r.json").read_text() == (
        '{\n "a": "\\u00e9",\n "m": {"x": true, "y": 1.5},\n "z": [1, {"a": null, "b": 2}]\n}\n')
    write_json(str(tmp_path / "e.json"), {})
    write_json(str(tmp_path / "l.json"), [1, 2])
    assert [(tmp_path / n).read_text() for n in ("e.json", "l.json")] == ["{}\n", "[1, 2]\n"]


def test_a_health_request_to_an_address_does_not_load_the_idna_codec() -> None:
    """A str host goes through the ``idna`` codec, whose first use imports three modules
    (about 4 ms of a runner's CPU a release). An ASCII host is given to the resolver as bytes;
    a name that is not ASCII still gets the codec, and an answer. That name is ``¹²7.0.0.1``,
    which the codec's NFKC spells ``127.0.0.1``: the test asks no name server anything."""
    answers = _Answers()
    odd = answers.base.replace("127.0.0.1", "\u00b9\u00b27.0.0.1", 1)  # not ASCII, yet an address
    probe = textwrap.dedent(f"""
        import sys
        from orchestrator.host import health
        print(health.fetch_plain({answers.base + "/ok"!r}, "GET", None, {{}}, 5.0))
        print("encodings.idna" in sys.modules)
        status, why = health.fetch_plain({odd + "/ok"!r}, "GET", None, {{}}, 5.0)
        print(status, "encodings.idna" in sys.modules)
        print(health.lookup_word("127.0.0.1"), health.lookup_word("b\\u00fccher.example"))
        """)
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                             cwd=HOST.parent.parent).stdout.splitlines()
    finally:
        answers.server.shutdown()
    assert out == ["(200, '{\"status\": \"ok\"}')", "False", "200 True", "b'127.0.0.1' bücher.example"]
