"""Facts, files and imports; pre-flight (helper side of core.facts, core.flags
and core.preflight; controller side: pipeline.plan's read and the deploy's
pre-flight, through shell/ops.py)."""

import json
import os
import re
import subprocess

from .files import file_info
from .processes import op_server_find, run_argv
from .wire import AgentError, expand

FACTS_SCRIPT = (
    "import importlib.util, json, os, sys\n"
    "try:\n"
    "    from importlib import metadata\n"
    "except ImportError:\n"
    "    metadata = None\n"
    "out = {'python': sys.executable, 'python_version': '%d.%d.%d' % sys.version_info[:3], 'packages': {}}\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        spec = importlib.util.find_spec(name)\n"
    "    except Exception:\n"
    "        spec = None\n"
    "    if spec is None:\n"
    "        continue\n"
    "    places = list(spec.submodule_search_locations or [])\n"
    "    path = places[0] if places else (os.path.dirname(spec.origin) if spec.origin else None)\n"
    "    version = None\n"
    "    if metadata is not None:\n"
    "        try:\n"
    "            version = metadata.version(name)\n"
    "        except Exception:\n"
    "            version = None\n"
    "    out['packages'][name] = {'path': path, 'version': version}\n"
    "print(json.dumps(out))\n"
)


FACT_MARKER = re.compile("\x00orch-fact:([^\x00]*)\x00")


FOLLOW_MAX_BYTES = 4 * 1024 * 1024


PYTHON_NAME = re.compile(r"^(python|pypy)[0-9.]*$")


def server_python(record):
    """The interpreter a running server was started with (its argv[0], if that is a Python)."""
    if not record or not record.get("argv"):
        return None
    first = record["argv"][0]
    if not PYTHON_NAME.match(os.path.basename(first)):
        return None
    if "/" in first and not os.path.isabs(first):
        first = os.path.join(record.get("cwd") or "/", first)
    return first


def gather_facts(python, packages, env, timeout):
    """What ``python`` (the server's interpreter) imports as each package: its directory and version."""
    res = run_argv([python, "-c", FACTS_SCRIPT] + list(packages), env=env, timeout=timeout)
    if res["rc"] != 0:
        last = (res["stderr"] or res["stdout"]).strip().splitlines()
        return {"python": python, "packages": {}, "error": last[-1] if last else "exit %d" % res["rc"]}
    try:
        facts = json.loads(res["stdout"].strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"python": python, "packages": {}, "error": "no facts in its output"}
    return facts


def fill_facts(path, facts):
    """Replace each fact marker in a path with the fact (a deferred ``{{ sglang_root }}``)."""

    def value(match):
        node = facts
        for part in match.group(1).split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node if isinstance(node, str) else ""

    return FACT_MARKER.sub(value, path)


FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+[.\w]", re.M)


FROM_AFTER_SEMICOLON = re.compile(r";[ \t]*from[ \t]+[.\w]")  # "import os; from x import y"


INDENT = re.compile(r"[ \t]*")


IMPORT_WORD = re.compile(r"[\s.]import\b")


IMPORT_PAREN_TRIES = 20  # bounds the work a line of prose like "from (a) ..." can cause


IMPORT_MAX_CHARS = 16384


def import_froms(text):
    """The ``from ... import ...`` statements of ``text``, outer ones first.

    A regex finds the lines that can start one and ``ast`` parses each, with
    its backslash-continued and parenthesised rest: parsing the whole module
    and walking every node of it was most of the helper's CPU in a no-op
    (11 ms for a 3,900-line ``server_args.py``, on every host of a fleet).
    A line inside a string that looks like an import is parsed too; that can
    only add a module that exists, which is then looked at, never hide one.
    Text that would make this parse more than a few times its size (prose
    full of "from x import (") gets the whole-module parse instead.
    """
    import ast

    found = []
    budget = 4 * len(text) + IMPORT_MAX_CHARS
    starts = {m.start() for m in FROM_IMPORT.finditer(text)}
    starts.update(text.rfind("\n", 0, m.start()) + 1 for m in FROM_AFTER_SEMICOLON.finditer(text))
    for start in sorted(starts):
        indent = INDENT.match(text, start).end() - start
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        while text[start:end].rstrip().endswith("\\") and end < len(text):
            after = text.find("\n", end + 1)
            end = len(text) if after < 0 else after
        if not IMPORT_WORD.search(text, start, end):
            continue  # prose that starts with "from"
        tree = None
        for _ in range(IMPORT_PAREN_TRIES):
            budget -= end - start
            if budget < 0:
                return [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ImportFrom)]
            try:
                tree = ast.parse(text[start:end].strip())
                break
            except (SyntaxError, ValueError):
                # a parenthesised list goes on to a later ")" (a comment may hold one first)
                close = text.find(")", end) if "(" in text[start:end] else -1
                if close < 0 or close - start > IMPORT_MAX_CHARS:
                    break
                end = close + 1
        if tree is None:
            continue
        # outer statements first, as a walk of the whole tree would meet them
        found.extend((indent, start, node) for node in tree.body if isinstance(node, ast.ImportFrom))
    return [node for _, _, node in sorted(found, key=lambda item: item[:2])]


