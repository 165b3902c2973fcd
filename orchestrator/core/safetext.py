"""Text from a host made safe to show: control characters written as escapes.

Anything a host sends back — a server's log tail, a hook's output, an error
message, a file read back for the ``sed -n`` view — may hold terminal escape
sequences. Printed raw, a hostile (or merely odd) host could set the
window title, clear the screen and print a fake ``changed`` line under
orch's name, and a CI log would keep the raw bytes. ``printable`` is the
one function that turns such text into what a person can safely read:
every control character except newline and tab is written as ``\\x1b``
(``\\u202e`` for the Unicode direction overrides, which reorder what is
shown). It is pure and idempotent: escaped text has nothing left to escape.
"""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""C0 controls but tab and newline, DEL, C1 controls (``\\x9b`` is a CSI too), and the
bidirectional marks and overrides."""


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control character but ``\\n`` and ``\\t`` shown as an escape."""
    return _CONTROL.sub(_escaped, text)
