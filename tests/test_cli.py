"""The interface as a user and a script meet it: the real ``orch`` in a subprocess, over
real sshd, against the stand-in server.

- through a pipe at 80 columns nothing is cut or boxed, and every error is one line;
- under a pseudo-terminal at 80 columns the history stays readable (no word broken);
- every exit code a script branches on, and ``--json`` on every run, bad input included;
- a mistyped host is refused before any name is resolved or any connection made;
- ``-v``/``-vv``/``-q``, shell completion, ``orch lint``, the default playbook lookup.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import shutil
import signal
import struct
import subprocess
import sys
import termios
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.forkrun import run_orch
from tests.fixtures.sandbox import Sandbox, health_status
from tests.fixtures.sshd import free_port

REPO = Path(__file__).resolve().parents[1]
BOX_CHARS = set("─│┃━┏┓┗┛┡┩╇╈┳┻╭╮╰╯└┘┌┐├┤┬┴┼═║")
INSERTED = '            help="Disable speculation when decode batch size exceeds this threshold.",'
HOST_COMMANDS = ("deploy", "rollback", "history", "status")

BAD_FLAG = """\
name: bad-flag
vars: {port: 30000}
files: []
server:
  manager: process
  flags: {"--speculative-disable-batch-treshold": 8}
health:
  base_url: "http://127.0.0.1:{{ port }}"
  timeout: 5m
  interval: 0.2s
  checks: [{get: /health}]
