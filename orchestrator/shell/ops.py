"""The helper's operations, typed on the controller's side.

Each function here builds one request for the host-side helper from its
type in ``orchestrator.host.protocol`` (the one definition of every request,
shared with the helper, which refuses an unknown op or field in one line).
The pipeline never writes a request as a dict literal: it calls these, so a
wrong op name or a misspelt argument fails in a unit test
(``tests/test_protocol.py`` holds every request type to the helper
function's signature), not on a host in the middle of a deploy.

``HostSession.run(op)`` sends one op (one round trip); ``HostSession.batch(
[op, op, …])`` sends several in one round trip, run in order on the host
until the first failure, and answers ``BatchResults``: each answer read by
the ``Op`` that asked for it (``results[op]``), never by its position. An
op's ``parse`` turns the wire answer into a typed value where the pipeline
reads it field by field.

Every op also has a ``shape``: what the controller reads of its answer
(``shell.replies``). ``Op.read`` checks the answer against it before
``parse`` runs, and turns a ``parse`` that trips over the answer into
``Malformed`` too: a host that answers garbage is that host's error (one
line), never a traceback in the middle of a fleet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import RecordFormatError
from orchestrator.host import protocol as p
from orchestrator.host.protocol_replies import Builds, ConfirmReply, PreparedBuild
from orchestrator.host.records import HostRecords, Lock, UnknownRecordFormat
from orchestrator.host.restore_plan import RestoreRecord
from orchestrator.shell.replies import ANY, DictOf, ListOf, Malformed, Number, Opt, check

Wire = dict[str, Any]

# What the controller reads of the answers (``shell.replies``): the keys it uses, their types.
FILE = {"path": str, "real": Opt(str), "exists": bool, "mode": Opt(int), "uid": Opt(int), "gid": Opt(int),
        "sha256": Opt(str), "size": Opt(int), "data": Opt(bytes)}
PROCESS = {"pid": Opt(int), "pgid": Opt(int), "argv": Opt(ListOf(str)), "cwd": Opt(str),
           "env": Opt(DictOf(str)), "starttime": Opt(Number), "found_by": Opt(str),
           "started_at": Opt(Number)}
LOCK = {"acquired": bool, "holder": Opt(dict), "token": Opt(str)}
STATE = {"root": str, "exists": Opt(bool), "journal": Opt(dict), "state": {"applied": Opt(ListOf(str))},
         "lock": Opt(dict), "releases": ListOf(dict)}
RUN = {"rc": int, "stdout": str, "stderr": str}
READ_HOST = {"facts": Opt(dict), "paths": ListOf(str), "files": ListOf(FILE), "companions": DictOf(ListOf(FILE)),
             "server": Opt(PROCESS)}
HEALTH = {"elapsed": Number, "polls": int, "stable_for": Opt(Number)}


def _as_is(value: Any) -> Any:
    return value


@dataclass(frozen=True, eq=False)
class Op:
    """One request (its type from ``host.protocol``) and how to read its answer.

    Compared and hashed by identity: the ``Op`` a batch was built with is the
    key its answer is read by (``BatchResults``).
    """

    request: p.Request
    parse: Callable[[Any], Any] = field(default=_as_is, repr=False)
    shape: Any = field(default=ANY, repr=False)

    @property
    def name(self) -> str:
        """The helper op this runs."""
        return self.request.OP

    @property
    def args(self) -> Wire:
        """The arguments as sent (optional ones left at None are not: the helper's default applies)."""
        args: Wire = self.request.to_wire()["args"]
        return args

    def wire(self) -> Wire:
        """The step as the helper's ``batch`` takes it."""
        return self.request.to_wire()

    def read(self, answer: Any, where: str = "result") -> Any:
        """The answer checked against ``shape``, then parsed; ``Malformed`` if it is not usable."""
        check(answer, self.shape, where)
        try:
            return self.parse(answer)
        except Malformed:
            raise
        except UnknownRecordFormat as e:  # a newer orch's record: refused by name, never misread
            raise RecordFormatError(str(e)) from None
        except (TypeError, KeyError, ValueError, AttributeError, IndexError) as e:
            raise Malformed(f"{where} cannot be read ({type(e).__name__}: {e})") from None


class BatchResults:
    """The answers of a batch, each read by the ``Op`` that asked for it.

    Indexing by position tied the pipeline to the order it built a batch in
    (``results[2]``, ``baseline_at``): a step added in front silently read the
    wrong answer. An ``Op`` not in the batch is a ``KeyError`` naming it.
    Iterating gives the answers in order (``a, b = session.batch([a_op, b_op])``).
    """

    def __init__(self, steps: Sequence[Op], answers: Sequence[Any]) -> None:
        self._steps = list(steps)
        self._answers = list(answers)

    def _index(self, step: Op) -> int:
        for i, s in enumerate(self._steps):
            if s is step:
                return i
        raise KeyError(f"{step.name} is not a step of this batch")

    def __getitem__(self, step: Op) -> Any:
        if not isinstance(step, Op):
            raise TypeError(f"a batch's answers are read by their Op, not by {type(step).__name__}")
        i = self._index(step)
        if i >= len(self._answers):
            raise KeyError(f"{step.name} has no answer (the batch stopped before it)")
        return self._answers[i]

    def each(self, steps: Sequence[Op]) -> list[Any]:
        """The answers of ``steps`` (a part of the batch), in their order."""
        return [self[s] for s in steps]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._answers)

    def __len__(self) -> int:
        return len(self._answers)

    def __bool__(self) -> bool:
        return bool(self._answers)


