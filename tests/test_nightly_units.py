"""The pure parts of ``orch nightly``: the spec's errors, the probe's figures, the
stand-in's speed model, the crontab edits, what changed between two nights, and what
rolling nights back restores.
No host, except one live stand-in for the probe's two APIs and the greedy text.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.cli.restore_words import describe_restore
from orchestrator.core.nightly import (
    FileRecord,
    InputRecord,
    NightManifest,
    ServerRecord,
    SourceRecord,
    builds_to_prune,
    manifest_changes,
    parse_nightly,
    parse_requirements,
    probe_changes,
    relative_to_build,
)
from orchestrator.core.probe import (
    ProbeConfig,
    ProbeResult,
    Sample,
    figures,
    greedy_body,
    percentile,
    probe_result,
    response_text,
)
from orchestrator.core.releases import (
    LinkState,
    describe_release,
    prune_candidates,
    rollback_target,
)
from orchestrator.core.restore import RestoreRecord
from orchestrator.core.schedule import (
    add_entry,
    check_schedule,
    cron_command,
    list_entries,
    remove_entry,
)
from orchestrator.errors import ConfigError
from orchestrator.host.records import Manifest
from orchestrator.standin import TREE, launch_argv, launch_env, make_tree
from tests.fixtures.sandbox import wait_healthy
from tests.fixtures.sshd import free_port

COMMIT = "3f2a1b2c" * 5

SPEC = f"""\
name: n
source:
  git: {{repo: /srv/sglang.git, commit: {COMMIT}}}
builds_dir: /opt/builds
stack: [speculative-disable.yaml]
server:
  command: python3 -m sglang.launch_server --port 30000
health:
  base_url: http://127.0.0.1:30000
  checks: [{{get: /health}}]
