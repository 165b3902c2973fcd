"""Issue 16 item 13: an out-of-space error names the file it could not write.

A real full filesystem (a 2 MB tmpfs as the state dir, filled with ``dd``),
the real CLI over sshd behind the latency proxy: ``write``/``fsync`` errors
carry no file name, so the helper now names the file in them.
"""

from __future__ import annotations

import json
import subprocess

from tests.fixtures.sandbox import sha256
from tests.test_faults import Link, link, story

__all__ = ["link"]  # the fixture, used by name


def test_a_full_state_dir_names_the_file_it_could_not_write(link: Link) -> None:
    box = link.box
    box.state_dir.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(box.state_dir)], check=True)
    try:
        (box.state_dir / "releases").mkdir(mode=0o700)
        subprocess.run(["dd", "if=/dev/zero", f"of={box.state_dir}/fill", "bs=64k"], capture_output=True)
        pid = box.start_by_hand()
        original = sha256(box.server_args)

        proc = box.orch("deploy", "--host", "gpu", "--json", str(story(box)))

        assert proc.returncode == 2, proc.stdout + proc.stderr
        rep = json.loads(proc.stdout)["hosts"]["gpu"]
        assert rep["outcome"] == "failed"
        assert "No space left on device" in rep["error"]
        assert f"{box.state_dir}/lock.json" in rep["error"], rep["error"]
        assert sha256(box.server_args) == original and box.server_pid() == pid
    finally:
        box.stop_all()
        (box.state_dir / "fill").unlink(missing_ok=True)
        subprocess.run(["umount", "-l", str(box.state_dir)], check=False)
