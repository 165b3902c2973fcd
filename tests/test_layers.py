"""Imports flow one way (docs/ARCHITECTURE.md): core, then shell, then pipeline, then cli.

Every import in a module counts, the ones inside functions too (orch imports its heavy
modules late): a late import from a layer above is the same knot as an early one.
``orchestrator/host`` imports nothing of orch's but itself (it runs on the host alone), and
the three modules beside the layers (``errors``, ``interrupts``, ``heap``) import nothing of
orch's: every layer may import them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "orchestrator"
LAYERS = ("core", "shell", "pipeline", "cli")
BESIDE = ("errors", "interrupts", "heap")


def orch_imports(path: Path) -> set[str]:
    """The ``orchestrator.*`` modules (and names imported from them) that ``path`` imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level:
            found.add("." * node.level + (node.module or ""))
    return {name for name in found if name.startswith(("orchestrator", "."))}


def part_of(name: str) -> str:
    """``orchestrator.pipeline.deploy`` → ``pipeline``; ``orchestrator.heap`` → ``heap``."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def modules(folder: str) -> list[Path]:
    return sorted((PACKAGE / folder).rglob("*.py"))


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_nothing_from_a_layer_above(layer: str) -> None:
    above = set(LAYERS[LAYERS.index(layer) + 1:]) | {"standin"}  # the stand-in server is the demo's
    if layer != "cli":
        above |= {"demo", "demo_nightly"}  # what ``orch demo`` runs: the pipeline, below the CLI
    wrong = {f"{path.relative_to(PACKAGE)}: {name}" for path in modules(layer)
             for name in orch_imports(path) if part_of(name) in above or name.startswith(".")}
    assert not wrong, sorted(wrong)


def test_the_host_package_imports_nothing_of_orch_but_itself() -> None:
    wrong = {f"{path.relative_to(PACKAGE)}: {name}" for path in modules("host")
             for name in orch_imports(path) if part_of(name) != "host" and not name.startswith(".")}
    assert not wrong, sorted(wrong)


@pytest.mark.parametrize("name", BESIDE)
def test_the_modules_beside_the_layers_import_nothing_of_orch(name: str) -> None:
    assert orch_imports(PACKAGE / f"{name}.py") == set()


def test_the_checker_sees_late_imports() -> None:
    """The deploy command imports its pipeline inside its function: the walk must find it."""
    assert "orchestrator.pipeline.deploy" in orch_imports(PACKAGE / "cli" / "commands" / "deploy.py")
