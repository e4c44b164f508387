"""What every benchmark shares: results, percentiles, servers, controller processes, an MQTT
peer that timestamps what it receives, and readers of process and Redis statistics."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import msgspec
import paho.mqtt.client as paho
import redis
from paho.mqtt.enums import CallbackAPIVersion
from redis import Redis

from service.embedded.processes import ControllerProcess, Server, mosquitto_server, redis_server
from service.embedded.topologies import SentinelTopology, sentinel_topology
from service.keys import NUM_SHARDS, Keys
from tests.harness import stop_paho

NODE = "bench-node"
PREFIX = "sedna"
NS = "default"
KEYS = Keys("lifelong")
UPSTREAM = f"{PREFIX}/{NODE}/upstream"
DOWNSTREAM = f"{PREFIX}/{NODE}/downstream"
#: Child processes run `python -m bench...` from here, whatever the caller's directory.
REPO = Path(__file__).resolve().parent.parent


@dataclass
class Result:
    """One figure, its baseline from the same run, and how it compares with the target."""

    id: str
    name: str
    value: float
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    ratio: float | None = None
    target: str = ""
    passed: bool | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def at_most(
        cls,
        id: str,
        name: str,
        value: float,
        unit: str,
        *,
        limit: float,
        limit_name: str,
        target: str,
        details: dict[str, Any],
    ) -> Result:
        """A figure that passes at or below `limit` (named `limit_name`), its baseline too."""
        return cls(
            id,
            name,
            value,
            unit,
            baseline=limit,
            baseline_name=limit_name,
            ratio=value / limit,
            target=target,
            passed=value <= limit,
            details=details,
        )


C = TypeVar("C")


class UpstreamHeader(msgspec.Struct):
    resourceName: str = ""  # noqa: N815


class UpstreamMessage(msgspec.Struct, Generic[C]):
    """An upstream message as a benchmark reads it: its content type names the only
    fields decoded (decoding on the measuring process's MQTT thread must stay cheap)."""

    header: UpstreamHeader
    content: C


def upstream_decoder(content: type[C]) -> Callable[[bytes], UpstreamMessage[C]]:
    return msgspec.json.Decoder(UpstreamMessage[content]).decode  # type: ignore[valid-type]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def distribution_ms(samples_s: list[float]) -> dict[str, float]:
    """p50/p90/p99/max of samples given in seconds, in milliseconds."""
    return {
        "n": len(samples_s),
        "p50_ms": percentile(samples_s, 50) * 1000,
        "p90_ms": percentile(samples_s, 90) * 1000,
        "p99_ms": percentile(samples_s, 99) * 1000,
        "max_ms": max(samples_s) * 1000,
    }


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.02)


# ------------------------------------------------------------------ servers and controllers
@dataclass
class Stack:
    """A private mosquitto and redis-server (never the standard ports) plus controllers;
    with ``sentinel``, the Redis is that topology's master, reached through its sentinels."""

    workdir: Path
    broker: Server
    redis: Server
    controllers: list[Controller] = field(default_factory=list)
    sentinel: SentinelTopology | None = None

    @property
    def mqtt_url(self) -> str:
        return f"mqtt://127.0.0.1:{self.broker.port}"

    @property
    def redis_url(self) -> str:
        if self.sentinel is not None:
            return self.sentinel.url
        return f"redis://127.0.0.1:{self.redis.port}/0"

    def redis_client(self) -> Redis[bytes]:
        """A client of the server that takes writes now (the master, behind Sentinel)."""
        server = self.redis if self.sentinel is None else self.sentinel.master()
        return Redis(port=server.port)

    def controller(self, name: str, env: dict[str, str] | None = None) -> Controller:
        controller = Controller(self, name, env or {})
        self.controllers.append(controller)
        controller.start()
        return controller


@contextlib.contextmanager
def stack(root: Path, name: str) -> Iterator[Stack]:
    workdir = root / name
    broker = mosquitto_server(workdir / "mosquitto")
    store = redis_server(workdir / "redis")
    s = Stack(workdir, broker, store)
    broker.start()
    try:
        store.start()
        try:
            yield s
        finally:
            for controller in s.controllers:
                controller.stop()
            store.stop()
    finally:
        broker.stop()


