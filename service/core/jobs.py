"""The lifecycle of one job, as a table of (phase, step, event) -> handler.

    train/waiting --trigger fires--> train/preparing --data written--> train/running
    train/running --train completed--> eval/preparing --data written--> eval/running
    eval/running  --eval completed--> deploy/copying --model copied--> train/waiting
    failures at any step go back to train/waiting (a failed round's train samples first).

A failed round backs off: the n-th failure in a row waits checkPeriodSeconds x 2^(n-1)
(at most an hour, or one period when that is longer) before the trigger is checked again, so
a worker that always fails cannot make its job spin; a completed deploy resets the count.

An event that does not fit the job's (phase, step) leaves it unchanged and says why.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from service.core import paths, reports, samples
from service.core.effects import (
    AttachDataset,
    CopyModel,
    DetachDataset,
    Reject,
    ReleaseOutputDir,
    WriteRound,
)
from service.core.events import (
    DatasetChanged,
    Event,
    JobApplied,
    JobDeleted,
    ModelCopied,
    RoundWritten,
    Tick,
    WorkerReported,
)
from service.core.outcome import Recorder
from service.core.state import JobState, ModelRef, RoundPhase, State
from service.core.triggers import NUM_OF_SAMPLES, should_fire
from service.messages import JobInput, JobOutput, JobStatus

replace = msgspec.structs.replace

#: The longest a failed round waits before the next try (unless the check period is longer).
MAX_RETRY_DELAY_MS = 3_600_000


def apply(state: State | None, event: Event, out: Recorder) -> State | None:
    """Apply one event to a job (None: the job does not exist, or no longer does)."""
    if state is not None and not isinstance(state, JobState):
        out.note(f"{type(event).__name__} does not apply to a dataset")
        return state
    if isinstance(event, JobApplied):
        return _job_applied(state, event, out)
    if isinstance(event, WorkerReported):
        refusal = reports.refusal(state, event, out.ctx.volume_prefix)
        if refusal is not None:
            out.add(refusal)
            return state
    if state is None:
        out.note(f"{type(event).__name__} for a job that does not exist: ignored")
        return None
    if isinstance(event, JobDeleted):
        out.add(
            DetachDataset(
                id=out.next_id(), namespace=state.namespace, name=state.name,
                dataset=state.spec.dataset,
            )
        )  # fmt: skip
        out.add(_release(state, out))
        out.note("job deleted")
        return None
    if isinstance(event, DatasetChanged):
        return _dataset_changed(state, event, out)
    if isinstance(event, WorkerReported):
        _forward(state, event, out)
    handler = JOB_TABLE.get((state.phase, state.step, _event_key(event)))
    if handler is None:
        return _does_not_fit(state, event, out)
    return handler(state, event, out)


def _event_key(event: Event) -> str:
    if isinstance(event, WorkerReported):
        return f"{event.kind}/{event.status}"
    if isinstance(event, RoundWritten):
        return f"{event.phase}-written"
    if isinstance(event, ModelCopied):
        return "model-copied"
    return "tick"


def _does_not_fit(job: JobState, event: Event, out: Recorder) -> JobState:
    where = f"{job.phase}/{job.step}"
    if isinstance(event, WorkerReported):
        if event.status in ("ready", "running") or event.kind in ("deploy", "inference"):
            return job  # progress reports are forwarded and change nothing
        out.note(
            f"{event.kind} worker {event.worker} reported {event.status} while the job is "
            f"{where}: forwarded only"
        )
    elif isinstance(event, Tick):
        return replace(job, next_check_ms=None)  # no trigger check outside train/waiting
    else:
        out.note(f"{type(event).__name__} does not fit {where} (version {job.version}): ignored")
    return job


# ================================================================= spec and dataset
def _job_applied(state: JobState | None, event: JobApplied, out: Recorder) -> JobState | None:
    if event.output_dir_holder is not None:
        reason = (
            f"outputDir {event.spec.output_dir} is already used by job "
            f"{event.output_dir_holder}: two jobs writing one outputDir overwrite each "
            "other's files; give this one its own"
        )
        out.add(Reject(code="output_dir_taken", reason=reason))
        return state
    if state is None:
        job = JobState(
            namespace=event.namespace, name=event.name, spec=event.spec, digest=event.digest
        )
        out.add(
            AttachDataset(
                id=out.next_id(), namespace=job.namespace, name=job.name, dataset=job.spec.dataset
            )
        )
        out.note("job created; waiting for its dataset")
        return job
    if event.digest == state.digest:
        return state  # Sedna's GM re-sends every resource on each resync: nothing changes
    if event.spec.dataset != state.spec.dataset:
        reason = (
            f"spec.dataset.name cannot change (was {state.spec.dataset!r}); "
            "delete and re-create the job"
        )
        out.add(Reject(code="immutable_field", reason=reason))
        return state
    job = replace(state, spec=event.spec, digest=event.digest)
    out.note("spec updated; applies from the next evaluation")
    if paths.canonical_dir(event.spec.output_dir) != paths.canonical_dir(state.spec.output_dir):
        out.add(_release(state, out))
    if job.retry_at_ms is not None:
        # a changed spec (a fixed worker template, say) is worth trying without the wait
        job = replace(job, retry_at_ms=None)
    if job.step == "waiting" and job.phase == "train" and _active(job):
        due_ms = out.ctx.now_ms + job.spec.trigger.check_period_s * 1000
        job = replace(job, next_check_ms=due_ms)
        out.schedule(due_ms)
    return job


def _release(job: JobState, out: Recorder) -> ReleaseOutputDir:
    """Give up the job's claim on its outputDir (the shell claims one for each job)."""
    return ReleaseOutputDir(
        id=out.next_id(), namespace=job.namespace, name=job.name, output_dir=job.spec.output_dir
    )


