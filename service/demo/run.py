"""One demo run: the servers it runs on (mosquitto, redis-server and two controller replicas),
the worker and the feed up, then follow upstream until done.
"""


import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from service import config as config_mod
from service.adapters.mqtt import MqttClient, MqttSettings
from service.demo.scenario import (
    NODE,
    REPLICAS,
    Feeder,
    Pace,
    Progress,
    dataset_resource,
    envelope,
    job_resource,
    pct,
)
from service.embedded import processes
from service.embedded.processes import ControllerProcess
from service.errors import BrokerUnavailable, ConfigError
from service.worker import Worker, WorkerSettings

PACKAGES = ("mosquitto", "redis-server")
READY_TIMEOUT_S = 20.0


def ensure_servers() -> None:
    """mosquitto and redis-server on the PATH, installed with apt-get when root on Debian."""
    missing = [name for name in PACKAGES if not _found(name)]
    if not missing:
        return
    debian = Path("/etc/debian_version").exists() and shutil.which("apt-get") is not None
    if not (debian and os.geteuid() == 0):
        raise ConfigError(
            f"demo needs {' and '.join(missing)} on the PATH: install them "
            f"(Debian/Ubuntu: sudo apt-get install {' '.join(PACKAGES)}; macOS: brew install "
            "mosquitto redis) or run the stack with `docker compose up`"
        )
    print(f"installing {' '.join(missing)} with apt-get ...", file=sys.stderr, flush=True)
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            raise ConfigError(f"{' '.join(argv)} failed (exit {done.returncode})")


def _found(name: str) -> bool:
    try:
        processes.find_binary(name, f"/usr/sbin/{name}", f"/usr/bin/{name}")
    except ConfigError:
        return False
    return True


@contextlib.contextmanager
def controllers(workdir: Path, env: dict[str, str]) -> Iterator[list[ControllerProcess]]:
    """The demo's replicas, started and ready (BrokerUnavailable with a replica's log
    otherwise); stopped at the end."""
    started = [
        ControllerProcess(replica, workdir / f"controller-{replica}.log", env)
        for replica in REPLICAS
    ]
    try:
        for controller in started:
            controller.start()
        for controller in started:
            try:
                controller.wait_ready(READY_TIMEOUT_S)
            except (RuntimeError, TimeoutError) as e:
                raise BrokerUnavailable(str(e)) from e
        yield started
    finally:
        for controller in started:
            controller.stop()


PUBACK_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class DemoOptions:
    rounds: int
    fast: bool
    timeout_s: float
    seed: int


def run(options: DemoOptions, console: Console) -> int:
    """Run the demo; 0 when `options.rounds` rounds were deployed in time."""
    ensure_servers()
    started_s = time.monotonic()
    pace = Pace.of(options.fast)
    progress = Progress()
    with tempfile.TemporaryDirectory(prefix="lifelong-demo-") as tmp:
        workdir = Path(tmp)
        outcome = _run_in(workdir, options=options, pace=pace, progress=progress,
                          console=console, started_s=started_s)
    if not outcome:
        print(f"demo failed: {progress.deployed} of {options.rounds} rounds deployed in "
              f"{options.timeout_s:g}s", file=sys.stderr)
        return 1
    accuracy = pct(progress.last_accuracy)
    print(f"demo complete: {progress.finished} rounds, {progress.deployed} deployed, "
          f"{progress.held_back} held back by the deploy gate, last accuracy {accuracy}, "
          f"{progress.samples} samples, {time.monotonic() - started_s:.0f}s", flush=True)
    return 0


