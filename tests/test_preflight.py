"""The pre-flight's pieces: the default command, ``server.preflight`` rendering, the helper's op.

The op runs for real against the stand-in tree in each of its layouts (the
same ``python -c`` SGLang's default runs on a GPU box): the new command line
parses (exit 0), a misspelt flag is refused with argparse's own line, and
nothing is started. The deploy step that uses these (after the commit,
before the stop) is wired in ``pipeline.deploy``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from orchestrator.core.models import parse_playbook
from orchestrator.core.preflight import (
    SGLANG_PARSE,
    STAGED_FINDER,
    PreflightResult,
    default_preflight,
    render_preflight,
    staged_aware,
    staged_builtin,
)
from orchestrator.core.rendering import render_playbook
from orchestrator.core.target import HostTarget
from orchestrator.core.templating import Renderer
from orchestrator.errors import TemplateError
from orchestrator.pipeline.plan import preflight_argv
from orchestrator.pipeline.session import HostSession
from orchestrator.shell import ops
from orchestrator.standin import LAYOUTS, launch_argv, launch_env, make_tree
from tests.fixtures.sandbox import listening_pid
from tests.fixtures.sshd import SshdServer, free_port


def run_preflight(host: HostSession, argv: list[str], *, env: dict[str, str] | None = None,
                  replace_env: bool = False, timeout: float = 120.0) -> PreflightResult:
    """The deploy's pre-flight request, alone."""
    result: PreflightResult = host.run(ops.preflight(argv, cwd=None, env=env, replace_env=replace_env,
                                                     timeout=timeout))
    return result


# --------------------------------------------------------------------------- the default


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["/v/bin/python", "-m", "sglang.launch_server", "--model-path", "m"], ["/v/bin/python", "-c", SGLANG_PARSE, "--model-path", "m"]),
        (["python3", "-u", "-X", "dev", "-m", "sglang.launch_server", "--port", "1"], ["python3", "-c", SGLANG_PARSE, "--port", "1"]),
        (["/v/bin/python3.11", "/v/bin/sglang", "serve", "--tp", "8"], ["/v/bin/python3.11", "-c", SGLANG_PARSE, "--tp", "8"]),
        (["/v/bin/sglang", "serve", "--tp", "8"], ["/v/bin/python", "-c", SGLANG_PARSE, "--tp", "8"]),
        (["sglang", "serve"], ["python3", "-c", SGLANG_PARSE]),
    ],
)
def test_the_default_knows_sglangs_launchers(argv: list[str], expected: list[str]) -> None:
    assert default_preflight(argv) == expected


def test_the_default_uses_server_python_for_a_bare_console_script() -> None:
    assert default_preflight(["sglang", "serve", "--x"], "/opt/py/bin/python") == [
        "/opt/py/bin/python", "-c", SGLANG_PARSE, "--x",
    ]


@pytest.mark.parametrize(
    "argv",
    [[], ["vllm", "serve", "m"], ["python3", "-m", "vllm.entrypoints.openai.api_server"], ["docker", "run", "x"], ["python3", "-c", "pass"]],
)
def test_no_default_for_servers_it_does_not_know(argv: list[str]) -> None:
    assert default_preflight(argv) is None


# --------------------------------------------------------------------------- server.preflight


def test_argv_as_a_word_of_its_own_is_the_new_command_line() -> None:
    argv = ["/v/bin/python", "-m", "x", "--name", "a b"]
    got = render_preflight(
        "{{ python }} check.py --strict {{ argv }}", argv, {"python": "/v/bin/python"}, Renderer()
    )
    assert got == ["/v/bin/python", "check.py", "--strict", *argv]


def test_command_is_the_new_command_line_as_one_quoted_word() -> None:
    argv = ["/v/bin/python", "-m", "x", "--name", "a b; rm -rf /"]
    got = render_preflight("sh -c '{{ command }} --help-only'", argv, {}, Renderer())
    assert got == ["sh", "-c", "/v/bin/python -m x --name 'a b; rm -rf /' --help-only"]


def test_an_undefined_name_in_preflight_is_located() -> None:
    with pytest.raises(TemplateError) as error:
        render_preflight("{{ nope }} {{ argv }}", ["a"], {}, Renderer(), file="p.yaml", line=7, key="server.preflight")
    assert str(error.value).startswith("p.yaml:7: server.preflight: 'nope' is undefined")


