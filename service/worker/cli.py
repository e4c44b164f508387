"""`lifelong worker` on the command line."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
from pathlib import Path

from service import config as config_mod
from service.errors import ConfigError
from service.logs import setup_logging
from service.worker.runner import Worker, default_lc_server
from service.worker.tasks import TaskKind, WorkerSettings

log = logging.getLogger("service.worker")

WORKER_EXAMPLES = """examples:
  lifelong worker --train-command 'python train.py' --eval-command 'python eval.py'
  lifelong worker --train-command 'python -m service.demo_model train' \\
                  --eval-command 'python -m service.demo_model eval' --lc-server http://127.0.0.1:9100

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


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `lifelong worker`."""
    parser = commands.add_parser(
        "worker",
        help="run train/eval commands for ready rounds (no Kubernetes needed)",
        description="Listen upstream and run a command for every train or eval ready round.",
        epilog=WORKER_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    parser.set_defaults(func=_worker)


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


def _worker(args: argparse.Namespace) -> int:
    cfg = config_mod.from_args(args, os.environ)
    setup_logging(cfg.log_format)
    worker = Worker(cfg, settings_from_args(args, cfg), client_id=args.client_id)

    def _on_signal(signum: int, _frame: object) -> None:
        log.info("signal %s: stopping the worker", signal.Signals(signum).name)
        worker.request_stop()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    worker.start()
    worker.wait()
    worker.stop()
    return 0
