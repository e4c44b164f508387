"""From wire bytes to core events: decode, validate, convert, route.

Everything that arrives (the MQTT downstream and worker topics, the HTTP worker endpoint)
passes through `accept_downstream` or `accept_report`, which return an `Accepted` ready to
append to the target shard's ingress stream or raise `InvalidMessage` with the reason. An
`Accepted` keeps the first bytes of the original payload so a later rejection (a report for
an unknown job, say) can still show what was refused.
"""

from __future__ import annotations

import hashlib
from typing import Literal

import msgspec

from service import messages
from service.core.events import (
    DatasetApplied,
    DatasetDeleted,
    DatasetPolled,
    Event,
    JobApplied,
    JobDeleted,
    RollbackRequested,
    Tick,
    WorkerReported,
)
from service.core.gate import GateSpec
from service.core.paths import DataRoots
from service.core.state import JobSpec
from service.core.triggers import TriggerSpec, parse_hhmm
from service.errors import InvalidMessage
from service.keys import dataset_key, job_key


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
    return job_key(event.namespace, event.name)


def accept_downstream(
    topic: str, payload: bytes, received_ms: int, *, data_roots: DataRoots | None = None
) -> Accepted:
    """A downstream envelope (insert or delete of a dataset or job, a job's rollback) as an
    event.

    With ``data_roots``, a dataset url or job outputDir outside them (or in a system
    directory) is refused too.
    """
    downstream = messages.decode_envelope(payload)
    if data_roots is not None:
        check_paths(downstream, data_roots)
    event, resource = downstream_event(downstream)
    head = payload[: messages.REJECTION_PAYLOAD_BYTES]
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
    workers only), as an event."""
    report = worker_event(messages.decode_worker_message(payload), channel)
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
    head = payload[: messages.REJECTION_PAYLOAD_BYTES]
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


def digest(resource: messages.Dataset | messages.LifelongLearningJob) -> str:
    """What makes a re-sent resource "identical": its spec and its credential.

    Sedna's GM re-sends every resource on each resync, with fresh status and
    resourceVersion; those must not count as a change.
    """
    credential = resource.metadata.annotations.get(messages.CREDENTIAL_ANNOTATION, "")
    blob = messages.canonical(resource.spec) + b"\0" + credential.encode("utf-8", "replace")
    return hashlib.sha256(blob).hexdigest()[:32]


def check_paths(message: messages.Downstream, data_roots: DataRoots) -> None:
    """Refuse a dataset url or outputDir where the controller may not read or write."""
    match message:
        case messages.DatasetInsert(dataset=dataset):
            field, url = "$.spec.url", dataset.spec.url
        case messages.JobInsert(job=job):
            field, url = "$.spec.outputDir", job.spec.output_dir
        case _:
            return
    problem = data_roots.problem(url)
    if problem is not None:
        raise InvalidMessage(problem, field, code="path_refused")


def downstream_event(message: messages.Downstream) -> tuple[Event, bytes | None]:
    match message:
        case messages.DatasetInsert(dataset=dataset, raw=raw):
            event: Event = DatasetApplied(
                namespace=dataset.metadata.namespace,
                name=dataset.metadata.name,
                url=dataset.spec.url,
                format=dataset.spec.normalized_format,
                digest=digest(dataset),
            )
            messages.credential_of(dataset.metadata)  # validated now, not at first use
            return event, raw
        case messages.JobInsert(job=job, raw=raw):
            messages.credential_of(job.metadata)
            applied = JobApplied(
                namespace=job.metadata.namespace,
                name=job.metadata.name,
                spec=job_spec(job),
                digest=digest(job),
            )
            return applied, raw
        case messages.DatasetDelete(namespace=namespace, name=name):
            return DatasetDeleted(namespace=namespace, name=name), None
        case messages.JobDelete(namespace=namespace, name=name):
            return JobDeleted(namespace=namespace, name=name), None
        case messages.JobRollback(namespace=namespace, name=name, version=version):
            return RollbackRequested(namespace=namespace, name=name, version=version), None
    raise InvalidMessage("unsupported downstream message")  # pragma: no cover - exhaustive


def job_spec(job: messages.LifelongLearningJob) -> JobSpec:
    """The part of a LifelongLearningJob the lifecycle reads."""
    spec = job.spec
    trigger = spec.train_spec.trigger
    window = None
    if trigger.timer is not None:
        window = (parse_hhmm(trigger.timer.start), parse_hhmm(trigger.timer.end))
    condition = trigger.condition
    operator, threshold, metric = "", 0.0, ""
    if condition is not None and condition.operator:
        operator, metric = condition.operator, condition.metric
        threshold = condition.threshold_value or 0.0
    return JobSpec(
        dataset=spec.dataset.name,
        train_prob=spec.dataset.train_prob,
        trigger=TriggerSpec(
            check_period_s=trigger.check_period_seconds,
            window=window,
            operator=operator,
            threshold=threshold,
            metric=metric,
        ),
        output_dir=spec.output_dir,
        gate=gate_spec(spec.deploy_spec),
    )


def gate_spec(deploy: messages.DeploySpec) -> GateSpec | None:
    """The deploy gate a job's `deploySpec.trigger.condition` sets (None: no condition, or
    an empty operator, as Sedna sends an unset one)."""
    condition = deploy.trigger.condition if deploy.trigger is not None else None
    if condition is None or not condition.operator:
        return None
    return GateSpec(
        operator=condition.operator,
        threshold=condition.threshold_value or 0.0,
        metric=condition.metric,
    )


def worker_event(
    report: messages.WorkerMessage, channel: Literal["mqtt", "http"] = "mqtt"
) -> WorkerReported:
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
