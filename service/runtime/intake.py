"""The intake: every message that arrives (MQTT downstream and worker topics, GM frames, the
HTTP worker endpoint) checked, converted to its core event and made durable in its shard's
ingress stream before anyone is told "got it".

While this replica holds the ingress lease it subscribes to the node's MQTT topics (and
holds the link to Sedna's GM, when one is configured), and every message it receives is
decoded, validated and appended to its shard's ingress stream before the broker is told
"got it". Bad messages become rejections and are acknowledged. The stages, in this
module's order:

- The GM link's holder (`GmBridge`): frames the GM sends go into the intake's queue as
  downstream messages (topic `GM_TOPIC`): decoded, validated, made durable and rejected with
  a reason like any MQTT downstream message. The link hands on only so many frames the
  intake has not finished with (`GmInbound.taken`), then stops reading: a flooding GM is
  slowed down, not buffered. What goes out to the GM is the outbox's (`outbox.GmSink`).
- Acceptance, from wire bytes to core events: decode, validate, convert, route. Everything
  that arrives passes through `accept_downstream` or `accept_report`, which return an
  `Accepted` ready to append to the target shard's ingress stream or raise `InvalidMessage`
  with the reason. A worker report goes to its owner by `ownerKind`: a lifelong- or
  incremental-learning job's to the job (which refuses one naming the other kind), a
  joint-inference service's or federated-learning job's to the stored resource it forwards
  through. An `Accepted` keeps the first bytes of the original payload so a later
  rejection (a report for an unknown job, say) can still show what was refused.
- Unknown spec fields (`UnknownFields`), logged once per resource version. The service
  takes resources with unknown fields (a newer Sedna GM may add some), but a misspelt
  optional field would silently fall back to its default; `lifelong validate` and `apply`
  refuse them, and the service says so in its log, once for each version of a resource (a
  GM resync re-sends every resource without a new line each time).
- Admission (`Admission`): what the intake admits beyond a message's own validity: a
  dataset only for this controller's node, and no more resources, or larger ones, than the
  node keeps. A dataset whose ``spec.nodeName`` is another node is refused (``wrong_node``):
  its source lies on that node, and the controller of that node watches it. Jobs are not
  placed this way: a job is bound on every node its workers run on. A resource whose JSON
  exceeds ``max_resource_bytes`` is refused (``too_large``). An insert of a new resource is
  refused (``too_many``) once the node keeps ``max_resources`` resources, or
  ``max_namespace_resources`` of its namespace; an update of a kept one is never refused by
  these counts. The counts are those of the resources stored (the shards' indexes, read
  again at most every `REFRESH_S` while inserts arrive) plus the inserts this intake
  admitted that are not stored yet, each counted until it is stored, deleted, or
  `PENDING_S` passed (an insert the lifecycle then refused stops counting then). A stored
  resource counts until its delete is applied.
- The worker endpoint (`WorkerEndpoint`), ``POST /sedna/workers/{worker}/info``: Sedna's
  worker library reports here, for every job kind it reports for (lifelong learning, joint
  inference, federated learning; dispatched by `ownerKind`); treated exactly like the MQTT
  worker topic, but answered at once (200, or 400 with the reason).
- The MQTT intake itself (`Intake`): batches of messages, admitted, appended in one round
  trip, then acknowledged. A batch's first deliveries for shards this replica holds are
  handed to its processor instead (`service.runtime.handoff`), unless it waits in its Redis
  read: the commit that applies them makes them durable, and they are acknowledged after it.
"""


import hashlib
import logging
import queue
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec

from service import failpoints, wire
from service.adapters.gm_frames import GmFrame, GmRejected
from service.adapters.gm_link import GmLink, GmLinkSettings, LinkState, parse_gm_address
from service.adapters.mqtt import Inbound, MqttClient, MqttSettings
from service.adapters.redis_store import Ingress, Leases, Outboxes, States
from service.config import Config
from service.core import passthrough, reports
from service.core.conditions import view_of
from service.core.effects import Reject
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
from service.core.state import (
    GmView,
    ModelInfo,
    SpecBefore,
    decode_or_older,
    decode_state,
    with_spec_now,
)
from service.errors import InvalidMessage, StoreUnavailable
from service.heartbeat import Clock, Heartbeats, progress
from service.keys import NUM_SHARDS, STORED_KINDS, dataset_key, job_key, rkey, shard_of
from service.metrics import Metrics
from service.runtime.handoff import Handoff, TakenMessage
from service.runtime.leases import LeaseKeeper
from service.runtime.outbox import GmSink
from service.runtime.rejections import Rejections
from service.wire import unknown_spec_fields
from service.wire.workers import STATUS_REQUIRED

