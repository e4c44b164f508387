"""Fault-test helpers: a `stack` whose cloud's session survives broker restarts, a look into the
service's Redis from outside, a TCP proxy that makes S3 unreachable on demand, and the
checks every fault test ends with (each upstream message at least once, duplicates share an
id, no transition applied twice)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from service.adapters.redis_store import RedisStore
from service.config import Config
from service.core.lifecycle import transition
from service.core.state import JobState, decode_state
from service.embedded.processes import Server, free_port, wait_port
from service.heartbeat import Clock
from service.history import decode_records
from service.keys import NUM_SHARDS, Keys, job_key
from service.runtime import Replica, Tuning
from service.runtime.processor import Transition
from tests.harness import NODE, Cloud, Controller, lines, model_file, samples_file, wait_ingress
from tests.servers import pipe, redis_server
from tests.stack import Stack
from tests.wait import wait_until


@pytest.fixture
def durable_cloud() -> bool:
    """Fault tests restart brokers: the `stack`'s cloud keeps its session through them."""
    return True


@dataclass
class Probe:
    """Reads the service's Redis from outside: job state, history, outbox, effect intents."""

    store: RedisStore

    def job(self, name: str, namespace: str = "default") -> JobState:
        state = self.job_or_none(name, namespace)
        assert state is not None, f"no state for job {name}"
        return state

    def job_or_none(self, name: str, namespace: str = "default") -> JobState | None:
        raw = self.store.states.load([job_key(namespace, name)])[job_key(namespace, name)]
        if raw is None:
            return None
        state = decode_state(raw)
        assert isinstance(state, JobState)
        return state

    def events(self, name: str, namespace: str = "default") -> Counter[str]:
        """How many events of each type were applied to the job (its history stream)."""
        history = self.store.states.history(job_key(namespace, name), count=1000)
        return Counter(record.event for record in decode_records(history))

    def outbox_depth(self) -> int:
        return sum(map(len, self.store.outboxes.read(range(NUM_SHARDS)).values()))

    def pending_effects(self) -> int:
        return sum(map(len, self.store.outboxes.pending_effects(range(NUM_SHARDS)).values()))


@contextlib.contextmanager
def probe_of(redis_url: str) -> Iterator[Probe]:
    store = RedisStore(redis_url, Keys())
    try:
        yield Probe(store)
    finally:
        store.close()


@pytest.fixture
def aof_redis(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    """redis-server with the AOF on; `request.param` is the appendfsync policy."""
    server = redis_server(
        tmp_path / "redis-aof", "--appendonly", "yes", "--appendfsync", str(request.param)
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


# ------------------------------------------------------------------ controllers


def readyz(controller: Controller) -> int:
    """The HTTP status of the controller's /readyz (0: nothing answered)."""
    return controller.get("/readyz", timeout_s=2)[0]


def wait_exit(controller: Controller, timeout_s: float = 15) -> int:
    """Wait for a controller to die on its own (a failpoint); its exit code."""
    assert controller.proc is not None
    try:
        code = controller.proc.wait(timeout_s)
    except Exception as e:
        raise AssertionError(f"{controller.name} did not die: {controller.log()[-3000:]}") from e
    controller.proc = None
    return code


# ------------------------------------------------------------------ upstream checks


def kind_of(content: dict[str, Any]) -> tuple[str, str, str]:
    """(phase, status, "input"|"output"|"") of an upstream job status."""
    part = "input" if "input" in content else "output" if "output" in content else ""
    return content.get("phase", ""), content.get("status", ""), part


def distinct_upstream(cloud: Cloud, name: str) -> dict[str, dict[str, Any]]:
    """Upstream messages of `name` by id, checking that duplicates are the same message."""
    by_id: dict[str, dict[str, Any]] = {}
    for message in cloud.upstream(name):
        first = by_id.setdefault(message["header"]["id"], message)
        assert first == message, f"two different messages share id {message['header']['id']}"
    return by_id


def assert_once_each(
    cloud: Cloud, job: str, expected: list[tuple[str, str, str]]
) -> None:
    """Every expected upstream job status arrived (maybe more than once, under one id) and
    no transition produced a second one under another id."""
    got = Counter(kind_of(m["content"]) for m in distinct_upstream(cloud, job).values())
    assert got == Counter(expected), f"upstream of {job}: {sorted(got.items())}"


# ------------------------------------------------------------------ S3 outage


class FlakyProxy:
    """A TCP proxy to a real server that can be made unreachable and reachable again.

    While down, every connection is accepted and closed at once (and counted): the client
    sees the endpoint drop it, the way a restarting load balancer or a dead backend looks,
    and the test sees each retry. The server behind keeps its state (moto keeps buckets in
    memory only, so stopping moto itself would wipe them).
    """

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self._target_port = target_port
        self._up = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.refused_at: list[float] = []
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.1)
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self._accepter = threading.Thread(target=self._accept_loop, daemon=True)
        self._accepter.start()
        wait_port(self.port)

    def up(self) -> None:
        self._up.set()

    def down(self) -> None:
        self._up.clear()

    def close(self) -> None:
        self._stop.set()
        self._accepter.join(5)
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()
        for thread in self._threads:
            thread.join(5)

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._up.is_set():
                with self._lock:
                    self.refused_at.append(time.monotonic())
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()  # linger 0: a reset, at once
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self._target_port))
            except OSError:  # the target is down: so is the way through
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                thread = threading.Thread(target=pipe, args=(a, b), daemon=True)
                thread.start()
                self._threads.append(thread)


# ------------------------------------------------------------------ one round


