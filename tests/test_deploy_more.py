"""More of the safe deploy: the commands manager, mode and owner, Ctrl-C, the
watchdog, secrets, pruning — each over real sshd against the stand-in server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.fixtures.sandbox import Sandbox, cmdline, get_json, health_status, sha256

REPO = Path(__file__).resolve().parents[1]
SPEC = (REPO / "playbooks" / "speculative-disable.yaml").read_text()


def report(proc: subprocess.CompletedProcess[str]) -> dict:
    return json.loads(proc.stdout)


def start_orch(box: Sandbox, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *args, "--ssh-config", str(box.sshd.ssh_config)],
        cwd=box.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def wait_for_step(box: Sandbox, step: str, timeout: float = 60.0) -> None:
    journal = box.state_dir / "journal.json"
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if json.loads(journal.read_text()).get("step") == step:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"journal never reached {step}")


COMMANDS = """\
name: commands-manager
vars: {{threshold: 32, port: 30000}}
files:
  - path: "{{{{ sglang_root }}}}/srt/server_args.py"
    edits:
      - insert: sglang/server_args_field.py.j2
        after: "speculative_accept_threshold_acc:"
      - insert: sglang/server_args_add_argument.py.j2
        after: '"--speculative-accept-threshold-acc"'
    validate: [python-syntax]
server:
  manager: commands
  python: {python}
  command: "{{{{ python }}}} -m sglang.launch_server --model-path /models/standin --port {{{{ port }}}}"
  flags: {{"--speculative-disable-batch-threshold": "{{{{ threshold }}}}"}}
  start: "sh -c 'cd {box}; PYTHONPATH={tree} setsid {{{{ command }}}} > {box}/cmd.log 2>&1 < /dev/null & echo $! > {box}/cmd.pid'"
  stop: "sh -c 'p=$(cat {box}/cmd.pid); kill $p; while kill -0 $p 2>/dev/null; do sleep 0.05; done'"
  pid: "cat {box}/cmd.pid"
health:
  base_url: "http://127.0.0.1:{{{{ port }}}}"
  timeout: 60s
  interval: 0.2s
  checks:
    - get: /health
    - get: /get_server_info
      expect: {{speculative_disable_batch_threshold: "{{{{ threshold }}}}"}}
