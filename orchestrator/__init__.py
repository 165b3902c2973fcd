"""orch: change code and flags on remote inference servers, and never leave a box broken."""

__version__ = "0.2.0"
