"""The states of jobs, datasets and stored resources (Models, joint-inference services,
federated-learning jobs): small frozen typed values, stored in Redis as msgpack."""


from collections.abc import Callable
from typing import Any, Generic, Literal, Protocol, TypeVar

import msgspec

from service.core.rounds import Deployment, RoundRecord, Scores
from service.core.samples import Ranges
from service.wire import Condition, JobSpec, ModelRef, RollbackResult, Timer, Trigger

T = TypeVar("T")

Phase = Literal["train", "eval", "deploy"]
#: waiting: trigger armed, no worker (in deploy: the deploy copy waits for a rollback's copy
#: to finish); preparing: round data being written; running: a worker was told "ready" and
#: is outstanding; copying: the deploy copy is in flight; staged: the stage is due (its round
#: data, or the deploy decision) and waits for Sedna's GM to show it `Waiting` (GM-managed
#: jobs only).
Step = Literal["waiting", "preparing", "running", "copying", "staged"]
#: The phases that write round data and wait for a worker.
RoundPhase = Literal["train", "eval"]

__all__ = [
    "Codec",
    "DatasetInfo",
    "DatasetState",
    "GmSent",
    "GmView",
    "JobModels",
    "JobState",
    "ModelInfo",
    "ModelRef",
    "Phase",
    "ResourceState",
    "RoundPhase",
    "State",
    "Step",
    "decode_state",
    "encode_state",
]


class DatasetInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a job knows of its dataset; `present` false means deleted: the job pauses."""

    url: str
    format: str
    present: bool = True


class GmView(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the latest copy of a job Sedna's GM sent shows (GM-managed jobs only).

    `stage` and `type` are its latest condition's, in lower case (`type` empty: no condition
    yet); `count` how many conditions it has, `reported` how many of them a local controller
    reported (the GM appends one per status it takes in from the node). `round_dir` is the
    outputDir of its latest `Ready` condition: the round the GM runs workers for. `trained`
    and `evaluated` are the models (format, url, metrics) its latest `Train/Completed` and
    `Eval/Completed` conditions carry: what a worker reported to a controller on another
    node.
    """

    stage: Phase = "train"
    type: str = ""
    count: int = 0
    reported: int = 0
    round_dir: str = ""
    trained: tuple[dict[str, Any], ...] = ()
    evaluated: tuple[dict[str, Any], ...] = ()


class GmSent(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The last stage `ready` (or deploy `completed`) the job sent Sedna's GM: its round and
    stage, when it went, and the status itself (JSON), sent again while the GM still shows
    the stage `Waiting` a while later."""

    version: int
    stage: Phase
    at_ms: int
    status: bytes


class ModelInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a Model resource says: where the model is, its format, the device SoC versions it
    runs on, and whether it names an S3 credential (the annotation; never kept here)."""

    url: str
    format: str = ""
    devices: tuple[str, ...] = ()
    credential: bool = False


class JobModels(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The Models an incremental-learning job's spec names, as its latest rounds found them
    (a train round looks up the initial model it trains from, an eval round the model it
    compares with while nothing is deployed and the deploy model, where a deployed model
    goes: Sedna's GM sends each to the node with the stage that needs it)."""

    initial: ModelInfo | None = None
    compared: ModelInfo | None = None
    deploy: ModelInfo | None = None

    def updated(self, found: "JobModels") -> "JobModels":
        """These, with the ones just `found` in their place."""
        return JobModels(
            initial=found.initial or self.initial,
            compared=found.compared or self.compared,
            deploy=found.deploy or self.deploy,
        )


class JobState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="job"):
    namespace: str
    name: str
    spec: JobSpec
    digest: str
    phase: Phase = "train"
    step: Step = "waiting"
    version: int = 0
    taken: int = 0
    pending: Ranges = ()
    round: Ranges = ()
    eval_batches: Ranges = ()
    train_models: tuple[ModelRef, ...] = ()
    eval_models: tuple[ModelRef, ...] = ()
    dataset: DatasetInfo | None = None
    shrunk: bool = False
    next_check_ms: int | None = None
    last_error: str | None = None
    #: when the job entered its (phase, step), ms; 0: unknown (a state from before this field)
    phase_since_ms: int = 0
    #: rounds failed in a row (reset by a completed deploy); each waits longer to retry
    consecutive_failures: int = 0
    #: no round starts before this time after a failure (None: no failure waiting)
    retry_at_ms: int | None = None
    #: the round under way, as its history record will say (None between rounds)
    current: RoundRecord | None = None
    #: the round's train samples once trained, until its deploy decision: a model the
    #: deploy gate holds back gives them back to the pending set
    trained: Ranges = ()
    #: how many pending samples (at the front) came back from a held-back round: the next
    #: round trains on them too, but only samples that arrived since count for its trigger
    returned: int = 0
    #: the model the deploy file holds, as this controller last copied it there
    deployed: Deployment | None = None
    #: the models it held before, newest last: what a rollback can restore
    deployments: tuple[Deployment, ...] = ()
    #: the rollback whose copy is in flight: the deployment it restores
    rollback: Deployment | None = None
    #: the latest eval's metrics, for the new model and the deployed one
    scores: Scores | None = None
    #: what Sedna's GM shows of the job (None: the job came over MQTT: event-driven flow)
    gm: GmView | None = None
    #: how many reported conditions the GM's copy holds once the GM has taken in every status
    #: the job sent it: only such a copy shows what the GM did after them (0 once a copy did)
    gm_reported: int = 0
    #: when the job last sent the GM a status (ms)
    gm_sent_ms: int = 0
    #: the last ready sent to the GM, until a newer copy shows the GM took it in
    gm_sent: GmSent | None = None
    #: a rollback whose copy is done and whose deploy `ready` waits for the GM to show
    #: `Train/Waiting` (between rounds)
    gm_rollback: RollbackResult | None = None
    #: an incremental-learning job's Models, as its latest rounds found them
    models: JobModels | None = None
    #: (round, phase, since ms): since when the GM has shown that round's running stage
    #: over (its pod ended) with no model of it reported (None: it has not)
    gm_unreported: tuple[int, str, int] | None = None


class DatasetState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="dataset"):
    namespace: str
    name: str
    url: str
    format: str
    digest: str
    num_samples: int = -1
    cursor: bytes = b""
    polling: bool = False
    #: why the source cannot be read now (missing, permission, S3 403/404); None: it can
    unreadable: str | None = None


class ResourceState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="resource"):
    """A resource the controller stores and runs nothing of: a Model (`model` says what it
    holds), a joint-inference service or a federated-learning job, whose workers' reports
    are forwarded upstream. `kind` is its resource key's kind; `reports` counts the reports
    forwarded, `last_report` is the latest one's `kind/status`, at `last_report_ms`."""

    kind: str
    namespace: str
    name: str
    digest: str
    model: ModelInfo | None = None
    reports: int = 0
    last_report: str = ""
    last_report_ms: int = 0


