"""A host deployed by orch 0.3.0 (main before issue 18), read and undone by this checkout.

Issue 18 rewrites the host side and the controller's reading of the host's
records. The records a host already has were written by the code before that
rewrite, and the box must stay manageable across the upgrade: this checkout's
``history`` and ``status`` read them, and ``rollback`` undoes the releases
they describe, file by file and flag by flag.

``tests/fixtures/state_0_3_0/host.tar.gz`` was made by ``tests/fixtures/make_state_0_3_0.py``
(see its docstring: commit 0d66b46's ``orch deploy`` run three times against the
stand-in over sshd: ``speculative-disable``, then ``local-debug``, then a
misspelt flag the pre-flight refused). It holds the target tree (``box/``) and
the state dir (``state/``), paths and the port as placeholders. This test does
not run that script; it unpacks the tarball, starts the server as the second
release left it (the argv, cwd and env that release recorded, its pid in the
pidfile, as 0.3.0's helper did), and drives this checkout's real CLI over the
real sshd.

What is asserted is behaviour: CLI fields, file bytes, the running server's
argv and answers. The fixture's own records are read only to know what 0.3.0
wrote (they are frozen data, not this checkout's layout); the records this
checkout writes are asserted only where the record IS the behaviour: the
journal a rollback leaves says it finished, and ``state.json`` no longer lists
an undone release (0.3.0's own reader of that file must agree).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.forkrun import run_orch
from tests.fixtures.sandbox import (
    SHIPPED_SPEC,
    cmdline,
    get_json,
    health_status,
    listening_pid,
    quick_stability,
    wait_healthy,
)
from tests.fixtures.sshd import SshdServer, free_port

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "state_0_3_0" / "host.tar.gz"
TEXT_LOGS = (".log", ".log.1")  # rewritten as text; JSON files by a JSON-aware walk


@dataclass(frozen=True)
class Release:
    """What 0.3.0 recorded of one release, as the fixture holds it (read-only)."""

    id: str
    manifest: dict[str, Any]

    @property
    def argv_after(self) -> list[str]:
        return list(self.manifest["server_after"]["argv"])

    @property
    def argv_before(self) -> list[str]:
        return list(self.manifest["server_before"]["argv"])


@dataclass
class OldHost:
    """The unpacked fixture: a box orch 0.3.0 left, reached over the suite's sshd."""

    root: Path  # @ROOT@: holds box/ and state/
    port: int
    sshd: SshdServer
    first: Release  # speculative-disable: server_args.py, --speculative-disable-batch-threshold 32
    second: Release  # local-debug: launch_server.py, --log-level debug
    refused: Release  # bad-flag: refused by the pre-flight, outcome rolled_back
    server: subprocess.Popen[bytes] | None = None

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def server_args(self) -> Path:
        return self.root / "box" / "python" / "sglang" / "srt" / "server_args.py"

    @property
    def launch_server(self) -> Path:
        return self.root / "box" / "python" / "sglang" / "launch_server.py"

    def orch(self, *args: str, code: int) -> subprocess.CompletedProcess[str]:
        """This checkout's real CLI, from the test's directory, as a user runs it."""
        env = dict(os.environ, COLUMNS="200", NO_COLOR="1")
        proc = run_orch([*args, "--ssh-config", str(self.sshd.ssh_config)], cwd=self.root.parent, env=env,
                        timeout=300)
        assert proc.returncode == code, f"exit {proc.returncode}, want {code}\n{proc.stdout}\n{proc.stderr}"
        return proc

    def orch_json(self, *args: str, code: int) -> dict[str, Any]:
        return dict(json.loads(self.orch(*args, "--json", code=code).stdout))

    def start_as_left(self, release: Release) -> int:
        """The server as ``release`` left it running: its recorded argv, cwd and env,
        its own session, its output appended to the state dir's log and its pid in
        the pidfile: what 0.3.0's helper did when it started it."""
        after = release.manifest["server_after"]
        spec = release.manifest["server_spec"]
        with open(spec["log"], "ab") as log:
            self.server = subprocess.Popen(after["argv"], cwd=after["cwd"], env=after["env"], stdout=log,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           start_new_session=True)
        Path(spec["pidfile"]).write_text(f"{self.server.pid}\n")
        wait_healthy(self.port)
        return self.server.pid

    def server_pid(self) -> int | None:
        return listening_pid(self.port)

    def stop(self) -> None:
        """Stop only what this test started, or what orch started on this test's
        port (a fresh port, so whatever listens there is ours)."""
        pids = {p for p in (self.server_pid(), self.server.pid if self.server else None) if p}
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):  # not a group leader: the process alone
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if self.server:
            self.server.wait(30)
        for pidfile in self.state_dir.glob("releases/*/watchdog.pid"):
            # A watchdog this checkout armed (the fixture's pids are long gone,
            # and may since belong to anything: only a process naming this state
            # dir is ours).
            with contextlib.suppress(OSError, ValueError):
                pid = int(pidfile.read_text().strip())
                if str(self.state_dir) in " ".join(cmdline(pid)):
                    os.kill(pid, signal.SIGKILL)


