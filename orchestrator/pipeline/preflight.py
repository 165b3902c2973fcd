"""Step 7 of the deploy, the host side: run the pre-flight command and say what the parser said.

One small typed call over the helper's ``preflight`` op (``shell.agent``);
what to run comes from ``ServerChange.preflight`` (``pipeline.plan``), what
it means from ``core.preflight``. The deploy calls this after the commit and
before it stops the running server; a refusal restores the files and never
touches the server.
"""

from __future__ import annotations

from orchestrator.core.preflight import DEFAULT_TIMEOUT, PreflightResult
from orchestrator.pipeline.session import HostSession


def run_preflight(
    session: HostSession,
    argv: list[str],
    *,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    replace_env: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
) -> PreflightResult:
    """Run ``argv`` on the host (the new server's cwd and environment) and return its verdict."""
    got = session.call(
        "preflight", argv=argv, cwd=cwd, env=env or {}, replace_env=replace_env, timeout=timeout
    )
    return PreflightResult.from_wire(got)
