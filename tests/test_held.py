"""The helper's code held in memory (``host/held.py``): a fork of the helper imports what it
needs after the kept copy it came from is gone, from that copy's bytecode, never stale."""

from __future__ import annotations

import compileall
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def kept_copy(tmp_path: Path) -> Path:
    """A compiled copy of the host package, as a host keeps it in its state dir."""
    top = tmp_path / "kept"
    shutil.copytree(ROOT / "orchestrator" / "host", top / "orchestrator" / "host",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (top / "orchestrator" / "__init__.py").write_text("")
    assert compileall.compile_dir(str(top), quiet=1)
    return top


def run_in(top: Path, body: str) -> str:
    code = f"import sys; sys.path.insert(0, {str(top)!r})\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_modules_not_imported_yet_are_imported_from_memory_after_the_copy_is_removed(tmp_path: Path) -> None:
    top = kept_copy(tmp_path)
    out = run_in(top, f"""
        import shutil, sys
        from orchestrator.host.held import HeldModules, hold_package
        finder = hold_package()
        assert hold_package() is finder  # a second arm holds nothing twice
        assert "orchestrator.host.restore_records" not in sys.modules  # held, not imported
        shutil.rmtree({str(top)!r})
        from orchestrator.host import restore_records, nightly
        assert restore_records.__file__.startswith({str(top)!r}), restore_records.__file__
        assert type(nightly.__spec__.loader) is HeldModules
        print(len(finder.held) > 10, "orchestrator.host.nightly" in finder.held)
        """)
    assert out == "True False"  # many still held; the imported one given up


def test_a_module_whose_bytecode_is_older_than_its_source_is_held_as_its_source(tmp_path: Path) -> None:
    top = kept_copy(tmp_path)
    source = top / "orchestrator" / "host" / "retention.py"
    source.write_text(source.read_text() + "\nHELD_FROM_SOURCE = True\n")  # newer than its .pyc
    out = run_in(top, f"""
        import shutil
        from orchestrator.host.held import hold_package
        finder = hold_package()
        print(finder.held["orchestrator.host.retention"][1][0])  # no bytecode held: its source
        shutil.rmtree({str(top)!r})
        from orchestrator.host import retention
        print(retention.HELD_FROM_SOURCE)
        """)
    assert out.splitlines() == ["None", "True"]


def test_a_helper_run_from_its_archive_holds_nothing(tmp_path: Path) -> None:
    """Its modules come from the archive in memory, as the bootstrap's finder loads them (no
    ``__file__``): no files to lose, nothing to hold."""
    source = (ROOT / "orchestrator" / "host" / "held.py").read_text()
    out = run_in(tmp_path, f"""
        import importlib.util

        class FromMemory(object):
            def create_module(self, spec):
                return None

            def exec_module(self, module):
                exec(compile({source!r}, "orchestrator/host/held.py", "exec"), module.__dict__)

        spec = importlib.util.spec_from_loader("orchestrator.host.held", FromMemory(),
                                               origin="orchestrator/host/held.py")
        held = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(held)
        print(hasattr(held, "__file__"), held.hold_package())
        """)
    assert out == "False None"


def test_a_checked_hash_cache_of_other_source_is_held_as_its_source(tmp_path: Path) -> None:
    """What the keep's ``py_compile`` writes under ``SOURCE_DATE_EPOCH``: checked against the
    source's hash, not its mtime, as the import system checks it."""
    import py_compile

    top = kept_copy(tmp_path)
    source = top / "orchestrator" / "host" / "retention.py"
    py_compile.compile(str(source), invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH, doraise=True)
    probe = f"from orchestrator.host.held import held_code\nprint(held_code({str(source)!r})[0] is not None)"
    out = run_in(top, probe)
    assert out == "True"  # its own source: the cache is used
    source.write_text(source.read_text() + "\nHELD_FROM_SOURCE = True\n")
    assert run_in(top, probe) == "False"


def test_held_bytecode_is_unmarshalled_only_when_its_module_is_imported(tmp_path: Path) -> None:
    """Holding reads bytes; most held modules are never imported (the gate, the nightly
    build), and unmarshalling them all at every arm was most of what holding cost."""
    top = kept_copy(tmp_path)
    out = run_in(top, f"""
        import marshal, shutil, types
        from orchestrator.host import held
        loads = []
        held.marshal = types.SimpleNamespace(loads=lambda data: loads.append(1) or marshal.loads(data))
        finder = held.hold_package()
        bytecode, source = finder.held["orchestrator.host.retention"][1]
        print(type(bytecode).__name__, len(loads))
        count = len(finder.held)
        shutil.rmtree({str(top)!r})
        from orchestrator.host import retention
        imported = count - len(finder.held)  # retention and the held modules it imports
        print(callable(retention.prune_plan), len(loads) == imported, 0 < imported < count)
        """)
    assert out.splitlines() == ["bytes 0", "True True True"]


def test_a_damaged_bytecode_cache_is_run_from_the_source_held_beside_it(tmp_path: Path) -> None:
    """A cache whose header is right and whose body is not (a torn write, a bad disk block):
    the import system would fail on it; the held source runs instead."""
    top = kept_copy(tmp_path)
    source = top / "orchestrator" / "host" / "retention.py"
    source.write_text(source.read_text() + "\nHELD_FROM_SOURCE = True\n")
    import importlib.util
    import py_compile

    py_compile.compile(str(source), doraise=True)
    cache = Path(importlib.util.cache_from_source(str(source)))
    data = cache.read_bytes()
    cache.write_bytes(data[:16] + b"\x00garbage" * 4)  # PEP 552 header kept: it still looks current
    out = run_in(top, f"""
        import shutil
        from orchestrator.host.held import hold_package
        finder = hold_package()
        print(finder.held["orchestrator.host.retention"][1][0] is not None)
        shutil.rmtree({str(top)!r})
        from orchestrator.host import retention
        print(retention.HELD_FROM_SOURCE)
        """)
    assert out.splitlines() == ["True", "True"]