log = logging.getLogger(__name__)

#: The topic GM frames are taken in under (rejections show it as their topic).
GM_TOPIC = "gm"
STORE_RETRY_S = 0.5


@dataclass(frozen=True)
class GmInbound(Inbound):
    """A GM frame in the intake's queue; the intake calls ``taken`` once it holds the frame
    no more, which frees its place in the link's bounded hand-off."""

    taken: Callable[[], None] = lambda: None


def frames_taken(batch: Iterable[Inbound]) -> None:
    """Free the hand-off places of the GM frames of an intake batch that is done with."""
    for msg in batch:
        if isinstance(msg, GmInbound):
            msg.taken()


class GmLinkRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the link's holder says of the link in Redis, for `describe` and `get`."""

    replica: str
    address: str
    link: LinkState


class GmBridge:
    """One holding of the link: built when the ingress lease is taken, stopped for good when
    it is lost (a second live connection would split the GM's messages between replicas).
    Frames in go to the intake's queue; upstream messages go out through the outbox's
    `GmSink`, on this holding's ``gm-outbox`` thread, which also records the link's state
    in Redis (`GmLinkRecord`)."""

    def __init__(
        self,
        *,
        address: str,
        node: str,
        replica: str,
        outboxes: Outboxes,
        leases: Leases,
        inbound: queue.SimpleQueue[Inbound],
        rejections: Rejections,
        metrics: Metrics,
        clock: Clock,
        report_ttl_ms: int,
        heartbeats: Heartbeats,
        settings: GmLinkSettings | None = None,
    ) -> None:
        self._replica = replica
        self._leases = leases
        self._inbound = inbound
        self._rejections = rejections
        self._report_ttl_ms = report_ttl_ms
        self._stop = threading.Event()
        self._link = GmLink(
            parse_gm_address(address), node, self._on_frame,
            on_reject=self._on_reject, observer=metrics.gm, settings=settings,
            heartbeats=heartbeats,
        )  # fmt: skip
        sink = GmSink(
            link=self._link, outboxes=outboxes, rejections=rejections, clock=clock,
            heartbeats=heartbeats, report=self._report,
        )  # fmt: skip
        self._thread = threading.Thread(
            target=sink.run, args=(self._stop,), name="gm-outbox", daemon=True
        )

    @property
    def status(self) -> str:
        return self._link.state.status

    def start(self) -> None:
        self._link.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._link.stop()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    # ------------------------------------------------------------ frames in
    def _on_frame(self, frame: GmFrame) -> None:
        """On the link's thread: hand the frame to the intake, nothing more."""
        self._inbound.put(
            GmInbound(
                topic=GM_TOPIC, payload=frame.data, qos=0, dup=False, mid=0,
                received_at=frame.received_at, taken=frame.taken,
            )
        )  # fmt: skip

    def _on_reject(self, rejected: GmRejected) -> None:
        now_ms = int(rejected.received_at * 1000)
        self._rejections.refuse(GM_TOPIC, "too_large", rejected.reason, b"", now_ms)

    def _report(self) -> None:
        record = GmLinkRecord(
            replica=self._replica, address=self._link.endpoint.shown, link=self._link.state
        )
        self._leases.put_gm_link(msgspec.json.encode(record), self._report_ttl_ms)


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
    """An accepted event from a shard's ingress stream. A job insert an older replica took in,
    before a job's spec was the wire's own, is read in that form and given the spec it stands
    for, so an upgrade loses none waiting in the streams."""
    before = decode_or_older(data, _decoder.decode, _decode_before)
    if not isinstance(before, _AcceptedBefore):
        return before
    accepted = {name: getattr(before, name) for name in Accepted.__struct_fields__}
    return Accepted(**{**accepted, "event": with_spec_now(JobApplied, before.event)})


class _JobAppliedBefore(JobApplied, frozen=True, kw_only=True, tag="job-applied"):
    spec: SpecBefore  # type: ignore[assignment]


class _AcceptedBefore(Accepted, frozen=True, kw_only=True, omit_defaults=True):
    event: _JobAppliedBefore