def _dataset_changed(job: JobState, event: DatasetChanged, out: Recorder) -> JobState:
    info = replace(event.info, format=event.info.format.lower())
    was_active = _active(job)
    job = replace(job, dataset=info)
    if not info.present:
        out.note(f"dataset {event.dataset} deleted: job paused, state kept")
        return replace(job, next_check_ms=None)
    grown = False
    if event.num_samples is not None:
        job, grown = _account(job, event.num_samples, out)
    if grown or not was_active:
        return _check_trigger(job, out, reschedule=not was_active)
    return job


def _account(job: JobState, available: int, out: Recorder) -> tuple[JobState, bool]:
    """Take the new batch samples[P:N] into pending train and one eval batch."""
    if available < job.taken:
        if not job.shrunk:
            out.note(
                f"dataset shrank to {available} samples below the {job.taken} already "
                "taken: nothing changes until it grows past them"
            )
        return replace(job, shrunk=True), False
    if available == job.taken:
        return job, False
    train, evaluation = samples.split_batch(job.taken, available, job.spec.train_prob)
    job = replace(
        job,
        taken=available,
        shrunk=False,
        pending=samples.append(job.pending, train),
        eval_batches=samples.keep_last(job.eval_batches, evaluation),
    )
    return job, train[1] > train[0]


def _active(job: JobState) -> bool:
    return job.dataset is not None and job.dataset.present


# ================================================================= the train trigger
def _check_trigger(job: JobState, out: Recorder, *, reschedule: bool) -> JobState:
    """Evaluate the train trigger in train/waiting; keep one periodic check scheduled."""
    if (job.phase, job.step) != ("train", "waiting"):
        return job
    if not _active(job):
        return replace(job, next_check_ms=None)
    ctx = out.ctx
    if job.retry_at_ms is not None and job.retry_at_ms > ctx.now_ms:
        if job.next_check_ms == job.retry_at_ms:
            return job
        out.schedule(job.retry_at_ms)  # a failed round waits out its backoff first
        return replace(job, next_check_ms=job.retry_at_ms)
    pending = samples.count(job.pending)
    metrics = {NUM_OF_SAMPLES: pending}
    if pending >= 1 and should_fire(job.spec.trigger, metrics, ctx.minute_of_day):
        return _fire(job, out)
    if reschedule or job.next_check_ms is None or job.next_check_ms <= ctx.now_ms:
        due_ms = ctx.now_ms + job.spec.trigger.check_period_s * 1000
        out.schedule(due_ms)
        return replace(job, next_check_ms=due_ms)
    return job


