"""The transports against real processes: a real sshd on loopback, and local children.

The same behaviour is asked of both (``transport`` is parametrized), then the
SSH-only parts: host keys, unreachable hosts, ~/.ssh/config, ProxyJump, a link
severed by a TCP proxy, and ``become`` with a stand-in ``sudo`` on the PATH.
Commands run with this interpreter's absolute path (the sshd is on this
machine), so the remote PATH does not matter except where a test sets it.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.core.target import HostTarget
from orchestrator.errors import HostKeyError, LinkLostError, RemoteError, UnreachableError
from orchestrator.shell.local import LocalTransport
from orchestrator.shell.transport import (
    CommandResult,
    RemoteProcess,
    Transport,
    explain_become_failure,
    open_transport,
)
from tests.fixtures.proxy import TcpProxy
from tests.fixtures.sshd import SshdServer, free_port, keygen, running_sshd

PY = sys.executable

# Upper-cases stdin lines back to stdout; says hello on stderr; exits 3 at EOF.
ECHO = """
import sys
sys.stderr.write("echo started\\n"); sys.stderr.flush()
for line in sys.stdin:
    sys.stdout.write(line.upper()); sys.stdout.flush()
sys.exit(3)
"""

LOCAL = HostTarget(name="sandbox", connection="local")


def ssh(server: SshdServer, **kw: object) -> Transport:
    """An SSH transport to ``server`` that never reads the machine's ssh config."""
    target = kw.pop("target", None) or server.target()
    kw.setdefault("ssh_config_path", str(server.ssh_config))
    return open_transport(target, **kw)  # type: ignore[arg-type]


@pytest.fixture(params=["local", "ssh"])
def transport(request: pytest.FixtureRequest) -> Iterator[Transport]:
    t = open_transport(LOCAL) if request.param == "local" else ssh(request.getfixturevalue("sshd"))
    t.connect()
    try:
        yield t
    finally:
        t.close()


