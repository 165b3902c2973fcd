"""Version of the stand-in server's miniature SGLang tree (never a real SGLang version)."""

__version__ = "0.0.0-standin"
