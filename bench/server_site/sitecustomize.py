"""Imported as each stand-in server of the fleet bench starts (it is on the server's
``PYTHONPATH``): the server moves itself into the bench's cgroup of servers, so that its
host's CPU count (``hostcpu.CpuGroups``) leaves it out, as the ``/proc`` count does.

orch restarts a server with the environment it had, so the server a deploy starts moves
too, whichever orch started it. Standard library only; a move that fails is said on the
server's stderr and the server runs on (the bench checks where each server is).
"""

import os
import sys

_group = os.environ.get("ORCH_BENCH_SERVER_CGROUP")
if _group:
    try:
        with open(os.path.join(_group, "cgroup.procs"), "w") as _procs:
            _procs.write(f"{os.getpid()}\n")
    except OSError as _exc:
        sys.stderr.write(f"orch bench: this server stays in its host's cgroup: {_exc}\n")