def rewrite_json(value: Any, words: dict[str, str], port: int) -> Any:
    """The placeholders back into a parsed JSON document: strings only, structure kept.

    ``"@PORT_NUMBER@"`` as a whole string was the port as a JSON number.
    """
    if value == "@PORT_NUMBER@":
        return port
    if isinstance(value, str):
        return rewrite_text(value, words)
    if isinstance(value, list):
        return [rewrite_json(v, words, port) for v in value]
    if isinstance(value, dict):
        return {rewrite_text(k, words): rewrite_json(v, words, port) for k, v in value.items()}
    return value


def rewrite_text(text: str, words: dict[str, str]) -> str:
    for word, value in words.items():
        text = text.replace(word, value)
    return text


def unpack(dest: Path, port: int) -> None:
    """The fixture into ``dest``, its placeholders made this test's paths and port."""
    words = {"@ROOT@": str(dest), "@PYTHON@": sys.executable, "@PORT@": str(port)}
    with tarfile.open(FIXTURE) as tar:
        for member in tar.getmembers():
            assert member.isfile() and not Path(member.name).is_absolute() and ".." not in Path(member.name).parts
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            if member.name.endswith(".json"):
                doc = rewrite_json(json.loads(data), words, port)
                data = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()  # as 0.3.0 wrote it
            elif member.name.endswith(TEXT_LOGS):
                data = rewrite_text(data.decode(), words).encode()
            assert b"@ROOT@" not in data and b"@PORT" not in data and b"@PYTHON@" not in data, member.name
            path = dest / member.name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            path.chmod(member.mode)


def fixture_releases(state_dir: Path) -> list[Release]:
    """0.3.0's release records, in the order that host made them (their ``seq``)."""
    manifests = [json.loads(p.read_text()) for p in state_dir.glob("releases/*/manifest.json")]
    return [Release(m["id"], m) for m in sorted(manifests, key=lambda m: m["seq"])]


def write_inventory(host: OldHost) -> None:
    entry = {
        "address": host.sshd.host, "port": host.sshd.port, "user": host.sshd.user,
        "identity_file": str(host.sshd.client_key), "known_hosts": str(host.sshd.known_hosts),
        "state_dir": str(host.state_dir), "python": sys.executable,
        "vars": {"sglang_root": str(host.root / "box" / "python" / "sglang"), "model": "/models/standin",
                 "port": host.port},
    }
    (host.root.parent / "inventory.yaml").write_text(json.dumps({"hosts": {"gpu": entry}}, indent=1))


@pytest.fixture
def old_host(tmp_path: Path, sshd: SshdServer) -> Iterator[OldHost]:
    port = free_port()
    root = tmp_path / "host"
    unpack(root, port)
    first, second, refused = fixture_releases(root / "state")
    host = OldHost(root, port, sshd, first, second, refused)
    write_inventory(host)
    try:
        yield host
    finally:
        host.stop()


def sha256(path: Path) -> str:
    return sha256_bytes(path.read_bytes())


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_entry(release: Release) -> dict[str, Any]:
    """The one file each of the fixture's deploys changed, as 0.3.0 recorded it."""
    (entry,) = release.manifest["files"]
    return dict(entry)


def backup(state_dir: Path, release: Release, side: str) -> bytes:
    """0.3.0's own copy of a file before/after ``release`` (``files/<n>.before|after``)."""
    return (state_dir / "releases" / release.id / "files" / f"{file_entry(release)['n']}.{side}").read_bytes()


