"""More of the safe deploy: the commands manager, mode and owner, Ctrl-C,
secrets, round trips — each over real sshd against the stand-in server.
(Faults over a slow link, the watchdog and retention: tests/test_faults.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.fixtures.sandbox import (
    Sandbox,
    cmdline,
    get_json,
    health_status,
    quick_stability,
    sha256,
)

REPO = Path(__file__).resolve().parents[1]
SPEC = quick_stability((REPO / "playbooks" / "speculative-disable.yaml").read_text())


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
  stable_for: 1s
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
    rejected = sandbox.orch("deploy", "--host", "gpu", "--json", str(bad))
    assert rejected.returncode == 1, rejected.stdout + rejected.stderr
    # the exit was seen while waiting (not the 60 s health timeout)
    assert "server exited during start" in report(rejected)["hosts"]["gpu"]["error"]
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
    # open_state, plan, stage+validate, backup+arm, then the commit with the runner's whole
    # run followed to its verdict (hello's answer comes with the helper's first line): 5,
    # whatever the number of files
    assert r1["round_trips"] == r7["round_trips"] == 5, (r1, r7)


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
