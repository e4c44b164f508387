"""A job's rounds up to the deploy decision: the train trigger, the round data, the workers'
reports, failures and their backoff, and the round's record.

A failed round backs off: the n-th failure in a row waits checkPeriodSeconds x 2^(n-1)
(at most an hour, or one period when that is longer) before the trigger is checked again, so
a worker that always fails cannot make its job spin; a completed round resets the count.
"""

import posixpath

import msgspec

from service.core import conditions, kinds, paths, reports, samples
from service.core.effects import Recorder, RecordRound, WriteRound
from service.core.events import Event, ModelCopied, RoundWritten, WorkerReported
from service.core.rounds import RoundOutcome, RoundRecord
from service.core.state import JobModels, JobState, ModelRef, RoundPhase
from service.core.triggers import NUM_OF_SAMPLES, should_fire
from service.wire import JobInput, JobStatus

replace = msgspec.structs.replace

#: The longest a failed round waits before the next try (unless the check period is longer).
MAX_RETRY_DELAY_MS = 3_600_000


def active(job: JobState) -> bool:
    return job.dataset is not None and job.dataset.present


def publish(job: JobState, out: Recorder, status: JobStatus, *, to_gm: bool = True) -> None:
    """An upstream status of the job, under its kind (a lifelong-learning job's is its
    resource key's)."""
    kind = job.spec.kind if job.spec.incremental is not None else ""
    out.publish(job.namespace, job.name, status, to_gm=to_gm, resource_kind=kind)


# ================================================================= the train trigger
def check_trigger(job: JobState, out: Recorder, *, reschedule: bool) -> JobState:
    """Evaluate the train trigger in train/waiting; keep one periodic check scheduled.

    `num_of_samples` counts the pending samples that arrived since the last round: those a
    held-back round returned ride along but do not count, so a held-back model is not
    retrained on the same data again and again."""
    if (job.phase, job.step) != ("train", "waiting"):
        return job
    if not active(job):
        return replace(job, next_check_ms=None)
    ctx = out.ctx
    if job.retry_at_ms is not None and job.retry_at_ms > ctx.now_ms:
        if job.next_check_ms == job.retry_at_ms:
            return job
        out.schedule(job.retry_at_ms)  # a failed round waits out its backoff first
        return replace(job, next_check_ms=job.retry_at_ms)
    pending = samples.count(job.pending) - job.returned  # new since a held-back round
    metrics = {NUM_OF_SAMPLES: pending}
    if (
        pending >= 1
        and conditions.may_start(job, out, "train")
        and should_fire(job.spec.trigger, metrics, ctx.minute_of_day)
    ):
        return _fire(job, out)
    if reschedule or job.next_check_ms is None or job.next_check_ms <= ctx.now_ms:
        due_ms = ctx.now_ms + job.spec.trigger.check_period_seconds * 1000
        out.schedule(due_ms)
        return replace(job, next_check_ms=due_ms)
    return job


def on_tick(job: JobState, _event: Event, out: Recorder) -> JobState:
    return check_trigger(replace(job, next_check_ms=None), out, reschedule=True)


def _fire(job: JobState, out: Recorder) -> JobState:
    """The trigger fired: round v takes every pending train sample (those a held-back round
    returned too); later ones wait."""
    version = job.version + 1
    record = RoundRecord(
        version=version, train_started_ms=out.ctx.now_ms, train_samples=samples.count(job.pending)
    )
    job = replace(
        job, version=version, round=job.pending, pending=(), step="preparing",
        next_check_ms=None, retry_at_ms=None, current=record, returned=0,
    )  # fmt: skip
    out.add(write_round(job, "train", job.round, out))
    out.note(f"train trigger fired: round {version} with {samples.count(job.round)} samples")
    return job


