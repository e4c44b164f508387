"""The hot path on Redis behind Sentinel, beside the single server's figures.

A master, one replica and three sentinels; the controller follows the master through the
sentinels and waits for one replica to hold each write it acts on (WAIT 1, the default
there). Transition latency and report throughput are measured as on a single Redis (the
same functions), and reported against the single server's figures of the same run. Then,
with two replicas (so WAIT 1 still holds once one is promoted), the master is SIGKILLed and
we time how long the controller takes to forward the report published right after.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

from bench.baselines import Floors
from bench.common import (
    UPSTREAM,
    Peer,
    Result,
    Stack,
    count_jobs,
    distribution_ms,
    percentile,
    wait_until,
    worker_report,
)
from bench.lifecycle import (
    Upstream,
    best_rate,
    burst_on_one_replica,
    insert_jobs,
    transition_latency,
    wait_ingress,
)
from service.embedded.topologies import SENTINEL_FAILOVER_TIMEOUT_MS

LABEL = "Sentinel, 1 replica, WAIT 1"


def _beside(result: Result, figure_id: str, single: Mapping[str, float]) -> Result:
    """A single-Redis figure measured on Sentinel: its baseline is the single server's."""
    base = single.get(result.id)
    return dataclasses.replace(
        result,
        id=figure_id,
        name=f"{result.name}, {LABEL}",
        baseline=base,
        baseline_name="single Redis" if base is not None else "",
        ratio=None if base is None else result.value / base,
        target="",
        passed=None,
    )


def latency(s: Stack, floors: Floors, single: Mapping[str, float], *, jobs: int) -> list[Result]:
    p50, p99 = transition_latency(s, floors, jobs=jobs)
    return [_beside(p50, "8.latency_p50", single), _beside(p99, "8.latency_p99", single)]


def throughput(s: Stack, single: Mapping[str, float], *, jobs: int, reports: int) -> list[Result]:
    peer, burst, client = burst_on_one_replica(s, jobs)
    rate = best_rate(burst, reports)
    peer.close()
    client.close()
    result = Result(
        "2.throughput_1",
        "report throughput, 1 replica",
        rate,
        "reports/s",
        details={"jobs": jobs, "reports": reports},
    )
    return [_beside(result, "8.throughput_1", single)]


def failover(s: Stack, *, trials: int) -> list[Result]:
    """SIGKILL the Redis master; time until the controller forwards the report published
    right after. The killed master comes back as a replica before the next trial."""
    topology = s.sentinel
    assert topology is not None
    seen = Upstream()
    peer = Peer(s.broker.port, [UPSTREAM], seen.handle)
    s.controller("r1")
    names = [f"rf-{i}" for i in range(16)]
    insert_jobs(peer, names, "no-such-dataset", s.workdir / "out")
    client = s.redis_client()
    wait_until(lambda: count_jobs(client) >= len(names), 30, "failover jobs inserted")
    client.close()
    wait_ingress(peer, seen, names[0])
    samples: list[float] = []
    promotions: list[float] = []
    for trial in range(trials):
        topology.wait_synced()
        if trial:  # no new failover of a master within 2x failover-timeout of the last start
            time.sleep(max(0.0, 2 * SENTINEL_FAILOVER_TIMEOUT_MS / 1000 + 1 - samples[-1]))
        old = topology.master()
        old.kill()
        started = time.perf_counter()
        seq = 2_000_000 + trial
        peer.publish(*worker_report(names[trial % len(names)], "inference", "running", [], seq=seq))
        topology.wait_promoted(old)
        promotions.append(time.perf_counter() - started)
        seen.wait(lambda q=seq: q in seen.forwarded, 60, "the report after the failover")
        samples.append(seen.forwarded[seq] - started)
        topology.restart_as_replica(old)
    peer.close()
    dist = {
        k.replace("_ms", "_s"): round(v / 1000, 3)
        for k, v in distribution_ms(samples).items()
        if k != "n"
    }
    return [
        Result(
            "8.failover",
            "Redis master SIGKILLed -> the next report forwarded (max), Sentinel, 2 replicas",
            max(samples),
            "s",
            details={
                "trials": trials,
                **dist,
                "p50_s": round(percentile(samples, 50), 3),
                "samples_s": [round(x, 3) for x in samples],
                "promotion_s": [round(x, 3) for x in promotions],
                "note": "down-after-milliseconds 1000; lease 3 s",
            },
        )
    ]
