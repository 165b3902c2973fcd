"""orch's entries in a crontab, edited as text so every other line stays byte for byte.

An entry is two lines: a marker comment naming it, then the cron line::

    # orch nightly: host=gpu1 spec=/home/me/nightly.yaml
    0 2 * * * cd /home/me && /home/me/.venv/bin/python -m orchestrator nightly … >> … 2>&1

``--unschedule`` removes exactly those two lines. (python-crontab, which
checks the schedule expression here, re-renders every line it parses, so it
is not used to write: a user's ``0  2 * * *`` must stay as they wrote it.)
Pure: text in, text out.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.errors import ConfigError

MARK = "# orch nightly: "


@dataclass(frozen=True)
class ScheduleEntry:
    key: str
    line: str

    @property
    def schedule(self) -> str:
        words = self.line.split()
        return words[0] if words and words[0].startswith("@") else " ".join(words[:5])

    @property
    def command(self) -> str:
        """The shell command cron runs (``\\%`` unescaped, as cron passes it to sh)."""
        words = self.line.split(None, 1 if self.line.startswith("@") else 5)
        return words[-1].replace("\\%", "%") if len(words) > 1 else ""


def check_schedule(expression: str) -> str:
    """A cron schedule (``0 2 * * *``, ``@daily``); ``ConfigError`` when it is not one."""
    from crontab import CronSlices

    text = " ".join(expression.split())
    if not text or not CronSlices.is_valid(text):
        raise ConfigError(f"not a cron schedule: {expression!r} (e.g. \"0 2 * * *\" or @daily)",
                          key="--schedule")
    return text


def schedule_key(host: str, spec: str) -> str:
    return f"host={host} spec={spec}"


def cron_command(argv: Sequence[str], cwd: str, log: str) -> str:
    """One shell line for cron: absolute paths, output appended to ``log``; ``%`` escaped."""
    line = f"cd {shlex.quote(cwd)} && {shlex.join(argv)} >> {shlex.quote(log)} 2>&1"
    return line.replace("%", "\\%")


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def list_entries(text: str) -> list[ScheduleEntry]:
    lines = _lines(text)
    out = []
    for i, line in enumerate(lines):
        if line.startswith(MARK) and i + 1 < len(lines):
            out.append(ScheduleEntry(line[len(MARK):].rstrip("\r\n"), lines[i + 1].rstrip("\r\n")))
    return out


def remove_entry(text: str, key: str) -> tuple[str, bool]:
    """``text`` without the entry named ``key`` (its two lines), and whether it was there."""
    lines = _lines(text)
    for i, line in enumerate(lines):
        if line.startswith(MARK) and line[len(MARK):].rstrip("\r\n") == key:
            return "".join(lines[:i] + lines[i + 2:]), True
    return text, False


def add_entry(text: str, key: str, schedule: str, command: str) -> str:
    """``text`` with the entry ``key`` (replacing one of that name), appended at the end."""
    text, _ = remove_entry(text, key)
    if text and not text.endswith("\n"):
        text += "\n"
    return f"{text}{MARK}{key}\n{schedule} {command}\n"
