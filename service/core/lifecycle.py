"""The pure lifecycle: `transition(state, event, ctx) -> Outcome(state', effects, verdict)`,
and the lifecycle tables that declare every move a job, dataset or stored resource makes.

No I/O, no clock, no randomness: time, ids and settings arrive in `ctx`. Everything a job or
dataset decides lives in this package and nowhere else; the shell carries the effects out.
Dataset events go to `service.core.datasets`, the events of the resources the controller
only stores to `service.core.passthrough`, job events to the handlers here, one per event
class, which route them on: the rounds to `service.core.training` (trigger, data, reports,
failures and their backoff), the deploy decision, the deploy gate and rollbacks to
`service.core.deploys`, what Sedna's GM shows of a job to `service.core.conditions`.

The tables below are the whole truth of where a resource may go: each row is one move,
(state, event) -> state, a job's state being its `phase/step` (`none`: it does not exist).
Handlers compute the effects and the data; `transition` checks every result against the
table. Staying put is always allowed (an event refused, stale, or with nothing to do); a
row from `any` is taken in every state; a result event (round data written, model copied)
or a train or eval report with no row from the job's state does not fit it: it leaves the
job unchanged and says why. A move no row declares is a bug: with `Context.strict` (the
tests) `transition` raises `UndeclaredMove`; otherwise (production) it refuses the event
(`undeclared_move`, with the move in the reason), keeps the state and drops the effects.

A job Sedna's GM manages waits in eval/staged and deploy/staged until the GM's copy of the
job shows the stage `Waiting`, and follows the GM where it moves the job ("GM copy" rows;
"tick" rows from a running or staged state are the GM's too: a doubt about its copy ended).
A second job kind brings its own table (text rows like `JOB_TABLE`'s) and its handlers; the
machinery (`Table`, the checks in `transition`, the drawing) is shared, not copied.

The tables, as `diagram()` draws them (tests/core/test_lifecycle_docs.py keeps this and
docs/lifecycle.md in step with them; `python -m tests.core.test_lifecycle_docs` rewrites both):

    LifelongLearningJob:
    none --applied, GM copy--> train/waiting  # created; waits for its dataset
    any --applied--> (stays)  # spec updated, or the insert refused
    any --GM copy--> (stays)  # spec updated; the GM's copy remembered
    any --deleted--> none  # deleted; its files kept
    any --dataset changed--> (stays)  # samples counted; paused if gone
    any --rollback--> (stays)  # a rollback's copy starts, or refused
    any --rollback copied--> (stays)  # the deploy file holds the rollback
    any --rollback failed--> (stays)  # the rollback refused after all
    any --tick--> (stays)  # timer forgotten; a GM ready resent
    train/waiting --tick, dataset changed--> train/preparing  # the train trigger fires
    train/waiting --GM copy--> train/preparing  # GM: Train/Waiting, the trigger fires
    train/preparing --train written--> train/running  # train ready sent
    train/preparing --train write failed--> train/waiting  # round failed
    train/running --train/completed--> eval/preparing  # its eval data is written
    train/running --train/completed--> eval/staged  # GM: the eval waits for Eval/Waiting
    train/running --train/completed--> train/waiting  # no usable model: round failed
    train/running --train/failed--> train/waiting  # round failed
    eval/preparing --eval written--> eval/running  # eval ready sent
    eval/preparing --eval write failed--> train/waiting  # round failed
    eval/running --eval/completed--> deploy/copying  # deployed: the copy starts
    eval/running --eval/completed--> deploy/waiting  # the copy waits for a rollback's
    eval/running --eval/completed--> deploy/staged  # GM: the decision waits for Deploy/Waiting
    eval/running --eval/completed--> train/waiting  # held back, or no usable model
    eval/running --eval/completed--> train/preparing  # held back; the trigger fires at once
    eval/running --eval/failed--> train/waiting  # round failed
    deploy/copying --model copied--> train/waiting  # deployed
    deploy/copying --model copied--> train/preparing  # deployed; the trigger fires at once
    deploy/copying --copy failed--> train/waiting  # round failed
    deploy/waiting --rollback copied, rollback failed--> deploy/copying  # the waiting copy
        starts
    deploy/waiting --rollback failed--> train/waiting | train/preparing  # held back: compared
        with it
    eval/staged --GM copy, tick--> eval/preparing  # GM: Eval/Waiting, its data is written
    deploy/staged --GM copy, tick--> deploy/copying | deploy/waiting | train/waiting |
        train/preparing  # GM: Deploy/Waiting, the deploy decision
    train/running --GM copy, tick--> eval/preparing | eval/staged | train/waiting  # GM: trained
        on another node, as train/completed
    eval/running --GM copy, tick--> deploy/copying | deploy/waiting | deploy/staged |
        train/waiting | train/preparing  # GM: evaluated on another node, as eval/completed
    train/running, eval/staged, eval/preparing, eval/running, deploy/staged, deploy/waiting,
        deploy/copying --GM copy--> train/waiting  # GM: it failed the stage; round failed

    IncrementalLearningJob: the rows of LifelongLearningJob, and
    eval/preparing --eval written--> train/waiting  # no trained model fits the Model: round
        failed
    train/waiting --GM copy--> (stays)  # GM: Deploy/Running (hot update): completed sent

    Dataset:
    none --applied--> present  # created; its first poll starts
    present --applied, polled, tick--> (stays)  # updated, counted, polled
    present --deleted--> none  # deleted; its jobs pause

    Stored resource:
    none --applied--> stored  # stored
    stored --applied, reported--> (stays)  # updated; reports forwarded
    stored --deleted--> none  # forgotten
"""


