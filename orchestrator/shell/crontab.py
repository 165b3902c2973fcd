"""The current user's crontab on the controller, read and written through ``crontab(1)``."""

from __future__ import annotations

import subprocess

from orchestrator.errors import OrchError


def read_crontab() -> str | None:
    """The crontab's exact text, or None when the user has none."""
    try:
        done = subprocess.run(["crontab", "-l"], capture_output=True, timeout=30)
    except OSError as e:
        raise OrchError(f"cannot run crontab: {e.strerror or e}") from None
    if done.returncode == 0:
        return done.stdout.decode("utf-8", "surrogateescape")
    if b"no crontab" in done.stderr.lower():
        return None
    raise OrchError(f"crontab -l failed: {done.stderr.decode(errors='replace').strip()}")


def write_crontab(text: str | None) -> None:
    """Install ``text`` as the crontab; None removes the crontab."""
    if text is None:
        done = subprocess.run(["crontab", "-r"], capture_output=True, timeout=30)
    else:
        done = subprocess.run(["crontab", "-"], input=text.encode("utf-8", "surrogateescape"),
                              capture_output=True, timeout=30)
    if done.returncode != 0:
        raise OrchError(f"crontab failed: {done.stderr.decode(errors='replace').strip()}")
