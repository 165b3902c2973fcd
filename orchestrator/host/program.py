"""A release's program: every step after its commit, written once, run by one executor.

Deploy, night and rollback differ in what they change before the point of no
return (a commit of files, a build's switch, a restore); after it, a release
is the same sequence for all of them: read the change back, run the
server's own parser, drain, measure the old server, stop it, start the new
one, wait for health and stability, measure again for the gate, put it back
behind the router, confirm. ``Program`` is that sequence as data: each
``ProgramStep`` is named (``StepName``) and carries the typed requests of
``protocol`` it runs, in order. The controller writes the program into the
release when it arms it (``RunSteps.program``), so the host holds
everything the rest of the release needs; ``executor.py`` runs it.

The program is a record like the others (``format``; unknown fields
ignored; an unknown format refused by name) and is written 0600: its
requests carry the rendered command lines, secrets included, as
``restore.json`` does.

Standard library only, Python 3.8 syntax: this module is shipped to the host.
"""

from __future__ import annotations

import enum

from .protocol import ProtocolError, parse_request

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from .protocol import Request, Wire

FORMAT = 1
"""The program's record format (``program.json``)."""


class StepName(str, enum.Enum):
    """The steps after a commit, in the order a program may hold them."""

    READ_BACK = "read_back"  # the committed files' sha256 read back (the ``sed -n`` view's proof)
    PREFLIGHT = "preflight"  # the server's own parser on the new command line
    BEFORE_STOP = "before_stop"  # the drain hook: out of the router before the stop
    BASELINE = "baseline"  # the gate's probe of the server still running
    STOP = "stop"  # the old server stopped, its port free
    SWITCH = "switch"  # a night's ``current`` link moved to the new build
    RESTORE = "restore"  # a rollback's restore: its files, links and server brought to its plan
    START = "start"  # the new command line started
    HEALTH = "health"  # health checks until healthy, then the stability window
    GATE = "gate"  # the gate's probe of the new server
    PROBE = "probe"  # a night's probe of the new build
    AFTER_HEALTHY = "after_healthy"  # back behind the router
    CONFIRM = "confirm"  # the release claimed as confirmed, made current, the lock given back

    def __str__(self) -> str:
        return str(self.value)


ORDER = tuple(StepName)
"""The one order of steps: a program's steps follow it (some may be absent)."""


EXPECT_KEYS = {"sha256": dict, "rc": int, "gate": dict, "answered": dict}
"""What a step may expect of its answers, so that the host decides the step (not whoever
asked for it): ``sha256`` {path: digest} of a read, ``rc`` of a command, ``gate`` the rules
its probes are judged by (``gate_step``), ``answered`` a probe ({"post", "concurrency"})
of which some request must succeed."""


class ProgramStep:
    """One named step: the requests it runs, each a ``protocol.Request``, and what it
    expects of the last one's answer (``EXPECT_KEYS``); the step fails where that differs."""

    __slots__ = ("name", "requests", "expect")

    def __init__(self, name: StepName, requests: Sequence[Request], expect: Wire | None = None) -> None:
        self.name = StepName(name)
        self.requests = tuple(requests)
        self.expect = dict(expect) if expect else None

    def to_wire(self) -> Wire:
        wire: Wire = {"step": self.name.value, "requests": [r.to_wire() for r in self.requests]}
        if self.expect:
            wire["expect"] = self.expect
        return wire

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any], where: str = "") -> ProgramStep:
        if not isinstance(wire, dict):
            raise ProtocolError("%sa program step is not an object" % where)
        try:
            name = StepName(wire.get("step"))
        except ValueError:
            raise ProtocolError("%sunknown program step %r" % (where, wire.get("step"))) from None
        requests = wire.get("requests")
        if not isinstance(requests, list):
            raise ProtocolError("%sstep %r: requests is not a list" % (where, name.value))
        where = "%s%s: " % (where, name.value)
        expect = wire.get("expect")
        if expect is not None and not isinstance(expect, dict):
            raise ProtocolError("%sexpect is not an object" % where)
        for key, value in (expect or {}).items():
            kind = EXPECT_KEYS.get(key)
            if kind is None or not isinstance(value, kind) or isinstance(value, bool):
                raise ProtocolError("%sunknown or ill-typed expect %r" % (where, key))
        return cls(name, [parse_request(r, where) for r in requests], expect)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProgramStep) and (self.name, self.requests, self.expect) == (
            other.name, other.requests, other.expect)

    def __repr__(self) -> str:
        return "ProgramStep(%s, %d request(s))" % (self.name.value, len(self.requests))


class Program:
    """Every step of one release after its commit, in ``ORDER``."""

    __slots__ = ("release", "kind", "steps")

    def __init__(self, release: str, kind: str, steps: Sequence[ProgramStep]) -> None:
        self.release = release
        self.kind = kind
        self.steps = tuple(s for s in steps if s.requests)
        names = [s.name for s in self.steps]
        positions = [ORDER.index(n) for n in names]
        if positions != sorted(set(positions)):
            raise ProtocolError("program of %s: steps %s are out of order or repeated"
                                % (release, ", ".join(n.value for n in names)))

    @property
    def names(self) -> list[StepName]:
        return [s.name for s in self.steps]

    def has(self, name: StepName) -> bool:
        return name in self.names

    def through(self, done: int, name: StepName) -> list[ProgramStep]:
        """The steps after the first ``done`` up to ``name``: what one call runs. Steps the
        program does not hold are skipped, so ``name`` may be absent (then the steps
        before where it would be)."""
        limit = ORDER.index(StepName(name))
        return [s for s in self.steps[done:] if ORDER.index(s.name) <= limit]

    def to_wire(self) -> Wire:
        return {"format": FORMAT, "release": self.release, "kind": self.kind,
                "steps": [s.to_wire() for s in self.steps]}

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Program:
        if not isinstance(wire, dict):
            raise ProtocolError("a program is not an object")
        version = wire.get("format", 1)
        if version != FORMAT:
            raise ProtocolError("program.json: unknown format %r (written by a newer orch)" % (version,))
        steps = wire.get("steps")
        if not isinstance(steps, list):
            raise ProtocolError("program: steps is not a list")
        return cls(str(wire.get("release", "")), str(wire.get("kind", "")),
                   [ProgramStep.from_wire(s, "program.steps[%d] " % i) for i, s in enumerate(steps)])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Program) and (self.release, self.kind, self.steps) == (
            other.release, other.kind, other.steps)

    def __repr__(self) -> str:
        return "Program(%s %s: %s)" % (self.kind, self.release, ", ".join(n.value for n in self.names))
