"""Command lines as words: splitting before rendering, one word per value, flag editing."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.core.cmdline import (
    apply_flags,
    flag_change_fields,
    flag_change_from_line,
    flag_changes,
    is_option,
    parse_flags,
    quote_argv,
    render_words,
    split_words,
)
from orchestrator.core.templating import Renderer
from orchestrator.errors import ConfigError, TemplateError

R = Renderer()


# ------------------------------------------------------------- split / render


def test_split_words_keeps_jinja_spans_together() -> None:
    assert split_words("{{ python }} -m x --model-path {{ model }}") == [
        "{{ python }}",
        "-m",
        "x",
        "--model-path",
        "{{ model }}",
    ]
    assert split_words('run {{ x | default("a b") }} --n {{ n  +  1 }}') == [
        "run",
        '{{ x | default("a b") }}',
        "--n",
        "{{ n  +  1 }}",
    ]
    assert split_words("a{{ b }}c 'd {{ e }}' {% if f %}g h{% endif %}") == [
        "a{{ b }}c",
        "d {{ e }}",
        "{% if f %}g",  # words render one by one: a block cannot span two words
        "h{% endif %}",
    ]


def test_split_words_like_a_shell() -> None:
    assert split_words("sh -c 'echo a; echo b' \"x y\" z\\ w") == [
        "sh",
        "-c",
        "echo a; echo b",
        "x y",
        "z w",
    ]
    with pytest.raises(ConfigError, match="No closing quotation"):
        split_words("run 'x")


@pytest.mark.parametrize(
    "value", ["a; rm -rf /", "$(id)", "`id`", "x y z", "a\nb", "'\"", "&&", "*"]
)
def test_render_words_keeps_each_value_one_word(value: str) -> None:
    argv = render_words("echo {{ v }} --flag={{ v }} end", {"v": value}, R)
    assert argv == ["echo", value, f"--flag={value}", "end"]


def test_rendered_values_reach_a_real_process_as_single_arguments() -> None:
    argv = render_words(
        "{{ py }} -c 'import sys, json; print(json.dumps(sys.argv[1:]))' {{ a }} {{ b }}",
        {"py": sys.executable, "a": "x; touch /tmp/orch-pwned", "b": "$(id)"},
        R,
    )
    # through a shell, quoted: the shell must not interpret anything
    out = subprocess.run(["sh", "-c", quote_argv(argv)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == '["x; touch /tmp/orch-pwned", "$(id)"]'


def test_render_words_errors_are_located() -> None:
    with pytest.raises(TemplateError) as info:
        render_words("run {{ nope }}", {}, R, file="p.yaml", line=4, key="server.command")
    assert str(info.value) == "p.yaml:4: server.command: 'nope' is undefined"
    with pytest.raises(ConfigError) as err:
        render_words("run 'x", {}, R, file="p.yaml", line=4, key="server.command")
    assert str(err.value) == (
        "p.yaml:4: server.command: cannot split command into words: No closing quotation"
    )
    with pytest.raises(ConfigError, match="^p.yaml:2: k: command is empty$"):
        render_words("   ", {}, R, file="p.yaml", line=2, key="k")


def test_quote_argv_round_trips() -> None:
    argv = ["a b", "c;d", "$(e)", "", "'"]
    assert shlex.split(quote_argv(argv)) == argv


# --------------------------------------------------------------- apply_flags

BASE = [
    "python",
    "-m",
    "sglang.launch_server",
    "--model-path",
    "/m",
    "--tp",
    "8",
    "--port",
    "30000",
]


def test_new_flag_is_appended() -> None:
    assert apply_flags(BASE, {"--threshold": 32}) == [*BASE, "--threshold", "32"]


def test_replace_value_in_place() -> None:
    assert apply_flags(BASE, {"--tp": 4}) == [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/m",
        "--tp",
        "4",
        "--port",
        "30000",
    ]


def test_replace_equals_form() -> None:
    argv = ["srv", "--a=1", "--b", "2"]
    assert apply_flags(argv, {"--a": "x"}) == ["srv", "--a", "x", "--b", "2"]
    assert apply_flags(argv, {"--a": None}) == ["srv", "--b", "2"]
    # in place, `--a x` would swallow the positional `model`: replaced at the end instead
    assert apply_flags(["srv", "--a=1", "model"], {"--a": "x"}) == ["srv", "model", "--a", "x"]


def test_bare_true_and_removal() -> None:
    assert apply_flags(BASE, {"--enable-x": True})[-1] == "--enable-x"
    assert apply_flags(["s", "--x", "--y", "1"], {"--x": False}) == ["s", "--y", "1"]
    assert apply_flags(["s", "--tp", "8", "--y"], {"--tp": None}) == ["s", "--y"]
    assert apply_flags(["s", "--x", "old", "--y"], {"--x": True}) == ["s", "--x", "--y"]


def test_list_values() -> None:
    argv = ["s", "--ids", "1", "2", "3", "--y", "v"]
    assert apply_flags(argv, {"--ids": ["a", 4, 0.5]}) == [
        "s",
        "--ids",
        "a",
        "4",
        "0.5",
        "--y",
        "v",
    ]
    assert apply_flags(["s"], {"--ids": []}) == ["s", "--ids"]


def test_negative_numbers_are_values_short_options_are_not() -> None:
    argv = ["s", "--chunk", "-1", "-0.5", "-v", "--z"]
    assert parse_flags(argv) == {"--chunk": ["-1", "-0.5"], "-v": [], "--z": []}
    assert apply_flags(argv, {"--chunk": 512}) == ["s", "--chunk", "512", "-v", "--z"]


def test_duplicates_collapse_into_the_first_position() -> None:
    argv = ["s", "--a", "1", "--b", "--a=2", "--c"]
    assert apply_flags(argv, {"--a": 3}) == ["s", "--a", "3", "--b", "--c"]


def test_program_word_is_never_touched() -> None:
    assert apply_flags(["--a", "--a", "1"], {"--a": None}) == ["--a"]


def test_prefix_of_another_flag_is_not_matched() -> None:
    argv = ["s", "--tp-size", "8", "--tp=2"]
    assert apply_flags(argv, {"--tp": 4}) == ["s", "--tp-size", "8", "--tp", "4"]


def test_flag_changes_summary() -> None:
    before = [*BASE, "--old", "x"]
    after = apply_flags(
        before,
        {"--speculative-disable-batch-threshold": 32, "--tp": 4, "--old": None, "--on": True},
    )
    assert flag_changes(before, after) == [
        "--tp: 8 -> 4",
        "--speculative-disable-batch-threshold: (absent) -> 32",
        "--on: (absent) -> (on)",
        "--old: x -> (absent)",
    ]
    assert flag_changes(BASE, BASE) == []
    assert flag_changes(["a", "serve"], ["b", "serve"]) == ["command: a serve -> b serve"]


def test_flag_change_fields_are_the_summary_as_fields() -> None:
    """``--json``'s ``flag_changes``: one object per line of the summary, a value or null."""
    before = [*BASE, "--old", "x"]
    after = apply_flags(
        before,
        {"--speculative-disable-batch-threshold": 32, "--tp": 4, "--old": None, "--on": True},
    )
    assert flag_change_fields(before, after) == [
        {"flag": "--tp", "from": "8", "to": "4"},
        {"flag": "--speculative-disable-batch-threshold", "from": None, "to": "32"},
        {"flag": "--on", "from": None, "to": True},
        {"flag": "--old", "from": "x", "to": None},
    ]
    assert len(flag_change_fields(before, after)) == len(flag_changes(before, after))
    assert flag_change_fields(BASE, BASE) == []
    assert flag_change_fields([], after) == []  # nothing ran: nothing to compare with
    assert flag_change_fields(["a", "serve"], ["b", "serve"]) == [
        {"flag": "command", "from": "a serve", "to": "b serve"}]
    # a host's records keep the lines: read back, they are the same fields
    assert [flag_change_from_line(line) for line in flag_changes(before, after)] == \
        flag_change_fields(before, after)