def flag_change(change: Any) -> tuple[str, str, str]:
    """One flag change as (flag, from, to), whether the CLI says it as a line
    (``--flag: (absent) -> 32``) or as fields (``{"flag", "from", "to"}``, issue 18's --json)."""
    if isinstance(change, dict):
        return (str(change["flag"]), str(change["from"] if change["from"] is not None else "(absent)"),
                str(change["to"] if change["to"] is not None else "(absent)"))
    flag, _, move = str(change).partition(": ")
    old, _, new = move.partition(" -> ")
    return flag, old, new


def history(host: OldHost) -> list[dict[str, Any]]:
    return list(host.orch_json("history", "--host", "gpu", code=0)["hosts"]["gpu"])


def assert_history_reads_the_old_records(host: OldHost) -> None:
    """``orch history`` lists 0.3.0's three releases, in the host's order, with the
    words their records imply: the first in effect under the second, the second
    current, the refused one rolled back by its own deploy."""
    rows = history(host)
    assert [r["id"] for r in rows] == [host.first.id, host.second.id, host.refused.id]
    assert [r["kind"] for r in rows] == ["deploy", "deploy", "deploy"]
    assert [r["playbook"] for r in rows] == ["speculative-disable", "local-debug", "bad-flag"]
    assert [r["outcome"] for r in rows] == ["deployed", "current", "rolled back"]
    assert [r["current"] for r in rows] == [False, True, False]
    assert [r["files"] for r in rows] == [[str(host.server_args)], [str(host.launch_server)], []]
    assert [[flag_change(c) for c in r["flag_changes"]] for r in rows] == [
        [("--speculative-disable-batch-threshold", "(absent)", "32")],
        [("--log-level", "(absent)", "debug")],
        [("--speculative-disable-batch-treshold", "(absent)", "8")],
    ]
    assert [r["error"] is None for r in rows] == [True, True, False]
    assert "unrecognized arguments: --speculative-disable-batch-treshold 8" in rows[2]["error"]
    assert [r["when"] for r in rows] == [r.manifest["created"] for r in (host.first, host.second, host.refused)]
    plain = host.orch("history", "--host", "gpu", code=0)
    text = plain.stdout + plain.stderr
    for release in (host.first, host.second, host.refused):
        assert release.id[-4:] in text, text


def assert_one_release_in_full(host: OldHost) -> None:
    """``history --release`` shows the second release from 0.3.0's records and
    its own before/after copies: hashes, both command lines, the edit itself."""
    rel = host.orch_json("history", "--host", "gpu", "--release", host.second.id[-4:], code=0)["hosts"]["gpu"]
    entry = file_entry(host.second)
    assert rel["id"] == host.second.id and rel["current"] is True and rel["outcome"] == "current"
    assert rel["files"] == [{"path": str(host.launch_server), "sha256_before": entry["sha256_before"],
                             "sha256_after": entry["sha256_after"]}]
    assert rel["argv_before"] == host.second.argv_before
    assert rel["argv_after"] == host.second.argv_after == host.second.argv_before + ["--log-level", "debug"]
    view = host.orch("history", "--host", "gpu", "--release", host.second.id, code=0)
    assert "server_args.log_requests = True  # this box logs every request" in view.stdout + view.stderr


def assert_status(host: OldHost, *, code: int, current: str | None, healthy: bool | None,
                  argv: list[str] | None) -> dict[str, Any]:
    st = host.orch_json("status", "--host", "gpu", code=code)["hosts"]["gpu"]
    assert st["exit_code"] == code
    assert st["current"] == current
    assert st["healthy"] is healthy
    assert st["drift"] == []
    assert st["in_progress"] is None
    if argv is None:
        assert st["server"] is None
    else:
        assert st["server"]["argv"] == argv and st["server"]["pid"] == host.server_pid()
    return dict(st)