def write_config(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# --- behaviour both transports share ------------------------------------------


def test_spawn_round_trip_exit_code_and_stderr(transport: Transport) -> None:
    assert isinstance(transport, Transport)
    before = transport.exec_count
    proc = transport.spawn([PY, "-u", "-c", ECHO])
    assert isinstance(proc, RemoteProcess)
    assert transport.exec_count == before + 1
    proc.write(b"hello\n")
    assert proc.readline(10) == b"HELLO\n"
    proc.write(b"second line\nthird")
    assert proc.readline(10) == b"SECOND LINE\n"
    proc.close_stdin()
    assert proc.readline(10) == b"THIRD"  # the last partial line, then EOF
    assert proc.readline(10) == b""
    assert proc.wait(10) == 3
    # The exit status and the stderr stream arrive separately: give the stderr
    # pump time to reach EOF (on a busy machine it may not have yet).
    assert "echo started" in proc.stderr_bytes(settle=30).decode()


def test_argv_words_arrive_exactly(transport: Transport, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    words = [
        "two words",
        "it's",
        'say "hi"',
        f"x; touch {marker}",
        f"$(touch {marker})",
        f"`touch {marker}`",
        "*",
        "line1\nline2",
        "",
        "-n",
        "back\\slash",
        "tab\there",
        "ünïcødé",
        "$HOME",
        "a&&b|c>d<e",
        "~",
    ]
    result = transport.run(
        [PY, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))", *words], timeout=20
    )
    assert result.rc == 0, result.stderr
    assert json.loads(result.stdout) == words
    assert not marker.exists()


def test_readline_times_out_promptly_on_silence(transport: Transport) -> None:
    proc = transport.spawn([PY, "-c", "import time; time.sleep(5)"])
    # the process sleeps 5 s: the error (not a line at its exit) proves the timeout worked
    with pytest.raises(LinkLostError, match=r"^no data from sandbox.* for 0\.4 s$"):
        proc.readline(0.4)
    assert proc.wait(0) is None  # still running: readline did not wait for it
    proc.kill()
    assert proc.wait(5) is not None


def test_run_feeds_stdin_and_collects_output(transport: Transport) -> None:
    code = "import sys; d = sys.stdin.read(); print(d[::-1]); print('oops', file=sys.stderr); sys.exit(5)"
    result = transport.run([PY, "-c", code], timeout=20, stdin=b"abc")
    assert result == CommandResult(rc=5, stdout=b"cba\n", stderr=b"oops\n")


def test_run_timeout_is_a_one_line_remote_error(transport: Transport) -> None:
    with pytest.raises(RemoteError, match=r"did not finish within 0\.5 s$") as err:
        transport.run([PY, "-c", "import time; time.sleep(5)"], timeout=0.5)
    assert "\n" not in str(err.value)


def test_big_streams_do_not_deadlock_and_stderr_is_bounded(transport: Transport) -> None:
    # Copies 2 MiB of stdin to stdout while writing 256 KiB to stderr: every pipe
    # fills up several times over, so this hangs unless all three are serviced.
    code = (
        "import sys\n"
        "while True:\n"
        "    chunk = sys.stdin.buffer.read1(65536)\n"
        "    if not chunk: break\n"
        "    sys.stdout.buffer.write(chunk); sys.stderr.buffer.write(b'e' * 8192)\n"
        "sys.stderr.buffer.write(b'END')\n"
    )
    data = os.urandom(2 * 1024 * 1024)
    result = transport.run([PY, "-c", code], timeout=30, stdin=data)
    assert result.rc == 0
    assert result.stdout == data
    assert len(result.stderr) == 64 * 1024
    assert result.stderr.endswith(b"eeeEND")


def test_write_after_the_process_ended_raises_link_lost(transport: Transport) -> None:
    proc = transport.spawn([PY, "-c", "pass"])
    assert proc.wait(10) == 0
    assert proc.readline(10) == b""
    deadline = time.monotonic() + 5
    with pytest.raises(LinkLostError):
        while time.monotonic() < deadline:  # the channel close may trail the exit status
            proc.write(b"x" * 65536)
            time.sleep(0.05)


def test_exec_count_counts_every_command(transport: Transport) -> None:
    start = transport.exec_count
    transport.run([PY, "-c", "pass"], timeout=20)
    transport.spawn([PY, "-c", "pass"]).wait(10)
    transport.run([PY, "-c", "pass"], timeout=20)
    assert transport.exec_count == start + 3


def test_local_command_not_found_is_one_line() -> None:
    with pytest.raises(
        RemoteError, match=r"^sandbox: cannot run 'no-such-cmd-xyz': command not found$"
    ):
        open_transport(LOCAL).spawn(["no-such-cmd-xyz"])


# --- SSH: one connection ------------------------------------------------------


def test_one_connection_serves_every_command(sshd: SshdServer) -> None:
    t = ssh(sshd)
    try:
        t.connect()
        t.connect()  # idempotent
        assert t.exec_count == 0
        ports = set()
        for _ in range(3):
            result = t.run(["sh", "-c", "echo $SSH_CONNECTION"], timeout=20)
            ports.add(result.stdout.split()[1])  # our side's TCP port
        proc = t.spawn(["sh", "-c", "echo $SSH_CONNECTION"])
        ports.add(proc.readline(10).split()[1])
        assert len(ports) == 1
        assert t.exec_count == 4
    finally:
        t.close()


def test_severed_link_is_reported_as_lost(sshd: SshdServer, tmp_path: Path) -> None:
    proxy = TcpProxy(sshd.port)
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{proxy.port} {sshd.host_key_pub}\n")
    t = ssh(sshd, target=sshd.target(port=proxy.port, known_hosts=str(known)), keepalive=1)
    try:
        proc = t.spawn([PY, "-u", "-c", ECHO])
        proc.write(b"ping\n")
        assert proc.readline(10) == b"PING\n"
        proxy.sever()
        # "lost" (not "no data for 10 s"): the drop is seen as a drop, not waited out
        with pytest.raises(LinkLostError, match=r"^connection to sandbox-ssh .* lost$"):
            proc.readline(10)
        with pytest.raises(LinkLostError):
            t.spawn(["true"])
    finally:
        t.close()
        proxy.close()


# --- SSH: host keys -------------------------------------------------------------


def ssh_keygen_fingerprint(private_key: Path) -> str:
    out = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", f"{private_key}.pub"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()[1]


def test_unknown_host_key_is_refused_and_not_recorded(sshd: SshdServer, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    t = ssh(sshd, target=sshd.target(known_hosts=str(known)))
    with pytest.raises(HostKeyError) as err:
        t.connect()
    message = str(err.value)
    fp = ssh_keygen_fingerprint(sshd.host_key)
    assert message == (
        f"unknown host key for 127.0.0.1:{sshd.port} (ssh-ed25519 {fp}); "
        "verify it and pass --accept-new-host-key"
    )
    assert known.read_text() == ""
    assert t.exec_count == 0


def test_accept_new_host_key_records_it_then_plain_connect_works(
    sshd: SshdServer, tmp_path: Path
) -> None:
    known = tmp_path / "sub" / "known_hosts"  # neither the file nor its directory exists yet
    first = ssh(sshd, target=sshd.target(known_hosts=str(known)), accept_new_host_key=True)
    try:
        assert first.run(["true"], timeout=20).rc == 0
    finally:
        first.close()
    assert known.read_text() == f"[127.0.0.1]:{sshd.port} {sshd.host_key_pub}\n"
    assert stat.S_IMODE(known.stat().st_mode) == 0o600
    second = ssh(sshd, target=sshd.target(known_hosts=str(known)))
    try:
        assert second.run(["true"], timeout=20).rc == 0
    finally:
        second.close()
    assert known.read_text() == f"[127.0.0.1]:{sshd.port} {sshd.host_key_pub}\n"


def test_accept_new_keeps_existing_lines_and_skips_bad_ones(
    sshd: SshdServer, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    existing = [
        "# my hosts",
        "@cert-authority *.example.invalid ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKnOt",
        "broken.invalid ssh-ed25519 not!base64",
    ]
    known.write_text("\n".join(existing))  # no final newline
    t = ssh(sshd, target=sshd.target(known_hosts=str(known)), accept_new_host_key=True)
    try:
        t.connect()
    finally:
        t.close()
    assert known.read_text().splitlines() == [
        *existing,
        f"[127.0.0.1]:{sshd.port} {sshd.host_key_pub}",
    ]


def test_revoked_key_is_never_accepted(sshd: SshdServer, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"@revoked * {sshd.host_key_pub}\n")
    t = ssh(sshd, target=sshd.target(known_hosts=str(known)), accept_new_host_key=True)
    with pytest.raises(HostKeyError, match="is marked @revoked"):
        t.connect()
    assert known.read_text() == f"@revoked * {sshd.host_key_pub}\n"


def test_changed_host_key_is_refused_even_with_accept_new(sshd: SshdServer, tmp_path: Path) -> None:
    with running_sshd(tmp_path / "other", client_key=sshd.client_key) as other:
        assert other.host_key_pub != sshd.host_key_pub
        known = tmp_path / "known_hosts"
        recorded = f"[127.0.0.1]:{other.port} {sshd.host_key_pub}\n"  # the "old" key for that port
        known.write_text(recorded)
        t = ssh(other, target=other.target(known_hosts=str(known)), accept_new_host_key=True)
        with pytest.raises(HostKeyError) as err:
            t.connect()
        message = str(err.value)
        assert f"host key for 127.0.0.1:{other.port} has CHANGED" in message
        assert ssh_keygen_fingerprint(other.host_key) in message
        assert ssh_keygen_fingerprint(sshd.host_key) in message
        assert "\n" not in message
        assert known.read_text() == recorded


# --- SSH: unreachable -------------------------------------------------------------


def test_closed_port_is_unreachable_quickly_in_one_line(sshd: SshdServer) -> None:
    port = free_port()
    t = ssh(sshd, target=sshd.target(port=port), connect_timeout=5)
    with pytest.raises(UnreachableError) as err:
        t.connect()
    assert str(err.value) == f"cannot reach sandbox-ssh (root@127.0.0.1:{port}): connection refused"


def test_silent_server_times_out_within_connect_timeout(sshd: SshdServer) -> None:
    # Accepts TCP (the kernel does, from the backlog) but never says an SSH banner.
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(5)
        port = mute.getsockname()[1]
        t = ssh(sshd, target=sshd.target(port=port), connect_timeout=1.0)
        with pytest.raises(UnreachableError, match=r"no SSH server answered within 1 s") as err:
            t.connect()
        assert "\n" not in str(err.value)


def test_silent_server_is_named_so_when_the_starts_own_wait_ends_first(
    sshd: SshdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The banner's wait (0.9 x connect_timeout, on Paramiko's thread) can lose to the start's
    own wait (connect_timeout) on a busy machine; here it is made 30 times longer so that it
    certainly does, and the reason must still be the missing banner, not the handshake."""
    from orchestrator.shell.ssh import SSHTransport

    plain = SSHTransport._timeouts
    monkeypatch.setattr(SSHTransport, "_timeouts",
                        lambda self: {**plain(self), "banner_timeout": self.connect_timeout * 30})
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(5)
        port = mute.getsockname()[1]
        t = ssh(sshd, target=sshd.target(port=port), connect_timeout=1.0)
        with pytest.raises(UnreachableError) as err:
            t.connect()
    assert str(err.value) == (f"cannot reach sandbox-ssh (root@127.0.0.1:{port}): "
                              "no SSH server answered within 1 s (no SSH banner came)")


def test_a_server_that_stops_after_its_banner_is_a_handshake_that_did_not_finish(sshd: SshdServer) -> None:
    """A banner, then silence (a wedged sshd, a middlebox holding the key exchange): the
    server answered, so the reason is the handshake, named with the same limit."""
    with socket.socket() as wedged:
        wedged.bind(("127.0.0.1", 0))
        wedged.listen(5)
        port = wedged.getsockname()[1]
        answered = threading.Event()

        def say_the_banner_only() -> None:
            peer, _ = wedged.accept()
            with peer:
                peer.sendall(b"SSH-2.0-OpenSSH_9.2p1 wedged\r\n")
                peer.recv(65536)  # the client's banner and key exchange, never answered
                answered.wait(60)  # held open until the test has its answer (or a minute)

        thread = threading.Thread(target=say_the_banner_only, daemon=True)
        thread.start()
        t = ssh(sshd, target=sshd.target(port=port), connect_timeout=1.0)
        with pytest.raises(UnreachableError) as err:
            t.connect()
        answered.set()
        thread.join(60)
    assert str(err.value) == (f"cannot reach sandbox-ssh (root@127.0.0.1:{port}): "
                              "the SSH handshake did not finish within 1 s")


def test_unauthorized_key_is_unreachable_with_reason(sshd: SshdServer, tmp_path: Path) -> None:
    stranger = tmp_path / "stranger"
    keygen(stranger, "not-authorized")
    t = ssh(sshd, target=sshd.target(identity_file=str(stranger)))
    with pytest.raises(
        UnreachableError,
        match=r"^cannot reach sandbox-ssh \(root@127\.0\.0\.1:\d+\): authentication failed for user 'root'$",
    ):
        t.connect()


# --- SSH: ~/.ssh/config ------------------------------------------------------------


def test_ssh_config_alias_supplies_hostname_port_user_and_key(
    sshd: SshdServer, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path / "ssh_config",
        f"Host myalias\n  HostName 127.0.0.1\n  Port {sshd.port}\n"
        f"  IdentityFile {sshd.client_key}\n  User {sshd.user}\n",
    )
    target = HostTarget(name="aliased", address="myalias", known_hosts=str(sshd.known_hosts))
    t = open_transport(target, ssh_config_path=config)
    try:
        assert t.run(["sh", "-c", "echo $SSH_CONNECTION"], timeout=20).stdout.split()[2:] == [
            b"127.0.0.1",
            str(sshd.port).encode(),
        ]
        assert t.endpoint == f"{sshd.user}@127.0.0.1:{sshd.port}"  # type: ignore[attr-defined]
    finally:
        t.close()


def jump_config(sshd: SshdServer, path: Path) -> str:
    return write_config(
        path,
        f"Host jumped\n  HostName 127.0.0.2\n  Port {sshd.port}\n"
        f"  ProxyJump {sshd.user}@127.0.0.1:{sshd.port}\n",
    )


def test_proxyjump_reaches_the_far_host(sshd: SshdServer, tmp_path: Path) -> None:
    target = sshd.target(address="jumped", port=None)
    t = open_transport(target, ssh_config_path=jump_config(sshd, tmp_path / "cfg"))
    try:
        result = t.run(["sh", "-c", "echo $SSH_CONNECTION"], timeout=20)
        assert result.stdout.split()[2] == b"127.0.0.2"
        assert t.exec_count == 1
    finally:
        t.close()


def test_proxyjump_refuses_an_unknown_jump_host_key(sshd: SshdServer, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line("127.0.0.2"))  # the far host only
    target = sshd.target(address="jumped", port=None, known_hosts=str(known))
    t = open_transport(target, ssh_config_path=jump_config(sshd, tmp_path / "cfg"))
    with pytest.raises(HostKeyError) as err:
        t.connect()
    assert str(err.value).startswith(
        f"unknown host key for 127.0.0.1:{sshd.port} (ssh-ed25519 SHA256:"
    )
    assert "jump host for sandbox-ssh" in str(err.value)
    assert known.read_text() == sshd.known_hosts_line("127.0.0.2")


def test_defaults_yield_to_ssh_config_but_host_values_win(sshd: SshdServer, tmp_path: Path) -> None:
    stranger = tmp_path / "stranger"
    keygen(stranger, "not-authorized")
    config = write_config(
        tmp_path / "cfg",
        f"Host 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n  IdentityFile {sshd.client_key}\n",
    )
    wrong = {"port": 1, "user": "nobody-here", "identity_file": str(stranger)}
    from_defaults = sshd.target(**wrong, from_defaults=frozenset(wrong))
    t = open_transport(from_defaults, ssh_config_path=config)
    try:
        assert t.run(["true"], timeout=20).rc == 0
    finally:
        t.close()
    explicit = sshd.target(port=1)  # the host's own entry says port 1: that wins
    with pytest.raises(UnreachableError, match=r"127\.0\.0\.1:1\): connection refused$"):
        open_transport(explicit, ssh_config_path=config).connect()


# --- become --------------------------------------------------------------------------


def fake_sudo(bin_dir: Path, log: Path) -> Path:
    """A stand-in ``sudo`` that records its argv, checks ``-n``, then runs the command."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "sudo"
    script.write_text(
        "#!/bin/sh\n"
        f"printf '%s\\n' \"$@\" > '{log}'\n"
        '[ "$1" = "-n" ] || exit 90\n'
        "shift\n"
        '[ "$1" = "--" ] && shift\n'
        'exec "$@"\n'
    )
    script.chmod(0o755)
    return script


def test_local_become_runs_through_sudo_n(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "sudo.log"
    fake_sudo(tmp_path / "bin", log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    t = LocalTransport(
        HostTarget(name="sandbox", connection="local", become=True), sudo_when_root=True
    )
    result = t.run([PY, "-c", "print('ran')"], timeout=20)
    assert result == CommandResult(rc=0, stdout=b"ran\n", stderr=b"")
    assert log.read_text().splitlines() == ["-n", "--", PY, "-c", "print('ran')"]


def test_local_become_as_root_skips_sudo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert os.geteuid() == 0, "the suite runs as root"
    log = tmp_path / "sudo.log"
    fake_sudo(tmp_path / "bin", log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    t = open_transport(HostTarget(name="sandbox", connection="local", become=True))
    assert t.run([PY, "-c", "print('ran')"], timeout=20).stdout == b"ran\n"
    assert not log.exists()


def test_local_become_without_sudo_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    t = LocalTransport(
        HostTarget(name="sandbox", connection="local", become=True), sudo_when_root=True
    )
    with pytest.raises(RemoteError, match=r"^sandbox: become is set but sudo is not installed"):
        t.run([PY, "-c", "pass"], timeout=20)


def test_ssh_become_prefixes_sudo_n_and_explains_missing_sudo(
    sshd: SshdServer, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    log = tmp_path / "sudo.log"
    script = fake_sudo(bin_dir, log)
    # This sshd gives sessions PATH=<bin_dir> only, so `sudo` is ours (or absent).
    with running_sshd(
        tmp_path / "sshd", client_key=sshd.client_key, extra_config=[f"SetEnv PATH={bin_dir}"]
    ) as server:
        t = ssh(server, target=server.target(become=True))
        try:
            argv = [PY, "-c", "import sys; print(sys.argv[1:])", "a b", "$(id)"]
            result = t.run(argv, timeout=20)
            assert result.rc == 0, result.stderr
            assert result.stdout == b"['a b', '$(id)']\n"
            assert log.read_text().splitlines() == ["-n", "--", *argv]
            script.unlink()
            with pytest.raises(RemoteError) as err:
                t.run([PY, "-c", "pass"], timeout=20)
            assert str(err.value) == (
                f"sandbox-ssh (root@127.0.0.1:{server.port}): become is set but sudo is "
                "not installed (sudo: command not found)"
            )
        finally:
            t.close()


@pytest.mark.parametrize(
    ("rc", "stderr", "expected"),
    [
        (127, "bash: line 1: sudo: command not found\n", "sudo is not installed"),
        (127, "sh: 1: sudo: not found\n", "sudo is not installed"),
        (1, "sudo: a password is required\n", "sudo -n needs a password"),
        (1, "sudo: deploy is not in the sudoers file.\n", "become failed: sudo: deploy is not"),
        (1, "Traceback: the command itself failed\n", None),
        (0, "", None),
    ],
)
def test_become_failures_are_explained(rc: int, stderr: str, expected: str | None) -> None:
    reason = explain_become_failure(rc, stderr.encode())
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason and "\n" not in reason
