"""The `lifelong` argument parser: every subcommand, registered by the module that runs it."""

from __future__ import annotations

import argparse
from typing import Protocol

from service import demo, worker
from service.cli.arguments import Subcommands
from service.cli.commands import rollback, schemas, send, serve, status, validate, watch


class CommandModule(Protocol):
    """A module adding subcommands: `register` adds parsers and sets `func=handler`
    (handler(args) -> exit code)."""

    def register(self, commands: Subcommands) -> None: ...


#: Every module contributing subcommands, in the order `lifelong --help` lists them.
COMMAND_MODULES: tuple[CommandModule, ...] = (
    serve, schemas, send, rollback, status, watch, validate, worker, demo,
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lifelong",
        description="Edge controller of Sedna lifelong-learning jobs.",
        epilog="exit codes: 0 ok, 1 problem found, 2 bad usage or configuration, "
        "3 server unreachable",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(commands)
    return parser
