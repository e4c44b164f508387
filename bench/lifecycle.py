"""The service on its hot path: transition latency, report throughput (one and two replicas),
Redis commands per report, and failover after a SIGKILL."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import redis

from bench.baselines import Floors
from bench.common import (
    DOWNSTREAM,
    UPSTREAM,
    Controller,
    Peer,
    Result,
    Stack,
    commandstats,
    count_jobs,
    cpu_seconds,
    dataset_resource,
    distribution_ms,
    ingress_holder,
    job_resource,
    model_resources,
    percentile,
    shard_holders,
    upstream_decoder,
    wait_until,
    worker_report,
    write_lines,
)
from service.keys import NUM_SHARDS, shard_of
from tests.harness import envelope

MONITOR_STOP = "bench-monitor-stop"


class _OwnerInfo(msgspec.Struct):
    seq: int = 0


class _Output(msgspec.Struct):
    ownerInfo: _OwnerInfo = msgspec.field(default_factory=_OwnerInfo)  # noqa: N815


class _Content(msgspec.Struct):
    status: str = ""
    phase: str = ""
    input: dict[str, Any] | None = None
    output: _Output | None = None


_decode_upstream = upstream_decoder(_Content)


@dataclass
class Upstream:
    """What the cloud saw upstream: `ready` arrivals per (job, phase) and forwarded reports
    by their `seq`, each with its arrival time.

    The handler runs on the measuring process's paho thread for every message, so it reads
    only the fields it needs, and during a burst wakes the waiter only once the burst is all
    in (`forwarded_target`): a wake-up per message would make the measuring process, which
    shares the machine's two cores with the controller, the cost being measured.
    """

    cond: threading.Condition = field(default_factory=threading.Condition)
    ready: dict[tuple[str, str], float] = field(default_factory=dict)
    forwarded: dict[int, float] = field(default_factory=dict)
    forwarded_target: int | None = None

    def handle(self, _topic: str, payload: bytes, t: float) -> None:
        message = _decode_upstream(payload)
        name, content = message.header.resourceName, message.content
        with self.cond:
            if content.status == "ready" and content.input is not None:
                self.ready.setdefault((name, content.phase), t)
            if content.output is not None:
                self.forwarded.setdefault(content.output.ownerInfo.seq, t)
                target = self.forwarded_target
                if target is not None and len(self.forwarded) < target:
                    return
            self.cond.notify_all()

    def wait(self, predicate: Any, timeout_s: float, what: str) -> None:
        with self.cond:
            if not self.cond.wait_for(predicate, timeout_s):
                raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")


def insert_jobs(peer: Peer, names: list[str], dataset: str, out: Path, **kw: Any) -> None:
    for name in names:
        resource = job_resource(name, dataset, str(out / name), **kw)
        peer.publish(DOWNSTREAM, envelope(resource, kind=resource["kind"].lower(), name=name))


def wait_ingress(peer: Peer, seen: Upstream, job: str, timeout_s: float = 20) -> None:
    """The first ingress session must exist before a burst: probe with a report until one is
    forwarded (a first connection has no session in which the broker could queue it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        peer.publish(*worker_report(job, "inference", "running", [], seq=-1))
        with seen.cond:
            if seen.cond.wait_for(lambda: -1 in seen.forwarded, 0.5):
                return
    raise TimeoutError("the controller never forwarded the probe report")


# ------------------------------------------------------------------ 1. transition latency
def transition_latency(s: Stack, floors: Floors, *, jobs: int) -> list[Result]:
    """Worker `completed` published -> the job's next `ready` received, one at a time:
    train completed -> eval ready, then eval completed -> deploy ready, for every job."""
    dist = distribution_ms(_latency_samples(s, jobs, incremental=False))
    floor_ms = floors.transition_floor_s * 1000
    # each percentile, its target, and the limit that target sets
    targets = {"p50": ("<= 3x floor", 3 * floor_ms), "p99": ("<= 10 ms", 10.0)}
    return [
        Result(
            f"1.latency_{q}",
            f"transition latency {q}",
            dist[f"{q}_ms"],
            "ms",
            baseline=floor_ms,
            baseline_name="relay RTT + Redis RTT + durable write (p50s)",
            ratio=dist[f"{q}_ms"] / floor_ms,
            target=target,
            passed=dist[f"{q}_ms"] <= limit,
            details=dist,
        )
        for q, (target, limit) in targets.items()
    ]


def incremental_latency(s: Stack, lifelong: list[Result], *, jobs: int) -> list[Result]:
    """The same transitions for incremental-learning jobs, beside the lifelong-learning
    ones of the same run (`lifelong`): their eval round also looks up two Models, and their
    deploy copies to the deploy Model's url."""
    dist = distribution_ms(_latency_samples(s, jobs, incremental=True))
    results = []
    for q in ("p50", "p99"):
        (ll,) = [r for r in lifelong if r.id == f"1.latency_{q}"]
        results.append(Result(
            f"1.il_latency_{q}", f"incremental-learning transition latency {q}",
            dist[f"{q}_ms"], "ms", baseline=ll.value,
            baseline_name=f"lifelong-learning transition latency {q}",
            ratio=dist[f"{q}_ms"] / ll.value, target="<= 1.25x lifelong learning",
            passed=dist[f"{q}_ms"] <= 1.25 * ll.value, details=dist,
        ))  # fmt: skip
    return results


def _latency_samples(s: Stack, jobs: int, *, incremental: bool) -> list[float]:
    seen = Upstream()
    peer = Peer(s.broker.port, [UPSTREAM], seen.handle)
    s.controller("r1")
    data = s.workdir / "data.txt"
    write_lines(data, 0, 10)
    out = s.workdir / "out"
    names = [f"lat-{i}" for i in range(jobs)]
    peer.publish(DOWNSTREAM, envelope(dataset_resource("ds", str(data)), kind="dataset", name="ds"))
    owner_kind = "LifelongLearningJob"
    if incremental:
        owner_kind = "IncrementalLearningJob"
        for model in model_resources(s.workdir / "models"):
            name = model["metadata"]["name"]
            peer.publish(DOWNSTREAM, envelope(model, kind="model", name=name))
    insert_jobs(peer, names, "ds", out, incremental=incremental)
    seen.wait(
        lambda: all((n, "train") in seen.ready for n in names),
        30 + jobs / 10,
        "every job's first train ready",
    )
    samples: list[float] = []
    for name in names:
        for phase, nxt in (("train", "eval"), ("eval", "deploy")):
            model = out / name / phase / "1" / "model.pkl"
            model.parent.mkdir(parents=True, exist_ok=True)
            model.write_bytes(b"model")
            started = time.perf_counter()
            peer.publish(*worker_report(name, phase, "completed", [str(model)],
                                        owner_kind=owner_kind))  # fmt: skip
            seen.wait(lambda n=name, p=nxt: (n, p) in seen.ready, 10, f"{name} {nxt} ready")
            samples.append(seen.ready[(name, nxt)] - started)
    peer.close()
    return samples


# ------------------------------------------------------------------ 2 + 7. throughput
class Burst:
    """Worker reports spread over many jobs, published as fast as QoS 1 allows."""

    def __init__(self, peer: Peer, seen: Upstream, names: list[str]) -> None:
        self.peer, self.seen, self.names = peer, seen, names
        self.next_seq = 1

    def run(self, count: int, timeout_s: float = 120) -> tuple[float, float]:
        """(reports/s from the first publish to the last forwarded arrival, duration_s)."""
        first = self.next_seq
        seqs = range(first, first + count)
        self.next_seq += count
        payloads = [
            worker_report(self.names[q % len(self.names)], "inference", "running", [], seq=q)
            for q in seqs
        ]
        with self.seen.cond:
            expected = len(self.seen.forwarded) + count  # seqs are new: each adds one key
            self.seen.forwarded_target = expected
        started = time.perf_counter()
        for topic, payload in payloads:
            self.peer.publish(topic, payload)
        try:
            self.seen.wait(
                lambda: len(self.seen.forwarded) >= expected,
                timeout_s,
                f"{count} forwarded reports",
            )
        finally:
            with self.seen.cond:
                self.seen.forwarded_target = None
        missing = [q for q in seqs if q not in self.seen.forwarded]
        if missing:
            raise AssertionError(f"{len(missing)} reports never forwarded, e.g. seq {missing[0]}")
        finished = max(self.seen.forwarded[q] for q in seqs)
        return count / (finished - started), finished - started


def commands_per_event(
    client: redis.Redis[bytes], burst: Burst, count: int, idle_s: float = 2.0
) -> tuple[float, float, dict[str, float]]:
    """(calls/event net of background, raw calls/event, top commands net per event).

    Background work (lease renewals, timers, blocking reads) is measured over `idle_s` just
    before and subtracted pro rata; commandstats also counts the commands scripts run."""
    before_idle = commandstats(client)
    t_idle = time.perf_counter()
    time.sleep(idle_s)
    idle = Counter(commandstats(client))
    idle.subtract(before_idle)
    idle_rate = {k: v / (time.perf_counter() - t_idle) for k, v in idle.items()}
    before = commandstats(client)
    t0 = time.perf_counter()
    burst.run(count)
    time.sleep(0.3)  # acks and outbox deletes that follow the last arrival
    elapsed = time.perf_counter() - t0
    delta = Counter(commandstats(client))
    delta.subtract(before)
    net = {k: (v - idle_rate.get(k, 0) * elapsed) / count for k, v in delta.items()}
    top = dict(
        sorted(((k, round(v, 3)) for k, v in net.items() if v > 0.005), key=lambda kv: -kv[1])[:10]
    )
    return sum(net.values()), sum(delta.values()) / count, top


def client_commands_per_event(
    client: redis.Redis[bytes], burst: Burst, count: int
) -> dict[str, Any]:
    """Commands the controller itself sends (MONITOR, Lua-internal ones left out): an upper
    bound on round trips per event, since a pipeline sends several in one trip."""
    seen: Counter[str] = Counter()
    started = threading.Event()

    def watch() -> None:
        with client.monitor() as monitor:
            started.set()
            while True:
                command = monitor.next_command()
                if command["client_type"] == "lua":
                    continue
                verb = command["command"].split(" ", 1)[0].upper()
                if MONITOR_STOP in command["command"]:
                    return
                seen[verb] += 1

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    started.wait(5)
    time.sleep(0.1)
    burst.run(count)
    time.sleep(0.3)
    client.echo(MONITOR_STOP)
    thread.join(10)
    seen.pop("ECHO", None)
    return {
        "per_event": sum(seen.values()) / count,
        "top": {k: round(v / count, 3) for k, v in seen.most_common(8)},
    }


def burst_on_one_replica(s: Stack, jobs: int) -> tuple[Peer, Burst, redis.Redis[bytes]]:
    """Replica r1 with ``jobs`` jobs inserted and its ingress taking reports: a burst ready to
    run, its peer and a client of the Redis master."""
    seen = Upstream()
    peer = Peer(s.broker.port, [UPSTREAM], seen.handle)
    s.controller("r1")
    names = [f"tp-{i}" for i in range(jobs)]
    insert_jobs(peer, names, "no-such-dataset", s.workdir / "out")
    client = s.redis_client()
    wait_until(lambda: count_jobs(client) >= jobs, 60 + jobs / 20, f"{jobs} jobs inserted")
    wait_ingress(peer, seen, names[0])
    return peer, Burst(peer, seen, names), client


def best_rate(burst: Burst, reports: int) -> float:
    """Reports/s: the best of three bursts after a warm-up, as the relay's baseline rate is
    (on a shared machine a single burst mostly measures the neighbours)."""
    burst.run(min(500, reports))
    return max(burst.run(reports)[0] for _ in range(3))


def throughput(s: Stack, floors: Floors, *, jobs: int, reports: int) -> list[Result]:
    """Report rates with one and two replicas, the controller's CPU per report (one replica),
    and the Redis commands per report."""
    peer, burst, client = burst_on_one_replica(s, jobs)
    pid, first = s.controllers[-1].pid, burst.next_seq
    cpu_before = cpu_seconds(pid)
    one_rate = best_rate(burst, reports)
    cpu_us = (cpu_seconds(pid) - cpu_before) / (burst.next_seq - first) * 1e6
    net, raw, top = commands_per_event(client, burst, reports)
    monitored = client_commands_per_event(client, burst, min(reports, 1000))
    s.controller("r2")
    wait_until(
        lambda: sorted(Counter(shard_holders(client).values()).values()) == [8, 8],
        30,
        "two replicas splitting the shards 8/8",
    )
    two_rate = best_rate(burst, reports)
    peer.close()
    client.close()
    relay = floors.relay_rate_per_s
    details = {"jobs": jobs, "reports": reports, "naive_loop_per_s": floors.naive_rate_per_s}
    rates = [
        Result(
            f"2.throughput_{replicas}",
            f"report throughput, {replicas} replica{'s' if replicas > 1 else ''}",
            rate,
            "reports/s",
            baseline=relay,
            baseline_name="relay throughput",
            ratio=rate / relay,
            target=">= 0.5x relay",
            passed=rate >= 0.5 * relay,
            details=details,
        )
        for replicas, rate in ((1, one_rate), (2, two_rate))
    ]
    return [
        *rates,
        Result.at_most(
            "2.cpu_per_report",
            "controller CPU per report, 1 replica (those bursts, background included)",
            cpu_us,
            "us/report",
            limit=150,
            limit_name="target",
            target="<= 150 us",
            details={"reports": burst.next_seq - first},
        ),
        Result.at_most(
            "7.redis_calls",
            "Redis commands per report (commandstats, net)",
            net,
            "calls/event",
            limit=4,
            limit_name="target",
            target="<= 4",
            details={
                "raw_per_event": raw,
                "top_net_per_event": top,
                "note": "commandstats counts commands run inside Lua scripts too",
            },
        ),
        Result.at_most(
            "7.client_commands",
            "commands the controller sends per report (MONITOR)",
            monitored["per_event"],
            "cmds/event",
            limit=3,
            limit_name="target",
            target="<= 3",
            details=monitored,
        ),
    ]


# ------------------------------------------------------------------ 6. failover
def failover(s: Stack, *, trials: int, lease_s: float) -> list[Result]:
    """SIGKILL the replica holding the ingress lease and the job's shard; time until the
    survivor forwards the report published right after the kill. Then once with SIGTERM:
    the replica releases its leases as it ends, so the survivor need not wait them out."""
    seen = Upstream()
    peer = Peer(s.broker.port, [UPSTREAM], seen.handle)
    env = {"LIFELONG_LEASE_SECONDS": str(lease_s)}
    replicas = {name: s.controller(name, env) for name in ("r1", "r2")}
    names = [f"fo-{i}" for i in range(4 * NUM_SHARDS)]
    insert_jobs(peer, names, "no-such-dataset", s.workdir / "out")
    client = s.redis_client()
    wait_until(lambda: count_jobs(client) >= len(names), 30, "failover jobs inserted")
    wait_ingress(peer, seen, names[0])
    by_shard = {shard_of(f"job:default/{n}"): n for n in names}

    def hand_over(seq: int, end: Callable[[Controller], object]) -> float:
        """End the replica holding the ingress lease and a job's shard, publish that job's
        report at once; seconds until the survivor forwards it. The ended one restarts."""
        wait_until(
            lambda: (
                sorted(Counter(shard_holders(client).values()).values()) == [8, 8]
                and ingress_holder(client) in replicas
            ),
            30,
            "balanced replicas",
        )
        victim = ingress_holder(client)
        assert victim is not None
        shard = next(sh for sh, r in shard_holders(client).items() if r == victim)
        job = by_shard[shard]
        end(replicas[victim])
        started = time.perf_counter()
        peer.publish(*worker_report(job, "inference", "running", [], seq=seq))
        seen.wait(lambda: seq in seen.forwarded, lease_s * 4 + 10, "the survivor's forward")
        s.controllers.remove(replicas[victim])
        replicas[victim] = s.controller(victim, env)
        return seen.forwarded[seq] - started

    samples = [hand_over(1_000_000 + trial, Controller.kill) for trial in range(trials)]
    graceful = hand_over(2_000_000, Controller.stop)
    peer.close()
    client.close()
    dist = {k: v / 1000 for k, v in distribution_ms(samples).items() if k != "n"}
    dist_s = {k.replace("_ms", "_s"): round(v, 3) for k, v in dist.items()}
    limit = lease_s + 1
    worst = max(samples)
    return [
        Result.at_most(
            "6.failover",
            "failover: SIGKILL -> survivor applies the next event (max)",
            worst,
            "s",
            limit=limit,
            limit_name="lease + 1 s",
            target="<= lease + 1 s",
            details={
                "trials": trials,
                "lease_s": lease_s,
                **dist_s,
                "samples_s": [round(x, 3) for x in samples],
                "p50_s": round(percentile(samples, 50), 3),
            },
        ),
        Result.at_most(
            "6.handover",
            "graceful handover: SIGTERMed replica gone -> survivor applies the next event",
            graceful,
            "s",
            limit=lease_s,
            limit_name="lease",
            target="< lease (no lease waited out)",
            details={"lease_s": lease_s},
        ),
    ]
