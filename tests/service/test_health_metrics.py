"""The health gauges and the per-job phase gauge, read from a running replica's /metrics."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from tests.harness import NODE, Controller, append_lines, lines
from tests.stack import Stack
from tests.wait import wait_until

Series = dict[tuple[tuple[str, str], ...], float]
PHASE = "lifelong_job_phase_entered_timestamp_seconds"


def series(controller: Controller, name: str) -> Series:
    """Every sample of one metric on the controller's /metrics, by its labels."""
    url = f"http://127.0.0.1:{controller.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        exposition = response.read().decode()
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
        if s.name == name
    }


def gauge(controller: Controller, name: str) -> float | None:
    """The value of a health gauge of this node (None while it has no sample)."""
    return series(controller, name).get((("node", NODE),))


def eventually(check: Callable[[], bool], what: str, timeout_s: float = 20) -> None:
    wait_until(check, timeout_s, what)


def test_health_gauges_follow_the_replicas_and_their_servers(stack: Stack) -> None:
    replicas = [stack.controller("r1"), stack.controller("r2")]

    def all_equal(name: str, value: float) -> bool:
        return all(gauge(r, name) == value for r in replicas)

    eventually(lambda: sum(gauge(r, "lifelong_ingress_held") or 0 for r in replicas) == 1,
               "exactly one replica holding the ingress")  # fmt: skip
    for name in ("lifelong_ready", "lifelong_redis_up", "lifelong_mqtt_up"):
        eventually(lambda name=name: all_equal(name, 1), f"{name} 1 on both")

    stack.redis.stop()
    eventually(lambda: all_equal("lifelong_redis_up", 0), "redis_up 0 with Redis stopped")
    eventually(lambda: all_equal("lifelong_ready", 0), "ready 0 with Redis stopped")
    stack.redis.start()
    eventually(lambda: all_equal("lifelong_redis_up", 1), "redis_up 1 with Redis back")

    stack.broker.stop()
    eventually(lambda: all_equal("lifelong_mqtt_up", 0), "mqtt_up 0 with the broker stopped")
    eventually(lambda: all_equal("lifelong_ready", 0), "ready 0 with the broker stopped")
    stack.broker.start()
    eventually(lambda: all_equal("lifelong_ready", 1), "ready 1 with the broker back", 40)


def test_a_job_has_one_phase_series_that_follows_its_round(stack: Stack) -> None:
    cloud = stack.cloud
    data = stack.workdir / "data.txt"
    append_lines(data, lines(0, 10))
    out = stack.workdir / "out"
    controller = stack.controller()
    cloud.insert_dataset("ds", data)
    started_s = time.time()
    cloud.insert_job("job", "ds", out)
    cloud.wait_status("job", "train", "ready")

    def phase_of_job() -> tuple[str, str, float] | None:
        found = [
            (label["phase"], label["step"], value)
            for labels, value in series(controller, PHASE).items()
            if (label := dict(labels))["name"] == "job"
        ]
        assert len(found) <= 1, f"one series per job, got {found}"
        return found[0] if found else None

    eventually(lambda: (phase_of_job() or ("",))[:2] == ("train", "running"), "train/running")
    entered = phase_of_job()
    assert entered is not None and started_s - 1 <= entered[2] <= time.time()

    model = out / "train" / "1" / "model.pkl"
    model.parent.mkdir(parents=True)
    model.write_bytes(b"trained")
    reported_s = time.time()
    cloud.report("job", "train", "completed", str(model))
    cloud.wait_status("job", "eval", "ready")
    eventually(lambda: (phase_of_job() or ("",))[:2] == ("eval", "running"), "eval/running")
    entered = phase_of_job()
    assert entered is not None and reported_s - 1 <= entered[2] <= time.time()

    cloud.downstream("lifelonglearningjob", "delete", None, name="job")
    eventually(lambda: phase_of_job() is None, "the deleted job's series gone")


def test_a_job_waiting_for_its_worker_is_reported_by_whoever_owns_it(stack: Stack) -> None:
    """Exactly one replica reports a job's phase, also after its shard moved to a replica that
    never saw an event for it (a worker may take hours to report)."""
    cloud = stack.cloud
    data = stack.workdir / "data.txt"
    append_lines(data, lines(0, 10))
    first = stack.controller("r1")
    cloud.insert_dataset("ds", data)
    cloud.insert_job("job", "ds", stack.workdir / "out")
    cloud.wait_status("job", "train", "ready")  # no worker ever reports: train/running

    def reported(controller: Controller) -> list[tuple[tuple[str, str], ...]]:
        return [
            labels
            for labels in series(controller, PHASE)
            if ("name", "job") in labels and ("step", "running") in labels
        ]

    eventually(lambda: len(reported(first)) == 1, "the job's series on r1")
    entered = series(first, PHASE)[reported(first)[0]]

    second = stack.controller("r2")
    replicas = [first, second]
    eventually(
        lambda: [series(r, "lifelong_leases_held")[()] for r in replicas] == [8, 8],
        "the shards split between the replicas",
    )
    eventually(lambda: sum(len(reported(r)) for r in replicas) == 1, "one replica reporting it")
    owner, other = replicas if reported(first) else replicas[::-1]
    owner.kill()
    eventually(lambda: len(reported(other)) == 1, "the survivor reporting the job")
    assert series(other, PHASE)[reported(other)[0]] == entered
