"""One module per ``orch`` command; ``cli.app`` registers them.

A command module defines one Click command, built from the shared option
groups in ``cli.options``, imports heavy modules inside the command body,
and returns the run's exit code (errors it raises reach ``cli.app.main``,
the one place that turns them into a line, a JSON report and a code).
"""
