"""The commands that run something until stopped: `lifelong serve` (one controller replica,
optionally on its own broker and Redis), `lifelong worker` (the reference worker runner of
`service.worker`) and `lifelong demo` (the end-to-end demo of `service.demo`)."""


import argparse
import contextlib
import dataclasses
import gc
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

from rich.console import Console

from service import config as config_mod
from service.cli.arguments import Subcommands, subcommand
from service.cli.connections import EXIT_OK
from service.demo.run import DemoOptions, run, sigterm_as_interrupt
from service.embedded import processes
from service.errors import ConfigError
from service.logs import setup_logging
from service.runtime import Replica
from service.worker import TaskKind, Worker, WorkerSettings, default_lc_server

log = logging.getLogger("service.cli")
worker_log = logging.getLogger("service.worker")

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


def register_serve(commands: Subcommands) -> None:
    """Add serve."""
    serve = subcommand(
        commands, "serve", "run the controller", SERVE_EXAMPLES,
        description="Run one controller replica (several may share one Redis and broker).",
    )  # fmt: skip
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
        broker = processes.mosquitto_server(Path(tmp) / "mosquitto")
        redis = processes.redis_server(Path(tmp) / "redis", "--appendonly", "yes")
        broker.own_session = redis.own_session = True  # stopped after the replica's stop
        with processes.running(broker, redis):
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

        # a closed terminal (SIGHUP) too: the embedded servers, in sessions of their own,
        # are stopped on the way out
        for stop_signal in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(stop_signal, _on_signal)
        # What is alive now (modules, their clients and tables: ~75,000 objects) lives as
        # long as the process: out of the collector's sight, a full collection need not
        # walk it each time (55 ms each on the bench's machine, 7% of the CPU of a burst).
        gc.collect()
        gc.freeze()
        replica.start()
        if urls is not None:
            _announce_when_ready(replica, cfg, stopping)
        replica.wait()
        replica.stop()
    return EXIT_OK


WORKER_EXAMPLES = """examples:
  lifelong worker --train-command 'python train.py' --eval-command 'python eval.py'
  lifelong worker --train-command 'python -m service.demo.comfort train' \\
                  --eval-command 'python -m service.demo.comfort eval' --lc-server http://127.0.0.1:9100

The command gets NAMESPACE, JOB_NAME, WORKER_NAME, TRAIN_DATASET_URL (train) or
TEST_DATASET_URL and MODEL_URLS (eval, ';'-separated), OUTPUT_URL, ORIGINAL_DATASET_URL (when
known), LC_SERVER and LIFELONG_RESULTS_FILE, and of the runner's environment only PATH, HOME,
USER, LOGNAME, SHELL, LANG, LANGUAGE, LC_*, TZ, TMPDIR, TERM, PYTHONPATH, VIRTUAL_ENV,
CUDA_VISIBLE_DEVICES and what --pass-env names (never a LIFELONG_ setting: the broker
password and the HTTP token stay with the runner; give the token in LIFELONG_HTTP_TOKEN or
--http-token-file). It writes its results there as JSON:
  {"results": [{"format": "pkl", "url": "/out/train/1/model.pkl", "metrics": {"acc": [0.9]}}]}
Exit 0 reports completed with them; another exit code reports failed with the stderr tail.
An eval of a job with a deploy condition also gets DEPLOYED_MODEL_URL (the deployed model,
also last in MODEL_URLS): report the new model's result first, the deployed model's second.
"""


def register_worker(commands: Subcommands) -> None:
    """Add `lifelong worker`."""
    parser = subcommand(
        commands, "worker", "run train/eval commands for ready rounds (no Kubernetes needed)",
        WORKER_EXAMPLES,
        description="Listen upstream and run a command for every train or eval ready round.",
    )  # fmt: skip
    config_mod.add_arguments(parser)
    parser.add_argument("--train-command", default=None, metavar="CMD",
                        help="command run for train rounds (shell-style words, no shell)")
    parser.add_argument("--eval-command", default=None, metavar="CMD",
                        help="command run for eval rounds")
    parser.add_argument("--lc-server", default=None, metavar="URL",
                        help="report over HTTP to this controller URL (also the command's "
                        "LC_SERVER); default: report over MQTT, LC_SERVER from --http-addr")
    parser.add_argument("--job", action="append", default=[], metavar="NAME",
                        help="serve only this job (repeatable; default: every job)")
    parser.add_argument("--original-dataset-url", default=None, metavar="URL",
                        help="ORIGINAL_DATASET_URL for the command when no data index is sent")
    parser.add_argument("--timeout-seconds", type=float, default=None, metavar="S",
                        help="kill a command running longer and report it failed")
    parser.add_argument("--work-dir", default=None, metavar="DIR",
                        help="keep each task's stdout, stderr and results file here")
    parser.add_argument("--pass-env", action="append", default=[], metavar="NAME",
                        help="also give the commands this variable of the runner's environment "
                        "(repeatable; e.g. AWS_ACCESS_KEY_ID for s3:// data)")
    parser.add_argument("--client-id", default=None, metavar="ID",
                        help="MQTT client id (default lifelong-worker-NODE; one runner per id)")
    parser.set_defaults(func=_run_worker)


def settings_from_args(args: argparse.Namespace, cfg: config_mod.Config) -> WorkerSettings:
    commands: dict[TaskKind, tuple[str, ...]] = {}
    if args.train_command:
        commands["train"] = tuple(shlex.split(args.train_command))
    if args.eval_command:
        commands["eval"] = tuple(shlex.split(args.eval_command))
    if not commands:
        raise ConfigError("worker: give --train-command and/or --eval-command")
    if args.timeout_seconds is not None and args.timeout_seconds <= 0:
        raise ConfigError("--timeout-seconds must be > 0")
    return WorkerSettings(
        commands=commands,
        lc_server=args.lc_server or default_lc_server(cfg),
        report_http=args.lc_server is not None,
        jobs=frozenset(args.job),
        original_dataset_url=args.original_dataset_url,
        timeout_s=args.timeout_seconds,
        work_dir=Path(args.work_dir) if args.work_dir else None,
        pass_env=tuple(args.pass_env),
    )


def _run_worker(args: argparse.Namespace) -> int:
    cfg = config_mod.from_args(args, os.environ)
    setup_logging(cfg.log_format)
    worker = Worker(cfg, settings_from_args(args, cfg), client_id=args.client_id)

    def _on_signal(signum: int, _frame: object) -> None:
        worker_log.info("signal %s: stopping the worker", signal.Signals(signum).name)
        worker.request_stop()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    worker.start()
    worker.wait()
    worker.stop()
    return 0


def register_demo(commands: Subcommands) -> None:
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
