"""Which sockets listen on a port (``host/sockets.py``), asked of this machine's kernel both ways:
``sock_diag`` and ``/proc/net/tcp`` must name the same sockets, and a socket that only
connects or has closed is named by neither."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from orchestrator.host import processes, sockets


def inode_of(sock: socket.socket) -> str:
    """The socket's inode as ``/proc/<pid>/fd`` names it (``socket:[N]``)."""
    return os.readlink(f"/proc/self/fd/{sock.fileno()}")[len("socket:["):-1]


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s


def test_both_ways_name_the_listening_socket_and_only_it(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    with socket.create_connection(("127.0.0.1", port)):  # an established socket on the same port
        assert sockets.diag_listening_inodes(port) == {inode_of(listener)}
        assert sockets.proc_listening_inodes(port) == {inode_of(listener)}
        assert sockets.listening_inodes(port) == {inode_of(listener)}
    assert processes.pid_listening_on(port) == os.getpid()
    assert processes.port_busy(port)


def test_an_ipv6_listener_is_named_too() -> None:
    if not socket.has_ipv6:
        pytest.fail("this machine's Python has no IPv6: the IPv6 half of the dump is untested")
    with socket.socket(socket.AF_INET6) as s:
        try:
            s.bind(("::1", 0))
        except OSError as e:
            pytest.fail(f"no IPv6 loopback on this machine ({e}): the IPv6 half of the dump is untested")
        s.listen()
        port = s.getsockname()[1]
        assert sockets.diag_listening_inodes(port) == sockets.proc_listening_inodes(port) == {inode_of(s)}


def test_a_closed_port_is_free_both_ways() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
    assert sockets.diag_listening_inodes(port) == set()
    assert sockets.proc_listening_inodes(port) == set()
    assert not processes.port_busy(port)
    assert processes.pid_listening_on(port) is None


def test_many_listeners_take_more_than_one_answer_and_none_is_missed() -> None:
    """Enough listening sockets (about 26 KB of answers) that the kernel sends its dump in parts."""
    held = []
    try:
        for _ in range(300):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            s.listen()
            held.append(s)
        for s in held[::37]:
            port = s.getsockname()[1]
            assert sockets.diag_listening_inodes(port) == {inode_of(s)}
    finally:
        for s in held:
            s.close()
