"""What every command's parser shares: the subcommand factory, common flags, argument types.

Argument types raise `argparse.ArgumentTypeError`, which argparse turns into one usage line
and exit code 2. Names are checked with the controller's own rules, so CLI and service agree.
"""


import argparse
from typing import TypeAlias

from service import config as config_mod
from service import wire
from service.cli.manifests import (
    DATASET,
    DEFAULT_NAMESPACE,
    KINDS,
    Kind,
    delete_envelope,
    kind_named,
)
from service.errors import InvalidMessage
from service.settings import node_name_problem

# argparse's type is generic only to type checkers, hence the string.
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

DEFAULT_TIMEOUT_S = 10.0

COMMON_NOTE = """
exit codes: 0 ok, 1 problem found, 2 bad usage or configuration, 3 server unreachable.
Broker and Redis come from LIFELONG_MQTT_URL and LIFELONG_REDIS_URL (or the flags above)."""


def subcommand(
    commands: Subcommands, name: str, summary: str, epilog: str, description: str | None = None
) -> argparse.ArgumentParser:
    """A subcommand whose description is `description` or else its one-line summary, and
    whose epilog (examples) keeps its line breaks."""
    return commands.add_parser(
        name,
        help=summary,
        description=description or summary[0].upper() + summary[1:] + ".",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    """The server and topic settings (as `serve` has them) and -v."""
    config_mod.add_arguments(parser)
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="name the servers used and log connection details to stderr",
    )


def add_files_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="FILE",
        help="YAML or JSON file of one or more resources; '-' reads stdin; repeatable",
    )


def add_namespace_flag(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument(
        "-n", "--namespace", type=namespace_arg, default=DEFAULT_NAMESPACE, help=help_text
    )


def add_timeout_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout", type=seconds_arg, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
        help="how long to wait for the broker (default: 10)",
    )  # fmt: skip


def kind_arg(text: str) -> Kind:
    kind = kind_named(text)
    if kind is None:
        names = ", ".join(f"{kind.wire} ({kind.short})" for kind in KINDS)
        raise argparse.ArgumentTypeError(f"unknown kind {text!r}: use one of {names}")
    return kind


def _header_arg(namespace: str, name: str) -> None:
    """Check names with the controller's own header rules."""
    try:
        wire.decode_envelope(delete_envelope(DATASET.wire, namespace, name))
    except InvalidMessage as e:
        raise argparse.ArgumentTypeError(f"{e.reason}") from None


def name_arg(text: str) -> str:
    _header_arg(DEFAULT_NAMESPACE, text)
    return text


def namespace_arg(text: str) -> str:
    _header_arg(text, "example")
    return text


def node_arg(text: str) -> str:
    problem = node_name_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def seconds_arg(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: seconds must be positive")
    return seconds


def count_arg(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)
