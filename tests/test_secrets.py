"""Secrets never reach a screen, a log or a record; host text never reaches a terminal raw.

The rules are pure (``core.secrets.Masker``, ``core.safetext.printable``) and
tested as such first; then the real CLI over real sshd against the stand-in
server: a secret var in an insert, in a health check's header and in
``--api-key`` (which the stand-in, like SGLang, logs at start), a server
environment with ``MYSQL_PWD`` and a ``DATABASE_URL`` holding a password, a
start that fails and prints its log tail, ``--check --diff``, ``-vv``,
``--json``, the history and a rollback — and every file in the host's state
dir but the ones orch needs to act, which are 0600.
"""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest

from orchestrator.core.safetext import printable
from orchestrator.core.secrets import MASK, Masker
from tests.fixtures.forkrun import run_orch
from tests.fixtures.sandbox import Sandbox, cmdline, health_status

# ------------------------------------------------------------------ the rules


def test_printable_escapes_every_control_character_but_newline_and_tab() -> None:
    hostile = "\x1b]0;pwned\x07\x1b[2J\rgpu: changed\n\tok \x9b31m \u202eevil\x7f"
    shown = printable(hostile)
    assert shown == "\\x1b]0;pwned\\x07\\x1b[2J\\x0dgpu: changed\n\tok \\x9b31m \\u202eevil\\x7f"
    assert printable(shown) == shown  # idempotent: nothing left to escape
    assert printable("plain [bold]text[/] é ❱") == "plain [bold]text[/] é ❱"


def test_the_env_rule_masks_names_the_var_rule_missed_and_url_passwords() -> None:
    m = Masker(declared=["odd_one"])
    env = {"MYSQL_PWD": "a", "DB_PASS": "b", "SIGNING_KEY": "c", "BASIC_AUTH": "d", "WANDB_KEY": "e",
           "HF_TOKEN": "f", "ODD_ONE": "g", "DATABASE_URL": "postgres://u:p4ss@h/db",
           "REDIS_URL": "redis://:r3dis@h:6379/0", "PATH": "/usr/bin", "MODEL": "glm"}
    assert m.env(env) == {"MYSQL_PWD": MASK, "DB_PASS": MASK, "SIGNING_KEY": MASK, "BASIC_AUTH": MASK,
                          "WANDB_KEY": MASK, "HF_TOKEN": MASK, "ODD_ONE": MASK,
                          "DATABASE_URL": "postgres://u:***@h/db", "REDIS_URL": "redis://:***@h:6379/0",
                          "PATH": "/usr/bin", "MODEL": "glm"}
    argv = ["python", "-m", "sglang.launch_server", "--api-key", "k1", "--admin-api-key=k2",
            "--hf-token", "k3", "--odd-one", "k4", "--port", "30000"]
    assert m.argv(argv) == ["python", "-m", "sglang.launch_server", "--api-key", MASK, f"--admin-api-key={MASK}",
                            "--hf-token", MASK, "--odd-one", MASK, "--port", "30000"]


def test_values_found_by_the_rules_are_masked_wherever_they_appear_later() -> None:
    m = Masker(["sk-var-secret"])
    m.learn({"env": {"MYSQL_PWD": "mysql-pw-0815", "TOKENIZERS_PARALLELISM": "false"},
             "argv": ["python", "--api-key", "from-argv-77", "--tokenizer-path", "/models/x"],
             "checks": [{"headers": {"Authorization": "Bearer hdr-token-9"}}]})
    tail = ("server_args=ServerArgs(tokenizer_path='/models/x', api_key='from-argv-77', parallel=false) "
            "mysql-pw-0815 hdr-token-9 sk-var-secret postgres://u:other-pw@h/db")
    assert m.text(tail) == ("server_args=ServerArgs(tokenizer_path='/models/x', api_key='***', parallel=false) "
                            "*** *** *** postgres://u:***@h/db")
    record = m.record({"health": {"checks": [{"headers": {"Content-Type": "x", "Authorization": "y"}}]},
                       "flag_changes": ["--api-key: absent -> ***", "--port: 1 -> 2"], "n": 3})
    assert record == {"health": {"checks": [{"headers": {"Content-Type": MASK, "Authorization": MASK}}]},
                      "flag_changes": ["--api-key: absent -> ***", "--port: 1 -> 2"], "n": 3}


