"""Events the core reacts to: resources applied and deleted, worker reports, timers and the
results of effects (and, for the resources it only stores, their inserts, deletes and the
reports of their workers). Tagged msgspec structs, stored in the ingress streams as msgpack."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from service.core.rounds import ModelDigest
from service.core.state import DatasetInfo, GmView, JobSpec, ModelInfo, RoundPhase
from service.wire import ReportedStatus, WorkerKind, WorkerStatus


class JobApplied(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="job-applied"):
    """A job was inserted. `output_dir_holder` is set by the shell, never the wire: the
    other job that already writes to this outputDir (the insert is then refused). `gm` is
    what the copy shows when Sedna's GM sent it (its conditions): the job is GM-managed."""

    namespace: str
    name: str
    spec: JobSpec
    digest: str
    output_dir_holder: str | None = None
    gm: GmView | None = None


class JobDeleted(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="job-deleted"):
    namespace: str
    name: str


class DatasetApplied(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="dataset-applied"
):
    namespace: str
    name: str
    url: str
    format: str
    digest: str


class DatasetDeleted(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="dataset-deleted"
):
    namespace: str
    name: str


class DatasetPolled(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="dataset-polled"
):
    """A poll's result: the sample count and the reader's opaque cursor, or why it failed:
    `error` for a failure worth retrying (an S3 endpoint down), `unreadable` when the source
    cannot be read until someone acts (missing, permission denied, S3 403/404)."""

    namespace: str
    name: str
    url: str
    num_samples: int = 0
    cursor: bytes = b""
    error: str | None = None
    unreadable: str | None = None


class DatasetChanged(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="dataset-changed"
):
    """Sent to each job of a dataset: its location, and its sample count when known."""

    namespace: str
    name: str
    dataset: str
    info: DatasetInfo
    num_samples: int | None = None


class WorkerReported(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="worker-reported"
):
    """A worker's report as it came; what its results mean is the core's to decide.

    `owner_info` is the report's `ownerInfo` as JSON text, validated at intake and kept so:
    it is forwarded as it came, and only a failure's exit code, reason and stderr are ever
    read out of it again. `channel` says how it came: over the broker, where the ACL ties
    the worker's name to its login, or over HTTP.
    """

    namespace: str
    name: str  # the owning job
    worker: str
    kind: WorkerKind
    status: WorkerStatus
    results: tuple[dict[str, Any], ...] = ()
    owner_info: bytes = b"{}"
    channel: Literal["mqtt", "http"] = "mqtt"


class Tick(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="tick"):
    """A durable timer came due for the resource (trigger check or dataset poll)."""

    kind: Literal["job", "dataset"]
    namespace: str
    name: str
    due_ms: int


class RoundWritten(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="round-written"
):
    namespace: str
    name: str
    phase: RoundPhase
    version: int
    error: str | None = None


class ModelCopied(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="model-copied"
):
    """The deploy copy of round `version` is done (or failed: `error`); `rollback` when it
    was a rollback's copy of that round's model; `digest`: what the copy read."""

    namespace: str
    name: str
    version: int
    error: str | None = None
    rollback: bool = False
    digest: ModelDigest | None = None


class RollbackRequested(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="rollback-requested"
):
    """Put round `version`'s model back in the deploy file (None: the previously deployed)."""

    namespace: str
    name: str
    version: int | None = None


class ResourceApplied(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="resource-applied"
):
    """A Model, joint-inference service or federated-learning job was inserted; `kind` is
    its resource key's kind, `model` what a Model holds."""

    kind: str
    namespace: str
    name: str
    digest: str
    model: ModelInfo | None = None


class ResourceDeleted(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="resource-deleted"
):
    kind: str
    namespace: str
    name: str


class OwnerReported(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="owner-reported"
):
    """A worker of a joint-inference service or a federated-learning job (`kind`, as its
    resource key spells it) reported; it is forwarded upstream as it came. `status` is empty
    when the report gave none; `owner_info` is its `ownerInfo` as JSON text."""

    kind: str
    namespace: str
    name: str  # the owning service or job
    worker: str
    phase: WorkerKind
    status: ReportedStatus
    results: tuple[dict[str, Any], ...] = ()
    owner_info: bytes = b"{}"
    channel: Literal["mqtt", "http"] = "mqtt"


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