"""


def test_commands_manager_restarts_through_user_commands_and_rolls_back(sandbox: Sandbox) -> None:
    tree = sandbox.sglang_root.parent
    # the server runs under the user's own start command from the beginning
    subprocess.run(["sh", "-c", f"cd {sandbox.root}; PYTHONPATH={tree} setsid {sys.executable} -m "
                    f"sglang.launch_server --model-path /models/standin --port {sandbox.port} > "
                    f"{sandbox.root}/cmd.log 2>&1 < /dev/null & echo $! > {sandbox.root}/cmd.pid"], check=True)
    from tests.fixtures.sandbox import wait_healthy

    wait_healthy(sandbox.port)
    first_pid = int((sandbox.root / "cmd.pid").read_text())
    original = sha256(sandbox.server_args)
    pb = sandbox.root / "commands.yaml"
    pb.write_text(COMMANDS.format(python=sys.executable, box=sandbox.root, tree=tree))
    proc = sandbox.orch("deploy", "--host", "gpu", "--json", str(pb))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    new_pid = int((sandbox.root / "cmd.pid").read_text())
    assert new_pid != first_pid
    assert cmdline(new_pid)[-2:] == ["--speculative-disable-batch-threshold", "32"]
    assert get_json(sandbox.port, "/get_server_info")["speculative_disable_batch_threshold"] == 32

    # a flag the server rejects: the pid command's process is watched, so it fails in seconds
    bad = sandbox.root / "bad.yaml"
    bad.write_text(pb.read_text().replace('"--speculative-disable-batch-threshold": "{{ threshold }}"',
                                          '"--speculative-disable-batch-threshold": "{{ threshold }}", "--no-such-flag": 1'))
    started = time.monotonic()
    rejected = sandbox.orch("deploy", "--host", "gpu", "--json", str(bad))
    assert rejected.returncode == 1, rejected.stdout + rejected.stderr
    assert "server exited during start" in report(rejected)["hosts"]["gpu"]["error"]
    assert time.monotonic() - started < 45  # the health timeout is 60 s
    assert get_json(sandbox.port, "/get_server_info")["speculative_disable_batch_threshold"] == 32

    back = sandbox.orch("rollback", "--host", "gpu")
    assert back.returncode == 0, back.stdout + back.stderr
    assert sha256(sandbox.server_args) == original
    assert "--speculative-disable-batch-threshold" not in cmdline(int((sandbox.root / "cmd.pid").read_text()))
    assert health_status(sandbox.port) == 200
    sandbox.orch("deploy", "--host", "gpu", str(pb))  # leave it for stop_all to find by port
    subprocess.run(["sh", "-c", f"kill $(cat {sandbox.root}/cmd.pid)"])


def test_commit_keeps_mode_and_owner(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    os.chmod(sandbox.server_args, 0o640)
    os.chown(sandbox.server_args, 65534, 65534)
    assert sandbox.orch("deploy", "--host", "gpu", "speculative-disable").returncode == 0
    st = sandbox.server_args.stat()
    assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o640, 65534, 65534)
    assert sandbox.orch("rollback", "--host", "gpu").returncode == 0
    st = sandbox.server_args.stat()
    assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o640, 65534, 65534)


def test_ctrl_c_during_health_wait_rolls_back(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    original = sha256(sandbox.server_args)
    slow = sandbox.root / "slow.yaml"
    slow.write_text(SPEC.replace("server:\n  manager: process\n",
                                 'server:\n  manager: process\n  env: {STANDIN_NEVER_READY: "1"}\n'))
    proc = start_orch(sandbox, "deploy", "--host", "gpu", "--json", str(slow))
    wait_for_step(sandbox, "restarting")
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    rep = json.loads(out)["hosts"]["gpu"]
    assert rep["outcome"] == "rolled_back" and "interrupted" in rep["error"]
    assert sha256(sandbox.server_args) == original
    assert cmdline(sandbox.server_pid()) == sandbox.hand_argv
    assert json.loads((sandbox.state_dir / "journal.json").read_text())["finished"] is True


def test_watchdog_restores_by_itself_when_the_controller_dies(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    original = sha256(sandbox.server_args)
    slow = sandbox.root / "slow.yaml"
    body = SPEC.replace("server:\n  manager: process\n",
                        'server:\n  manager: process\n  env: {STANDIN_NEVER_READY: "1"}\n  stop_timeout: 5s\n')
    body = body.replace("timeout: 15m", "timeout: 20s").replace("confirm_timeout: 60s", "confirm_timeout: 2s")
    slow.write_text(body)
    proc = start_orch(sandbox, "deploy", "--host", "gpu", str(slow))
    wait_for_step(sandbox, "restarting")
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)  # the controller dies: nobody will roll back but the host
    proc.wait()
    assert sha256(sandbox.server_args) != original
    deadline = time.time() + 90
    while time.time() < deadline:
        journal = json.loads((sandbox.state_dir / "journal.json").read_text())
        if journal.get("step") == "restored_by_watchdog":
            break
        time.sleep(0.2)
    assert journal.get("step") == "restored_by_watchdog", journal
    assert sha256(sandbox.server_args) == original
    from tests.fixtures.sandbox import wait_healthy

    wait_healthy(sandbox.port, 60)
    assert cmdline(sandbox.server_pid()) == sandbox.hand_argv
    rows = report(sandbox.orch("history", "--host", "gpu", "--json"))["hosts"]["gpu"]
    assert rows[-1]["outcome"] == "rolled back (watchdog)"
    # the host is healthy and its journal finished: the next deploy goes ahead
    assert sandbox.orch("deploy", "--host", "gpu", "speculative-disable").returncode == 0


def test_secrets_never_reach_history_json_or_the_run_log(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    secret = "sk-very-secret-0123456789"
    pb = sandbox.root / "secret.yaml"
    pb.write_text(SPEC.replace('flags: {"--speculative-disable-batch-threshold": "{{ threshold }}"}',
                               'flags: {"--speculative-disable-batch-threshold": "{{ threshold }}", '
                               '"--api-key": "{{ api_key }}"}'))
    auth = '      headers: {Authorization: "Bearer {{ api_key }}"}\n'
    body = pb.read_text().replace("timeout: 15m", "timeout: 30s")
    body = body.replace('      json: {text: "ping", sampling_params: {max_new_tokens: 4}}\n',
                        '      json: {text: "ping", sampling_params: {max_new_tokens: 4}}\n' + auth)
    body = body.replace('      expect: {speculative_disable_batch_threshold: "{{ threshold }}"}\n',
                        '      expect: {speculative_disable_batch_threshold: "{{ threshold }}"}\n' + auth)
    pb.write_text(body)
    proc = sandbox.orch("deploy", "--host", "gpu", "--json", "--var", f"api_key={secret}", str(pb))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert cmdline(sandbox.server_pid())[-2:] == ["--api-key", secret]  # it did take effect
    st = sandbox.orch("status", "--host", "gpu", "--json")
    assert secret not in st.stdout + st.stderr
    assert "--api-key" in st.stdout
    hist = sandbox.orch("history", "--host", "gpu", "--json")
    assert secret not in proc.stdout + proc.stderr
    assert secret not in hist.stdout + hist.stderr
    for path in sandbox.state_dir.glob("releases/*/run.log"):
        assert secret not in path.read_text()
    back = sandbox.orch("rollback", "--host", "gpu")  # restores from restore.json, unmasked
    assert back.returncode == 0, back.stdout + back.stderr
    assert secret not in back.stdout + back.stderr
    for path in sandbox.state_dir.glob("releases/*/manifest.json"):
        assert secret not in path.read_text()
        manifest = json.loads(path.read_text())
        if manifest["kind"] != "deploy":
            continue
        assert manifest["vars"]["api_key"] == "***"
        assert all(secret not in c for c in manifest["flag_changes"])


def test_old_releases_are_pruned_never_current_or_previous(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    sandbox.write_inventory(keep_releases=2)
    for t in ("1", "2", "3", "4"):
        proc = sandbox.orch("deploy", "--host", "gpu", "--var", f"threshold={t}", "speculative-disable")
        assert proc.returncode == 0, proc.stdout + proc.stderr
    releases = sorted(p.name for p in (sandbox.state_dir / "releases").iterdir())
    assert len(releases) == 2
    state = json.loads((sandbox.state_dir / "state.json").read_text())
    assert state["applied"] == releases
    assert sandbox.orch("rollback", "--host", "gpu").returncode == 0
    assert get_json(sandbox.port, "/get_server_info")["speculative_disable_batch_threshold"] == 3


def test_round_trips_do_not_grow_with_files_and_one_exec_per_run(sandbox: Sandbox) -> None:
    import yaml

    sandbox.start_by_hand()
    one = sandbox.orch("deploy", "--host", "gpu", "--json", "speculative-disable")
    assert one.returncode == 0, one.stdout + one.stderr
    assert sandbox.orch("rollback", "--host", "gpu").returncode == 0
    spec = yaml.safe_load(SPEC)
    copies = []
    for i in range(6):
        copy = sandbox.server_args.with_name(f"copy_{i}.py")
        copy.write_text(sandbox.server_args.read_text())
        copies.append(dict(spec["files"][0], path=str(copy)))
    spec["files"] = copies + spec["files"]
    many = sandbox.root / "many.yaml"
    many.write_text(yaml.safe_dump(spec))
    seven = sandbox.orch("deploy", "--host", "gpu", "--json", str(many))
    assert seven.returncode == 0, seven.stdout + seven.stderr
    r1, r7 = report(one)["hosts"]["gpu"], report(seven)["hosts"]["gpu"]
    assert len(r7["files"]) == 7
    assert r1["execs"] == r7["execs"] == 1  # one SSH exec: the helper
    assert r1["round_trips"] == r7["round_trips"] <= 10, (r1, r7)


def test_stopping_a_hand_started_server_takes_its_workers_too(sandbox: Sandbox) -> None:
    from tests.fixtures.sandbox import wait_healthy

    tree = sandbox.sglang_root.parent
    # started from a shell script: the server is not its process group's leader
    subprocess.Popen(["setsid", "sh", "-c", f"cd {sandbox.root}; STANDIN_WORKER=1 PYTHONPATH={tree} "
                      f"{sys.executable} -m sglang.launch_server --model-path /models/standin "
                      f"--port {sandbox.port} > {sandbox.root}/hand.log 2>&1; echo done"])
    wait_healthy(sandbox.port)
    server = sandbox.server_pid()
    assert os.getpgid(server) != server
    worker = int(Path(f"/proc/{server}/task/{server}/children").read_text().split()[0])
    assert sandbox.orch("deploy", "--host", "gpu", "speculative-disable").returncode == 0
    assert not Path(f"/proc/{server}").exists()
    assert not Path(f"/proc/{worker}").exists() or "Z" in Path(f"/proc/{worker}/stat").read_text().split()[2]


def never_healthy_playbook(box: Sandbox, health_timeout: str) -> Path:
    """The story's playbook, but the new server never becomes healthy."""
    body = SPEC.replace("server:\n  manager: process\n",
                        'server:\n  manager: process\n  env: {STANDIN_NEVER_READY: "1"}\n  stop_timeout: 5s\n')
    body = body.replace("timeout: 15m", f"timeout: {health_timeout}").replace("confirm_timeout: 60s", "confirm_timeout: 2s")
    path = box.root / "slow.yaml"
    path.write_text(body)
    return path


