"""Upstream messages: built as outbox entries (`upstream_entry`), committed with the state
that caused them, then sent by two sinks of the same entry: the MQTT broker and, when one
is configured, Sedna's GM.

MQTT, at least once: publish committed outbox entries, forget them after PUBACK.

Outbox entries are written in the same atomic commit as the state that caused them, so an
upstream message exists if and only if its transition happened. The processor hands each
commit's entries (with the stream ids the commit returned) to `send`, which publishes them
at QoS 1 at once; the publisher thread deletes acknowledged entries in batches. After a
crash, a timeout or a lease move, a sweep of the outbox stream sends the rest again with the
same `id`, which is how receivers drop duplicates. An entry the sweep cannot read as an
upstream message (not written by this service) is set aside (`Rejections.unreadable`) and
deleted, so the entries after it still go out.

The GM (`GmSink`): an entry the GM takes (`OutboxEntry.gm`, decided with the envelope) is
also appended, by the same commit, to its shard's GM outbox stream, and reaches the link
as a typed `GmMessage`: in stream order per shard, each removed once the link wrote it.
With nothing to send the sink blocks on those streams, so a commit on any replica wakes it.
While the link is down they wait, and go out in order once it is back. Websocket has no
acknowledgement, so a message counts as sent once it was written to the open connection.
One written just before the connection dropped, or before this replica died between the
write and the removal, is lost or sent again: at least once except across a connection
that dies mid-write, with the header's `id` to tell copies apart (Sedna's GM appends every
job status it reads to the job's conditions, copies included).
"""


import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import msgspec

from service import failpoints, wire
from service.adapters.gm_link import GmLink
from service.adapters.mqtt import PublishTicket
from service.adapters.redis_store import OutboxEntry, Outboxes, Unreadable
from service.config import Config
from service.core.effects import Forward, Publish
from service.core.passthrough import gm_accepts
from service.errors import ServiceError, StoreUnavailable
from service.heartbeat import Clock, Heartbeats, progress
from service.keys import NUM_SHARDS, parse_rkey
from service.runtime.rejections import Publisher, Rejections

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 5.0
#: how long the GM sink waits when the link is down, or at most for a new message
POLL_S = 0.2
POLL_MS = int(POLL_S * 1000)
#: the link's record in Redis is refreshed this often, and whenever its status changes
REPORT_EVERY_S = 2.0
STORE_RETRY_S = 0.5
BATCH = 100
BUSY_WAIT_S = 0.05  # between rounds while entries are in flight
IDLE_WAIT_S = 1.0

Key = tuple[int, str]  # (shard, outbox stream id)


