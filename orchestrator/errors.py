"""Every error orch reports on purpose: the causes.

The classes here say *what happened* (a cause): bad input, an unreachable
host, a lost link, a host step that failed, a server that failed. *What
that means for the run* — the outcome and the exit code — depends also on
how far the run got, and is decided in one place, ``core.outcomes``:
``verdict`` for a host run, ``error_exit_code`` for an error that ends a
command outside a host run (by class, as Click's ``ClickException.exit_code``):
a ``RefusedError`` is refused before anything on a host changed, a
``ServerFailedError`` failed and was restored, a ``HostUnsafeError`` leaves
the host not known to be healthy.

A message is one line meant for a person. Nothing here does I/O.
"""

from __future__ import annotations

import signal


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP to the controller (docs/CLI.md, "Signals"): before a commit it ends the
    run as a Ctrl-C does (nothing changed, exit 1); after it, the controller only stops
    following and the host's runner goes on — nothing is aborted."""

    signum = 15  # SIGTERM (a class attribute: the fleet raises it in a worker by its class alone)


class Hangup(Terminated):
    """SIGHUP: the terminal or the SSH session that ran orch went away."""

    signum = 1


def signal_name(cause: BaseException | type[BaseException]) -> str | None:
    """The signal a ``Terminated`` stands for (``"SIGTERM"``, ``"SIGHUP"``); None for a Ctrl-C."""
    signum = getattr(cause, "signum", None)
    return signal.Signals(signum).name if signum else None


def interruption(cause: BaseException | type[BaseException]) -> str:
    """How a run names what stopped it (``interruption_words``)."""
    return interruption_words(signal_name(cause))


def interruption_words(signame: str | None) -> str:
    """A Ctrl-C as such; SIGTERM and SIGHUP by name, for a service manager, ``timeout`` or a
    closed SSH session sent those, not a person at the keys."""
    return f"stopped by {signame}" if signame else "interrupted (Ctrl-C)"


class InterruptedTwice(KeyboardInterrupt):
    """A second Ctrl-C, as a fleet's worker thread is told it: a thread has one slot for an
    exception raised in it from outside, so two Ctrl-C that come before it runs again would be
    one; this one says both came (stop waiting, after asking the host to abort)."""


class OrchError(Exception):
    """Base of all errors orch raises on purpose."""


class RefusedError(OrchError):
    """Refused before anything on a host changed (exit 2)."""


class ConfigError(RefusedError):
    """Bad input: names the file, the line and the key.

    ``str(err)`` is ``file:line: key: message`` with the parts that are known.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        key: str | None = None,
    ) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.key = key
        super().__init__(self.__str__())

    def located(
        self, *, file: str | None = None, line: int | None = None, key: str | None = None
    ) -> ConfigError:
        """Return a copy with the location parts that were missing filled in."""
        return type(self)(
            self.message,
            file=self.file or file,
            line=self.line or line,
            key=self.key or key,
        )

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = self.file + (f":{self.line}" if self.line else "") + ": "
        key = f"{self.key}: " if self.key else ""
        return f"{where}{key}{self.message}"


class TemplateError(ConfigError):
    """A template failed to parse or render (syntax error, undefined variable)."""


class AnchorError(ConfigError):
    """An anchor matched zero places, or several; the message lists candidates."""


class EditError(ConfigError):
    """An edit cannot be applied as written (replace count, patch refused, markers)."""


class StructureError(RefusedError):
    """The edited Python file is not the original plus exactly the planned statements."""


class ValidationError(RefusedError):
    """A ``validate`` step failed on the staged copy."""


class HostKeyError(RefusedError):
    """The host's SSH key is unknown (and not accepted) or has changed."""


class UnreachableError(RefusedError):
    """The host could not be reached or logged into."""


class BecomeRefusedError(RefusedError):
    """``become`` is set and the host's sudo refused to run orch's helper (it asks for a
    password, the user is not in sudoers, sudo is missing): the host was reached, and
    refused — the host's ``failed``, not ``unreachable``."""


class LockHeldError(RefusedError):
    """Another deploy holds the host's lock."""


class UnfinishedDeployError(RefusedError):
    """The journal shows a deploy that never finished; ``orch rollback`` finishes it."""


class ContentChangedError(RefusedError):
    """A target changed on the host after it was planned: the commit refused, nothing was written."""


class RecordFormatError(RefusedError):
    """A record on the host (journal, lock, manifest, restore plan …) is in a format this
    orch does not read: a newer orch wrote it. Refused, never misread; one line names the
    record and its version (``host.records.UnknownRecordFormat``, raised at the boundary)."""


class RemoteError(OrchError):
    """A step on the host failed. Which exit code it means depends on the step."""


class ServerFailedError(OrchError):
    """The new server did not start, did not become healthy, or did not stay healthy."""


class PreflightRefusedError(ServerFailedError):
    """The server's own parser refused the new command line; the running server was not touched."""


class GateFailedError(ServerFailedError):
    """The new server is healthy but fails a rule of the playbook's performance gate."""


class HostUnsafeError(OrchError):
    """The host is not known to be healthy; the message says what to run (exit 3)."""


class LinkLostError(OrchError):
    """The connection went silent or dropped during the run.

    Before anything changed that is an unreachable host (exit 2); after the
    commit the host is in an unknown state (exit 3): the policy decides.
    """


class MalformedReplyError(LinkLostError):
    """A host's helper answered something the controller cannot use (not JSON, nested
    too deep, a wrong type, a missing key): the link is closed and not trusted again.

    A lost link as far as what happened on the host is concerned (after the commit,
    the host is in an unknown state: ``unreachable``, exit 3), but a refusal of that
    one host before anything changed (``failed``, exit 2): the host answered, badly.
    """
