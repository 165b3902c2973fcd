"""The helper's operations, typed on the controller's side.

Each function here builds one request for the host-side helper
(``shell/agent.py``, where ``@op("name")`` defines what it does). The
pipeline never writes a request as a dict literal: it calls these, so a
wrong op name or a misspelt argument fails in a unit test
(``tests/test_ops.py`` binds every builder's arguments to the helper
function's signature), not on a host in the middle of a deploy.

``HostSession.run(op)`` sends one op (one round trip); ``HostSession.batch(
[op, op, …])`` sends several in one round trip, run in order on the host
until the first failure. An op's ``parse`` turns the wire answer into a
typed value where the pipeline reads it field by field.

Every op also has a ``shape``: what the controller reads of its answer
(``shell.replies``). ``Op.read`` checks the answer against it before
``parse`` runs, and turns a ``parse`` that trips over the answer into
``Malformed`` too: a host that answers garbage is that host's error (one
line), never a traceback in the middle of a fleet.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import RecordFormatError
from orchestrator.host.records import HostRecords, Lock, UnknownRecordFormat
from orchestrator.host.restore_plan import RestoreRecord
from orchestrator.shell.replies import ANY, DictOf, ListOf, Malformed, Number, Opt, check

Wire = dict[str, Any]

# What the controller reads of the answers (``shell.replies``): the keys it uses, their types.
FILE = {"path": str, "real": Opt(str), "exists": bool, "mode": Opt(int), "uid": Opt(int), "gid": Opt(int),
        "sha256": Opt(str), "size": Opt(int), "data": Opt(bytes)}
PROCESS = {"pid": Opt(int), "pgid": Opt(int), "argv": Opt(ListOf(str)), "cwd": Opt(str),
           "env": Opt(DictOf(str)), "starttime": Opt(Number), "found_by": Opt(str)}
LOCK = {"acquired": bool, "holder": Opt(dict), "token": Opt(str)}
STATE = {"root": str, "exists": Opt(bool), "journal": Opt(dict), "state": {"applied": Opt(ListOf(str))},
         "lock": Opt(dict), "releases": ListOf(dict)}
RUN = {"rc": int, "stdout": str, "stderr": str}
READ_HOST = {"facts": Opt(dict), "paths": ListOf(str), "files": ListOf(FILE), "companions": DictOf(ListOf(FILE)),
             "server": Opt(PROCESS)}
HEALTH = {"elapsed": Number, "polls": int, "stable_for": Opt(Number)}


def _as_is(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Op:
    """One request: the helper op's name, its keyword arguments, and how to read its answer."""

    name: str
    args: Mapping[str, Any] = field(default_factory=dict)
    parse: Callable[[Any], Any] = field(default=_as_is, compare=False, repr=False)
    shape: Any = field(default=ANY, compare=False, repr=False)

    def wire(self) -> Wire:
        """The step as the helper's ``batch`` takes it."""
        return {"op": self.name, "args": dict(self.args)}

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


def _number_at(key: str, kind: type[int] | type[float]) -> Callable[[Any], Any]:
    """A parse that reads one number of an answer (None where it is absent or not a number)."""
    def parse(data: Any) -> int | float | None:
        value = data.get(key) if isinstance(data, dict) else None
        ok = isinstance(value, int | float) and not isinstance(value, bool) and (kind is float or isinstance(value, int))
        return kind(value) if ok else None

    return parse


def _op(name: str, parse: Callable[[Any], Any] = _as_is, shape: Any = ANY, **args: Any) -> Op:
    # Arguments left at None are not sent: the helper's own default applies.
    return Op(name, {k: v for k, v in args.items() if v is not None}, parse, shape)


def _read_all(steps: Sequence[Op], results: list[Any], where: str) -> list[Any]:
    """Each step's answer read by its own op; as many answers as steps."""
    if len(results) != len(steps):
        raise Malformed(f"{where} has {len(results)} answers for {len(steps)} steps")
    return [s.read(r, f"{where}[{i}] ({s.name})") for i, (s, r) in enumerate(zip(steps, results, strict=True))]


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
    return _op("open_state", _opened, shape={"root": str, "lock": Opt(LOCK), "state": STATE},
               state_dir=state_dir, holder=holder)