def assert_rollback(host: OldHost, undo: Release, now_current: str | None) -> dict[str, Any]:
    """``orch rollback`` undoes ``undo``: its file back to the bytes 0.3.0 saved
    before it, the server restarted with the command line it had before it."""
    pid_before = host.server_pid()
    rep = host.orch_json("rollback", "--host", "gpu", code=0)
    out = rep["hosts"]["gpu"]
    entry = file_entry(undo)
    assert rep["exit_code"] == 0 and out["exit_code"] == 0 and out["error"] is None
    assert out["outcome"] == "rolled_back"
    assert out["undid"] == [undo.id]
    assert out["current"] == now_current
    assert out["files"] == [entry["path"]]
    assert out["drift"] == []
    target = Path(entry["path"])
    assert target.read_bytes() == backup(host.state_dir, undo, "before")
    assert sha256(target) == entry["sha256_before"]
    assert health_status(host.port) == 200
    pid = host.server_pid()
    assert pid and pid != pid_before
    assert cmdline(pid) == undo.argv_before
    # The record this rollback wrote, read back through the CLI: a rollback
    # that undid the release, the command lines the other way round.
    rel = host.orch_json("history", "--host", "gpu", "--release", out["release"], code=0)["hosts"]["gpu"]
    assert rel["kind"] == "rollback" and rel["id"] == out["release"]
    assert rel["argv_before"] == undo.argv_after and rel["argv_after"] == undo.argv_before
    assert rel["files"] == [{"path": entry["path"], "sha256_before": entry["sha256_after"],
                             "sha256_after": entry["sha256_before"]}]
    assert_records_finished(host, out["release"], now_current)
    return dict(out)


def assert_records_finished(host: OldHost, rollback_id: str, now_current: str | None) -> None:
    """Where the record IS the behaviour: the journal says the rollback finished
    (or the next deploy would be refused as unfinished), and the list of releases
    in effect no longer has the undone one (it is what the next rollback undoes)."""
    journal = json.loads((host.state_dir / "journal.json").read_text())
    assert journal["release"] == rollback_id and journal["kind"] == "rollback", journal
    assert journal["finished"] is True, journal
    applied = json.loads((host.state_dir / "state.json").read_text())["applied"]
    assert applied == ([now_current] if now_current else [])


def test_a_host_deployed_by_0_3_0_is_read_and_undone_release_by_release(old_host: OldHost) -> None:
    host = old_host
    first_file, second_file = file_entry(host.first), file_entry(host.second)
    # The fixture is what 0.3.0 left: both files as the second release wrote them.
    assert host.server_args.read_bytes() == backup(host.state_dir, host.first, "after")
    assert sha256(host.server_args) == first_file["sha256_after"]
    assert sha256(host.launch_server) == second_file["sha256_after"]
    assert first_file["path"] == str(host.server_args) and second_file["path"] == str(host.launch_server)

    assert_history_reads_the_old_records(host)
    assert_one_release_in_full(host)
    # The host rebooted: a release recorded a server, none runs, status says so.
    down = assert_status(host, code=3, current=host.second.id, healthy=False, argv=None)
    assert down["problems"]

    pid = host.start_as_left(host.second)
    assert cmdline(pid) == host.second.argv_after
    info = get_json(host.port, "/get_server_info")
    assert info["log_level"] == "debug" and info["log_requests"] is True
    assert info["speculative_disable_batch_threshold"] == 32
    up = assert_status(host, code=0, current=host.second.id, healthy=True, argv=host.second.argv_after)
    assert up["problems"] == [] and up["server"]["found_by"] == "pidfile"

    # Undo the second release: launch_server.py back, --log-level gone, the first's flag kept.
    back = assert_rollback(host, host.second, now_current=host.first.id)
    assert sha256(host.server_args) == first_file["sha256_after"]  # the first release's file untouched
    assert "--log-level" not in cmdline(host.server_pid())
    info = get_json(host.port, "/get_server_info")
    assert info["log_level"] != "debug" and info["log_requests"] is False
    assert info["speculative_disable_batch_threshold"] == 32
    assert_status(host, code=0, current=host.first.id, healthy=True, argv=host.first.argv_after)

    # Undo the first: the original bytes, the hand-started command line.
    again = assert_rollback(host, host.first, now_current=None)
    assert host.server_args.read_bytes() == backup(host.state_dir, host.first, "before")
    assert host.launch_server.read_bytes() == backup(host.state_dir, host.second, "before")
    assert cmdline(host.server_pid()) == host.first.argv_before
    assert "speculative_disable_batch_threshold" not in get_json(host.port, "/get_server_info")

    # Nothing left to undo, and history tells the whole story in the same words.
    last = host.orch("rollback", "--host", "gpu", code=0)
    assert "nothing to roll back" in last.stdout + last.stderr
    rows = history(host)
    assert [r["id"] for r in rows] == [host.first.id, host.second.id, host.refused.id,
                                       back["release"], again["release"]]
    assert [r["outcome"] for r in rows] == [f"undone by {again['release']}", f"undone by {back['release']}",
                                            "rolled back", f"undid {host.second.id}", f"undid {host.first.id}"]
    assert [r["kind"] for r in rows] == ["deploy", "deploy", "deploy", "rollback", "rollback"]
    assert not any(r["current"] for r in rows)


