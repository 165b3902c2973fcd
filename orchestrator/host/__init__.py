"""orch's host side: the helper that runs on each host, standard library only, Python 3.8.

It is shipped to a host as one archive named by its hash and kept there,
compiled, in the state dir (``shell.agent_client``). Nothing here imports
from the rest of orchestrator: a host has only this package.
"""
