"""The bench's "GPU box": a real sshd on loopback whose every exec pays a slow shell init.

Built from the test fixtures (``tests/fixtures/sshd.py``, ``tests/fixtures/sandbox.py``)
so the bench and the suite look at the same host: a copy of the stand-in's
SGLang-like tree, a stand-in server started by hand, an inventory for orch.

Two things are added for measuring:

- ``SetEnv HOME=<bench home>`` whose ``.bashrc`` sleeps S seconds: sshd runs
  every exec as ``bash -c``, and Debian's bash, seeing it was started by sshd,
  reads ``~/.bashrc`` (and only that: not ``$BASH_ENV``, which bash reads only
  in the shells below it) — so the ``sleep`` is a conda or pyenv init paid on
  *every* exec, as on many GPU boxes. An exported guard variable keeps shells
  started below from paying it again: S once per exec, no more.
- ``LogLevel VERBOSE`` (in a ``Match all`` block: the fixture's config already
  says ``LogLevel INFO`` and sshd keeps the first value it reads): sshd then logs
  ``Starting session: ...`` once per exec or subsystem channel and
  ``Accepted publickey`` once per connection, which counts round-trip-costly
  channels for every tool alike, from the server's side.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # ``tests.fixtures`` and ``orchestrator`` from this checkout
    sys.path.insert(0, str(REPO))

from orchestrator.standin import make_tree  # noqa: E402
from tests.fixtures.sandbox import Sandbox, listening_pid, wait_healthy  # noqa: E402
from tests.fixtures.sshd import SshdServer, free_port, start_sshd  # noqa: E402

CHANNEL_LINE = "Starting session: "
CONNECTION_LINE = "Accepted publickey for "
STARTUP_DELAY = 0.3  # seconds the stand-in answers 503 after its start (as the suite's hand start)


def slow_bashrc_text(delay: float) -> str:
    """A ``.bashrc`` that sleeps ``delay`` once per SSH exec (not again in shells it starts)."""
    return (
        "# orch bench: a slow shell init (think `conda init`), paid once per SSH exec\n"
        'if [ -z "${ORCH_BENCH_INIT_DONE:-}" ]; then\n'
        "  export ORCH_BENCH_INIT_DONE=1\n"
        f"  sleep {delay}\n"
        "fi\n"
    )


@dataclass
class Counts:
    """What sshd logged between two marks: TCP+auth connections and exec/subsystem channels."""

    connections: int
    channels: int


@dataclass
class BenchHost:
    """The running sshd and stand-in box, plus what is needed to put the box back as it was."""

    workdir: Path
    sshd: SshdServer
    box: Sandbox
    targets: list[Path]  # the files the story patches (server_args.py and its copies)
    pristine: dict[Path, bytes] = field(default_factory=dict)
    _reaped: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.box.port

    # -- counting ---------------------------------------------------------------

    def log_mark(self) -> int:
        """The sshd log's size now; ``counts_since`` reads what came after."""
        try:
            return self.sshd.log.stat().st_size
        except OSError:
            return 0

    def counts_since(self, mark: int) -> Counts:
        time.sleep(0.05)  # the per-connection sshd child writes its last lines as the client leaves
        with open(self.sshd.log, "rb") as f:
            f.seek(mark)
            text = f.read().decode(errors="replace")
        return Counts(text.count(CONNECTION_LINE), text.count(CHANNEL_LINE))

    # -- the box ----------------------------------------------------------------

    def start_server(self) -> None:
        """Start the stand-in by hand (as a user would) and wait until it is healthy."""
        if self.box.hand is not None:
            self._reaped.append(self.box.hand)
        self.box.start_by_hand(delay=STARTUP_DELAY)
        # Reap it as soon as it ends: a user's server is nobody's child here, and an unreaped
        # zombie still answers ``kill -0``, which a baseline's "wait until it is gone" loop trusts.
        threading.Thread(target=self.box.hand.wait, daemon=True).start()

    def stop_server(self) -> None:
        """Stop whatever listens on the port, whoever started it (orch, a baseline, us)."""
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            pid = listening_pid(self.port)
            if pid is None:
                break
            _kill_group(pid, signal.SIGTERM if time.monotonic() < deadline - 5 else signal.SIGKILL)
            time.sleep(0.1)
        for proc in [*self._reaped, *([self.box.hand] if self.box.hand else [])]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)

    def reset(self) -> None:
        """Put the files back byte for byte and restart the server with its original flags.

        Local, not over SSH, and never timed: a baseline's "restore" is not part
        of what is compared (orch's own ``rollback`` resets orch's runs).
        """
        self.stop_server()
        self.restore_files()
        self.start_server()

    def restore_files(self) -> None:
        for path, data in self.pristine.items():
            path.write_bytes(data)
        for path in self.targets:
            with contextlib.suppress(FileNotFoundError):
                Path(f"{path}.bak").unlink()
            shutil.rmtree(path.parent / "__pycache__", ignore_errors=True)  # py_compile's

    def files_pristine(self) -> bool:
        return all(p.read_bytes() == d for p, d in self.pristine.items())

    def stop(self) -> None:
        """Stop every process the bench started or caused: servers, watchdogs, sshd."""
        with contextlib.suppress(Exception):
            self.box.stop_all()
        with contextlib.suppress(Exception):
            self.stop_server()
        self.sshd.stop()