def state_read(state_dir: str) -> Op:
    """Everything history/status/rollback need; creates nothing (parsed: ``HostRecords``)."""
    return _op("state_read", HostRecords.from_wire, shape=STATE, state_dir=state_dir)


def lock_acquire(state_dir: str, holder: Wire, replace_token: str | None = None) -> Op:
    return _op("lock_acquire", _lock_answer, shape=LOCK, state_dir=state_dir, holder=holder, replace_token=replace_token)


def lock_release(state_dir: str) -> Op:
    return _op("lock_release", state_dir=state_dir)


def get_json(path: str) -> Op:
    return _op("get_json", shape=Opt(dict), path=path)  # every record orch reads back is an object


def put_json(path: str, value: Any) -> Op:
    return Op("put_json", {"path": path, "value": value})


def mark(path: str) -> Op:
    """An empty marker file (creating one needs no data blocks on a full disk)."""
    return _op("mark", path=path)


# ---------------------------------------------------------------- files


def read_host(paths: Sequence[str], *, packages: Sequence[str] = (), python: str | None = None,
              pidfile: str | None = None, port: int | None = None,
              follow: Sequence[Wire] | None = None) -> Op:
    """Facts (installed packages, for the server's interpreter), then the files (their
    paths may hold fact markers), then the modules an ``add_flag`` follows."""
    return _op("read_host", shape=READ_HOST, paths=list(paths), packages=list(packages), python=python, pidfile=pidfile,
               port=port, follow=list(follow) if follow is not None else None)


def read(paths: Sequence[str], *, with_data: bool = True) -> Op:
    return _op("read", shape=ListOf(FILE), paths=list(paths), with_data=with_data)


def sha256(paths: Sequence[str]) -> Op:
    return _op("sha256", shape=DictOf(Opt(str)), paths=list(paths))


def stage(files: Sequence[Wire], token: str, *, clean_stale: bool = False) -> Op:
    """``files``: ``{"path", "data" (bytes: sent as blob lines)}``; staged beside the real file."""
    return _op("stage", shape=ListOf({"staged": str}), files=list(files), token=token, clean_stale=clean_stale)


def validate(checks: Sequence[Wire], token: str, *, keep_staged: bool = True) -> Op:
    """``checks``: ``{"target", "argvs", "python"}``; run on the staged copies of ``token``
    (removed afterwards unless ``keep_staged``)."""
    return _op("validate", shape=ListOf({**RUN, "target": str, "argv": ListOf(str)}), checks=list(checks),
               token=token, keep_staged=keep_staged)


def remove(paths: Sequence[str]) -> Op:
    return _op("remove", paths=list(paths))


def commit(files: Sequence[Wire], release_dir: str | None) -> Op:
    """``files``: ``{"path", "staged", "before", "after"}``; compare-and-swap on ``before``."""
    return _op("commit", files=list(files), release_dir=release_dir)


# ---------------------------------------------------------------- releases and restores


def release_create(state_dir: str, release_id: str, manifest: Wire, files: Sequence[Wire],
                   restore: Wire | None = None) -> Op:
    """Back up into a new release; the host adds its next ``seq`` to the manifest and
    answers ``{"root", "seq"}``: read as the ``seq`` (None from a helper that kept none)."""
    return _op("release_create", _number_at("seq", int), state_dir=state_dir, release_id=release_id, manifest=manifest,
               files=list(files), restore=restore)


def release_update(state_dir: str, release_id: str, fields: Wire) -> Op:
    return _op("release_update", state_dir=state_dir, release_id=release_id, fields=fields)


def release_prune(state_dir: str, remove: Sequence[str]) -> Op:
    return _op("release_prune", state_dir=state_dir, remove=list(remove))


def release_log(state_dir: str, release_id: str, text: str) -> Op:
    return _op("release_log", state_dir=state_dir, release_id=release_id, text=text)


def release_arm(state_dir: str, release_dir: str) -> Op:
    """Start the release's watchdog (its restore plan is already on disk); answers with
    ``fires_at``, the host's wall time at which it acts unless confirmed (host clock): read
    as that time (None if the helper did not say)."""
    return _op("release_arm", _number_at("fires_at", float), state_dir=state_dir, release_dir=release_dir)


