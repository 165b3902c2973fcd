"""Issue 16 item 13: template rendering has a limit (nested loops once ran past 120 s).

A budget of loop iterations plus calls and of output size
(``core.templating``), deterministic where a clock would not be. Through the
real CLI over real sshd: a template file whose nested loops would take
10^10 iterations is refused in about a second with one line naming the
template and its line, exit 2, the JSON report, nothing changed.
"""

from __future__ import annotations

import json
import time

import pytest

from orchestrator.core import templating
from orchestrator.core.templating import MAX_TEMPLATE_STEPS, Renderer
from orchestrator.errors import TemplateError
from tests.fixtures.sandbox import Sandbox, sha256

LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"

PLAYBOOK = """\
name: slow-template
files:
  - path: "{{ sglang_root }}/srt/server_args.py"
    edits:
      - insert: slow.py.j2
        after: "class ServerArgs"
"""


def test_a_template_with_nested_loops_is_refused_naming_it(sandbox: Sandbox) -> None:
    pid = sandbox.start_by_hand()
    (sandbox.root / "playbooks" / "slow.yaml").write_text(PLAYBOOK)
    (sandbox.root / "playbooks" / "slow.py.j2").write_text("x = 1\n" + LOOPS + "\n")
    original = sha256(sandbox.server_args)

    proc = sandbox.orch("deploy", "--host", "gpu", "--json", "playbooks/slow.yaml")

    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    host = json.loads(proc.stdout)["hosts"]["gpu"]
    assert host["outcome"] == "failed"
    error = host["error"]
    assert "\n" not in error
    assert f"more than {MAX_TEMPLATE_STEPS:,} loop iterations and calls" in error
    assert "(in template " in error and "slow.py.j2 line 2)" in error, error
    assert "slow.yaml:5" in error
    assert sha256(sandbox.server_args) == original and sandbox.server_pid() == pid


@pytest.mark.parametrize(("source", "why"), [
    ("{{ 'x' * 10**9 }}", "'*' would build a value of 1,000,000,000 items"),
    ("{{ 7 ** 100000000 }}", "is too large to compute"),
    ("{% macro f(n) %}{% if n %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(40) }}",
     "loop iterations and calls"),
    ("{% for a in x %}{% for b in x %}{% for c in x %}{{ c }}{% endfor %}{% endfor %}{% endfor %}",
     "loop iterations and calls"),
], ids=["repeat", "power", "macro-recursion", "loops-over-a-var"])
def test_each_way_to_spend_time_is_bounded(source: str, why: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A tenth of the budget: what is counted is the same (a macro's calls cost ~10 us each, so a
    # million took 10-12 s here, and the budget is half that); the real budget is spent by the CLI test above and passed by
    # the per-render test below.
    monkeypatch.setattr(templating, "MAX_TEMPLATE_STEPS", MAX_TEMPLATE_STEPS // 10)
    renderer = Renderer()
    with pytest.raises(TemplateError) as info:
        renderer.render_string(source, {"x": list(range(1000))}, file="p.yaml", line=3, key="k")
    assert str(info.value).startswith("p.yaml:3: k: template over its budget: ") and why in str(info.value)


def test_the_budget_is_per_render_and_ordinary_templates_pass() -> None:
    renderer = Renderer()
    source = "{% for i in range(1000) %}{% for j in range(400) %}{% endfor %}{% endfor %}{{ n * 2 }}"
    for _ in range(3):  # 401,000 steps each: under the budget every time, never summed across renders
        assert renderer.render_string(source, {"n": 21}) == "42"
    assert renderer.evaluate("x | length > 3 and 'a' * 3 == 'aaa'", {"x": [1, 2, 3, 4]}) is True
    started = time.monotonic()  # not asserted: a number for the report, never a pass/fail
    with pytest.raises(TemplateError):
        renderer.render_string(LOOPS, {})
    print(f"refused after {time.monotonic() - started:.2f} s")