JOB = "fault-classifier"
DATASET = "fault-dataset"
QUIET_POLLS = {"LIFELONG_DATASET_POLL_SECONDS": "3600"}
"""Controller env for tests that want no commit but the ones they cause: the dataset is
polled on insert and then not for an hour (the files are written before the insert)."""

QUIET_TRIGGER = {
    "checkPeriodSeconds": 60,
    "condition": {"operator": ">", "threshold": 0, "metric": "num_of_samples"},
}
"""Fires as soon as samples are pending; its periodic checks (and the one still due when it
fired) are a minute away, past any test, so no Tick is committed behind the test's back."""

FULL_ROUND = [
    ("train", "ready", "input"),
    ("train", "completed", "output"),
    ("eval", "ready", "input"),
    ("eval", "completed", "output"),
    ("deploy", "ready", "input"),
]
OLD_DEPLOY = b"an older, larger model file" * 10


@dataclass
class Round:
    """Round 1 of one job over a local 10-sample txt dataset, step by step."""

    stack: Stack
    model_bytes: int = 64

    @property
    def data(self) -> Path:
        return self.stack.workdir / "data" / "train.txt"

    @property
    def out(self) -> Path:
        return self.stack.workdir / "out"

    @property
    def eval_model(self) -> bytes:
        return (b"evaluated model " * (self.model_bytes // 16 + 1))[: self.model_bytes]

    def prepare(self) -> None:
        """The dataset file and an older, larger deploy file, before any controller runs."""
        samples_file(self.data)
        (self.out / "deploy").mkdir(parents=True, exist_ok=True)
        (self.out / "deploy" / "index.pkl").write_bytes(OLD_DEPLOY)

    def create(self) -> None:
        """Insert the dataset and the job; wait for round 1's train ready."""
        cloud = self.stack.cloud
        cloud.insert_dataset(DATASET, self.data)
        cloud.insert_job(JOB, DATASET, self.out, trigger=QUIET_TRIGGER)
        cloud.wait_status(JOB, "train", "ready")

    def start(self, name: str = "r1") -> Controller:
        """Prepare, start a controller (`QUIET_POLLS`) taking in what the cloud sends, and
        create: round 1's train ready is out. The controller."""
        self.prepare()
        controller = self.stack.serving(name, env=QUIET_POLLS)
        self.create()
        return controller

    def train_model(self) -> str:
        model = self.out / "train" / "1" / "model.pkl"
        return model_file(model, b"trained")

    def scored_model(self) -> str:
        model = self.out / "eval" / "1" / "model.pkl"
        return model_file(model, self.eval_model)

    def train_completed(self) -> None:
        self.stack.cloud.report(JOB, "train", "completed", self.train_model())

    def eval_completed(self) -> None:
        self.stack.cloud.report(JOB, "eval", "completed", self.scored_model())

    def assert_complete(self, probe: Probe) -> None:
        """Round 1 went through exactly once: messages, files, version and event counts,
        once the outbox has drained."""
        wait_until(lambda: probe.outbox_depth() == 0, 10, "the outbox to drain")
        assert_once_each(self.stack.cloud, JOB, FULL_ROUND)
        assert read_lines(self.out / "data" / "train" / "1" / "data.txt") == lines(0, 8)
        assert read_lines(self.out / "data" / "eval" / "1" / "data.txt") == lines(8, 10)
        assert (self.out / "deploy" / "index.pkl").read_bytes() == self.eval_model
        assert not (self.out / "data" / "train" / "2").exists()
        state = probe.job(JOB)
        assert (state.version, state.phase) == (1, "train"), state
        events = probe.events(JOB)
        assert events["WorkerReported"] == 2, events
        assert events["RoundWritten"] == 2, events
        assert events["ModelCopied"] == 1, events
        assert self.stack.cloud.errors() == []


def read_lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


# ------------------------------------------------------------------ in-process replica


@dataclass(frozen=True)
class InProcess:
    """What `wait_ingress` needs of a controller, for a Replica running in the test."""

    name: str
    http_port: int

    def auth_headers(self) -> dict[str, str]:
        return {}  # the in-process replica runs without an HTTP token


@contextlib.contextmanager
def replica_on(
    stack: Stack,
    *,
    clock: Clock | None = None,
    tuning: Tuning | None = None,
    transition: Transition = transition,
    lease_s: float = 2,
) -> Iterator[Replica]:
    """A `Replica` in this process (so the test can hand it a clock, shrink its retry budget
    or wrap its core), started, ready and taking in MQTT; stopped gracefully afterwards."""
    http_port = free_port()
    config = Config.from_env(
        {
            "LIFELONG_MQTT_URL": stack.mqtt_url,
            "LIFELONG_REDIS_URL": stack.redis_url,
            "LIFELONG_NODE_NAME": NODE,
            "LIFELONG_HTTP_ADDR": f"127.0.0.1:{http_port}",
            "LIFELONG_LEASE_SECONDS": str(lease_s),
            "LIFELONG_DATASET_POLL_SECONDS": "1",
            # the test's datasets and output dirs lie in its temporary directory
            "LIFELONG_DATA_ROOTS": str(stack.workdir),
        }
    )
    replica = Replica(
        config, replica_id="in-process", clock=clock, tuning=tuning, transition=transition
    )
    replica.start()
    try:
        wait_until(lambda: replica.ready()[0], 15, "the in-process replica to be ready")
        wait_ingress(InProcess("in-process", http_port), stack.cloud)  # type: ignore[arg-type]
        yield replica
    finally:
        replica.stop()