"""

# A new server that exits at start: its log is shown (a stand-in switch).
CRASHING = BAD_FLAG.replace("name: bad-flag", "name: crashing").replace(
    '  flags: {"--speculative-disable-batch-treshold": 8}', '  env: {STANDIN_CRASH_AT_START: "1"}')
PREFLIGHT_SAID = ("the pre-flight refused the new command line (exit 2): sglang serve: error: "
                  "unrecognized arguments: --speculative-disable-batch-treshold 8; the running server was not touched")


def run(box: Sandbox | Path, *args: str, columns: int = 80, env: dict[str, str] | None = None,
        timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    """``orch ARGS`` from the sandbox dir, stdout and stderr through pipes (not a terminal)."""
    cwd = box.root if isinstance(box, Sandbox) else box
    full = list(args)
    if isinstance(box, Sandbox) and args and args[0] in HOST_COMMANDS:
        full += ["--ssh-config", str(box.sshd.ssh_config)]
    environ = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    environ.update(COLUMNS=str(columns), **(env or {}))
    return run_orch(full, cwd=cwd, env=environ, timeout=timeout)


def as_json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    return json.loads(proc.stdout)


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("orch: error: "), proc.stderr
    return lines[0]


def no_boxes(text: str) -> None:
    found = BOX_CHARS & set(text)
    assert not found, f"box-drawing characters {found} in:\n{text}"


# ------------------------------------------------------------ off a terminal


def test_piped_at_80_columns_nothing_is_cut_folded_or_boxed(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    deploy = run(sandbox, "deploy", "--host", "gpu", "--diff", "speculative-disable")
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    lines = deploy.stdout.splitlines()
    assert "+" + INSERTED in lines  # the diff line, whole
    assert any(line.startswith("❱") and line.endswith(" " + INSERTED) for line in lines)  # the view
    assert max(len(line) for line in lines) > 80  # long lines were kept long, not folded
    assert "\x1b[" not in deploy.stdout  # no colour off a terminal
    no_boxes(deploy.stdout + deploy.stderr)

    (sandbox.root / "bad-flag.yaml").write_text(BAD_FLAG)
    bad = run(sandbox, "deploy", "--host", "gpu", "bad-flag.yaml")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    out = bad.stderr.splitlines()  # a host's failure: on stderr
    assert "gpu: rolled_back" in " ".join(out)
    assert "  " + PREFLIGHT_SAID in out  # the parser's own words, the error on one line
    no_boxes(bad.stdout + bad.stderr)

    (sandbox.root / "crashing.yaml").write_text(CRASHING)
    crash = run(sandbox, "deploy", "--host", "gpu", "crashing.yaml")
    assert crash.returncode == 1, crash.stdout + crash.stderr
    out = crash.stderr.splitlines()  # the failure and the log that explains it
    assert "  | RuntimeError: STANDIN_CRASH_AT_START=1: the server fails at start" in out  # the log, whole
    assert "  server exited during start (code 1)" in out
    no_boxes(crash.stdout + crash.stderr)

    history = run(sandbox, "history", "--host", "gpu")
    assert history.returncode == 0, history.stderr
    rows = history.stdout.splitlines()
    assert rows[0] == "history of gpu (3 releases)"
    assert len(rows) == 4  # one line per release
    assert rows[1].split()[5] == "current" and f"files: {sandbox.server_args}" in rows[1]
    assert rows[2].endswith("error: " + PREFLIGHT_SAID)
    assert rows[3].endswith("error: server exited during start (code 1)")
    no_boxes(history.stdout)

    status = run(sandbox, "status", "--host", "gpu")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "gpu status: ok" in status.stdout.splitlines()
    no_boxes(status.stdout)


@pytest.mark.parametrize(
    ("args", "files", "needle"),
    [
        (["deploy", "--host", "gpu", "bad.yaml"], {"bad.yaml": "name: t\nfiles:\n  - path: [x\n"},
         "bad.yaml:4: malformed YAML"),
        (["deploy", "--host", "gpu", "--var", "queue=[1", "speculative-disable"], {},
         "--var queue: value '[1' is not valid YAML"),
        (["deploy", "--host", "gpu", "--no-such-option"], {}, "orch deploy: No such option '--no-such-option'"),
        (["status"], {}, "orch status: Missing option '--host'"),
        (["history", "--host", "gpx"], {}, "--host: 'gpx' is not in the inventory (inventory.yaml); "
                                           "did you mean 'gpu'?"),
        (["deploy", "--host", "gpu", "no-such-playbook"], {}, "playbook 'no-such-playbook' not found"),
        (["rollback", "--host", "gpu", "-q", "-v"], {}, "-q and -v cannot be used together"),
        (["deploy", "--host", "gpu", "bomb.yaml"],
         {"bomb.yaml": "a0: &a0 [x]\n" + "".join(
             f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 9)}]\n" for n in range(1, 10))},
         "bomb.yaml:5: YAML aliases expand to more than 10000 nodes"),
    ],
)
def test_bad_input_is_one_line_and_a_json_report(sandbox: Sandbox, args: list[str],
                                                 files: dict[str, str], needle: str) -> None:
    for name, text in files.items():
        (sandbox.root / name).write_text(text)
    proc = run(sandbox, *args, "--json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = one_error_line(proc)
    assert needle in line, line
    assert as_json(proc) == {"exit_code": 2, "error": line.removeprefix("orch: error: "), "hosts": {}}
    assert not sandbox.state_dir.exists()  # nothing touched on the host


def test_a_mistyped_host_is_refused_before_any_name_is_resolved(sandbox: Sandbox, tmp_path: Path) -> None:
    """``localhost`` resolves, and with these defaults it would reach the test's sshd: it is
    still refused, and the process makes no DNS lookup and no connection (an audit hook sees
    every ``socket.getaddrinfo`` and ``socket.connect``)."""
    sshd = sandbox.sshd
    (sandbox.root / "inventory.yaml").write_text(json.dumps({
        "defaults": {"port": sshd.port, "user": sshd.user, "identity_file": str(sshd.client_key),
                     "known_hosts": str(sshd.known_hosts), "state_dir": str(sandbox.state_dir),
                     "python": sys.executable},
        "hosts": {"gpu": {"address": sshd.host}},
    }))
    harness = tmp_path / "audited.py"
    harness.write_text(textwrap.dedent("""\
        import atexit, json, sys
        seen = []
        WATCH = ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex",
                 "socket.connect")
        def hook(event, args):
            if event in WATCH:
                seen.append([event, repr(args)[:200]])
        sys.addaudithook(hook)
        atexit.register(lambda: open(sys.argv[1], "w").write(json.dumps(seen)))
        from orchestrator.cli.app import main
        main(sys.argv[2:])
    """))

    def audited(host: str) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
        log = tmp_path / "events.json"
        proc = subprocess.run(
            [sys.executable, str(harness), str(log), "status", "--host", host, "--json",
             "--ssh-config", str(sshd.ssh_config)],
            cwd=sandbox.root, capture_output=True, text=True, timeout=120)
        return proc, json.loads(log.read_text())

    proc, events = audited("localhost")
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert "'localhost' is not in the inventory" in line and "ssh://localhost" in line
    assert as_json(proc)["hosts"] == {}
    assert events == []

    proc, events = audited("gpuu")
    assert "did you mean 'gpu'?" in one_error_line(proc)
    assert events == []

    # the control: the same harness does see a lookup and a connection for an explicit name
    proc, events = audited("ssh://localhost")
    assert proc.returncode == 2  # its host key is not known under that name
    assert "unknown host key" in as_json(proc)["hosts"]["localhost"]["error"]
    assert any(e == "socket.getaddrinfo" and "localhost" in a for e, a in events), events
    assert any(e == "socket.connect" for e, _ in events), events


# ------------------------------------------------------------------ exit codes


def test_status_and_check_exit_codes(sandbox: Sandbox) -> None:
    # a host orch never deployed to: nothing to check, and nothing created by looking
    st = run(sandbox, "status", "--host", "gpu", "--json")
    assert st.returncode == 0, st.stdout + st.stderr
    assert as_json(st)["hosts"]["gpu"]["current"] is None
    hist = run(sandbox, "history", "--host", "gpu", "--json")  # the human line: on stderr under --json
    assert hist.returncode == 0
    assert f"gpu: no releases: orch has never deployed to gpu (no {sandbox.state_dir})" in hist.stderr
    assert as_json(hist)["hosts"] == {"gpu": []}
    assert not sandbox.state_dir.exists()

    # --check exits 2 where a deploy would refuse: no server runs and no server.command
    check = run(sandbox, "deploy", "--check", "--json", "--host", "gpu", "speculative-disable")
    assert check.returncode == 2, check.stdout + check.stderr
    rep = as_json(check)["hosts"]["gpu"]
    assert rep["outcome"] == "failed" and "server.command" in rep["error"]
    assert rep["files"] == [str(sandbox.server_args)]  # the plan is still shown and reported
    assert "a deploy would refuse" in check.stderr

    sandbox.start_by_hand()
    assert run(sandbox, "deploy", "--host", "gpu", "speculative-disable").returncode == 0
    st = run(sandbox, "status", "--host", "gpu", "--json")
    assert st.returncode == 0 and as_json(st)["hosts"]["gpu"]["healthy"] is True

    with sandbox.server_args.open("a") as f:  # drift is reported, not an error
        f.write("# a hand edit\n")
    st = run(sandbox, "status", "--host", "gpu", "--json")
    assert st.returncode == 0 and as_json(st)["hosts"]["gpu"]["drift"] == [str(sandbox.server_args)]

    pid = sandbox.server_pid()
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)
    deadline = time.time() + 30
    while sandbox.server_pid() is not None and time.time() < deadline:
        time.sleep(0.05)
    st = run(sandbox, "status", "--host", "gpu", "--json")
    assert st.returncode == 3, st.stdout + st.stderr
    assert "server not healthy" in as_json(st)["hosts"]["gpu"]["problems"]
    assert "gpu status: server not healthy" in st.stderr  # the human lines, on stderr under --json

    journal = sandbox.state_dir / "journal.json"
    journal.write_text(json.dumps({"release": "20260101T000000000-dead", "step": "committed",
                                   "finished": False}))
    st = run(sandbox, "status", "--host", "gpu", "--json")
    assert st.returncode == 3
    assert "deploy 20260101T000000000-dead unfinished" in as_json(st)["hosts"]["gpu"]["problems"]
    check = run(sandbox, "deploy", "--check", "--json", "--host", "gpu", "speculative-disable")
    assert check.returncode == 2
    assert "never finished" in as_json(check)["hosts"]["gpu"]["error"]

    sandbox.write_inventory(port=free_port())  # nobody listens there
    st = run(sandbox, "status", "--host", "gpu", "--json")
    assert st.returncode == 2, st.stdout + st.stderr
    assert as_json(st)["hosts"]["gpu"]["outcome"] == "unreachable"
    hist = run(sandbox, "history", "--host", "gpu", "--json")
    assert hist.returncode == 2
    assert as_json(hist)["failed"]["gpu"]["outcome"] == "unreachable"
    assert "gpu: unreachable" in hist.stderr  # a host failure


def test_rollback_to_an_unknown_release_is_exit_2_in_every_state(sandbox: Sandbox) -> None:
    fresh = run(sandbox, "rollback", "--host", "gpu", "--to", "nope", "--json")
    assert fresh.returncode == 2, fresh.stdout + fresh.stderr
    assert "no release 'nope' on this host" in as_json(fresh)["hosts"]["gpu"]["error"]

    sandbox.start_by_hand()
    assert run(sandbox, "deploy", "--host", "gpu", "speculative-disable").returncode == 0
    first = as_json(run(sandbox, "history", "--host", "gpu", "--json"))["hosts"]["gpu"][0]["id"]
    current = run(sandbox, "rollback", "--host", "gpu", "--to", "nope", "--json")
    assert current.returncode == 2
    assert as_json(current)["hosts"]["gpu"]["outcome"] == "failed"

    same = run(sandbox, "rollback", "--host", "gpu", "--to", first, "--json")
    assert same.returncode == 0 and as_json(same)["hosts"]["gpu"]["outcome"] == "unchanged"

    assert run(sandbox, "rollback", "--host", "gpu").returncode == 0
    undone = run(sandbox, "rollback", "--host", "gpu", "--to", first, "--json")
    assert undone.returncode == 2, undone.stdout + undone.stderr
    error = as_json(undone)["hosts"]["gpu"]["error"]
    assert f"release {first} is not in effect" in error and "undone by" in error
    assert "deployed" not in error
    assert run(sandbox, "rollback", "--host", "gpu", "--to", "nope").returncode == 2
    assert health_status(sandbox.port) == 200


# ---------------------------------------------------------------- verbosity


SECRET_VALIDATOR = """\
name: secret-check
files:
  - path: "{{ sglang_root }}/srt/server_args.py"
    edits:
      - content: "x_orch_marker = 1"
        after: "speculative_accept_threshold_acc:"
    validate:
      - "{{ python }} -c 'import sys' {{ staged }} {{ api_token }}"
