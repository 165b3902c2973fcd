"""The SSH transport: one Fabric ``Connection`` per host, one channel per command.

Fabric gives us what users expect from ``ssh``: ``~/.ssh/config`` (HostName,
User, Port, IdentityFile, ProxyJump), key files and the agent. We take from
it only the connection; commands run on raw Paramiko channels
(``open_session`` + ``exec_command``) because ``Connection.run`` wants to own
threads, a pty and the terminal, and the helper protocol needs binary pipes
whose reads honour a timeout.

Host keys follow OpenSSH's ``StrictHostKeyChecking``: Fabric's default
policy (add any unknown key) is replaced, on the target and on every
ProxyJump hop, by one that refuses unknown keys unless the user passed
``--accept-new-host-key`` (then the key is appended to the known_hosts file,
like ``accept-new``). A changed key is refused always.

This module imports Fabric and Paramiko (about 0.15 s), so
``shell.transport.open_transport`` imports it only for SSH hosts.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import logging
import os
import shlex
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fabric
import paramiko
from paramiko.ssh_exception import (
    AuthenticationException,
    BadHostKeyException,
    ChannelException,
    NoValidConnectionsError,
    PasswordRequiredException,
    SSHException,
)

from orchestrator.core.target import HostTarget
from orchestrator.errors import (
    ConfigError,
    HostKeyError,
    LinkLostError,
    RemoteError,
    UnreachableError,
)
from orchestrator.shell.transport import (
    CommandResult,
    PumpedProcess,
    become_argv,
    check_argv,
    one_line,
    run_on,
)

# Paramiko logs a failed handshake (a banner that never came) with its traceback; with no
# handler configured, Python's last-resort handler printed it on stderr between orch's own
# lines. orch says what went wrong in one line of its own (``UnreachableError`` and friends).
logging.getLogger("paramiko").addHandler(logging.NullHandler())

#: Where host keys are read and (with accept-new) written when the target names none.
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"

#: How long opening a channel, starting a command or sending to it may stall
#: before the link counts as lost (DESIGN: "noticed within about 30 s").
CHANNEL_TIMEOUT = 30.0

_ERRNO_TEXT = {
    errno.ECONNREFUSED: "connection refused",
    errno.EHOSTUNREACH: "no route to host",
    errno.ENETUNREACH: "network unreachable",
    errno.ECONNRESET: "connection reset",
}


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's ``SHA256:...`` form, so users can compare with ``ssh-keygen -lf``."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def known_hosts_name(host: str, port: int) -> str:
    """The name a known_hosts line uses: ``host``, or ``[host]:port`` off port 22."""
    return host if port == 22 else f"[{host}]:{port}"


def append_known_host(path: Path, name: str, key: paramiko.PKey) -> None:
    """Append one plain ``name type base64`` line; create the file 0600 if missing.

    Appending (rather than Paramiko's ``save_host_keys``, which rewrites the
    whole file) keeps the user's comments, hashed entries and markers intact.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    line = f"{name} {key.get_name()} {key.get_base64()}\n".encode("ascii")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
    finally:
        os.close(fd)


def load_known_hosts(keys: paramiko.HostKeys, path: Path) -> frozenset[str]:
    """Load ``path`` into ``keys`` the way OpenSSH reads it: skip lines it cannot use.

    Paramiko's own loader gives up on the whole file at one malformed line
    (and at ``@cert-authority`` lines), which would make every host
    "unknown". Returns the base64 of keys marked ``@revoked``, which must
    never be accepted. The file is read once per content (``read_known_hosts``).
    """
    known = read_known_hosts(path)
    for name, kind, key in known.entries:
        keys.add(name, kind, key)
    return known.revoked


@dataclass(frozen=True)
class KnownHosts:
    """A known_hosts file, read: (host pattern, key type, key) per usable entry, and revoked keys."""

    entries: tuple[tuple[str, str, paramiko.PKey], ...]
    revoked: frozenset[str]


_known_hosts: dict[tuple[str, int, int, int], KnownHosts] = {}
_known_hosts_lock = threading.Lock()