def _on_tick(job: JobState, _event: Event, out: Recorder) -> JobState:
    return _check_trigger(replace(job, next_check_ms=None), out, reschedule=True)


def _fire(job: JobState, out: Recorder) -> JobState:
    """The trigger fired: round v takes every pending train sample; later ones wait."""
    version = job.version + 1
    job = replace(
        job, version=version, round=job.pending, pending=(), step="preparing",
        next_check_ms=None, retry_at_ms=None,
    )  # fmt: skip
    out.add(_write_round(job, "train", job.round, out))
    out.note(f"train trigger fired: round {version} with {samples.count(job.round)} samples")
    return job


# ================================================================= rounds
def _write_round(
    job: JobState, phase: RoundPhase, ranges: samples.Ranges, out: Recorder
) -> WriteRound:
    assert job.dataset is not None  # only fired while active
    prefix = out.ctx.volume_prefix
    dataset = job.dataset
    data_dir = paths.round_data_dir(job.spec.output_dir, phase, job.version)
    index = paths.needs_index(dataset.url, dataset.format)
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
        data_url=paths.add_prefix(prefix, paths.join(data_dir, paths.data_file(dataset.format))),
        index_url=paths.add_prefix(prefix, paths.join(data_dir, "dataIndex.txt"))
        if index
        else None,
        index_prefix=paths.index_prefix(dataset.url) if index else None,
    )


def _round_input(job: JobState, phase: RoundPhase, models: tuple[ModelRef, ...]) -> JobInput:
    """The worker-visible `input` of a round's ready message (no volume prefix)."""
    assert job.dataset is not None
    data_dir = paths.round_data_dir(job.spec.output_dir, phase, job.version)
    index = paths.needs_index(job.dataset.url, job.dataset.format)
    return JobInput(
        models=list(models),
        data_url=paths.join(data_dir, paths.data_file(job.dataset.format)),
        data_index_url=paths.join(data_dir, "dataIndex.txt") if index else None,
        output_dir=paths.round_output_dir(job.spec.output_dir, phase, job.version),
    )


def _stale_round(job: JobState, event: RoundWritten | ModelCopied, out: Recorder) -> bool:
    if event.version != job.version:
        out.note(f"result for round {event.version} while at round {job.version}: ignored")
        return True
    return False


def _publish(job: JobState, out: Recorder, status: JobStatus) -> None:
    out.publish(job.namespace, job.name, status)


def _data_written(job: JobState, event: Event, out: Recorder) -> JobState:
    """A round's train or eval data is on disk: tell the worker (eval gets the train models)."""
    assert isinstance(event, RoundWritten)
    if _stale_round(job, event, out):
        return job
    if event.error is not None:
        _publish(job, out, JobStatus(phase=event.phase, status="failed", reason=event.error))
        return _back_to_train(job, out, event.error)
    models = job.train_models if event.phase == "eval" else ()
    job_input = _round_input(job, event.phase, models)
    _publish(job, out, JobStatus(phase=event.phase, status="ready", input=job_input))
    return replace(job, step="running")


def _no_usable_model(job: JobState, event: WorkerReported, out: Recorder) -> JobState:
    """`completed` without a model to go on with: the round failed, and the cloud says why."""
    reason = reports.no_usable_model(event)
    _publish(job, out, JobStatus(phase=event.kind, status="failed", reason=reason))
    return _back_to_train(job, out, reason)


def _kept_models(event: WorkerReported, out: Recorder) -> tuple[ModelRef, ...]:
    left_out = reports.models_left_out(event)
    if left_out is not None:
        out.note(left_out)
    return reports.model_refs(event)


def _train_completed(job: JobState, event: Event, out: Recorder) -> JobState:
    assert isinstance(event, WorkerReported)
    models = _kept_models(event, out)
    if not models:
        return _no_usable_model(job, event, out)
    job = replace(job, phase="eval", step="preparing", train_models=models, round=())
    out.add(_write_round(job, "eval", job.eval_batches, out))
    return job


