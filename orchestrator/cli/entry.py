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

from orchestrator import interrupted


def main() -> None:
    args = sys.argv[1:]
    try:
        from orchestrator.cli.app import main as run_cli

        signal.signal(signal.SIGINT, signal.default_int_handler)
        run_cli(args)
    except KeyboardInterrupt:
        output = sys.modules.get("orchestrator.cli.output")
        if output is not None:  # a spinner on screen: erased before the line that says so
            output.stop_live_views()
        interrupted(args)
    finally:
        # The run is over (its report printed, its code chosen): a Ctrl-C now changes nothing,
        # and must not kill the interpreter while it exits (it restores the default action).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