def restore_release(release_dir: str, by: str, *, within: float | None = None, reason: str | None = None,
                    until: float | None = None) -> Op:
    """Run the release's restore plan; answers with the record of what was done.

    ``within``: seconds (counted on the host) after which the watchdog backs
    this restore up; ``until`` is the older absolute form, kept for callers
    that have one.
    """
    return _op("restore_release", RestoreRecord.from_wire, dict, release_dir=release_dir, by=by, until=until,
               reason=reason, within=within)


@dataclass(frozen=True)
class ConfirmAnswer:
    confirmed: bool
    restored: RestoreRecord | None
    claimed_by: str | None
    results: list[Any] = field(default_factory=list)  # once confirmed: each step's answer, parsed


def confirm_release(release_dir: str, steps: Sequence[Op]) -> Op:
    """Claim the release as confirmed and run ``steps`` — unless a restore got there first."""
    def parse(data: Wire) -> ConfirmAnswer:
        restored = data.get("restored")
        results = data.get("results") or []
        return ConfirmAnswer(
            bool(data.get("confirmed")),
            RestoreRecord.from_wire(restored) if restored else None,
            (data.get("claim") or {}).get("by"),
            _read_all(steps, results, "result.results") if results else [],
        )

    shape = {"confirmed": Opt(bool), "restored": Opt(dict), "claim": Opt({"by": Opt(str)}), "results": Opt(list)}
    return _op("confirm_release", parse, shape, release_dir=release_dir, steps=[s.wire() for s in steps])


# ---------------------------------------------------------------- servers


def server_find(pidfile: str | None, port: int | None) -> Op:
    return _op("server_find", shape=Opt(PROCESS), pidfile=pidfile, port=port)


def process(pid: int) -> Op:
    return _op("process", shape=Opt(PROCESS), pid=pid)


def server_stop(pid: int, pgid: int | None, stop_timeout: float, port: int | None, free_timeout: float) -> Op:
    return _op("server_stop", pid=pid, pgid=pgid, stop_timeout=stop_timeout, port=port,
               free_timeout=free_timeout)


def server_start(argv: Sequence[str], cwd: str | None, env: Mapping[str, str] | None, log: str | None,
                 pidfile: str | None, replace_env: bool) -> Op:
    return _op("server_start", argv=list(argv), cwd=cwd, env=dict(env or {}), log=log, pidfile=pidfile,
               replace_env=replace_env)


def run(argv: Sequence[str], *, timeout: float = 600.0, cwd: str | None = None) -> Op:
    """A command whose exit code is data (``{"rc", "stdout", "stderr"}``)."""
    return _op("run", shape=RUN, argv=list(argv), timeout=timeout, cwd=cwd)


def run_ok(argv: Sequence[str], *, timeout: float = 600.0) -> Op:
    """A user's server command that must succeed (``commands`` manager)."""
    return _op("run_ok", argv=list(argv), timeout=timeout)


def commands_start(start: Sequence[str], pid_cmd: Sequence[str] | None) -> Op:
    return _op("commands_start", start=list(start), pid_cmd=list(pid_cmd) if pid_cmd else None)


def preflight(argv: Sequence[str], *, cwd: str | None, env: Mapping[str, str] | None, replace_env: bool,
              timeout: float) -> Op:
    """The server's own argument parser on the new command line; nothing is started."""
    from orchestrator.core.preflight import PreflightResult

    return _op("preflight", PreflightResult.from_wire, dict, argv=list(argv), cwd=cwd, env=dict(env or {}),
               replace_env=replace_env, timeout=timeout)


def health_wait(health: Wire, *, pid: int | str | None = None, log: str | None = None) -> Op:
    """Poll ``health`` (``base_url``, ``checks``, ``timeout``, ``interval``, ``stable_for``);
    ``pid="started"`` watches the server started earlier in the same batch."""
    return _op("health_wait", shape=HEALTH, pid=pid, log=log, **health)


def batch(steps: Sequence[Op]) -> Op:
    """Several ops in one round trip; each answer read by its own op's ``parse``."""
    def parse(results: list[Any]) -> list[Any]:
        return _read_all(steps, results, "result")

    return Op("batch", {"steps": [s.wire() for s in steps]}, parse, list)


# ---------------------------------------------------------------- nightly builds, the probe


