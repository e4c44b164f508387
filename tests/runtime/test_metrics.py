"""The job gauges (counts by phase, bounded per-job phase entry) and health gauges."""

from __future__ import annotations

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from service.core.state import JobSpec, JobState
from service.metrics import Metrics

PHASE = "lifelong_job_phase_entered_timestamp_seconds"


def job(name: str, phase: str = "train", step: str = "running", since_ms: int = 1_000) -> JobState:
    return JobState(
        namespace="default",
        name=name,
        spec=JobSpec(dataset="ds", train_prob=0.8, output_dir="/out"),
        digest="d",
        phase=phase,  # type: ignore[arg-type]
        step=step,  # type: ignore[arg-type]
        phase_since_ms=since_ms,
    )


def samples(metrics: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    exposition = metrics.render()[0].decode()
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
        if s.name == name
    }


def phases(metrics: Metrics) -> dict[str, tuple[str, str, float]]:
    found: dict[str, tuple[str, str, float]] = {}
    for labels, value in samples(metrics, PHASE).items():
        label = dict(labels)
        assert label["name"] not in found, "one series per job"
        found[label["name"]] = (label["phase"], label["step"], value)
    return found


def counts(metrics: Metrics) -> dict[str, float]:
    """lifelong_jobs by "phase/step", zeros left out."""
    return {
        f"{dict(labels)['phase']}/{dict(labels)['step']}": value
        for labels, value in samples(metrics, "lifelong_jobs").items()
        if value
    }


def test_one_series_per_job_that_follows_its_phase_and_goes_with_it() -> None:
    m = Metrics()
    a = job("a", step="preparing", since_ms=1_500)
    m.job_changed(3, None, a)
    m.job_changed(5, None, job("b", "eval", "running", 2_000))
    assert phases(m) == {"a": ("train", "preparing", 1.5), "b": ("eval", "running", 2.0)}
    assert counts(m) == {"train/preparing": 1, "eval/running": 1}

    moved = msgspec.structs.replace(a, step="running", phase_since_ms=9_000)
    m.job_changed(3, a, moved)
    assert phases(m)["a"] == ("train", "running", 9.0)
    assert counts(m) == {"train/running": 1, "eval/running": 1}

    m.job_changed(3, moved, None)  # deleted
    assert set(phases(m)) == {"b"}
    assert counts(m) == {"eval/running": 1}


def test_a_job_waiting_for_samples_is_counted_without_a_series() -> None:
    m = Metrics()
    running = job("a", since_ms=4_000)
    m.job_changed(1, None, running)
    waiting = msgspec.structs.replace(running, step="waiting", phase_since_ms=8_000)
    m.job_changed(1, running, waiting)
    assert phases(m) == {}
    assert counts(m) == {"train/waiting": 1}


def test_a_job_with_an_unknown_entry_time_is_counted_without_a_series() -> None:
    m = Metrics()
    m.job_changed(1, None, job("a", since_ms=4_000))
    m.job_changed(1, job("a", since_ms=4_000), job("a", since_ms=0))
    assert phases(m) == {}
    assert counts(m) == {"train/running": 1}


def test_jobs_of_shards_no_longer_held_are_forgotten() -> None:
    m = Metrics()
    m.job_changed(1, None, job("a"))
    m.job_changed(2, None, job("b"))
    m.job_changed(2, None, job("c", step="waiting"))
    m.keep_jobs_of({2, 7})
    assert set(phases(m)) == {"b"}
    assert counts(m) == {"train/running": 1, "train/waiting": 1}
    m.keep_jobs_of(set())
    assert phases(m) == {}
    assert counts(m) == {}


def test_holding_no_shard_forgets_every_job() -> None:
    m = Metrics()
    m.job_changed(1, None, job("a"))
    m.keep_jobs_of(set())
    assert phases(m) == {}
    assert counts(m) == {}


def test_health_gauges_carry_the_node() -> None:
    m = Metrics()
    m.set_health("edge-1", ready=True, ingress_held=False, redis_up=True, mqtt_up=False)
    node = (("node", "edge-1"),)
    assert samples(m, "lifelong_ready") == {node: 1.0}
    assert samples(m, "lifelong_ingress_held") == {node: 0.0}
    assert samples(m, "lifelong_redis_up") == {node: 1.0}
    assert samples(m, "lifelong_mqtt_up") == {node: 0.0}