def _run_in(
    workdir: Path,
    *,
    options: DemoOptions,
    pace: Pace,
    progress: Progress,
    console: Console,
    started_s: float,
) -> bool:
    broker = processes.mosquitto_server(workdir / "mosquitto")
    redis = processes.redis_server(workdir / "redis", "--appendonly", "yes")
    broker.own_session = redis.own_session = True  # stopped after the controllers' stop
    with processes.running(broker, redis):
        mqtt_url = f"mqtt://127.0.0.1:{broker.port}"
        env = {
            "LIFELONG_MQTT_URL": mqtt_url,
            "LIFELONG_REDIS_URL": f"redis://127.0.0.1:{redis.port}/0",
            "LIFELONG_NODE_NAME": NODE,
            "LIFELONG_LEASE_SECONDS": "2",
            "LIFELONG_DATASET_POLL_SECONDS": str(pace.dataset_poll_s),
            # the demo's dataset and output dir lie in its temporary directory
            "LIFELONG_DATA_ROOTS": str(workdir),
        }
        cfg = config_mod.Config.from_env(env)
        with controllers(workdir, env) as replicas, _client(cfg) as client, _worker(
            cfg, replicas[0], workdir
        ):
            data = workdir / "data" / "comfort.csv"
            data.parent.mkdir()
            with Feeder(data, pace, options.seed):
                _publish(client, cfg, envelope("dataset", dataset_resource(str(data))))
                _publish(client, cfg, envelope("lifelonglearningjob",
                                               job_resource(str(workdir / "out"))))
                return _watch(client, options, progress, console, started_s)


@contextlib.contextmanager
def _client(cfg: config_mod.Config) -> Iterator[MqttClient]:
    client = MqttClient(
        MqttSettings(url=cfg.mqtt_url, client_id=f"lifelong-demo-{os.getpid()}"),
        subscriptions=[cfg.upstream_topic_filter()],
    )
    client.start()
    try:
        if not client.wait_connected(READY_TIMEOUT_S):
            raise BrokerUnavailable("demo: no connection to its own broker")
        yield client
    finally:
        client.stop()


@contextlib.contextmanager
def _worker(cfg: config_mod.Config, replica: ControllerProcess, workdir: Path) -> Iterator[Worker]:
    model = (sys.executable, "-m", "service.demo.comfort")
    worker = Worker(
        cfg,
        WorkerSettings(
            commands={"train": (*model, "train"), "eval": (*model, "eval")},
            lc_server=f"http://127.0.0.1:{replica.http_port}",
            work_dir=workdir / "worker",
            timeout_s=60,
        ),
        client_id="lifelong-demo-worker",
    )
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()


def _publish(client: MqttClient, cfg: config_mod.Config, payload: bytes) -> None:
    if not client.publish(cfg.downstream_topic(), payload).wait(PUBACK_TIMEOUT_S):
        raise BrokerUnavailable("demo: the broker did not acknowledge a resource")


def _watch(
    client: MqttClient, options: DemoOptions, progress: Progress, console: Console,
    started_s: float,
) -> bool:
    """Follow upstream until enough rounds are deployed (True) or time runs out (False)."""
    deadline_s = started_s + options.timeout_s
    live = Live(console=console, auto_refresh=False) if console.is_terminal else None
    with live if live is not None else contextlib.nullcontext():
        while progress.deployed < options.rounds:
            if time.monotonic() > deadline_s:
                return False
            for message in _drain(client):
                line = progress.update(message)
                if line is not None and live is None:
                    print(line, flush=True)
            if live is not None:
                live.update(progress.table(options.rounds, time.monotonic() - started_s),
                            refresh=True)
        return True


def _drain(client: MqttClient) -> list[dict[str, Any]]:
    """Upstream messages received so far (waiting briefly for the first)."""
    messages: list[dict[str, Any]] = []
    timeout_s = 0.1
    while True:
        try:
            item = client.inbound.get(timeout=timeout_s)
        except queue.Empty:
            return messages
        timeout_s = 0
        with contextlib.suppress(ValueError):
            body = json.loads(item.payload)
            if isinstance(body, dict):
                messages.append(body)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP (a closed terminal) unwind like Ctrl-C, so every `finally` stops
    what it started (the servers, in sessions of their own, get no signal of their own)."""

    def _raise(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, _raise) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