def _number_at(key: str, kind: type[int] | type[float]) -> Callable[[Any], Any]:
    """A parse that reads one number of an answer (None where it is absent or not a number)."""
    def parse(data: Any) -> int | float | None:
        value = data.get(key) if isinstance(data, dict) else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if kind is int and not isinstance(value, int):
            return None
        return kind(value)

    return parse

def _op(request: p.Request, parse: Callable[[Any], Any] = _as_is, shape: Any = ANY) -> Op:
    return Op(request, parse, shape)


def _read_all(steps: Sequence[Op], results: list[Any], where: str) -> BatchResults:
    """Each step's answer read by its own op; as many answers as steps."""
    if len(results) != len(steps):
        raise Malformed(f"{where} has {len(results)} answers for {len(steps)} steps")
    return BatchResults(steps, [s.read(r, f"{where}[{i}] ({s.name})")
                                for i, (s, r) in enumerate(zip(steps, results, strict=True))])


# ---------------------------------------------------------------- state, lock, records


@dataclass(frozen=True)
class LockAnswer:
    """``lock_acquire``'s answer: taken (with this run's token), or refused naming the holder."""

    acquired: bool
    token: str | None = None
    holder: Lock | None = None


def _lock_answer(data: Wire) -> LockAnswer:
    return LockAnswer(bool(data["acquired"]), data.get("token"), Lock.from_wire(data.get("holder")))


@dataclass(frozen=True)
class OpenedState:
    """``open_state``'s answer: the state dir, the lock (if one was asked for), the records."""

    root: str
    lock: LockAnswer | None
    state: HostRecords


def _opened(data: Wire) -> OpenedState:
    lock = data.get("lock")
    return OpenedState(str(data["root"]), _lock_answer(lock) if lock is not None else None,
                       HostRecords.from_wire(data["state"]))


def open_state(state_dir: str, holder: Wire | None = None) -> Op:
    """Create the state dir, take the lock (``holder``), read the records: one round trip."""
    return _op(p.OpenState(state_dir, holder), _opened, shape={"root": str, "lock": Opt(LOCK), "state": STATE})


def state_read(state_dir: str) -> Op:
    """Everything history/status/rollback need; creates nothing (parsed: ``HostRecords``)."""
    return _op(p.StateRead(state_dir), HostRecords.from_wire, shape=STATE)


def lock_acquire(state_dir: str, holder: Wire, replace_token: str | None = None) -> Op:
    return _op(p.LockAcquire(state_dir, holder, replace_token), _lock_answer, shape=LOCK)


def lock_release(state_dir: str) -> Op:
    return _op(p.LockRelease(state_dir))


def get_json(path: str) -> Op:
    return _op(p.GetJson(path), shape=Opt(dict))  # every record orch reads back is an object


def put_json(path: str, value: Any, *, best_effort: bool = False) -> Op:
    """``value`` written to ``path``; ``best_effort``: a full disk answers False, not an error."""
    return _op(p.PutJson(path, value, best_effort or None))  # a None ``value`` is sent: it is required


def mark(path: str) -> Op:
    """An empty marker file (creating one needs no data blocks on a full disk)."""
    return _op(p.Mark(path))


# ---------------------------------------------------------------- files


def read_host(paths: Sequence[str], *, packages: Sequence[str] = (), python: str | None = None,
              pidfile: str | None = None, port: int | None = None,
              follow: Sequence[Wire] | None = None) -> Op:
    """Facts (installed packages, for the server's interpreter), then the files (their
    paths may hold fact markers), then the modules an ``add_flag`` follows."""
    return _op(p.ReadHost(list(paths), packages=list(packages), python=python, pidfile=pidfile, port=port,
                          follow=list(follow) if follow is not None else None), shape=READ_HOST)


def read(paths: Sequence[str], *, with_data: bool = True) -> Op:
    return _op(p.Read(list(paths), with_data=with_data), shape=ListOf(FILE))


def sha256(paths: Sequence[str]) -> Op:
    return _op(p.Sha256(list(paths)), shape=DictOf(Opt(str)))