class OutboxPublisher:
    def __init__(
        self,
        outboxes: Outboxes,
        mqtt: Publisher,
        held_shards: Callable[[], list[int]],
        *,
        clock: Clock,
        rejections: Rejections,
        puback_timeout_s: float = 10.0,
        idle_wait_s: float = IDLE_WAIT_S,
        on_depth: Callable[[int], None] = lambda _depth: None,
    ) -> None:
        self._outboxes = outboxes
        self._idle_wait_s = idle_wait_s
        self._mqtt = mqtt
        self._held_shards = held_shards
        self._clock = clock
        self._rejections = rejections
        self._timeout_s = puback_timeout_s
        self._on_depth = on_depth
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._dirty: set[int] = set()
        self._inflight: dict[Key, tuple[PublishTicket, float]] = {}
        self._publishing: set[Key] = set()
        self._acked: list[Key] = []
        self._last_sweep = 0.0

    def send(self, committed: Sequence[tuple[int, Sequence[tuple[str, OutboxEntry]]]]) -> None:
        """Publish just-committed entries now, per shard with their stream ids, as one batch
        (called by the committing thread)."""
        now = self._clock.monotonic_s()
        with self._mqtt.batch():
            for shard, entries in committed:
                for stream_id, entry in entries:
                    self._publish((shard, stream_id), entry, now)

    def wake(self, shards: set[int] | None = None) -> None:
        """Entries may wait unsent in these shards (None: sweep every held shard)."""
        with self._lock:
            if shards is None:
                self._last_sweep = 0.0
            else:
                self._dirty |= shards
        self._wake.set()

    def run_once(self) -> None:
        """Forget what was acknowledged, resend what timed out, sweep what is unsent."""
        self._wake.clear()
        self._forget_acknowledged()
        self._expire()
        self._sweep()
        self._on_depth(self.depth)

    def finish(self, timeout_s: float) -> None:
        """On a graceful stop: wait up to ``timeout_s`` for what is in flight to be
        acknowledged, then forget what was, so the next owner's sweep does not send it again
        (the thread that deletes acknowledged entries has already stopped)."""
        deadline = self._clock.monotonic_s() + timeout_s
        with self._lock:
            tickets = [ticket for ticket, _ in self._inflight.values()]
        for ticket in tickets:
            if not ticket.wait(max(0.0, deadline - self._clock.monotonic_s())):
                break
        with self._lock:  # done, but its callback may not have recorded it yet
            recorded = set(self._acked)
            self._acked += [
                key
                for key, (ticket, _) in self._inflight.items()
                if ticket.done and key not in recorded
            ]
        self._forget_acknowledged()

    def wait(self, stop: threading.Event) -> None:
        self._wake.wait(BUSY_WAIT_S if self.depth else self._idle_wait_s)
        if stop.is_set():
            self._wake.set()

    @property
    def depth(self) -> int:
        with self._lock:
            return len(self._inflight)

    def _publish(self, key: Key, entry: OutboxEntry, now: float) -> None:
        """Publish an entry unless it is in flight already. The committing thread's `send`
        and this thread's sweep may both come to a just-committed entry: the first reserves
        it (`_publishing`) before publishing, so the other leaves it alone."""
        with self._lock:
            if key in self._inflight or key in self._publishing:
                return
            self._publishing.add(key)
        ticket: PublishTicket | None = None
        try:
            failpoints.hit("outbox-before-publish")
            ticket = self._mqtt.publish(entry.topic, entry.payload, qos=1)
        except ServiceError as e:
            log.warning("publishing %s to %s failed: %s", entry.id, entry.topic, e)
        finally:
            with self._lock:
                self._publishing.discard(key)
                if ticket is None:
                    self._dirty.add(key[0])  # the next sweep tries again
                else:
                    self._inflight[key] = (ticket, now)
        if ticket is not None:
            ticket.add_done_callback(lambda: self._on_puback(key))

    def _on_puback(self, key: Key) -> None:
        """Runs on paho's thread: record, nothing more. No wake: the thread comes round
        every `BUSY_WAIT_S` while anything is in flight and deletes what was acknowledged
        meanwhile, all shards' in one round trip."""
        with self._lock:
            self._acked.append(key)

    def _forget_acknowledged(self) -> None:
        with self._lock:
            acked, self._acked = self._acked, []
        if not acked:
            return
        by_shard: dict[int, list[str]] = {}
        for shard, stream_id in acked:
            by_shard.setdefault(shard, []).append(stream_id)
        try:
            self._outboxes.done(by_shard)
        except ServiceError:
            with self._lock:  # deleted on the next round; sent again at worst
                self._acked[:0] = acked
            raise
        with self._lock:
            for key in acked:
                self._inflight.pop(key, None)

    def _expire(self) -> None:
        """Drop unacknowledged entries older than the timeout (the next sweep resends them).

        `_inflight` is in send order, so the scan stops at the first young entry: a burst of
        thousands in flight costs nothing here until they are really overdue.
        """
        deadline = self._clock.monotonic_s() - self._timeout_s
        with self._lock:
            overdue: list[Key] = []
            for key, (ticket, sent_at) in self._inflight.items():
                if sent_at > deadline:
                    break
                if not ticket.done:
                    overdue.append(key)
            for key in overdue:
                del self._inflight[key]
                self._dirty.add(key[0])

    def _sweep(self) -> None:
        """Publish what waits unsent: every entry of a dirty shard; of the other held shards
        every `SWEEP_INTERVAL_S`, those outside the span of stream ids in flight (a burst's
        entries are not read back to be skipped). An entry inside the span is in flight, or
        acknowledged and about to be deleted, or was dropped in flight, which made its shard
        dirty; the span moves on as its oldest entries are acknowledged."""
        now = self._clock.monotonic_s()
        with self._lock:
            shards = set(self._dirty)
            self._dirty.clear()
            skip: dict[int, tuple[str, str]] = {}
            if now - self._last_sweep >= SWEEP_INTERVAL_S:
                periodic = set(self._held_shards()) - shards
                skip = _spans(key for key in self._inflight if key[0] in periodic)
                shards |= periodic
                self._last_sweep = now
        if not shards:
            return
        unreadable: dict[int, list[str]] = {}
        with self._mqtt.batch():
            for shard, entries in self._outboxes.read(sorted(shards), skip=skip).items():
                for stream_id, entry in entries:
                    if isinstance(entry, Unreadable):
                        self._rejections.unreadable(
                            "outbox", f"shard {shard} entry {stream_id}", entry.reason,
                            entry.raw, self._clock.now_ms(),
                        )  # fmt: skip
                        unreadable.setdefault(shard, []).append(stream_id)
                    else:
                        self._publish((shard, stream_id), entry, now)
        self._outboxes.done(unreadable)


