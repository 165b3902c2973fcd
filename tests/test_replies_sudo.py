"""Issue 16 item 13: sudo that asks for a password is a refusal, not an unreachable host.

A real user whose sudoers entry has no NOPASSWD, logging in over a real sshd
with ``become: true``: orch runs its helper through ``sudo -n``, sudo says
"a password is required", and the report is that host's ``failed``, exit 2,
"sudo asks for a password on H: …" — the host was reached and refused.
The user and its sudoers entry are made once and kept (useradd, like the
sshd, needs root; the suite runs as root).
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.forkrun import run_orch
from tests.fixtures.sandbox import SHIPPED_SPEC
from tests.fixtures.sshd import SshdServer, public_part, running_sshd

USER = "orchtest-sudopw"
SUDOERS = Path("/etc/sudoers.d") / USER


def ensure_user() -> pwd.struct_passwd:
    """The user, with a password (so its account is not locked) and sudo rights that need it."""
    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", USER], check=True)
        subprocess.run(["chpasswd"], input=f"{USER}:{secrets.token_hex(16)}\n", text=True, check=True)
        entry = pwd.getpwnam(USER)
    if not SUDOERS.exists():
        SUDOERS.write_text(f"{USER} ALL=(ALL) ALL\n")  # sudo, with a password: no NOPASSWD
        SUDOERS.chmod(0o440)
    check = subprocess.run(["visudo", "-c", "-f", str(SUDOERS)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    return entry


@pytest.fixture
def user_sshd(sshd: SshdServer, tmp_path: Path) -> Iterator[SshdServer]:
    """An sshd that lets ``USER`` in with the suite's client key (from the user's own home)."""
    entry = ensure_user()
    ssh_dir = Path(entry.pw_dir) / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    keys = ssh_dir / "authorized_keys"
    keys.write_text(public_part(sshd.client_key) + "\n")
    for path in (ssh_dir, keys):
        os.chown(path, entry.pw_uid, entry.pw_gid)
    config = [f"Match User {USER}", f"  AuthorizedKeysFile {keys}"]
    with running_sshd(tmp_path / "sshd", client_key=sshd.client_key, extra_config=config) as server:
        yield server


def test_sudo_asking_for_a_password_is_that_hosts_refusal(user_sshd: SshdServer, tmp_path: Path) -> None:
    server = user_sshd
    entry = {"address": server.host, "port": server.port, "user": USER, "identity_file": str(server.client_key),
             "known_hosts": str(server.known_hosts), "become": True, "state_dir": str(tmp_path / "state"),
             "vars": {"sglang_root": str(tmp_path / "tree"), "model": "/models/standin", "port": 30000}}
    (tmp_path / "inventory.yaml").write_text(json.dumps({"hosts": {"gpu": entry}}))
    (tmp_path / "play.yaml").write_text(SHIPPED_SPEC)
    env = dict(os.environ, COLUMNS="200", NO_COLOR="1")

    proc = run_orch(["deploy", "--host", "gpu", "--json", "play.yaml",
                           "--ssh-config", str(server.ssh_config)], cwd=tmp_path, env=env, timeout=240)

    assert proc.returncode == 2, proc.stdout + proc.stderr
    host = json.loads(proc.stdout)["hosts"]["gpu"]
    assert host["outcome"] == "failed", host
    assert host["error"].startswith(f"sudo asks for a password on gpu ({USER}@{server.host}:{server.port}): ")
    assert "NOPASSWD" in host["error"] and "\n" not in host["error"]
    assert f"Accepted publickey for {USER}" in server.log_text()  # reached and logged into: not unreachable
    assert not (tmp_path / "state").exists()