# ================================================================= rounds
def write_round(
    job: JobState, phase: RoundPhase, ranges: samples.Ranges, out: Recorder
) -> WriteRound:
    """Where the round's samples go: the files its ready message will name, on disk."""
    assert job.dataset is not None  # only fired while active
    prefix = out.ctx.volume_prefix
    dataset = job.dataset
    files = round_input(job, phase, ())
    assert files.data_url is not None
    index_url = files.data_index_url
    return WriteRound(
        id=out.next_id(),
        namespace=job.namespace,
        name=job.name,
        phase=phase,
        version=job.version,
        dataset=job.spec.dataset,
        source_url=paths.add_prefix(prefix, dataset.url),
        format=dataset.format,
        ranges=ranges,
        data_url=paths.add_prefix(prefix, files.data_url),
        index_url=None if index_url is None else paths.add_prefix(prefix, index_url),
        index_prefix=None if index_url is None else paths.index_prefix(dataset.url),
        keep=tuple(sorted({d.version for d in (job.deployed, *job.deployments) if d})),
        models=job.spec.incremental,
        ahead=made_ahead(job, phase, prefix),
    )


def made_ahead(job: JobState, phase: RoundPhase, prefix: str) -> tuple[str, ...]:
    """The directories a train round's effect makes once its files are written (as on
    disk): the eval round's data directory of the same version and, for a lifelong-learning
    job, its deploy directory. The steps that write into them come when a worker reports
    (train completed, eval completed) and a worker waits for what they write; making a
    directory costs more than the durable write into it (ext4 on the benchmark machine: a
    durable write into two new directories 1.0-1.4 ms, into directories made earlier 0.6
    ms). An output dir on S3 has no directories."""
    out = job.spec.output_dir
    if phase != "train" or paths.is_remote(out):
        return ()
    ahead = [paths.round_data_dir(out, "eval", job.version)]
    if job.spec.incremental is None:
        ahead.append(posixpath.dirname(paths.deploy_model(out)))
    return tuple(paths.add_prefix(prefix, d) for d in ahead)


def round_input(job: JobState, phase: RoundPhase, models: tuple[ModelRef, ...]) -> JobInput:
    """The worker-visible `input` of a round's ready message (no volume prefix).

    An eval that compares (`kinds.compared`) also gets the deployed model, last in `models`
    and as `deployedModel`: the worker scores both on the same data.
    """
    assert job.dataset is not None
    out, version, fmt = job.spec.output_dir, job.version, job.dataset.format
    index = paths.needs_index(job.dataset.url, fmt)
    deployment = kinds.compared(job) if phase == "eval" else None
    deployed = deployment.model if deployment is not None else None
    return JobInput(
        models=[*models, deployed] if deployed is not None else list(models),
        data_url=paths.round_data_file(out, phase, version, fmt),
        data_index_url=paths.round_index_file(out, phase, version) if index else None,
        output_dir=paths.round_output_dir(out, phase, version),
        deployed_model=deployed,
    )


def stale_round(job: JobState, event: RoundWritten | ModelCopied, out: Recorder) -> bool:
    if event.version != job.version:
        out.note(f"result for round {event.version} while at round {job.version}: ignored")
        return True
    return False


def data_written(job: JobState, event: Event, out: Recorder) -> JobState:
    """A round's train or eval data is on disk: tell the worker the models it starts from
    (`kinds`: an incremental-learning job's train round gets its base model; an eval the
    trained models and, when it compares, the deployed one)."""
    assert isinstance(event, RoundWritten)
    if stale_round(job, event, out):
        return job
    if event.models is not None:
        job = replace(job, models=(job.models or JobModels()).updated(event.models))
    pick = kinds.eval_models if event.phase == "eval" else kinds.train_models
    models, problem = pick(job)
    error = event.error or (problem if event.phase == "eval" else None)
    if error is not None:
        publish(job, out, JobStatus(phase=event.phase, status="failed", reason=error))
        return back_to_train(job, out, error)
    if problem is not None:
        out.note(problem)
    job_input = round_input(job, event.phase, models)
    publish(job, out, JobStatus(phase=event.phase, status="ready", input=job_input))
    deployment = kinds.compared(job) if event.phase == "eval" else None
    if deployment is not None:
        current = job.current or RoundRecord(version=job.version)
        job = replace(job, current=replace(current, deployed_version=deployment.version))
    return replace(job, step="running")