class GmSink:
    """The GM link as the outbox's second sink: sends what waits in the per-shard GM outbox
    streams while the link is up, in stream order per shard, each entry removed once the
    link wrote it; with nothing to send it blocks on those streams, so a commit on any
    replica wakes it. While the link is down the entries wait, and go out in order once it
    is back. Runs on the thread of the GM link's holder (`intake.GmBridge`), which calls
    ``report`` whenever the link's status changes and every `REPORT_EVERY_S`."""

    def __init__(
        self,
        *,
        link: GmLink,
        outboxes: Outboxes,
        rejections: Rejections,
        clock: Clock,
        heartbeats: Heartbeats,
        report: Callable[[], None],
    ) -> None:
        self._link = link
        self._outboxes = outboxes
        self._rejections = rejections
        self._clock = clock
        self._heartbeats = heartbeats
        self._report = report
        self._stop = threading.Event()

    def run(self, stop: threading.Event) -> None:
        """Send what waits in the GM outbox streams while the link is up, beating each time
        round, until ``stop``; no exception ever leaves this thread."""
        self._stop = stop
        with self._heartbeats.watch("gm-outbox") as beat:
            self._forward_until_stopped(beat)

    def _forward_until_stopped(self, beat: Callable[[], None]) -> None:
        reported_at, reported = 0.0, ""
        while not self._stop.is_set():
            beat()
            try:
                status = self._link.state.status
                if status != reported or self._clock.monotonic_s() - reported_at >= REPORT_EVERY_S:
                    self._report()
                    reported_at, reported = self._clock.monotonic_s(), status
                if self._link.state.status != "up":
                    self._stop.wait(POLL_S)
                elif (sent := self._send_pending()) is None:
                    self._stop.wait(POLL_S)  # the link refused: it is going down
                elif not sent and not self._outboxes.wait_gm(range(NUM_SHARDS), POLL_MS):
                    self._stop.wait(POLL_S)  # no blocking read here (Redis Cluster)
            except StoreUnavailable as e:
                log.warning("GM outbox waits for redis: %s", e)
                self._stop.wait(STORE_RETRY_S)
            except Exception:
                log.exception("GM outbox failed; continuing")
                self._stop.wait(STORE_RETRY_S)

    def _send_pending(self) -> bool | None:
        """Send one batch per shard, in order: whether anything was sent, or None when the
        link refused a message (the rest then waits, in order). An entry that is not an
        upstream envelope is set aside and the next one goes on."""
        sent_any = False
        for shard, entries in self._outboxes.read_gm(range(NUM_SHARDS), BATCH).items():
            done: list[str] = []
            refused = False
            for stream_id, message in entries:
                progress()
                if isinstance(message, Unreadable):
                    self._rejections.unreadable(
                        "gm-outbox", f"shard {shard} entry {stream_id}", message.reason,
                        message.raw, self._clock.now_ms(),
                    )  # fmt: skip
                elif self._stop.is_set() or not self._link.send(message.header, message.content):
                    refused = True
                    break
                done.append(stream_id)
            self._outboxes.done_gm(shard, done)
            sent_any = sent_any or bool(done)
            if refused:
                return None
        return sent_any


def _spans(keys: Iterable[Key]) -> dict[int, tuple[str, str]]:
    """Per shard, the first and last of these stream ids."""
    bounds: dict[int, tuple[tuple[int, int], tuple[int, int]]] = {}
    for shard, stream_id in keys:
        position = _position(stream_id)
        first, last = bounds.get(shard, (position, position))
        bounds[shard] = (min(first, position), max(last, position))
    return {shard: (_stream_id(first), _stream_id(last)) for shard, (first, last) in bounds.items()}


def _position(stream_id: str) -> tuple[int, int]:
    milliseconds, sequence = stream_id.split("-")
    return int(milliseconds), int(sequence)


def _stream_id(position: tuple[int, int]) -> str:
    return f"{position[0]}-{position[1]}"


def upstream_entry(rkey: str, effect: Publish | Forward, config: Config) -> OutboxEntry:
    """The outbox entry of a status (or a forwarded report): its upstream envelope under the
    resource's kind, the header keeping the effect's stable id; for the GM link too when one
    is configured and the GM takes it (a status the core marked for it, a forwarded report
    of a kind and status the GM reads)."""
    kind = effect.resource_kind if isinstance(effect, Publish) else ""
    header = wire.Header(
        namespace=effect.namespace,
        resource_kind=kind or parse_rkey(rkey).wire_kind,
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
    if isinstance(effect, Publish):
        to_gm = effect.to_gm
    else:
        to_gm = gm_accepts(parse_rkey(rkey).kind, effect.status)
    topic = config.upstream_topic_for(effect.namespace)
    return OutboxEntry(effect.id, topic, payload, gm=bool(config.gm_address) and to_gm)


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
