"""The fixtures' ports: no test loses its port to another between the pick and the bind.

On a busy machine the fleet's sshd failed with "Bind to port … failed: Address already
in use": the port was probed free, the probe closed, and someone else bound it before
sshd did. Ports are now reserved when picked (``reserve_port``), and ``start_sshd``
moves to another port when sshd still cannot bind its own. Real sockets, the real
sshd and the real stand-in server on loopback; the port is taken from outside, by a
listener of our own, as another test's server would take it.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.standin import make_tree
from tests.fixtures.fleet import PORT_RANGE, free_port_below_ephemeral
from tests.fixtures.sandbox import Sandbox, listening_pid, wait_until
from tests.fixtures.sshd import ADDRESSES, SshdServer, free_port, reserve_port, start_sshd


def taken_on(address: str, port: int) -> socket.socket:
    """A listener on ``address:port`` as another test's server would be: with
    ``SO_REUSEADDR``, like sshd and the stand-in, so it may bind a reserved port."""
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    other.bind((address, port))
    other.listen(5)
    return other


@pytest.fixture
def intruder() -> Iterator[list[socket.socket]]:
    """Listeners a test opens to take ports; closed after it."""
    opened: list[socket.socket] = []
    try:
        yield opened
    finally:
        for sock in opened:
            sock.close()


def logs_in(server: SshdServer, address: str) -> bool:
    """A real ``ssh`` login to ``address`` on the server's port runs ``true``."""
    known = server.workdir / "known_hosts_test"
    known.write_text(server.known_hosts_line(address))
    done = subprocess.run(
        ["ssh", "-F", str(server.ssh_config), "-i", str(server.client_key), "-p", str(server.port),
         "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes",
         "-o", "BatchMode=yes", f"{server.user}@{address}", "true"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )
    return done.returncode == 0


def test_a_picked_port_is_refused_to_every_other_pick_on_any_address() -> None:
    port = free_port()
    for address in ("127.0.0.1", "127.0.0.2", "127.0.40.3", "0.0.0.0"):
        with socket.socket() as probe, pytest.raises(OSError) as err:
            probe.bind((address, port))
        assert err.value.errno == errno.EADDRINUSE, address
    assert reserve_port(port) is None
    # Reserved, not served: a client is refused until a server listens there.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_the_fleets_ports_are_below_the_ephemeral_range_and_reserved() -> None:
    port = free_port_below_ephemeral()
    low, high = PORT_RANGE
    assert low <= port < high
    assert reserve_port(port) is None


def test_the_standin_binds_its_reserved_port_and_again_after_a_stop(sshd: SshdServer, tmp_path: Path) -> None:
    """The reservation outlives the server: while orch restarts it, nobody else can take the port."""
    port = free_port()
    box = Sandbox(tmp_path, sshd, port, make_tree(tmp_path / "tree"), tmp_path / "state")
    try:
        first = box.start_by_hand(delay=0.0)
        assert listening_pid(port) == first
        box.stop_all()
        wait_until(lambda: listening_pid(port) is None, f"nothing listening on {port}")
        with socket.socket() as probe, pytest.raises(OSError):
            probe.bind(("127.0.0.1", port))
        second = box.start_by_hand(delay=0.0)
        assert second != first and listening_pid(port) == second
    finally:
        box.stop_all()


def test_start_sshd_moves_to_another_port_when_its_pick_is_taken_under_it(
        tmp_path: Path, intruder: list[socket.socket]) -> None:
    taken = free_port()
    intruder.append(taken_on("127.0.0.2", taken))  # between the pick and sshd's bind
    picked: list[int] = []

    def pick() -> int:
        port = taken if not picked else free_port()
        picked.append(port)
        return port

    server = start_sshd(tmp_path / "sshd", pick_port=pick)
    try:
        assert picked[0] == taken and len(picked) == 2
        assert server.port == picked[1] != taken
        assert listening_pid(server.port) == server.process.pid  # type: ignore[union-attr]
        assert all(logs_in(server, address) for address in ADDRESSES)
        assert listening_pid(taken) == os.getpid()  # the intruder kept its port
    finally:
        server.stop()


def test_start_sshd_on_a_port_taken_on_one_address_fails_naming_the_bind(
        tmp_path: Path, intruder: list[socket.socket]) -> None:
    """Not half a server: sshd bound 127.0.0.1 and served it, and a connection to
    127.0.0.2 reached the intruder, so the port used to pass as sshd's."""
    taken = free_port()
    intruder.append(taken_on("127.0.0.2", taken))
    with pytest.raises(RuntimeError) as err:
        start_sshd(tmp_path / "sshd", port=taken)
    assert f"Bind to port {taken} on 127.0.0.2 failed: Address already in use" in str(err.value)
    assert "try 1 of 1" in str(err.value)
    assert listening_pid(taken) == os.getpid()  # the intruder, alone: sshd was stopped


def test_start_sshd_gives_up_after_its_tries_with_the_last_error(
        tmp_path: Path, intruder: list[socket.socket]) -> None:
    picked: list[int] = []

    def pick() -> int:
        port = free_port()
        intruder.append(taken_on("127.0.0.1", port))
        picked.append(port)
        return port

    with pytest.raises(RuntimeError) as err:
        start_sshd(tmp_path / "sshd", pick_port=pick, tries=3)
    assert len(picked) == 3
    assert f"try 3 of 3, port {picked[-1]}" in str(err.value)
    assert f"Bind to port {picked[-1]} on 127.0.0.1 failed: Address already in use" in str(err.value)