def read_known_hosts(path: Path) -> KnownHosts:
    """``path`` read and its keys decoded, once per content (path, inode, mtime, size).

    A fleet connects to every host with the same file: decoding each of its
    keys for every host cost O(hosts x keys) of the controller's CPU. A key
    orch appends (``--accept-new-host-key``) changes the size: it is read again.
    """
    try:
        st = path.stat()
        stamp = (str(path), st.st_ino, st.st_mtime_ns, st.st_size)
        with _known_hosts_lock:
            known = _known_hosts.get(stamp)
        if known is not None:
            return known
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return KnownHosts((), frozenset())
    except OSError as exc:
        raise HostKeyError(f"cannot read known_hosts file {path}: {exc.strerror or exc}") from exc
    entries: list[tuple[str, str, paramiko.PKey]] = []
    revoked: set[str] = set()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            fields = line.split()
            if fields[0] == "@revoked" and len(fields) >= 4:
                revoked.add(fields[3])
            continue  # @cert-authority: host certificates are not supported by Paramiko
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
        except Exception:  # bad base64 or key data: OpenSSH skips such lines too
            continue
        if entry is None or entry.key is None:
            continue
        entries.extend((name, entry.key.get_name(), entry.key) for name in entry.hostnames)
    known = KnownHosts(tuple(entries), frozenset(revoked))
    with _known_hosts_lock:
        _known_hosts[stamp] = known
    return known


class KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown host keys, or record them when the user accepted new keys.

    Paramiko calls this only for a host with no key in known_hosts; a key
    that differs from the recorded one never gets here (``BadHostKeyException``).
    """

    def __init__(
        self,
        known_hosts: Path,
        *,
        accept_new: bool,
        where: str,
        via: str,
        revoked: frozenset[str] = frozenset(),
    ) -> None:
        self.known_hosts = known_hosts
        self.accept_new = accept_new
        self.where = where
        self.via = via
        self.revoked = revoked

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        if key.get_base64() in self.revoked:
            raise HostKeyError(
                f"host key for {self.where}{self.via} ({key.get_name()} {fingerprint(key)}) "
                f"is marked @revoked in {self.known_hosts}; refusing to connect"
            )
        if not self.accept_new:
            raise HostKeyError(
                f"unknown host key for {self.where} ({key.get_name()} {fingerprint(key)})"
                f"{self.via}; verify it and pass --accept-new-host-key"
            )
        try:
            append_known_host(self.known_hosts, hostname, key)
        except OSError as exc:
            raise HostKeyError(
                f"cannot record the host key for {self.where} in {self.known_hosts}: "
                f"{exc.strerror or exc}"
            ) from exc
        client.get_host_keys().add(hostname, key.get_name(), key)


class SSHProcess(PumpedProcess):
    """A command on one SSH channel; stdout and stderr drained by pump threads.

    The channel timeout bounds ``write`` (a full send window on a stalled link
    must not hang us); the pumps simply retry when it expires on an idle read.
    """

    def __init__(self, channel: paramiko.Channel, label: str, *, write_timeout: float) -> None:
        super().__init__(label)
        self._chan = channel
        self._write_timeout = write_timeout
        self._killed = False
        channel.settimeout(write_timeout)
        self._start_pumps(_patient(channel.recv), _patient(channel.recv_stderr))

    def write(self, data: bytes) -> None:
        try:
            self._chan.sendall(data)
        except TimeoutError as exc:
            raise LinkLostError(
                f"cannot send to {self.label}: no room for {self._write_timeout:g} s"
            ) from exc
        except (OSError, EOFError, SSHException) as exc:
            raise LinkLostError(f"connection to {self.label} lost") from exc

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError, EOFError, SSHException):
            self._chan.shutdown_write()

    def wait(self, timeout: float) -> int | None:
        """Exit code; ``-1`` when the command died of a signal (SSH sends no code)."""
        if not self._chan.status_event.wait(timeout):
            return None
        reason = self._link_lost()
        if reason:
            raise LinkLostError(reason)
        return self._chan.exit_status

    def kill(self) -> None:
        """Close the channel: sshd closes the command's pipes (it sees EOF / EPIPE)."""
        self._killed = True
        with contextlib.suppress(OSError, EOFError, SSHException):
            self._chan.close()

    def _link_lost(self) -> str | None:
        if self._killed or (self._chan.exit_status_ready() and self._chan.exit_status != -1):
            return None
        transport = self._chan.get_transport()
        if transport is None or not transport.is_active():
            return f"connection to {self.label} lost"
        return None