"""


def test_quiet_verbose_and_protocol_levels(sandbox: Sandbox) -> None:
    (sandbox.root / "secret.yaml").write_text(SECRET_VALIDATOR)
    secret = "sk-test-0123456789"
    base = ("deploy", "--check", "--host", "gpu", "--var", f"api_token={secret}", "secret.yaml")

    quiet = run(sandbox, *base, "-q")
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert quiet.stdout.splitlines() == ["gpu: planned"]

    normal = run(sandbox, *base)
    assert "sed -n" in normal.stdout and "-> batch" not in normal.stdout

    verbose = run(sandbox, *base, "-v")
    out = verbose.stdout
    assert "'<orch helper bootstrap>'" in out  # the one command that starts the helper
    assert "gpu -> batch: read" in out
    # a validate command names the staged copy: it is rendered from the host's stage reply
    assert "gpu -> stage" in out and "gpu -> validate" in out
    assert re.search(r"\$ \S+ -c 'import sys' \S+orch-staged-\S+ \*\*\*", out), out
    assert '> {"id"' not in out

    protocol = run(sandbox, *base, "-vv")
    assert '> {"id":' in protocol.stdout and '< {"id":' in protocol.stdout
    # file contents go as blob lines: named in the request, sized in the answer, never dumped
    assert '"data":{"blob":' in protocol.stdout and '"blob":1,"bytes":' in protocol.stdout
    for proc in (quiet, normal, verbose, protocol):
        assert secret not in proc.stdout + proc.stderr


# ---------------------------------------------------------- pseudo-terminal


def run_in_pty(box: Sandbox, *args: str, columns: int = 80) -> tuple[int, str]:
    """``orch ARGS`` with a pseudo-terminal of ``columns`` as its stdin, stdout and stderr;
    the screen's text, colours and cursor moves taken out."""
    code, raw = run_in_pty_raw(box, *args, columns=columns)
    return code, screen_text(raw)


