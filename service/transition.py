"""The pure lifecycle: `transition(state, event, ctx) -> Outcome(state', effects)`.

No I/O, no clock, no randomness: time, ids and settings arrive in `ctx`. Everything a job or
dataset decides lives here and nowhere else. Events that move a job through its rounds are
looked up in `JOB_TABLE` by (phase, step, event); one that does not fit leaves the state
unchanged and yields a `Note` saying why.

The round of one job (CONTRACT.md "The lifecycle of one job"):

    train/waiting --trigger fires--> train/preparing --data written--> train/running
    train/running --train completed--> eval/preparing --data written--> eval/running
    eval/running  --eval completed--> deploy/copying --model copied--> train/waiting
    failures at any step go back to train/waiting (a failed round's train samples first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec

from service import paths, samples
from service.state import (
    AttachDataset,
    Context,
    CopyModel,
    DatasetApplied,
    DatasetChanged,
    DatasetDeleted,
    DatasetInfo,
    DatasetPolled,
    DatasetState,
    DetachDataset,
    Effect,
    Event,
    JobApplied,
    JobDeleted,
    JobState,
    ModelCopied,
    ModelRef,
    Note,
    NotifyJobs,
    Outcome,
    PollDataset,
    Publish,
    Reject,
    RoundWritten,
    ScheduleCheck,
    State,
    Tick,
    WorkerReported,
    WriteRound,
)
from service.triggers import NUM_OF_SAMPLES, should_fire

JOB_KIND: Final = "lifelonglearningjob"
DATASET_KIND: Final = "dataset"

replace = msgspec.structs.replace


class _Out:
    """Collects the effects of one transition and numbers their ids from the event's id."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.effects: list[Effect] = []

    def next_id(self) -> str:
        return f"{self.ctx.event_id}/{len(self.effects)}"

    def add(self, effect: Effect) -> None:
        self.effects.append(effect)

    def note(self, reason: str) -> None:
        self.add(Note(reason=reason))

    def publish_job(self, job: JobState, content: dict[str, Any]) -> None:
        self.add(
            Publish(
                id=self.next_id(),
                kind=JOB_KIND,
                namespace=job.namespace,
                name=job.name,
                content=content,
            )
        )

    def schedule(self, due_ms: int) -> None:
        self.add(ScheduleCheck(due_ms=due_ms))

    def done(self, state: State | None) -> Outcome:
        return Outcome(state, tuple(self.effects))


def transition(state: State | None, event: Event, ctx: Context) -> Outcome:
    """Apply one event to one resource's state. Never raises for any well-typed input."""
    out = _Out(ctx)
    match event:
        case JobApplied() | JobDeleted() | DatasetChanged() | WorkerReported():
            result = _job_event(state, event, out)
        case RoundWritten() | ModelCopied():
            result = _job_event(state, event, out)
        case Tick(kind="job"):
            result = _job_event(state, event, out)
        case DatasetApplied() | DatasetDeleted() | DatasetPolled() | Tick():
            result = _dataset_event(state, event, out)
    return out.done(_stamp_phase(state, result, ctx.now_ms))


def _stamp_phase(before: State | None, after: State | None, now_ms: int) -> State | None:
    """Record when a job entered its (phase, step): now, if it is new or they changed."""
    if not isinstance(after, JobState):
        return after
    if isinstance(before, JobState) and (before.phase, before.step) == (after.phase, after.step):
        return after
    return replace(after, phase_since_ms=now_ms)


# ================================================================= jobs
def _job_event(state: State | None, event: Event, out: _Out) -> State | None:
    if isinstance(state, DatasetState):
        out.note(f"{type(event).__name__} does not apply to a dataset")
        return state
    if isinstance(event, JobApplied):
        return _job_applied(state, event, out)
    if state is None:
        if isinstance(event, WorkerReported):
            out.add(Reject(reason=f"unknown job {event.namespace}/{event.name}"))
        else:
            out.note(f"{type(event).__name__} for a job that does not exist: ignored")
        return None
    if isinstance(event, JobDeleted):
        out.add(
            DetachDataset(
                id=out.next_id(),
                namespace=state.namespace,
                name=state.name,
                dataset=state.spec.dataset,
            )
        )
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