def no_usable_model(job: JobState, event: WorkerReported, out: Recorder) -> JobState:
    """`completed` without a model to go on with: the round failed, and the cloud says why."""
    reason = reports.no_usable_model(event)
    publish(job, out, JobStatus(phase=event.kind, status="failed", reason=reason))
    return back_to_train(job, out, reason)


def kept_models(event: WorkerReported, out: Recorder) -> tuple[ModelRef, ...]:
    """The report's models the job keeps (the first `reports.MAX_MODELS_KEPT`), saying so
    when it leaves some out."""
    left_out = reports.models_left_out(event)
    if left_out is not None:
        out.note(left_out)
    return reports.model_refs(event)


def train_completed(job: JobState, event: Event, out: Recorder) -> JobState:
    """The round is trained: its eval starts (for a GM-managed job once the GM shows
    Eval/Waiting: until then it is staged)."""
    assert isinstance(event, WorkerReported)
    models = kept_models(event, out)
    if not models:
        return no_usable_model(job, event, out)
    job = replace(
        job, phase="eval", step="staged", train_models=models, round=(), trained=job.round,
        gm_sent=None,
    )  # fmt: skip
    if conditions.may_start(job, out, "eval"):
        return start_eval(job, out)
    out.note(f"round {job.version} trained; its eval waits for Sedna's GM to show Eval/Waiting")
    return job


def start_eval(job: JobState, out: Recorder) -> JobState:
    """Write the round's eval data: the last eval batches."""
    current = job.current or RoundRecord(version=job.version)
    current = replace(
        current, eval_started_ms=out.ctx.now_ms, eval_samples=samples.count(job.eval_batches)
    )
    job = replace(job, step="preparing", current=current)
    out.add(write_round(job, "eval", job.eval_batches, out))
    return job


def worker_failed(job: JobState, event: Event, out: Recorder) -> JobState:
    assert isinstance(event, WorkerReported)
    return back_to_train(job, out, reports.failure(event))


def retry_delay_ms(check_period_s: int, failures: int) -> int:
    """How long the `failures`-th failed round in a row waits before the next trigger check:
    one check period, doubled for every further failure, capped at an hour (a check period
    longer than that is kept: a failure never brings the next check forward)."""
    period_ms = check_period_s * 1000
    doubled = period_ms << min(max(failures - 1, 0), 32)
    return max(period_ms, min(doubled, MAX_RETRY_DELAY_MS))


def back_to_train(job: JobState, out: Recorder, reason: str) -> JobState:
    """Back to train/waiting; a round whose training did not complete returns its samples
    to the front of the pending set, so the next round (v+1) trains on them again."""
    what = f"round {job.version} {job.phase} failed"
    job = replace(
        job,
        phase="train",
        step="waiting",
        pending=samples.concat(job.round, job.pending),
        round=(),
    )
    return round_failed(job, out, what, reason)


def round_failed(job: JobState, out: Recorder, what: str, reason: str) -> JobState:
    """Count the failure and wait out its backoff before the trigger is checked again."""
    failures = job.consecutive_failures + 1
    delay_ms = retry_delay_ms(job.spec.trigger.check_period_seconds, failures)
    retry_at_ms = out.ctx.now_ms + delay_ms
    out.note(
        f"{what}: {reason}; back to train, failure {failures} in a row, "
        f"next try in {delay_ms / 1000:g} s"
    )
    out.schedule(retry_at_ms)
    job = end_round(job, out, "failed", reason)
    return replace(
        job,
        last_error=reason,
        consecutive_failures=failures,
        retry_at_ms=retry_at_ms,
        next_check_ms=retry_at_ms,
    )


def end_round(
    job: JobState, out: Recorder, outcome: RoundOutcome, reason: str | None = None
) -> JobState:
    """The round is over: its record joins the history (with `reason`, else the one it
    has), and the job forgets the round's trained samples."""
    current = job.current or RoundRecord(version=job.version)  # a round begun before records
    record = replace(
        current, outcome=outcome, ended_ms=out.ctx.now_ms, reason=reason or current.reason
    )
    out.add(RecordRound(record=record))
    return replace(job, current=None, trained=(), gm_sent=None)