import textwrap
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

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
    DatasetChanged,
    DatasetEvent,
    Event,
    JobApplied,
    JobDeleted,
    ModelCopied,
    RollbackRequested,
    RoundWritten,
    StoredEvent,
    Tick,
    WorkerReported,
)
from service.core.state import DatasetState, JobState, ResourceState, State
from service.wire import JobOutput, JobSpec, JobStatus

replace = msgspec.structs.replace

__all__ = [
    "DATASET_TABLE",
    "INCREMENTAL_TABLE",
    "JOB_TABLE",
    "RESOURCE_TABLE",
    "Move",
    "Rule",
    "Table",
    "UndeclaredMove",
    "diagram",
    "event_key",
    "transition",
    "verdict",
    "where",
]

#: The state of a resource that does not exist (before its insert, after its delete).
NONE = "none"
#: The source of a row taken in every state.
ANY = "any"
#: The target of a row that leaves the state where it is.
SAME = "="


class UndeclaredMove(Exception):
    """A handler moved a resource where its lifecycle table declares no move: a bug."""


class Move(NamedTuple):
    """One move of a lifecycle table: `event` in state `source` may lead to `target`."""

    source: str
    event: str
    target: str


class Rule(NamedTuple):
    """One row of a lifecycle table: each of `events` in each of `sources` may lead to each
    of `targets`, for the reason `why`."""

    sources: tuple[str, ...]
    events: tuple[str, ...]
    targets: tuple[str, ...]
    why: str

    @property
    def moves(self) -> list[Move]:
        return [Move(s, e, t) for e in self.events for s in self.sources for t in self.targets]

    def text(self) -> str:
        """The row as one line of the drawing (wrapped when long)."""
        targets = " | ".join("(stays)" if t == SAME else t for t in self.targets)
        line = f"{', '.join(self.sources)} --{', '.join(self.events)}--> {targets}  # {self.why}"
        return textwrap.fill(line, width=92, subsequent_indent="    ", break_on_hyphens=False)


class Table:
    """One kind's lifecycle as data: the moves each (state, event) may make; `extends`:
    another kind's table whose rows this one has too, before its own."""

    def __init__(self, kind: str, rules: Iterable[Rule], extends: "Table | None" = None) -> None:
        self.kind = kind
        self.extends = extends
        self.own = tuple(rules)
        self.rules: tuple[Rule, ...] = (extends.rules if extends is not None else ()) + self.own
        targets: dict[tuple[str, str], set[str]] = {}
        for rule in self.rules:
            for move in rule.moves:
                targets.setdefault((move.source, move.event), set()).add(move.target)
        self._targets = MappingProxyType({k: frozenset(v) for k, v in targets.items()})

    def fits(self, state: str, event: str) -> bool:
        """Whether the table has a row for `event` in `state` (or in any state)."""
        return (state, event) in self._targets or (ANY, event) in self._targets

    def targets(self, state: str, event: str) -> frozenset[str]:
        """Where `event` may take a resource in `state` (besides leaving it there)."""
        return self._targets.get((state, event), frozenset()) | self._targets.get(
            (ANY, event), frozenset()
        )

    def allows(self, before: str, event: str, after: str) -> bool:
        """Whether `event` may move a resource from `before` to `after`."""
        return after == before or after in self.targets(before, event)

    def diagram(self) -> str:
        """The table as text: its kind, then a line per row, in the order declared (for a
        table that extends another, that one's name and then only its own rows)."""
        title = f"{self.kind}:"
        if self.extends is not None:
            title = f"{self.kind}: the rows of {self.extends.kind}, and"
        return "\n".join([title, *(rule.text() for rule in self.own)])