def screen_text(raw: bytes) -> str:
    """What a terminal shows of ``raw``: colours and cursor moves taken out."""
    text = raw.decode("utf-8", "replace").replace("\r", "")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07", "", text)


def run_in_pty_raw(box: Sandbox, *args: str, columns: int = 80) -> tuple[int, bytes]:
    """``orch ARGS`` under a pseudo-terminal of ``columns``: its exit code and the raw bytes it wrote."""
    return orch_in_pty([*args, "--ssh-config", str(box.sshd.ssh_config)], box.root, columns)


def orch_in_pty(args: list[str], cwd: Path, columns: int, lines: int = 40) -> tuple[int, bytes]:
    """``orch ARGS`` in ``cwd`` under a pseudo-terminal ``columns`` wide: its exit code and the raw
    bytes it wrote (its stdin, stdout and stderr are the terminal, as for a person)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", *args], cwd=cwd, env=env, stdin=slave,
                            stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child side closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(120), b"".join(chunks)


def test_history_under_a_terminal_at_80_columns_breaks_no_word(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    assert run(sandbox, "deploy", "--host", "gpu", "speculative-disable").returncode == 0
    (sandbox.root / "bad-flag.yaml").write_text(BAD_FLAG)
    assert run(sandbox, "deploy", "--host", "gpu", "bad-flag.yaml").returncode == 1
    assert run(sandbox, "rollback", "--host", "gpu").returncode == 0
    rows = as_json(run(sandbox, "history", "--host", "gpu", "--json"))["hosts"]["gpu"]
    assert len(rows) == 3

    code, text = run_in_pty(sandbox, "history", "--host", "gpu")
    assert code == 0, text
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), text
    whole = [r["id"] for r in rows] + [
        "speculative-disable", "bad-flag", "(rollback)",
        "--speculative-disable-batch-threshold: (absent) -> 32",
        "--speculative-disable-batch-treshold: (absent) -> 8",
        "unrecognized arguments: --speculative-disable-batch-treshold 8", f"undone by {rows[2]['id']}", f"undid {rows[0]['id']}",
    ]
    for words in whole:
        assert any(words in line for line in lines), f"{words!r} is broken or missing in:\n{text}"
    # a path longer than the screen is folded whole, never shortened or cut
    assert str(sandbox.server_args) in folded(text), text

    code, text = run_in_pty(sandbox, "status", "--host", "gpu")
    assert code == 0, text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "status" in text and "ok" in text

    assert run(sandbox, "deploy", "--host", "gpu", "speculative-disable").returncode == 0
    with sandbox.server_args.open("a") as f:  # drift: status names the drifted file in full
        f.write("# a hand edit\n")
    code, text = run_in_pty(sandbox, "status", "--host", "gpu")
    assert code == 0, text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "…" not in text, text
    assert str(sandbox.server_args) in folded(text), text


def folded(text: str) -> str:
    """The screen's lines joined with their borders and indentation dropped: a folded word
    reads whole again."""
    return "".join(line.strip(" │┃║") for line in text.splitlines())


# ------------------------------------------------------- completion and lint


def write_inventory(folder: Path, **hosts: dict[str, Any]) -> None:
    (folder / "inventory.yaml").write_text(json.dumps({
        "defaults": {"vars": {"model": "/models/m"}},
        "hosts": hosts or {"box": {"address": "127.0.0.1", "vars": {"sglang_root": "/srv/sglang"}}},
        "groups": {"fleet": list(hosts or ["box"])},
    }))


def test_shell_completion_offers_inventory_hosts_and_groups(tmp_path: Path) -> None:
    write_inventory(tmp_path)
    proc = run(tmp_path, env={"_ORCH_COMPLETE": "bash_complete", "COMP_WORDS": "orch status --host ",
                              "COMP_CWORD": "3"})
    assert proc.returncode == 0, proc.stderr
    assert set(proc.stdout.split()) == {"plain,box", "plain,fleet", "plain,all"}
    source = run(tmp_path, env={"_ORCH_COMPLETE": "bash_source"})
    assert "_orch_completion" in source.stdout


GOOD = """\
name: good
vars: {threshold: 32}
files:
  - path: "{{ sglang_root }}/srt/server_args.py"
    edits:
      - insert: sglang/server_args_field.py.j2
        after: "speculative_accept_threshold_acc:"
    validate: ["{{ python }} -m py_compile {{ staged }}"]