# --------------------------------------------------------------------------- --check: the staged files


def test_check_runs_the_default_with_dash_b_and_the_finder_first() -> None:
    argv = ["/v/bin/python", "-m", "sglang.launch_server", "--model-path", "m"]
    assert staged_builtin(default_preflight(argv) or []) == [
        "/v/bin/python", "-B", "-c", STAGED_FINDER + SGLANG_PARSE, "--model-path", "m",
    ]
    assert staged_builtin(["/v/bin/python", "-m", "mycheck", *argv]) is None  # not the built-in one


@pytest.mark.parametrize(
    ("template", "aware"),
    [
        ("{{ python }} -m mycheck --staged {{ staged_files }} {{ argv }}", True),
        ("{{ python }} -m mycheck --staged={{staged_files|trim}} {{ argv }}", True),
        ("sh -c 'test -n \"$ORCH_STAGED\" && exec mycheck \"$@\"' sh {{ argv }}", True),
        ("{{ python }} -m mycheck {{ argv }}", False),
        ("{{ python }} -m mycheck --files staged_files {{ argv }}", False),  # a word, not the variable
    ],
)
def test_a_custom_preflight_is_staged_aware_when_a_word_takes_the_map(template: str, aware: bool) -> None:
    assert staged_aware(template) is aware


def test_staged_files_is_the_map_as_json_and_empty_for_the_deploy() -> None:
    import json

    staged = {"/t/srt/server_args.py": "/t/srt/.server_args.orch-staged-1a2b.py"}
    got = render_preflight("mycheck {{ staged_files }} {{ argv }}", ["p", "--x"], {}, Renderer(), staged=staged)
    assert got[0] == "mycheck" and json.loads(got[1]) == staged and got[2:] == ["p", "--x"]
    assert render_preflight("mycheck {{ staged_files }} {{ argv }}", ["p"], {}, Renderer()) == ["mycheck", "{}", "p"]


PLAYBOOK = """\
name: t
server:
  manager: process
  python: /v/bin/python
  preflight: "{{ python }} -m mycheck {{ argv }}"
"""


def test_the_plan_renders_the_playbooks_preflight_or_falls_back_to_the_default() -> None:
    new_argv = ["/v/bin/python", "-m", "sglang.launch_server", "--model-path", "m", "--x", "1"]
    pb = parse_playbook(PLAYBOOK, "p.yaml")
    rendered = render_playbook(pb, None, {"python": "/v/bin/python"}, Renderer())
    assert preflight_argv(rendered.server, new_argv, {"python": "/v/bin/python"}, Renderer()) == [
        "/v/bin/python", "-m", "mycheck", *new_argv,
    ]
    without = parse_playbook(PLAYBOOK.replace('  preflight: "{{ python }} -m mycheck {{ argv }}"\n', ""), "p.yaml")
    rendered = render_playbook(without, None, {"python": "/v/bin/python"}, Renderer())
    assert preflight_argv(rendered.server, new_argv, {}, Renderer()) == default_preflight(new_argv)
    assert preflight_argv(rendered.server, ["vllm", "serve", "m"], {}, Renderer()) is None
    off = parse_playbook(PLAYBOOK.replace('  preflight: "{{ python }} -m mycheck {{ argv }}"\n', "  preflight: false\n"),
                         "p.yaml")
    rendered = render_playbook(off, None, {"python": "/v/bin/python"}, Renderer())
    assert preflight_argv(rendered.server, new_argv, {}, Renderer()) is None  # turned off: none runs
    on = parse_playbook(PLAYBOOK.replace('  preflight: "{{ python }} -m mycheck {{ argv }}"\n', "  preflight: true\n"),
                        "p.yaml")
    rendered = render_playbook(on, None, {"python": "/v/bin/python"}, Renderer())
    assert preflight_argv(rendered.server, new_argv, {}, Renderer()) == default_preflight(new_argv)


# --------------------------------------------------------------------------- the helper's op, for real


def session() -> HostSession:
    return HostSession(HostTarget(name="local", connection="local", python=sys.executable))


@pytest.fixture(params=sorted(LAYOUTS))
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    make_tree(tmp_path / "tree", layout=request.param)
    return tmp_path / "tree"