def _rules(text: str) -> list[Rule]:
    """A table's rows as written: `sources | events | targets | why` a line (a long one
    continued with a backslash), lists split by commas; `=` as the target: it stays."""
    rules = []
    for line in text.strip().splitlines():
        sources, events, targets, why = (cell.strip() for cell in line.split("|"))
        rules.append(Rule(_names(sources), _names(events), _names(targets), why))
    return rules


def _names(cell: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in cell.split(","))


#: The lifecycle of a LifelongLearningJob. "GM:" rows are GM-managed jobs' only.
JOB_TABLE = Table(
    "LifelongLearningJob",
    _rules(
        """
none            | applied, GM copy   | train/waiting   | created; waits for its dataset
any             | applied            | =               | spec updated, or the insert refused
any             | GM copy            | =               | spec updated; the GM's copy remembered
any             | deleted            | none            | deleted; its files kept
any             | dataset changed    | =               | samples counted; paused if gone
any             | rollback           | =               | a rollback's copy starts, or refused
any             | rollback copied    | =               | the deploy file holds the rollback
any             | rollback failed    | =               | the rollback refused after all
any             | tick               | =               | timer forgotten; a GM ready resent
train/waiting   | tick, dataset changed | train/preparing | the train trigger fires
train/waiting   | GM copy            | train/preparing | GM: Train/Waiting, the trigger fires
train/preparing | train written      | train/running   | train ready sent
train/preparing | train write failed | train/waiting   | round failed
train/running   | train/completed    | eval/preparing  | its eval data is written
train/running   | train/completed    | eval/staged     | GM: the eval waits for Eval/Waiting
train/running   | train/completed    | train/waiting   | no usable model: round failed
train/running   | train/failed       | train/waiting   | round failed
eval/preparing  | eval written       | eval/running    | eval ready sent
eval/preparing  | eval write failed  | train/waiting   | round failed
eval/running    | eval/completed     | deploy/copying  | deployed: the copy starts
eval/running    | eval/completed     | deploy/waiting  | the copy waits for a rollback's
eval/running    | eval/completed     | deploy/staged   | GM: the decision waits for Deploy/Waiting
eval/running    | eval/completed     | train/waiting   | held back, or no usable model
eval/running    | eval/completed     | train/preparing | held back; the trigger fires at once
eval/running    | eval/failed        | train/waiting   | round failed
deploy/copying  | model copied       | train/waiting   | deployed
deploy/copying  | model copied       | train/preparing | deployed; the trigger fires at once
deploy/copying  | copy failed        | train/waiting   | round failed
deploy/waiting  | rollback copied, rollback failed | deploy/copying | the waiting copy starts
deploy/waiting  | rollback failed    | train/waiting, train/preparing | held back: compared with it
eval/staged     | GM copy, tick      | eval/preparing  | GM: Eval/Waiting, its data is written
deploy/staged   | GM copy, tick      | deploy/copying, deploy/waiting, train/waiting, \
train/preparing | GM: Deploy/Waiting, the deploy decision
train/running   | GM copy, tick      | eval/preparing, eval/staged, train/waiting \
| GM: trained on another node, as train/completed
eval/running    | GM copy, tick      | deploy/copying, deploy/waiting, deploy/staged, \
train/waiting, train/preparing | GM: evaluated on another node, as eval/completed
train/running, eval/staged, eval/preparing, eval/running, deploy/staged, deploy/waiting, \
deploy/copying | GM copy | train/waiting | GM: it failed the stage; round failed
"""
    ),
)

#: The lifecycle of an IncrementalLearningJob: a lifelong-learning job's, where models come
#: from Models and go to one (`service.core.kinds`), and these rows besides.
INCREMENTAL_TABLE = Table(
    "IncrementalLearningJob",
    _rules(
        """
eval/preparing | eval written | train/waiting | no trained model fits the Model: round failed
train/waiting  | GM copy      | =             | GM: Deploy/Running (hot update): completed sent
"""
    ),
    extends=JOB_TABLE,
)