def _does_not_fit(job: JobState, event: Event, out: _Out) -> JobState:
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


def _job_applied(state: JobState | None, event: JobApplied, out: _Out) -> JobState:
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
        out.add(
            Reject(
                reason=f"spec.dataset.name cannot change (was {state.spec.dataset!r}); "
                "delete and re-create the job"
            )
        )
        return state
    job = replace(state, spec=event.spec, digest=event.digest)
    out.note("spec updated; applies from the next evaluation")
    if job.step == "waiting" and job.phase == "train" and _active(job):
        period_ms = job.spec.trigger.check_period_s * 1000
        job = replace(job, next_check_ms=out.ctx.now_ms + period_ms)
        out.schedule(out.ctx.now_ms + period_ms)
    return job


def _dataset_changed(job: JobState, event: DatasetChanged, out: _Out) -> JobState:
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


def _account(job: JobState, available: int, out: _Out) -> tuple[JobState, bool]:
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


def _check_trigger(job: JobState, out: _Out, *, reschedule: bool) -> JobState:
    """Evaluate the train trigger in train/waiting; keep one periodic check scheduled."""
    if (job.phase, job.step) != ("train", "waiting"):
        return job
    if not _active(job):
        return replace(job, next_check_ms=None)
    ctx = out.ctx
    pending = samples.count(job.pending)
    metrics = {NUM_OF_SAMPLES: pending}
    if pending >= 1 and should_fire(job.spec.trigger, metrics, ctx.minute_of_day):
        return _fire(job, out)
    if reschedule or job.next_check_ms is None or job.next_check_ms <= ctx.now_ms:
        due_ms = ctx.now_ms + job.spec.trigger.check_period_s * 1000
        out.schedule(due_ms)
        return replace(job, next_check_ms=due_ms)
    return job


def _on_tick(job: JobState, event: Event, out: _Out) -> JobState:
    return _check_trigger(replace(job, next_check_ms=None), out, reschedule=True)


def _fire(job: JobState, out: _Out) -> JobState:
    """The trigger fired: round v takes every pending train sample; later ones wait."""
    version = job.version + 1
    job = replace(
        job,
        version=version,
        round=job.pending,
        pending=(),
        step="preparing",
        next_check_ms=None,
    )
    out.add(_write_round(job, "train", job.round, out))
    out.note(f"train trigger fired: round {version} with {samples.count(job.round)} samples")
    return job


