"""``-q`` says each host's outcome in one line, and ``-vv`` never prints a line of
tens of thousands of characters (issue 21's table, rows ``-q`` and ``-vv``).

The real ``orch`` in a subprocess over real sshd, against the stand-in server.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.fixtures.sandbox import SHIPPED_SPEC, Sandbox, quick_stability
from tests.test_cli import REPO, run


def test_quiet_status_and_history_say_one_line_per_host(sandbox: Sandbox) -> None:
    history = run(sandbox, "history", "--host", "gpu", "-q")
    assert history.returncode == 0, history.stderr
    lines = history.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu: no releases: orch has never deployed"), lines
    # the story, stable for 0.2 s, as the sandbox's own: each restart here waits it out
    sandbox.root.joinpath("playbooks", "speculative-disable.yaml").write_text(quick_stability(SHIPPED_SPEC, "0.2s"))
    sandbox.start_by_hand()
    deployed = run(sandbox, "deploy", "--host", "gpu", "-q", "speculative-disable")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    status = run(sandbox, "status", "--host", "gpu", "-q")
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.splitlines() == ["gpu: ok"]
    history = run(sandbox, "history", "--host", "gpu", "-q")
    lines = history.stdout.splitlines()
    assert len(lines) == 1 and re.fullmatch(r"gpu: current \S+, 1 release", lines[0]), history.stdout
    sandbox.stop_all()  # the server gone: status names the problem in its one line, exit 3
    status = run(sandbox, "status", "--host", "gpu", "-q")
    assert status.returncode == 3
    assert len(status.stdout.splitlines()) == 1 and status.stdout.startswith("gpu: server not"), status.stdout


def test_protocol_lines_elide_big_values(sandbox: Sandbox) -> None:
    # the story, stable for 0.2 s, as the sandbox's own: each restart here waits it out
    sandbox.root.joinpath("playbooks", "speculative-disable.yaml").write_text(quick_stability(SHIPPED_SPEC, "0.2s"))
    sandbox.start_by_hand()
    # two releases make the state read big: some 14,000 characters in one line, elided to <= 4,000
    for threshold in (8, 32):
        deployed = run(sandbox, "deploy", "--host", "gpu", "-q", "--var", f"threshold={threshold}",
                       "speculative-disable")
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    proc = run(sandbox, "history", "--host", "gpu", "-vv")
    assert proc.returncode == 0, proc.stderr
    protocol = [line for line in proc.stdout.splitlines() if line.startswith(("gpu > {", "gpu < {"))]
    assert protocol, proc.stdout
    assert max(len(line) for line in protocol) <= 4400, max(len(line) for line in protocol)
    assert "chars>" in proc.stdout


def test_history_release_prints_one_release_in_full(sandbox: Sandbox) -> None:
    from tests.fixtures.sandbox import sha256
    from tests.test_cli import as_json, folded

    before = sha256(sandbox.server_args)
    # the story, stable for 0.2 s, as the sandbox's own: each restart here waits it out
    sandbox.root.joinpath("playbooks", "speculative-disable.yaml").write_text(quick_stability(SHIPPED_SPEC, "0.2s"))
    sandbox.start_by_hand()
    deployed = run(sandbox, "deploy", "--host", "gpu", "speculative-disable", "--json")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    rid = as_json(deployed)["hosts"]["gpu"]["release"]
    after = sha256(sandbox.server_args)

    shown = run(sandbox, "history", "--host", "gpu", "--release", rid[-4:])
    assert shown.returncode == 0, shown.stdout + shown.stderr
    text = shown.stdout
    assert f"release {rid} on gpu (current)" in text
    whole = folded(text)  # at 80 columns a path or a sha256 may fold over two lines
    assert str(sandbox.server_args) in whole
    assert before in whole and after in whole, text
    assert "--speculative-disable-batch-threshold: (absent) -> 32" in text
    assert re.search(r"argv after .*--speculative-disable-batch-threshold 32", text), text
    assert "sed -n" in text and 'help="Disable speculation when decode batch size exceeds' in text
    assert "timings" in text

    report = as_json(run(sandbox, "history", "--host", "gpu", "--release", rid, "--json"))
    got = report["hosts"]["gpu"]
    assert got["id"] == rid and got["current"] is True
    assert got["files"] == [{"path": str(sandbox.server_args), "sha256_before": before, "sha256_after": after}]
    assert got["argv_after"][-2:] == ["--speculative-disable-batch-threshold", "32"]

    missing = run(sandbox, "history", "--host", "gpu", "--release", "zzzz")
    assert missing.returncode == 2
    assert missing.stdout.strip() == "gpu: no release zzzz"


def test_quiet_lint_still_says_its_outcome(tmp_path: Path) -> None:
    from tests.test_cli import run

    proc = run(tmp_path, "lint", "-q", str(REPO / "playbooks" / "speculative-disable.yaml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("lint: 1 playbook"), proc.stdout
    assert proc.stdout.splitlines()[-1].endswith("ok") or "warning" in proc.stdout