_decode_before = msgspec.msgpack.Decoder(_AcceptedBefore).decode


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
    """Refuse a dataset url, an outputDir or a hot-update config file where the controller
    may not read or write."""
    match message:
        case wire.DatasetInsert(dataset=dataset):
            places = [("$.spec.url", dataset.spec.url)]
        case wire.JobInsert(job=job):
            places = [("$.spec.outputDir", job.spec.output_dir)]
            config = wire.hot_update_config(job)
            if config is not None:
                places.append((f"$.metadata.annotations[{wire.HOT_UPDATE_ANNOTATION!r}]", config))
        case _:
            return
    for field, url in places:
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


def gm_view(job: wire.LearningJob) -> GmView:
    """What the GM's copy of a job shows (its status conditions)."""
    return view_of(job.status.conditions if job.status is not None else [])


def report_event(
    report: wire.WorkerMessage, channel: Literal["mqtt", "http"] = "mqtt"
) -> WorkerReported | OwnerReported:
    """The event of a worker report, for its owner's kind (`ownerKind`)."""
    kind = report.owner_kind
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
    """The event of a lifelong- or incremental-learning job's worker report."""
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
        owner=(
            "incrementallearningjob"
            if report.owner_kind == "incrementallearningjob"
            else "lifelonglearningjob"
        ),
    )


#: resource versions remembered as already told; the oldest are forgotten first
REMEMBERED = 10_000


class UnknownFields:
    """Used by the intake thread only."""

    def __init__(self, remembered: int = REMEMBERED) -> None:
        self._told: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._remembered = remembered

    def check(self, accepted: Accepted) -> None:
        event = accepted.event
        stored = JobApplied | DatasetApplied | ResourceApplied
        if not isinstance(event, stored) or accepted.resource is None:
            return
        version = (target_of(event), event.digest)
        if version in self._told:
            self._told.move_to_end(version)
            return
        self._told[version] = None
        if len(self._told) > self._remembered:
            self._told.popitem(last=False)
        unknown = unknown_spec_fields(msgspec.json.decode(accepted.resource))
        if unknown:
            log.warning(
                "%s %s/%s has fields this controller does not know (ignored): %s",
                type(event).__name__.removesuffix("Applied").lower(),
                event.namespace,
                event.name,
                "; ".join(f"{field.path}: {field.reason}" for field in unknown),
                extra={"outcome": "applied"},
            )


REFRESH_S = 1.0
PENDING_S = 60.0


class _Spec(msgspec.Struct, frozen=True, rename="camel"):
    node_name: str = ""


class _Placed(msgspec.Struct, frozen=True):
    spec: _Spec = _Spec()


_placed_decoder = msgspec.json.Decoder(_Placed)


