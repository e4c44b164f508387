"""`lifelong`: the command line of the controller, its argument parser (every subcommand,
registered by the module that runs it) and `main`.

Failures print one clear line and exit non-zero, never a traceback. Exit codes: 0 success;
1 the command ran and found a problem; 2 bad usage or configuration; 3 a server the command
needs is unreachable.
"""


import argparse
import sys
from collections.abc import Callable, Sequence

from service import schemas
from service.cli import running, sending, viewing
from service.cli.arguments import Subcommands
from service.cli.connections import EXIT_INTERRUPTED, exit_code
from service.errors import ServiceError
from service.logs import escape_controls, redact

__all__ = ["build_parser", "main"]

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lifelong",
        description="Edge controller of Sedna lifelong-learning jobs.",
        epilog="exit codes: 0 ok, 1 problem found, 2 bad usage or configuration, "
        "3 server unreachable",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # Each group's register function adds its parsers (with `func=handler`, handler(args) ->
    # exit code), in the order `lifelong --help` lists them.
    registrars: tuple[Callable[[Subcommands], None], ...] = (
        running.register_serve,
        schemas.register,
        sending.register_send,
        sending.register_rollback,
        viewing.register_status,
        viewing.register_watch,
        sending.register_validate,
        running.register_worker,
        running.register_demo,
    )
    for register in registrars:
        register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `lifelong` command; its exit code."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ServiceError as e:
        print(f"lifelong: {escape_controls(redact(str(e)))}", file=sys.stderr)
        return exit_code(e)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
