"""The host package's value classes (``host/values.py``): what ``dataclass(frozen=True)``
gave the records, without importing ``dataclasses`` on the host."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.host.records import AppliedState, HostRecords, Journal, Manifest, ServerProcess
from orchestrator.host.restore_plan import ServerStart
from orchestrator.host.values import field, fields_of, replace, value

ROOT = Path(__file__).resolve().parents[1]


@value(frozen=True)
class Base:
    name: str
    tags: list[str] = field(default_factory=list)


@value(frozen=True)
class Child(Base):
    size: int = 0


def test_fields_come_in_order_bases_first_with_their_defaults() -> None:
    assert [f.name for f in fields_of(Child)] == ["name", "tags", "size"]
    assert [f.required for f in fields_of(Child)] == [True, False, False]
    assert Child("a", ["t"], 3) == Child(name="a", tags=["t"], size=3)
    assert repr(Child("a")) == "Child(name='a', tags=[], size=0)"


def test_a_default_factory_gives_each_value_its_own_list() -> None:
    one, two = AppliedState(), AppliedState()
    one.applied.append("R1")
    assert two.applied == [] and one != two
    assert ServerStart(["serve"], "/srv").env == {}


def test_values_are_frozen_compared_by_type_and_fields_and_hashable() -> None:
    a = Child("a")
    with pytest.raises(AttributeError, match="Child is frozen: cannot assign 'name'"):
        a.name = "b"  # type: ignore[misc]
    with pytest.raises(AttributeError, match="frozen"):
        del a.size  # type: ignore[misc]
    assert Base("a") != Child("a")  # same fields, another type
    assert hash(Journal(release="R1")) == hash(Journal(release="R1"))


def test_wrong_arguments_are_refused_in_one_line() -> None:
    with pytest.raises(TypeError, match=r"^Child\(\) missing required argument 'name'$"):
        Child()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^Child\(\) got an unexpected or repeated argument 'colour'$"):
        Child("a", colour="red")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^Child\(\) got an unexpected or repeated argument 'name'$"):
        Child("a", name="b")  # type: ignore[misc]
    with pytest.raises(TypeError, match=r"^Child\(\) takes 3 arguments, 4 given$"):
        Child("a", [], 1, 2)  # type: ignore[call-arg]


def test_replace_copies_with_changes_and_refuses_an_unknown_field() -> None:
    records = HostRecords(root="/s", exists=True, journal=None, lock=None)
    assert replace(records, exists=False) == HostRecords(root="/s", exists=False, journal=None, lock=None)
    with pytest.raises(TypeError, match="HostRecords has no field 'colour'"):
        replace(records, colour=1)  # type: ignore[call-arg]


def test_a_record_survives_copy_pickle_and_its_wire_form() -> None:
    process = ServerProcess.from_wire({"pid": 7, "argv": ["serve", "--port", "1"], "env": {"A": "1"}})
    assert copy.deepcopy(process) == process == pickle.loads(pickle.dumps(process))
    manifest = Manifest.from_wire({"id": "R1", "kind": "deploy", "new_field": 1})
    assert Manifest.from_wire(manifest.to_wire()) == manifest


def test_the_helper_arms_without_importing_dataclasses_or_typing() -> None:
    """Every op's module, and the restore's records a guard imports when it restores, cost a
    helper no ``dataclasses`` (with ``inspect``, ``ast``, ``tokenize``) and no ``typing``: a
    third of its import once."""
    code = (f"import sys, importlib; sys.path.insert(0, {str(ROOT)!r})\n"
            "import orchestrator.host.main, orchestrator.host.dispatch as d\n"
            "for m in sorted(set(w[0] for w in d.OPS.values()) | {'restore_records'}):\n"
            "    importlib.import_module('orchestrator.host.' + m)\n"
            "print(sorted(m for m in ('dataclasses', 'inspect', 'typing', 'ast') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
