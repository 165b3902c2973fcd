"""Baseline "pyinfra": the story as a pyinfra deploy file (run by the pyinfra CLI, not imported).

    pyinfra -y --parallel K inventory.py bench/pyinfra_deploy.py

Each host's job (``bench_fleet.host_job``) is in its inventory data as
``bench_job``. The deploy is what a pyinfra user would write:

- a fact, ``Sha1File``, of the live file; equal to the patched file's → nothing
  more (the no-op re-run: it looks at the file only);
- ``files.put`` of the patched file to a staged path beside the live one;
- one ``server.shell``: validate the staged copy (``compile()``, no bytecode),
  back up (``cp -p``), put it in place (``cat >``, keeps mode and owner),
  read the changed lines back (``sed -n``) and check they show the flag;
- ``server.shell``: stop the server by pid, start it with the new flag;
- ``server.shell``: poll ``/health`` every ``poll`` seconds until 200;
- ``server.shell``: check ``/get_server_info`` reports the value and
  ``POST /generate`` answers text.

pyinfra runs one operation on every host, then the next (``--parallel K``
hosts at a time), over one Paramiko connection per host.
"""

from __future__ import annotations

import hashlib
import json
import shlex

from pyinfra import host
from pyinfra.facts.files import Sha1File
from pyinfra.operations import files, server

job = host.data.bench_job
q = shlex.quote
path = job["path"]
staged = f"{path}.bench-staged"
url = f"http://127.0.0.1:{job['port']}"
field = job["flag_name"].lstrip("-").replace("-", "_")
py = q(job["python"])

with open(job["patched"], "rb") as f:
    wanted = hashlib.sha1(f.read()).hexdigest()  # noqa: S324 - pyinfra's own fact is SHA1

if host.get_fact(Sha1File, path=path) != wanted:
    files.put(name="upload the patched file (staged)", src=job["patched"], dest=staged)
    check = 'import sys; compile(open(sys.argv[1], "rb").read(), sys.argv[1], "exec")'
    sed = ";".join(f"{a},{b}p" for a, b in job["ranges"])
    server.shell(
        name="validate, back up, replace, read back",
        commands=[
            f"{py} -c {q(check)} {q(staged)}",
            f"cp -p {q(path)} {q(path)}.bak && cat {q(staged)} > {q(path)} && rm -f {q(staged)}",
            f"sed -n {q(sed)} {q(path)} | grep -q {q(field)}",
        ],
    )
    pattern = q(f"^[^ ]+ -m sglang[.]launch_server .*--port {job['port']}( |$)")
    env = " ".join(f"{k}={q(v)}" for k, v in job["env"].items())
    server.shell(
        name="restart with the flag",
        commands=[
            f"pid=$(pgrep -f {pattern}) && kill $pid && while kill -0 $pid 2>/dev/null; do sleep 0.1; done",
            f"cd {q(job['cwd'])} && {{ env {env} nohup setsid {shlex.join(job['argv'])} "
            f"> {q(job['log'])} 2>&1 < /dev/null & }}",
        ],
    )
    tries = max(1, int(job["timeout"] / job["poll"]))
    server.shell(
        name="wait for health",
        commands=[f"for i in $(seq {tries}); do curl -sf -o /dev/null {url}/health && exit 0; "
                  f"sleep {job['poll']}; done; exit 1"],
    )
    expect = f'import json, sys; sys.exit(json.load(sys.stdin).get({field!r}) != {job["threshold"]!r})'
    body = q(json.dumps({"text": "ping", "sampling_params": {"max_new_tokens": 4}}))
    server.shell(
        name="the flag is live; generate answers",
        commands=[
            f"curl -sf {url}/get_server_info | {py} -c {q(expect)}",
            f"curl -sf -H 'Content-Type: application/json' -d {body} {url}/generate | grep -q '\"text\"'",
        ],
    )
