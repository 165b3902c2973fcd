"""Shared pytest plugins for the suite: the real sshd, the sandbox host, the fleet of sshd hosts."""

pytest_plugins = ["tests.fixtures.sshd", "tests.fixtures.sandbox", "tests.fixtures.fleet"]
