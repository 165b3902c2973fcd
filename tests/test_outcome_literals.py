"""No outcome word and no exit code is written outside ``core/outcomes.py`` (issue 18 item 5).

The outcome of a run and its exit code are decided in one place; the rest
of the controller names them (``Outcome.ROLLED_BACK``, ``UNSAFE``,
``status_exit_code``…). This test reads every module of ``orchestrator/``
with ``ast`` and reports each place where an outcome word or an exit code
is written as a literal *where it is used as one*: an ``outcome=`` keyword,
an ``"outcome"`` key's value, a comparison with something named outcome,
a report built with a word or a code, a set of outcome words, a
``sys.exit(3)``, an ``exit_code`` assigned or returned. The words a host's
record ends with (``RecordedOutcome``: ``deployed``, ``done``…) count as
outcome words, and a journal step (``JournalStep``) written as a word under
``"step"`` is reported too: the helper in ``orchestrator/host/`` is scanned
like the controller. The same words in a
docstring, in a message, as a dict key of something else, or as another
vocabulary's word (a helper's error ``kind == "changed"``) are not outcomes
and are not reported.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

import orchestrator
from orchestrator.core.outcomes import ExitCode, Outcome
from orchestrator.host.records import JournalStep, RecordedOutcome

PACKAGE = Path(orchestrator.__file__).parent
WORDS = frozenset(o.value for o in Outcome) | frozenset(o.value for o in RecordedOutcome)
"""A run's outcome words and the words a release's record ends with (``deployed``, ``done``…)."""
STEP_WORDS = frozenset(s.value for s in JournalStep)
"""The journal's steps: written as ``JournalStep``, never as a word."""
CODES = frozenset(int(c) for c in ExitCode)

EXEMPT = {
    "core/outcomes.py": "the policy itself: the only place the words and codes are written",
    "cli/": "the CLI's wording (the brief leaves it the words it prints)",
    # the words the host's records say a release ended with, defined once as enums that the
    # helper and the controller write (``RecordedOutcome``, ``JournalStep``): the rest of
    # orchestrator/host/ is scanned like the controller
    "host/records.py": "the host's records and their vocabulary (JournalStep; RecordedOutcome re-exported)",
    "host/record_words.py": "RecordedOutcome: the words a release's record ends with, defined once",
    "standin/": "the stand-in inference server the tests run: not orch",
    "__init__.py": "a Ctrl-C while orch is still importing: exit 1 and its JSON report, written "
                   "without importing anything (not even core.outcomes)",
}
"""Paths under ``orchestrator/`` the scan skips, each with why."""

REPORT_CALLS = frozenset({"HostReport", "NightResult", "Verdict", "result", "ended"})
"""Calls whose positional arguments are an outcome and an exit code."""

EXIT_CALLS = frozenset({"exit", "_exit", "SystemExit", "Exit"})
"""Calls whose argument is a process's exit code (``sys.exit(3)``, ``ctx.exit(1)``)."""


@dataclass(frozen=True)
class Finding:
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.line}: {self.what}"


