"""``pipeline.release.restore_here``: how a controller's restore before the commit can come back.

The restore itself runs for real in the fault suite (``tests/test_faults.py``: a refused
pre-flight, a Ctrl-C between the backup and the commit). Here, each way its one request can end
is given to it by a session that answers that way, and the cut it reports is checked: the
deploy's and the night's words for each case hang on it.
"""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.errors import LinkLostError, OrchError, UnreachableError
from orchestrator.pipeline.release import Cut, RestoreCut, restore_here
from orchestrator.shell.agent_client import RemoteStepError


class AnsweringSession:
    """A session whose one ``run`` answers ``answer`` (or raises it), on a host clock at 1000."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.asked: list[Any] = []

    def host_time(self) -> float:
        return 1000.0

    def run(self, op: Any, on_event: Any = None) -> Any:
        self.asked.append(op)
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(("raised", "why"), [
    (LinkLostError("the link went silent"), Cut.LINK_LOST),
    (KeyboardInterrupt(), Cut.INTERRUPTED),
    (RemoteStepError("restore_release", "absent", "no such release", {}), Cut.ABSENT),
    (RemoteStepError("restore_release", "locked", "another restore holds it", {}), Cut.COULD_NOT_RUN),
    (UnreachableError("gone"), Cut.COULD_NOT_RUN),
], ids=["link-lost", "interrupted", "absent", "refused", "other-error"])
def test_each_way_a_restore_is_cut_short_is_named_with_the_backstops_time(raised: BaseException, why: Cut) -> None:
    session = AnsweringSession(raised)
    got = restore_here(session, "/state/releases/r1", 42.0, "the pre-flight refused", lambda ev: None)  # type: ignore[arg-type]
    assert isinstance(got, RestoreCut) and got.why is why
    assert got.until == 1042.0  # the host's clock when asked, plus the budget
    assert got.error is (raised if isinstance(raised, OrchError) else None)
    assert len(session.asked) == 1  # one request: never asked again from here


def test_a_record_comes_back_as_it_is() -> None:
    record = object()
    assert restore_here(AnsweringSession(record), "/r", 1.0, "why", lambda ev: None) is record  # type: ignore[arg-type]
