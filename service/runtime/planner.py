"""Fold the transitions of one resource's events into one commit: pure, so it is tested
without Redis.

The processor runs `transition` for each event of a resource in stream order (timing each),
then hands the steps here. Everything the transitions produced lands in one `Commit` (state,
resource JSON, timer, acknowledged entries, upstream and errors messages, effect intents,
history, the records of rounds that ended), which Redis applies all-or-nothing, fenced by
the shard's lease.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from service import history, wire
from service.adapters.redis_store import Commit, OutboxEntry
from service.config import Config
from service.core.effects import (
    DatasetUnreadable,
    Forward,
    Note,
    Outcome,
    Publish,
    RecordRound,
    Refused,
    Reject,
    ScheduleCheck,
    Work,
    encode_work,
)
from service.core.passthrough import gm_accepts
from service.core.rounds import encode_round
from service.core.state import State, encode_state
from service.errors import RejectCode
from service.keys import parse_rkey
from service.runtime.accept import Accepted
from service.runtime.rejections import rejection_record


@dataclass(frozen=True)
class Step:
    """One ingress entry of the resource and what its transition gave (None: the entry could
    not be decoded; it is acknowledged and dropped)."""

    entry_id: str
    accepted: Accepted | None
    outcome: Outcome | None
    at_ms: int


@dataclass(frozen=True)
class Rejected:
    """A refusal the commit publishes on the errors topic; the caller logs and counts it."""

    topic: str
    code: RejectCode
    reason: str
    record: bytes


@dataclass(frozen=True)
class Plan:
    commit: Commit
    work: tuple[tuple[str, Work], ...]
    #: the history record of every transition, kept or not (the journal counts them all)
    records: tuple[history.HistoryRecord, ...]
    #: for each record, whether its transition changed the resource's view (phase, step,
    #: version, sample count): the journal logs those and the records that say something at
    #: INFO, the rest (a forwarded progress report) at DEBUG
    changed: tuple[bool, ...]
    rejected: tuple[Rejected, ...]
    #: datasets found unreadable (newly, or for a new reason): on the errors topic, counted
    unreadable: tuple[DatasetUnreadable, ...] = ()
    #: the resource's state once the commit applies (None: it is gone)
    state: State | None = None


def plan(
    rkey: str, token: str, initial: State | None, steps: Sequence[Step], config: Config
) -> Plan:
    """One commit carrying everything the steps did to the resource."""
    fold = _Fold(rkey, initial)
    view = history.view_of(initial)
    for step in steps:
        if step.accepted is None or step.outcome is None:
            continue
        fold.add(step.entry_id, step.accepted, step.outcome, step.at_ms, config)
        event = type(step.accepted.event).__name__
        record = history.record_of(event, step.outcome, at_ms=step.at_ms, token=token)
        fold.records.append(record)
        fold.changed.append(record.view() != view)
        view = record.view()
    ack_ids = tuple(step.entry_id for step in steps)
    return Plan(
        fold.commit(ack_ids), tuple(fold.work), tuple(fold.records), tuple(fold.changed),
        tuple(fold.rejected), tuple(fold.unreadable), fold.state,
    )  # fmt: skip


@dataclass
class _Fold:
    """What the steps so far add up to."""

    rkey: str
    initial: State | None
    state: State | None = None
    outbox: list[OutboxEntry] = field(default_factory=list)
    gm: list[tuple[str, bytes]] = field(default_factory=list)
    work: list[tuple[str, Work]] = field(default_factory=list)
    records: list[history.HistoryRecord] = field(default_factory=list)
    changed: list[bool] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    unreadable: list[DatasetUnreadable] = field(default_factory=list)
    rounds: list[bytes] = field(default_factory=list)
    timer_ms: int | None = None
    resource: bytes | None = None

    def __post_init__(self) -> None:
        self.state = self.initial

    def add(
        self, entry_id: str, accepted: Accepted, outcome: Outcome, at_ms: int, config: Config
    ) -> None:
        self.state = outcome.state
        if accepted.resource is not None and self.state is not None:
            self.resource = accepted.resource
        for effect in outcome.effects:
            if isinstance(effect, ScheduleCheck):
                self.timer_ms = effect.due_ms
            elif isinstance(effect, Publish):
                entry = _upstream(self.rkey, effect, config)
                self.outbox.append(entry)
                if config.gm_address and effect.to_gm:
                    self.gm.append((entry.id, entry.payload))
            elif isinstance(effect, Forward):
                entry = _upstream(self.rkey, effect, config)
                self.outbox.append(entry)
                if config.gm_address and gm_accepts(parse_rkey(self.rkey).kind, effect.status):
                    self.gm.append((entry.id, entry.payload))
            elif isinstance(effect, Reject):
                refusal = _rejected(accepted, effect, at_ms)
                self.rejected.append(refusal)
                rejection_id = f"{entry_id}/rejection"
                self.outbox.append(OutboxEntry(rejection_id, config.errors_topic(), refusal.record))
            elif isinstance(effect, Refused):
                refusal = _refused(effect, at_ms, config)
                self.rejected.append(refusal)
                entry = OutboxEntry(f"{entry_id}/refused", config.errors_topic(), refusal.record)
                self.outbox.append(entry)
            elif isinstance(effect, DatasetUnreadable):
                self.unreadable.append(effect)
                record = _unreadable_record(effect, at_ms, config)
                entry = OutboxEntry(f"{entry_id}/unreadable", config.errors_topic(), record)
                self.outbox.append(entry)
            elif isinstance(effect, RecordRound):
                self.rounds.append(encode_round(effect.record))
            elif not isinstance(effect, Note):
                self.work.append((effect.id, effect))

    def commit(self, ack_ids: tuple[str, ...]) -> Commit:
        outbox = tuple(self.outbox)
        if self.state is None and self.initial is None:
            return Commit(
                rkey=self.rkey, state=None, keep_state=True, ack_ids=ack_ids, outbox=outbox
            )
        intents = tuple((effect_id, encode_work(item)) for effect_id, item in self.work)
        if self.state is None:
            return Commit(
                rkey=self.rkey, state=None, delete=True, ack_ids=ack_ids, outbox=outbox,
                effects=intents, gm=tuple(self.gm),
            )  # fmt: skip
        kept = tuple(history.encode_record(r) for r in self.records if history.worth_keeping(r))
        return Commit(
            rkey=self.rkey,
            state=encode_state(self.state),
            resource=self.resource,
            timer_due_ms=self.timer_ms,
            ack_ids=ack_ids,
            outbox=outbox,
            effects=intents,
            history=kept,
            gm=tuple(self.gm),
            rounds=tuple(self.rounds),
        )


def _upstream(rkey: str, effect: Publish | Forward, config: Config) -> OutboxEntry:
    """The upstream envelope of a status (or a forwarded report) under the resource's kind;
    its header keeps the effect's stable id."""
    header = wire.Header(
        namespace=effect.namespace,
        resource_kind=parse_rkey(rkey).wire_kind,
        resource_name=effect.name,
        operation="status",
        id=effect.id,
    )
    payload = wire.encode(wire.UpstreamEnvelope(header=header, content=effect.status))
    status = effect.status
    if len(payload) > wire.MAX_PAYLOAD_BYTES and not isinstance(status, wire.DatasetStatus):
        for trimmed in _trimmed(status, len(payload)):
            envelope = wire.UpstreamEnvelope(header=header, content=trimmed)
            payload = wire.encode(envelope)
            if len(payload) <= wire.MAX_PAYLOAD_BYTES:
                break
    return OutboxEntry(effect.id, config.upstream_topic_for(effect.namespace), payload)