def _word(node: ast.AST | None, words: frozenset[str] = WORDS) -> str | None:
    """The outcome word ``node`` is or may evaluate to (``a if c else "failed"``), or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in words:
        return node.value
    if isinstance(node, ast.IfExp):
        return _word(node.body, words) or _word(node.orelse, words)
    return None


def _step(node: ast.AST | None) -> str | None:
    """The journal step ``node`` is or may evaluate to, written as a word, or None."""
    return _word(node, STEP_WORDS)


def _code(node: ast.AST | None) -> int | None:
    """The exit code ``node`` is or may evaluate to (``1 if c else 2``), or None."""
    if isinstance(node, ast.Constant) and type(node.value) is int and node.value in CODES:
        return node.value
    if isinstance(node, ast.IfExp):
        found = _code(node.body)
        return found if found is not None else _code(node.orelse)
    return None


def _named(node: ast.AST, name: str) -> bool:
    """``node`` reads something named ``name``: a variable, an attribute, ``d["name"]``, ``d.get("name")``."""
    if isinstance(node, ast.Name):
        return name in node.id.lower()
    if isinstance(node, ast.Attribute):
        return name in node.attr.lower()
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == name
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == name
    return False


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _words_in(nodes: list[ast.expr]) -> list[str]:
    return [w for w in (_word(n) for n in nodes) if w is not None]


def scan(source: str) -> list[Finding]:
    """Every outcome word and exit code written as a literal and used as one in ``source``."""
    found: list[Finding] = []

    def add(node: ast.AST, what: str) -> None:
        found.append(Finding(getattr(node, "lineno", 0), what))

    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg:
            if "outcome" in node.arg and _word(node.value):
                add(node.value, f"{node.arg}={_word(node.value)!r}")
            if node.arg in ("exit_code", "code") and _code(node.value) is not None:
                add(node.value, f"{node.arg}={_code(node.value)}")
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "outcome" and _word(value):
                    add(value, f'"outcome": {_word(value)!r}')
                if isinstance(key, ast.Constant) and key.value == "exit_code" and _code(value) is not None:
                    add(value, f'"exit_code": {_code(value)}')
                if isinstance(key, ast.Constant) and key.value == "step" and _step(value):
                    add(value, f'"step": {_step(value)!r}')
            keyed = _words_in([k for k in node.keys if k is not None])
            if len(keyed) >= 2:
                add(node, f"a dict keyed by outcome words {keyed}")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            literal = _words_in(sides) + [w for s in sides if isinstance(s, ast.Tuple | ast.List | ast.Set)
                                          for w in _words_in(s.elts)]
            if literal and any(_named(s, "outcome") for s in sides):
                add(node, f"an outcome compared with {literal}")
            steps = [w for w in (_step(s) for s in sides) if w is not None]
            if steps and any(_named(s, "step") for s in sides):
                add(node, f"a journal step compared with {steps}")
            codes = [c for c in (_code(s) for s in sides) if c is not None]
            if codes and any(_named(s, "exit_code") for s in sides):
                add(node, f"an exit code compared with {codes}")
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_named(t, "outcome") for t in targets) and _word(node.value):
                add(node, f"an outcome set to {_word(node.value)!r}")
            if any(_named(t, "exit_code") for t in targets) and _code(node.value) is not None:
                add(node, f"an exit code set to {_code(node.value)}")
            if any(_named(t, "step") for t in targets) and _step(node.value):
                add(node, f"a journal step set to {_step(node.value)!r}")
        elif isinstance(node, ast.Call):
            name = _callee(node)
            if name in REPORT_CALLS:
                for arg in node.args:
                    if _word(arg):
                        add(arg, f"{name}(…{_word(arg)!r}…)")
                    if _code(arg) is not None:
                        add(arg, f"{name}(…{_code(arg)}…)")
            if name in EXIT_CALLS and node.args and _code(node.args[0]) is not None:
                add(node, f"{name}({_code(node.args[0])})")
            if name in ("max", "min") and any(_named(a, "exit_code") for a in node.args):
                for arg in node.args:
                    if _code(arg) is not None:
                        add(arg, f"{name}(…, {_code(arg)})")
        elif isinstance(node, ast.Tuple | ast.List | ast.Set):
            listed = _words_in(node.elts)
            if len(listed) >= 2:
                add(node, f"a collection of outcome words {listed}")
        elif isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple) and node.value.elts:
            if _word(node.value.elts[0]):
                add(node, f"returns the outcome {_word(node.value.elts[0])!r}")
                for elt in node.value.elts[1:]:
                    if _code(elt) is not None:
                        add(elt, f"returns the exit code {_code(elt)}")
        elif isinstance(node, ast.FunctionDef) and "exit" in node.name:
            for inner in ast.walk(node):
                if isinstance(inner, ast.Return) and _code(inner.value) is not None:
                    add(inner, f"{node.name}() returns {_code(inner.value)}")
    return sorted(set(found), key=lambda f: (f.line, f.what))


def scanned_modules() -> list[Path]:
    """Every module of the package but the exempt ones."""
    modules = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if any(rel == key or (key.endswith("/") and rel.startswith(key)) for key in EXEMPT):
            continue
        modules.append(path)
    return modules


def test_no_outcome_word_or_exit_code_outside_the_policy() -> None:
    modules = scanned_modules()
    names = {p.relative_to(PACKAGE).as_posix() for p in modules}
    # the scan covers the modules that end runs (a wrong EXEMPT would silently skip them)
    assert {"pipeline/deploy.py", "pipeline/rollback.py", "pipeline/nightly.py", "pipeline/fleet.py",
            "pipeline/report.py", "pipeline/inspect.py", "errors.py", "demo.py",
            # the helper, which writes the host's records: it names their words by their enums
            "host/restore.py", "host/restore_records.py", "host/state.py", "host/executor.py", "host/program.py", "host/backstop.py",
            "host/nightly.py", "host/dispatch.py"} <= names
    found = {p.relative_to(PACKAGE).as_posix(): scan(p.read_text(encoding="utf-8")) for p in modules}
    written = [f"orchestrator/{name}:{f}" for name, hits in found.items() for f in hits]
    assert written == [], "outcome words or exit codes written outside core/outcomes.py " \
                          "(use Outcome / the verdicts of core.outcomes):\n" + "\n".join(written)


@pytest.mark.parametrize("line", [
    'HostReport(label, "rolled_back", 1)',
    'report = HostReport(label, outcome, code, extra={"outcome": "failed"})',
    'ops.release_update(d, rid, {"outcome": "failed" if x else "deployed"})',
    'self.result("rollback_failed", 3, reason)',
    'x = HostReport(label, outcome="rolled_back", exit_code=1)',
    'ok = report.outcome == "changed"',
    'ok = n.get("outcome") != "unchanged"',
    'ok = rollback.outcome in ("rollback_failed", "unreachable")',
    'outcome = "planned"',
    'READABLE = ("changed", "rolled_back", "failed")',
    'RETRY = frozenset({"failed", "not_started"})',
    'WORDS = {"changed": "good", "rolled_back": "switched back"}',
    'sys.exit(3)',
    'raise SystemExit(2)',
    'emit({"exit_code": 0 if ok else 1})',
    'ok = report.exit_code == 0',
    'code = max(rollback.exit_code, 2)',
    'self.exit_code = 2',
    'def f():\n    return "failed", 2',
    'class R:\n    @property\n    def exit_code(self):\n        return 3 if self.problems else 0',
    'class E(Exception):\n    exit_code = 3',
    'manifest["outcome"] = "done" if record["ok"] else "rollback_failed"',
    'ops.release_update(d, rid, {"outcome": "deployed", "finished": t})',
    'if m.outcome == "in_progress":\n    pass',
    'journal["step"] = "restore_failed" if completed else "restore_interrupted"',
    'ops.put_json(path, {"release": rid, "step": "committed"})',
    'if journal.step == "restored_by_watchdog":\n    pass',
])
def test_the_scan_finds_an_outcome_or_exit_code_written_as_a_literal(line: str) -> None:
    assert scan(line) != []


@pytest.mark.parametrize("line", [
    '"""A deploy that failed is rolled_back; one that changed nothing is unchanged."""',
    'def f():\n    """Return "failed" when it failed."""\n    return 2',
    'gate = {"inconclusive_as": x, "failed": [c.name for c in failing]}',
    'said = by_action.get("unchanged")',
    'if e.kind == "changed":\n    raise ContentChangedError(e.message)',
    'reporter.step(label, "unchanged: nothing to do")',
    'reporter.warn(label, "failed")',
    'ok = report.outcome == Outcome.CHANGED',
    'x = HostReport.ended(label, UNCHANGED, files=[])',
    'n = len(items) - 1',
    'timeout = 2',
    'return_code = proc.wait(3)',
    'e.details["step"] = 0',
    'reply = {"id": rid, "done": True, "ok": True}',
    'state = {"next": 0, "done": 0}',
])
def test_the_scan_leaves_other_strings_and_numbers_alone(line: str) -> None:
    assert scan(line) == []


def test_an_outcome_added_in_the_pipeline_fails_the_scan() -> None:
    """The scan of the real deploy module, clean today, reports a line that writes an outcome."""
    source = (PACKAGE / "pipeline" / "deploy.py").read_text(encoding="utf-8")
    assert scan(source) == []
    added = source + '\n\ndef shortcut(label):\n    return HostReport(label, outcome="rolled_back", exit_code=1)\n'
    assert [f.what for f in scan(added)] == ["exit_code=1", "outcome='rolled_back'"]
