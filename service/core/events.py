"""Events the core reacts to: resources applied and deleted, worker reports, timers and the
results of effects (and, for the resources it only stores, their inserts, deletes and the
reports of their workers). Tagged msgspec structs, stored in the ingress streams as msgpack."""


from typing import Any, Literal

import msgspec

from service.core.rounds import ModelDigest
from service.core.state import DatasetInfo, GmView, JobModels, ModelInfo, RoundPhase
from service.wire import JobKind, JobSpec, ReportedStatus, WorkerKind, WorkerStatus


class _Event(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What every event carries: the namespace and name of the resource it is for (a
    worker's report: of the job or service that owns the worker)."""

    namespace: str
    name: str


class _Report(_Event, frozen=True, kw_only=True):
    """What every worker report carries: the worker's name, its results, its `ownerInfo`
    as JSON text, and how it came."""

    worker: str
    results: tuple[dict[str, Any], ...] = ()
    owner_info: bytes = b"{}"
    channel: Literal["mqtt", "http"] = "mqtt"


class JobApplied(_Event, frozen=True, kw_only=True, tag="job-applied"):
    """A job was inserted. `output_dir_holder` is set by the shell, never the wire: the
    other job that already writes to this outputDir (the insert is then refused). `gm` is
    what the copy shows when Sedna's GM sent it (its conditions): the job is GM-managed."""

    spec: JobSpec
    digest: str
    output_dir_holder: str | None = None
    gm: GmView | None = None


class JobDeleted(_Event, frozen=True, kw_only=True, tag="job-deleted"):
    """A job was deleted."""


class DatasetApplied(_Event, frozen=True, kw_only=True, tag="dataset-applied"):
    """A dataset was inserted: where its samples are, and how they are laid out."""

    url: str
    format: str
    digest: str


class DatasetDeleted(_Event, frozen=True, kw_only=True, tag="dataset-deleted"):
    """A dataset was deleted: its jobs pause."""


class DatasetPolled(_Event, frozen=True, kw_only=True, tag="dataset-polled"):
    """A poll's result: the sample count and the reader's opaque cursor, or why it failed:
    `error` for a failure worth retrying (an S3 endpoint down), `unreadable` when the source
    cannot be read until someone acts (missing, permission denied, S3 403/404)."""

    url: str
    num_samples: int = 0
    cursor: bytes = b""
    error: str | None = None
    unreadable: str | None = None


class DatasetChanged(_Event, frozen=True, kw_only=True, tag="dataset-changed"):
    """Sent to each job of a dataset: its location, and its sample count when known."""

    dataset: str
    info: DatasetInfo
    num_samples: int | None = None


class WorkerReported(_Report, frozen=True, kw_only=True, tag="worker-reported"):
    """A worker's report as it came; what its results mean is the core's to decide.

    `owner_info` is the report's `ownerInfo` as JSON text, validated at intake and kept so:
    it is forwarded as it came, and only a failure's exit code, reason and stderr are ever
    read out of it again. `channel` says how it came: over the broker, where the ACL ties
    the worker's name to its login, or over HTTP.
    """

    kind: WorkerKind
    status: WorkerStatus
    #: the kind of job the report says it is for (its `ownerKind`)
    owner: JobKind = "lifelonglearningjob"


class Tick(_Event, frozen=True, kw_only=True, tag="tick"):
    """A durable timer came due for the resource (trigger check or dataset poll)."""

    kind: Literal["job", "dataset"]
    due_ms: int


class RoundWritten(_Event, frozen=True, kw_only=True, tag="round-written"):
    """The round `version`'s `phase` data is written (or failed: `error`); an
    incremental-learning job's round also brings the Models it needs, as they are now
    (`models`: the initial model for a train round, the compared and deploy models for an
    eval round)."""

    phase: RoundPhase
    version: int
    error: str | None = None
    models: JobModels | None = None


class ModelCopied(_Event, frozen=True, kw_only=True, tag="model-copied"):
    """The deploy copy of round `version` is done (or failed: `error`); `rollback` when it
    was a rollback's copy of that round's model; `digest`: what the copy read."""

    version: int
    error: str | None = None
    rollback: bool = False
    digest: ModelDigest | None = None


class RollbackRequested(_Event, frozen=True, kw_only=True, tag="rollback-requested"):
    """Put round `version`'s model back in the deploy file (None: the previously deployed)."""

    version: int | None = None


class ResourceApplied(_Event, frozen=True, kw_only=True, tag="resource-applied"):
    """A Model, joint-inference service or federated-learning job was inserted; `kind` is
    its resource key's kind, `model` what a Model holds."""

    kind: str
    digest: str
    model: ModelInfo | None = None


class ResourceDeleted(_Event, frozen=True, kw_only=True, tag="resource-deleted"):
    """A stored resource of `kind` was deleted."""

    kind: str


class OwnerReported(_Report, frozen=True, kw_only=True, tag="owner-reported"):
    """A worker of a joint-inference service or a federated-learning job (`kind`, as its
    resource key spells it) reported; it is forwarded upstream as it came. `status` is empty
    when the report gave none; `owner_info` is its `ownerInfo` as JSON text."""

    kind: str
    phase: WorkerKind
    status: ReportedStatus


#: The events of the resources the controller only stores.
StoredEvent = ResourceApplied | ResourceDeleted | OwnerReported
#: A dataset's own events (a dataset's timer is a `Tick` of kind "dataset").
DatasetEvent = DatasetApplied | DatasetDeleted | DatasetPolled

Event = (
    JobApplied
    | JobDeleted
    | DatasetApplied
    | DatasetDeleted
    | DatasetPolled
    | DatasetChanged
    | WorkerReported
    | Tick
    | RoundWritten
    | ModelCopied
    | RollbackRequested
    | ResourceApplied
    | ResourceDeleted
    | OwnerReported
)