Forwarded = TypeVar("Forwarded", bound=wire.JobStatus | wire.ReportStatus)


def _trimmed(status: Forwarded, size: int) -> Iterator[Forwarded]:
    """Smaller forms of a forwarded report too large to send (outbound messages keep the
    inbound size limit): its results as {format, url} only and no ownerInfo, then no results
    at all; the reason says so."""
    output = status.output
    if output is None:
        return
    models = output.models or []
    note = (
        f"the report is {size} bytes forwarded, over the {wire.MAX_PAYLOAD_BYTES}-byte "
        f"limit: {{}} left out of its {len(models)} results; ownerInfo left out"
    )
    empty = msgspec.Raw(b"{}")
    slim: list[dict[str, Any]] = [{k: r[k] for k in ("format", "url") if k in r} for r in models]
    for left_out, kept in (("everything but each result's format and url", slim), ("all", [])):
        trimmed = msgspec.structs.replace(
            output, models=kept if output.models is not None else None, owner_info=empty
        )
        yield msgspec.structs.replace(status, reason=note.format(left_out), output=trimmed)


def _unreadable_record(effect: DatasetUnreadable, at_ms: int, config: Config) -> bytes:
    """The errors-topic record of an unreadable dataset, shaped like a rejection: the topic
    its resource came on, the reason, and its URL as the payload."""
    reason = f"dataset {effect.namespace}/{effect.name} cannot be read: {effect.reason}"
    return rejection_record(config.downstream_topic(), reason, effect.url.encode(), at_ms)


def _refused(effect: Refused, at_ms: int, config: Config) -> Rejected:
    """The errors-topic record of a request refused after it was taken in (a rollback whose
    copy failed), shaped like a rejection: the downstream topic it came on, the reason, and
    its subject as the payload."""
    topic = config.downstream_topic()
    record = rejection_record(topic, effect.reason, effect.subject.encode(), at_ms)
    return Rejected(topic, effect.code, effect.reason, record)


def _rejected(accepted: Accepted, effect: Reject, at_ms: int) -> Rejected:
    topic = accepted.topic or "internal"
    record = rejection_record(topic, effect.reason, accepted.head, accepted.received_ms or at_ms)
    return Rejected(topic, effect.code, effect.reason, record)