#: The lifecycle of a Dataset: it exists or not; its count and its polls change inside.
DATASET_TABLE = Table(
    "Dataset",
    _rules(
        """
none    | applied                | present | created; its first poll starts
present | applied, polled, tick  | =       | updated, counted, polled
present | deleted                | none    | deleted; its jobs pause
"""
    ),
)

#: The lifecycle of a resource the controller only stores (Model, JointInferenceService,
#: FederatedLearningJob).
RESOURCE_TABLE = Table(
    "Stored resource",
    _rules(
        """
none   | applied           | stored | stored
stored | applied, reported | =      | updated; reports forwarded
stored | deleted           | none   | forgotten
"""
    ),
)


def diagram() -> str:
    """Every lifecycle table as text (the end of this module's docstring)."""
    tables = (JOB_TABLE, INCREMENTAL_TABLE, DATASET_TABLE, RESOURCE_TABLE)
    return "\n\n".join(t.diagram() for t in tables)


def job_table(state: State | None, event: Event) -> Table:
    """The table of the job an event is for: its kind's (an insert's, for a new job)."""
    spec = state.spec if isinstance(state, JobState) else None
    if spec is None and isinstance(event, JobApplied):
        spec = event.spec
    return INCREMENTAL_TABLE if spec is not None and spec.incremental else JOB_TABLE


def where(state: State | None) -> str:
    """A resource's state as its table names it: a job's `phase/step`, `present` (a
    dataset), `stored` (a stored resource), `none` (it does not exist)."""
    if isinstance(state, JobState):
        return f"{state.phase}/{state.step}"
    if isinstance(state, DatasetState):
        return "present"
    if isinstance(state, ResourceState):
        return "stored"
    return NONE


def event_key(event: Event) -> str:
    """An event as the tables name it."""
    match event:
        case JobApplied(gm=gm):
            return "applied" if gm is None else "GM copy"
        case WorkerReported(kind=kind, status=status):
            return f"{kind}/{status}"
        case RoundWritten(phase=phase, error=error):
            return f"{phase} written" if error is None else f"{phase} write failed"
        case ModelCopied(rollback=True, error=error):
            return "rollback copied" if error is None else "rollback failed"
        case ModelCopied(error=error):
            return "model copied" if error is None else "copy failed"
    return _KEYS[type(event).__name__]


#: The events each table names by their class alone.
_KEYS: Mapping[str, str] = MappingProxyType(
    {
        "JobDeleted": "deleted",
        "DatasetApplied": "applied",
        "DatasetDeleted": "deleted",
        "DatasetPolled": "polled",
        "DatasetChanged": "dataset changed",
        "ResourceApplied": "applied",
        "ResourceDeleted": "deleted",
        "OwnerReported": "reported",
        "RollbackRequested": "rollback",
        "Tick": "tick",
    }
)


# ================================================================= the job handlers
def apply(state: State | None, event: Event, out: Recorder) -> State | None:
    """Apply one event to a job (None: the job does not exist, or no longer does)."""
    if state is not None and not isinstance(state, JobState):
        out.note(f"{type(event).__name__} does not apply to a dataset")
        return state
    result = _HANDLERS[type(event)](state, event, out)
    if isinstance(result, JobState):
        return conditions.after(result, out)
    return result


def _absent(event: Event, out: Recorder) -> JobState | None:
    out.note(f"{type(event).__name__} for a job that does not exist: ignored")
    return None


def _fits(job: JobState, event: Event) -> bool:
    return job_table(job, event).fits(where(job), event_key(event))


def _job_deleted(state: JobState | None, event: JobDeleted, out: Recorder) -> JobState | None:
    if state is None:
        return _absent(event, out)
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


def _dataset_notice(
    state: JobState | None, event: DatasetChanged, out: Recorder
) -> JobState | None:
    if state is None:
        return _absent(event, out)
    return _dataset_changed(state, event, out)


def _reported(state: JobState | None, event: WorkerReported, out: Recorder) -> JobState | None:
    refusal = reports.refusal(state, event, out.ctx.volume_prefix)
    if refusal is not None:
        out.add(refusal)
        return state
    if state is None:
        return _absent(event, out)
    _forward(state, event, out)
    if not _fits(state, event):
        # forwarded and changing nothing: the progress (ready, running) of the stage the job
        # runs, and the inference worker's reports; any other was refused (`reports.refusal`)
        return state
    if event.status == "failed":
        return training.worker_failed(state, event, out)
    if event.kind == "train":
        return training.train_completed(state, event, out)
    return deploys.eval_completed(state, event, out)


