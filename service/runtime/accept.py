"""From wire bytes to core events: decode, validate, convert, route.

Everything that arrives (the MQTT downstream and worker topics, the HTTP worker endpoint)
passes through `accept_downstream` or `accept_report`, which return an `Accepted` ready to
append to the target shard's ingress stream or raise `InvalidMessage` with the reason. A
worker report goes to its owner by `ownerKind`: a lifelong-learning job's to the job, a
joint-inference service's or federated-learning job's to the stored resource it forwards
through; an incremental-learning job's is refused (that kind is not managed yet). An
`Accepted` keeps the first bytes of the original payload so a later rejection (a report for
an unknown job, say) can still show what was refused.
"""

from __future__ import annotations

import hashlib
from types import MappingProxyType
from typing import Literal

import msgspec

from service import wire
from service.core.conditions import view_of
from service.core.events import (
    DatasetApplied,
    DatasetDeleted,
    DatasetPolled,
    Event,
    JobApplied,
    JobDeleted,
    OwnerReported,
    ResourceApplied,
    ResourceDeleted,
    RollbackRequested,
    Tick,
    WorkerReported,
)
from service.core.paths import DataRoots
from service.core.state import GmView, ModelInfo
from service.errors import InvalidMessage
from service.keys import STORED_KINDS, dataset_key, job_key, rkey
from service.runtime.gm import GM_TOPIC
from service.wire.workers import STATUS_REQUIRED


class Accepted(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One accepted event as it sits in a shard's ingress stream."""

    event: Event
    topic: str = ""
    head: bytes = b""  # the first 4 KiB of the original payload
    received_ms: int = 0
    resource: bytes | None = None  # canonical resource JSON of an insert (stored beside state)


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Accepted)


def encode_accepted(accepted: Accepted) -> bytes:
    return _encoder.encode(accepted)


def decode_accepted(data: bytes) -> Accepted:
    return _decoder.decode(data)


def target_of(event: Event) -> str:
    """The resource key an event applies to (and so its shard)."""
    if isinstance(event, DatasetApplied | DatasetDeleted | DatasetPolled) or (
        isinstance(event, Tick) and event.kind == "dataset"
    ):
        return dataset_key(event.namespace, event.name)
    if isinstance(event, ResourceApplied | ResourceDeleted | OwnerReported):
        return rkey(event.kind, event.namespace, event.name)
    return job_key(event.namespace, event.name)


def accept_downstream(
    topic: str, payload: bytes, received_ms: int, *, data_roots: DataRoots | None = None
) -> Accepted:
    """A downstream envelope (insert or delete of a dataset or job, a job's rollback) as an
    event.

    With ``data_roots``, a dataset url or job outputDir outside them (or in a system
    directory) is refused too.
    """
    downstream = wire.decode_envelope(payload)
    if data_roots is not None:
        check_paths(downstream, data_roots)
    event, resource = downstream_event(downstream, from_gm=topic == GM_TOPIC)
    head = payload[: wire.REJECTION_PAYLOAD_BYTES]
    return Accepted(event=event, topic=topic, head=head, received_ms=received_ms, resource=resource)


def accept_report(
    topic: str,
    worker: str,
    payload: bytes,
    received_ms: int,
    *,
    channel: Literal["mqtt", "http"] = "mqtt",
    namespace: str | None = None,
) -> Accepted:
    """A worker report sent under `worker` (its topic level or HTTP path) and, on a
    namespaced topic, under `namespace` (which the broker's ACL grants that namespace's
    workers only), as an event for its owner's kind."""
    report = report_event(wire.decode_worker_message(payload), channel)
    if report.worker != worker:
        raise InvalidMessage(
            f"worker name {report.worker!r} does not match {worker!r} in the topic or path",
            "$.name",
            code="name_mismatch",
        )
    if namespace is not None and report.namespace != namespace:
        raise InvalidMessage(
            f"namespace {report.namespace!r} does not match {namespace!r} in the topic: "
            "a namespace's workers report for that namespace's jobs only",
            "$.namespace",
            code="name_mismatch",
        )
    head = payload[: wire.REJECTION_PAYLOAD_BYTES]
    return Accepted(event=report, topic=topic, head=head, received_ms=received_ms)


def worker_topic_levels(topic: str) -> tuple[str | None, str] | None:
    """The `{namespace}` and `{worker}` levels of
    `{prefix}/{node}/workers/{namespace}/{worker}/info`, or (None, worker) of the topic
    without a namespace level, `{prefix}/{node}/workers/{worker}/info`."""
    parts = topic.split("/")
    if len(parts) == 5 and parts[2] == "workers" and parts[4] == "info":
        return None, parts[3]
    if len(parts) == 6 and parts[2] == "workers" and parts[5] == "info":
        return parts[3], parts[4]
    return None


def digest(resource: wire.Resource) -> str:
    """What makes a re-sent resource "identical": its spec and its credential.

    Sedna's GM re-sends every resource on each resync, with fresh status and
    resourceVersion; those must not count as a change.
    """
    annotations = resource.metadata.annotations
    blob = wire.canonical(resource.spec)
    for name in (wire.CREDENTIAL_ANNOTATION, wire.DEPLOY_TRIGGER_ANNOTATION):
        blob += b"\0" + annotations.get(name, "").encode("utf-8", "replace")
    return hashlib.sha256(blob).hexdigest()[:32]