def _patient(recv: Callable[[int], bytes]) -> Callable[[], bytes]:
    """A reader for the pumps that waits through channel timeouts until data or EOF."""

    def read() -> bytes:
        while True:
            try:
                return recv(65536)
            except TimeoutError:
                continue

    return read


class SSHTransport:
    """``Transport`` over one SSH connection (plus one per ProxyJump hop)."""

    def __init__(
        self,
        target: HostTarget,
        *,
        accept_new_host_key: bool = False,
        ssh_config_path: str | None = None,
        connect_timeout: float = 10.0,
        keepalive: float = 10.0,
        channel_timeout: float = CHANNEL_TIMEOUT,
    ) -> None:
        self.target = target
        self.accept_new_host_key = accept_new_host_key
        self.ssh_config_path = ssh_config_path
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self.channel_timeout = channel_timeout
        self.known_hosts = Path(target.known_hosts or DEFAULT_KNOWN_HOSTS).expanduser()
        self._conn: fabric.Connection | None = None
        # (connection, how messages name it); the target first, then its jump hops.
        self._hops: list[tuple[fabric.Connection, str]] = []
        self._missing_keys: list[str] = []
        self._count = 0
        self._ever_connected = False
        self._lock = threading.Lock()

    # -- public -----------------------------------------------------------------

    @property
    def exec_count(self) -> int:
        return self._count

    @property
    def endpoint(self) -> str | None:
        """``user@host:port`` as resolved through the ssh config (after ``connect``)."""
        if self._conn is None:
            return None
        return f"{self._conn.user}@{self._conn.host}:{self._conn.port}"

    def connect(self) -> None:
        """Open the connection and every jump hop; a no-op while connected.

        Called again after the link dropped, it reconnects (rollback needs that);
        ``spawn`` on a dropped link raises ``LinkLostError`` instead.
        """
        with self._lock:
            if self._conn is not None and self._conn.is_connected:
                return
            if self._conn is None:
                self._build()
            for conn, role in reversed(self._hops):  # nearest hop first
                if conn.is_connected:
                    continue
                self._open_hop(conn, role)
            self._ever_connected = True

    def spawn(self, argv: Sequence[str]) -> SSHProcess:
        words = check_argv(argv)
        if self.target.become:
            words = become_argv(words)
        command = shlex.join(words)
        transport = self._live_transport()
        label = self.target.label
        try:
            channel = transport.open_session(timeout=self.channel_timeout)
        except (SSHException, OSError, EOFError) as exc:
            if not transport.is_active():
                raise LinkLostError(f"connection to {label} lost") from exc
            raise RemoteError(f"{label}: cannot open an SSH channel: {one_line(str(exc))}") from exc
        with self._lock:
            self._count += 1
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            channel.close()

        # exec_command waits for the server's reply without a timeout of its own;
        # closing the channel is what wakes it.
        timer = threading.Timer(self.channel_timeout, expire)
        timer.daemon = True
        timer.start()
        try:
            channel.exec_command(command)
        except (SSHException, OSError, EOFError) as exc:
            channel.close()
            if expired.is_set():
                raise LinkLostError(
                    f"{label} did not start a command within {self.channel_timeout:g} s"
                ) from exc
            if not transport.is_active():
                raise LinkLostError(f"connection to {label} lost") from exc
            raise RemoteError(
                f"{label}: the server refused to run a command: {one_line(str(exc))}"
            ) from exc
        finally:
            timer.cancel()
        return SSHProcess(channel, label, write_timeout=self.channel_timeout)

    def run(self, argv: Sequence[str], *, timeout: float, stdin: bytes = b"") -> CommandResult:
        return run_on(
            self.spawn,
            argv,
            label=self.target.label,
            become=self.target.become,
            timeout=timeout,
            stdin=stdin,
        )

    def close(self) -> None:
        with self._lock:
            for conn, _role in self._hops:  # target first, then the hops it runs through
                with contextlib.suppress(Exception):  # best effort; nothing to tell the user
                    conn.close()

    def __enter__(self) -> SSHTransport:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- building and opening -------------------------------------------------

    def _live_transport(self) -> paramiko.Transport:
        if not self._ever_connected:
            self.connect()
        assert self._conn is not None
        transport = self._conn.transport
        if transport is None or not transport.is_active():
            raise LinkLostError(f"connection to {self.target.label} lost")
        return transport

    def _build(self) -> None:
        """Create the Fabric connection (and its ProxyJump hops) with our policies."""
        target = self.target
        try:
            if self.ssh_config_path:
                config = fabric.Config(runtime_ssh_path=self.ssh_config_path)
            else:
                config = fabric.Config()
        except Exception as exc:  # unreadable or unparsable ssh/fabric config
            raise ConfigError(
                f"cannot read the ssh config: {one_line(str(exc))}",
                file=self.ssh_config_path,
            ) from exc
        address = target.address or target.name
        ssh_cfg = config.base_ssh_config.lookup(address)
        # A fleet-wide default yields to the host's own block in ~/.ssh/config.
        fallback = target.from_defaults
        user = None if "user" in fallback and "user" in ssh_cfg else target.user
        port = None if "port" in fallback and "port" in ssh_cfg else target.port
        keys: list[str] = []
        if target.identity_file and not ("identity_file" in fallback and "identityfile" in ssh_cfg):
            keys.append(target.identity_file)
        kwargs: dict[str, Any] = self._timeouts()
        if keys:
            kwargs["key_filename"] = keys
        try:
            conn = fabric.Connection(
                host=address, user=user, port=port, config=config, connect_kwargs=kwargs
            )
        except (ValueError, KeyError) as exc:  # e.g. a ProxyJump value Fabric cannot parse
            raise ConfigError(
                f"{target.name}: cannot use the ssh config for {address!r}: {one_line(str(exc))}",
                file=self.ssh_config_path,
            ) from exc
        hops: list[tuple[fabric.Connection, str]] = [(conn, "")]
        gateway = conn.gateway
        while isinstance(gateway, fabric.Connection):
            hops.append((gateway, f"jump host {gateway.user}@{gateway.host}:{gateway.port}"))
            gateway = gateway.gateway
        for hop, role in hops:
            self._configure(hop, role, extra_keys=[] if not role else keys)
        self._conn, self._hops = conn, hops

    def _timeouts(self) -> dict[str, Any]:
        # Fabric hands connect_timeout to Paramiko's start_client too, which on
        # expiry returns *without* an error (auth then fails with "No existing
        # session"); a slightly shorter banner timeout fails first, with a reason.
        return {
            "banner_timeout": self.connect_timeout * 0.9,
            "auth_timeout": self.connect_timeout,
            "channel_timeout": self.channel_timeout,
        }

    def _configure(self, conn: fabric.Connection, role: str, *, extra_keys: list[str]) -> None:
        """Host-key policy, timeouts and existing key files for one hop."""
        where = f"{conn.host}:{conn.port}"
        via = f" (the jump host for {self.target.name})" if role else ""
        client = conn.client
        revoked = load_known_hosts(client.get_host_keys(), self.known_hosts)
        client.set_missing_host_key_policy(
            KnownHostsPolicy(
                self.known_hosts,
                accept_new=self.accept_new_host_key,
                where=where,
                via=via,
                revoked=revoked,
            )
        )
        # Fabric truncates connect_timeout to int (0.5 s would mean "none").
        conn.connect_timeout = self.connect_timeout
        kwargs = dict(conn.connect_kwargs)
        if role:
            # A hop gets the same limits, and may use the target's key as well
            # as its own: fleet keys are usually accepted by the bastion too.
            kwargs.update(self._timeouts())
            if extra_keys:
                kwargs["key_filename"] = list(kwargs.get("key_filename") or []) + extra_keys
        files = kwargs.pop("key_filename", None) or []
        if isinstance(files, str):
            files = [files]
        present: list[str] = []
        for name in files:
            path = os.path.expanduser(name)
            if os.path.isfile(path):
                if path not in present:
                    present.append(path)
            elif name not in self._missing_keys:
                self._missing_keys.append(name)
        if present:
            kwargs["key_filename"] = present
        conn.connect_kwargs = kwargs

    def _open_hop(self, conn: fabric.Connection, role: str) -> None:
        label = self.target.label
        prefix = f"{role}: " if role else ""
        try:
            conn.open()
        except HostKeyError:
            self._close_quietly()
            raise
        except BadHostKeyException as exc:
            self._close_quietly()
            where = f"{conn.host}:{conn.port}"
            via = f" (the jump host for {self.target.name})" if role else ""
            raise HostKeyError(
                f"host key for {where}{via} has CHANGED: it offers {exc.key.get_name()} "
                f"{fingerprint(exc.key)} but {self.known_hosts} has {fingerprint(exc.expected_key)}; "
                f"refusing to connect (if the change is expected, remove the old line "
                f"from {self.known_hosts})"
            ) from exc
        except Exception as exc:  # every way a connection fails: one line, no traceback
            reason = self._describe(exc, conn)  # before the close: it reads the transport
            self._close_quietly()
            raise UnreachableError(f"cannot reach {label}: {prefix}{reason}") from exc
        if self.keepalive > 0 and conn.transport is not None:
            conn.transport.set_keepalive(self.keepalive)

    def _close_quietly(self) -> None:
        for conn, _role in self._hops:
            with contextlib.suppress(Exception):
                conn.close()

    def _describe(self, exc: BaseException, conn: fabric.Connection) -> str:
        """The reason a hop could not be opened, in a few words."""
        if isinstance(exc, PasswordRequiredException):
            return "the private key is encrypted; load it into ssh-agent first"
        if isinstance(exc, AuthenticationException):
            text = f"authentication failed for user {conn.user!r}"
            if self._missing_keys:
                text += f" (identity file not found: {', '.join(self._missing_keys)})"
            return text
        if isinstance(exc, ChannelException):
            return (
                f"the jump host could not connect to {conn.host}:{conn.port} "
                f"({one_line(str(exc.text))})"
            )
        if isinstance(exc, NoValidConnectionsError):
            codes: set[int] = {getattr(err, "errno", None) or 0 for err in exc.errors.values()}  # OSErrors
            if codes == {errno.ECONNREFUSED}:
                return "connection refused"
            return _ERRNO_TEXT.get(min(codes, default=0), "no route to host")
        if isinstance(exc, socket.gaierror):
            return f"cannot resolve host name {conn.host!r}"
        if isinstance(exc, (socket.timeout, TimeoutError)):
            return f"timed out after {self.connect_timeout:g} s"
        if isinstance(exc, OSError) and exc.errno in _ERRNO_TEXT:
            return _ERRNO_TEXT[exc.errno]
        if isinstance(exc, EOFError):
            return "the connection closed during the SSH handshake"
        if isinstance(exc, SSHException):
            text = one_line(str(exc)) or type(exc).__name__
            if "banner" in text:
                return f"no SSH server answered within {self.connect_timeout:g} s ({text})"
            if text in ("No existing session", "Negotiation failed."):
                # The start's own wait (connect_timeout) can end before the banner's (0.9 x
                # it) has raised on a busy machine: what the transport read says which it was.
                transport = conn.client.get_transport()
                if transport is not None and not transport.remote_version:
                    return f"no SSH server answered within {self.connect_timeout:g} s (no SSH banner came)"
                return f"the SSH handshake did not finish within {self.connect_timeout:g} s"
            return f"SSH error: {text}"
        if isinstance(exc, OSError):
            return one_line(exc.strerror or str(exc))
        return one_line(f"{type(exc).__name__}: {exc}")