State = JobState | DatasetState | ResourceState


class Codec(Generic[T]):
    """Values of one type as msgpack bytes and back (a union of tagged structs decodes to
    the member its tag names)."""

    def __init__(self, type_: Any) -> None:
        self.encode: Callable[[T], bytes] = msgspec.msgpack.encode
        self.decode: Callable[[bytes], T] = msgspec.msgpack.Decoder(type_).decode


_states: Codec[State] = Codec(State)
encode_state = _states.encode


Older = TypeVar("Older")


def decode_or_older(
    data: bytes, decode: Callable[[bytes], T], older: Callable[[bytes], Older]
) -> T | Older:
    """`decode(data)`, or, where that fails, `older(data)`: the layout written before a
    change (an upgrade meets it in what was stored or queued); neither: `decode`'s error."""
    try:
        return decode(data)
    except msgspec.ValidationError as error:
        try:
            return older(data)
        except msgspec.ValidationError:
            raise error from None


def decode_state(data: bytes) -> State:
    """A stored state. A job's stored before its spec was the wire's own (`SpecBefore`) is
    read in that form and given the spec it stands for."""
    state = decode_or_older(data, _states.decode, _job_before)
    return with_spec_now(JobState, state) if isinstance(state, _JobBefore) else state


class HoldsSpecBefore(Protocol):
    """A struct of an older layout whose `spec` is a `SpecBefore`."""

    @property
    def spec(self) -> "SpecBefore": ...


Upgraded = TypeVar("Upgraded", bound=msgspec.Struct)


def with_spec_now(kind: type[Upgraded], before: HoldsSpecBefore) -> Upgraded:
    """`before`, read in an older layout, as a `kind`: its fields, its spec the one it
    stands for."""
    fields = {name: getattr(before, name) for name in kind.__struct_fields__}
    return kind(**{**fields, "spec": before.spec.now()})


class _TriggerBefore(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A trigger as job states stored it before: its timer in minutes of the day."""

    check_period_s: int = 60
    window: tuple[int, int] | None = None
    operator: str = ""
    threshold: float = 0.0
    metric: str = ""

    def now(self) -> Trigger:
        timer = None
        if self.window is not None:
            start, end = (f"{m // 60:02d}:{m % 60:02d}" for m in self.window)
            timer = Timer(start=start, end=end)
        return Trigger(
            check_period_seconds=self.check_period_s, timer=timer, condition=_condition(self)
        )


class _GateBefore(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    operator: str
    threshold: float
    metric: str


class SpecBefore(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A job's spec as job states (and job inserts in the ingress streams) held it before it
    was the wire's `JobSpec`; `now()` is the spec it stands for."""

    dataset: str
    train_prob: float
    trigger: _TriggerBefore = _TriggerBefore()
    output_dir: str
    gate: _GateBefore | None = None

    def now(self) -> JobSpec:
        return JobSpec(
            dataset=self.dataset, train_prob=self.train_prob, trigger=self.trigger.now(),
            output_dir=self.output_dir, gate=_condition(self.gate),
        )  # fmt: skip


def _condition(rule: _TriggerBefore | _GateBefore | None) -> Condition | None:
    if rule is None or not rule.operator:
        return None
    return Condition(operator=rule.operator, threshold=rule.threshold, metric=rule.metric)  # type: ignore[arg-type]


class _JobBefore(JobState, frozen=True, kw_only=True, tag="job"):
    spec: SpecBefore  # type: ignore[assignment]


_job_before = msgspec.msgpack.Decoder(_JobBefore).decode
