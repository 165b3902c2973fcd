"""Where an interrupt may be raised: never inside the interpreter's import machinery.

A signal handler that raises (``KeyboardInterrupt`` for a Ctrl-C, ``Terminated`` for a
SIGTERM) raises in whatever frame was running. Inside ``importlib._bootstrap`` some of
those frames hold the interpreter's import lock between an ``acquire`` and the ``try``
that releases it: the weakref callback ``_get_module_lock.<locals>.cb`` runs whenever a
module lock is freed, and an exception raised there is printed as "Exception ignored"
and dropped. The Ctrl-C was lost, the lock stayed held, and the next import from any
other thread (a link's reader, a fleet's worker) waited for ever: seen once in CI as a
deploy that hung after its Ctrl-C until the test's 240 s ran out.

So a handler answers through ``when_safe``: in such a frame its answer (which raises) is
not given now but a moment later, from a SIGALRM that finds the import finished (each
import is short: it is tried again every 10 ms). Standard library only: the console
script's first handlers use it too.

The import machinery is not the only place that drops an exception: so does any
``__del__``, weakref callback or C library that reports one as "Exception ignored"
(seen once: a Ctrl-C in ``orch lint`` while pydantic-core used a field's ``pattern``;
the run went on and said "ok", exit 0). ``answer_dropped_interrupts`` catches such an
interrupt at ``sys.unraisablehook`` and gives it again, the same way, a moment later.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import TypeAlias

    Handler: TypeAlias = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

RETRY_SECONDS = 0.01
"""How soon an interrupt that came inside the import machinery is tried again."""


def in_import_machinery(frame: FrameType | None) -> bool:
    """Is ``frame`` the interpreter's own import code (``<frozen importlib._bootstrap>``,
    ``…_bootstrap_external``), where an exception can leave the import lock held?

    Only the innermost frame counts: a module's own body, run by an import, is ordinary
    code, and an exception there unwinds through the import machinery's ``finally``
    clauses as any import error does.
    """
    return frame is not None and frame.f_code.co_filename.startswith("<frozen importlib")


class _WaitingAnswer:
    """SIGALRM's handler while a signal's answer waits for the main thread to leave the import
    machinery: tried every ``RETRY_SECONDS``; once out, SIGALRM's own handler is put back and
    the answer given."""

    def __init__(self, answer: Callable[[], None], previous: Handler) -> None:
        self.answer = answer
        self.previous = previous

    def __call__(self, _signum: int, frame: FrameType | None) -> None:
        if in_import_machinery(frame):
            signal.setitimer(signal.ITIMER_REAL, RETRY_SECONDS)
            return
        self.put_back()
        self.answer()

    def put_back(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.previous if self.previous is not None else signal.SIG_DFL)


def when_safe(frame: FrameType | None, answer: Callable[[], None]) -> None:
    """Call ``answer`` (a signal's answer, which usually raises) now, or, when ``frame`` is
    inside the import machinery, from a SIGALRM a moment later that finds the main thread
    outside it (tried again until so). The answer decides then what the moment calls for:
    a command may have ended meanwhile. A second signal while one waits replaces its answer
    (one exception ends the wait either way).

    Called from a signal handler, so on the main thread: SIGALRM's handler is only set
    while an answer waits, and the previous one is put back before answering.
    """
    if not in_import_machinery(frame):
        answer()
        return
    later(answer)


def later(answer: Callable[[], None]) -> None:
    """Give ``answer`` from a SIGALRM in ``RETRY_SECONDS``, outside the import machinery
    (``when_safe``); an answer already waiting is replaced. On the main thread only."""
    waiting = signal.getsignal(signal.SIGALRM)
    if isinstance(waiting, _WaitingAnswer):
        waiting.answer = answer
        return
    signal.signal(signal.SIGALRM, _WaitingAnswer(answer, waiting))
    signal.setitimer(signal.ITIMER_REAL, RETRY_SECONDS)


def answer_dropped_interrupts() -> Callable[[], None]:
    """From now on, an interrupt the interpreter would drop as "Exception ignored" on the
    main thread (raised by a signal handler inside a ``__del__``, a weakref callback, a C
    library's callback) is signalled again a moment later (``later``), where its handler
    answers it as it would have (a command that has ended meanwhile is not cut short);
    any other such exception is reported as before. Returns what puts the previous
    ``sys.unraisablehook`` back: the run's end, after which a Ctrl-C changes nothing.
    """
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        dropped = unraisable.exc_value
        if isinstance(dropped, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
            # the signal it stands for: SIGINT, or ``errors.Terminated``'s SIGTERM / SIGHUP
            signum = signal.Signals(getattr(dropped, "signum", signal.SIGINT))
            later(lambda: signal.raise_signal(signum))
            return
        previous(unraisable)

    def put_back() -> None:
        sys.unraisablehook = previous

    sys.unraisablehook = hook
    return put_back


def forget_waiting() -> None:
    """The run is over: an answer still waiting for its SIGALRM is dropped (a Ctrl-C now
    changes nothing) rather than raised into the interpreter's exit."""
    waiting = signal.getsignal(signal.SIGALRM)
    if isinstance(waiting, _WaitingAnswer):
        waiting.put_back()


def thread_in_import_machinery(ident: int) -> bool:
    """Is thread ``ident`` inside the import machinery right now (see ``in_import_machinery``)?
    A look, not a promise: the thread runs on."""
    return in_import_machinery(sys._current_frames().get(ident))
