"""Baseline "ansible": the same story as an Ansible playbook, with ansible-core from PyPI.

ansible-core lives in its own venv under /tmp (never in the project's
environment); ``find_ansible`` uses one that is there or makes it with pip,
and answers ``None`` (the bench then skips this baseline, saying why) when
that does not work.

The playbook is what a careful engineer writes: ``gather_facts: false``, the
interpreter named (no discovery), one task per step, ``loop`` over the files:
``copy remote_src`` backup, ``copy`` of the patched file, ``command``
py_compile, ``command`` sed read-back, ``shell`` stop by pid, ``shell``
start with nohup/setsid, ``uri`` ``/health`` ``until`` 200, ``uri``
``/get_server_info`` and ``/generate``. Ansible's defaults otherwise (its
OpenSSH ControlMaster/ControlPersist connection sharing, no pipelining); the
bench runs it once so and once with ``pipelining = True``, the usual tuning.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

DEFAULT_VENV = Path("/tmp/orch-bench-ansible")
INSTALL_TIMEOUT = 300.0


def find_ansible(venv: Path, *, install: bool = True) -> tuple[Path | None, str]:
    """``(ansible-playbook path, note)``: an existing one in ``venv``, else pip-installed there."""
    exe = venv / "bin" / "ansible-playbook"
    if not exe.exists() and install:
        try:
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True,
                           capture_output=True, timeout=120)
            subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "ansible-core"], check=True,
                           capture_output=True, timeout=INSTALL_TIMEOUT)
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"cannot install ansible-core into {venv}: {type(exc).__name__}"
    if not exe.exists():
        return None, f"no ansible-playbook in {venv}"
    try:
        out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{exe} does not run: {type(exc).__name__}"
    if out.returncode != 0:
        return None, f"{exe} --version failed: {out.stderr.strip()[:200]}"
    return exe, out.stdout.splitlines()[0].strip()


def playbook(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The story as Ansible tasks (returned as data; written out as JSON, which is YAML)."""
    port = job["port"]
    url = f"http://127.0.0.1:{port}"
    field = job["flag_name"].lstrip("-").replace("-", "_")
    pattern = shlex.quote(f"[s]glang.launch_server.*--port {port}")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in job["env"].items())
    start = (f"cd {shlex.quote(job['cwd'])} && {{ env {env} nohup setsid {shlex.join(job['argv'])} "
             f"> {shlex.quote(job['log'])} 2>&1 < /dev/null & }}")
    files = [{"path": f["path"], "patched": f["patched"],
              "sed": ";".join(f"{a},{b}p" for a, b in f["ranges"])} for f in job["files"]]
    return [{
        "name": "speculative-disable, by hand",
        "hosts": "gpu",
        "gather_facts": False,
        "vars": {"files": files},
        "tasks": [
            {"name": "back up", "copy": {"src": "{{ item.path }}", "dest": "{{ item.path }}.bak",
                                         "remote_src": True, "mode": "preserve"},
             "loop": "{{ files }}"},
            {"name": "upload the patched file", "copy": {"src": "{{ item.patched }}", "dest": "{{ item.path }}"},
             "loop": "{{ files }}"},
            {"name": "syntax", "command": {"argv": [job["python"], "-m", "py_compile", "{{ item.path }}"]},
             "loop": "{{ files }}", "changed_when": False},
            {"name": "read back", "command": {"argv": ["sed", "-n", "{{ item.sed }}", "{{ item.path }}"]},
             "loop": "{{ files }}", "register": "shown", "changed_when": False,
             "failed_when": f"'{field}' not in shown.stdout"},
            {"name": "stop the server",
             "shell": f"pid=$(pgrep -f {pattern}) && kill $pid && "
                      "while kill -0 $pid 2>/dev/null; do sleep 0.1; done"},
            {"name": "start the server", "shell": start},
            {"name": "wait for health", "uri": {"url": f"{url}/health", "status_code": 200},
             "register": "health", "until": "health.status == 200",
             "retries": int(job["timeout"] / job["poll"]), "delay": job["poll"]},
            {"name": "the flag is live", "uri": {"url": f"{url}/get_server_info", "return_content": True},
             "register": "info", "failed_when": f"info.json.{field} != {job['threshold']}"},
            {"name": "generate", "uri": {"url": f"{url}/generate", "method": "POST", "body_format": "json",
                                         "body": {"text": "ping", "sampling_params": {"max_new_tokens": 4}},
                                         "return_content": True},
             "register": "gen", "failed_when": "'\"text\"' not in gen.content"},
        ],
    }]


def write_project(workdir: Path, job: dict[str, Any], *, ssh_config: Path, known_hosts: Path,
                  pipelining: bool) -> tuple[Path, dict[str, str]]:
    """Write inventory, ansible.cfg and playbook under ``workdir``; return (playbook, env)."""
    workdir.mkdir(parents=True, exist_ok=True)
    inventory = workdir / "hosts.ini"
    inventory.write_text(
        f"gpu ansible_host={job['address']} ansible_port={job['ssh_port']} ansible_user={job['user']} "
        f"ansible_ssh_private_key_file={job['identity_file']} ansible_python_interpreter={job['python']}\n"
    )
    cfg = workdir / "ansible.cfg"
    cfg.write_text("\n".join([
        "[defaults]",
        f"inventory = {inventory}",
        "host_key_checking = True",
        "gathering = explicit",
        "retry_files_enabled = False",
        "forks = 1",
        f"local_tmp = {workdir / 'local-tmp'}",
        f"remote_tmp = {workdir / 'remote-tmp'}",
        "",
        "[ssh_connection]",
        f"ssh_args = -F {ssh_config} -o UserKnownHostsFile={known_hosts} -o IdentitiesOnly=yes "
        "-o ControlMaster=auto -o ControlPersist=60s",
        f"control_path = {control_path(workdir)}",
        f"pipelining = {pipelining}",
        "",
    ]))
    book = workdir / "story.yaml"
    book.write_text(json.dumps(playbook(job), indent=1))
    env = dict(os.environ, ANSIBLE_CONFIG=str(cfg), ANSIBLE_HOME=str(workdir / "home"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    return book, env


def control_path(workdir: Path) -> str:
    return str(workdir / "cm-%%h-%%p")  # ansible.cfg is ConfigParser: %% is one %


def close_master(workdir: Path, ssh_argv: list[str]) -> None:
    """End the ControlPersist master of a run, so the next run starts from nothing (not timed)."""
    path = control_path(workdir).replace("%%", "%")
    subprocess.run([*ssh_argv[:-1], "-o", f"ControlPath={path}", "-O", "exit", ssh_argv[-1]],
                   capture_output=True, timeout=30)
