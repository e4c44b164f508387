"""The floors the service is compared with, measured on the same broker, Redis and disk: an
MQTT relay (round trip and rate), a Redis PING, pipelined EVALSHA, a durable small-file write
and a naive one-at-a-time "QoS 1 in -> EVALSHA -> QoS 1 out" loop."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.common import REPO, Peer, Result, Stack, distribution_ms, percentile
from bench.relay import NAIVE_SCRIPT

PAYLOAD = b'{"name":"w","ownerName":"job","kind":"train","status":"running",' + b'"x":"' * 40


@dataclass
class Floors:
    """The baseline numbers later benchmarks divide by."""

    relay_rtt_p50_s: float
    relay_rate_per_s: float
    redis_rtt_p50_s: float
    durable_write_p50_s: float
    naive_rate_per_s: float

    @property
    def transition_floor_s(self) -> float:
        """What a transition cannot beat: one relay round trip, one Redis round trip and one
        durable small-file write (the round file or model copy before its `ready` goes out)."""
        return self.relay_rtt_p50_s + self.redis_rtt_p50_s + self.durable_write_p50_s


@contextlib.contextmanager
def relay(s: Stack, topic_in: str, topic_out: str, *, naive: bool = False) -> Iterator[None]:
    argv = [sys.executable, "-m", "bench.relay", str(s.broker.port), topic_in, topic_out]
    if naive:
        argv.append(str(s.redis.port))
    proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError("relay did not start")
        yield
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def round_trips_s(port: int, topic_in: str, topic_out: str, n: int) -> list[float]:
    """Publish, wait for the relayed copy, repeat: n round trips, one at a time."""
    arrived = threading.Event()
    peer = Peer(port, [topic_out], lambda *_: arrived.set())
    samples: list[float] = []
    try:
        for _ in range(n + 20):
            arrived.clear()
            started = time.perf_counter()
            peer.publish(topic_in, PAYLOAD)
            if not arrived.wait(5):
                raise TimeoutError("relayed message never arrived")
            samples.append(time.perf_counter() - started)
    finally:
        peer.close()
    return samples[20:]  # the first few warm up connections and caches


def rate_per_s(port: int, topic_in: str, topic_out: str, n: int) -> float:
    """Publish n messages as fast as QoS 1 allows; messages/s until the last one is relayed."""
    lock = threading.Lock()
    state = {"count": 0, "last": 0.0}
    done = threading.Event()

    def on_message(_topic: str, _payload: bytes, t: float) -> None:
        with lock:
            state["count"] += 1
            state["last"] = t
            if state["count"] >= n:
                done.set()

    peer = Peer(port, [topic_out], on_message)
    try:
        started = time.perf_counter()
        for _ in range(n):
            peer.publish(topic_in, PAYLOAD)
        if not done.wait(120):
            raise TimeoutError(f"only {state['count']} of {n} relayed messages arrived")
    finally:
        peer.close()
    return n / (state["last"] - started)


def redis_rtts_s(client: redis.Redis[bytes], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        client.ping()
        samples.append(time.perf_counter() - started)
    return samples


def durable_writes_s(directory: Path, n: int, size: int = 512) -> list[float]:
    """Write, fsync, rename over the target, fsync the directory: what the service does for a
    small round file before announcing it."""
    directory.mkdir(parents=True, exist_ok=True)
    target, staging = directory / "data.txt", directory / ".data.txt.tmp"
    data = b"x" * (size - 1) + b"\n"
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(staging, target)
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        samples.append(time.perf_counter() - started)
    return samples


def evalsha_rate_per_s(client: redis.Redis[bytes], n: int, batch: int = 500) -> float:
    sha = client.script_load(NAIVE_SCRIPT)  # type: ignore[no-untyped-call]
    started = time.perf_counter()
    for lo in range(0, n, batch):
        pipe = client.pipeline(transaction=False)
        for i in range(lo, min(n, lo + batch)):
            pipe.evalsha(sha, 2, "pipelined:state", "pipelined:count", i)
        pipe.execute()
    return n / (time.perf_counter() - started)


def measure(s: Stack, *, round_trips: int, burst: int) -> tuple[Floors, list[Result]]:
    """Rates are the best of three bursts: on a shared machine a single burst mostly
    measures the neighbours, and a floor is what the setup can do at its best."""
    port = s.broker.port
    with relay(s, "relay/in", "relay/out"):
        relay_rtt = round_trips_s(port, "relay/in", "relay/out", round_trips)
        relay_rate = max(rate_per_s(port, "relay/in", "relay/out", burst) for _ in range(3))
    with relay(s, "naive/in", "naive/out", naive=True):
        naive_rtt = round_trips_s(port, "naive/in", "naive/out", round_trips)
        naive_rate = max(rate_per_s(port, "naive/in", "naive/out", burst) for _ in range(3))
    client = s.redis_client()
    redis_rtt = redis_rtts_s(client, 2000)
    evalsha = evalsha_rate_per_s(client, 20_000)
    client.close()
    writes = durable_writes_s(s.workdir / "durable-write", 300)
    floors = Floors(
        relay_rtt_p50_s=percentile(relay_rtt, 50),
        relay_rate_per_s=relay_rate,
        redis_rtt_p50_s=percentile(redis_rtt, 50),
        durable_write_p50_s=percentile(writes, 50),
        naive_rate_per_s=naive_rate,
    )
    relay_ms = distribution_ms(relay_rtt)
    naive_ms = distribution_ms(naive_rtt)
    results = [
        Result(
            "b.relay_rtt",
            "MQTT QoS 1 relay round trip p50",
            relay_ms["p50_ms"],
            "ms",
            details=relay_ms,
        ),
        Result(
            "b.relay_rate",
            "MQTT QoS 1 relay throughput",
            relay_rate,
            "msg/s",
            details={"messages": burst},
        ),
        Result(
            "b.redis_rtt",
            "Redis round trip (PING) p50",
            floors.redis_rtt_p50_s * 1000,
            "ms",
            details=distribution_ms(redis_rtt),
        ),
        Result(
            "b.durable_write",
            "durable small-file write (write, fsync, rename, fsync dir) p50",
            floors.durable_write_p50_s * 1000,
            "ms",
            details=distribution_ms(writes),
        ),
        Result(
            "b.evalsha_rate",
            "pipelined EVALSHA",
            evalsha,
            "calls/s",
            details={"calls": 20_000, "pipeline": 500},
        ),
        Result(
            "b.naive_rtt",
            "naive loop (QoS1 in -> EVALSHA -> QoS1 out) p50",
            naive_ms["p50_ms"],
            "ms",
            baseline=relay_ms["p50_ms"],
            baseline_name="relay round trip p50",
            ratio=naive_ms["p50_ms"] / relay_ms["p50_ms"],
            details=naive_ms,
        ),
        Result(
            "b.naive_rate",
            "naive loop throughput",
            naive_rate,
            "events/s",
            baseline=relay_rate,
            baseline_name="relay throughput",
            ratio=naive_rate / relay_rate,
            details={"messages": burst},
        ),
    ]
    return floors, results