class Admission:
    """Checks each accepted message before it is made durable (`check`); used by the intake
    only, on its one thread."""

    def __init__(self, *, config: Config, index: States, clock: Clock) -> None:
        self._node = config.node_name
        self._max = config.max_resources
        self._max_per_namespace = config.max_namespace_resources
        self._max_bytes = config.max_resource_bytes
        self._index = index
        self._clock = clock
        self._read_at = -REFRESH_S
        self._stored: set[str] = set()
        self._pending: dict[str, float] = {}  # admitted, not stored yet -> when admitted
        self._namespaces: Counter[str] = Counter()

    def check(self, accepted: Accepted) -> None:
        """Raise `InvalidMessage` with the reason when ``accepted`` may not go in; otherwise
        count it if it inserts a new resource."""
        resource = accepted.resource
        if isinstance(accepted.event, DatasetDeleted | JobDeleted):
            self._forget(target_of(accepted.event))
        if resource is None:
            return  # a delete, a rollback, a report: nothing is kept for it
        if isinstance(accepted.event, DatasetApplied):
            self._check_node(resource)
        if len(resource) > self._max_bytes:
            raise InvalidMessage(
                f"the resource holds {len(resource)} bytes, more than the "
                f"{self._max_bytes} a node keeps of one (LIFELONG_MAX_RESOURCE_BYTES)",
                code="too_large",
            )
        self._count(target_of(accepted.event))

    def _check_node(self, resource: bytes) -> None:
        node = _placed_decoder.decode(resource).spec.node_name
        if node != self._node:
            raise InvalidMessage(
                f"the dataset is for node {node!r}; this controller serves {self._node!r}",
                "$.spec.nodeName",
                code="wrong_node",
            )

    def _count(self, rkey: str) -> None:
        now_s = self._clock.monotonic_s()
        if now_s - self._read_at >= REFRESH_S:
            self._refresh(now_s)
        if rkey in self._stored or rkey in self._pending:
            return  # an update
        namespace = _namespace_of(rkey)
        total = len(self._stored) + len(self._pending)
        if total >= self._max:
            raise InvalidMessage(
                f"the node keeps {total} resources, the most it may "
                f"(LIFELONG_MAX_RESOURCES={self._max}); delete one first",
                code="too_many",
            )
        if self._namespaces[namespace] >= self._max_per_namespace:
            raise InvalidMessage(
                f"the node keeps {self._namespaces[namespace]} resources of namespace "
                f"{namespace!r}, the most it may (LIFELONG_MAX_NAMESPACE_RESOURCES="
                f"{self._max_per_namespace}); delete one first",
                code="too_many",
            )
        self._pending[rkey] = now_s
        self._namespaces[namespace] += 1

    def _forget(self, rkey: str) -> None:
        """A delete: an insert of ``rkey`` admitted but not stored yet counts no more (a
        stored one counts until the delete is applied)."""
        if self._pending.pop(rkey, None) is not None:
            self._namespaces[_namespace_of(rkey)] -= 1

    def _refresh(self, now_s: float) -> None:
        """Read the stored resources again; forget the pending ones now stored or too old.
        While Redis cannot be read the last counts stand (the batch still goes in; storing it
        waits for Redis anyway)."""
        try:
            self._stored = set(self._index.list_rkeys(None, range(NUM_SHARDS)))
        except StoreUnavailable as e:
            log.warning("resource counts not refreshed, the last ones stand: %s", e)
            return
        self._read_at = now_s
        self._pending = {
            rkey: at_s
            for rkey, at_s in self._pending.items()
            if rkey not in self._stored and now_s - at_s < PENDING_S
        }
        self._namespaces = Counter(map(_namespace_of, (*self._stored, *self._pending)))


def _namespace_of(rkey: str) -> str:
    """The namespace of a resource key, ``<kind>:<namespace>/<name>``, whatever its kind."""
    return rkey.partition(":")[2].partition("/")[0]


class WorkerEndpoint:
    def __init__(
        self,
        *,
        states: States,
        ingress: Ingress,
        rejections: Rejections,
        clock: Clock,
        metrics: Metrics,
        volume_prefix: str = "",
    ) -> None:
        self._volume_prefix = volume_prefix
        self._states = states
        self._ingress = ingress
        self._rejections = rejections
        self._clock = clock
        self._metrics = metrics

    def report(self, worker: str, body: bytes) -> tuple[int, str]:
        """The HTTP status and message for one report; 503 while Redis is unreachable."""
        now_ms = self._clock.now_ms()
        topic = f"http:/sedna/workers/{worker}/info"
        try:
            accepted = accept_report(topic, worker, body, now_ms, channel="http")
            event = accepted.event
            assert isinstance(event, WorkerReported | OwnerReported)
            job = target_of(event)
            # judged against what the replicas hold: a state a failover could take back
            # (a commit whose WAIT fell short) neither accepts nor refuses it
            raw = self._states.load([job], barrier=True)[job]
            try:
                state = decode_state(raw) if raw else None
            except (msgspec.DecodeError, msgspec.ValidationError):
                reason = f"{job} is quarantined: its stored state cannot be decoded"
                raise InvalidMessage(reason, "$.ownerName", code="quarantined") from None
            refusal: Reject | None
            if isinstance(event, OwnerReported):
                refusal = passthrough.refusal(state, event)
            else:
                refusal = reports.refusal(state, event, self._volume_prefix)
            if refusal is not None:
                raise InvalidMessage(refusal.reason, "$.ownerName", code=refusal.code)
            self._ingress.append(shard_of(job), encode_accepted(accepted))
        except InvalidMessage as e:
            self._rejections.refuse(topic, e.code, e.detail, body, now_ms, publish=False)
            return 400, e.detail
        except StoreUnavailable:
            return 503, "state store unavailable; retry"
        self._metrics.events.labels(type="worker-reported", outcome="accepted").inc()
        return 200, "OK"


READ_BATCH = 500
SESSION_EXPIRY_S = 7 * 24 * 3600

ClientFactory = Callable[[queue.SimpleQueue[Inbound]], MqttClient]
GmFactory = Callable[[queue.SimpleQueue[Inbound]], GmBridge]