def imported_modules(path, text):
    """Files of the same package that ``path`` imports (``from pkg.a.b import c``; relative too)."""
    try:
        nodes = import_froms(text)
    except (SyntaxError, ValueError):  # the whole-module parse, for a text that does not parse
        return []
    parts = os.path.abspath(path).split(os.sep)
    out = []
    for node in nodes:
        if node.level:
            base = os.path.dirname(os.path.abspath(path))
            for _ in range(node.level - 1):
                base = os.path.dirname(base)
            module_dir = os.path.join(base, *(node.module or "").split(".")) if node.module else base
        else:
            if not node.module:
                continue
            names = node.module.split(".")
            tops = [i for i, part in enumerate(parts[:-1]) if part == names[0]]
            if not tops:
                continue
            root = os.sep.join(parts[: tops[-1]]) or os.sep
            module_dir = os.path.join(root, *names)
        candidates = [module_dir + ".py", os.path.join(module_dir, "__init__.py")]
        candidates += [os.path.join(module_dir, alias.name + ".py") for alias in node.names]
        for candidate in candidates:
            if os.path.isfile(candidate) and candidate not in out and candidate != os.path.abspath(path):
                out.append(candidate)
    return out


def follow_imports(path, names):
    """The modules ``path`` imports that mention any of ``names`` (where a layout keeps its fields)."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    found = []
    for module in imported_modules(path, text):
        try:
            if os.path.getsize(module) > FOLLOW_MAX_BYTES:
                continue
            with open(module, "rb") as f:
                data = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        if any(name in data for name in names):
            found.append(file_info(module))
    return found


def op_read_host(s, paths, packages=(), python=None, pidfile=None, port=None, follow=None, timeout=60.0):
    """Facts, then the files (their paths may hold fact markers), then the modules they import
    that mention the given names — in one round trip; and the running server (``server``:
    its record, found by the pidfile or the port, as ``server_find`` does).

    Facts are gathered by the server's interpreter with the server's
    environment when a server runs (found like ``server_find``), else by
    ``python`` (or python3) with this helper's.
    """
    record = None
    try:
        record = op_server_find(s, pidfile, port)
    except AgentError:
        record = None
    interpreter = python or server_python(record) or "python3"
    env = dict(record["env"]) if record and record.get("env") else None
    facts = gather_facts(interpreter, packages, env, timeout) if packages else {"packages": {}}
    resolved = [fill_facts(p, facts) for p in paths]
    files = [file_info(p) for p in resolved]
    companions = {}
    for item in follow or []:
        index = int(item["index"])
        if 0 <= index < len(resolved) and files[index]["exists"]:
            companions[str(index)] = follow_imports(expand(resolved[index]), item["names"])
    return {"facts": facts, "paths": resolved, "files": files, "companions": companions, "server": record}


PARSER_ERROR = re.compile(r"^(\S.*?): error: (.*)$")


def op_preflight(s, argv, cwd=None, env=None, replace_env=False, timeout=120.0, staged=None):
    """Run a server's argument parser on its new command line (``core.preflight``), nothing else.

    Returns its exit code, output, and the parser's own error line
    (``sglang serve: error: unrecognized arguments: …``) when there is one.
    ``staged`` (``--check``): the staged copies the parser reads instead of
    their targets; each must still be the file this helper wrote, before and
    after, or the verdict is void (``--check`` holds no lock).
    """
    if staged:
        from .staging import refuse_if_swapped

        for copy in staged:
            refuse_if_swapped(s, expand(copy), "before the pre-flight ran")
    if replace_env:
        full_env = dict(env or {})
        res = _run_exact_env(argv, cwd and expand(cwd), full_env, timeout)
    else:
        res = run_argv(argv, cwd and expand(cwd), env, timeout)
    error_line = None
    message = None
    for line in reversed((res["stderr"] + "\n" + res["stdout"]).splitlines()):
        match = PARSER_ERROR.match(line.strip())
        if match:
            error_line, message = match.group(0), match.group(2)
            break
    for copy in staged or ():
        refuse_if_swapped(s, expand(copy), "while the pre-flight ran; its verdict is void")
    res["error_line"] = error_line
    res["message"] = message
    res["argv"] = argv
    return res


def _run_exact_env(argv, cwd, env, timeout):
    """``run_argv`` with exactly ``env`` (a recorded server environment), not this helper's plus it."""
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout)
    except (FileNotFoundError, PermissionError) as e:
        return {"rc": 127, "stdout": "", "stderr": "cannot run %s: %s" % (argv[0], e)}
    except subprocess.TimeoutExpired:
        return {"rc": 124, "stdout": "", "stderr": "timed out after %ss" % timeout}
    return {"rc": proc.returncode,
            "stdout": proc.stdout[-64 * 1024:].decode("utf-8", "replace"),
            "stderr": proc.stderr[-64 * 1024:].decode("utf-8", "replace")}
