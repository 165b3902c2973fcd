"""Shared pytest plugins for the suite: the real sshd, the sandbox host."""

pytest_plugins = ["tests.fixtures.sshd", "tests.fixtures.sandbox"]