def ingress_client_factory(config: Config) -> ClientFactory:
    """Builds the subscribing client: one fixed client id with a persistent session, which
    the next lease holder resumes (mosquitto does not hand a departed shared-subscription
    member's messages to the others)."""

    def build(inbound: queue.SimpleQueue[Inbound]) -> MqttClient:
        return MqttClient(
            MqttSettings(
                url=config.mqtt_url,
                client_id=f"{config.key_prefix}-{config.node_name}-ingress",
                clean_start=False,
                session_expiry_s=SESSION_EXPIRY_S,
                manual_ack=True,
            ),
            subscriptions=[
                config.downstream_topic(),
                config.worker_topic_filter(),
                config.namespaced_worker_topic_filter(),
            ],
            inbound=inbound,
        )

    return build


class Intake:
    def __init__(
        self,
        *,
        config: Config,
        ingress: Ingress,
        leases: LeaseKeeper,
        rejections: Rejections,
        clock: Clock,
        stop: threading.Event,
        client_factory: ClientFactory,
        admission: Admission,
        handoff: Handoff,
        gm_factory: GmFactory | None = None,
    ) -> None:
        self._downstream_topic = config.downstream_topic()
        self._handoff = handoff
        self._data_roots = config.path_policy()
        self._ingress = ingress
        self._leases = leases
        self._rejections = rejections
        self._clock = clock
        self._stop = stop
        self._client_factory = client_factory
        self._admission = admission
        self._inbound: queue.SimpleQueue[Inbound] = queue.SimpleQueue()
        self._gm_factory = gm_factory
        self._client: MqttClient | None = None
        self._gm: GmBridge | None = None
        self._unknown_fields = UnknownFields()
        self._lock = threading.Lock()

    # ------------------------------------------------------------ the subscription
    def on_ingress_lease(self, held: bool) -> None:
        """Subscribe while the ingress lease is held; stop for good once it is gone, so a
        displaced holder never fights the next one for the fixed client id.

        Called by one thread at a time (the lease keeper's, or the stopping one once no
        lease is taken any more). Stopping the client and the GM link waits for their
        threads (seconds, when the broker or the GM is slow to answer): that happens after
        the lock is let go, so acknowledging, `state` and readiness never wait for it."""
        with self._lock:
            if held and self._client is None and not self._stop.is_set():
                self._client = self._client_factory(self._inbound)
                self._client.start()
                if self._gm_factory is not None:
                    self._gm = self._gm_factory(self._inbound)
                    self._gm.start()
                return
            if held or self._client is None:
                return
            client, gm = self._client, self._gm
            self._client, self._gm = None, None
        client.stop()
        if gm is not None:
            gm.stop()

    @property
    def state(self) -> str:
        """standby (another replica takes messages in), connecting, or up (subscribed)."""
        with self._lock:
            client = self._client
        if client is None:
            return "standby"
        return "up" if client.subscribed else "connecting"

    @property
    def subscribed(self) -> bool:
        """This replica's ingress client has every subscription acknowledged by the broker."""
        return self.state == "up"

    @property
    def gm_state(self) -> str:
        """off (no GM configured), standby (another replica holds the link), or the link's
        status: connecting, up or down."""
        if self._gm_factory is None:
            return "off"
        with self._lock:
            gm = self._gm
        return "standby" if gm is None else gm.status

    # ------------------------------------------------------------ taking messages in
    def run_once(self) -> None:
        try:
            first = self._inbound.get(timeout=0.2)
        except queue.Empty:
            return
        batch = [first]
        while len(batch) < READ_BATCH:
            try:
                batch.append(self._inbound.get_nowait())
            except queue.Empty:
                break
        try:
            self._take_in(batch)
        finally:
            frames_taken(batch)

    def _take_in(self, batch: list[Inbound]) -> None:
        accepted: list[tuple[Inbound, int, Accepted, str | None]] = []
        for msg in batch:
            now_ms = self._clock.now_ms()
            try:
                event = self._accept(msg, now_ms)
                self._admission.check(event)
            except InvalidMessage as e:
                self._rejections.refuse(msg.topic, e.code, e.detail, msg.payload, now_ms)
                self._ack(msg)
                continue
            self._unknown_fields.check(event)
            # MQTT may redeliver a message: its digest lets the store drop the copy. The GM
            # never redelivers, and re-sends a resource on purpose: no marker is needed.
            digest = None if msg.topic == GM_TOPIC else _digest(msg)
            accepted.append((msg, shard_of(target_of(event.event)), event, digest))
        if accepted:  # decoded, handed over or appended next: not yet in Redis
            failpoints.hit("intake-before-durable")
        appended = self._hand_over(accepted)
        if appended and self._append(appended):
            failpoints.hit("intake-before-ack")
            self._ack_all([msg for msg, *_ in appended])

    def _hand_over(
        self, accepted: list[tuple[Inbound, int, Accepted, str | None]]
    ) -> list[tuple[Inbound, int, bytes, str | None]]:
        """Hand the first MQTT deliveries of shards this replica holds to its processor, if
        it takes them now; the rest, to append. A shard whose batch holds any other message
        (a redelivery, a GM frame) is appended whole, in order, unless the processor still
        owes a message of it handed over earlier (`Handoff.owed`): then all of its messages
        are handed over, behind that one, even once this replica has lost the shard or the
        ingress lease (a Redis outage outlasting the leases: the processor then appends
        them to the stream after the one it owes; appended here, they would overtake it)."""
        token = self._leases.ingress_token
        with self._lock:
            client = self._client
        owed = self._handoff.owed()
        stream = {s for msg, s, _, digest in accepted if msg.dup or digest is None} - owed
        # decided once per shard: a lease lost halfway through the batch must not hand its
        # first messages over and append the later ones (they would overtake them)
        shards = {s for _, s, _, _ in accepted} - stream
        held = {s for s in shards if self._leases.token(s)}
        taken: list[TakenMessage] = []
        rest: list[tuple[Inbound, int, bytes, str | None]] = []
        for msg, shard, event, digest in accepted:
            if shard in owed or (client is not None and token and shard in held):
                # with the client gone, nothing acknowledges it: the broker delivers it again
                # to the next holder, whose marker check drops it once it is in
                handed = TakenMessage(
                    shard=shard, accepted=event, digest=digest, dup=msg.dup, ingress_token=token,
                    msg=msg, ack=client.ack_all if client is not None else _unacknowledged,
                )  # fmt: skip
                taken.append(handed)
            else:
                rest.append((msg, shard, encode_accepted(event), digest))
        if taken and not self._handoff.offer_messages(taken):
            return [(t.msg, t.shard, encode_accepted(t.accepted), t.digest) for t in taken] + rest
        return rest

    def _append(self, accepted: list[tuple[Inbound, int, bytes, str | None]]) -> bool:
        """Make the batch durable; False when stopping first (then it is not acknowledged,
        and the broker redelivers it to the next holder)."""
        retry = False
        while not self._stop.is_set():
            progress()  # waiting for Redis is not a stall of this thread
            try:
                # the token fences a holder frozen past its lease: messages the new holder
                # already took in are dropped by their marker, not taken in twice. A retry
                # may follow appends that happened but were not confirmed (no reply, too few
                # replicas): it sends them as redeliveries, so only the missing ones go in.
                self._ingress.append_many(
                    [(s, data, d, m.dup or retry) for m, s, data, d in accepted],
                    token=self._leases.ingress_token,
                )
                return True
            except StoreUnavailable as e:
                log.warning("ingress not durable yet, holding %d messages: %s", len(accepted), e)
                retry = True
                self._stop.wait(STORE_RETRY_S)
        return False

    def _accept(self, msg: Inbound, now_ms: int) -> Accepted:
        if msg.topic in (self._downstream_topic, GM_TOPIC):
            return accept_downstream(msg.topic, msg.payload, now_ms, data_roots=self._data_roots)
        levels = worker_topic_levels(msg.topic)
        if levels is None:
            raise InvalidMessage(f"no handler for topic {msg.topic!r}", code="unknown_topic")
        namespace, worker = levels
        return accept_report(msg.topic, worker, msg.payload, now_ms, namespace=namespace)

    def _ack(self, msg: Inbound) -> None:
        self._ack_all([msg])

    def _ack_all(self, msgs: list[Inbound]) -> None:
        """PUBACK these messages, in one batch (one wake-up of the client's network thread)."""
        with self._lock:
            if self._client is not None:
                self._client.ack_all(msgs)


def _unacknowledged(_msgs: Sequence[Inbound]) -> None:
    """The acknowledgement of a message whose client stopped: none can be sent."""


def _digest(msg: Inbound) -> str:
    return hashlib.sha256(msg.topic.encode() + b"\0" + msg.payload).hexdigest()
