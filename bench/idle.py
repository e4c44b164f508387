"""Idle cost: many registered jobs with nothing to do must cost (almost) nothing."""

from __future__ import annotations

import time

import redis

from bench.common import (
    DOWNSTREAM,
    UPSTREAM,
    Peer,
    Result,
    Stack,
    count_jobs,
    cpu_seconds,
    dataset_resource,
    redis_cpu_s,
    wait_until,
)
from bench.lifecycle import insert_jobs
from tests.harness import envelope

CPU_LIMIT_PCT = 2.0
MEMORY_LIMIT_B = 2048


def _cpu_pct(pid: int, client: redis.Redis[bytes], window_s: float) -> tuple[float, float]:
    """(controller, redis) CPU over `window_s` as % of one core."""
    c0, r0, t0 = cpu_seconds(pid), redis_cpu_s(client), time.perf_counter()
    time.sleep(window_s)
    elapsed = time.perf_counter() - t0
    return (
        100 * (cpu_seconds(pid) - c0) / elapsed,
        100 * (redis_cpu_s(client) - r0) / elapsed,
    )


def memory_by_kind(client: redis.Redis[bytes]) -> dict[str, int]:
    """MEMORY USAGE summed by key kind (`state`, `history`, `ingress`...): where bytes go."""
    totals: dict[str, int] = {}
    names = list(client.scan_iter(count=1000))
    for lo in range(0, len(names), 1000):
        chunk = names[lo : lo + 1000]
        pipe = client.pipeline(transaction=False)
        for name in chunk:
            pipe.memory_usage(name, samples=0)
        for name, used in zip(chunk, pipe.execute(), strict=True):
            parts = name.decode().split(":")
            kind = parts[2] if len(parts) > 2 and parts[1].startswith("{s") else parts[1]
            totals[kind] = totals.get(kind, 0) + int(used or 0)
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def _memory(client: redis.Redis[bytes]) -> tuple[int, int]:
    """(used_memory, what of it the connections' query and reply buffers hold). Those
    buffers belong to connections, not to jobs, and move by tens of KiB from one reading to
    the next as commands come and go (61-102 KiB over one idle window, 11 connections)."""
    info = client.info("memory")
    return int(info["used_memory"]), int(info["mem_clients_normal"])


def idle_cost(s: Stack, *, jobs: int, window_s: float, check_period_s: int) -> list[Result]:
    """`jobs` jobs on a dataset with no samples, so each is in train/waiting and re-checks its
    trigger every `check_period_s`; the window spans one whole period. Service defaults for
    the lease (10 s) and dataset polls (60 s)."""
    env = {"LIFELONG_LEASE_SECONDS": "10", "LIFELONG_DATASET_POLL_SECONDS": "60"}
    controller = s.controller("r1", env)
    client = s.redis_client()
    peer = Peer(s.broker.port, [UPSTREAM], lambda *_: None)
    data = s.workdir / "empty.txt"
    data.write_bytes(b"")
    peer.publish(DOWNSTREAM, envelope(dataset_resource("ds", str(data)), kind="dataset", name="ds"))
    time.sleep(2)
    base_cpu, base_redis_cpu = _cpu_pct(controller.pid, client, min(10.0, window_s / 3))
    mem_before, buffers_before = _memory(client)
    insert_jobs(
        peer,
        [f"idle-{i}" for i in range(jobs)],
        "ds",
        s.workdir / "out",
        check_period_s=check_period_s,
    )
    wait_until(lambda: count_jobs(client) >= jobs, 60 + jobs / 50, f"{jobs} idle jobs")
    time.sleep(3 + jobs / 2000)  # the inserts' own work settles
    mem_settled, _ = _memory(client)
    cpu, redis_cpu = _cpu_pct(controller.pid, client, window_s)
    mem_after, buffers_after = _memory(client)
    keys = int(client.dbsize())
    by_kind = memory_by_kind(client)
    # A job idle for long holds no dedupe marker of the message that inserted it (markers
    # expire 60 s after their message): the idle figure leaves them out. MEMORY USAGE does
    # not count a key's entry in the expiry table, so what remains errs on the high side.
    # Nor does it count the connections' buffers, which hold no job.
    markers_b = by_kind.get("seen", 0)
    peer.close()
    client.close()
    buffers_b = buffers_after - buffers_before
    per_job_b = (mem_after - mem_before - markers_b - buffers_b) / jobs
    details = {
        "jobs": jobs,
        "window_s": window_s,
        "check_period_s": check_period_s,
        "redis_cpu_pct": round(redis_cpu, 2),
        "redis_cpu_pct_no_jobs": round(base_redis_cpu, 2),
        "redis_keys": keys,
        "bytes_per_job_after_insert": round((mem_settled - mem_before) / jobs),
        "bytes_per_job_after_window": round((mem_after - mem_before) / jobs),
        "bytes_per_job_idle": round(per_job_b),
        "connection_buffers_change_b": buffers_b,
        "key_bytes_per_job_by_kind": {k: round(v / jobs) for k, v in by_kind.items()},
    }
    return [
        Result(
            "5.idle_cpu",
            f"idle: controller CPU with {jobs:,} jobs",
            cpu,
            "% of a core",
            baseline=base_cpu,
            baseline_name="same controller, no jobs",
            ratio=cpu / CPU_LIMIT_PCT,
            target=f"<= {CPU_LIMIT_PCT}% of a core",
            passed=cpu <= CPU_LIMIT_PCT,
            details=details,
        ),
        Result.at_most(
            "5.idle_memory",
            "idle: Redis memory per job (without dedupe markers and connection buffers)",
            per_job_b,
            "bytes",
            limit=MEMORY_LIMIT_B,
            limit_name="target",
            target="<= 2 KiB",
            details=details,
        ),
    ]