def test_a_value_pasted_into_secrets_is_refused_without_being_quoted(tmp_path: Path) -> None:

    pb = tmp_path / "pb.yaml"
    pb.write_text("name: x\nsecrets: [hf_token, 'sk-live 0123']\n")
    proc = run_orch(["lint", str(pb)], cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "pb.yaml:2: secrets[1]: expected the name of a var" in proc.stdout + proc.stderr
    assert "sk-live 0123" not in proc.stdout + proc.stderr


# --------------------------------------------------------- through the real CLI


SECRET = "hub-access-5f3a9c1e"
MYSQL_PWD = "mysql-pwd-0815x"
PG_PASSWORD = "pgpass-4711x"
ODD_SETTING = "odd-value-2718x"  # under a name no rule matches: masked because secrets: lists it
SECRETS = (SECRET, MYSQL_PWD, PG_PASSWORD, ODD_SETTING)

PLAYBOOK = """\
name: secret-deploy
secrets: [hub_access, odd_setting]   # a var and an env var whose names no rule matches
vars: {{threshold: 32}}
files:
  - path: "{{{{ sglang_root }}}}/srt/server_args.py"
    edits:
      - add_flag:
          name: speculative_disable_batch_threshold
          type: int
          default: null
          help: "Disable speculation when decode batch size exceeds this threshold."
          near: speculative_accept_threshold_acc
      - content: "HF_TOKEN = '{{{{ hub_access }}}}'"
        after: "import random"
    validate: [python-syntax]
server:
  manager: process
  env: {{MYSQL_PWD: {mysql}, DATABASE_URL: "postgres://u:{pg}@db.internal/app", ODD_SETTING: {odd}{extra_env}}}
  flags: {{"--speculative-disable-batch-threshold": "{{{{ threshold }}}}", "--api-key": "{{{{ hub_access }}}}"}}
health:
  base_url: "http://127.0.0.1:{{{{ port }}}}"
  timeout: 60s
  interval: 0.2s
  confirm_timeout: 60s
  stable_for: 1s
  checks:
    - get: /health
    - get: /get_server_info
      headers: {{Authorization: "Bearer {{{{ hub_access }}}}"}}
      expect: {{speculative_disable_batch_threshold: "{{{{ threshold }}}}"}}
"""


def playbook(box: Sandbox, name: str, extra_env: str = "") -> str:
    path = box.root / name
    path.write_text(PLAYBOOK.format(mysql=MYSQL_PWD, pg=PG_PASSWORD, odd=ODD_SETTING, extra_env=extra_env))
    return str(path)


def assert_no_secret(proc: subprocess.CompletedProcess[str], what: str) -> None:
    shown = proc.stdout + proc.stderr
    for secret in SECRETS:
        assert secret not in shown, f"{what} shows {secret}:\n{shown}"
    assert "\x1b" not in shown, f"{what} writes a raw ESC:\n{shown!r}"


NEEDED_ON_DISK = ("restore.json", "program.json", "server.log", "files")  # what a restore and the program run
"""What orch (or the server) keeps unmasked on the host because a restore needs it, or the
server wrote it: restore plans, the server's own log, the files' before/after copies."""


def test_no_secret_reaches_any_output_log_or_record(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    good = playbook(sandbox, "good.yaml")
    var = ("--var", f"hub_access={SECRET}")

    check = sandbox.orch("deploy", "--check", "--diff", "-vv", "--host", "gpu", *var, good)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "HF_TOKEN = '***'" in check.stdout  # the --diff and the planned view, masked
    assert_no_secret(check, "--check --diff -vv")

    deployed = sandbox.orch("deploy", "-vv", "--host", "gpu", *var, good)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    assert cmdline(sandbox.server_pid())[-2:] == ["--api-key", SECRET]  # the real values did take effect
    assert f"HF_TOKEN = '{SECRET}'" in sandbox.server_args.read_text()
    assert "HF_TOKEN = '***'" in deployed.stdout  # the sed -n view read back from the host
    # -vv shows the program's requests, masked: the --api-key argument and the health check's
    # Authorization header (a whole environment is long enough to be elided as <N chars>)
    assert '"--api-key","***"' in deployed.stdout and '"Authorization":"***"' in deployed.stdout
    assert_no_secret(deployed, "deploy -vv")

    # the new server logs its ServerArgs (api_key included) and dies at start: the log tail is shown
    crash = playbook(sandbox, "crash.yaml", extra_env=', STANDIN_CRASH_AT_START: "1"')
    failed = sandbox.orch("deploy", "-vv", "--host", "gpu", "--var", "threshold=33", *var, crash)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "api_key='***'" in failed.stderr  # the tail was printed (with the failure, on stderr), the key masked
    assert_no_secret(failed, "failed deploy -vv")
    as_json = sandbox.orch("deploy", "--json", "--host", "gpu", "--var", "threshold=33", *var, crash)
    assert as_json.returncode == 1, as_json.stdout + as_json.stderr
    assert json.loads(as_json.stdout)["hosts"]["gpu"]["outcome"] == "rolled_back"
    assert_no_secret(as_json, "failed deploy --json")
    assert health_status(sandbox.port) == 200  # the previous release's server is back

    current = json.loads(sandbox.orch("history", "--host", "gpu", "--json").stdout)["hosts"]["gpu"][0]["id"]
    # each read once with --json: the JSON report on stdout and the human output (the same
    # lines as without --json) on stderr, both checked by assert_no_secret
    view = sandbox.orch("history", "--host", "gpu", "--release", current, "--json")
    assert "HF_TOKEN = '***'" in view.stderr, view.stderr  # the release's own copy, read back masked
    assert view.returncode == 0, view.stdout + view.stderr
    assert_no_secret(view, "history --release --json")  # its files' sed -n view too
    for args in (("history", "--host", "gpu", "--json"), ("status", "--host", "gpu", "-vv", "--json")):
        proc = sandbox.orch(*args)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert_no_secret(proc, " ".join(args))
        if "-vv" in args:  # the protocol lines are there to be checked (on stderr under --json)
            assert '> {"id":' in proc.stderr, proc.stderr

    # no playbook: the rules, and the secrets: names the releases recorded; restore.json's real values
    back = sandbox.orch("rollback", "-vv", "--host", "gpu")
    assert back.returncode == 0, back.stdout + back.stderr
    assert "MYSQL_PWD" in back.stdout and "ODD_SETTING" in back.stdout  # the restore plan's env, masked
    assert_no_secret(back, "rollback -vv")
    assert cmdline(sandbox.server_pid()) == sandbox.hand_argv

    run_logs = list(sandbox.state_dir.glob("releases/*/run.log"))
    assert len(run_logs) >= 3
    checked = 0
    for path in sandbox.state_dir.rglob("*"):
        if not path.is_file():
            continue
        mode = stat.S_IMODE(path.stat().st_mode)
        if path.name == "run.log" or any(part.startswith(NEEDED_ON_DISK) for part in path.parts[-2:]):
            assert mode == 0o600, f"{path} is {oct(mode)}"
        if any(part.startswith(NEEDED_ON_DISK) for part in path.parts[-2:]):
            continue
        data = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, f"{path} holds {secret}"
        checked += 1
    assert checked >= 10  # manifests, journals, run logs, events …
    manifests = [json.loads(p.read_text()) for p in sandbox.state_dir.glob("releases/*/manifest.json")]
    deploys = [m for m in manifests if m["kind"] == "deploy" and m.get("server_after")]
    assert deploys and all(m["server_after"]["env"]["MYSQL_PWD"] == MASK for m in deploys)
    assert all(m["server_after"]["env"]["ODD_SETTING"] == MASK for m in deploys)
    assert all(m["server_after"]["env"]["DATABASE_URL"] == "postgres://u:***@db.internal/app" for m in deploys)
    assert all(c["headers"]["Authorization"] == MASK for m in deploys for c in m["health"]["checks"]
               if c.get("headers"))


@pytest.mark.parametrize("verbosity", [(), ("-vv",)])
def test_a_hostile_log_tail_reaches_no_terminal_or_log_raw(sandbox: Sandbox, verbosity: tuple[str, ...]) -> None:
    sandbox.start_by_hand()
    hostile = playbook(sandbox, "hostile.yaml", extra_env=(
        ', STANDIN_CRASH_AT_START: "1", STANDIN_SAY: "\\e]0;pwned\\a\\e[2J\\e[32mgpu: changed [bold]release ok[/]"'))
    proc = sandbox.orch("deploy", *verbosity, "--host", "gpu", "--var", f"hub_access={SECRET}", hostile)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\x1b[32mgpu: changed [bold]release ok[/]" in proc.stderr  # shown, escaped
    assert "\x1b" not in proc.stdout + proc.stderr and "\x07" not in proc.stdout + proc.stderr
    assert_no_secret(proc, "a hostile deploy")
    logs = [p.read_text() for p in sandbox.state_dir.glob("releases/*/run.log")]
    assert any("\\x1b]0;pwned" in log for log in logs)
    assert not any("\x1b" in log for log in logs)


def run_in_terminal(box: Sandbox, *args: str, columns: int) -> tuple[int, bytes]:
    """``orch ARGS`` under a pseudo-terminal (Rich's terminal path: ``Syntax``, panels,
    folding); the raw bytes it wrote."""
    from tests.test_cli import run_in_pty_raw

    return run_in_pty_raw(box, *args, columns=columns)


def test_on_a_terminal_folded_views_and_panels_hold_no_secret_and_no_host_escape(sandbox: Sandbox) -> None:
    sandbox.start_by_hand()
    var = ("--var", f"hub_access={SECRET}")
    # 30 columns: the inserted line, the diff and the log tail are folded by Rich
    code, raw = run_in_terminal(sandbox, "deploy", "--check", "--diff", "--host", "gpu", *var,
                                playbook(sandbox, "good.yaml"), columns=30)
    assert code == 0, raw.decode(errors="replace")
    assert b"\x1b[" in raw  # a terminal's layout: Rich's own colours are there
    for secret in SECRETS:
        assert secret.encode() not in raw, raw.decode(errors="replace")
    assert b"***" in raw

    hostile = playbook(sandbox, "hostile.yaml", extra_env=(
        ', STANDIN_CRASH_AT_START: "1", STANDIN_SAY: "\\e]0;pwned\\a\\e[2J\\e[32mgpu: changed"'))
    code, raw = run_in_terminal(sandbox, "deploy", "--host", "gpu", *var, hostile, columns=100)
    assert code == 1, raw.decode(errors="replace")
    assert b"pwned" in raw  # the log tail was shown …
    assert b"\x1b]0;pwned" not in raw and b"\x1b[2J" not in raw and b"\x07" not in raw  # … never raw
    assert b"\\x1b]0;pwned\\x07\\x1b[2J\\x1b[32mgpu: changed" in raw
    for secret in SECRETS:
        assert secret.encode() not in raw, raw.decode(errors="replace")
