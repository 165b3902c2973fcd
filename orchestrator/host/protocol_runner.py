"""The requests of a release's runner (``runner.py``, ``stamp.py``): start it, follow it,
abort it, and the confirm's record of the run it writes by itself.

A module of its own only to keep ``protocol`` under 600 lines; ``protocol.REQUEST_TYPES``
lists these with every other request, and the helper parses them the same way.

Standard library only, Python 3.8 syntax: this module is shipped to the host.
"""

from __future__ import annotations

from .protocol import (
    Field as Field,  # the base classes' annotations name it (``typing.get_type_hints``)
)
from .protocol import Request, message

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import ClassVar

    from .protocol import Wire


@message(frozen=True)
class ReleaseRun(Request):
    """The commit is done: the guard forks the runner, which takes the lock (the commit's batch)."""

    OP: ClassVar[str] = "release_run"
    release_dir: str
    state_dir: str


@message(frozen=True)
class ReleaseFollow(Request):
    """The release's event log from line ``after`` on, as events, until its verdict (the answer);
    a ``cancel`` meanwhile aborts the runner (``abort_on_cancel``), or only ends the call."""

    OP: ClassVar[str] = "release_follow"
    release_dir: str
    after: int = 0
    abort_on_cancel: bool = True


@message(frozen=True)
class ReleaseAbort(Request):
    """Ask the release's live runner to stop its step and restore."""

    OP: ClassVar[str] = "release_abort"
    release_dir: str


@message(frozen=True)
class ReleaseStamp(Request):
    """Inside the confirm: the release's finish time, duration, steps and timings from its
    event log (``steps``: those before the commit, from the controller), and with a gate the
    verdict and figures its gate step judged (``gate``: the probes' labels and settings); a
    night's probe summed up from its probe step's answers (``probe``: ``post``, ``concurrency``)
    and its build's manifest written with it (``manifest``: ``path``, ``record``). ``fields``:
    more of the release's manifest set in the same write (the outcome the confirm records)."""

    OP: ClassVar[str] = "release_stamp"
    state_dir: str
    release_id: str
    release_dir: str
    started: float
    steps: list[Wire]
    gate: Wire | None = None
    probe: Wire | None = None
    manifest: Wire | None = None
    fields: Wire | None = None
