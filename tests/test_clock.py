"""Issue 17, time on the host: clocks that disagree change nothing about what orch does.

The controller's clock is skewed with ``faketime --exclude-monotonic`` in front
of the real CLI; the host's with an interpreter wrapper (inventory ``python:``)
that runs the helper under ``faketime``, its offset read from a file the test
rewrites between runs (the host's clock stepped back). The monotonic clock is
never faked: it is what the watchdog counts its budget on. Every run goes to
the real sshd through the latency proxy. After each run the test checks the
exit code, the file by sha256, the server's argv and health, the journal, and
the order the host's records are in — which must be the order of the runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.core.nightly import builds_to_prune
from orchestrator.core.releases import ordered_ids, prune_candidates, resolve_release
from orchestrator.errors import ConfigError
from orchestrator.host.records import Manifest
from orchestrator.pipeline.nightly_report import load_nights
from tests.fixtures.proxy import TcpProxy
from tests.fixtures.sandbox import (
    SHIPPED_SPEC,
    Sandbox,
    cmdline,
    get_json,
    sha256,
    wait_healthy,
    wait_until,
)
from tests.test_nightly import NightBox, nightbox  # noqa: F401 - the fixture, used by name

FLAG = "--speculative-disable-batch-threshold"
SHIM = Path(__file__).parent / "fixtures" / "faketime_shim"  # time.sleep under faketime (see its docstring)


def with_shim(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the faketime shim first on ``PYTHONPATH``."""
    rest = env.get("PYTHONPATH")
    return dict(env, PYTHONPATH=f"{SHIM}:{rest}" if rest else str(SHIM))


SHM = Path("/dev/shm")
CLEAR_STALE_FAKETIME_SH = ('for s in /dev/shm/sem.faketime_sem_*; do p="${s##*_}"; '
                           '[ -d "/proc/$p" ] || rm -f "$s" "/dev/shm/faketime_shm_$p" 2>/dev/null; done\n')


def clear_stale_faketime() -> None:
    """Remove what ``faketime`` wrappers that were killed (a test's ``kill -9``) left in
    ``/dev/shm``: its semaphore and memory are named by the wrapper's pid, and a new wrapper
    that is given the same pid (they wrap at 32768 on a busy machine) fails at once with
    "sem_open: File exists". A live wrapper's are never touched. One shell snippet, which
    the host's wrapper also runs before each helper (``host_wrapper``)."""
    subprocess.run(["sh", "-c", CLEAR_STALE_FAKETIME_SH], check=True)


def faketime_works() -> None:
    """The fault these tests cause needs ``faketime`` to skew Python's wall clock and not its
    monotonic clock, and Python to sleep under it; fail loudly (never skip) where it does not."""
    clear_stale_faketime()
    probe = "import time; time.sleep(0.01); print(time.time(), time.monotonic())"
    faked = subprocess.run(["faketime", "--exclude-monotonic", "-f", "-1h", sys.executable, "-c", probe],
                           env=with_shim(dict(os.environ)), capture_output=True, text=True,
                           check=True).stdout.split()
    plain = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert float(plain[0]) - float(faked[0]) > 3000, "faketime does not move Python's wall clock"
    assert abs(float(plain[1]) - float(faked[1])) < 600, "faketime --exclude-monotonic fakes the monotonic clock"


