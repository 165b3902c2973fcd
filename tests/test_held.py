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
        print(type(finder.held["orchestrator.host.retention"][1]).__name__)
        shutil.rmtree({str(top)!r})
        from orchestrator.host import retention
        print(retention.HELD_FROM_SOURCE)
        """)
    assert out.splitlines() == ["bytes", "True"]


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
    probe = f"from orchestrator.host.held import compiled_code\nprint(type(compiled_code({str(source)!r})).__name__)"
    out = run_in(top, probe)
    assert out == "code"  # its own source: the cache is used
    source.write_text(source.read_text() + "\nHELD_FROM_SOURCE = True\n")
    assert run_in(top, probe) == "bytes"
