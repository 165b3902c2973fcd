"""The fleet bench's smoke run: ``bench/bench_fleet.py --quick`` for orch and the minimal Fabric script.

Real sshd hosts, real stand-in servers, the real ``orch`` CLI — the bench's
own path end to end, at N = 1 and 2, one round. Nothing about time is
asserted (figures come from the bench, never from a test); what is asserted:
the tables are produced with a figure for every tool and N, every deploy did
the work on every host (the bench checks the hosts itself and reports a
failure otherwise), both tools keep to one SSH channel per host, the
Markdown results file is written with the machine, and nothing the bench
started is left running. pyinfra and Ansible are not installed in CI, so
they are left out here.

The comparison with another revision (``--baseline``, issue 18) runs too, as
small as it gets (N = 1, one round; HEAD against this checkout): both orchs
deploy, the table has a wall time and a hosts' CPU for each, and ``--write``
appends a section naming both revisions without touching what the file held.
``bench_helper_start.py`` likewise, with two starts a side.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.fixtures.sandbox import wait_until

REPO = Path(__file__).resolve().parents[1]


def running_under(path: Path) -> list[str]:
    """Command lines of live processes that mention ``path`` (the bench's work dirs are below it)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(path) in cmd:
            found.append(cmd)
    return found


def test_quick_bench_produces_the_tables(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))  # the bench's work dir lands here, to look for leftovers
    proc = subprocess.run(
        [sys.executable, "bench/bench_fleet.py", "--quick", "--tools", "orch,fabric-minimal",
         "--write", str(results)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "failed" not in out.lower(), out  # the bench checked every host after every run

    summary = out.split("summary (wall seconds, medians):", 1)[1]
    header = summary.splitlines()[1].split()
    assert header[:3] == ["tool", "N=1", "N=2"]
    number = r"\d+\.\d\d"
    for tool in ("orch", "fabric-minimal"):
        row = re.search(rf"^{tool} +({number}) +({number}) +({number}) +({number}) +(\d+) +(\S+)$",
                        summary, re.MULTILINE)
        assert row, f"no complete summary row for {tool}:\n{summary}"
        assert row.group(6) == "1", f"{tool}: SSH channels per host is {row.group(6)}, not 1"
    ratio = re.search(rf"^fabric-minimal +({number}) +({number})$", summary, re.MULTILINE)
    assert ratio, summary  # orch / fabric-minimal per N

    for n in (1, 2):
        assert f"N={n}, forks {n}, 1 round(s), medians" in out

    text = results.read_text()
    assert text.startswith("# Fleet bench results")
    for part in ("## Machine", "- cores (nproc): ", "- python: ", "- cpu: ", "## Summary",
                 "## N = 1 (forks 1)", "## N = 2 (forks 2)", "--quick"):
        assert part in text, part

    assert running_under(tmp) == []  # every sshd, server and tool run was stopped
    assert list(tmp.iterdir()) == []  # and the work directory removed


def number_cells(line: str) -> list[float]:
    return [float(c) for c in line.split() if re.fullmatch(r"\d+(\.\d+)?", c)]


def test_baseline_comparison_runs_both_orchs_and_appends(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Fleet bench results\n\nearlier figures\n")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    proc = subprocess.run(
        [sys.executable, "bench/bench_fleet.py", "--baseline", "HEAD", "--ns", "1", "--rounds", "1",
         "--write", str(results)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "failed" not in out.lower(), out  # both orchs deployed, checked on the host by the bench
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.strip()
    table = out.split("alternately in one run, medians:", 1)[1]
    assert f"orch@{head} wall s" in table
    for run in ("deploy", "no-op"):
        line = re.search(rf"^1 +{run} .*$", table, re.MULTILINE)
        assert line, table
        # N, rounds, wall base, wall this, ratio, host ms base, host ms this, ratio
        n, rounds, wall_b, wall_t, wall_r, cpu_b, cpu_t, cpu_r = number_cells(line.group(0))
        assert (n, rounds) == (1, 1)
        assert min(wall_b, wall_t, cpu_b, cpu_t) > 0, line.group(0)  # the hosts' CPU was counted
        assert abs(wall_r - wall_t / wall_b) < 0.01 and wall_r > 0
        assert cpu_r > 0
        assert line.group(0).split()[-1] in ("yes", "no")

    text = results.read_text()
    assert text.startswith("# Fleet bench results\n\nearlier figures\n")  # appended, not replaced
    assert re.search(rf"^## \d{{4}}-\d\d-\d\d \d\d:\d\d UTC: orch {head}.* against orch {head}$",
                     text, re.MULTILINE), text
    assert "--baseline HEAD" in text and "1  deploy" in text

    assert running_under(tmp) == []
    assert list(tmp.iterdir()) == []
    clock = re.search(r"^hosts' CPU counted by a cgroup per host \(cgroup v\d, (\S+)\)$", out, re.MULTILINE)
    if os.geteuid() == 0:  # as root, each host's CPU is counted by its cgroup, to the nanosecond
        assert clock, out
        assert not Path(clock.group(1)).exists()  # and the cgroups are removed after
    else:
        assert "hosts' CPU counted by /proc, in clock ticks" in out


def test_helper_start_bench_measures_both_sides() -> None:
    proc = subprocess.run(
        [sys.executable, "bench/bench_helper_start.py", "--baseline", "HEAD", "--starts", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "kept nothing" not in out  # every measured start ran the kept copy
    rows = [line for line in out.splitlines() if line.startswith("orch")]
    assert len(rows) == 2, out
    for row in rows:
        starts, median, low, high, wall = number_cells(row)[-5:]
        assert starts == 2 and 0 < low <= median <= high, row
        assert wall > 0
    ratio = re.search(r"this/baseline \(medians\): (\d+\.\d+)", out)
    assert ratio and float(ratio.group(1)) > 0, out


BURN = ("import resource, sys\n"
        "n = 0\n"
        "while resource.getrusage(resource.RUSAGE_SELF).ru_utime < float(sys.argv[2]):\n"
        "    n += 1\n"
        "u = resource.getrusage(resource.RUSAGE_SELF)\n"
        "open(sys.argv[1], 'w').write(str(u.ru_utime + u.ru_stime))\n")


def run_and_wait_for_orphan(fleet: Any, host: Any, remote: str, orphan_report: Path) -> None:
    """``remote`` run on the fleet host over the real ssh client; then wait for the orphan
    it left (``setsid``) to write its report."""
    done = subprocess.run(
        ["ssh", "-F", str(fleet.ssh_config), "-i", str(fleet.client_key), "-o", "BatchMode=yes",
         "-o", f"UserKnownHostsFile={fleet.known_hosts}", "-p", str(host.sshd.port),
         f"{host.sshd.user}@{host.address}", remote],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    wait_until(lambda: orphan_report.exists() and orphan_report.read_text(), "the orphan's report")


def test_hosts_cpu_counts_what_leaves_the_ssh_session(tmp_path: Path) -> None:
    """The fleet's hosts' CPU (bench/hostcpu.py) counts a process that the SSH session
    started and that left it (``setsid``, as orch's watchdog does): the subreaper its
    sshd runs under reaps it, so it does not escape to PID 1. Each burner reports its
    own CPU; the host's count over the run is at least their sum."""
    sys.path.insert(0, str(REPO / "bench"))
    import hostcpu
    from fleet import start_fleet, stop_hosts

    registry: list = []
    try:
        fleet = start_fleet(tmp_path / "fleet", 1, startup_delay=0, bashrc_delay=0, file_lines=0,
                            registry=registry)
        host = fleet.hosts[0]
        burn = tmp_path / "burn.py"
        burn.write_text(BURN)
        fg, bg = tmp_path / "fg", tmp_path / "bg"
        py = sys.executable
        remote = (f"{py} {burn} {fg} 0.1; "
                  f"(setsid {py} {burn} {bg} 0.3 </dev/null >/dev/null 2>&1 &)")
        watch = [(host.reaper_pid, host.sshd_pid, ())]
        assert hostcpu.wait_settled(watch) == []
        before = hostcpu.tree_cpu(hostcpu.snapshot(), host.reaper_pid)
        run_and_wait_for_orphan(fleet, host, remote, bg)
        assert hostcpu.wait_settled(watch, timeout=120) == []  # the orphan too has ended, reaped
        spent = hostcpu.tree_cpu(hostcpu.snapshot(), host.reaper_pid) - before
        burners = float(fg.read_text()) + float(bg.read_text())
        assert burners >= 0.4
        assert spent >= burners - 0.02, (spent, burners)  # 0.02: the clock tick of /proc's figures
    finally:
        stop_hosts(registry)


def test_hosts_cpu_by_cgroup_counts_the_session_and_its_orphans_and_not_the_servers(tmp_path: Path) -> None:
    """As root the fleet counts each host's CPU in a cgroup of its own (bench/hostcpu.py,
    ``CpuGroups``): what the session ran and what left it are counted, to the nanosecond;
    a server, which moves itself to the servers' cgroup as its interpreter starts (it is
    started with the environment ``server_env`` gives), is not."""
    sys.path.insert(0, str(REPO / "bench"))
    import hostcpu
    from fleet import start_fleet, stop_hosts

    registry: list = []
    try:
        fleet = start_fleet(tmp_path / "fleet", 1, startup_delay=0, bashrc_delay=0, file_lines=0,
                            registry=registry)
        if os.geteuid() != 0:  # the bench falls back to /proc's clock ticks (the test above)
            assert fleet.groups is None
            return
        assert fleet.groups is not None, "root, yet no cgroup could be made: the bench would count in ticks"
        host = fleet.hosts[0]
        groups, mine, servers = fleet.groups, host.cpu_group, host.server_group
        assert groups.holds(mine, host.reaper_pid) and groups.holds(mine, host.sshd_pid)
        hand = hostcpu.listening_pids([host.port])[host.port]
        assert groups.holds(servers, hand)  # the server the bench started by hand moved itself
        burn = tmp_path / "burn.py"
        burn.write_text(BURN)
        fg, bg, srv = tmp_path / "fg", tmp_path / "bg", tmp_path / "srv"
        py = sys.executable
        as_server = " ".join(f"{k}={v}" for k, v in host.server_env(0).items())
        remote = (f"{py} {burn} {fg} 0.1; "
                  f"(setsid {py} {burn} {bg} 0.2 </dev/null >/dev/null 2>&1 &); "
                  f"env {as_server} {py} {burn} {srv} 0.6")
        watch = [(host.reaper_pid, host.sshd_pid, (hand,))]
        assert hostcpu.wait_settled(watch) == []
        before = groups.seconds(mine)
        run_and_wait_for_orphan(fleet, host, remote, bg)
        assert hostcpu.wait_settled(watch, timeout=120) == []
        spent = groups.seconds(mine) - before
        session, server = float(fg.read_text()) + float(bg.read_text()), float(srv.read_text())
        assert session >= 0.3 and server >= 0.6
        assert spent >= session, (spent, session)  # no tick to allow for: nanoseconds
        assert spent < session + server - 0.2, (spent, session, server)  # the server's burn is not in it
    finally:
        stop_hosts(registry)
    assert not any(Path(p).exists() for p in [g.top for g in [fleet.groups] if g]), "the cgroups are removed"