server:
  manager: process
  flags: {"--speculative-disable-batch-threshold": "{{ threshold }}"}
"""


def test_lint_renders_every_playbook_for_every_host_without_contacting_any(tmp_path: Path) -> None:
    write_inventory(tmp_path, a={"address": "10.255.0.1", "vars": {"sglang_root": "/srv/a"}},
                    b={"address": "10.255.0.2"})
    (tmp_path / "good.yaml").write_text(GOOD)
    (tmp_path / "typo.yaml").write_text(GOOD.replace("{{ threshold }}", "{{ threshhold }}"))
    (tmp_path / "syntax.yaml").write_text(GOOD.replace("{{ staged }}", "{{ staged }"))

    proc = run(tmp_path, "lint", "good.yaml", "--json")
    assert proc.returncode == 0, proc.stdout  # host b has no sglang_root: the host's facts give it
    report = as_json(proc)
    assert report["problems"] == [] and report["warnings"] == []
    assert report["rendered_for"] == ["a", "b"]
    (tmp_path / "rot.yaml").write_text(GOOD.replace("{{ sglang_root }}", "{{ sglang_rot }}"))
    proc = run(tmp_path, "lint", "rot.yaml", "--json")
    assert proc.returncode == 2
    assert as_json(proc)["problems"] == [{"error": "rot.yaml:4: files[0].path: 'sglang_rot' is undefined",
                                          "hosts": ["a", "b"]}]

    proc = run(tmp_path, "lint", "good.yaml", "--var", "sglang_root=/srv/x")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == ["lint: 1 playbook with inventory.yaml (2 hosts): ok"]

    proc = run(tmp_path, "lint", "typo.yaml", "syntax.yaml", "--var", "sglang_root=/srv/x")
    assert proc.returncode == 2
    lines = proc.stdout.splitlines()
    assert lines[0] == "typo.yaml:11: server.flags.--speculative-disable-batch-threshold: " \
                       "'threshhold' is undefined (for hosts a, b)"
    assert lines[1].startswith("syntax.yaml:8: files[0].validate[0]: ")
    assert lines[-1] == "lint: 2 playbooks with inventory.yaml (2 hosts): 2 problems"


def test_lint_of_the_shipped_playbooks_in_a_fresh_copy_of_the_repo_is_clean(tmp_path: Path) -> None:
    """The README's own example: `orch lint playbooks/*.yaml` beside the example inventory,
    whose hosts set sglang_root but not vllm_root, and playbooks whose when: test facts."""
    for folder in ("playbooks", "templates"):
        shutil.copytree(REPO / folder, tmp_path / folder)
    shutil.copy(REPO / "inventory.yaml", tmp_path / "inventory.yaml")
    (tmp_path / "playbooks" / "versions.yaml").write_text(
        "name: versions\nfiles:\n  - path: '{{ sglang_root }}/srt/arg_groups/field_order.py'\n"
        "    when: \"facts.packages.sglang is defined and facts.packages.sglang.version >= '0.5.20'\"\n"
        "    edits:\n      - content: '\"x\"'\n        into: POSITIONAL_FIELD_ORDER\n        after_item: y\n"
        "  - path: '{{ vllm_root }}/engine/arg_utils.py'\n"
        "    when: \"facts.packages.vllm.version is version('0.8.5', '<')\"\n"
        "    edits: [{content: 'x = 1', after: 'y'}]\n")
    books = sorted(f"playbooks/{p.name}" for p in (tmp_path / "playbooks").glob("*.yaml"))
    assert len(books) == 6
    proc = run(tmp_path, "lint", *books)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == ["skipped playbooks/nightly.yaml: a nightly spec, not a playbook",
                                        "lint: 6 playbooks with inventory.yaml (2 hosts): ok"]


def test_lint_without_an_inventory_warns_of_undefined_variables_it_cannot_check(tmp_path: Path) -> None:
    (tmp_path / "rot.yaml").write_text(GOOD.replace("{{ sglang_root }}", "{{ sglang_rot }}")
                                       .replace("{{ threshold }}", "{{ threshhold }}"))
    proc = run(tmp_path, "lint", "rot.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "warning: rot.yaml:4: files[0].path: 'sglang_rot' is undefined (not checked: no inventory)",
        "warning: rot.yaml:11: server.flags.--speculative-disable-batch-threshold: 'threshhold' is undefined "
        "(not checked: no inventory)",
        "lint: 1 playbook: ok, 2 warnings",
    ]
    write_inventory(tmp_path)  # ./inventory.yaml now: the same names are errors, both in one run
    proc = run(tmp_path, "lint", "rot.yaml")
    assert proc.returncode == 2
    assert proc.stdout.splitlines() == [
        "rot.yaml:4: files[0].path: 'sglang_rot' is undefined (for host box)",
        "rot.yaml:11: server.flags.--speculative-disable-batch-threshold: 'threshhold' is undefined (for host box)",
        "lint: 1 playbook with inventory.yaml (1 host): 2 problems",
    ]


def test_lint_reports_every_schema_error_of_a_file_in_one_run(tmp_path: Path) -> None:
    write_inventory(tmp_path)
    broken = (GOOD.replace("    edits:", "    edtis:").replace("  manager: process", "  manager: systemd")
              .replace("vars: {threshold: 32}", "vars: {threshold: 32}\nkeep_releases: 0"))
    (tmp_path / "three.yaml").write_text(broken)
    (tmp_path / "good.yaml").write_text(GOOD)
    proc = run(tmp_path, "lint", "three.yaml", "good.yaml")
    assert proc.returncode == 2
    lines = proc.stdout.splitlines()
    assert lines[0] == "three.yaml:3: keep_releases: must be >= 1 (got: 0)"
    assert lines[1].startswith("three.yaml:6: files[0].edtis: extra key not permitted (did you mean 'edits'?)")
    assert lines[2].startswith("three.yaml:11: server.manager: expected one of process, commands (got: systemd)")
    assert lines[3] == "lint: 2 playbooks with inventory.yaml (1 host): 3 problems"
    assert lines[-1].startswith("lint: 2 playbooks with inventory.yaml (1 host): ")
    assert not any("edits: field required" in line for line in lines)  # the typo is the cause, not a second error


def test_the_default_playbook_is_the_working_directorys_then_the_shipped_one(tmp_path: Path) -> None:
    write_inventory(tmp_path)
    proc = run(tmp_path, "lint", "--json")
    shipped = as_json(proc)["playbooks"]
    assert shipped == [str((REPO / "playbooks" / "site.yaml").resolve())] or \
        shipped[0].endswith("orchestrator/_data/playbooks/site.yaml")
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "site.yaml").write_text(GOOD.replace("name: good", "name: mine"))
    proc = run(tmp_path, "lint", "--json")
    assert as_json(proc)["playbooks"] == ["playbooks/site.yaml"]
    assert proc.returncode == 0, proc.stdout
    (tmp_path / "playbooks" / "nightly.yaml").write_text("name: n\nsource: {git: {}}\nstack: []\n")
    proc = run(tmp_path, "lint", "playbooks/site.yaml", "playbooks/nightly.yaml")
    assert proc.returncode == 0, proc.stdout
    assert "skipped playbooks/nightly.yaml: a nightly spec, not a playbook" in proc.stdout