def _kill_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def start_host(workdir: Path, *, files: int, bashrc_delay: float, real_home: bool = False) -> BenchHost:
    """Start the sshd and the box; ``files`` copies of server_args.py are patched (the first is the real one).

    sshd's sessions get ``HOME`` = a home of the bench's whose ``.bashrc`` is
    the slow init. With ``real_home`` that file then also runs the login user's
    own ``~/.bashrc`` (this machine's runs ``pyenv init``: 0.1 s to 0.7 s an
    exec, depending on load); by default it does not, so the only cost is the
    one chosen.
    """
    home = workdir / "home"
    home.mkdir()
    rc = slow_bashrc_text(bashrc_delay)
    if real_home:
        real = Path.home()
        rc += f'export HOME={real}\n[ -f {real}/.bashrc ] && . {real}/.bashrc\n'
    (home / ".bashrc").write_text(rc)
    sshd = start_sshd(
        workdir / "sshd",
        extra_config=[f"SetEnv HOME={home}", "Match all", "    LogLevel VERBOSE"],
    )
    try:
        root = workdir / "box"
        root.mkdir()
        sglang_root = make_tree(root / "tree")
        box = Sandbox(root, sshd, free_port(), sglang_root, root / "state")
        box.write_inventory()
        real = box.server_args
        targets = [real]
        copies = sglang_root / "srt" / "bench_copies"
        for i in range(1, files):
            copies.mkdir(exist_ok=True)
            copy = copies / f"server_args_{i}.py"
            shutil.copyfile(real, copy)
            targets.append(copy)
        host = BenchHost(workdir, sshd, box, targets, {p: p.read_bytes() for p in targets})
        host.start_server()
        wait_healthy(host.port)
        return host
    except BaseException:
        sshd.stop()
        raise


# -- what one exec costs here ---------------------------------------------------------


def ssh_argv(sshd: SshdServer) -> list[str]:
    """OpenSSH client options that log into the bench's sshd (and read nothing of ~/.ssh)."""
    return [
        "ssh", "-F", str(sshd.ssh_config), "-i", str(sshd.client_key),
        "-o", f"UserKnownHostsFile={sshd.known_hosts}", "-o", "BatchMode=yes",
        "-o", "IdentitiesOnly=yes", "-p", str(sshd.port), f"{sshd.user}@{sshd.host}",
    ]


def exec_costs(sshd: SshdServer, samples: int = 3) -> tuple[float, float]:
    """Median seconds of ``ssh host true`` (connect + auth + exec) and of one exec on an open connection."""
    import paramiko  # only here: the bench's own start stays light

    full = []
    for _ in range(samples):
        t = time.perf_counter()
        subprocess.run([*ssh_argv(sshd), "true"], check=True, capture_output=True, timeout=60)
        full.append(time.perf_counter() - t)
    client = paramiko.SSHClient()
    client.load_host_keys(str(sshd.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(sshd.host, port=sshd.port, username=sshd.user, key_filename=str(sshd.client_key),
                   look_for_keys=False, allow_agent=False)
    try:
        one = []
        for _ in range(samples):
            t = time.perf_counter()
            _, out, _ = client.exec_command("true")
            out.channel.recv_exit_status()
            one.append(time.perf_counter() - t)
    finally:
        client.close()
    return statistics.median(full), statistics.median(one)
