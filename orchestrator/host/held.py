"""The helper's code held in memory for the processes that outlive it.

A release's guard and runner are forks of the helper. They may have to
restore an hour later, after a person has removed the kept copy of the
helper they came from (``tests/test_agent.py`` removes it). So before the
fork every module of this package not imported yet is read into memory (its
bytecode as the file holds it), and a finder first on ``sys.meta_path``
imports it from there when it is first needed. Importing them all up front,
as this helper did before, cost each deploy about 10 ms of the host's CPU for
modules most releases never run (the restore machine, the nightly build, the
gate's judgement); unmarshalling them all up front still cost about 5 ms of
the 7 that holding took, so a module's bytecode is unmarshalled only when it
is imported.

A helper started from the archive it was sent (its first start on a host)
runs from memory already: nothing to hold.

Standard library only, Python 3.8 syntax: this module is shipped to the host.
"""

import importlib.util
import marshal
import os
import sys
import types

PACKAGE = __name__.rpartition(".")[0]
# None when run from the archive in memory: its modules have no file (``agent_client.BOOTSTRAP``)
HERE = os.path.dirname(os.path.abspath(globals()["__file__"])) if "__file__" in globals() else None
PYC_HEADER_BYTES = 16  # magic, flags, and the source's mtime and size (or hash): PEP 552


class HeldModules(object):
    """A finder and loader for the modules ``hold_package`` read: each one's code, run once."""

    def __init__(self, held):
        self.held = held  # module name -> (path, ``held_code``'s (bytecode or None, source))

    def find_spec(self, name, path=None, target=None):
        if name not in self.held:
            return None
        return importlib.util.spec_from_file_location(name, self.held[name][0], loader=self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        path, (bytecode, source) = self.held.pop(module.__name__)
        code = None
        if bytecode is not None:
            try:
                code = marshal.loads(bytecode)
            except (ValueError, EOFError, TypeError):
                pass  # a damaged cache: its source is compiled below
        if not isinstance(code, types.CodeType):
            code = compile(source, path, "exec", dont_inherit=True)
        exec(code, module.__dict__)


def hold_package():
    """Hold every module of this package that is not imported yet (see the module's docstring)."""
    if HERE is None or not os.path.isfile(os.path.join(HERE, "__init__.py")):
        return None  # run from the archive in memory
    for finder in sys.meta_path:
        if isinstance(finder, HeldModules):
            return finder  # held at an earlier arm of this helper's session
    held = {}
    for entry in sorted(os.listdir(HERE)):
        stem, ext = os.path.splitext(entry)
        name = "%s.%s" % (PACKAGE, stem)
        if ext != ".py" or stem == "__init__" or name in sys.modules:
            continue
        path = os.path.join(HERE, entry)
        try:
            held[name] = (path, held_code(path))
        except OSError:
            continue  # an unreadable file: imported from disk as it would have been
    finder = HeldModules(held)
    sys.meta_path.insert(0, finder)
    return finder


def held_code(path):
    """``(bytecode, source)``: ``path``'s source bytes, and its marshalled code from the
    bytecode cache where that is this Python's and no older than the source (else None).
    Nothing is unmarshalled or compiled until the module is imported."""
    with open(path, "rb") as f:
        source = f.read()
    try:
        with open(importlib.util.cache_from_source(path), "rb") as f:
            data = f.read()
    except (OSError, NotImplementedError, ValueError):
        return None, source
    if data[:4] != importlib.util.MAGIC_NUMBER or len(data) <= PYC_HEADER_BYTES:
        return None, source
    flags = int.from_bytes(data[4:8], "little")
    if flags == 0:  # checked by the source's mtime and size, as the import system does
        st = os.stat(path)
        mtime = int.from_bytes(data[8:12], "little")
        size = int.from_bytes(data[12:16], "little")
        if mtime != (int(st.st_mtime) & 0xFFFFFFFF) or size != (len(source) & 0xFFFFFFFF):
            return None, source
    elif flags & 0b10 and data[8:16] != importlib.util.source_hash(source):
        return None, source  # a checked hash-based cache (py_compile under SOURCE_DATE_EPOCH) not of this source
    return data[PYC_HEADER_BYTES:], source
