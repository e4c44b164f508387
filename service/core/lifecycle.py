"""The pure lifecycle: `transition(state, event, ctx) -> Outcome(state', effects, verdict)`,
and the lifecycle of one job, as a table of (phase, step, event) -> handler.

No I/O, no clock, no randomness: time, ids and settings arrive in `ctx`. Everything a job or
dataset decides lives in this package and nowhere else; the shell carries the effects out.
Dataset events go to `service.core.datasets`, the events of the resources the controller
only stores to `service.core.passthrough`, job events to the table below.

    train/waiting --trigger fires--> train/preparing --data written--> train/running
    train/running --train completed--> eval/preparing --data written--> eval/running
    eval/running  --eval completed--> deploy/copying --model copied--> train/waiting
    failures at any step go back to train/waiting (a failed round's train samples first).

A job Sedna's GM manages waits in eval/staged and deploy/staged until the GM's copy of the
job shows the stage `Waiting`, and follows the GM where it moves the job
(`service.core.conditions`).

The rounds live in `service.core.training` (trigger, data, reports, failures and their
backoff), the deploy decision, the deploy gate and rollbacks in `service.core.deploys`; this
module routes events to them. A rollback and its copy's result are taken in any (phase,
step): whether one may start is the rollback's own rule. An event that does not fit the
job's (phase, step) leaves it unchanged and says why.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from service.core import (
    conditions,
    datasets,
    deploys,
    passthrough,
    paths,
    reports,
    samples,
    training,
)
from service.core.effects import (
    AttachDataset,
    Context,
    DetachDataset,
    Effect,
    Outcome,
    Publish,
    Recorder,
    Reject,
    ReleaseOutputDir,
    Verdict,
)
from service.core.events import (
    DatasetApplied,
    DatasetChanged,
    DatasetDeleted,
    DatasetPolled,
    Event,
    JobApplied,
    JobDeleted,
    ModelCopied,
    OwnerReported,
    ResourceApplied,
    ResourceDeleted,
    RollbackRequested,
    RoundWritten,
    Tick,
    WorkerReported,
)
from service.core.state import DatasetState, JobState, State
from service.wire import JobOutput, JobStatus

replace = msgspec.structs.replace

__all__ = ["JOB_TABLE", "apply", "transition", "verdict"]


def apply(state: State | None, event: Event, out: Recorder) -> State | None:
    """Apply one event to a job (None: the job does not exist, or no longer does)."""
    result = _apply(state, event, out)
    if isinstance(result, JobState):
        return conditions.after(result, out)
    return result


def _apply(state: State | None, event: Event, out: Recorder) -> State | None:
    if state is not None and not isinstance(state, JobState):
        out.note(f"{type(event).__name__} does not apply to a dataset")
        return state
    if isinstance(event, JobApplied):
        return _job_applied(state, event, out)
    if isinstance(event, RollbackRequested):
        return deploys.rollback_requested(state, event, out)
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
        if conditions.managed(state) and not training.active(state):
            out.note("binding ended: this node no longer runs the job's workers; files kept")
        else:
            out.note("job deleted")
        return None
    if isinstance(event, DatasetChanged):
        return _dataset_changed(state, event, out)
    if isinstance(event, ModelCopied) and event.rollback:
        return deploys.rollback_copied(state, event, out)
    if isinstance(event, WorkerReported):
        _forward(state, event, out)
    if isinstance(event, Tick) and conditions.managed(state):
        state = conditions.resend(state, event, out)
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
        # forwarded and changing nothing: the progress (ready, running) of the stage the job
        # runs, and the inference worker's reports; any other was refused (`reports.refusal`)
        return job
    if isinstance(event, Tick):
        return replace(job, next_check_ms=None)  # no trigger check outside train/waiting
    out.note(f"{type(event).__name__} does not fit {where} (version {job.version}): ignored")
    return job


# ================================================================= spec and dataset
def _job_applied(state: JobState | None, event: JobApplied, out: Recorder) -> JobState | None:
    job = _spec_applied(state, event, out)
    if job is None or event.gm is None or event.output_dir_holder is not None:
        return job
    return conditions.follow(job, event.gm, out)


def _spec_applied(state: JobState | None, event: JobApplied, out: Recorder) -> JobState | None:
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
    if job.step == "waiting" and job.phase == "train" and training.active(job):
        due_ms = out.ctx.now_ms + job.spec.trigger.check_period_s * 1000
        job = replace(job, next_check_ms=due_ms)
        out.schedule(due_ms)
    return job


def _release(job: JobState, out: Recorder) -> ReleaseOutputDir:
    """Give up the job's claim on its outputDir (the shell claims one for each job)."""
    return ReleaseOutputDir(
        id=out.next_id(), namespace=job.namespace, name=job.name,
        output_dir=paths.claim_dir(out.ctx.volume_prefix, job.spec.output_dir),
    )  # fmt: skip