def deploy_through_proxy(box: Sandbox, health_timeout: str, fault: str) -> tuple[subprocess.Popen[str], str, str, float]:
    """Deploy over a TCP proxy, and cut (``sever``) or ``stall`` it once the server restarts."""
    from tests.fixtures.proxy import TcpProxy

    proxy = TcpProxy(box.sshd.port)
    try:
        known = box.root / "known_hosts"
        known.write_text(f"[127.0.0.1]:{proxy.port} {box.sshd.host_key_pub}\n")
        box.write_inventory(port=proxy.port, known_hosts=str(known))
        proc = start_orch(box, "deploy", "--host", "gpu", "--json", str(never_healthy_playbook(box, health_timeout)))
        wait_for_step(box, "restarting")
        time.sleep(0.5)
        faulted = time.monotonic()
        getattr(proxy, fault)()
        out, err = proc.communicate(timeout=150)
        return proc, out, err, time.monotonic() - faulted
    finally:
        proxy.close()


def test_link_severed_after_commit_exits_3_and_the_watchdog_restores(sandbox: Sandbox) -> None:
    from tests.fixtures.sandbox import wait_healthy

    sandbox.start_by_hand()
    original = sha256(sandbox.server_args)
    proc, out, err, _ = deploy_through_proxy(sandbox, "20s", "sever")
    assert proc.returncode == 3, out + err
    rep = json.loads(out)["hosts"]["gpu"]
    assert rep["outcome"] == "rollback_failed"
    assert "after the commit" in rep["error"] and "watchdog" in rep["error"]
    assert "orch rollback --host gpu" in rep["error"]
    deadline = time.time() + 90
    while time.time() < deadline:
        if json.loads((sandbox.state_dir / "journal.json").read_text()).get("step") == "restored_by_watchdog":
            break
        time.sleep(0.2)
    assert sha256(sandbox.server_args) == original
    wait_healthy(sandbox.port, 60)
    assert cmdline(sandbox.server_pid()) == sandbox.hand_argv


