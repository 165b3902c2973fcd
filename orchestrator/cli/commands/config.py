"""``orch config``: each setting in effect and where it came from, as ``ansible-config dump``."""

from __future__ import annotations

import click

from orchestrator.cli.options import OutputFlags, output_options


@click.command(short_help="Show each setting in effect and where it came from.")
@output_options
def config(out: OutputFlags) -> int:
    """Each setting in effect — inventory, ssh_config, forks, link_timeout, color — and its source.

    Precedence: a flag > its environment variable (ORCH_INVENTORY,
    ORCH_SSH_CONFIG, ORCH_FORKS, ORCH_LINK_TIMEOUT; NO_COLOR for colour) > the config file (the
    first found of ./orch.yaml and $XDG_CONFIG_HOME/orch/config.yaml) > the
    default. Reads only; contacts nothing.
    """
    import os

    from orchestrator.cli.options import _config_file, settings_in_effect
    from orchestrator.shell.config_files import config_candidates

    settings = settings_in_effect({"color": out.color_flag})
    found = _config_file()
    output = out.output()
    shown = {True: "on", False: "off", None: "on a terminal"}
    for name, value, source in settings.rows():
        text = shown[value] if name == "color" else ("-" if value is None else str(value))
        output.line(f"{name:<12} {text:<24} from {source}")
    looked = ", ".join(str(p) for p in config_candidates(os.environ))
    output.line(f"config file: {found.path or 'none found'} (looked for: {looked})", "dim")
    if out.as_json:
        output.emit_json({
            "exit_code": 0, "error": None, "config_file": found.path,
            "settings": {name: {"value": value, "source": source} for name, value, source in settings.rows()},
        })
    return 0
