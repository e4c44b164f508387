"""`lifelong serve`: run one controller replica, optionally on its own broker and Redis."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import shlex
import signal
import sys
import tempfile
import threading
import time
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
#: The node `serve --embedded` serves unless told otherwise: the one examples/*.yaml name.
EMBEDDED_NODE = "edge-node"
READY_WAIT_S = 15.0
#: Settings a client must share with the controller, beyond the URLs and the node name.
_SHARED_SETTINGS = ("topic_prefix", "upstream_topic", "key_prefix")
_DEFAULTS = config_mod.Config(node_name=EMBEDDED_NODE)

SERVE_EXAMPLES = """examples:
  lifelong serve                                  # settings: docs/configuration.md
  lifelong serve --mqtt-url mqtt://broker:1883 --redis-url redis://redis:6379/0
  lifelong serve --embedded                       # own mosquitto + redis-server on free ports

With --embedded, the node is edge-node (the one examples/*.yaml name) unless --node-name,
LIFELONG_NODE_NAME or NODENAME says otherwise, and once the replica is ready it prints the
`export` line a second shell needs for `lifelong apply`, `get`, ... to reach it.
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
        "directory, serve against them, and print the exports a second shell needs",
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


def _embedded_config(
    cfg: config_mod.Config, urls: tuple[str, str], node_chosen: bool
) -> config_mod.Config:
    """The settings against the embedded servers; the node the examples name unless the
    user chose one, so `apply -f examples/...` reaches this replica out of the box."""
    node = cfg.node_name if node_chosen else EMBEDDED_NODE
    if not node_chosen:
        print(f"serving node {node} (the examples' node; --node-name to change)", flush=True)
    return dataclasses.replace(cfg, mqtt_url=urls[0], redis_url=urls[1], node_name=node)


def shell_exports(cfg: config_mod.Config) -> str:
    """The `export` line a second shell needs for its `lifelong` commands to reach these
    servers and this node: URLs and node name, and topic and key settings not at default."""
    fields = ["mqtt_url", "redis_url", "node_name"]
    fields += [f for f in _SHARED_SETTINGS if getattr(cfg, f) != getattr(_DEFAULTS, f)]
    variables = config_mod.environment(cfg, fields)
    return "export " + " ".join(f"{name}={shlex.quote(v)}" for name, v in variables.items())


def _announce_when_ready(
    replica: Replica, cfg: config_mod.Config, stopping: threading.Event
) -> None:
    """Print the exports once the replica can take messages (or after a while regardless)."""
    deadline = time.monotonic() + READY_WAIT_S
    while not replica.ready()[0] and time.monotonic() < deadline:
        if stopping.wait(0.1):
            return
    print(f"in another shell:\n{shell_exports(cfg)}", flush=True)


def _serve(args: argparse.Namespace) -> int:
    cfg = config_mod.from_args(args, os.environ)
    setup_logging(cfg.log_format)
    # Several I/O-bound threads hand each event on (paho -> intake -> processor -> effects
    # -> outbox); at the default 5 ms GIL switch interval each hand-off can wait that long.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    with _embedded_servers(args.embedded) as urls:
        if urls is not None:
            cfg = _embedded_config(cfg, urls, config_mod.node_name_chosen(args, os.environ))
        replica = Replica(cfg, replica_id=args.replica_id)
        stopping = threading.Event()

        def _on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("signal %s: shutting down", signal.Signals(signum).name)
            stopping.set()
            replica.stop()

        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
        replica.start()
        if urls is not None:
            _announce_when_ready(replica, cfg, stopping)
        replica.wait()
        replica.stop()
    return EXIT_OK
