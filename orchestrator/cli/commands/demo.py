"""``orch demo``: the whole story on this machine, with the stand-in server."""

from __future__ import annotations

import click

from orchestrator.cli.options import OutputFlags, output_options


@click.command(short_help="The whole story on this machine with a stand-in server.")
@click.option("--keep", is_flag=True,
              help="Keep the sandbox (inventory, tree, state, a script that starts the stand-in) "
                   "to go on with deploy, rollback, history there; see docs/CLI.md.")
@output_options
def demo(out: OutputFlags, keep: bool) -> int:
    """A local sandbox host with a stand-in SGLang server: deploy, a bad flag rolled back
    automatically, orch rollback, the history."""
    from orchestrator.demo import run_demo

    return run_demo(out.output(), keep=keep)