def _dataset_changed(job: JobState, event: DatasetChanged, out: Recorder) -> JobState:
    info = replace(event.info, format=event.info.format.lower())
    was_active = training.active(job)
    job = replace(job, dataset=info)
    if not info.present:
        out.note(f"dataset {event.dataset} deleted: job paused, state kept")
        return replace(job, next_check_ms=None)
    grown = False
    if event.num_samples is not None:
        job, grown = _account(job, event.num_samples, out)
    if grown or not was_active:
        return training.check_trigger(job, out, reschedule=not was_active)
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


def _forward(job: JobState, event: WorkerReported, out: Recorder) -> None:
    """Every worker message for a known job goes upstream as it came; Sedna's GM gets the
    train and eval workers' (those it takes in: not `running`), never the inference
    worker's, whose `completed` it would take for the end of the deploy stage."""
    output = JobOutput(models=list(event.results), owner_info=msgspec.Raw(event.owner_info))
    status = JobStatus(phase=event.kind, status=event.status, output=output)
    training.publish(job, out, status, to_gm=event.kind in ("train", "eval"))


JobHandler = Callable[[JobState, Event, Recorder], JobState]

#: The lifecycle as a table: (phase, step, event) -> handler. Worker events are keyed
#: "kind/status"; effect results "train-written", "eval-written", "model-copied".
JOB_TABLE: dict[tuple[str, str, str], JobHandler] = {
    ("train", "waiting", "tick"): training.on_tick,
    ("train", "preparing", "train-written"): training.data_written,
    ("train", "running", "train/completed"): training.train_completed,
    ("train", "running", "train/failed"): training.worker_failed,
    ("eval", "preparing", "eval-written"): training.data_written,
    ("eval", "running", "eval/completed"): deploys.eval_completed,
    ("eval", "running", "eval/failed"): training.worker_failed,
    ("deploy", "copying", "model-copied"): deploys.model_copied,
}


# ================================================================= the entry point
def transition(state: State | None, event: Event, ctx: Context) -> Outcome:
    """Apply one event to one resource's state. Never raises for any well-typed input."""
    out = Recorder(ctx)
    if isinstance(event, DatasetApplied | DatasetDeleted | DatasetPolled) or (
        isinstance(event, Tick) and event.kind == "dataset"
    ):
        result = datasets.apply(state, event, out)
    elif isinstance(event, ResourceApplied | ResourceDeleted | OwnerReported):
        result = passthrough.apply(state, event, out)
    else:
        result = apply(state, event, out)
    result = _stamp_phase(state, result, ctx.now_ms)
    effects = tuple(out.effects)
    return Outcome(result, effects, verdict(state, result, effects))


def _stamp_phase(before: State | None, after: State | None, now_ms: int) -> State | None:
    """Record when a job entered its (phase, step): now, if it is new or they changed."""
    if not isinstance(after, JobState):
        return after
    if isinstance(before, JobState) and (before.phase, before.step) == (after.phase, after.step):
        return after
    return msgspec.structs.replace(after, phase_since_ms=now_ms)


def verdict(before: State | None, after: State | None, effects: tuple[Effect, ...]) -> Verdict:
    """Rejected when refused; ignored when only bookkeeping changed and nothing was said
    upstream; applied otherwise."""
    if any(isinstance(e, Reject) for e in effects):
        return "rejected"
    if _material(before) == _material(after) and not any(isinstance(e, Publish) for e in effects):
        return "ignored"
    return "applied"


def _material(state: State | None) -> State | None:
    """The state without its bookkeeping of timers and polls in flight."""
    if isinstance(state, JobState):
        return msgspec.structs.replace(state, next_check_ms=None)
    if isinstance(state, DatasetState):
        return msgspec.structs.replace(state, polling=False)
    return state
