"""`lifelong serve`: run one controller replica, optionally on its own broker and Redis."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from service import config as config_mod
from service import embedded
from service.cli.arguments import Subcommands
from service.cli.connections import EXIT_OK
from service.logs import setup_logging
from service.runtime import Replica

log = logging.getLogger("service.cli")

SWITCH_INTERVAL_S = 0.0005

SERVE_EXAMPLES = """examples:
  lifelong serve                                  # env vars as in the README
  lifelong serve --mqtt-url mqtt://broker:1883 --redis-url redis://redis:6379/0
  lifelong serve --embedded                       # own mosquitto + redis-server on free ports
"""


def register(commands: Subcommands) -> None:
    """Add serve."""
    serve = commands.add_parser(
        "serve",
        help="run the controller",
        description="Run one controller replica (several may share one Redis and broker).",
        epilog=SERVE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    config_mod.add_arguments(serve)
    serve.add_argument(
        "--replica-id", default=None, help="this replica's name (default: hostname-pid)"
    )
    serve.add_argument(
        "--embedded",
        action="store_true",
        help="start mosquitto and redis-server (from PATH) on free ports in a temporary "
        "directory and serve against them",
    )
    serve.set_defaults(func=_serve)


@contextlib.contextmanager
def _embedded_servers(enabled: bool) -> Iterator[tuple[str, str] | None]:
    """Overrides pointing the service at its own broker and Redis (when enabled)."""
    if not enabled:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="lifelong-") as tmp:
        broker = embedded.mosquitto_server(Path(tmp) / "mosquitto")
        redis = embedded.redis_server(Path(tmp) / "redis", "--appendonly", "yes")
        with embedded.running(broker, redis):
            print(
                f"embedded mosquitto on mqtt://127.0.0.1:{broker.port}, "
                f"redis-server on redis://127.0.0.1:{redis.port}/0",
                flush=True,
            )
            yield f"mqtt://127.0.0.1:{broker.port}", f"redis://127.0.0.1:{redis.port}/0"


def _serve(args: argparse.Namespace) -> int:
    cfg = config_mod.from_args(args, os.environ)
    setup_logging(cfg.log_format)
    # Several I/O-bound threads hand each event on (paho -> intake -> processor -> effects
    # -> outbox); at the default 5 ms GIL switch interval each hand-off can wait that long.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    with _embedded_servers(args.embedded) as urls:
        if urls is not None:
            cfg = dataclasses.replace(cfg, mqtt_url=urls[0], redis_url=urls[1])
        replica = Replica(cfg, replica_id=args.replica_id)

        def _on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("signal %s: shutting down", signal.Signals(signum).name)
            replica.stop()

        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
        replica.start()
        replica.wait()
        replica.stop()
    return EXIT_OK