def test_the_preflight_accepts_a_good_command_line_and_starts_nothing(tree: Path) -> None:
    port = free_port()
    argv = launch_argv(sys.executable, tree, port=port, extra=["--tp-size", "2"])
    check = default_preflight(argv)
    assert check is not None
    with session() as host:
        result = run_preflight(host, check, env={**os.environ, **launch_env(tree)}, replace_env=True)
    assert result.ok, result.stderr
    assert result.rc == 0 and result.error_line is None
    assert "orch pre-flight: the arguments parse" in result.stdout
    assert listening_pid(port) is None  # no server was started


def test_the_preflight_refuses_a_misspelt_flag_with_the_parsers_own_line(tree: Path) -> None:
    argv = launch_argv(sys.executable, tree, port=free_port(), extra=["--speculative-disable-batch-treshold", "8"])
    with session() as host:
        result = run_preflight(host, default_preflight(argv) or [], env=launch_env(tree))
    assert not result.ok and result.rc == 2
    assert result.error_line == "sglang serve: error: unrecognized arguments: --speculative-disable-batch-treshold 8"
    assert result.message == "unrecognized arguments: --speculative-disable-batch-treshold 8"
    refusal = result.refusal()
    assert "sglang serve: error: unrecognized arguments: --speculative-disable-batch-treshold 8" in refusal
    assert refusal.endswith("the running server was not touched") and "\n" not in refusal


def test_the_preflight_sees_a_flag_the_committed_patch_added(tree: Path, tmp_path: Path) -> None:
    """After the commit the new flag parses: the check reads the files on disk, as the new server will."""
    from orchestrator.core.edits import plan_file
    from orchestrator.core.flags import FlagRequest, expand_edits
    from orchestrator.host import facts
    from orchestrator.shell.config_files import packaged_dir, template_lookup

    root = tree / "python" / "sglang" / "srt"
    target = root / "server_args.py"
    related = {i["path"]: Path(i["path"]).read_text() for i in facts.follow_imports(str(target), ["speculative_accept_threshold_acc"])}
    request = FlagRequest(
        "speculative_disable_batch_threshold", "int", None, "h", "speculative_accept_threshold_acc", True, "t:0.0"
    )
    renderer = Renderer(template_lookup((packaged_dir("templates"),)))
    edits, _ = expand_edits(str(target), [request], target.read_text(), related, renderer, {})
    argv = launch_argv(sys.executable, tree, port=free_port(), extra=["--speculative-disable-batch-threshold", "8"])
    with session() as host:
        before = run_preflight(host, default_preflight(argv) or [], env=launch_env(tree))
        for path, specs in edits.items():
            if specs:
                Path(path).write_text(plan_file(path, Path(path).read_text(), specs).result)
        after = run_preflight(host, default_preflight(argv) or [], env=launch_env(tree))
    assert before.rc == 2 and "unrecognized arguments" in (before.message or "")
    assert after.ok, after.stderr


