"""Entry points of the stand-in server."""