def _write_round(job: JobState, phase: str, ranges: samples.Ranges, out: _Out) -> WriteRound:
    assert job.dataset is not None  # only fired while active
    assert phase in ("train", "eval")
    prefix = out.ctx.volume_prefix
    dataset = job.dataset
    data_dir = paths.round_data_dir(job.spec.output_dir, phase, job.version)
    index = paths.needs_index(dataset.url, dataset.format)
    return WriteRound(
        id=out.next_id(),
        namespace=job.namespace,
        name=job.name,
        phase="train" if phase == "train" else "eval",
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


def _round_input(job: JobState, phase: str) -> dict[str, Any]:
    """The worker-visible `input` of a round's ready message (no volume prefix)."""
    assert job.dataset is not None
    data_dir = paths.round_data_dir(job.spec.output_dir, phase, job.version)
    result: dict[str, Any] = {
        "dataURL": paths.join(data_dir, paths.data_file(job.dataset.format)),
    }
    if paths.needs_index(job.dataset.url, job.dataset.format):
        result["dataIndexURL"] = paths.join(data_dir, "dataIndex.txt")
    result["outputDir"] = paths.round_output_dir(job.spec.output_dir, phase, job.version)
    return result


def _models(models: tuple[ModelRef, ...]) -> list[dict[str, str]]:
    return [{"format": model.format, "url": model.url} for model in models]


def _stale_round(job: JobState, event: RoundWritten | ModelCopied, out: _Out) -> bool:
    if event.version != job.version:
        out.note(f"result for round {event.version} while at round {job.version}: ignored")
        return True
    return False


def _data_written(job: JobState, event: Event, out: _Out) -> JobState:
    """A round's train or eval data is on disk: tell the worker (eval gets the train models)."""
    assert isinstance(event, RoundWritten)
    if _stale_round(job, event, out):
        return job
    if event.error is not None:
        out.publish_job(job, {"phase": event.phase, "status": "failed", "reason": event.error})
        return _back_to_train(job, out, event.error, retry_now=False)
    content = _round_input(job, event.phase)
    if event.phase == "eval":
        content = {"models": _models(job.train_models), **content}
    out.publish_job(job, {"phase": event.phase, "status": "ready", "input": content})
    return replace(job, step="running")


def _no_usable_model(job: JobState, event: WorkerReported, out: _Out) -> JobState:
    """`completed` without a model to go on with: the round failed, and the cloud says why."""
    reason = event.unusable or f"{event.kind} worker completed without a usable model"
    out.publish_job(job, {"phase": event.kind, "status": "failed", "reason": reason})
    return _back_to_train(job, out, reason, retry_now=True)


def _train_completed(job: JobState, event: Event, out: _Out) -> JobState:
    assert isinstance(event, WorkerReported)
    if not event.models:
        return _no_usable_model(job, event, out)
    job = replace(job, phase="eval", step="preparing", train_models=event.models, round=())
    out.add(_write_round(job, "eval", job.eval_batches, out))
    return job


def _worker_failed(job: JobState, event: Event, out: _Out) -> JobState:
    assert isinstance(event, WorkerReported)
    return _back_to_train(job, out, f"{event.kind} worker {event.worker} failed", retry_now=True)


def _back_to_train(job: JobState, out: _Out, reason: str, *, retry_now: bool) -> JobState:
    """Back to train/waiting; a round whose training did not complete returns its samples
    to the front of the pending set, so the next round (v+1) trains on them again.

    A worker's failure re-arms the trigger at once (pending changed); our own effect's
    permanent failure waits one check period, so a broken store does not spin rounds.
    """
    out.note(f"round {job.version} {job.phase} failed: {reason}; back to train")
    job = replace(
        job,
        phase="train",
        step="waiting",
        pending=samples.concat(job.round, job.pending),
        round=(),
        last_error=reason,
        next_check_ms=None,
    )
    if retry_now:
        return _check_trigger(job, out, reschedule=True)
    due_ms = out.ctx.now_ms + job.spec.trigger.check_period_s * 1000
    out.schedule(due_ms)
    return replace(job, next_check_ms=due_ms)


def _eval_completed(job: JobState, event: Event, out: _Out) -> JobState:
    assert isinstance(event, WorkerReported)
    if not event.models:
        return _no_usable_model(job, event, out)
    prefix = out.ctx.volume_prefix
    source = event.models[0].url
    out.add(
        CopyModel(
            id=out.next_id(),
            namespace=job.namespace,
            name=job.name,
            version=job.version,
            src_url=paths.add_prefix(prefix, source),
            dst_url=paths.add_prefix(prefix, paths.deploy_model(job.spec.output_dir)),
        )
    )
    return replace(job, phase="deploy", step="copying", eval_models=event.models)


def _model_copied(job: JobState, event: Event, out: _Out) -> JobState:
    assert isinstance(event, ModelCopied)
    if _stale_round(job, event, out):
        return job
    models = {"models": _models(job.eval_models)}
    if event.error is None:
        out.publish_job(job, {"phase": "deploy", "status": "ready", "input": models})
        error = None
    else:
        out.publish_job(
            job, {"phase": "deploy", "status": "failed", "reason": event.error, "input": models}
        )
        out.note(f"deploy of round {job.version} failed: {event.error}")
        error = event.error
    job = replace(job, phase="train", step="waiting", last_error=error, next_check_ms=None)
    return _check_trigger(job, out, reschedule=True)


def _forward(job: JobState, event: WorkerReported, out: _Out) -> None:
    """Every worker message for a known job goes upstream as it came."""
    output = {"models": list(event.results), "ownerInfo": event.owner_info}
    out.publish_job(job, {"phase": event.kind, "status": event.status, "output": output})


JobHandler = Callable[[JobState, Event, _Out], JobState]

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


# ================================================================= datasets
def _dataset_event(state: State | None, event: Event, out: _Out) -> State | None:
    if isinstance(state, JobState):
        out.note(f"{type(event).__name__} does not apply to a job")
        return state
    if isinstance(event, DatasetApplied):
        return _dataset_applied(state, event, out)
    if state is None:
        out.note(f"{type(event).__name__} for a dataset that does not exist: ignored")
        return None
    if isinstance(event, DatasetDeleted):
        out.add(
            NotifyJobs(
                id=out.next_id(),
                namespace=state.namespace,
                dataset=state.name,
                info=_info(state, present=False),
            )
        )
        out.note("dataset deleted: its jobs pause")
        return None
    if isinstance(event, DatasetPolled):
        return _dataset_polled(state, event, out)
    assert isinstance(event, Tick)
    if state.polling:
        return state
    return _poll(state, out)


def _info(state: DatasetState, *, present: bool = True) -> DatasetInfo:
    return DatasetInfo(url=state.url, format=state.format, present=present)


def _poll(state: DatasetState, out: _Out) -> DatasetState:
    out.add(
        PollDataset(
            id=out.next_id(),
            namespace=state.namespace,
            name=state.name,
            url=paths.add_prefix(out.ctx.volume_prefix, state.url),
            format=state.format,
            cursor=state.cursor,
        )
    )
    return replace(state, polling=True)


def _dataset_applied(state: DatasetState | None, event: DatasetApplied, out: _Out) -> DatasetState:
    fmt = event.format.lower()
    if state is None:
        new = DatasetState(
            namespace=event.namespace,
            name=event.name,
            url=event.url,
            format=fmt,
            digest=event.digest,
        )
        out.note("dataset created")
        return _poll(new, out)
    if event.digest == state.digest:
        return state if state.polling else _poll(state, out)  # polled on every insert
    moved = (event.url, fmt) != (state.url, state.format)
    updated = replace(state, url=event.url, format=fmt, digest=event.digest)
    if moved:
        updated = replace(updated, cursor=b"")
        out.add(
            NotifyJobs(
                id=out.next_id(), namespace=state.namespace, dataset=state.name, info=_info(updated)
            )
        )
        out.note(f"dataset moved to {event.url} ({fmt}): counting again from its start")
    return updated if updated.polling else _poll(updated, out)


def _dataset_polled(state: DatasetState, event: DatasetPolled, out: _Out) -> DatasetState:
    state = replace(state, polling=False)
    if event.url != paths.add_prefix(out.ctx.volume_prefix, state.url):
        return _poll(state, out)  # a poll of the old location: poll the new one
    out.schedule(out.ctx.now_ms + out.ctx.dataset_poll_ms)
    if event.error is not None:
        out.note(f"dataset poll failed: {event.error}")
        return state
    state = replace(state, cursor=event.cursor)
    if event.num_samples == state.num_samples:
        return state
    state = replace(state, num_samples=event.num_samples)
    out.add(
        Publish(
            id=out.next_id(),
            kind=DATASET_KIND,
            namespace=state.namespace,
            name=state.name,
            content={"numberOfSamples": event.num_samples},
        )
    )
    out.add(
        NotifyJobs(
            id=out.next_id(),
            namespace=state.namespace,
            dataset=state.name,
            info=_info(state),
            num_samples=event.num_samples,
        )
    )
    return state
