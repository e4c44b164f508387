"""Refusals and quarantine: what the service does with a message, an entry or a state it
cannot use, before carrying on.

Refused messages: a log line, a counter by reason code, the dead-letter stream and the
errors topic, then the service carries on. A flood of refusals must not become a flood of
log lines: per reason code, the first `LOG_BURST` of each `LOG_INTERVAL_S` are logged one
by one and the rest are summed up in one line, "N more like this", once the interval is
over (`LogLimiter`); the counter, the dead-letter stream and the errors topic still get
every one. `Publisher` is what they (and the outbox, and presence) publish through: the
MQTT client, or a test's fake.

Poison isolation (`Quarantines`): a resource whose stored state, or one of whose ingress
entries, cannot be decoded is quarantined instead of stalling its shard. Its entries (the
bad one and any arriving while the quarantine lasts) are taken out of the ingress and kept
on the dead-letter stream with the reason; the resource is marked (a `QuarantineMark` in
its shard's `broken` hash, listed by `States.quarantined`) and retried after 1 s, 2 s,
4 s... up to 5 minutes (a timer, so a quiet resource is retried too). A retry that decodes
the state ends the quarantine and the event is applied as usual; deleting the resource ends
it too. An entry whose resource cannot be told is set aside alone. Every other resource of
the shard goes on meanwhile, and each quarantine logs one line per try.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal, Protocol

import msgspec

from service import masking, wire
from service.adapters.mqtt import PublishTicket
from service.adapters.redis_store import Quarantine, Records
from service.core.events import DatasetDeleted, JobDeleted, ResourceDeleted
from service.errors import RejectCode, ServiceError, StoreUnavailable
from service.keys import WIRE_KINDS, dataset_key, job_key, parse_rkey, rkey, shard_of
from service.metrics import Metrics

if TYPE_CHECKING:
    from service.runtime.intake import Accepted


log = logging.getLogger(__name__)

LOG_BURST = 5
LOG_INTERVAL_S = 10.0

#: The internal queues whose unreadable entries are set aside (`Rejections.unreadable`).
Queue = Literal["outbox", "gm-outbox", "effects"]


def rejection_record(topic: str, reason: str, payload: bytes, at_ms: int) -> bytes:
    """The encoded errors-topic record of a refused message (secrets masked)."""
    received = datetime.fromtimestamp(at_ms / 1000, UTC)
    return wire.encode(wire.make_rejection(topic, reason, payload, received))


class Publisher(Protocol):
    """An MQTT connection that publishes (QoS 1 completes on the broker's PUBACK)."""

    @property
    def connected(self) -> bool: ...

    def publish(
        self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False
    ) -> PublishTicket: ...

    def batch(self) -> AbstractContextManager[None]:
        """Publishes made inside go out together, at the end at the latest."""
        ...


@dataclass
class _Window:
    started_s: float
    seen: int = 0
    example: str = ""


class LogLimiter:
    """Which warnings of a kind (a reason code) are logged one by one: the first ``burst`` of
    each ``interval_s``, counted from the first of them; the others are counted and `flush`
    (or the next warning of the kind) logs how many there were once the interval is over."""

    def __init__(
        self,
        *,
        burst: int = LOG_BURST,
        interval_s: float = LOG_INTERVAL_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._burst = burst
        self._interval_s = interval_s
        self._monotonic = monotonic
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()

    def admit(self, kind: str, example: str) -> bool:
        """True when this warning of ``kind`` is to be logged now; ``example`` (an already
        loggable text) stands for it in the summary line otherwise."""
        now = self._monotonic()
        with self._lock:
            window = self._windows.get(kind)
            if window is not None and now - window.started_s >= self._interval_s:
                self._summarise(kind, window)
                window = None
            if window is None:
                window = self._windows[kind] = _Window(started_s=now)
            window.seen += 1
            if window.seen > self._burst:
                window.example = example
            return window.seen <= self._burst

    def flush(self) -> None:
        """Log the summary of every kind whose interval is over (called every second or so)."""
        now = self._monotonic()
        with self._lock:
            for kind, window in list(self._windows.items()):
                if now - window.started_s >= self._interval_s:
                    self._summarise(kind, window)
                    del self._windows[kind]

    def _summarise(self, kind: str, window: _Window) -> None:
        more = window.seen - self._burst
        if more > 0:
            log.warning("%d more like this (%s) in %.0fs, not logged one by one; the last: %s",
                        more, kind, self._interval_s, window.example,
                        extra={"outcome": "rejected", "suppressed": more})  # fmt: skip


class Rejections:
    """Records refusals; publishes them itself for the intake path (the processor's go out
    through the outbox, committed with the state)."""

    def __init__(
        self,
        *,
        dead_letters: Records,
        publisher: Publisher,
        errors_topic: str,
        metrics: Metrics,
    ) -> None:
        self._log = LogLimiter()
        self._dead_letters = dead_letters
        self._publisher = publisher
        self._errors_topic = errors_topic
        self._metrics = metrics

    def flush_log(self) -> None:
        """Log the "N more like this" lines that are due (`LogLimiter.flush`)."""
        self._log.flush()

    def refuse(
        self,
        topic: str,
        code: RejectCode,
        reason: str,
        payload: bytes,
        at_ms: int,
        *,
        publish: bool = True,
    ) -> None:
        """A message refused at the door; published on the errors topic unless ``publish`` is
        false (the HTTP endpoint answers its caller instead)."""
        record = rejection_record(topic, reason, payload, at_ms)
        self.recorded(topic, code, reason, record)
        if publish:
            try:
                self._publisher.publish(self._errors_topic, record)
            except ServiceError as e:
                self._warn("errors topic", "could not publish rejection: %s", e)

    def set_aside(self, topic: str, reason: str, payload: bytes, at_ms: int) -> None:
        """Dead-letter an ingress entry set aside by a quarantine (which logs and counts)."""
        try:
            self._dead_letters.dead_letter(rejection_record(topic, reason, payload, at_ms))
        except StoreUnavailable as e:
            self._warn("dead-letter stream", "dead-letter stream unavailable: %s", e)

    def unreadable(self, queue: Queue, where: str, reason: str, raw: bytes, at_ms: int) -> None:
        """An entry of an internal queue that cannot be decoded (``where`` names it: shard
        and id), taken out by the caller so the entries after it go on: a log line, a count
        by queue and the dead-letter stream (its record's topic is ``{queue} {where}``)."""
        log.warning("set aside an unreadable %s entry (%s): %s", queue, where, reason,
                    extra={"outcome": "set-aside"})  # fmt: skip
        self._metrics.set_aside.labels(queue=queue).inc()
        self.set_aside(f"{queue} {where}", reason, raw, at_ms)

    def recorded(self, topic: str, code: RejectCode, reason: str, record: bytes) -> None:
        """Log, count and dead-letter a rejection whose record is already built (its reason
        is logged masked, as the record holds it)."""
        masked = masking.mask(reason)
        self._metrics.rejections.labels(reason=code).inc()
        if self._log.admit(f"reason code {code}", f"on {topic}: {masked}"):
            log.warning("rejected message on %s: %s", topic, masked, extra={"outcome": "rejected"})
        try:
            self._dead_letters.dead_letter(record)
        except StoreUnavailable as e:
            self._warn("dead-letter stream", "dead-letter stream unavailable: %s", e)

    def _warn(self, kind: str, message: str, error: ServiceError) -> None:
        if self._log.admit(kind, message % error):
            log.warning(message, error)


#: "state": the stored state cannot be decoded; "entry": one of its ingress entries cannot.
Cause = Literal["state", "entry"]
FIRST_RETRY_MS = 1_000
MAX_RETRY_MS = 300_000
_DATASET_EVENTS = ("dataset-applied", "dataset-deleted", "dataset-polled")
#: The events of stored resources, whose `kind` field is their resource key's kind.
_STORED_EVENTS = ("resource-applied", "resource-deleted", "owner-reported")


class QuarantineMark(msgspec.Struct, frozen=True, kw_only=True):
    """Why and since when a resource is quarantined, when it is tried again, and how many of
    its entries were set aside so far."""

    cause: Cause
    reason: str
    since_ms: int
    attempts: int
    retry_at_ms: int
    dead_lettered: int = 0


def retry_delay_ms(attempts: int) -> int:
    """The wait before the next try after `attempts` failed ones: doubling from 1 s, capped."""
    doublings = min(max(attempts - 1, 0), 20)
    return min(FIRST_RETRY_MS << doublings, MAX_RETRY_MS)


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(QuarantineMark)
#: What an unreadable mark reads as: a quarantine due for a try now.
_UNREADABLE = QuarantineMark(
    cause="state", reason="quarantine mark unreadable", since_ms=0, attempts=0, retry_at_ms=0
)


def encode_mark(mark: QuarantineMark) -> bytes:
    return _encoder.encode(mark)


def decode_mark(data: bytes) -> QuarantineMark:
    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return _UNREADABLE


@dataclass(frozen=True)
class Held:
    """An ingress entry as the processor holds it: decoded, or not (`error` says why)."""

    entry_id: str
    accepted: Accepted | None
    raw: bytes = b""  # the entry as stored
    error: str = ""
    #: an effect's result handed over in process (no ingress entry): the intent it retires
    effect_id: str | None = None
    #: a message the intake handed over in process (no ingress entry)
    taken: bool = False

    @property
    def in_process(self) -> bool:
        """Handed over in process: no ingress entry holds it."""
        return self.effect_id is not None or self.taken


@dataclass(frozen=True)
class Letter:
    """A dead-letter record to write for an entry set aside."""

    topic: str
    reason: str
    payload: bytes
    at_ms: int


@dataclass(frozen=True)
class Isolation:
    """What setting entries aside commits (`op`) and then dead-letters (`letters`)."""

    shard: int
    op: Quarantine
    mark: QuarantineMark | None
    letters: tuple[Letter, ...]


def guess_target(shard: int, data: bytes) -> str | None:
    """The resource an undecodable entry was for, when its envelope still says so."""
    try:
        obj = msgspec.msgpack.decode(data)
    except msgspec.DecodeError:
        return None
    event = obj.get("event") if isinstance(obj, dict) else None
    if not isinstance(event, dict):
        return None
    tag, namespace, name = event.get("type"), event.get("namespace"), event.get("name")
    if not all(isinstance(x, str) and x for x in (tag, namespace, name)):
        return None
    kind = event.get("kind")
    if tag in _STORED_EVENTS:
        if kind not in WIRE_KINDS:
            return None
        key = rkey(str(kind), str(namespace), str(name))
    else:
        dataset = tag in _DATASET_EVENTS or (tag == "tick" and kind == "dataset")
        key = (dataset_key if dataset else job_key)(str(namespace), str(name))
    return key if shard_of(key) == shard else None


def last_delete(entries: Sequence[Held]) -> int | None:
    """The index of the last decoded delete event among the entries."""
    for i in range(len(entries) - 1, -1, -1):
        accepted = entries[i].accepted
        if accepted is not None and isinstance(
            accepted.event, JobDeleted | DatasetDeleted | ResourceDeleted
        ):
            return i
    return None


class Quarantines:
    """The quarantine marks of the owned shards (this replica is their only writer while it
    holds a shard, so they are read from Redis only when a shard is recovered)."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._marks: dict[int, dict[str, QuarantineMark]] = {}

    def load(self, marks: dict[int, dict[str, bytes]]) -> None:
        for shard, stored in marks.items():
            self._marks[shard] = {rkey: decode_mark(data) for rkey, data in stored.items()}
        self._count()

    def keep_only(self, shards: Collection[int]) -> None:
        for shard in [s for s in self._marks if s not in shards]:
            del self._marks[shard]
        self._count()

    def mark_of(self, shard: int, rkey: str) -> QuarantineMark | None:
        return self._marks.get(shard, {}).get(rkey)

    def committed(self, isolation: Isolation) -> None:
        """An isolation committed: keep its mark, count what it set aside."""
        if isolation.op.rkey is not None and isolation.mark is not None:
            self._marks.setdefault(isolation.shard, {})[isolation.op.rkey] = isolation.mark
        cause = isolation.mark.cause if isolation.mark is not None else "entry"
        self._metrics.quarantined_entries.labels(cause=cause).inc(len(isolation.op.ack_ids))
        self._count()

    def ended(self, shard: int, rkey: str) -> None:
        """A commit that ended the resource's quarantine went through."""
        if self._marks.get(shard, {}).pop(rkey, None) is not None:
            log.info("quarantine of %s ended", rkey, extra=_extra(rkey))
            self._count()

    def _count(self) -> None:
        self._metrics.quarantined.set(sum(len(marks) for marks in self._marks.values()))

    # ------------------------------------------------------------ deciding
    def isolate(
        self,
        shard: int,
        rkey: str,
        entries: Sequence[Held],
        now_ms: int,
        failure: tuple[Cause, str] | None,
    ) -> Isolation:
        """Set the resource's entries aside: after a failed try (`failure`), or while its
        quarantine waits for the next one (then nothing is tried and nothing logged)."""
        previous = self.mark_of(shard, rkey)
        if failure is None:
            assert previous is not None
            mark = msgspec.structs.replace(
                previous, dead_lettered=previous.dead_lettered + len(entries)
            )
        else:
            cause, reason = failure
            attempts = 1 if previous is None else previous.attempts + 1
            mark = QuarantineMark(
                cause=cause,
                reason=reason,
                since_ms=now_ms if previous is None else previous.since_ms,
                attempts=attempts,
                retry_at_ms=now_ms + retry_delay_ms(attempts),
                dead_lettered=len(entries) + (0 if previous is None else previous.dead_lettered),
            )
            log.warning(
                "%s quarantined (try %d): %s; %d entries set aside on the dead-letter stream, "
                "next try in %.0f s",
                rkey, attempts, reason, len(entries), retry_delay_ms(attempts) / 1000,
                extra=_extra(rkey),
            )  # fmt: skip
        why = f"{rkey} is quarantined ({mark.cause}): {mark.reason}"
        return Isolation(
            shard=shard,
            op=Quarantine(
                rkey=rkey,
                ack_ids=tuple(e.entry_id for e in entries),
                mark=encode_mark(mark),
                retry_at_ms=mark.retry_at_ms,
            ),
            mark=mark,
            letters=tuple(_letter(shard, e, why, now_ms) for e in entries),
        )

    def set_aside_unknown(self, shard: int, entries: Sequence[Held], now_ms: int) -> Isolation:
        """Undecodable entries whose resource cannot be told: set aside, one line each."""
        letters = []
        for entry in entries:
            why = f"ingress entry {entry.entry_id} of shard {shard} cannot be decoded"
            why = f"{why}: {entry.error}"
            log.warning("%s; set aside on the dead-letter stream", why)
            letters.append(_letter(shard, entry, why, now_ms))
        op = Quarantine(rkey=None, ack_ids=tuple(e.entry_id for e in entries))
        return Isolation(shard=shard, op=op, mark=None, letters=tuple(letters))


def _letter(shard: int, entry: Held, reason: str, now_ms: int) -> Letter:
    """The entry's record: the original message's head when it has one, else its bytes."""
    accepted = entry.accepted
    topic = accepted.topic if accepted is not None and accepted.topic else f"ingress/s{shard}"
    payload = accepted.head if accepted is not None and accepted.head else entry.raw
    received = accepted.received_ms if accepted is not None and accepted.received_ms else now_ms
    return Letter(topic=topic, reason=f"{reason}; entry {entry.entry_id}", payload=payload,
                  at_ms=received)  # fmt: skip


def _extra(rkey: str) -> dict[str, str]:
    key = parse_rkey(rkey)
    return {key.kind: key.path}
