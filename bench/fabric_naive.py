"""Baseline "fabric-naive": the story as a careful engineer would script it by hand with Fabric.

One ``c.run`` / ``c.put`` per step, over one Fabric connection, the way such a
script usually looks: back up, upload the patched file, ``py_compile`` it, read
the changed lines back, stop the server by pid, start it with the new flag,
poll ``/health`` with ``curl`` until 200, then check ``/get_server_info`` and
``/generate``. Every file repeats its four steps.

The patched files are made before the run (by orch's own edit engine, so the
bytes are the ones orch writes): the script only ships them. It knows the
server's command line, as its author would. No lock, no release record, no
rollback: that is the "naive".

Run by ``bench_deploy.py`` as its own process (like ``orch`` is), with a JSON
job file: ``python bench/fabric_naive.py JOB.json``. Prints one JSON line
``{"runs": N, "puts": M, "polls": K, "steps": [[command, seconds], ...]}``; exits 1 (message on stderr) on failure.

``bench_fleet.py`` gives it ``{"forks": K, "hosts": [job, ...]}``: the same
steps for every host, on K threads, one connection each; it prints
``{"hosts": {name: "changed"|"failed: ..."}}`` and exits 1 if a host failed.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def deploy_one(job: dict[str, Any]) -> dict[str, Any]:
    """The story on one host, step by step; ``{"runs", "puts", "polls", "steps"}``; raises on failure."""
    import paramiko
    from fabric import Config, Connection

    config = Config(overrides={"load_ssh_configs": False, "run": {"hide": True, "in_stream": False}})
    c = Connection(
        job["address"], user=job["user"], port=job["ssh_port"], config=config,
        connect_kwargs={"key_filename": job["identity_file"], "look_for_keys": False, "allow_agent": False},
    )
    c.client.load_host_keys(job["known_hosts"])
    c.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    runs = puts = polls = 0
    steps: list[tuple[str, float]] = []  # (command, seconds): where the time went

    def run(cmd: str, warn: bool = False) -> Any:
        nonlocal runs
        runs += 1
        start = time.perf_counter()
        try:
            return c.run(cmd, warn=warn)
        finally:
            steps.append((cmd.split()[0], round(time.perf_counter() - start, 3)))

    py = shlex.quote(job["python"])
    port = job["port"]
    url = f"http://127.0.0.1:{port}"
    try:
        for entry in job["files"]:
            path = shlex.quote(entry["path"])
            run(f"cp -p {path} {path}.bak")
            c.put(entry["patched"], entry["path"])
            puts += 1
            run(f"{py} -m py_compile {path}")
            script = ";".join(f"{a},{b}p" for a, b in entry["ranges"])
            shown = run(f"sed -n {shlex.quote(script)} {path}").stdout
            if job["flag_name"].lstrip("-").replace("-", "_") not in shown:
                raise RuntimeError(f"read-back of {entry['path']} does not show the change")

        pattern = shlex.quote(f"[s]glang.launch_server.*--port {port}")
        run(f"pid=$(pgrep -f {pattern}) && kill $pid && while kill -0 $pid 2>/dev/null; do sleep 0.1; done")
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in job["env"].items())
        argv = shlex.join(job["argv"])
        # The braces matter: with a bare `cd X && cmd &` the backgrounded subshell keeps the
        # channel's stdout open and c.run waits for the server to exit.
        run(f"cd {shlex.quote(job['cwd'])} && {{ env {env} nohup setsid {argv} "
            f"> {shlex.quote(job['log'])} 2>&1 < /dev/null & }}")

        deadline = time.monotonic() + job["timeout"]
        while True:
            polls += 1
            if run(f"curl -sf -o /dev/null {url}/health", warn=True).ok:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("server not healthy in time")
            time.sleep(job["poll"])

        info = json.loads(run(f"curl -sf {url}/get_server_info").stdout)
        if info.get(job["flag_name"].lstrip("-").replace("-", "_")) != job["threshold"]:
            raise RuntimeError(f"server reports {info!r}")
        body = shlex.quote(json.dumps({"text": "ping", "sampling_params": {"max_new_tokens": 4}}))
        out = run(f"curl -sf -H 'Content-Type: application/json' -d {body} {url}/generate").stdout
        if '"text"' not in out:
            raise RuntimeError(f"/generate answered {out!r}")
    finally:
        c.close()
    return {"runs": runs, "puts": puts, "polls": polls, "steps": steps}


def deploy_fleet(fleet: dict[str, Any]) -> dict[str, str]:
    """Every host of ``{"forks": K, "hosts": [...]}`` on K threads; name -> "changed" or "failed: ..."."""
    def one(job: dict[str, Any]) -> str:
        try:
            deploy_one(job)
            return "changed"
        except Exception as exc:  # noqa: BLE001 - per host, the others go on
            return f"failed: {type(exc).__name__}: {str(exc).strip()[:300]}"

    with ThreadPoolExecutor(max_workers=fleet["forks"]) as pool:
        return dict(zip((h["name"] for h in fleet["hosts"]), pool.map(one, fleet["hosts"]), strict=True))


def main(job_path: str) -> int:
    with open(job_path) as f:
        job: dict[str, Any] = json.load(f)
    if "hosts" in job:  # the fleet bench: many hosts, threads
        outcomes = deploy_fleet(job)
        print(json.dumps({"hosts": outcomes}))
        return 1 if any(o.startswith("failed") for o in outcomes.values()) else 0
    try:
        result = deploy_one(job)
    except Exception as exc:  # noqa: BLE001 - a baseline script: one line and a non-zero exit
        print(f"fabric-naive failed: {type(exc).__name__}: {str(exc).strip()[:500]}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
