"""The performance gate's judgement, for the controller: figures before and after → a verdict per rule.

The judgement is defined once, in the host package (``host/gate.py``:
``Measured``, ``judge_bound``, ``check_probe``, ``next_step``,
``GateOutcome`` …), because the host judges a release it runs itself as the
controller does, and the host package imports nothing of the controller's.
This module keeps the names the controller has always imported them by, and
adapts the one call that takes the playbook's rules: ``check_probe``
accepts the controller's pydantic ``GateRules`` (validated from a playbook
or ``probe.json``) as well as the host's dataclass. Pure.
"""

from __future__ import annotations

from orchestrator.core.models import GateRules
from orchestrator.host import gate as host_gate
from orchestrator.host.figures import ProbeResult
from orchestrator.host.gate import COLUMNS as COLUMNS
from orchestrator.host.gate import Final as Final
from orchestrator.host.gate import GateOutcome as GateOutcome
from orchestrator.host.gate import Measured as Measured
from orchestrator.host.gate import RuleCheck as RuleCheck
from orchestrator.host.gate import Verdict as Verdict
from orchestrator.host.gate import bound_text as bound_text
from orchestrator.host.gate import inconclusive_probes as inconclusive_probes
from orchestrator.host.gate import judge_bound as judge_bound
from orchestrator.host.gate import margin_and_noise as margin_and_noise
from orchestrator.host.gate import next_step as next_step
from orchestrator.host.gate import plain_table as plain_table


def host_rules(rules: GateRules | host_gate.GateRules) -> host_gate.GateRules:
    """The rules as the host's judgement reads them: a playbook model through its
    wire form (``GateRules.to_host``), the host's own dataclass as it is."""
    return rules.to_host() if isinstance(rules, GateRules) else rules


def check_probe(label: str, rules: GateRules | host_gate.GateRules, before: ProbeResult | None,
                after: ProbeResult) -> list[RuleCheck]:
    """Every bound of ``rules`` on one probe, in the order of the rules' fields
    (``host.gate.check_probe``, with the playbook's rules handed over)."""
    return host_gate.check_probe(label, host_rules(rules), before, after)
