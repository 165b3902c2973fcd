"""The console script's entry: a Ctrl-C is answered the same way from the very start.

Importing the command line (Click, then each command's modules) takes a
visible fraction of a second. A Ctrl-C in that time would otherwise end
in a Python traceback and exit 130. The package's ``__init__`` answers a
Ctrl-C until the command line is imported; here the commands take over,
with the usual ``KeyboardInterrupt`` (a deploy after its commit asks the
host to abort and restore), and whatever escapes them gets the same line.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

from orchestrator import ctrl_c_seen, heap, interrupted, note_ctrl_c
from orchestrator.interrupts import answer_dropped_interrupts, forget_waiting, when_safe


def main() -> None:
    heap.loading()  # no collections while the command line loads: ``orchestrator.heap``
    args = sys.argv[1:]
    put_back_hook = answer_dropped_interrupts()
    try:
        from orchestrator.cli.app import main as run_cli

        signal.signal(signal.SIGINT, ctrl_c)
        run_cli(args)
    except KeyboardInterrupt:
        stop_live_views()
        interrupted(args)
    except Exception:
        if not ctrl_c_seen():
            raise
        # a Ctrl-C that landed inside a library comes out as that library's own error (zipfile's
        # cleanup, pydantic-core's schema builder, while a module was being imported), with or
        # without the interrupt in its context: it is still the Ctrl-C
        stop_live_views()
        interrupted(args)
    finally:
        # The run is over (its report printed, its code chosen): a Ctrl-C now changes nothing,
        # and must not kill the interpreter while it exits (it restores the default action).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        forget_waiting()
        put_back_hook()
        heap.exiting()


def ctrl_c(_signum: int, frame: FrameType | None) -> None:
    """SIGINT while the command line is imported: noted, then raised as ``KeyboardInterrupt``
    (once outside the import machinery: ``orchestrator.interrupts``)."""
    note_ctrl_c()
    when_safe(frame, raise_ctrl_c)


def raise_ctrl_c() -> None:
    raise KeyboardInterrupt


def stop_live_views() -> None:
    """A spinner on screen is erased before the line that says the run was interrupted."""
    output = sys.modules.get("orchestrator.cli.output")
    if output is not None:
        output.stop_live_views()
