"""`lifelong watch`: upstream status and rejections as they happen."""

from __future__ import annotations

import argparse
import queue
import sys
import time

from service.adapters.mqtt import Inbound
from service.cli.arguments import (
    COMMON_NOTE,
    DEFAULT_TIMEOUT_S,
    Subcommands,
    add_connection_flags,
    count_arg,
    node_arg,
    seconds_arg,
    subcommand,
)
from service.cli.connections import EXIT_OK, EXIT_PROBLEM, command_config, mqtt_session
from service.cli.rendering import watch_line

WATCH_EXAMPLES = (
    """examples:
  lifelong watch                         # until Ctrl-C
  lifelong watch --count 3 --timeout 30  # stop after 3 messages or 30 s
  lifelong watch -o json | jq .

With --count, exit 1 when fewer messages arrived before the timeout."""
    + COMMON_NOTE
)


def register(commands: Subcommands) -> None:
    """Add watch."""
    watch = subcommand(
        commands, "watch", "print upstream status and rejections as they happen", WATCH_EXAMPLES
    )
    watch.add_argument("--count", type=count_arg, default=None, metavar="N",
                       help="stop after N messages")  # fmt: skip
    watch.add_argument("--timeout", type=seconds_arg, default=None, metavar="SECONDS",
                       help="stop after this long")  # fmt: skip
    watch.add_argument("--node", type=node_arg, default=None,
                       help="edge node (default: LIFELONG_NODE_NAME)")  # fmt: skip
    watch.add_argument("-o", "--output", choices=("text", "json"), default="text")
    add_connection_flags(watch)
    watch.set_defaults(func=_watch)


def _watch(args: argparse.Namespace) -> int:
    cfg = command_config(args)
    node_cfg = cfg.for_node(args.node or cfg.node_name)
    topics = [node_cfg.upstream_topic_filter(), node_cfg.errors_topic()]
    inbound: queue.SimpleQueue[Inbound] = queue.SimpleQueue()
    connect_s = args.timeout or DEFAULT_TIMEOUT_S
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    seen = 0
    with mqtt_session(cfg, "watch", connect_s, subscriptions=topics, inbound=inbound):
        print(f"watching {' and '.join(topics)}", file=sys.stderr, flush=True)
        while args.count is None or seen < args.count:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            try:
                msg = inbound.get(timeout=remaining)
            except queue.Empty:
                break
            seen += 1
            print(watch_line(msg.topic, msg.payload, msg.received_at, args.output), flush=True)
    if args.count is not None and seen < args.count:
        print(f"watch: {seen} of {args.count} messages before the timeout", file=sys.stderr)
        return EXIT_PROBLEM
    return EXIT_OK
