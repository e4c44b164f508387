"""`lifelong`: the command line of the controller.

Failures print one clear line and exit non-zero, never a traceback.

Exit codes: 0 success; 1 the command ran and found a problem; 2 bad usage or configuration;
3 a server the command needs is unreachable.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Protocol

from service import config as config_mod
from service import demo, embedded, ops, rollback_cli, schemas, worker
from service.errors import ConfigError, ServiceError, TransientError
from service.logs import redact, setup_logging
from service.runtime import Replica

log = logging.getLogger("service.cli")


class CommandModule(Protocol):
    """A module adding subcommands: `register` adds parsers and sets `func=handler`
    (handler(args) -> exit code)."""

    def register(self, commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None: ...


#: Modules contributing further subcommands (apply, get, worker, demo, ...).
COMMAND_MODULES: list[CommandModule] = [ops, rollback_cli, worker, demo]

EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
SWITCH_INTERVAL_S = 0.0005

SERVE_EXAMPLES = """examples:
  lifelong serve                                  # env vars as in the README
  lifelong serve --mqtt-url mqtt://broker:1883 --redis-url redis://redis:6379/0
  lifelong serve --embedded                       # own mosquitto + redis-server on free ports
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lifelong",
        description="Edge controller of Sedna lifelong-learning jobs.",
        epilog="exit codes: 0 ok, 1 problem found, 2 bad usage or configuration, "
        "3 server unreachable",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
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
    schema = commands.add_parser(
        "schemas",
        help="generate schemas/ (JSON Schema + AsyncAPI) from the wire types",
        description="Write the JSON Schemas and AsyncAPI document; --check only compares.",
    )
    schema.add_argument("--check", action="store_true", help="exit 1 if schemas/ is stale")
    schema.add_argument("--out", default=None, help="output directory (default: schemas/)")
    serve.set_defaults(func=_serve)
    schema.set_defaults(func=_schemas)
    for module in COMMAND_MODULES:
        module.register(commands)
    return parser


def _schemas(args: argparse.Namespace) -> int:
    extra = ["--check"] if args.check else []
    extra += ["--out", args.out] if args.out else []
    return schemas.main(extra)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as e:
        print(f"lifelong: {redact(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    except TransientError as e:
        print(f"lifelong: {redact(str(e))}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except ServiceError as e:
        print(f"lifelong: {redact(str(e))}", file=sys.stderr)
        return EXIT_PROBLEM
    except KeyboardInterrupt:
        return 130


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