@dataclass(frozen=True)
class Builds:
    """A host's ``builds_dir``: its builds, oldest first, and where ``current`` points."""

    builds_dir: str
    current: str | None
    builds: list[str]
    complete: list[str] | None = None  # confirmed builds (None: an older helper did not say)
    seqs: dict[str, int] = field(default_factory=dict)  # each build's ``seq``, where its manifest has one


def _builds(data: Wire) -> Builds:
    complete = data.get("complete")
    return Builds(data["builds_dir"], data.get("current"), list(data.get("builds") or []),
                  list(complete) if complete is not None else None, dict(data.get("seqs") or {}))


@dataclass(frozen=True)
class PreparedBuild:
    """A new build's place, made ready while the old build serves."""

    builds_dir: str
    build_dir: str
    current: str | None
    builds: list[str]
    log: str
    complete: list[str] | None = None  # confirmed builds (None: an older helper did not say)
    seqs: dict[str, int] = field(default_factory=dict)  # each build's ``seq``, where its manifest has one


def _prepared(data: Wire) -> PreparedBuild:
    complete = data.get("complete")
    return PreparedBuild(data["builds_dir"], data["build_dir"], data.get("current"),
                         list(data.get("builds") or []), data["log"],
                         list(complete) if complete is not None else None, dict(data.get("seqs") or {}))


def nightly_prepare(builds_dir: str, build: str) -> Op:
    """Make ``builds_dir`` and its ``logs/``; the new build's dir must not exist yet."""
    return _op("nightly_prepare", _prepared, dict, builds_dir=builds_dir, build=build)


def nightly_builds(builds_dir: str) -> Op:
    """The builds and the ``current`` link; reads only."""
    return _op("nightly_builds", _builds, dict, builds_dir=builds_dir)


def nightly_fetch_git(repo: str, commit: str, builds_dir: str, build: str, log: str) -> Op:
    """A mirror cache on the host, then exactly ``commit`` checked out into the build."""
    return _op("nightly_fetch_git", repo=repo, commit=commit, builds_dir=builds_dir, build=build, log=log)


def nightly_pip(builds_dir: str, build: str, requirements: str, python: str, pip_args: Sequence[str],
                log: str) -> Op:
    """A fresh venv in the build and ``pip install --require-hashes`` of ``requirements`` (its text)."""
    return _op("nightly_pip", builds_dir=builds_dir, build=build, requirements=requirements, python=python,
               pip_args=list(pip_args), log=log)


def nightly_run(argv: Sequence[str], cwd: str, log: str) -> Op:
    """One ``install`` command in the build, its output streamed and logged."""
    return _op("nightly_run", argv=list(argv), cwd=cwd, log=log)


def nightly_remove_build(builds_dir: str, build: str) -> Op:
    """Remove a half-built build (never the one ``current`` points to)."""
    return _op("nightly_remove_build", builds_dir=builds_dir, build=build)


def nightly_prune(builds_dir: str, remove: Sequence[str]) -> Op:
    """Remove old builds and their logs (never the one ``current`` points to)."""
    return _op("nightly_prune", builds_dir=builds_dir, remove=list(remove))


def nightly_link_swap(link: str, to: str | None, expect: str | None) -> Op:
    """Point ``link`` at ``to`` only if it points at ``expect`` now (None: no link)."""
    return Op("nightly_link_swap", {"link": link, "to": to, "expect": expect})  # None is meant here



# ---------------------------------------------------------------- the probe (performance gate, nightly)


def probe_http(base_url: str, path: str, body: Any, *, requests: int, concurrency: int, timeout: float,
               headers: Mapping[str, str] | None = None, warmup: int = 0,
               greedy_body: Wire | None = None) -> Op:
    """One round of a probe: ``warmup`` requests not counted, the greedy request alone
    (``greedy_body``, whose whole answer comes back), then ``requests`` POSTs of ``body``
    at ``concurrency``; answers the raw samples (``core.probe.round_from_wire`` sums them up)."""
    return Op("probe_http", {"base_url": base_url, "path": path, "body": body, "requests": requests,
                             "concurrency": concurrency, "timeout": timeout, "headers": dict(headers or {}),
                             "warmup": warmup, "greedy_body": greedy_body}, _as_is, dict)