# ------------------------------------------------------------ properties

NAMES = st.sampled_from(["--a", "--b", "--tp", "--long-name", "-x"])
WORD = st.one_of(
    st.text(alphabet="abcz019./=", min_size=1, max_size=6),
    st.integers(-50, 50).map(str),
)
VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-100, 100),
    WORD,
    st.lists(st.one_of(st.integers(-9, 9), WORD), max_size=3),
)
ARGV = st.lists(st.one_of(NAMES, WORD, NAMES.map(lambda n: n + "=v")), max_size=10).map(
    lambda words: ["prog", *words]
)
FLAGS = st.dictionaries(st.sampled_from(["--a", "--b", "--tp", "--long-name"]), VALUE, max_size=3)


def _expected_words(value: object) -> list[str] | None:
    if value is None or value is False:
        return None
    if value is True:
        return []
    if isinstance(value, list):
        return [str(v) for v in value]
    return [str(value)]


@given(ARGV, FLAGS)
def test_apply_flags_is_idempotent(argv: list[str], flags: dict) -> None:
    once = apply_flags(argv, flags)
    assert apply_flags(once, flags) == once


@given(ARGV, FLAGS)
def test_apply_flags_sets_exactly_what_was_asked(argv: list[str], flags: dict) -> None:
    result = apply_flags(argv, flags)
    assert result[0] == "prog"
    parsed = parse_flags(result)
    for name, value in flags.items():
        expected = _expected_words(value)
        if expected is None:
            assert name not in parsed
            assert not any(w == name or w.startswith(name + "=") for w in result[1:])
        else:
            assert sum(w == name or w.startswith(name + "=") for w in result[1:]) == 1
            if all(not w.startswith("-") or w.lstrip("-")[:1].isdigit() for w in expected):
                assert parsed[name] == expected


def _without(argv: list[str], names: set[str]) -> list[str]:
    """``argv`` minus every occurrence of ``names`` and the values parsed for it."""
    out, index = argv[:1], 1
    while index < len(argv):
        word = argv[index]
        if any(word.startswith(n + "=") for n in names):
            index += 1
        elif word in names:
            index += 1
            while index < len(argv) and not is_option(argv[index]):
                index += 1
        else:
            out.append(word)
            index += 1
    return out


@given(ARGV, FLAGS)
def test_apply_flags_leaves_every_other_word_alone(argv: list[str], flags: dict) -> None:
    names = set(flags)
    assert _without(apply_flags(argv, flags), names) == _without(argv, names)
