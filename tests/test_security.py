"""Issue 16 items 1 and 12: a local user who can write in a target's directory.

The shared-tree case, for real: ``srt/`` is ``root:orchtest-devs 2775``,
``server_args.py`` belongs to the developer ``orchtest-dev`` (0664), and that
user — a real second account, see tests/fixtures/attacker.py — plants links
to a root-only file (0600) at every name orch writes, while root deploys,
rolls back and the watchdog restores, over a link with real latency. The
root-only file must be untouched (sha256, mode, owner), the target restored
as a regular file with its owner and mode, and what was refused reported.

Item 12: what a killed helper or a dead run left beside a target (orch's
exact names, this uid's regular files) goes at the next deploy; a file of a
similar name owned by another user, or a link, is never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.standin import make_tree
from tests.fixtures.attacker import attacking, ensure_user, owner_mode, run_as
from tests.fixtures.proxy import TcpProxy
from tests.fixtures.sandbox import (
    SHIPPED_SPEC,
    Sandbox,
    quick_stability,
    sha256,
    wait_healthy,
    wait_until,
)
from tests.fixtures.sshd import SshdServer, free_port
from tests.test_faults import finish, read, release_dirs, story

SECRET = b"root:only:do-not-touch\n"


@dataclass
class Shared:
    box: Sandbox
    proxy: TcpProxy
    work: Path  # world-traversable: the other user reaches srt/ and runs its script from here
    victim: Path  # the root-only file every planted link points at
    uid: int
    gid: int

    @property
    def srt(self) -> Path:
        return self.box.server_args.parent

    def victim_state(self) -> tuple[str, tuple[int, int, int]]:
        return sha256(self.victim), owner_mode(self.victim)

    def assert_target_restored(self, original: str) -> None:
        target = self.box.server_args
        assert not target.is_symlink() and target.is_file()
        assert sha256(target) == original
        assert owner_mode(target) == (self.uid, self.gid, 0o664)

    def orch_leftovers(self) -> list[str]:
        """orch's own names still in srt/ (links the attacker planted are the attacker's)."""
        return sorted(p.name for p in self.srt.iterdir()
                      if "orch" in p.name and not p.is_symlink() and p.lstat().st_uid == 0
                      and "moved-by-attacker" not in p.name)


@pytest.fixture
def shared(tmp_path: Path, sshd: SshdServer) -> Iterator[Shared]:
    uid, gid = ensure_user()
    work = Path(tempfile.mkdtemp(prefix="orch-sec-", dir="/tmp"))
    work.chmod(0o755)
    root = make_tree(work / "box")
    box = Sandbox(tmp_path, sshd, free_port(), root, tmp_path / "state")
    (tmp_path / "playbooks").mkdir(exist_ok=True)
    (tmp_path / "playbooks" / "speculative-disable.yaml").write_text(quick_stability(SHIPPED_SPEC))
    srt = box.server_args.parent
    os.chown(srt, 0, gid)
    srt.chmod(0o2775)
    os.chown(box.server_args, uid, gid)
    box.server_args.chmod(0o664)
    victim = work / "root-only"
    victim.write_bytes(SECRET)
    victim.chmod(0o600)
    proxy = TcpProxy(sshd.port, delay=0.02)
    known = tmp_path / "known_hosts_proxy"
    known.write_text(f"[127.0.0.1]:{proxy.port} {sshd.host_key_pub}\n")
    box.write_inventory(port=proxy.port, known_hosts=str(known))
    try:
        yield Shared(box, proxy, work, victim, uid, gid)
    finally:
        proxy.close()
        box.stop_all()
        shutil.rmtree(work, ignore_errors=True)


def gate_validator(go: Path) -> str:
    """A validator that holds the deploy with its staged copy in place until the test creates ``go``."""
    return f"sh -c 'while [ ! -e {go} ]; do sleep 0.05; done'"


def helper_pid(box: Sandbox) -> int:
    return int(read(box.state_dir / "lock.json")["agent_pid"])


def plant_at_target(s: Shared) -> None:
    """The other user replaces the target itself with a link to the root-only file."""
    run_as(s.uid, s.gid, "import os, sys; t = sys.argv[1] + '.x'; os.symlink(sys.argv[2], t); "
           "os.rename(t, sys.argv[1])", str(s.box.server_args), str(s.victim))
    assert s.box.server_args.is_symlink()


# ---------------------------------------------------------------- item 1: the attack, reproduced


def test_links_planted_at_orchs_names_during_a_failing_deploy_never_redirect_its_restore(shared: Shared) -> None:
    """The issue's attack: a link at the helper's old temp name (its pid is in ``ps``), and a
    loop swapping every ``.*orch*`` name that appears, while the deploy's server fails and
    the controller restores."""
    s, box = shared, shared.box
    box.start_by_hand()
    original, victim = sha256(box.server_args), s.victim_state()
    go, up = box.root / "go", box.root / "up"
    playbook = story(box, env={"STANDIN_READY_FILE": str(up), "STANDIN_EXIT_AFTER_READY": "0.1"},
                     validate=[gate_validator(go)])
    with attacking(s.work, s.srt, s.victim, box.server_args, "predict") as predictor:
        proc = box.start_orch("deploy", "--host", "gpu", "--json", str(playbook))
        wait_until(lambda: (box.state_dir / "lock.json").exists() and list(s.srt.glob(".*orch-staged-*")),
                   "the staged copy")
        pid = helper_pid(box)
        wait_until(lambda: predictor.planted(f".server_args.py.orch-tmp-{pid}"), "the link at the helper's old name")
        go.write_text("")  # the commit goes ahead; the new server waits for `up`
        wait_until(lambda: box.journal().get("step") == "restarting", "the restart")
        with attacking(s.work, s.srt, s.victim, box.server_args, "swap") as swapper:
            wait_until(lambda: "ready" in swapper.lines(), "the swapping loop")
            up.write_text("")  # the new server comes up, then dies: the restore runs under attack
            code, rep, text = finish(proc)
    assert s.victim_state() == victim, text
    assert code == 1, text
    assert rep["outcome"] == "rolled_back" and box.journal()["step"] == "rolled_back", text
    s.assert_target_restored(original)
    wait_healthy(box.port, 60)
    assert (s.srt / f".server_args.py.orch-tmp-{pid}").is_symlink()  # planted, and never used
    assert s.orch_leftovers() == []


def test_a_staged_copy_swapped_for_a_link_while_validated_is_refused(shared: Shared) -> None:
    """The validator must judge the file orch wrote: a swap is refused, nothing is committed."""
    s, box = shared, shared.box
    pid = box.start_by_hand()
    original, victim = sha256(box.server_args), s.victim_state()
    go = box.root / "go"
    with attacking(s.work, s.srt, s.victim, box.server_args, "swap") as swapper:
        proc = box.start_orch("deploy", "--host", "gpu", "--json", str(story(box, validate=[gate_validator(go)])))
        wait_until(lambda: any(line.startswith("swap .server_args.orch-staged-") for line in swapper.lines()),
                   "the other user to swap the staged copy")
        go.write_text("")
        code, rep, text = finish(proc)
    assert code == 2, text
    # the swap lands after orch's checks of its copy (replaced), or, on a busy machine, between
    # its exclusive create and the check that the name is still that file (not made by orch):
    # the same refusal either way, whoever wins that race
    said = rep["error"]
    assert ("was replaced by a file orch did not write" in said or "orch did not make it" in said) and "refused" in said, text
    assert s.victim_state() == victim
    assert sha256(box.server_args) == original and owner_mode(box.server_args) == (s.uid, s.gid, 0o664)
    assert box.server_pid() == pid and release_dirs(box) == []


def test_the_runners_restore_replaces_a_link_planted_at_the_target_and_says_so(shared: Shared) -> None:
    """The controller dies after the commit; the other user points the target at the root-only
    file and plants at the runner's temp name. The runner's restore follows neither."""
    s, box = shared, shared.box
    box.start_by_hand()
    original, victim = sha256(box.server_args), s.victim_state()
    with attacking(s.work, s.srt, s.victim, box.server_args, "predict") as predictor:
        proc = box.start_orch("deploy", "--host", "gpu",
                              str(story(box, env={"STANDIN_NEVER_READY": "1"}, timeout="20s")))
        wait_until(lambda: box.journal().get("step") == "restarting", "the restart")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        release = release_dirs(box)[-1]
        runner = int(read(release / "runner.json")["pid"])
        wait_until(lambda: predictor.planted(f".server_args.py.orch-tmp-{runner}"), "the link at the runner's name")
        plant_at_target(s)
        wait_until(lambda: box.journal().get("finished"), "the runner's restore", 240)
    assert box.journal()["step"] == "rolled_back"
    assert s.victim_state() == victim
    s.assert_target_restored(original)
    record = read(release / "restored.json")
    assert record["ok"] is True and record["by"] == "runner"
    refused = record["files"][0]["refused"]
    assert any(f"is a link made by uid {s.uid}" in why and str(s.victim) in why for why in refused), refused
    wait_healthy(box.port, 60)
    assert s.orch_leftovers() == []


def test_orch_rollback_replaces_a_link_planted_at_the_target_and_reports_it(shared: Shared) -> None:
    s, box = shared, shared.box
    box.start_by_hand()
    original, victim = sha256(box.server_args), s.victim_state()
    # refused, the controller tries again every 5 s for 6 connect timeouts: 14.4 s (tries at 0, 5, 10 s)
    proc = box.start_orch("deploy", "--host", "gpu", "--json", "--connect-timeout", "2.4",
                          str(story(box, env={"STANDIN_NEVER_READY": "1"}, timeout="5m")))
    wait_until(lambda: box.journal().get("step") == "restarting", "the restart")
    s.proxy.refuse()
    code, _, text = finish(proc)
    assert code == 3, text
    # a reboot's worth: the runner and its guard gone, the release unfinished
    ran = read(release_dirs(box)[-1] / "runner.json")
    os.kill(ran["guard"], signal.SIGKILL)
    wait_until(lambda: not Path(f"/proc/{ran['guard']}/status").exists()
               or "Z" in Path(f"/proc/{ran['guard']}/status").read_text().split("State:")[1][:4], "the guard's end")
    os.kill(ran["pid"], signal.SIGKILL)
    box.write_inventory()  # a route back, straight to sshd
    plant_at_target(s)
    with attacking(s.work, s.srt, s.victim, box.server_args, "swap"):
        back = box.orch("rollback", "--host", "gpu")
    assert back.returncode == 0, back.stdout + back.stderr
    assert "REFUSED a planted file or link" in back.stdout + back.stderr, back.stdout + back.stderr
    assert s.victim_state() == victim
    s.assert_target_restored(original)
    wait_healthy(box.port, 60)


# ---------------------------------------------------------------- item 12: leftovers


def test_the_next_deploy_removes_orchs_leftovers_and_nothing_else(shared: Shared) -> None:
    s, box = shared, shared.box
    box.start_by_hand()
    victim = s.victim_state()
    srt = s.srt
    # what a killed helper and a dead run leave: root's, orch's exact names
    old_tmp = srt / ".server_args.py.orch-tmp-31337"  # a flat temp file (older helpers), a full copy
    old_tmp.write_bytes(box.server_args.read_bytes())
    old_tmp.chmod(0o600)
    tmp_dir = srt / ".server_args.py.orch-tmp-0123456789abcdef"  # a private temp directory, killed mid-write
    tmp_dir.mkdir(mode=0o700)
    (tmp_dir / "new").write_text("half")
    staged = srt / ".server_args.orch-staged-deadbeef.py"  # a Ctrl-C'd run's staged copy, just made
    staged.write_text("x = 1\n")
    # what is not orch's to remove
    run_as(s.uid, s.gid, "import os, sys\n"
           "open(sys.argv[1] + '/.server_args.py.orch-tmp-4242', 'w').write('mine')\n"
           "open(sys.argv[1] + '/.server_args.orch-staged-cafe.py', 'w').write('mine')\n"
           "os.symlink(sys.argv[2], sys.argv[1] + '/.server_args.py.orch-tmp-abcd')\n", str(srt), str(s.victim))
    (srt / ".server_args.py.orch-tmp-1").symlink_to(box.server_args)  # a link, even root's
    (srt / ".server_args.py.orch-tmp-notes").write_text("not orch's pattern")
    kept = sorted([".server_args.py.orch-tmp-4242", ".server_args.orch-staged-cafe.py", ".server_args.py.orch-tmp-abcd",
                   ".server_args.py.orch-tmp-1", ".server_args.py.orch-tmp-notes"])
    done = box.orch("deploy", "--host", "gpu", "--json", str(story(box)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["hosts"]["gpu"]["outcome"] == "changed"
    assert not old_tmp.exists() and not tmp_dir.exists() and not staged.exists()
    assert sorted(p.name for p in srt.iterdir() if "orch" in p.name) == kept
    assert (srt / ".server_args.py.orch-tmp-4242").read_text() == "mine"
    assert s.victim_state() == victim
    assert owner_mode(box.server_args) == (s.uid, s.gid, 0o664) and not box.server_args.is_symlink()