def test_a_link_that_goes_silent_is_noticed_and_reported(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    # the watchdog's deadline is minutes away; the sandbox's teardown stops it
    proc, out, err, noticed = deploy_through_proxy(sandbox, "5m", "stall")
    assert proc.returncode == 3, out + err
    rep = json.loads(out)["hosts"]["gpu"]
    assert "no data from" in rep["error"] and "watchdog" in rep["error"]
    assert noticed < 120, noticed


def test_deploy_after_the_server_died_starts_the_current_release_command_line(sandbox: Sandbox) -> None:
    sandbox.start_by_hand("--log-level", "warning")
    assert sandbox.orch("deploy", "--host", "gpu", "speculative-disable").returncode == 0
    running = sandbox.server_pid()
    argv = cmdline(running)
    os.killpg(running, signal.SIGKILL)  # the server crashes; nothing listens any more
    deadline = time.time() + 10
    while sandbox.server_pid() is not None and time.time() < deadline:
        time.sleep(0.05)
    proc = sandbox.orch("deploy", "--host", "gpu", "--json", "--var", "threshold=8", "speculative-disable")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert cmdline(sandbox.server_pid()) == argv[:-1] + ["8"]
    assert get_json(sandbox.port, "/get_server_info")["speculative_disable_batch_threshold"] == 8
