"""`lifelong demo`: the whole system on one machine, end to end, in about a minute.

It starts its own mosquitto and redis-server on free ports in a temporary directory, two
controller replicas (`lifelong serve` subprocesses sharing them), and the reference worker
running `python -m service.demo_model` for train and eval. It applies a Dataset and a
LifelongLearningJob, streams labelled thermal-comfort samples into the dataset while the
comfort boundary drifts, and shows each round's phases, sample counts and eval accuracy until
the requested number of rounds is deployed. Its last line is `demo complete: N rounds, ...`.

Everything it starts is stopped on the way out, whether it finished, failed or was
interrupted (Ctrl-C or SIGTERM): each resource is a context manager, entered in order and left
in reverse.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.live import Live
from rich.table import Table

from service import config as config_mod
from service import embedded
from service.adapters.mqtt import MqttClient, MqttSettings
from service.demo_model import CSV_HEADER, comfort_rows, drift_c
from service.errors import BrokerUnavailable, ConfigError
from service.logs import setup_logging
from service.worker import Worker, WorkerSettings, upstream_filter

log = logging.getLogger("service.demo")

NODE = "demo-node"
NAMESPACE = "default"
JOB = "thermal-comfort"
DATASET = "comfort-samples"
REPLICAS = ("r1", "r2")
TRIGGER_SAMPLES = 200
TRAIN_PROB = 0.8
INITIAL_SAMPLES = 60
PACKAGES = ("mosquitto", "redis-server")
READY_TIMEOUT_S = 20.0
PUBACK_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Pace:
    """How fast samples arrive and the controllers look at them."""

    batch_samples: int
    interval_s: float
    dataset_poll_s: float

    @classmethod
    def of(cls, fast: bool) -> Pace:
        return cls(60, 0.25, 0.5) if fast else cls(25, 0.5, 1.0)


# --- servers ----------------------------------------------------------------------------------


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
        embedded.find_binary(name, f"/usr/sbin/{name}", f"/usr/bin/{name}")
    except ConfigError:
        return False
    return True


class Controller:
    """One `lifelong serve` replica as a child process, logging to a file."""

    def __init__(self, replica: str, workdir: Path, env: dict[str, str]) -> None:
        self.replica = replica
        self.http_port = embedded.free_port()
        self.log_path = workdir / f"controller-{replica}.log"
        self._env = {**os.environ, **env, "LIFELONG_HTTP_ADDR": f"127.0.0.1:{self.http_port}"}
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "service.cli", "serve", "--replica-id", self.replica]
        with open(self.log_path, "ab") as out:
            self._proc = subprocess.Popen(argv, env=self._env, stdout=out, stderr=out)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        url = f"http://127.0.0.1:{self.http_port}/readyz"
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                break
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(url, timeout=1),
            ):
                return
            time.sleep(0.1)
        raise BrokerUnavailable(f"controller {self.replica} did not become ready:\n{self.tail()}")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def tail(self, chars: int = 1500) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-chars:]


@contextlib.contextmanager
def controllers(workdir: Path, env: dict[str, str]) -> Iterator[list[Controller]]:
    started = [Controller(replica, workdir, env) for replica in REPLICAS]
    try:
        for controller in started:
            controller.start()
        for controller in started:
            controller.wait_ready(READY_TIMEOUT_S)
        yield started
    finally:
        for controller in started:
            controller.stop()


# --- the data feed ----------------------------------------------------------------------------


class Feeder:
    """Appends labelled samples to the dataset file at a steady pace, drifting as it goes."""

    def __init__(self, path: Path, pace: Pace, seed: int) -> None:
        self._path = path
        self._pace = pace
        self._rng = np.random.default_rng(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feeder", daemon=True)
        self.total = 0
        path.write_text(CSV_HEADER + "\n")
        self.append(INITIAL_SAMPLES)

    @property
    def shift_c(self) -> float:
        return drift_c(self.total)

    def append(self, count: int) -> None:
        rows = comfort_rows(self._rng, count, self.shift_c)
        with open(self._path, "a") as f:
            f.write("".join(row + "\n" for row in rows))
        self.total += count

    def _run(self) -> None:
        while not self._stop.wait(self._pace.interval_s):
            self.append(self._pace.batch_samples)

    def __enter__(self) -> Feeder:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


# --- resources --------------------------------------------------------------------------------


def dataset_resource(url: str) -> dict[str, Any]:
    return {
        "apiVersion": "sedna.io/v1alpha1",
        "kind": "Dataset",
        "metadata": {"name": DATASET, "namespace": NAMESPACE},
        "spec": {"url": url, "format": "csv", "nodeName": NODE},
    }


def job_resource(output_dir: str) -> dict[str, Any]:
    template = {"spec": {"nodeName": NODE, "containers": [{"name": "demo", "image": "local"}]}}
    return {
        "apiVersion": "sedna.io/v1alpha1",
        "kind": "LifelongLearningJob",
        "metadata": {"name": JOB, "namespace": NAMESPACE},
        "spec": {
            "dataset": {"name": DATASET, "trainProb": TRAIN_PROB},
            "trainSpec": {
                "template": template,
                "trigger": {
                    "checkPeriodSeconds": 1,
                    "condition": {
                        "operator": ">=",
                        "threshold": TRIGGER_SAMPLES,
                        "metric": "num_of_samples",
                    },
                },
            },
            "evalSpec": {"template": template},
            "deploySpec": {"template": template},
            "outputDir": output_dir,
        },
    }


def envelope(kind: str, resource: dict[str, Any]) -> bytes:
    """A downstream insert, as the cloud (Sedna's GM through KubeEdge) would send it."""
    header = {
        "namespace": NAMESPACE,
        "resourceKind": kind,
        "resourceName": resource["metadata"]["name"],
        "operation": "insert",
    }
    return json.dumps({"header": header, "content": resource}).encode()


# --- what the demo shows ----------------------------------------------------------------------


@dataclass
class Round:
    version: int
    train_samples: int = 0
    eval_samples: int = 0
    train_accuracy: float | None = None
    accuracy: float | None = None
    state: str = "train"


@dataclass
class Progress:
    """The job as seen from upstream: what the live view and the last line report."""

    samples: int = 0
    phase: str = "waiting"
    rounds: dict[int, Round] = field(default_factory=dict)
    deployed: int = 0
    last_accuracy: float | None = None
    notes: list[str] = field(default_factory=list)

    def update(self, message: dict[str, Any]) -> str | None:
        """Take one upstream message in; returns a line worth printing, if any."""
        content = message.get("content")
        if not isinstance(content, dict):
            return None
        if "numberOfSamples" in content:
            self.samples = int(content["numberOfSamples"])
            return None
        phase, status = content.get("phase"), content.get("status")
        if "input" in content:
            return self._entered(str(phase), str(status), content["input"])
        output = content.get("output")
        if isinstance(output, dict) and status in ("completed", "failed"):
            return self._reported(str(phase), str(status), output)
        return None

    def _entered(self, phase: str, status: str, task_input: dict[str, Any]) -> str | None:
        self.phase = phase if status == "ready" else f"{phase} {status}"
        if phase == "deploy":
            current = self._current()
            if current is None:
                return None
            current.state = "deployed" if status == "ready" else "deploy failed"
            self.deployed += status == "ready"
            self.last_accuracy = current.accuracy
            return f"round {current.version}: {current.state}"
        version = _version(task_input.get("outputDir"))
        if version is None:
            return None
        this = self.rounds.setdefault(version, Round(version))
        count = _samples_in(task_input.get("dataURL"))
        this.state = phase
        if phase == "train":
            this.train_samples = count
            return f"round {version}: training on {count} samples"
        this.eval_samples = count
        return f"round {version}: evaluating on {count} samples"

    def _reported(self, phase: str, status: str, output: dict[str, Any]) -> str | None:
        current = self._current()
        if current is None:
            return None
        if status == "failed":
            current.state = f"{phase} failed"
            return f"round {current.version}: {phase} failed: {output.get('ownerInfo')}"
        metrics = _first_metrics(output)
        if phase == "train" and "train_accuracy" in metrics:
            current.train_accuracy = float(metrics["train_accuracy"])
        if phase == "eval" and "accuracy" in metrics:
            current.accuracy = float(metrics["accuracy"])
            return f"round {current.version}: eval accuracy {current.accuracy:.2f}"
        return None

    def _current(self) -> Round | None:
        return self.rounds[max(self.rounds)] if self.rounds else None

    def table(self, target_rounds: int, elapsed_s: float) -> Table:
        table = Table(
            title=f"lifelong demo: job {JOB} ({len(REPLICAS)} controller replicas)",
            caption=f"phase {self.phase} | dataset {self.samples} samples | "
            f"{self.deployed}/{target_rounds} rounds deployed | {elapsed_s:.0f}s",
        )
        for column in ("round", "state", "train samples", "train acc", "eval samples",
                       "eval accuracy"):
            table.add_column(column, justify="left" if column == "state" else "right")
        for r in sorted(self.rounds.values(), key=lambda r: r.version):
            table.add_row(str(r.version), r.state, str(r.train_samples),
                          _pct(r.train_accuracy), str(r.eval_samples), _pct(r.accuracy))
        return table


def _version(output_dir: object) -> int | None:
    tail = str(output_dir or "").rstrip("/").rsplit("/", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _samples_in(data_url: object) -> int:
    """Samples in a round's csv file (header excluded); 0 if it cannot be read."""
    try:
        with open(str(data_url), "rb") as f:
            return max(0, sum(1 for _ in f) - 1)
    except OSError:
        return 0


def _first_metrics(output: dict[str, Any]) -> dict[str, Any]:
    models = output.get("models")
    if isinstance(models, list) and models and isinstance(models[0], dict):
        metrics = models[0].get("metrics")
        return metrics if isinstance(metrics, dict) else {}
    return {}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


# --- the run ----------------------------------------------------------------------------------


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
    accuracy = _pct(progress.last_accuracy)
    print(f"demo complete: {progress.deployed} rounds, last accuracy {accuracy}, "
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
    broker = embedded.mosquitto_server(workdir / "mosquitto")
    redis = embedded.redis_server(workdir / "redis", "--appendonly", "yes")
    with embedded.running(broker, redis):
        mqtt_url = f"mqtt://127.0.0.1:{broker.port}"
        env = {
            "LIFELONG_MQTT_URL": mqtt_url,
            "LIFELONG_REDIS_URL": f"redis://127.0.0.1:{redis.port}/0",
            "LIFELONG_NODE_NAME": NODE,
            "LIFELONG_LEASE_SECONDS": "2",
            "LIFELONG_DATASET_POLL_SECONDS": str(pace.dataset_poll_s),
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
        subscriptions=[upstream_filter(cfg)],
    )
    client.start()
    try:
        if not client.wait_connected(READY_TIMEOUT_S):
            raise BrokerUnavailable("demo: no connection to its own broker")
        yield client
    finally:
        client.stop()


@contextlib.contextmanager
def _worker(cfg: config_mod.Config, replica: Controller, workdir: Path) -> Iterator[Worker]:
    model = (sys.executable, "-m", "service.demo_model")
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
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so every `finally` stops what it started."""

    def _raise(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --- command line -----------------------------------------------------------------------------


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
    with _sigterm_as_interrupt():
        return run(options, Console())
