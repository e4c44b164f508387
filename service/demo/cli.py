"""`lifelong demo` on the command line."""

from __future__ import annotations

import argparse
import logging

from rich.console import Console

from service.demo.run import DemoOptions, run, sigterm_as_interrupt
from service.errors import ConfigError
from service.logs import setup_logging


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `lifelong demo`."""
    parser = commands.add_parser(
        "demo",
        help="run the end-to-end demo on its own broker and Redis",
        description="Start mosquitto, redis-server, two controllers and the reference worker, "
        "stream drifting thermal-comfort samples and train, evaluate and deploy a model "
        "round after round.",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds to deploy (default 3)")
    parser.add_argument("--fast", action="store_true",
                        help="stream samples faster and poll the dataset more often")
    parser.add_argument("--timeout-seconds", type=float, default=110.0, metavar="S",
                        help="give up (exit 1) after this long (default 110)")
    parser.add_argument("--seed", type=int, default=7, help="random seed of the sample stream")
    parser.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    if args.rounds < 1 or args.timeout_seconds <= 0:
        raise ConfigError("--rounds must be >= 1 and --timeout-seconds > 0")
    setup_logging("text", level=logging.WARNING)
    options = DemoOptions(args.rounds, args.fast, args.timeout_seconds, args.seed)
    with sigterm_as_interrupt():
        return run(options, Console())