def check_paths(message: wire.Downstream, data_roots: DataRoots) -> None:
    """Refuse a dataset url or outputDir where the controller may not read or write."""
    match message:
        case wire.DatasetInsert(dataset=dataset):
            field, url = "$.spec.url", dataset.spec.url
        case wire.JobInsert(job=job):
            field, url = "$.spec.outputDir", job.spec.output_dir
        case _:
            return
    problem = data_roots.problem(url)
    if problem is not None:
        raise InvalidMessage(problem, field, code="path_refused")


def downstream_event(
    message: wire.Downstream, *, from_gm: bool = False
) -> tuple[Event, bytes | None]:
    """The event a downstream message makes; `from_gm`: it came over Sedna's GM link, and a
    job's conditions then drive it."""
    match message:
        case wire.DatasetInsert(dataset=dataset, raw=raw):
            event: Event = DatasetApplied(
                namespace=dataset.metadata.namespace,
                name=dataset.metadata.name,
                url=dataset.spec.url,
                format=dataset.spec.normalized_format,
                digest=digest(dataset),
            )
            wire.credential_of(dataset.metadata)  # validated now, not at first use
            return event, raw
        case wire.JobInsert(job=job, raw=raw):
            wire.credential_of(job.metadata)
            applied = JobApplied(
                namespace=job.metadata.namespace,
                name=job.metadata.name,
                spec=wire.job_spec(job),
                digest=digest(job),
                gm=gm_view(job) if from_gm else None,
            )
            return applied, raw
        case wire.DatasetDelete(namespace=namespace, name=name):
            return DatasetDeleted(namespace=namespace, name=name), None
        case wire.JobDelete(namespace=namespace, name=name):
            return JobDeleted(namespace=namespace, name=name), None
        case wire.JobRollback(namespace=namespace, name=name, version=version):
            return RollbackRequested(namespace=namespace, name=name, version=version), None
        case wire.ResourceInsert(resource=resource, raw=raw):
            wire.credential_of(resource.metadata)
            model = resource if isinstance(resource, wire.ModelResource) else None
            stored = ResourceApplied(
                kind=STORED_KINDS[resource.kind.lower()],
                namespace=resource.metadata.namespace,
                name=resource.metadata.name,
                digest=digest(resource),
                model=None if model is None else model_info(model),
            )
            return stored, raw
        case wire.ResourceDelete(kind=kind, namespace=namespace, name=name):
            return ResourceDeleted(kind=STORED_KINDS[kind], namespace=namespace, name=name), None
    raise InvalidMessage("unsupported downstream message")  # pragma: no cover - exhaustive


def model_info(model: wire.ModelResource) -> ModelInfo:
    """What a Model holds, as its state keeps it (the credential only as "named")."""
    return ModelInfo(
        url=model.spec.url,
        format=model.spec.format,
        devices=tuple(model.spec.devices),
        credential=wire.CREDENTIAL_ANNOTATION in model.metadata.annotations,
    )


def gm_view(job: wire.LifelongLearningJob) -> GmView:
    """What the GM's copy of a job shows (its status conditions)."""
    return view_of(job.status.conditions if job.status is not None else [])


#: Why a report of an owner kind this controller does not manage yet is refused.
NOT_MANAGED = MappingProxyType(
    {
        "incrementallearningjob": "incremental-learning jobs are not yet managed by this "
        "controller (keep Sedna's local controller on nodes that run them)"
    }
)


def report_event(
    report: wire.WorkerMessage, channel: Literal["mqtt", "http"] = "mqtt"
) -> WorkerReported | OwnerReported:
    """The event of a worker report, for its owner's kind (`ownerKind`)."""
    kind = report.owner_kind
    if kind in NOT_MANAGED:
        raise InvalidMessage(NOT_MANAGED[kind], "$.ownerKind")
    if kind not in STORED_KINDS:
        return worker_event(report, channel)
    return OwnerReported(
        kind=STORED_KINDS[kind],
        namespace=report.namespace,
        name=report.owner_name,
        worker=report.name,
        phase=report.kind,
        status=report.status or "",
        results=tuple(report.results),
        owner_info=b"{}" if report.owner_info is None else bytes(report.owner_info),
        channel=channel,
    )


def worker_event(
    report: wire.WorkerMessage, channel: Literal["mqtt", "http"] = "mqtt"
) -> WorkerReported:
    """The event of a lifelong-learning job's worker report."""
    if report.status is None:
        raise InvalidMessage(STATUS_REQUIRED, "$.status")
    owner_info = b"{}" if report.owner_info is None else bytes(report.owner_info)
    return WorkerReported(
        namespace=report.namespace,
        name=report.owner_name,
        worker=report.name,
        kind=report.kind,
        status=report.status,
        results=tuple(report.results),
        owner_info=owner_info,
        channel=channel,
    )