def test_a_killed_faketime_wrappers_leftovers_are_cleared_and_a_live_ones_kept(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid no process has now (reaped)
    made = [SHM / f"sem.faketime_sem_{dead.pid}", SHM / f"faketime_shm_{dead.pid}",
            SHM / f"sem.faketime_sem_{os.getpid()}", SHM / f"faketime_shm_{os.getpid()}"]
    try:
        for path in made:
            path.write_bytes(b"\0" * 8)
        clear_stale_faketime()
        assert [p.exists() for p in made] == [False, False, True, True]
    finally:
        for path in made:
            path.unlink(missing_ok=True)


@dataclass
class Skewed:
    """The sandbox host behind the latency proxy, and controllers with their own clocks."""

    box: Sandbox
    proxy: TcpProxy
    host_offset: Path  # the host's faketime offset ("+0h"), read by the wrapper at each start

    def command(self, offset: str, *args: str) -> tuple[list[str], dict[str, str]]:
        """The real CLI under a controller clock ``offset`` from the true time ("-1h", "+1h")."""
        clear_stale_faketime()
        env = with_shim(dict(os.environ, COLUMNS="200", NO_COLOR="1", **self.box.extra_env))
        return (["faketime", "--exclude-monotonic", "-f", offset, sys.executable, "-m", "orchestrator", *args,
                 "--ssh-config", str(self.box.sshd.ssh_config)], env)

    def orch(self, offset: str, *args: str) -> subprocess.CompletedProcess[str]:
        cmd, env = self.command(offset, *args)
        return subprocess.run(cmd, cwd=self.box.root, env=env, capture_output=True, text=True, timeout=300)

    def json_run(self, offset: str, *args: str) -> tuple[int, dict[str, Any], str]:
        proc = self.orch(offset, *args, "--json")
        text = proc.stdout + proc.stderr
        try:
            return proc.returncode, json.loads(proc.stdout)["hosts"]["gpu"], text
        except (ValueError, KeyError):
            raise AssertionError(text) from None

    def history(self) -> list[dict[str, Any]]:
        code, rows, text = self.json_run("+0h", "history", "--host", "gpu")
        assert code == 0, text
        return list(rows)  # type: ignore[arg-type]

    def manifest(self, rid: str) -> dict[str, Any]:
        return dict(json.loads((self.box.state_dir / "releases" / rid / "manifest.json").read_text()))

    def on_disk(self) -> set[str]:
        return {p.name for p in (self.box.state_dir / "releases").iterdir()}


def host_wrapper(root: Path, offset_file: Path) -> Path:
    """An interpreter for the host's helper that runs it on a skewed wall clock. The helper
    starts with ``python -S``: ``ORCH_HELPER_SITE=1`` has it import the shim (a
    ``sitecustomize``) all the same."""
    wrapper = root / "skewed-python"
    wrapper.write_text("#!/bin/sh\n"
                       f'PYTHONPATH="{SHIM}${{PYTHONPATH:+:$PYTHONPATH}}"; ORCH_HELPER_SITE=1; '
                       'export PYTHONPATH ORCH_HELPER_SITE\n'
                       + CLEAR_STALE_FAKETIME_SH +
                       f'exec faketime --exclude-monotonic -f "$(cat {offset_file})" {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


@pytest.fixture
def skewed(sandbox: Sandbox) -> Iterator[Skewed]:
    faketime_works()
    proxy = TcpProxy(sandbox.sshd.port, delay=0.02)
    known = sandbox.root / "known_hosts_proxy"
    known.write_text(f"[127.0.0.1]:{proxy.port} {sandbox.sshd.host_key_pub}\n")
    offset = sandbox.root / "host-offset"
    offset.write_text("+0h")
    sandbox.write_inventory(port=proxy.port, known_hosts=str(known), keep_releases=4,
                            python=str(host_wrapper(sandbox.root, offset)))
    try:
        yield Skewed(sandbox, proxy, offset)
    finally:
        proxy.close()


def story(box: Sandbox, *, bad_flag: bool = False, held_by: Path | None = None) -> Path:
    """The story's playbook with short timeouts; ``bad_flag`` adds a flag the server's parser refuses,
    ``held_by`` makes the new server answer its health 503 until that file exists, and die just
    after (so its deploy is rolled back as soon as the test lets it go). The server is ready as
    soon as it listens (no stand-in startup delay: nothing here is about a slow start)."""
    spec = yaml.safe_load(SHIPPED_SPEC)
    env = {"STANDIN_STARTUP_DELAY": "0"}
    if held_by is not None:
        env.update(STANDIN_READY_FILE=str(held_by), STANDIN_EXIT_AFTER_READY="0.05")
    spec["server"].update(stop_timeout="5s", free_timeout="5s", preflight_timeout="15s", env=env)
    spec["health"].update(timeout="30s", stable_for="1s", confirm_timeout="1s", interval="0.2s")
    # health and the flag it reports; no /generate: on two shared cores its answer can outlast
    # the stability window's 1 s bound, and nothing here is about generation
    spec["health"]["checks"] = [c for c in spec["health"]["checks"] if "post" not in c]
    if bad_flag:
        spec["server"]["flags"]["--no-such-flag"] = 1
    path = box.root / ("refused.yaml" if bad_flag else "held.yaml" if held_by else "story.yaml")
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def serving(box: Sandbox) -> tuple[list[str], int | None]:
    """The server's argv and the threshold it reports, once it is healthy."""
    wait_healthy(box.port, 60)
    pid = box.server_pid()
    assert pid is not None
    return cmdline(pid), get_json(box.port, "/get_server_info").get("speculative_disable_batch_threshold")


def deploy(sk: Skewed, offset: str, threshold: int, patched: str | None) -> str:
    """A deploy that must succeed whatever the clocks: exit 0, file, argv, health, journal.

    ``patched``: the file's sha256 with the story's patch applied; None for the deploy
    that applies it (its manifest then says what the file must hold)."""
    box = sk.box
    code, rep, text = sk.json_run(offset, "deploy", "--host", "gpu", str(story(box)), "--var",
                                  f"threshold={threshold}")
    assert code == 0 and rep["outcome"] == "changed", text
    if patched is None:
        [entry] = sk.manifest(rep["release"])["files"]
        patched = entry["sha256_after"]
        assert entry["sha256_before"] != patched
    assert sha256(box.server_args) == patched
    argv, reported = serving(box)
    assert argv[-2:] == [FLAG, str(threshold)] and reported == threshold
    journal = box.journal()
    assert journal["release"] == rep["release"] and journal["step"] == "confirmed" and journal["finished"]
    return str(rep["release"])


def rollback(sk: Skewed, offset: str, undone: str, current: str | None) -> str:
    code, rep, text = sk.json_run(offset, "rollback", "--host", "gpu")
    assert code == 0 and rep["outcome"] == "rolled_back", text
    assert rep["undid"] == [undone] and rep["current"] == current, text
    return str(rep["release"])


def test_two_controllers_an_hour_either_side_of_the_host_deploy_and_roll_back_in_turn(
    skewed: Skewed,
) -> None:
    sk, box = skewed, skewed.box
    box.start_by_hand()
    original = sha256(box.server_args)
    behind, ahead = "-1h", "+1h"
    started = time.time()

    # deploy: behind, ahead, behind. Each is confirmed (an hour behind, the watchdog used to
    # restore each one at once; an hour ahead, it would have waited an hour too long)
    d1 = deploy(sk, behind, 32, None)
    patched = sha256(box.server_args)
    assert patched != original
    d2 = deploy(sk, ahead, 40, patched)
    d3 = deploy(sk, behind, 48, patched)
    for rid in (d1, d2, d3):
        manifest = sk.manifest(rid)
        watchdog = json.loads((box.state_dir / "releases" / rid / "watchdog.json").read_text())
        # every time recorded is the host's: between the test's start and now on this (the host's) clock
        assert started <= manifest["created"] <= manifest["finished"] <= time.time()
        assert started <= watchdog["armed"] <= time.time()
        assert watchdog["fires_at"] == pytest.approx(watchdog["armed"] + manifest["watchdog_budget"])
        assert watchdog["budget"] == manifest["watchdog_budget"] > 0
        assert json.loads((box.state_dir / "releases" / rid / "claim.json").read_text())["by"] == "confirmed"
    assert [sk.manifest(r)["seq"] for r in (d1, d2, d3)] == [1, 2, 3]
    rows = sk.history()
    assert [r["id"] for r in rows] == [d1, d2, d3]
    assert [r["current"] for r in rows] == [False, False, True]

    # roll back in turn: each goes one step further back, in the order of the deploys
    rb1 = rollback(sk, ahead, d3, d2)
    assert serving(box)[1] == 40
    rb2 = rollback(sk, behind, d2, d1)
    assert serving(box)[1] == 32
    assert sha256(box.server_args) == patched

    # keep_releases 4: d4 makes six releases; the two oldest not in effect go (d2, d3), as without skew
    d4 = deploy(sk, ahead, 56, patched)
    assert sk.on_disk() == {d1, rb1, rb2, d4}
    assert [r["id"] for r in sk.history()] == [d1, rb1, rb2, d4]

    rollback(sk, behind, d4, d1)
    assert serving(box)[1] == 32
    rollback(sk, ahead, d1, None)
    assert sha256(box.server_args) == original
    assert serving(box)[0] == box.hand_argv
    assert box.journal()["finished"] is True and box.journal()["step"] == "done"



def test_a_held_lock_shows_since_when_on_the_hosts_clock(skewed: Skewed) -> None:
    """A controller an hour ahead is refused by the lock of one an hour behind; the holder is
    shown since the time the host took the lock, on the host's clock."""
    sk, box = skewed, skewed.box
    box.start_by_hand()
    original = sha256(box.server_args)
    started = time.time()
    let_go = box.root / "let-go"
    cmd, env = sk.command("-1h", "deploy", "--host", "gpu", str(story(box, held_by=let_go)), "--json")
    first = subprocess.Popen(cmd, cwd=box.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: box.journal().get("step") == "restarting", "the first deploy's restart")
        lock = json.loads((box.state_dir / "lock.json").read_text())
        assert started <= lock["since"] == lock["taken"] <= time.time()  # the host's clock, not -1h
        code, rep, text = sk.json_run("+1h", "deploy", "--host", "gpu", str(story(box)))
        assert code == 2 and rep["outcome"] == "failed", text
        since = datetime.fromtimestamp(lock["taken"], timezone.utc).strftime("%H:%M:%S")
        assert "locked by" in rep["error"] and f"since {since} UTC, host clock" in rep["error"], text
    finally:
        let_go.write_text("")  # the first deploy's new server: healthy, then gone at once
        out, err = first.communicate(timeout=240)
    assert first.returncode == 1, out + err  # its new server did not stay healthy: rolled back
    assert json.loads(out)["hosts"]["gpu"]["outcome"] == "rolled_back"
    assert sha256(box.server_args) == original and serving(box)[0] == box.hand_argv
    assert box.journal()["finished"] is True


def test_a_host_an_hour_ahead_then_stepped_back_keeps_the_order_of_the_deploys(skewed: Skewed) -> None:
    sk, box = skewed, skewed.box
    box.start_by_hand()
    original = sha256(box.server_args)
    started = time.time()
    sk.host_offset.write_text("+1h")  # the host's clock is an hour ahead of the controller's
    d1 = deploy(sk, "+0h", 32, None)
    patched = sha256(box.server_args)
    assert sk.manifest(d1)["created"] >= started + 3000  # stamped on the host's clock, not ours
    rb1 = rollback(sk, "+0h", d1, None)
    assert sha256(box.server_args) == original and serving(box)[0] == box.hand_argv

    sk.host_offset.write_text("+0h")  # ... and is stepped back an hour
    code, rep, text = sk.json_run("+0h", "deploy", "--host", "gpu", str(story(box, bad_flag=True)))
    assert code == 1 and rep["outcome"] == "rolled_back", text  # the pre-flight refuses the flag
    failed = str(rep["release"])
    assert sha256(box.server_args) == original and serving(box)[0] == box.hand_argv
    assert failed < d1 < rb1  # the ids, stamped an hour earlier, misorder; the sequence does not
    assert [r["id"] for r in sk.history()] == [d1, rb1, failed]

    d2 = deploy(sk, "+0h", 40, patched)
    d3 = deploy(sk, "+0h", 48, patched)
    # keep_releases 4, five releases: the oldest not in effect goes — d1, not the failed deploy
    # that sorts first by id
    assert sk.on_disk() == {rb1, failed, d2, d3}
    rows = sk.history()
    assert [r["id"] for r in rows] == [rb1, failed, d2, d3]
    assert [r["current"] for r in rows] == [False, False, False, True]
    assert [sk.manifest(r)["seq"] for r in (rb1, failed, d2, d3)] == [2, 3, 4, 5]

    # orch rollback walks back in the order of the deploys
    rollback(sk, "+0h", d3, d2)
    assert serving(box)[1] == 40 and sha256(box.server_args) == patched
    rollback(sk, "+0h", d2, None)
    assert sha256(box.server_args) == original and serving(box)[0] == box.hand_argv
    assert box.journal()["finished"] is True


def test_nights_on_a_host_stepped_back_an_hour_keep_builds_and_history_in_the_order_they_ran(
    nightbox: NightBox,  # noqa: F811 - the fixture imported above
) -> None:
    box = nightbox.box
    faketime_works()
    proxy = TcpProxy(box.sshd.port, delay=0.02)
    known = box.root / "known_hosts_proxy"
    known.write_text(f"[127.0.0.1]:{proxy.port} {box.sshd.host_key_pub}\n")
    offset = box.root / "host-offset"
    offset.write_text("+1h")
    box.write_inventory(port=proxy.port, known_hosts=str(known), python=str(host_wrapper(box.root, offset)),
                        vars={"model": "/models/standin", "port": box.port, "source_repo": str(nightbox.src),
                              "builds_root": str(nightbox.builds)})
    nightbox.write_spec(keep_builds=3, probe=False)
    try:
        names: list[str] = []
        # the first night on a host an hour ahead; then its clock is stepped back an hour
        for skew, threshold in (("+1h", 16), ("+0h", 24), ("+0h", 32), ("+0h", 40)):
            offset.write_text(skew)
            proc, data = nightbox.night("--var", f"threshold={threshold}")
            assert proc.returncode == 0, proc.stdout + proc.stderr
            names.append(data["hosts"]["gpu"]["build"])
            assert nightbox.current() == names[-1]
            wait_healthy(box.port, 60)
            assert get_json(box.port, "/get_server_info")["speculative_disable_batch_threshold"] == threshold
        assert names[1] < names[2] < names[3] < names[0]  # the names, stamped on the host's clock, misorder

        # keep_builds 3: the oldest night's build goes (not the second, whose name sorts first)
        kept = {p.name for p in nightbox.builds.iterdir() if p.name not in ("current", "logs", ".cache")}
        assert kept == set(names[1:])
        seqs = [json.loads((nightbox.builds / n / "manifest.json").read_text())["seq"] for n in names[1:]]
        assert seqs == [2, 3, 4]
        rows = json.loads(box.orch("history", "--host", "gpu", "--json", "--ssh-config",
                                   str(box.sshd.ssh_config)).stdout)["hosts"]["gpu"]
        assert [r["id"] for r in rows] == names
        # the first night's build is gone (keep_builds 3): history says so, as `orch rollback` cannot reach it
        assert [r["outcome"] for r in rows] == ["good; build pruned", "good", "good", "current"]
        assert [r["build_pruned"] for r in rows] == [True, False, False, False]
        assert [n["night"] for n in load_nights(nightbox.reports)] == names  # the trend's order too

        # orch rollback switches back to the night before, by the order they ran
        back = box.orch("rollback", "--host", "gpu", "--json", "--ssh-config", str(box.sshd.ssh_config))
        assert back.returncode == 0, back.stdout + back.stderr
        assert json.loads(back.stdout)["hosts"]["gpu"]["current"] == names[2]
        assert nightbox.current() == names[2]
        wait_healthy(box.port, 60)
        assert get_json(box.port, "/get_server_info")["speculative_disable_batch_threshold"] == 32
    finally:
        proxy.close()


# ---------------------------------------------------------------- the order, as pure functions


def test_records_of_earlier_versions_come_first_by_id_then_the_hosts_sequence() -> None:
    """Releases without ``seq`` (written before it existed) keep their old order, by id, before any
    release with one; those with one follow ``seq`` whatever their ids say."""
    old1, old2 = "20261129T100000000-aaaa", "20261130T100000000-bbbb"
    late_stamp, early_stamp = "20261201T120000000-cccc", "20261201T110000000-dddd"  # made in this order
    manifests = [Manifest.from_wire(m) for m in
                 ({"id": early_stamp, "seq": 2}, {"id": old2}, {"id": late_stamp, "seq": 1}, {"id": old1})]
    order = ordered_ids(manifests)
    assert order == [old1, old2, late_stamp, early_stamp]
    assert prune_candidates(order, applied=[old2, early_stamp], keep=2) == [old1, late_stamp]
    # "the latest" that a wrong --to names are the newest by sequence
    with pytest.raises(ConfigError) as refused:
        resolve_release("nope", [], {m.id: m for m in manifests})
    assert f"the latest: {early_stamp}, {late_stamp}, {old2}" in str(refused.value)


def test_keep_builds_prunes_by_sequence_and_builds_without_one_first() -> None:
    legacy, first, second, third, fourth = "20261130T0-aaaaaaa", "20261201T2-bbbbbbb", "20261201T0-ccccccc", \
        "20261201T1-ddddddd", "20261201T3-eeeeeee"
    seqs = {first: 1, second: 2, third: 3, fourth: 4}  # ``second`` was named an hour earlier than ``first``
    builds = [legacy, first, second, third, fourth]
    assert builds_to_prune(builds, fourth, third, keep=3, seqs=seqs) == [legacy, first]
    assert builds_to_prune(builds, fourth, third, keep=3) == [legacy, second]  # by name: the misorder