def digest(tree: Path) -> dict[str, str]:
    import hashlib

    return {str(p.relative_to(tree)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(tree.rglob("*"))}


def test_the_finder_reads_each_planned_file_from_its_staged_copy(tree: Path) -> None:
    """The add_flag patch staged beside its targets (the spec layout's in ``arg_groups/fields/spec.py``),
    the unpatched targets on disk with their bytecode compiled: the check's form of the default parses
    the new flag, the deploy's form does not, and the tree is as it was, ``__pycache__`` included."""
    import compileall
    import json

    from orchestrator.core.edits import plan_file
    from orchestrator.core.flags import FlagRequest, expand_edits
    from orchestrator.host import facts
    from orchestrator.shell.config_files import packaged_dir, template_lookup

    target = tree / "python" / "sglang" / "srt" / "server_args.py"
    related = {i["path"]: Path(i["path"]).read_text() for i in facts.follow_imports(str(target), ["speculative_accept_threshold_acc"])}
    request = FlagRequest(
        "speculative_disable_batch_threshold", "int", None, "h", ("speculative_accept_threshold_acc",), True, "t:0.0"
    )
    renderer = Renderer(template_lookup((packaged_dir("templates"),)))
    edits, _ = expand_edits(str(target), [request], target.read_text(), related, renderer, {})
    staged = {}
    for path, specs in edits.items():
        if specs:
            copy = Path(path).with_name(f".{Path(path).stem}.orch-staged-test.py")
            copy.write_text(plan_file(path, Path(path).read_text(), specs).result)
            staged[path] = str(copy)
    assert staged
    compileall.compile_dir(str(tree), quiet=1)  # a stale __pycache__ of every unpatched target
    before = digest(tree)
    argv = launch_argv(sys.executable, tree, port=free_port(), extra=["--speculative-disable-batch-threshold", "8"])
    check = staged_builtin(default_preflight(argv) or [])
    assert check is not None
    env = {**launch_env(tree), "ORCH_STAGED": json.dumps(staged)}
    with session() as host:
        on_disk = run_preflight(host, default_preflight(argv) or [], env=launch_env(tree))
        with_copies = run_preflight(host, check, env=env)
        bad = launch_argv(sys.executable, tree, port=free_port(), extra=["--speculative-disable-batch-threshold", "x"])
        refused = run_preflight(host, staged_builtin(default_preflight(bad) or []) or [], env=env)
    assert on_disk.rc == 2 and "unrecognized arguments" in (on_disk.message or "")
    assert with_copies.ok, with_copies.stderr
    assert refused.rc == 2 and "invalid int value: 'x'" in (refused.message or ""), refused.stderr
    assert digest(tree) == before


def test_a_staged_copy_swapped_before_the_preflight_voids_it(tmp_path: Path) -> None:
    """``--check`` holds no lock: a staged name that now names a file orch did not write is refused,
    not judged (the same rule as the validators')."""
    from orchestrator.shell.agent_client import RemoteStepError

    target = tmp_path / "mod.py"
    target.write_text("x = 1\n")
    with session() as host:
        (info,) = host.run(ops.stage([{"path": str(target), "data": b"x = 2\n"}], "c0ffee00"))
        staged = info["staged"]
        ok = host.run(ops.preflight([sys.executable, "-c", "pass"], cwd=None, env={}, replace_env=False,
                                    timeout=60, staged=[staged]))
        planted = tmp_path / "planted.py"
        planted.write_text("x = 3\n")
        os.replace(planted, staged)
        with pytest.raises(RemoteStepError) as refused:
            host.run(ops.preflight([sys.executable, "-c", "pass"], cwd=None, env={}, replace_env=False,
                                   timeout=60, staged=[staged]))
        host.run(ops.remove([staged]))
    assert ok.ok
    assert refused.value.kind == "planted"
    assert "before the pre-flight ran" in str(refused.value)


def test_a_missing_interpreter_or_a_hang_is_a_refusal_not_a_crash(tmp_path: Path) -> None:
    with session() as host:
        missing = run_preflight(host, [str(tmp_path / "no-python"), "-c", "pass"])
        slow = run_preflight(host, [sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    assert missing.rc == 127 and not missing.ok
    assert slow.rc == 124 and "timed out" in slow.refusal()


def test_result_from_the_wire() -> None:
    result = PreflightResult.from_wire(
        {"argv": ["p"], "rc": 2, "stdout": "", "stderr": "usage: x\nx: error: bad\n", "error_line": "x: error: bad", "message": "bad"}
    )
    assert not result.ok and result.message == "bad"
    assert result.refusal() == (
        "the pre-flight refused the new command line (exit 2): x: error: bad; the running server was not touched"
    )


def test_the_preflight_op_over_sshd(tmp_path: Path, sshd: SshdServer) -> None:
    from orchestrator.pipeline.session import ConnectOptions

    make_tree(tmp_path / "tree", layout="spec")
    target = HostTarget(
        name="gpu", address=sshd.host, port=sshd.port, user=sshd.user,
        identity_file=str(sshd.client_key), known_hosts=str(sshd.known_hosts), python=sys.executable,
    )
    argv = launch_argv(sys.executable, tmp_path / "tree", port=free_port(), extra=["--nope", "1"])
    with HostSession(target, ConnectOptions(ssh_config_path=str(sshd.ssh_config))) as host:
        result = run_preflight(host, default_preflight(argv) or [], env=launch_env(tmp_path / "tree"))
    assert result.error_line == "sglang serve: error: unrecognized arguments: --nope 1"