def stage(files: Sequence[Wire], token: str, *, clean_stale: bool = False) -> Op:
    """``files``: ``{"path", "data" (bytes: sent as blob lines)}``; staged beside the real file."""
    return _op(p.Stage(list(files), token, clean_stale=clean_stale), shape=ListOf({"staged": str}))


def validate(checks: Sequence[Wire], token: str, *, keep_staged: bool = True) -> Op:
    """``checks``: ``{"target", "argvs", "python"}``; run on the staged copies of ``token``
    (removed afterwards unless ``keep_staged``)."""
    return _op(p.Validate(list(checks), token, keep_staged=keep_staged),
               shape=ListOf({**RUN, "target": str, "argv": ListOf(str)}))


def remove(paths: Sequence[str]) -> Op:
    return _op(p.Remove(list(paths)))


def commit(files: Sequence[Wire], release_dir: str | None) -> Op:
    """``files``: ``{"path", "staged", "before", "after"}``; compare-and-swap on ``before``."""
    return _op(p.Commit(list(files), release_dir))


# ---------------------------------------------------------------- releases and restores


def release_create(state_dir: str, release_id: str, manifest: Wire, files: Sequence[Wire],
                   restore: Wire | None = None) -> Op:
    """Back up into a new release; the host adds its next ``seq`` to the manifest and
    answers ``{"root", "seq"}``: read as the ``seq`` (None from a helper that kept none)."""
    return _op(p.ReleaseCreate(state_dir, release_id, manifest, list(files), restore), _number_at("seq", int))


def release_update(state_dir: str, release_id: str, fields: Wire) -> Op:
    return _op(p.ReleaseUpdate(state_dir, release_id, fields))


def release_prune(state_dir: str, remove: Sequence[str], keep: int | None = None) -> Op:
    """Remove ``remove``; ``keep`` (the ``keep_releases`` that chose them) goes in the host's
    ``pruned.json`` with the count, for ``history``."""
    return _op(p.ReleasePrune(state_dir, list(remove), keep))


def release_log(state_dir: str, release_id: str, text: str) -> Op:
    return _op(p.ReleaseLog(state_dir, release_id, text))


def release_arm(state_dir: str, release_dir: str) -> Op:
    """Start the release's watchdog (its restore plan is already on disk); answers with
    ``fires_at``, the host's wall time at which it acts unless confirmed (host clock): read
    as that time (None if the helper did not say)."""
    return _op(p.ReleaseArm(state_dir, release_dir), _number_at("fires_at", float))


def restore_release(release_dir: str, by: str, *, within: float | None = None, reason: str | None = None,
                    until: float | None = None) -> Op:
    """Run the release's restore plan; answers with the record of what was done.

    ``within``: seconds (counted on the host) after which the watchdog backs
    this restore up; ``until`` is the older absolute form, kept for callers
    that have one.
    """
    return _op(p.RestoreRelease(release_dir, by, until=until, reason=reason, within=within),
               RestoreRecord.from_wire, dict)


@dataclass(frozen=True)
class ConfirmAnswer:
    confirmed: bool
    restored: RestoreRecord | None
    claimed_by: str | None
    results: BatchResults = field(default_factory=lambda: BatchResults([], []))  # once confirmed: by step


def confirm_release(release_dir: str, steps: Sequence[Op]) -> Op:
    """Claim the release as confirmed and run ``steps`` — unless a restore got there first."""
    def parse(data: Wire) -> ConfirmAnswer:
        reply = ConfirmReply.from_wire(data)
        results = reply.results or []
        return ConfirmAnswer(
            bool(reply.confirmed),
            RestoreRecord.from_wire(reply.restored) if reply.restored else None,
            (reply.claim or {}).get("by"),
            _read_all(steps, results, "result.results") if results else BatchResults(steps, []),
        )

    shape = {"confirmed": Opt(bool), "restored": Opt(dict), "claim": Opt({"by": Opt(str)}), "results": Opt(list)}
    return _op(p.ConfirmRelease(release_dir, [s.wire() for s in steps]), parse, shape)


# ---------------------------------------------------------------- servers


def server_find(pidfile: str | None, port: int | None) -> Op:
    return _op(p.ServerFind(pidfile, port), shape=Opt(PROCESS))


def process(pid: int) -> Op:
    return _op(p.Process(pid), shape=Opt(PROCESS))


def server_stop(pid: int, pgid: int | None, stop_timeout: float, port: int | None, free_timeout: float) -> Op:
    return _op(p.ServerStop(pid, pgid, stop_timeout, port, free_timeout))


def server_start(argv: Sequence[str], cwd: str | None, env: Mapping[str, str] | None, log: str | None,
                 pidfile: str | None, replace_env: bool) -> Op:
    return _op(p.ServerStart(list(argv), cwd, dict(env or {}), log, pidfile, replace_env))


