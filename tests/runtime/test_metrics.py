"""The job gauges (counts by phase, bounded per-job phase entry) and health gauges."""

from __future__ import annotations

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from service.core.rounds import Deployment, Scores
from service.core.state import JobState, ModelRef
from service.metrics import Metrics
from service.wire import JobSpec

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


MODEL = "lifelong_job_model_metric"
VERSION = "lifelong_job_deployed_version"


MetricValues = dict[str, tuple[float, ...]]


def scored(
    name: str, deployed: int | None, candidate: MetricValues, measured: MetricValues | None = None,
    own: MetricValues | None = None,
) -> JobState:  # fmt: skip
    """A job whose latest eval scored `candidate` (and `measured` for the deployed model, in
    that eval), with version `deployed` deployed (its own round's metrics `own`)."""
    deployment = None
    if deployed is not None:
        deployment = Deployment(
            version=deployed, model=ModelRef(format="f", url="/m"), metrics=own or {}
        )
    scores = Scores(
        version=9, candidate=candidate, deployed=measured or {},
        deployed_version=deployed if measured else None,
    )  # fmt: skip
    return msgspec.structs.replace(job(name), deployed=deployment, scores=scores)


def model_series(m: Metrics) -> dict[tuple[str, str, str], float]:
    return {
        (dict(labels)["name"], dict(labels)["model"], dict(labels)["metric"]): value
        for labels, value in samples(m, MODEL).items()
    }


def test_deployed_version_and_latest_model_metrics_per_job() -> None:
    m = Metrics()
    m.job_changed(1, None, scored("a", 3, {"acc": (0.9,), "f1": (0.5, 0.7)}, {"acc": (0.8,)}))
    assert samples(m, VERSION) == {(("name", "a"), ("namespace", "default")): 3.0}
    assert model_series(m) == {
        ("a", "candidate", "acc"): 0.9,
        ("a", "candidate", "f1[0]"): 0.5,
        ("a", "candidate", "f1[1]"): 0.7,
        ("a", "deployed", "acc"): 0.8,
    }
    # a rollback to version 2: the deployed model's own metrics; stale series are dropped
    m.job_changed(1, None, scored("a", 2, {"acc": (0.9,)}, own={"acc": (0.75,)}))
    assert samples(m, VERSION) == {(("name", "a"), ("namespace", "default")): 2.0}
    assert model_series(m) == {("a", "candidate", "acc"): 0.9, ("a", "deployed", "acc"): 0.75}


def test_model_series_are_capped_and_go_with_the_job_or_its_shard() -> None:
    m = Metrics()
    many = {f"m{i:02}": (float(i), float(i)) for i in range(8)}
    m.job_changed(1, None, scored("a", 1, many, many))
    assert len([k for k in model_series(m) if k[1] == "candidate"]) == 8
    assert len([k for k in model_series(m) if k[1] == "deployed"]) == 8
    m.job_changed(2, None, scored("b", None, {"acc": (0.5,)}))
    assert samples(m, VERSION) == {(("name", "a"), ("namespace", "default")): 1.0}
    m.job_changed(1, scored("a", 1, many), None)  # deleted
    assert {k[0] for k in model_series(m)} == {"b"}
    assert samples(m, VERSION) == {}
    m.keep_jobs_of({1})  # b's shard moved to another replica
    assert model_series(m) == {}
