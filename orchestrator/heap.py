"""When Python's cyclic garbage collector runs in one run of ``orch``: not while orch loads, not at exit.

A run imports pydantic's schemas, Click, Rich, Jinja2, Fabric, Paramiko and cryptography:
about 60,000 objects that live until the process ends, and almost no garbage. With the
collector's default thresholds Python walked them about 150 times while they loaded, 35 ms
of CPU in a no-op deploy (a tenth of its imports), where the hosts' work after made 1–2 ms of
collections. And when the process exits, the interpreter's last collections walk every one
of those objects again: 60–100 ms between the report printed and the process gone.

So the console script pauses the collector before its first import (``loading``); the
first transport opened brings it back (``loaded``: Fabric and Paramiko are the last heavy
imports, and from there a run may last hours); and once the run's report is out and its
code chosen, what exists is frozen (``exiting``), so the interpreter's exit leaves it
alone. What is frozen is never collected: ``atexit`` handlers, open files' flushes and
objects freed by their reference counts are untouched. A run that never opens a transport
(``lint``, ``config``, ``--list-hosts``) is short, and keeps the collector paused to its end.

Standard library only, no state of its own: the console script calls ``loading`` first
thing in its ``main``, before the command line is imported.
"""

from __future__ import annotations

import gc


def loading() -> None:
    """Pause the collector while the command line and a command's modules are imported."""
    gc.disable()


def loaded() -> None:
    """The heavy imports are done: what exists now lives to the end (frozen, so the collector
    never walks it again), and the collector is back for what the run makes. Nothing when the
    collector runs already: a run that did not start through the console script, or a second
    transport."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def exiting() -> None:
    """The run is over: freeze everything, so the interpreter's exit does not walk it."""
    gc.freeze()