def test_a_hand_edit_made_after_a_0_3_0_release_is_kept_as_drift_when_it_is_undone(old_host: OldHost) -> None:
    """0.3.0's restore plan names the bytes it wrote; a file holding other bytes
    (a person edited it since) is saved as drift before this checkout puts back
    the bytes from before the release, and status and the outputs name it."""
    host = old_host
    host.start_as_left(host.second)
    edited = host.launch_server.read_bytes() + b"# a hand edit on the box\n"
    host.launch_server.write_bytes(edited)
    st = host.orch_json("status", "--host", "gpu", code=0)["hosts"]["gpu"]
    assert st["drift"] == [str(host.launch_server)] and st["current"] == host.second.id

    proc = host.orch("rollback", "--host", "gpu", "--json", code=0)
    out = json.loads(proc.stdout)["hosts"]["gpu"]
    assert out["outcome"] == "rolled_back" and out["undid"] == [host.second.id]
    assert out["drift"] == [str(host.launch_server)]
    assert host.launch_server.read_bytes() == backup(host.state_dir, host.second, "before")
    kept = [p for p in host.state_dir.glob("releases/*/files/*.drift") if p.read_bytes() == edited]
    assert len(kept) == 1, sorted(host.state_dir.glob("releases/*/files/*"))
    assert str(kept[0]) in proc.stderr
    assert cmdline(host.server_pid()) == host.second.argv_before
    assert health_status(host.port) == 200
    rows = {r["id"]: r for r in history(host)}
    assert rows[out["release"]]["drift_kept"] == [str(host.launch_server)]


def test_a_deploy_by_this_checkout_continues_a_0_3_0_host_and_is_undone_back_to_it(old_host: OldHost) -> None:
    """The upgrade's first deploy: 0.3.0's journal, lock-free state and release
    sequence are taken as they are, the new release comes after the old ones in
    the host's order, and undoing it gives back the server 0.3.0's last release ran."""
    host = old_host
    host.start_as_left(host.second)
    playbooks = host.root.parent / "playbooks"
    playbooks.mkdir()
    (playbooks / "speculative-disable.yaml").write_text(quick_stability(SHIPPED_SPEC, "0.2s"))  # a short wait
    files_before = (host.server_args.read_bytes(), host.launch_server.read_bytes())

    rep = host.orch_json("deploy", "--host", "gpu", "--var", "threshold=8", "speculative-disable", code=0)
    out = rep["hosts"]["gpu"]
    assert out["outcome"] == "changed" and out["files"] == []  # the flag only: 0.3.0's edit is already there
    assert cmdline(host.server_pid()) == host.second.argv_after[:-4] + [
        "--speculative-disable-batch-threshold", "8", "--log-level", "debug"]
    assert get_json(host.port, "/get_server_info")["speculative_disable_batch_threshold"] == 8
    rows = history(host)
    assert [r["id"] for r in rows][:3] == [host.first.id, host.second.id, host.refused.id]
    assert len(rows) == 4 and rows[3]["current"] is True and rows[3]["kind"] == "deploy"
    assert [r["outcome"] for r in rows] == ["deployed", "deployed", "rolled back", "current"]
    assert [flag_change(c) for c in rows[3]["flag_changes"]] == [("--speculative-disable-batch-threshold", "32", "8")]

    back = host.orch_json("rollback", "--host", "gpu", code=0)["hosts"]["gpu"]
    assert back["undid"] == [rows[3]["id"]] and back["current"] == host.second.id
    assert cmdline(host.server_pid()) == host.second.argv_after
    assert (host.server_args.read_bytes(), host.launch_server.read_bytes()) == files_before
    assert health_status(host.port) == 200
    assert_status(host, code=0, current=host.second.id, healthy=True, argv=host.second.argv_after)