@contextlib.contextmanager
def sentinel_stack(root: Path, name: str, replicas: int) -> Iterator[Stack]:
    """A stack whose Redis is a master with ``replicas`` replicas and three sentinels."""
    workdir = root / name
    broker = mosquitto_server(workdir / "mosquitto")
    topology = sentinel_topology(workdir / "sentinel", replicas=replicas)
    broker.start()
    try:
        topology.start()
        s = Stack(workdir, broker, topology.master(), sentinel=topology)
        try:
            yield s
        finally:
            for controller in s.controllers:
                controller.stop()
            topology.stop()
    finally:
        broker.stop()


@contextlib.contextmanager
def scratch(keep: bool) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="lifelong-bench-"))
    try:
        yield root
    finally:
        if keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


class Controller(ControllerProcess):
    """`lifelong serve` as a child process (through bench.serve, which sets the log level),
    ready once `start` returns."""

    log_level = "WARNING"

    def __init__(self, s: Stack, name: str, env: dict[str, str]) -> None:
        defaults = {
            "LIFELONG_MQTT_URL": s.mqtt_url,
            "LIFELONG_REDIS_URL": s.redis_url,
            "LIFELONG_NODE_NAME": NODE,
            "LIFELONG_LEASE_SECONDS": "3",
            "LIFELONG_DATASET_POLL_SECONDS": "1",
            "LIFELONG_LOG_FORMAT": "text",
            # every dataset and output dir of a bench lies in its working directory
            "LIFELONG_DATA_ROOTS": str(s.workdir),
        }
        command = [sys.executable, "-m", "bench.serve", self.log_level]
        super().__init__(
            name,
            s.workdir / f"controller-{name}.log",
            {**defaults, **env},
            command=[*command, "serve", "--replica-id", name],
            cwd=REPO,
        )

    def start(self) -> None:
        super().start()
        self.wait_ready(40)


def shard_holders(client: redis.Redis[bytes]) -> dict[int, str]:
    """Shard -> replica id of the holder of its lease (free shards left out)."""
    pipe = client.pipeline(transaction=False)
    for shard in range(NUM_SHARDS):
        pipe.get(KEYS.lease(shard))
    tokens = pipe.execute()
    return {s: t.decode().rpartition(":")[0] for s, t in enumerate(tokens) if t is not None}


def ingress_holder(client: redis.Redis[bytes]) -> str | None:
    token = client.get(KEYS.ingress_lease())
    return None if token is None else str(token.decode().rpartition(":")[0])


def count_jobs(client: redis.Redis[bytes]) -> int:
    pipe = client.pipeline(transaction=False)
    for shard in range(NUM_SHARDS):
        pipe.scard(KEYS.index(shard))
    return int(sum(pipe.execute()))


# ------------------------------------------------------------------ MQTT
def set_nodelay(_client: paho.Client, _userdata: Any, sock: Any) -> None:
    """paho never sets TCP_NODELAY; without it every request/response hop waits ~40 ms."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def make_client(client_id: str, *, max_inflight: int = 20) -> paho.Client:
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
    client.on_socket_open = set_nodelay
    client.max_inflight_messages_set(max_inflight)
    return client


class Peer:
    """The cloud and the workers as one MQTT client; `handler(topic, payload, t)` sees every
    message on paho's network thread, stamped with `time.perf_counter()` on arrival."""

    def __init__(
        self, port: int, topics: list[str], handler: Callable[[str, bytes, float], None]
    ) -> None:
        self._handler = handler
        self._subscribed = threading.Event()
        self.client = make_client(f"bench-peer-{time.time_ns()}", max_inflight=1000)
        self.client.on_connect = lambda c, *_: c.subscribe([(t, 1) for t in topics])
        self.client.on_subscribe = lambda *_: self._subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        if not self._subscribed.wait(10):
            raise TimeoutError("peer never subscribed")

    def _on_message(self, _c: paho.Client, _u: Any, msg: paho.MQTTMessage) -> None:
        self._handler(msg.topic, bytes(msg.payload), time.perf_counter())

    def publish(self, topic: str, payload: bytes) -> paho.MQTTMessageInfo:
        return self.client.publish(topic, payload, qos=1)

    def close(self) -> None:
        stop_paho(self.client)


