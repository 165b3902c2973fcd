"""Ctrl-C twice at the pre-flight (issue 19, item 4's table): the second one stops the following
with one line naming the release and ``orch status --follow``, exit 3, and the runner still
finishes: it aborts and restores.

At the pre-flight the old server was never stopped, so the abort's restore puts files back
and restarts nothing: it has no moment of its own to hold. The moment is held on the link
instead: it stalls before the first Ctrl-C, so the abort that Ctrl-C sends waits in the
proxy (in order, as a route that stalls holds it) while the controller waits for the verdict;
the second Ctrl-C lands there. When the route comes back the abort reaches the host, and the
runner ends the pre-flight and restores, with no controller left to see it. Over real sshd
behind the 20 ms proxy.
"""

from __future__ import annotations

import json
import signal

from tests.fixtures.sandbox import wait_until
from tests.test_faults import Link, finish
from tests.test_faults import link as link  # noqa: F401 - the fixture, used by name
from tests.test_runner_held import assert_restored, start_held, verdicts


def test_ctrl_c_twice_at_the_preflight_stops_following_and_the_runner_still_restores(link: Link) -> None:
    box = link.box
    h = start_held(box, "preflight")
    link.proxy.stall()
    h.proc.send_signal(signal.SIGINT)
    # the first Ctrl-C is acknowledged at once, naming what a second one does
    acknowledged = []
    assert h.proc.stderr is not None
    while not any("Ctrl-C again" in line for line in acknowledged):
        line = h.proc.stderr.readline()
        assert line, "the controller ended without acknowledging the first Ctrl-C"
        acknowledged.append(line)
    h.proc.send_signal(signal.SIGINT)
    code, report, out = finish(h.proc)
    out = "".join(acknowledged) + out
    assert code == 3, out
    assert report["outcome"] == "unreachable" and report["release"] == h.release.name, out
    assert report["error"].startswith(f"interrupted again: orch stopped following release {h.release.name}"), out
    assert "`orch status --follow --host gpu`" in report["error"] and "Traceback" not in out
    assert verdicts(h.release) == []  # the abort has not reached the host yet
    link.proxy.unstall()  # the route comes back: the abort arrives; the runner ends the pre-flight and restores
    wait_until(lambda: verdicts(h.release), "the runner's verdict without a controller", 120)
    assert_restored(box, h, "runner")
    assert not h.go.exists()  # nothing let the pre-flight go: the abort ended it
    follower = box.orch("status", "--follow", "--host", "gpu", "--json")
    assert follower.returncode == 1, follower.stdout + follower.stderr
    followed = json.loads(follower.stdout)["hosts"]["gpu"]
    assert followed["outcome"] == "rolled_back" and followed["release"] == h.release.name, followed