def _ticked(state: JobState | None, event: Tick, out: Recorder) -> JobState | None:
    """A timer: a GM-managed job looks at the GM's copy again; in train/waiting the trigger
    is checked; anywhere else the timer is forgotten (no trigger check outside it)."""
    if state is None:
        return _absent(event, out)
    if conditions.managed(state):
        state = conditions.resend(state, event, out)
    return training.on_tick(state, event, out)


def _written(state: JobState | None, event: RoundWritten, out: Recorder) -> JobState | None:
    if state is None:
        return _absent(event, out)
    if not _fits(state, event):
        return _does_not_fit(state, event, out)
    return training.data_written(state, event, out)


def _copied(state: JobState | None, event: ModelCopied, out: Recorder) -> JobState | None:
    if state is None:
        return _absent(event, out)
    if event.rollback:
        return deploys.rollback_copied(state, event, out)
    if not _fits(state, event):
        return _does_not_fit(state, event, out)
    return deploys.model_copied(state, event, out)


def _does_not_fit(job: JobState, event: Event, out: Recorder) -> JobState:
    out.note(
        f"{type(event).__name__} does not fit {job.phase}/{job.step} (version {job.version}): "
        "ignored"
    )
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
    unchangeable = _unchangeable(state, event.spec)
    if unchangeable is not None:
        out.add(Reject(code="immutable_field", reason=unchangeable))
        return state
    job = replace(state, spec=event.spec, digest=event.digest)
    out.note("spec updated; applies from the next evaluation")
    if paths.canonical_dir(event.spec.output_dir) != paths.canonical_dir(state.spec.output_dir):
        out.add(_release(state, out))
    if job.retry_at_ms is not None:
        # a changed spec (a fixed worker template, say) is worth trying without the wait
        job = replace(job, retry_at_ms=None)
    if job.step == "waiting" and job.phase == "train" and training.active(job):
        due_ms = out.ctx.now_ms + job.spec.trigger.check_period_seconds * 1000
        job = replace(job, next_check_ms=due_ms)
        out.schedule(due_ms)
    return job


def _unchangeable(job: JobState, spec: JobSpec) -> str | None:
    """Why an insert cannot update the job (None: it can): it is of the other kind, whose
    job holds the name, or it names another dataset."""
    if spec.kind != job.spec.kind:
        return (
            f"{job.namespace}/{job.name} is a {job.spec.kind} already: a namespace and name "
            f"hold one job, so this {spec.kind} is refused; delete the other job or choose "
            "another name"
        )
    if spec.dataset != job.spec.dataset:
        return (
            f"spec.dataset.name cannot change (was {job.spec.dataset!r}); delete and "
            "re-create the job"
        )
    return None


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

#: The job handlers, one per event class.
_HANDLERS: Mapping[type, Callable[[JobState | None, Any, Recorder], JobState | None]] = (
    MappingProxyType(
        {
            JobApplied: _job_applied,
            JobDeleted: _job_deleted,
            DatasetChanged: _dataset_notice,
            RollbackRequested: deploys.rollback_requested,
            WorkerReported: _reported,
            Tick: _ticked,
            RoundWritten: _written,
            ModelCopied: _copied,
        }
    )
)


# ================================================================= the entry point
def transition(state: State | None, event: Event, ctx: Context) -> Outcome:
    """Apply one event to one resource's state. Never raises for any well-typed
    input, unless `ctx.strict` and a handler makes a move its table does not declare."""
    out = Recorder(ctx)
    if isinstance(event, DatasetEvent) or (isinstance(event, Tick) and event.kind == "dataset"):
        table, result = DATASET_TABLE, datasets.apply(state, event, out)
    elif isinstance(event, StoredEvent):
        table, result = RESOURCE_TABLE, passthrough.apply(state, event, out)
    else:
        table, result = job_table(state, event), apply(state, event, out)
    key, before, after = event_key(event), where(state), where(result)
    if not table.allows(before, key, after):
        problem = (
            f"{type(event).__name__} ({key}) moved {before} to {after}: a move the "
            f"{table.kind} lifecycle table does not declare"
        )
        if ctx.strict:
            raise UndeclaredMove(problem)
        refused = Reject(code="undeclared_move", reason=f"{problem}; refused, state kept")
        return Outcome(state, (refused,), "rejected")
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
