"""The Jinja2 sandbox: strict variables, one-line errors with locations, no escapes."""

from __future__ import annotations

import threading

import pytest

from orchestrator.core.templating import Renderer
from orchestrator.errors import TemplateError
from tests.fixtures.at_once import ask_at_once

FILES = {
    "sglang/field.py.j2": "speculative_disable_batch_threshold: int = {{ threshold }}\n",
    "undefined.j2": "line one\nline two {{ threshold }}\n",
    "broken.j2": "ok\n{% for x in %}\n{% endfor %}\n",
    "includes.j2": "{% include 'sglang/field.py.j2' %}",
    "includes-missing.j2": "{% include 'gone.j2' %}",
    "escape.j2": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
}


@pytest.fixture
def renderer() -> Renderer:
    return Renderer(FILES.get, searched=["playbooks", "templates", "/pkg/templates"])


def message(exc_info: pytest.ExceptionInfo[TemplateError]) -> str:
    text = str(exc_info.value)
    assert "\n" not in text
    return text


def test_renders_template_and_keeps_trailing_newline(renderer: Renderer) -> None:
    out = renderer.render_template("sglang/field.py.j2", {"threshold": 32}, file="p.yaml", line=3)
    assert out == "speculative_disable_batch_threshold: int = 32\n"
    assert renderer.render_template("includes.j2", {"threshold": 1}) == (
        "speculative_disable_batch_threshold: int = 1\n"
    )


def test_no_autoescape(renderer: Renderer) -> None:
    assert renderer.render_string("{{ s }}", {"s": "<a & 'b'>"}) == "<a & 'b'>"


def test_undefined_variable_in_template_file(renderer: Renderer) -> None:
    with pytest.raises(TemplateError) as info:
        renderer.render_template(
            "undefined.j2", {}, file="playbooks/x.yaml", line=14, key="files[0].edits[1].insert"
        )
    assert message(info) == (
        "playbooks/x.yaml:14: files[0].edits[1].insert: 'threshold' is undefined "
        "(in template undefined.j2 line 2)"
    )


def test_undefined_variable_inline(renderer: Renderer) -> None:
    with pytest.raises(TemplateError) as info:
        renderer.render_string(
            "a\nb\n{{ threshold }}", {}, file="playbooks/x.yaml", line=9, key="k", source_line=10
        )
    assert message(info) == "playbooks/x.yaml:12: k: 'threshold' is undefined"


def test_undefined_attribute(renderer: Renderer) -> None:
    with pytest.raises(TemplateError) as info:
        renderer.render_string("{{ cfg.missing }}", {"cfg": {}}, file="p.yaml", line=2, key="k")
    assert message(info) == "p.yaml:2: k: 'dict object' has no attribute 'missing'"


def test_syntax_error_in_template_file_names_it_and_its_line(renderer: Renderer) -> None:
    with pytest.raises(TemplateError) as info:
        renderer.render_template("broken.j2", {}, file="playbooks/x.yaml", line=7, key="k")
    assert message(info) == (
        "broken.j2:2: template syntax error: Expected an expression, got 'end of statement "
        "block' (referenced from playbooks/x.yaml:7 k)"
    )


def test_syntax_error_inline_points_into_the_playbook(renderer: Renderer) -> None:
    with pytest.raises(TemplateError) as info:
        renderer.render_string(
            "one\ntwo {{ x + }}\n",
            {"x": 1},
            file="playbooks/x.yaml",
            line=5,
            key="c",
            source_line=6,
        )
    assert message(info) == (
        "playbooks/x.yaml:7: c: template syntax error: unexpected 'end of print statement'"
    )


def test_template_not_found_lists_where_it_looked(renderer: Renderer) -> None:
    with pytest.raises(TemplateError) as info:
        renderer.render_template("nope.j2", {}, file="playbooks/x.yaml", line=4, key="k")
    assert message(info) == (
        "playbooks/x.yaml:4: k: template 'nope.j2' not found "
        "(looked in: playbooks, templates, /pkg/templates)"
    )
    with pytest.raises(TemplateError) as info:
        renderer.render_template("includes-missing.j2", {}, file="p.yaml", line=1, key="k")
    assert "template 'gone.j2' not found" in message(info)


def test_patch_source_is_raw_and_missing_is_an_error(renderer: Renderer) -> None:
    assert renderer.source("undefined.j2") == FILES["undefined.j2"]
    with pytest.raises(TemplateError) as info:
        renderer.source("fix.diff", file="p.yaml", line=3, key="files[0].edits[0].patch")
    assert message(info).startswith("p.yaml:3: files[0].edits[0].patch: file 'fix.diff' not found")


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__ }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ items.append(4) }}",
        "{{ mapping.update(a=1) }}",
    ],
)
def test_sandbox_refuses_unsafe_operations(renderer: Renderer, source: str) -> None:
    values = {"items": [1], "mapping": {}}
    with pytest.raises(TemplateError) as info:
        renderer.render_string(source, values, file="p.yaml", line=1, key="k")
    assert message(info).startswith("p.yaml:1: k: unsafe template operation refused: ")
    assert values == {"items": [1], "mapping": {}}


def test_sandbox_error_in_template_file_names_it(renderer: Renderer) -> None:
    with pytest.raises(TemplateError) as info:
        renderer.render_template("escape.j2", {}, file="p.yaml", line=1, key="k")
    assert "unsafe template operation refused" in message(info)
    assert message(info).endswith("(in template escape.j2 line 1)")


def test_runtime_error_is_one_line(renderer: Renderer) -> None:
    with pytest.raises(TemplateError) as info:
        renderer.render_string("{{ 1 / 0 }}", {}, file="p.yaml", line=1, key="k")
    assert message(info) == "p.yaml:1: k: template error: ZeroDivisionError: division by zero"


def test_plain_text_is_returned_unchanged(renderer: Renderer) -> None:
    assert renderer.render_string("no templates here", {}) == "no templates here"
    assert renderer.render_string("{not jinja}", {}) == "{not jinja}"


def test_a_fleets_threads_compile_a_template_once() -> None:
    """Every host of a fleet renders the playbook's templates at the same moment; Jinja's cache
    let each thread that missed it look the file up and compile its own copy."""
    release = threading.Event()
    looked_up: list[str] = []

    def lookup(name: str) -> str | None:
        looked_up.append(name)
        release.wait(30)
        return FILES.get(name)

    renderer = Renderer(lookup)
    answers = ask_at_once(8, lambda: renderer.render_template("sglang/field.py.j2", {"threshold": 8}),
                          Renderer.render_template.__code__, release)
    assert answers == ["speculative_disable_batch_threshold: int = 8\n"] * 8
    assert looked_up == ["sglang/field.py.j2"]
