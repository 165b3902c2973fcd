"""Launch the inference server (the stand-in server's launcher).

Like SGLang's, it builds the argument parser by importing
``sglang.srt.server_args``: a patch that breaks that file's syntax ends the
process at start with Python's own traceback (exit 1), and an unknown flag
ends it in argparse (exit 2, ``unrecognized arguments``).
"""

import sys

from sglang.srt.server_args import prepare_server_args


def run_server(server_args):
    """Run the HTTP server until SIGTERM/SIGINT."""
    from sglang.srt.entrypoints.http_server import launch_server

    launch_server(server_args)


if __name__ == "__main__":
    server_args = prepare_server_args(sys.argv[1:])
    run_server(server_args)