probe: {{post: /generate, json: {{text: hi}}, requests: 8, concurrency: 2}}
"""


def spec_error(text: str) -> str:
    with pytest.raises(ConfigError) as got:
        parse_nightly(text, "nightly.yaml")
    return str(got.value)


# ------------------------------------------------------------------ the spec


def test_a_pinned_spec_parses() -> None:
    spec = parse_nightly(SPEC, "nightly.yaml")
    assert spec.source.git is not None and spec.source.git.commit == COMMIT
    assert spec.keep_builds == 5 and spec.probe is not None and spec.probe.concurrency == 2


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (f"commit: {COMMIT}", "commit: main",
         "nightly.yaml:3: source.git.commit: a full 40-hex commit id (got: 'main')"),
        (f"commit: {COMMIT}", "commit: 3f2a1b2",
         "nightly.yaml:3: source.git.commit: a full 40-hex commit id (got: '3f2a1b2')"),
        ("  git: {", "  pip: {requirements: r.txt}\n  git: {",
         "nightly.yaml:2: source: expected exactly one of git, pip (got: git, pip)"),
        ("stack:", "stak:", "nightly.yaml:5: stak: extra key not permitted (did you mean 'stack'?)"),
        ("builds_dir: /opt/builds", "builds_dir: builds",
         "nightly.yaml:4: builds_dir: an absolute path on the host (got: 'builds')"),
        ("server:\n", "keep_builds: 1\nserver:\n", "nightly.yaml:6: keep_builds: must be >= 2 (got: 1)"),
        ("concurrency: 2", "concurrency: 0", "nightly.yaml:11: probe.concurrency: must be >= 1 (got: 0)"),
        ("  command: python3 -m sglang.launch_server --port 30000\n", "  flags: {--x: 1}\n",
         "nightly.yaml:6: server: command is required"),
        ("server:\n", "server:\n  manager: commands\n  start: a\n  stop: b\n  pid: c\n",
         "nightly.yaml:7: server.manager: a nightly switches servers with the process manager"),
    ],
)
def test_spec_errors_name_file_line_and_key(old: str, new: str, expected: str) -> None:
    assert old in SPEC
    assert spec_error(SPEC.replace(old, new, 1)).startswith(expected)


def test_requirements_must_all_be_pinned_with_sha256_hashes() -> None:
    good = "a" * 64
    pins = parse_requirements(
        f"# locked\nfoo==1.0 \\\n    --hash=sha256:{good} \\\n    --hash=sha256:{'b' * 64}\n"
        f"Bar_Baz[extra]==2.1 ; python_version >= '3.8' --hash=sha256:{good}\n", "req.txt")
    assert [(p.name, p.version, len(p.hashes), p.line) for p in pins] == [
        ("foo", "1.0", 2, 2), ("Bar_Baz", "2.1", 1, 5)]
    cases = {
        f"foo>=1.0 --hash=sha256:{good}\n": "req.txt:1: source.pip.requirements: not pinned exactly: 'foo>=1.0'",
        "ok==1 --hash=sha256:" + good + "\nfoo==1.0\n": "req.txt:2: source.pip.requirements: foo==1.0 has no --hash",
        "foo==1.* --hash=sha256:" + good + "\n": "req.txt:1: source.pip.requirements: not pinned exactly",
        "-e ./src\n": "req.txt:1: source.pip.requirements: only pinned requirements are allowed",
        "foo==1 --hash=md5:abc\n": "req.txt:1: source.pip.requirements: foo: only sha256 hashes",
        f"foo==1 --hash=sha256:{good}\nFOO==2 --hash=sha256:{good}\n": "req.txt:2: source.pip.requirements: FOO is pinned twice",
        "# nothing\n": "req.txt: source.pip.requirements: no requirements",
    }
    for text, expected in cases.items():
        with pytest.raises(ConfigError) as got:
            parse_requirements(text, "req.txt")
        assert str(got.value).startswith(expected), (text, str(got.value))


def test_an_unpinned_requirements_file_is_refused_with_its_own_line(tmp_path: Path) -> None:
    from orchestrator.shell.nightly_files import load_nightly

    (tmp_path / "req.txt").write_text("torch==2.1.0 --hash=sha256:" + "c" * 64 + "\nnumpy\n")
    spec = SPEC.replace(f"git: {{repo: /srv/sglang.git, commit: {COMMIT}}}", "pip: {requirements: req.txt}")
    spec = spec.replace("stack: [speculative-disable.yaml]", "stack: []")
    (tmp_path / "nightly.yaml").write_text(spec)
    with pytest.raises(ConfigError) as got:
        load_nightly(tmp_path / "nightly.yaml")
    assert str(got.value).endswith("req.txt:2: source.pip.requirements: not pinned exactly: 'numpy'; "
                                   "write name==version --hash=sha256:…")


# ----------------------------------------------------------------- the probe


def test_percentile_interpolates_between_ranks() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([7.0], 99) == 7.0


def test_figures_count_tokens_from_usage_or_meta_info_and_errors_apart() -> None:
    samples = [
        Sample.from_wire({"latency": 0.1, "status": 200, "tokens": {"usage": {"completion_tokens": 10}}}),
        Sample.from_wire({"latency": 0.3, "status": 200,
                          "tokens": {"meta_info": [{"completion_tokens": 6}, {"completion_tokens": 4}]}}),
        Sample.from_wire({"latency": 5.0, "status": 500, "error": "HTTP 500", "tokens": None}),
        Sample.from_wire({"latency": 9.0, "status": None, "error": "timed out", "tokens": None}),
    ]
    got = figures(samples, concurrency=2, duration_s=2.0)
    assert (got.requests, got.ok, got.errors, got.first_error) == (4, 2, 2, "HTTP 500")
    assert got.requests_per_s == 1.0 and got.output_tokens_per_s == 10.0
    assert got.p50_ms == pytest.approx(200.0) and got.p99_ms == pytest.approx(298.0)


def test_greedy_request_sets_temperature_zero_in_each_apis_form() -> None:
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 4, "temperature": 0.7}}
    assert greedy_body("/generate", body)["sampling_params"] == {"max_new_tokens": 4, "temperature": 0}
    assert body["sampling_params"]["temperature"] == 0.7  # the probe's own body is left alone
    assert greedy_body("/v1/completions", {"prompt": "hi"}) == {"prompt": "hi", "temperature": 0}
    assert response_text("/generate", {"text": "abc", "meta_info": {}}) == "abc"
    assert response_text("/generate", [{"text": "first"}, {"text": "second"}]) == "first"
    assert response_text("/v1/completions", {"choices": [{"text": "x"}]}) == "x"
    assert response_text("/v1/chat/completions", {"choices": [{"message": {"content": "y"}}]}) == "y"
    assert response_text("/generate", {"error": "no"}) is None


def test_probe_result_gives_median_and_spread_over_rounds_and_round_trips_as_json() -> None:
    def answer(tokens: int, latency: float, greedy: str | None = None) -> dict:
        samples = [{"latency": latency, "status": 200, "tokens": {"usage": {"completion_tokens": tokens}}}] * 4
        return {"samples": samples, "duration": 1.0,
                "greedy": {"doc": {"text": greedy}, "status": 200, "error": None} if greedy else None}

    result = probe_result("/generate", 4, [answer(10, 0.1, "hello"), answer(12, 0.2), answer(11, 0.3)])
    assert result.median("output_tokens_per_s") == 44.0
    assert result.spread("output_tokens_per_s") == pytest.approx(8 / 44, abs=1e-3)
    assert result.greedy_sha256 == "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    assert ProbeResult.from_json(result.to_json()) == result
    failed = probe_result("/generate", 4, [{"samples": [], "duration": 1.0,
                                            "greedy": {"doc": None, "status": None, "error": "refused"}}])
    assert failed.greedy_sha256 is None and failed.greedy_error == "refused"


# ------------------------------------------------------- the stand-in's speed


@pytest.fixture
def speed() -> Iterator[object]:
    sys.path.insert(0, str(TREE / "python"))
    try:
        yield importlib.import_module("sglang.srt.standin_speed")
    finally:
        sys.path.remove(str(TREE / "python"))


def test_speculation_is_slower_at_concurrency_32_and_the_threshold_recovers_it(speed: object) -> None:
    model = speed.SpeedModel()  # type: ignore[attr-defined]
    plain = model.steady_tokens_per_s(32, speculation=False)
    speculating = model.steady_tokens_per_s(32, speculation=True)
    assert speculating < 0.6 * plain  # clearly slower with speculation at high concurrency
    assert model.steady_tokens_per_s(1, speculation=True) > 1.5 * model.steady_tokens_per_s(1, speculation=False)
    assert model.steady_tokens_per_s(32, speculation=True, threshold=16) == plain  # recovered above N
    assert model.steady_tokens_per_s(8, speculation=True, threshold=16) == model.steady_tokens_per_s(8, True)
    assert model.steady_tokens_per_s(32, speculation=True, threshold=64) == speculating
    # the story's figures: ~354 tok/s with speculation against ~773 without, at a full batch
    assert model.steady_tokens_per_s(64, True) == pytest.approx(354, rel=0.05)
    assert model.steady_tokens_per_s(64, False) == pytest.approx(773, rel=0.05)


def test_the_slowdown_switch_divides_every_figure(speed: object) -> None:
    normal = speed.SpeedModel()  # type: ignore[attr-defined]
    slow = speed.SpeedModel(slowdown=speed.slowdown_factor({"STANDIN_SLOWDOWN": "2"}))  # type: ignore[attr-defined]
    for concurrency in (1, 8, 32):
        for spec in (False, True):
            assert slow.steady_tokens_per_s(concurrency, spec) == pytest.approx(
                normal.steady_tokens_per_s(concurrency, spec) / 2)
    assert speed.slowdown_factor({"STANDIN_SLOWDOWN": "nonsense"}) == 1.0  # type: ignore[attr-defined]


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[object]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(*extra: str, env: dict[str, str] | None = None) -> int:
        port = free_port()
        make_tree(tmp_path / "tree")
        full = dict(os.environ, **launch_env(tmp_path / "tree"), STANDIN_STARTUP_DELAY="0", **(env or {}))
        procs.append(subprocess.Popen(launch_argv(sys.executable, tmp_path / "tree", port=port, extra=extra),
                                      env=full, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_healthy(port)
        return port

    yield start
    for p in procs:
        p.terminate()
        p.wait(10)


def post(port: int, path: str, body: dict) -> dict:
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def test_greedy_text_is_a_function_of_the_prompt_and_the_salt_switch_changes_it(standin: object) -> None:
    port = standin("--speculative-algorithm", "EAGLE")  # type: ignore[operator]
    greedy = {"text": "same prompt", "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    first, again = post(port, "/generate", greedy), post(port, "/generate", greedy)
    assert first["text"] == again["text"] and first["meta_info"]["completion_tokens"] == 6
    other = post(port, "/generate", {**greedy, "text": "another prompt"})
    assert other["text"] != first["text"]
    openai = post(port, "/v1/completions", {"prompt": "same prompt", "max_tokens": 6, "temperature": 0})
    assert openai["choices"][0]["text"] == first["text"]  # same decoding behind both APIs
    salted = standin(env={"STANDIN_GREEDY_SALT": "patched"})  # type: ignore[operator]
    assert post(salted, "/generate", greedy)["text"] != first["text"]


def test_probe_runs_from_the_host_helper_on_both_apis(standin: object, tmp_path: Path) -> None:
    from orchestrator.core.probe import ProbeConfig, ProbeResult  # noqa: F401 - the helper's return type
    from orchestrator.core.target import HostTarget
    from orchestrator.pipeline.probe import probe_ops, read_probe
    from orchestrator.pipeline.session import HostSession

    def run_probe(session: HostSession, base_url: str, config: ProbeConfig) -> ProbeResult:
        rounds = probe_ops(base_url, config)
        return read_probe(config, session.batch(rounds).each(rounds))

    port = standin()  # type: ignore[operator]
    target = HostTarget(name="here", connection="local", state_dir=str(tmp_path / "state"), python=sys.executable)
    generate = ProbeConfig.model_validate({"post": "/generate", "requests": 6, "concurrency": 3, "rounds": 2,
                                           "json": {"text": "p", "sampling_params": {"max_new_tokens": 2}}})
    completions = ProbeConfig.model_validate({"post": "/v1/completions", "requests": 4, "concurrency": 2,
                                              "json": {"prompt": "p", "max_tokens": 2}})
    missing = ProbeConfig.model_validate({"post": "/nowhere", "requests": 2, "concurrency": 2, "greedy": False})
    with HostSession(target) as session:
        one = run_probe(session, f"http://127.0.0.1:{port}", generate)
        two = run_probe(session, f"http://127.0.0.1:{port}", completions)
        bad = run_probe(session, f"http://127.0.0.1:{port}", missing)
    assert len(one.rounds) == 2 and all(r.ok == 6 and r.errors == 0 for r in one.rounds)
    assert one.median("output_tokens_per_s") and one.median("p99_ms")
    assert two.rounds[0].ok == 4 and two.rounds[0].output_tokens_per_s
    assert one.greedy_sha256 == two.greedy_sha256 is not None  # prompt "p", temperature 0, either API
    assert bad.errors == 2 and bad.rounds[0].first_error == "HTTP 404" and bad.greedy_sha256 is None


# ------------------------------------------------------------------- crontab


def test_crontab_entries_leave_every_other_line_byte_for_byte() -> None:
    mine = "# mine\nMAILTO=\"\"\n0  4 * * *   /bin/true  # odd  spacing\n\n@reboot /x\n"
    one = add_entry(mine, "host=a spec=/s.yaml", "0 2 * * *", "cd /w && orch nightly")
    two = add_entry(one, "host=b spec=/s.yaml", "@daily", "cd /w && orch nightly --host b")
    assert two.startswith(mine)
    assert [(e.key, e.schedule, e.command) for e in list_entries(two)] == [
        ("host=a spec=/s.yaml", "0 2 * * *", "cd /w && orch nightly"),
        ("host=b spec=/s.yaml", "@daily", "cd /w && orch nightly --host b")]
    assert add_entry(two, "host=a spec=/s.yaml", "0 3 * * *", "x").count("host=a") == 1  # replaced
    back, found = remove_entry(remove_entry(two, "host=b spec=/s.yaml")[0], "host=a spec=/s.yaml")
    assert found and back == mine
    assert remove_entry(mine, "nothing")[1] is False


def test_cron_command_quotes_words_and_escapes_percent() -> None:
    line = cron_command(["/v/bin/python", "-m", "orchestrator", "nightly", "/a b/spec.yaml"], "/w", "/r/cron.log")
    assert line == "cd /w && /v/bin/python -m orchestrator nightly '/a b/spec.yaml' >> /r/cron.log 2>&1"
    assert cron_command(["echo", "50%"], "/w", "/l") == "cd /w && echo 50\\% >> /l 2>&1"  # cron: \\% is %
    assert check_schedule(" 0  2 * * * ") == "0 2 * * *" and check_schedule("@daily") == "@daily"
    with pytest.raises(ConfigError, match="--schedule: not a cron schedule: '61 2 \\* \\* \\*'"):
        check_schedule("61 2 * * *")


# ------------------------------------------------------ manifests and builds


def manifest(build: str, commit: str = COMMIT, template: str = "t1", after: str = "b" * 64) -> NightManifest:
    return NightManifest(
        spec="n", host="gpu",
        inputs=[InputRecord(kind="spec", name="n", sha256="s" * 64),
                InputRecord(kind="template", name="sglang/field.py.j2", sha256=template * 32)],
        source=SourceRecord(kind="git", repo="/srv/x.git", commit=commit),
        files=[FileRecord(path="python/sglang/srt/server_args.py", sha256_before="a" * 64, sha256_after=after)],
        server=ServerRecord(argv=["python3", "-m", "sglang.launch_server"], cwd="/opt/builds/current"),
        orch_version="0.1.0", host_python="3.11.7", build=build, started=float(len(build)),
        probe={"summary": {"output_tokens_per_s": 100.0, "p99_ms": 50.0}},
    )


def test_two_nights_compare_equal_but_for_what_varies_and_changes_are_named() -> None:
    one, two = manifest("20260101T020000000-3f2a1b2"), manifest("20260102T020000000-3f2a1b2")
    assert one.comparable() == two.comparable() and one != two
    three = manifest("n3", commit="9" * 40, template="t2", after="c" * 64)
    texts = [c.text for c in manifest_changes(two, three)]
    assert f"commit {COMMIT} -> {'9' * 40}" in texts
    assert any(t.startswith("template sglang/field.py.j2 changed") for t in texts)
    assert any(t.startswith("python/sglang/srt/server_args.py: sha256") for t in texts)
    assert manifest_changes(one, two) == []
    figures_ = {f.name: f.percent for f in probe_changes(
        {"summary": {"output_tokens_per_s": 100.0}}, {"summary": {"output_tokens_per_s": 150.0}})}
    assert figures_ == {"output_tokens_per_s": 50.0}


def test_relative_to_build_and_pruning_never_current_or_previous() -> None:
    build = "/opt/builds/20260101T0200-abc"
    assert relative_to_build({"PYTHONPATH": f"{build}/python", "x": [build]}, build) == {
        "PYTHONPATH": "{{ build }}/python", "x": ["{{ build }}"]}
    names = [f"2026010{i}T0200-abc" for i in range(1, 8)]
    assert builds_to_prune(names, names[-1], names[-2], keep=3) == names[:4]
    assert builds_to_prune(names, names[-1], names[0], keep=2) == names[1:-1]  # previous good kept
    assert builds_to_prune(names[:2], names[1], None, keep=5) == []


def night_record(rid: str, before: str | None, **fields: object) -> Manifest:
    return Manifest.from_wire({"id": rid, "kind": "night", "outcome": "deployed", "files": [], "restarted": True,
                               "link": {"path": "/opt/builds/current", "before": before, "after": rid},
                               "server_before": {"argv": ["python3", "-m", "x"]}, **fields})


def test_rolling_back_nights_switches_current_back_one_night_at_a_time() -> None:
    releases = {"n1": night_record("n1", None), "n2": night_record("n2", "n1"), "n3": night_record("n3", "n2")}
    one = rollback_target(["n1", "n2", "n3"], releases, "/s/releases")
    assert one.undo == ("n3",) and one.new_applied == ("n1", "n2") and one.files == () and one.restart
    assert one.links == (LinkState("/opt/builds/current", "n2", "n3"),)
    two = rollback_target(["n1", "n2", "n3"], releases, "/s/releases", to="n1")
    assert two.links == (LinkState("/opt/builds/current", "n1", "n3"),)  # the oldest undone's before wins
    first = rollback_target(["n1"], releases, "/s/releases")
    assert first.links == (LinkState("/opt/builds/current", None, "n1"),)  # no link before the first night
    # a deploy on top of a night: its files, and the night's link, in one target
    deploy = Manifest.from_wire({
        "id": "d4", "kind": "deploy", "outcome": "deployed", "restarted": False,
        "files": [{"path": "/opt/builds/current/x.py", "n": 0, "sha256_before": "a", "sha256_after": "b"}]})
    both = rollback_target(["n1", "n2", "d4"], {**releases, "d4": deploy}, "/s/releases", to="n1")
    assert [f.path for f in both.files] == ["/opt/builds/current/x.py"]
    assert both.links == (LinkState("/opt/builds/current", "n1", "n2"),)


def test_pruning_releases_never_removes_a_night_a_rollback_needs() -> None:
    nights = [f"2026010{i}T020000000-abc" for i in range(1, 6)]
    failed = "20260103T030000000-abc"  # a night switched back: never in effect
    assert prune_candidates(sorted([*nights, failed]), nights, keep=2) == [failed]  # a soft cap
    undone = [nights[2], failed, nights[3], nights[4]]  # rolled back by `orch rollback`: no longer needed
    assert prune_candidates(sorted([*nights, failed]), nights[:2], keep=2) == undone


def test_nights_are_described_in_their_own_words() -> None:
    assert describe_release(night_record("n2", "n1"), ["n1", "n2"]) == "current"
    assert describe_release(night_record("n1", None), ["n1", "n2"]) == "good"
    assert describe_release(night_record("n1", None, undone_by="r9"), []) == "undone by r9"
    assert describe_release(night_record("n3", "n2", outcome="rolled_back", restored_by="controller"), []) == \
        "switched back"
    assert describe_release(night_record("n3", "n2", outcome="rolled_back", restored_by="watchdog"), []) == \
        "switched back (watchdog)"
    assert describe_release(night_record("n3", "n2", outcome="failed"), []) == "failed"


def test_a_restore_record_names_the_link_it_switched_back() -> None:
    record = RestoreRecord.from_wire({
        "by": "watchdog", "ok": True, "completed": True, "files": [],
        "links": [{"path": "/b/current", "target": "n1", "action": "restored", "was": "n2"}],
        "server": {"action": "restarted", "pid": 7}, "health": {"elapsed": 1.0}})
    assert record.changed_anything
    assert describe_restore(record) == ("/b/current points at n1 again; the previous server was restarted (pid 7) "
                                 "and is healthy")
    removed = RestoreRecord.from_wire({"by": "controller", "ok": True, "completed": True, "files": [],
                                       "links": [{"path": "/b/current", "target": None, "action": "removed",
                                                  "was": "n1"}]})
    assert describe_restore(removed) == "/b/current removed (there was none before)"


def test_the_probe_is_bounded_for_the_watchdogs_deadline() -> None:
    from orchestrator.core.budget import probe_seconds

    config = ProbeConfig.model_validate({"post": "/generate", "requests": 16, "concurrency": 8, "timeout": "5s"})
    assert probe_seconds(config) == 5 + 5 * (16 // 8 + 2)  # the greedy request, then one batch
    more = config.model_copy(update={"rounds": 3, "warmup": 8, "greedy": False})
    assert probe_seconds(more) == 5 * (8 // 8 + 2) + 3 * 5 * (16 // 8 + 2)


def test_half_made_builds_never_count_toward_keep_builds_and_go_first() -> None:
    """Issue 16.8: ``complete`` names the confirmed builds; the others hold nothing to switch to."""
    builds = ["b1", "b2", "h3", "b4"]
    # before: the half-made h3 counted, and the good b1 went in its place
    assert builds_to_prune(builds, "b4", "b2", keep=3) == ["b1"]
    assert builds_to_prune(builds, "b4", "b2", keep=3, complete=["b1", "b2", "b4"]) == ["h3"]
    assert builds_to_prune(builds, "b4", "b2", keep=2, complete=["b1", "b2", "b4"]) == ["h3", "b1"]
    # current and the previous one are never pruned, whatever a record says
    assert builds_to_prune(builds, "b4", "h3", keep=1, complete=["b1", "b2", "b4"]) == ["b1", "b2"]