def run(argv: Sequence[str], *, timeout: float = 600.0, cwd: str | None = None) -> Op:
    """A command whose exit code is data (``{"rc", "stdout", "stderr"}``)."""
    return _op(p.Run(list(argv), cwd=cwd, timeout=timeout), shape=RUN)


def run_ok(argv: Sequence[str], *, timeout: float = 600.0) -> Op:
    """A user's server command that must succeed (``commands`` manager)."""
    return _op(p.RunOk(list(argv), timeout=timeout))


def commands_start(start: Sequence[str], pid_cmd: Sequence[str] | None) -> Op:
    return _op(p.CommandsStart(list(start), list(pid_cmd) if pid_cmd else None))


def preflight(argv: Sequence[str], *, cwd: str | None, env: Mapping[str, str] | None, replace_env: bool,
              timeout: float, staged: Sequence[str] | None = None) -> Op:
    """The server's own argument parser on the new command line; nothing is started.
    ``staged`` (``--check``): the staged copies it reads, checked to be orch's before and after."""
    from orchestrator.core.preflight import PreflightResult

    return _op(p.Preflight(list(argv), cwd=cwd, env=dict(env or {}), replace_env=replace_env, timeout=timeout,
                           staged=list(staged) if staged else None),
               PreflightResult.from_wire, dict)


def health_wait(health: Wire, *, pid: int | str | None = None, log: str | None = None) -> Op:
    """Poll ``health`` (``base_url``, ``checks``, ``timeout``, ``interval``, ``stable_for``);
    ``pid="started"`` watches the server started earlier in the same batch."""
    return _op(p.HealthWait(pid=pid, log=log, **health), shape=HEALTH)


def batch(steps: Sequence[Op]) -> Op:
    """Several ops in one round trip; each answer read by its own op's ``parse``, kept by its op."""
    def parse(results: list[Any]) -> BatchResults:
        return _read_all(steps, results, "result")

    return _op(p.Batch([s.wire() for s in steps]), parse, list)


# ---------------------------------------------------------------- nightly builds, the probe

def nightly_prepare(builds_dir: str, build: str) -> Op:
    """Make ``builds_dir`` and its ``logs/``; the new build's dir must not exist yet."""
    return _op(p.NightlyPrepare(builds_dir, build), PreparedBuild.from_wire, dict)


def nightly_builds(builds_dir: str) -> Op:
    """The builds and the ``current`` link; reads only."""
    return _op(p.NightlyBuilds(builds_dir), Builds.from_wire, dict)


def nightly_fetch_git(repo: str, commit: str, builds_dir: str, build: str, log: str) -> Op:
    """A mirror cache on the host, then exactly ``commit`` checked out into the build."""
    return _op(p.NightlyFetchGit(repo, commit, builds_dir, build, log))


def nightly_pip(builds_dir: str, build: str, requirements: str, python: str, pip_args: Sequence[str],
                log: str) -> Op:
    """A fresh venv in the build and ``pip install --require-hashes`` of ``requirements`` (its text)."""
    return _op(p.NightlyPip(builds_dir, build, requirements, python, list(pip_args), log))


def nightly_run(argv: Sequence[str], cwd: str, log: str) -> Op:
    """One ``install`` command in the build, its output streamed and logged."""
    return _op(p.NightlyRun(list(argv), cwd, log=log))


def nightly_remove_build(builds_dir: str, build: str) -> Op:
    """Remove a half-built build (never the one ``current`` points to)."""
    return _op(p.NightlyRemoveBuild(builds_dir, build))


def nightly_prune(builds_dir: str, remove: Sequence[str]) -> Op:
    """Remove old builds and their logs (never the one ``current`` points to)."""
    return _op(p.NightlyPrune(builds_dir, list(remove)))


def nightly_link_swap(link: str, to: str | None, expect: str | None) -> Op:
    """Point ``link`` at ``to`` only if it points at ``expect`` now (None: no link; sent as such)."""
    return _op(p.NightlyLinkSwap(link, to, expect))


# ---------------------------------------------------------------- the probe (performance gate, nightly)


def probe_http(base_url: str, path: str, body: Any, *, requests: int, concurrency: int, timeout: float,
               headers: Mapping[str, str] | None = None, warmup: int = 0,
               greedy_body: Wire | None = None) -> Op:
    """One round of a probe: ``warmup`` requests not counted, the greedy request alone
    (``greedy_body``, whose whole answer comes back), then ``requests`` POSTs of ``body``
    at ``concurrency``; answers the raw samples (``core.probe.round_from_wire`` sums them up)."""
    return _op(p.ProbeHttp(base_url, path, body, requests, concurrency, timeout, headers=dict(headers or {}),
                           warmup=warmup, greedy_body=greedy_body), _as_is, dict)
