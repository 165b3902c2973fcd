"""Baseline "ansible": the story for a fleet as an Ansible playbook (pipelining, forks).

``write_project`` writes an inventory (one line per host, its job as host
vars), an ``ansible.cfg`` and the playbook into a directory; ``bench_fleet``
runs ``ansible-playbook`` there from ``bench/.venv-baselines`` (made by
``bench/setup.sh``; never orch's environment).

The playbook is what a careful engineer writes for a fleet: ``gather_facts:
false``, the interpreter named (no discovery), and the idiomatic modules:

- ``copy`` of the patched file with ``backup: yes`` and ``validate:`` (the temp
  copy is compiled with the host's python before it replaces the live file;
  unchanged content → ``ok``, nothing else runs: the no-op re-run);
- ``command sed -n`` read-back, failing unless it shows the new field;
- ``shell`` stop by pid, ``shell`` start with ``nohup setsid``;
- ``uri /health`` ``until`` 200 every ``poll`` seconds, ``uri /get_server_info``
  (value checked), ``uri POST /generate``;

every step after the copy ``when: upload is changed``. ``ansible.cfg``: ``forks
= K``, ``pipelining = True`` (the usual tuning), OpenSSH with Ansible's
default ``ControlMaster``/``ControlPersist`` connection sharing, strict host
keys against the bench's ``known_hosts``.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any


def host_vars(job: dict[str, Any]) -> dict[str, Any]:
    """What the playbook needs of one host, precomputed (no templating tricks on the controller)."""
    q = shlex.quote
    port = job["port"]
    pattern = q(f"^[^ ]+ -m sglang[.]launch_server .*--port {port}( |$)")
    env = " ".join(f"{k}={q(v)}" for k, v in job["env"].items())
    return {
        "ansible_host": job["address"],
        "ansible_port": job["ssh_port"],
        "ansible_user": job["user"],
        "ansible_ssh_private_key_file": job["identity_file"],
        "ansible_python_interpreter": job["python"],
        "story_path": job["path"],
        "story_patched": job["patched"],
        "story_sed": ";".join(f"{a},{b}p" for a, b in job["ranges"]),
        "story_url": f"http://127.0.0.1:{port}",
        "story_stop": f"pid=$(pgrep -f {pattern}) && kill $pid && "
                      "while kill -0 $pid 2>/dev/null; do sleep 0.1; done",
        "story_start": f"cd {q(job['cwd'])} && {{ env {env} nohup setsid {shlex.join(job['argv'])} "
                       f"> {q(job['log'])} 2>&1 < /dev/null & }}",
    }


def playbook(field: str, threshold: int, poll: float, timeout: float) -> list[dict[str, Any]]:
    """The story as Ansible tasks (returned as data; written out as JSON, which is YAML)."""
    changed = "upload is changed"
    check = "{{ ansible_python_interpreter }} -c 'import sys; compile(open(sys.argv[1], \"rb\").read(), sys.argv[1], \"exec\")' %s"
    return [{
        "name": "speculative-disable, fleet",
        "hosts": "fleet",
        "gather_facts": False,
        "tasks": [
            {"name": "upload the patched file (backup, validate)",
             "copy": {"src": "{{ story_patched }}", "dest": "{{ story_path }}", "backup": True,
                      "validate": check},
             "register": "upload"},
            {"name": "read back", "command": {"argv": ["sed", "-n", "{{ story_sed }}", "{{ story_path }}"]},
             "register": "shown", "changed_when": False, "failed_when": f"'{field}' not in shown.stdout",
             "when": changed},
            {"name": "stop the server", "shell": "{{ story_stop }}", "when": changed},
            {"name": "start the server", "shell": "{{ story_start }}", "when": changed},
            {"name": "wait for health", "uri": {"url": "{{ story_url }}/health", "status_code": 200},
             "register": "health", "until": "health.status == 200",
             "retries": max(1, int(timeout / poll)), "delay": poll, "when": changed},
            {"name": "the flag is live", "uri": {"url": "{{ story_url }}/get_server_info", "return_content": True},
             "register": "info", "failed_when": f"info.json.{field} != {threshold}", "when": changed},
            {"name": "generate", "uri": {"url": "{{ story_url }}/generate", "method": "POST",
                                         "body_format": "json",
                                         "body": {"text": "ping", "sampling_params": {"max_new_tokens": 4}},
                                         "return_content": True},
             "register": "gen", "failed_when": "'\"text\"' not in gen.content", "when": changed},
        ],
    }]


def write_project(workdir: Path, jobs: list[dict[str, Any]], *, forks: int, ssh_config: Path,
                  known_hosts: Path) -> tuple[Path, dict[str, str]]:
    """Write inventory, ansible.cfg and playbook under ``workdir``; return (playbook, env)."""
    workdir.mkdir(parents=True, exist_ok=True)
    inventory = workdir / "hosts.json"
    inventory.write_text(json.dumps({"fleet": {"hosts": {j["name"]: host_vars(j) for j in jobs}}}, indent=1))
    first = jobs[0]
    cfg = workdir / "ansible.cfg"
    cfg.write_text("\n".join([
        "[defaults]",
        f"inventory = {inventory}",
        "host_key_checking = True",
        "gathering = explicit",
        "retry_files_enabled = False",
        f"forks = {forks}",
        "timeout = 60",  # connect timeout: 10 s by default, which a loaded 2-core box can exceed
        f"local_tmp = {workdir / 'local-tmp'}",
        f"remote_tmp = {workdir / 'remote-tmp'}",
        "",
        "[ssh_connection]",
        f"ssh_args = -F {ssh_config} -o UserKnownHostsFile={known_hosts} -o IdentitiesOnly=yes "
        "-o ControlMaster=auto -o ControlPersist=60s",
        f"control_path = {workdir / 'cm-%%h-%%p'}",  # ConfigParser: %% is one %
        "pipelining = True",
        "",
    ]))
    book = workdir / "story.yaml"
    field = first["flag_name"].lstrip("-").replace("-", "_")
    book.write_text(json.dumps(playbook(field, first["threshold"], first["poll"], first["timeout"]), indent=1))
    env = dict(os.environ, ANSIBLE_CONFIG=str(cfg), ANSIBLE_HOME=str(workdir / "home"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    return book, env
