"""Reports are bound to their job (by the worker's name) and to their round (by where their
models lie): a foreign or replayed report is refused with a reason and changes nothing."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from service.core import reports
from service.core.effects import Publish, Reject, WriteRound
from service.core.events import WorkerReported
from service.core.state import JobState
from service.wire import Trigger
from tests.core.driver import JOB, NS, Driver, report, spec


def at_round(version: int, *, output_dir: str = "/output", prefix: str = "") -> Driver:
    """A job whose round `version` is running its train worker."""
    d = Driver(prefix=prefix)
    d.create(spec(trigger=Trigger(), output_dir=output_dir))
    for v in range(1, version + 1):
        d.dataset(10 * v)
        if v < version:
            d.complete_round(output_dir)
    d.written("train")
    assert (d.job.phase, d.job.step, d.job.version) == ("train", "running", version)
    d.effects.clear()
    return d


def named(
    worker: str, kind: str = "train", status: str = "running", channel: str = "mqtt", **kw: Any
) -> WorkerReported:
    return msgspec.structs.replace(
        report(kind, status, **kw), worker=worker, channel=channel  # type: ignore[arg-type]
    )


def refused(d: Driver, event: WorkerReported, code: str) -> Reject:
    before = d.state
    effects = d.apply(event)
    assert d.state == before, "a refused report changes nothing"
    assert not any(isinstance(e, Publish | WriteRound) for e in effects), effects
    (reject,) = [e for e in effects if isinstance(e, Reject)]
    assert reject.code == code
    return reject


# ---------------------------------------------------------------- by name
@pytest.mark.parametrize(
    ("worker", "kind", "channel"),
    [
        (f"{JOB}-train-1", "train", "mqtt"),  # our runner: {job}-{kind}-{version}
        (f"{JOB}-train-x7k2p", "train", "mqtt"),  # Sedna's GM pod name
        (f"{JOB}-eval-1", "eval", "mqtt"),
        (f"{JOB}-inference-b4c9d", "deploy", "mqtt"),  # the inference worker's deploy status
        (f"{JOB}-deploy-1", "inference", "mqtt"),
        ("train-worker-x7k2p", "train", "http"),  # Sedna's library, WORKER_NAME from the GM
        ("eval-worker-b4c9d", "eval", "http"),
        ("inferworker-q2w3e", "deploy", "http"),
    ],
)
def test_workers_named_for_the_job_are_heard(worker: str, kind: str, channel: str) -> None:
    d = at_round(1)
    if kind == "eval":
        d.apply(report("train", "completed", "/output/train/1/m.pkl"))
        d.written("eval")
    effects = d.apply(named(worker, kind, channel=channel))
    assert not any(isinstance(e, Reject) for e in effects)
    assert any(isinstance(e, Publish) for e in effects), "forwarded upstream"


@pytest.mark.parametrize(
    ("worker", "kind", "channel"),
    [
        ("intruder", "train", "mqtt"),
        (f"other-{JOB}-train-1", "train", "mqtt"),
        (f"{JOB}-train", "train", "mqtt"),  # no suffix
        (f"{JOB}-train-", "train", "mqtt"),
        (f"{JOB}-eval-1", "train", "mqtt"),  # an eval worker reporting training
        (f"{JOB}-train-eval-1", "train", "mqtt"),  # the suffix is one label: job-a-train's?
        (f"{JOB}-train-1.x", "train", "mqtt"),
        (f"{JOB}x-train-1", "train", "mqtt"),
        ("train-worker-x7k2p", "train", "mqtt"),  # the library's names only over HTTP
        ("eval-worker-x7k2p", "train", "http"),
        ("train-worker-", "train", "http"),
        ("inferworker-x", "train", "http"),
    ],
)
def test_a_worker_not_named_for_the_job_is_refused(worker: str, kind: str, channel: str) -> None:
    d = at_round(1)
    reject = refused(d, named(worker, kind, "completed", channel, results=[]), "foreign_worker")
    assert worker in reject.reason and f"{NS}/{JOB}" in reject.reason
    assert f"'{JOB}-{kind}-<suffix>'" in reject.reason


def test_the_refusal_comes_before_any_lifecycle_step() -> None:
    """A foreign `completed` with a model in the round's dir still moves nothing."""
    d = at_round(1)
    event = named("intruder", "train", "completed")
    event = msgspec.structs.replace(event, results=({"url": "/output/train/1/m.pkl"},))
    refused(d, event, "foreign_worker")
    assert (d.job.phase, d.job.step) == ("train", "running")


def test_an_unknown_job_is_refused_before_the_name_is_judged() -> None:
    refusal = reports.refusal(None, named("intruder"))
    assert refusal is not None and refusal.code == "unknown_job"


# ---------------------------------------------------------------- by round
def test_a_replayed_train_completed_of_round_1_does_not_move_round_2() -> None:
    d = at_round(2)
    replay = report("train", "completed", "/output/train/1/m.pkl")
    reject = refused(d, replay, "outside_round")
    assert "/output/train/2/" in reject.reason and "'/output/train/1/m.pkl'" in reject.reason
    assert (d.job.phase, d.job.step, d.job.version) == ("train", "running", 2)
    # the real report of round 2 still moves it
    d.apply(report("train", "completed", "/output/train/2/m.pkl"))
    assert (d.job.phase, d.job.step) == ("eval", "preparing")


def test_a_replayed_eval_completed_of_round_1_does_not_deploy_round_2() -> None:
    d = at_round(2)
    d.apply(report("train", "completed", "/output/train/2/m.pkl"))
    d.written("eval")
    refused(d, report("eval", "completed", "/output/eval/1/m.pkl"), "outside_round")
    assert (d.job.phase, d.job.step) == ("eval", "running")


