"""The host side of orch: standard library only, Python 3.8+, shared with the controller."""