#: The Models an incremental-learning job of the benchmark names (`incremental_models`).
INITIAL_MODEL, DEPLOY_MODEL = "bench-initial", "bench-deploy"


def job_resource(
    name: str, dataset: str, output_dir: str, *, check_period_s: int = 1,
    incremental: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """A LifelongLearningJob, or with `incremental` an IncrementalLearningJob deploying to
    the Model `DEPLOY_MODEL` from `INITIAL_MODEL`."""
    template = {"spec": {"nodeName": NODE, "containers": [{"image": "x", "name": "w"}]}}
    trigger = {
        "checkPeriodSeconds": check_period_s,
        "timer": {"start": "00:00", "end": "24:00"},
        "condition": {"operator": ">", "threshold": 0, "metric": "num_of_samples"},
    }
    spec: dict[str, Any] = {
        "dataset": {"name": dataset, "trainProb": 0.8},
        "trainSpec": {"template": template, "trigger": trigger},
        "evalSpec": {"template": template},
        "deploySpec": {"template": template},
        "outputDir": output_dir,
    }
    if incremental:
        spec["initialModel"] = {"name": INITIAL_MODEL}
        spec["deploySpec"]["model"] = {"name": DEPLOY_MODEL}
    return {
        "apiVersion": "sedna.io/v1alpha1",
        "kind": "IncrementalLearningJob" if incremental else "LifelongLearningJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def model_resources(directory: Path) -> list[dict[str, Any]]:
    """The two Models of the benchmark's incremental-learning jobs, their files in
    `directory` (the initial one written)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{INITIAL_MODEL}.pkl").write_bytes(b"initial")
    return [
        {
            "apiVersion": "sedna.io/v1alpha1", "kind": "Model",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"url": str(directory / f"{name}.pkl"), "format": "pkl"},
        }
        for name in (INITIAL_MODEL, DEPLOY_MODEL)
    ]  # fmt: skip


def dataset_resource(name: str, url: str) -> dict[str, Any]:
    return {
        "apiVersion": "sedna.io/v1alpha1",
        "kind": "Dataset",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"url": url, "format": "txt", "nodeName": NODE},
    }


def worker_report(
    job: str, kind: str, status: str, models: list[str], seq: int = 0, *,
    owner_kind: str = "LifelongLearningJob",
) -> tuple[str, bytes]:  # fmt: skip
    """The topic and payload of one worker's report; `seq` makes otherwise equal reports
    distinct (it travels in ownerInfo, which is forwarded upstream untouched). A report to
    be forwarded whatever the job's stage is an inference worker's: a train or eval report
    is heard only while the job runs that stage."""
    worker = f"{job}-{kind}-bench"  # as Sedna names a job's worker pods: <job>-<kind>-<suffix>
    message = {
        "name": worker,
        "namespace": NS,
        "ownerName": job,
        "ownerKind": owner_kind,
        "ownerInfo": {"kind": kind, "seq": seq},
        "kind": kind,
        "status": status,
        "results": [{"format": "pkl", "url": url} for url in models],
    }
    return f"{PREFIX}/{NODE}/workers/{worker}/info", json.dumps(message).encode()


def write_lines(path: Path, start: int, end: int) -> None:
    """Append samples start..end-1 in large blocks (a 1M-line file takes well under 1 s)."""
    block = 100_000
    with open(path, "ab") as f:
        for lo in range(start, end, block):
            hi = min(end, lo + block)
            f.write(b"".join(b"sample-%d label-%d\n" % (i, i % 3) for i in range(lo, hi)))


# ------------------------------------------------------------------ process and Redis stats
def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    """VmHWM: the highest resident set size the process ever had."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def commandstats(client: redis.Redis[bytes]) -> dict[str, int]:
    """Calls per command since the server started (commands run inside Lua included)."""
    info = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}


def redis_cpu_s(client: redis.Redis[bytes]) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
