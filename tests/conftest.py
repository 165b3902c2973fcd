"""Shared pytest plugins for the suite: the real sshd, the sandbox host, the fleet of sshd hosts."""

import signal

import pytest

pytest_plugins = ["tests.fixtures.sshd", "tests.fixtures.sandbox", "tests.fixtures.fleet"]


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C works in the suite however it was started.

    A suite started in the background by a non-interactive shell (``cmd &``,
    ``nohup``) inherits SIGINT *ignored*; Python then installs no
    KeyboardInterrupt handler, and every process it starts inherits the
    ignoring too: the Ctrl-C tests' SIGINT would be lost. With a handler
    here, each worker raises KeyboardInterrupt, and every child (orch under
    test, helpers, servers) starts with SIGINT at its default, as from a
    terminal.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