def _worker_failed(job: JobState, event: Event, out: Recorder) -> JobState:
    assert isinstance(event, WorkerReported)
    return _back_to_train(job, out, reports.failure(event))


def retry_delay_ms(check_period_s: int, failures: int) -> int:
    """How long the `failures`-th failed round in a row waits before the next trigger check:
    one check period, doubled for every further failure, capped at an hour (a check period
    longer than that is kept: a failure never brings the next check forward)."""
    period_ms = check_period_s * 1000
    doubled = period_ms << min(max(failures - 1, 0), 32)
    return max(period_ms, min(doubled, MAX_RETRY_DELAY_MS))


def _back_to_train(job: JobState, out: Recorder, reason: str) -> JobState:
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
    return _round_failed(job, out, what, reason)


def _round_failed(job: JobState, out: Recorder, what: str, reason: str) -> JobState:
    """Count the failure and wait out its backoff before the trigger is checked again."""
    failures = job.consecutive_failures + 1
    delay_ms = retry_delay_ms(job.spec.trigger.check_period_s, failures)
    retry_at_ms = out.ctx.now_ms + delay_ms
    out.note(
        f"{what}: {reason}; back to train, failure {failures} in a row, "
        f"next try in {delay_ms / 1000:g} s"
    )
    out.schedule(retry_at_ms)
    return replace(
        job,
        last_error=reason,
        consecutive_failures=failures,
        retry_at_ms=retry_at_ms,
        next_check_ms=retry_at_ms,
    )


# ================================================================= deploy
def _eval_completed(job: JobState, event: Event, out: Recorder) -> JobState:
    assert isinstance(event, WorkerReported)
    models = _kept_models(event, out)
    if not models:
        return _no_usable_model(job, event, out)
    prefix = out.ctx.volume_prefix
    out.add(
        CopyModel(
            id=out.next_id(),
            namespace=job.namespace,
            name=job.name,
            version=job.version,
            src_url=paths.add_prefix(prefix, models[0].url),
            dst_url=paths.add_prefix(prefix, paths.deploy_model(job.spec.output_dir)),
        )
    )
    return replace(job, phase="deploy", step="copying", eval_models=models)


def _model_copied(job: JobState, event: Event, out: Recorder) -> JobState:
    assert isinstance(event, ModelCopied)
    if _stale_round(job, event, out):
        return job
    models = JobInput(models=list(job.eval_models))
    job = replace(job, phase="train", step="waiting", next_check_ms=None)
    if event.error is not None:
        status = JobStatus(phase="deploy", status="failed", reason=event.error, input=models)
        _publish(job, out, status)
        return _round_failed(job, out, f"deploy of round {job.version} failed", event.error)
    _publish(job, out, JobStatus(phase="deploy", status="ready", input=models))
    job = replace(job, last_error=None, consecutive_failures=0, retry_at_ms=None)
    return _check_trigger(job, out, reschedule=True)


def _forward(job: JobState, event: WorkerReported, out: Recorder) -> None:
    """Every worker message for a known job goes upstream as it came."""
    output = JobOutput(models=list(event.results), owner_info=msgspec.Raw(event.owner_info))
    _publish(job, out, JobStatus(phase=event.kind, status=event.status, output=output))


JobHandler = Callable[[JobState, Event, Recorder], JobState]

#: The lifecycle as a table: (phase, step, event) -> handler. Worker events are keyed
#: "kind/status"; effect results "train-written", "eval-written", "model-copied".
JOB_TABLE: dict[tuple[str, str, str], JobHandler] = {
    ("train", "waiting", "tick"): _on_tick,
    ("train", "preparing", "train-written"): _data_written,
    ("train", "running", "train/completed"): _train_completed,
    ("train", "running", "train/failed"): _worker_failed,
    ("eval", "preparing", "eval-written"): _data_written,
    ("eval", "running", "eval/completed"): _eval_completed,
    ("eval", "running", "eval/failed"): _worker_failed,
    ("deploy", "copying", "model-copied"): _model_copied,
}
