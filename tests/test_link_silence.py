"""A file whose bytes take longer than the link's silence limit to cross is not a dead link.

Issue 16, item 2: each end took a link for dead when no whole LINE came for
its silence limit (the ``link_timeout`` setting, 30 s unless set; the helper
keeps the limit its controller sends in ``hello``), and a file's content was
one line; the controller's pings queued behind it. Here, with the limit set to
``LIMIT`` (not 30 s: the premise is the same, the wait a fifth), one round trip
each way carries a file whose base64 takes longer than that to cross a real
sshd behind a proxy forwarding 40 KB/s each way, in blob lines each of which
takes longer than that too: the helper's answer to ``read`` (the controller
must not give up on it) and a ``stage`` request (the helper must not give up
on its controller). The premise is checked from the sizes, not from a clock.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.host import session as host_session
from orchestrator.host.protocol import Hello
from orchestrator.shell.agent_client import (
    BLOB_CHUNK,
    BOOTSTRAP,
    READY_MAGIC,
    Agent,
    bootstrap_payload,
    helper_id,
    helper_reason,
)
from orchestrator.shell.transport import open_transport
from tests.fixtures.proxy import TcpProxy
from tests.fixtures.sshd import SshdServer

BANDWIDTH = 40_000  # bytes per second, each way
LIMIT = 6.0  # the link's silence limit for these tests (the setting's floor is 3 s)
SIZE = 300_000  # its base64 (400 KB) needs ~10 s at that rate (the proxy never goes faster)


@pytest.fixture
def slow_agent(sshd: SshdServer, tmp_path: Path) -> Iterator[Agent]:
    """The helper over the real sshd, through a proxy forwarding ``BANDWIDTH`` bytes/s each way."""
    proxy = TcpProxy(sshd.port, delay=0.02, bandwidth=BANDWIDTH)
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{proxy.port} {sshd.host_key_pub}\n")
    transport = open_transport(sshd.target(port=proxy.port, known_hosts=str(known)),
                               ssh_config_path=str(sshd.ssh_config))
    transport.connect()
    helper = Agent(transport, python=sys.executable, link_timeout=LIMIT).start()
    try:
        yield helper
    finally:
        helper.close()
        transport.close()
        proxy.close()


def test_a_file_slower_than_the_silence_limit_crosses_both_ways(slow_agent: Agent, tmp_path: Path) -> None:
    assert slow_agent.link_timeout == LIMIT < SIZE * 4 / 3 / BANDWIDTH  # the premise, by size
    assert LIMIT < BLOB_CHUNK * 4 / 3 / BANDWIDTH  # and by a blob line's size: no whole line in time
    data = os.urandom(SIZE)
    source = tmp_path / "source.bin"
    source.write_bytes(data)

    # host -> controller: one answer whose bytes keep coming for longer than LIMIT
    info = slow_agent.call("read", paths=[str(source)])[0]
    assert info["data"] == data and info["sha256"] == hashlib.sha256(data).hexdigest()

    # controller -> host: one request as long; the helper hears its bytes, not just its lines
    dest = tmp_path / "dest.bin"
    dest.write_bytes(b"old\n")
    staged = slow_agent.call("stage", files=[{"path": str(dest), "data": data}], token="slow")[0]
    assert Path(staged["staged"]).read_bytes() == data
    assert staged["sha256"] == hashlib.sha256(data).hexdigest()
    assert slow_agent.dead is None and slow_agent.calls == 2
    slow_agent.call("remove", paths=[staged["staged"]])
    assert not Path(staged["staged"]).exists()


def test_a_helper_whose_controller_fell_silent_leaves_with_one_clean_line(tmp_path: Path) -> None:
    """The helper leaves when its controller says nothing for the limit its ``hello`` set
    (``LIMIT``): a message of its own on stderr, not an interpreter dump ending in ``<no Python
    frame>`` (which is what a failed big transfer used to show as its reason), and the
    helper's exit code 0."""
    proc = subprocess.Popen([sys.executable, "-u", "-c", BOOTSTRAP, "", helper_id()], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    assert json.loads(proc.stdout.readline()) == {"send": True}  # no kept copy: it asks for its source
    proc.stdin.write(bootstrap_payload())
    proc.stdin.write(json.dumps({"id": 1, **Hello(link_timeout=LIMIT).to_wire()}).encode() + b"\n")
    proc.stdin.write(b'{"op":"blob","blob":1,"data":"')  # half a line, then nothing: stdin stays open
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline())["ready"] == READY_MAGIC
    hello = json.loads(proc.stdout.readline())
    assert hello["id"] == 1 and hello["ok"] is True, hello
    assert proc.wait(timeout=LIMIT + 60) == 0
    err = proc.stderr.read().decode()
    assert err.strip().splitlines() == [f"orch-helper: no word from the controller for {LIMIT:g} s; stopped"], err
    assert helper_reason(err + "Fatal Python error: x\nCurrent thread 0x1 (most recent call first):\n"
                         "  <no Python frame>\n") == err.strip()
    proc.stdin.close()


def test_blobs_whose_request_never_came_do_not_keep_the_helper_ticking(tmp_path: Path) -> None:
    """A controller interrupted between a request's blob lines and the request itself: the
    helper holds blobs that no request will name. Its pings must not make it say "still
    receiving" for ever (the controller would wait on those ticks for an answer that
    cannot come); only the request's own bytes do."""
    import io
    import time

    session = host_session.Session(io.BytesIO())
    session.take_line(b'{"op":"blob","blob":1,"data":"aGVsbG8="}\n')
    now = time.monotonic()
    assert session.receiving(now)  # its bytes just arrived: the request may follow
    session.last_data = now - 60  # a minute since; pings went on arriving all along
    session.last_heard = now
    session.take_line(b'{"op":"ping"}\n')
    assert not session.receiving(time.monotonic())
