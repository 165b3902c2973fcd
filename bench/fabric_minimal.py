"""Baseline "fabric-minimal": the floor — one connection and ONE exec per host, threads.

The whole story for a host travels as one shell script inside one ``c.run``:
the patched file (gzip + base64, inside the command line, so no SFTP channel
and no stdin pumping), then

1. unchanged? (``cmp`` with the live file) → print ``unchanged`` and stop
   (the no-op re-run; it looks at the file only, not the running flag);
2. validate the staged copy (``compile()`` with the host's python, no bytecode);
3. back up (``cp -p``), put the staged copy in place (``cat >``: keeps the
   file's mode and owner), read the changed lines back (``sed -n A,Bp``);
4. stop the server by pid (``pgrep``, ``kill``, wait until it is gone), start
   it with the new flag (``nohup setsid``), poll ``curl /health`` every
   ``poll`` seconds until 200;
5. print ``/get_server_info`` and the reply of ``POST /generate``.

The controller checks what the script printed (the read-back shows the new
flag's field, the server reports the value, ``/generate`` answers text).
Hosts run on a thread pool of ``forks`` threads, each with its own
``fabric.Connection``. What it does not do, and orch does: lock, journal,
release record, watchdog, rollback, structural check, command-line discovery
(it knows the server's argv by heart).

    python bench/fabric_minimal.py JOB.json

JOB.json: ``{"forks": K, "hosts": [per-host job, see bench_fleet.host_job]}``.
Prints one JSON line ``{"hosts": {name: "changed"|"unchanged"|"failed: ..."}}``;
exits 1 if a host failed.
"""

from __future__ import annotations

import base64
import gzip
import json
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

MARK = "@@orch-bench@@"


def server_pattern(port: int) -> str:
    """``pgrep -f`` pattern for the server on ``port``, anchored at the interpreter: the
    shell running this very script also has ``sglang.launch_server … --port N`` in its
    command line (the start step), and must not match."""
    return f"^[^ ]+ -m sglang[.]launch_server .*--port {port}( |$)"


def story_script(job: dict[str, Any], patched: bytes) -> str:
    """The one shell script that does the whole story on the host."""
    q = shlex.quote
    path = job["path"]
    staged = f"{path}.bench-staged"
    url = f"http://127.0.0.1:{job['port']}"
    blob = base64.b64encode(gzip.compress(patched, mtime=0)).decode()
    sed = ";".join(f"{a},{b}p" for a, b in job["ranges"])
    check = 'import sys; compile(open(sys.argv[1], "rb").read(), sys.argv[1], "exec")'
    pattern = q(server_pattern(job["port"]))
    env = " ".join(f"{k}={q(v)}" for k, v in job["env"].items())
    tries = max(1, int(job["timeout"] / job["poll"]))
    body = q(json.dumps({"text": "ping", "sampling_params": {"max_new_tokens": 4}}))
    return "\n".join([
        "set -u",
        f"f={q(path)}; staged={q(staged)}",
        f"printf %s {blob} | base64 -d | gunzip > \"$staged\" || exit 1",
        'if cmp -s "$staged" "$f"; then rm -f "$staged"; echo unchanged; exit 0; fi',
        f"{q(job['python'])} -c {q(check)} \"$staged\" || {{ rm -f \"$staged\"; exit 1; }}",
        'cp -p "$f" "$f.bak" && cat "$staged" > "$f" && rm -f "$staged" || exit 1',
        f"echo {MARK}; sed -n {q(sed)} \"$f\"",
        f"pid=$(pgrep -f {pattern}) && kill $pid && while kill -0 $pid 2>/dev/null; do sleep 0.1; done",
        f"cd {q(job['cwd'])} && {{ env {env} nohup setsid {shlex.join(job['argv'])} "
        f"> {q(job['log'])} 2>&1 < /dev/null & }}",
        f"ok=; for i in $(seq {tries}); do curl -sf -o /dev/null {url}/health && {{ ok=1; break; }}; "
        f"sleep {job['poll']}; done",
        '[ -n "$ok" ] || { echo "not healthy in time" >&2; exit 1; }',
        f"echo {MARK}; curl -sf {url}/get_server_info || exit 1",
        f"echo; echo {MARK}; curl -sf -H 'Content-Type: application/json' -d {body} {url}/generate || exit 1",
        "",
    ])


def check_output(job: dict[str, Any], out: str) -> str:
    """``changed`` or ``unchanged``; raises if what the host printed does not show the story done."""
    if out.strip() == "unchanged":
        return "unchanged"
    parts = out.split(MARK + "\n")
    if len(parts) != 4:
        raise RuntimeError(f"unexpected output: {out[-300:]!r}")
    _, shown, info, reply = parts
    field = job["flag_name"].lstrip("-").replace("-", "_")
    if field not in shown:
        raise RuntimeError("read-back does not show the change")
    if json.loads(info).get(field) != job["threshold"]:
        raise RuntimeError(f"server reports {info.strip()[:200]}")
    if '"text"' not in reply:
        raise RuntimeError(f"/generate answered {reply.strip()[:200]!r}")
    return "changed"


def deploy_host(job: dict[str, Any]) -> str:
    import paramiko
    from fabric import Config, Connection

    config = Config(overrides={"load_ssh_configs": False, "run": {"hide": True, "in_stream": False}})
    c = Connection(job["address"], user=job["user"], port=job["ssh_port"], config=config,
                   connect_kwargs={"key_filename": job["identity_file"], "look_for_keys": False,
                                   "allow_agent": False})
    c.client.load_host_keys(job["known_hosts"])
    c.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        with open(job["patched"], "rb") as f:
            script = story_script(job, f.read())
        result = c.run(f"bash -c {shlex.quote(script)}", warn=True)
        if not result.ok:
            raise RuntimeError(f"exit {result.exited}: {result.stderr.strip()[-300:]}")
        return check_output(job, result.stdout)
    except Exception as exc:  # noqa: BLE001 - a baseline: report per host, go on with the others
        return f"failed: {type(exc).__name__}: {str(exc).strip()[:300]}"
    finally:
        c.close()


def main(job_path: str) -> int:
    with open(job_path) as f:
        fleet: dict[str, Any] = json.load(f)
    hosts = fleet["hosts"]
    with ThreadPoolExecutor(max_workers=fleet["forks"]) as pool:
        outcomes = dict(zip((h["name"] for h in hosts), pool.map(deploy_host, hosts), strict=True))
    print(json.dumps({"hosts": outcomes}))
    return 1 if any(o.startswith("failed") for o in outcomes.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
