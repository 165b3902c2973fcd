"""The host side of orch: what runs on a server, standard library only (Python 3.8+)."""
