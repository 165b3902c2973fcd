"""The ``orch`` command line: the group, its commands, and the one error path.

Each command lives in its own module under ``cli/commands/`` and is
registered below; a new command is a new module plus one line here.
Heavy modules (Fabric, Paramiko, Rich, Jinja2) are imported inside the
commands, so ``orch --help``, ``orch --version`` and shell completion
start fast.

``main`` is the one place where errors become output and exit codes: an
``OrchError``'s code is ``core.outcomes.error_exit_code``'s; a usage mistake is exit 2;
Ctrl-C is exit 1. Every error is printed as exactly one line on stderr,
``orch: error: …``, never a traceback — and when ``--json`` was asked for,
the JSON report ``{"exit_code": …, "error": "…", "hosts": {}}`` is printed
on stdout too, so a script always gets a report to read.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Sequence
from types import FrameType

import click

from orchestrator import __version__, interrupted, note_ctrl_c
from orchestrator.cli.commands.config import config
from orchestrator.cli.commands.demo import demo
from orchestrator.cli.commands.deploy import deploy
from orchestrator.cli.commands.history import history
from orchestrator.cli.commands.lint import lint
from orchestrator.cli.commands.nightly import nightly
from orchestrator.cli.commands.rollback import rollback
from orchestrator.cli.commands.status import status
from orchestrator.core.outcomes import ExitCode, error_exit_code
from orchestrator.errors import Hangup, OrchError, Terminated
from orchestrator.interrupts import when_safe


class Interrupted(Exception):
    """A Ctrl-C that ended a command, raised past Click: for a ``KeyboardInterrupt`` Click
    prints a blank line on stderr before its ``Abort``, and the row of the signal table is
    one line (docs/CLI.md, "Signals"), which ``main`` prints."""


class SigintGate:
    """Where a Ctrl-C is a ``KeyboardInterrupt``: inside a command only.

    Inside a command everything that must answer it does (a deploy aborts and restores, a
    read stops). While Click parses the command line or closes its context, Click would
    catch it itself; there it is noted (``pending``) and answered once Click is out of the
    way: at the command's start, or after it returned.
    """

    def __init__(self) -> None:
        self.in_command = False
        self.pending = False

    def handler(self, _signum: int, frame: FrameType | None) -> None:
        note_ctrl_c()
        when_safe(frame, self._ctrl_c)

    def terminate(self, signum: int, frame: FrameType | None) -> None:
        """SIGTERM, SIGHUP: inside a command a ``Terminated`` (a deploy after its commit stops
        following, and aborts nothing); elsewhere the same as a Ctrl-C."""
        note_ctrl_c()
        when_safe(frame, lambda: self._terminate(signum))

    def _ctrl_c(self) -> None:
        if self.in_command:
            raise KeyboardInterrupt
        self.pending = True

    def _terminate(self, signum: int) -> None:
        if self.in_command:
            raise Hangup() if signum == signal.SIGHUP else Terminated()
        self.pending = True


SIGINT_GATE = SigintGate()


class OrchGroup(click.Group):
    """The ``orch`` group: a Ctrl-C in a command leaves it as ``Interrupted``."""

    def invoke(self, ctx: click.Context) -> object:
        SIGINT_GATE.in_command = True
        try:
            if SIGINT_GATE.pending:  # it came while Click parsed the command line
                raise KeyboardInterrupt
            return super().invoke(ctx)
        except KeyboardInterrupt:
            SIGINT_GATE.in_command = False
            raise Interrupted() from None
        finally:
            SIGINT_GATE.in_command = False


@click.group(cls=OrchGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="orch")
def cli() -> None:
    """Change code and flags on remote inference servers, and never leave a box broken.

    Exit codes: 0 success or nothing to do; 1 a deploy failed and the host
    is back as it was; 2 refused before anything changed (bad input, an
    unknown --host, unreachable, locked …); 3 a host is not known to be
    healthy. See docs/CLI.md.
    """


for command in (deploy, rollback, history, status, nightly, lint, config, demo):
    cli.add_command(command)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: run the command, turn whatever it raised into one line and a code."""
    args = list(argv) if argv is not None else sys.argv[1:]
    as_json = "--json" in (args[: args.index("--")] if "--" in args else args)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # ignored: a caller's wish, kept
        signal.signal(signal.SIGINT, SIGINT_GATE.handler)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is not signal.SIG_IGN:  # nohup's wish, kept
            signal.signal(signum, SIGINT_GATE.terminate)
    try:
        code = cli.main(args=args, prog_name="orch", standalone_mode=False)
    except OrchError as e:
        fail(str(e), error_exit_code(e), as_json)
    except click.UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError" and e.ctx is not None:  # plain `orch`
            click.echo(e.ctx.get_help())
            sys.exit(ExitCode.OK)
        where = e.ctx.command_path if e.ctx else "orch"
        fail(f"{where}: {e.format_message()} (see '{where} --help')", ExitCode.REFUSED, as_json)
    except click.ClickException as e:
        fail(e.format_message(), ExitCode.REFUSED, as_json)
    except (Interrupted, click.exceptions.Abort, KeyboardInterrupt):
        # a read (status, history, lint, --list-hosts) or a run before any host: one line, exit 1,
        # the JSON report with its ``interrupted`` field (docs/CLI.md, "Signals")
        clear_live_lines()
        interrupted(args)
    except BrokenPipeError:  # `orch history | head`: the reader left; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(ExitCode.FAILED)
    if SIGINT_GATE.pending:  # while Click closed the command's context: the same answer
        clear_live_lines()
        interrupted(args)
    clear_live_lines()
    sys.exit(code if isinstance(code, int) else ExitCode.OK)


def clear_live_lines() -> None:
    """Erase a spinner or live board still on screen, whatever ended the run: the next line
    (the error, the shell's prompt) must start on a clean line. Rich was never imported
    when nothing could have drawn one (``orch --help``)."""
    output = sys.modules.get("orchestrator.cli.output")
    if output is not None:
        output.stop_live_views()


def fail(message: str, exit_code: int, as_json: bool) -> None:
    """The one error path: a line on stderr, the JSON report on stdout with ``--json``, the code."""
    from orchestrator.core.safetext import printable
    from orchestrator.core.secrets import mask_urls

    clear_live_lines()
    # URL passwords masked (no run's Masker exists out here: this error comes before or around it)
    line = mask_urls(re.sub(r"\s*\n\s*", " ", message.strip()))  # exactly one line, whatever it held
    # an error may quote a host (its answer, a file's line): control characters shown escaped
    click.echo(f"orch: error: {printable(line)}", err=True)
    if as_json:
        import json

        from orchestrator.pipeline.report import error_report

        click.echo(json.dumps(error_report(line, int(exit_code)), indent=2, sort_keys=True))
    sys.exit(int(exit_code))
