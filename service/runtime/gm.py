"""The node's link to Sedna's global manager (GM), held by the ingress lease holder.

Frames the GM sends go into the intake's queue as downstream messages (topic `GM_TOPIC`):
decoded, validated, made durable and rejected with a reason like any MQTT downstream
message. The link hands on only so many frames the intake has not finished with
(`GmInbound.taken`), then stops reading: a flooding GM is slowed down, not buffered.

Upstream messages reach the GM from the per-shard GM outbox streams the commits write beside
the MQTT outbox: in stream order per shard, each removed once the link wrote it. With
nothing to send the forwarder blocks on those streams, so a commit on any replica wakes it.
While the link is down they wait, and go out in order once it is back.

What the GM gets: websocket has no acknowledgement, so a message counts as sent once it was
written to the open connection. One written just before the connection dropped, or before
this replica died between the write and the removal, is lost or sent again: at least once
except across a connection that dies mid-write, with the header's `id` to tell copies apart
(Sedna's GM appends every job status it reads to the job's conditions, copies included).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgspec

from service.adapters.gm import (
    GmFrame,
    GmLink,
    GmLinkSettings,
    GmRejected,
    LinkState,
    parse_gm_address,
)
from service.adapters.mqtt import Inbound
from service.adapters.redis_store import Leases, Outboxes, Unreadable
from service.errors import StoreUnavailable
from service.heartbeat import Heartbeats, progress
from service.keys import NUM_SHARDS
from service.metrics import Metrics
from service.runtime.clock import Clock
from service.runtime.rejections import Rejections

log = logging.getLogger(__name__)

#: The topic GM frames are taken in under (rejections show it as their topic).
GM_TOPIC = "gm"
#: how long the forwarder waits when the link is down, or at most for a new message
POLL_S = 0.2
POLL_MS = int(POLL_S * 1000)
#: the link's record in Redis is refreshed this often, and whenever its status changes
REPORT_EVERY_S = 2.0
STORE_RETRY_S = 0.5
BATCH = 100


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


class _Envelope(msgspec.Struct, frozen=True):
    """An upstream envelope as the GM outbox holds it: the header's values are strings."""

    header: dict[str, str]
    content: msgspec.Raw = msgspec.Raw(b"null")


_envelope_decoder = msgspec.json.Decoder(_Envelope)


def _frame_of(payload: bytes | Unreadable) -> tuple[dict[str, str], bytes] | Unreadable:
    """The header and content JSON of a GM outbox entry, or why it is not an envelope."""
    if isinstance(payload, Unreadable):
        return payload
    try:
        envelope = _envelope_decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        return Unreadable(f"not an upstream envelope: {e}", payload)
    return envelope.header, bytes(envelope.content)


class GmBridge:
    """One holding of the link: built when the ingress lease is taken, stopped for good when
    it is lost (a second live connection would split the GM's messages between replicas)."""

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
        self._address = address
        self._replica = replica
        self._outboxes = outboxes
        self._leases = leases
        self._inbound = inbound
        self._rejections = rejections
        self._clock = clock
        self._report_ttl_ms = report_ttl_ms
        self._heartbeats = heartbeats
        self._stop = threading.Event()
        self._link = GmLink(
            parse_gm_address(address), node, self._on_frame,
            on_reject=self._on_reject, observer=metrics.gm, settings=settings,
            heartbeats=heartbeats,
        )  # fmt: skip
        self._thread = threading.Thread(target=self._forward, name="gm-outbox", daemon=True)

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

    # ------------------------------------------------------------ messages out
    def _forward(self) -> None:
        """Send what waits in the GM outbox streams while the link is up, beating each time
        round; no exception ever leaves this thread."""
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
                elif not sent and not self._outboxes.gm_outbox_wait(range(NUM_SHARDS), POLL_MS):
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
        for shard, entries in self._outboxes.gm_outbox_read(range(NUM_SHARDS), BATCH).items():
            done: list[str] = []
            refused = False
            for stream_id, payload in entries:
                progress()
                frame = _frame_of(payload)
                if isinstance(frame, Unreadable):
                    self._rejections.unreadable(
                        "gm-outbox", f"shard {shard} entry {stream_id}", frame.reason,
                        frame.raw, self._clock.now_ms(),
                    )  # fmt: skip
                elif self._stop.is_set() or not self._link.send(*frame):
                    refused = True
                    break
                done.append(stream_id)
            self._outboxes.gm_outbox_done(shard, done)
            sent_any = sent_any or bool(done)
            if refused:
                return None
        return sent_any

    def _report(self) -> None:
        record = GmLinkRecord(
            replica=self._replica, address=self._link.endpoint.shown, link=self._link.state
        )
        self._leases.put_gm_link(msgspec.json.encode(record), self._report_ttl_ms)