@pytest.mark.parametrize(
    "url",
    [
        "/etc/passwd",
        "/output/deploy/index.pkl",  # only eval may name the deployed model
        "/output/train/20/m.pkl",
        "/output/train/2x/m.pkl",
        "/output/eval/2/m.pkl",
        "/output/train",
        "s3://bucket/output/train/2/m.pkl",
    ],
)
def test_models_outside_the_round_are_refused(url: str) -> None:
    d = at_round(2)
    refused(d, report("train", "completed", url), "outside_round")


def test_every_model_must_lie_in_the_round() -> None:
    d = at_round(2)
    event = report("train", "completed", "/output/train/2/m.pb", "/output/train/1/ckpt")
    refused(d, event, "outside_round")


def test_the_round_dir_itself_and_files_deep_inside_it_are_models_of_the_round() -> None:
    for url in ("/output/train/2", "/output/train/2/saved_model/variables/v.data"):
        d = at_round(2)
        d.apply(report("train", "completed", url))
        assert d.job.phase == "eval", url


def test_eval_may_name_the_deployed_model_after_its_own() -> None:
    """A deploy gate's eval: the new model, then the deployed one it was compared with (the
    deploy file, or the deployed round's own file); never the deployed one first."""
    for deployed in ("/output/deploy/index.pkl", "/output/eval/1/m.pkl"):
        d = at_round(2)
        d.apply(report("train", "completed", "/output/train/2/m.pkl"))
        d.written("eval")
        refused(d, report("eval", "completed", deployed, "/output/eval/2/m.pkl"), "outside_round")
        d.apply(report("eval", "completed", "/output/eval/2/m.pkl", deployed))
        assert (d.job.phase, d.job.step) == ("deploy", "copying")


def test_eval_may_report_back_the_models_it_was_given() -> None:
    """An eval worker that scores the round's trained models and reports them (as
    `lifelong worker`'s demo model does), not ones of another round."""
    d = at_round(2)
    d.apply(report("train", "completed", "/output/train/2/m.pkl"))
    d.written("eval")
    refused(d, report("eval", "completed", "/output/train/1/m.pkl"), "outside_round")
    d.apply(report("eval", "completed", "/output/train/2/m.pkl"))
    assert (d.job.phase, d.job.step) == ("deploy", "copying")


def test_the_volume_prefix_is_trimmed_before_judging() -> None:
    d = at_round(1, prefix="/rootfs")
    d.apply(report("train", "completed", "/rootfs/output/train/1/m.pkl"))
    assert d.job.phase == "eval"
    d.written("eval")
    refused(d, report("eval", "completed", "/rootfs/output/eval/0/m.pkl"), "outside_round")


def test_s3_output_dirs_bind_by_bucket_and_key_prefix() -> None:
    out = "s3://bucket/jobs/a"
    d = at_round(2, output_dir=out)
    for url in (
        "s3://bucket/jobs/a/train/1/m.pkl",
        "s3://other/jobs/a/train/2/m.pkl",
        "s3://bucket/jobs/a/train/20/m.pkl",
        "s3://bucket/jobs/a//train/2/m.pkl",
        "/jobs/a/train/2/m.pkl",
    ):
        refused(d, report("train", "completed", url), "outside_round")
    d.apply(report("train", "completed", "s3://bucket/jobs/a/train/2/m.pkl"))
    assert d.job.phase == "eval"


def test_reports_without_models_are_judged_by_name_only() -> None:
    """Failures and progress carry no model to bind; a completed report without a usable
    model still fails its round, as before."""
    d = at_round(2)
    d.apply(report("train", "running"))
    d.apply(report("train", "completed", results=[{"url": 7}]))
    job = d.state
    assert isinstance(job, JobState) and job.phase == "train" and job.version == 2
    assert job.last_error is not None and "without a usable model" in job.last_error


# ---------------------------------------------------------------- every status, by round and stage
@pytest.mark.parametrize("status", ["failed", "running", "completed"])
def test_a_report_of_an_earlier_round_by_name_is_refused_whatever_its_status(status: str) -> None:
    """`lifelong worker` names its workers for the round (`{job}-train-{version}`): round 1's
    `failed` (which carries no model to place it) replayed in round 2 fails nothing."""
    d = at_round(2)
    reject = refused(d, named(f"{JOB}-train-1", "train", status), "outside_round")
    assert f"for round 1, but job {NS}/{JOB} is at round 2" in reject.reason


def test_the_current_rounds_failed_report_still_fails_it() -> None:
    d = at_round(2)
    effects = d.apply(named(f"{JOB}-train-2", "train", "failed"))
    assert not any(isinstance(e, Reject) for e in effects)
    assert (d.job.phase, d.job.step, d.job.consecutive_failures) == ("train", "waiting", 1)


@pytest.mark.parametrize(
    ("worker", "channel"), [("train-worker-x7k2p", "http"), (f"{JOB}-train-x7k2p", "mqtt")]
)
def test_a_report_of_a_stage_the_job_does_not_run_is_refused(worker: str, channel: str) -> None:
    """A name without a round is bound by the stage: a train `failed` while the job
    evaluates is refused, and not forwarded (it would put a condition on the cloud's job)."""
    d = at_round(1)
    d.apply(report("train", "completed", "/output/train/1/m.pkl"))
    d.written("eval")
    reject = refused(d, named(worker, "train", "failed", channel), "not_running")
    assert "is not running its train stage (it is eval/running at round 1)" in reject.reason


def test_a_library_worker_reporting_while_the_stage_runs_is_heard() -> None:
    d = at_round(1)
    d.apply(named("train-worker-x7k2p", "train", "failed", "http"))
    assert (d.job.phase, d.job.step, d.job.consecutive_failures) == ("train", "waiting", 1)
