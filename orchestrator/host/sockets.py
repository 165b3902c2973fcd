"""Which sockets listen on a TCP port: asked of the kernel's ``sock_diag``, else read from ``/proc``.

A restart asks this several times (is the old server's port free yet? which
process listens on it?). ``/proc/net/tcp`` answers by listing every TCP
socket of the host, established and closing ones included: on a busy box
each read costs milliseconds of kernel time, and the list grows with the
traffic the server serves. A ``sock_diag`` dump asked for listening sockets
only walks the kernel's table of listeners, which holds a few entries. Where
netlink is not allowed (a seccomp profile, a kernel without ``inet_diag``)
the ``/proc`` tables answer as before.

Standard library only, Python 3.8 syntax: this module is shipped to the host.
"""

import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCP_LISTEN = 10
HEADER = struct.Struct("=IHHII")  # struct nlmsghdr: length, type, flags, sequence, port id
# struct inet_diag_req_v2 without its socket id: family, protocol, extensions, pad, states
REQUEST = struct.Struct("=BBBBI")
SOCKET_ID_BYTES = 48  # struct inet_diag_sockid: ports, addresses, interface, cookie
# in struct inet_diag_msg: the source port (big-endian) after the 4 bytes before the id,
# and the inode after the id and four 32-bit fields (expires, queues, uid)
PORT_AT, INODE_AT = 4, 4 + SOCKET_ID_BYTES + 16


def listening_inodes(port):
    """The inodes (as ``/proc/<pid>/fd`` links name them) of the TCP sockets listening on ``port``."""
    try:
        return diag_listening_inodes(port)
    except (OSError, ValueError, struct.error):
        return proc_listening_inodes(port)


def diag_listening_inodes(port):
    """``listening_inodes`` by a ``sock_diag`` dump of listening TCP sockets, IPv4 and IPv6."""
    inodes = set()
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as s:
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
            request = REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN) + bytes(SOCKET_ID_BYTES)
            s.sendall(HEADER.pack(HEADER.size + len(request), SOCK_DIAG_BY_FAMILY,
                                  NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + request)
            for message in dump_messages(s, seq):
                if struct.unpack_from("!H", message, PORT_AT)[0] == port:
                    inodes.add(str(struct.unpack_from("=I", message, INODE_AT)[0]))
    return inodes


def dump_messages(s, seq):
    """The payloads of one dump's answers, up to its ``NLMSG_DONE``; an error answer raises."""
    while True:
        data = s.recv(1 << 16)
        if not data:
            raise OSError("sock_diag: the dump ended without its last message")
        at = 0
        while at + HEADER.size <= len(data):
            length, kind, _flags, got_seq, _pid = HEADER.unpack_from(data, at)
            if length < HEADER.size:
                raise ValueError("sock_diag: a message of %d bytes" % length)
            payload = data[at + HEADER.size:at + length]
            at += (length + 3) & ~3
            if got_seq != seq:
                continue
            if kind == NLMSG_DONE:
                return
            if kind == NLMSG_ERROR:
                raise OSError("sock_diag refused the dump (%d)" % struct.unpack_from("=i", payload)[0])
            if len(payload) >= INODE_AT + 4:
                yield payload


def proc_listening_inodes(port):
    """``listening_inodes`` read from ``/proc/net/tcp`` and ``tcp6`` (state ``0A``: listening)."""
    inodes = set()
    hexport = ":%04X" % port
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[1].endswith(hexport) and parts[3] == "0A":
                        inodes.add(parts[9])
        except (OSError, StopIteration):
            pass
    return inodes
