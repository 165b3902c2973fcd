"""``orch demo [nightly]``: the whole story on this machine, with the stand-in server."""

from __future__ import annotations

import click

from orchestrator.cli.options import OutputFlags, output_options


@click.command(short_help="The whole story on this machine with a stand-in server.")
@click.argument("which", required=False, type=click.Choice(["nightly"]), metavar="[nightly]")
@click.option("--keep", is_flag=True,
              help="Keep the sandbox (inventory, tree, state, a script that starts the stand-in) "
                   "to go on with deploy, rollback, history there; see docs/CLI.md.")
@output_options
def demo(out: OutputFlags, which: str | None, keep: bool) -> int:
    """A local sandbox host with a stand-in SGLang server, in six steps: a deploy with a
    performance gate; a change that halves throughput, rolled back by the gate; a
    misspelt flag, refused by the pre-flight before the server is touched; a server that
    crashes at start, rolled back by itself; orch rollback; the history.

    `orch demo nightly`: nights of the stand-in instead: built from a git
    repository at a pinned commit, patched, switched, probed; a night that
    crashes switched back; orch rollback; the history (docs/NIGHTLY.md).
    """
    if which == "nightly":
        from orchestrator.demo_nightly import run_nightly_demo

        return run_nightly_demo(out.output(), keep=keep)
    from orchestrator.demo import run_demo

    return run_demo(out.output(), keep=keep)
