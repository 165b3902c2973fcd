"""orch: change code and flags on remote inference servers, and never leave a box broken."""

import sys as _sys

__version__ = "0.8.5"


def interrupted(args: "list[str]") -> None:
    """Ctrl-C outside a command's own handling: one line, exit 1, the JSON report if asked.

    The same answer as a Ctrl-C anywhere else before a host was touched
    (docs/CLI.md, the signal table). It lives here, the first module of
    orch any run imports, so it can answer while the rest is still being
    imported; it needs nothing but the standard library.
    """
    import _signal  # type: ignore[import-not-found]  # CPython's C module (no stub): lighter than signal

    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)  # a second Ctrl-C must not cut this short
    try:
        # a terminal echoed ``^C`` where the cursor was: the line starts below it (through a
        # pipe there is no echo, and the line is the only one)
        after_echo = "\n" if _sys.stderr.isatty() else ""
    except (AttributeError, ValueError):  # no stderr, or a closed one
        after_echo = ""
    _sys.stderr.write(after_echo + "orch: error: interrupted\n")
    _sys.stderr.flush()
    if "--json" in (args[: args.index("--")] if "--" in args else args):
        # written out, not through the json module: the Ctrl-C may have come in the middle of
        # importing what json imports (re), and importing it now would fail half-way
        _sys.stdout.write(INTERRUPTED_JSON)
        _sys.stdout.flush()
    # Out at once, without the interpreter's finalization: a read's abandoned workers (daemon
    # threads, blocked in a socket) made it abort now and then ("FATAL: exception not rethrown").
    # Everything worth keeping was written and flushed above; the hosts' helpers end with
    # their SSH sessions, which the kernel closes.
    import os

    os._exit(1)


INTERRUPTED_JSON = '{\n  "error": "interrupted",\n  "exit_code": 1,\n  "hosts": {},\n  "interrupted": true\n}\n'
"""``json.dumps(INTERRUPTED_REPORT, indent=2, sort_keys=True)``: the report of a run a Ctrl-C
ended before a host's own run could say more (``interrupted``: only such a report has it)."""

INTERRUPTED_REPORT = {"exit_code": 1, "error": "interrupted", "hosts": {}, "interrupted": True}


_ctrl_c_seen = False


def note_ctrl_c() -> None:
    """A SIGINT (or a SIGTERM/SIGHUP, which before a commit acts as one) reached this process.
    Kept because a library may turn the ``KeyboardInterrupt`` it raises into an error of its own,
    with or without a trace of it (zipfile's cleanup raises ``ValueError``; pydantic-core,
    building a model's schema during an import, ``SchemaError``): the entry point still answers
    that run as the Ctrl-C it was (``ctrl_c_seen``)."""
    global _ctrl_c_seen
    _ctrl_c_seen = True


def ctrl_c_seen() -> bool:
    return _ctrl_c_seen


def _ctrl_c_while_starting(_signum: int, _frame: object) -> None:
    interrupted(_sys.argv[1:])


if _sys.argv and (_sys.argv[0] in ("-m", "orch") or _sys.argv[0].endswith("/orch")):
    # This process is the orch command (not a library user, such as the tests): until the
    # command line is imported (cli/entry.py), a Ctrl-C is answered from here. ``_signal``,
    # not ``signal``: that one imports enum, a window of its own.
    import _signal

    _signal.signal(_signal.SIGINT, _ctrl_c_while_starting)
