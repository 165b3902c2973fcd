"""A rollback whose link is lost after its hand-over follows its runner again (issue 19, item 5).

The rollback, like a deploy after its commit, belongs to the host's runner once it is handed
on; a link severed while the runner restores is retried, and the controller follows the
runner's log on from the last line it saw, to the verdict, and exits with its code. Over
real sshd behind the 20 ms proxy; the restored server's start is held from outside (its
``STANDIN_READY_FILE``), so the link is cut while the restore is at work, never by luck.
"""

from __future__ import annotations

import json

from tests.fixtures.sandbox import cmdline, sha256, wait_healthy, wait_until
from tests.test_faults import Link, read
from tests.test_faults import link as link  # noqa: F401 - the fixture, used by name
from tests.test_rollback_runner import deployed_then_held, rollback_release, verdicts


def test_link_severed_mid_restore_the_rollback_reconnects_and_exits_with_the_verdict(link: Link) -> None:
    box = link.box
    gate, original, patched = deployed_then_held(box)
    assert patched != original
    proc = box.start_orch("rollback", "--host", "gpu", "--json")
    release = rollback_release(box)  # its runner has started the previous server, which waits
    connections = link.proxy.connections
    link.proxy.sever()
    gate.write_text("")
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, out + err
    report = json.loads(out)["hosts"]["gpu"]
    assert report["outcome"] == "rolled_back" and report["release"] == release.name, report
    assert "connecting again to follow it" in err, err
    assert link.proxy.connections > connections  # it did connect again
    assert verdicts(release) == ["confirmed"]
    record = read(release / "restored.json")
    assert record["by"] == "rollback" and record["ok"] is True
    assert read(release / "reported.json")["by"]["command"] == "rollback"
    manifest = read(release / "manifest.json")
    assert manifest["finished"] and manifest["duration"] is not None  # written after the follow
    assert sha256(box.server_args) == original
    wait_healthy(box.port, 60)
    assert cmdline(box.server_pid()) == box.hand_argv
    assert read(box.state_dir / "state.json")["applied"] == []


def test_reconnects_refused_mid_restore_the_rollback_is_exit_3_and_the_host_finishes_it(link: Link) -> None:
    box = link.box
    gate, original, _patched = deployed_then_held(box)
    proc = box.start_orch("rollback", "--host", "gpu", "--json", "--connect-timeout", "2")
    release = rollback_release(box)
    link.proxy.refuse()  # severed, and no way back: orch tries to connect again, in vain
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 3, out + err
    report = json.loads(out)["hosts"]["gpu"]
    assert report["outcome"] == "unreachable" and report["release"] == release.name, report
    assert "connecting again to follow it" in err, err
    assert "the host finishes it by itself" in report["error"], report
    assert "orch status --follow --host gpu" in report["error"], report
    gate.write_text("")  # the restored server comes up: the runner ends the rollback alone
    wait_until(lambda: verdicts(release), "the runner's verdict", 120)
    assert verdicts(release) == ["confirmed"]
    assert read(release / "restored.json")["by"] == "rollback"
    assert sha256(box.server_args) == original
    box.write_inventory()  # a route back, straight to sshd
    follow = box.orch("status", "--follow", "--host", "gpu")
    assert follow.returncode == 0, follow.stdout + follow.stderr
    assert read(release / "reported.json")["by"]["command"] == "status --follow"  # the follower reported it
