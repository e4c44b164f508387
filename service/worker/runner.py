"""The runner: listens upstream and runs one task at a time."""

from __future__ import annotations

import json
import logging
import os
import queue
import shlex
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from service import config as config_mod
from service.adapters.mqtt import Inbound, MqttClient, MqttSettings
from service.errors import BrokerUnavailable, PermanentError, TransientError
from service.worker.commands import Stopped, run_command
from service.worker.reports import HttpReporter, MqttReporter, Reporter, worker_message
from service.worker.tasks import Task, WorkerSettings, command_env, parse_ready, task_env

log = logging.getLogger("service.worker")

SEEN_IDS_MAX = 10_000
SESSION_EXPIRY_S = 3600
_POLL_S = 0.2


class Worker:
    """Listens upstream and runs one task at a time until `stop`."""

    def __init__(
        self,
        cfg: config_mod.Config,
        settings: WorkerSettings,
        *,
        client_id: str | None = None,
    ) -> None:
        self._cfg = cfg
        self._settings = settings
        self._stopping = threading.Event()
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._work_root = settings.work_dir or Path(tempfile.mkdtemp(prefix="lifelong-worker-"))
        self._own_work_root = settings.work_dir is None
        self._client = MqttClient(
            MqttSettings(
                url=cfg.mqtt_url,
                client_id=client_id or f"lifelong-worker-{cfg.node_name}",
                clean_start=False,
                session_expiry_s=SESSION_EXPIRY_S,
                manual_ack=True,
            ),
            subscriptions=[cfg.upstream_topic_filter()],
        )
        self._reporter: Reporter = (
            HttpReporter(settings.lc_server, token=cfg.http_bearer_token())
            if settings.report_http
            else MqttReporter(self._client, cfg)
        )
        self._thread = threading.Thread(target=self._loop, name="worker", daemon=True)
        self.tasks_done = 0

    def start(self, connect_timeout_s: float = 10.0) -> None:
        """Connect, subscribe and begin serving; raises BrokerUnavailable if the broker stays
        away. Returns once the broker acknowledged the subscription: on a first start it
        holds no session for the runner yet, and a ready message published before that
        would never reach it."""
        self._client.start()
        deadline = time.monotonic() + connect_timeout_s
        while not self._client.subscribed:
            if self._stopping.is_set():
                return  # a signal asked to stop meanwhile: `wait` returns at once
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerUnavailable(
                    f"worker: not connected and subscribed after {connect_timeout_s:g}s"
                )
            self._stopping.wait(_POLL_S / 4)
        log.info("worker serving node %s: subscribed to %s", self._cfg.node_name,
                 self._cfg.upstream_topic_filter())  # fmt: skip
        self._thread.start()

    def request_stop(self) -> None:
        """Ask the runner to stop (safe from a signal handler); a running command is killed."""
        self._stopping.set()

    def stop(self) -> None:
        """Stop serving: end a running command unreported (its message stays unacknowledged,
        so the broker hands it to the next session) and disconnect. Idempotent."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self._client.stop()
        if self._own_work_root:
            shutil.rmtree(self._work_root, ignore_errors=True)

    def wait(self) -> None:
        """Block until `stop` (from a signal handler or another thread)."""
        while not self._stopping.wait(1.0):
            pass

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                msg = self._client.inbound.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            try:
                self._handle(msg)
            except Stopped:
                log.info("worker stopped mid-task; the round is rerun on the next start")
                return
            except Exception:
                log.exception("worker: handling a message on %s failed", msg.topic)

    def _handle(self, msg: Inbound) -> None:
        task = parse_ready(msg.payload)
        if task is None or not self._wanted(task):
            self._client.ack(msg)
            return
        if task.message_id in self._seen:
            log.info("duplicate ready %s for %s: already run", task.message_id, task.worker_name)
            self._client.ack(msg)
            return
        self._run_task(task)
        self._remember(task.message_id)
        self._client.ack(msg)

    def _wanted(self, task: Task) -> bool:
        jobs = self._settings.jobs
        return task.kind in self._settings.commands and (not jobs or task.job in jobs)

    def _remember(self, message_id: str) -> None:
        self._seen[message_id] = None
        while len(self._seen) > SEEN_IDS_MAX:
            self._seen.popitem(last=False)

    def _task_dir(self, worker: str) -> Path:
        """The task's directory, made empty: a rerun starts clean, with no stale results file.
        `worker` is a DNS-1123 name (`parse_ready` refuses others), so this is a child of the
        work root; whatever was planted there is removed (a link is never followed)."""
        task_dir = self._work_root / worker
        if task_dir.is_symlink() or task_dir.is_file():
            task_dir.unlink()
        elif task_dir.exists():
            shutil.rmtree(task_dir)
        task_dir.mkdir(parents=True)
        return task_dir

    def _run_task(self, task: Task) -> None:
        worker = task.worker_name
        task_dir = self._task_dir(worker)
        if "://" not in task.output_dir:
            Path(task.output_dir).mkdir(parents=True, exist_ok=True)
        env = command_env(os.environ, self._settings.pass_env)
        env |= task_env(task, self._settings, task_dir / "results.json")
        log.info("%s: running %s", worker, shlex.join(self._settings.commands[task.kind]))
        self._report(task, worker_message(task, "running"))
        outcome = run_command(
            self._settings.commands[task.kind], env, task_dir, self._settings.timeout_s,
            self._stopping,
        )
        log.info("%s: %s %s", worker, outcome.status, json.dumps(outcome.owner_info)[:300])
        self._report(task, worker_message(task, outcome.status, outcome.results,
                                          outcome.owner_info))
        self.tasks_done += 1

    def _report(self, task: Task, message: dict[str, Any]) -> None:
        try:
            self._reporter.report(task.worker_name, message)
        except (TransientError, PermanentError) as e:
            log.error("%s: %s report not delivered: %s", task.worker_name, message["status"], e)


def default_lc_server(cfg: config_mod.Config) -> str:
    """The controller's HTTP address as a URL (a wildcard bind is reached on loopback)."""
    host, port = cfg.http_host_port()
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
