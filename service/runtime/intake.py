"""The intake: while this replica holds the ingress lease it subscribes to the node's MQTT
topics (and holds the link to Sedna's GM, when one is configured), and every message it
receives is decoded, validated and appended to its shard's ingress stream before the broker
is told "got it". Bad messages become rejections and are acknowledged."""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
from collections.abc import Callable

from service import failpoints
from service.adapters.mqtt import Inbound, MqttClient, MqttSettings
from service.adapters.redis_store import Ingress
from service.config import Config
from service.errors import InvalidMessage, StoreUnavailable
from service.heartbeat import progress
from service.keys import shard_of
from service.runtime.accept import (
    Accepted,
    accept_downstream,
    accept_report,
    encode_accepted,
    target_of,
    worker_topic_levels,
)
from service.runtime.admission import Admission
from service.runtime.clock import Clock
from service.runtime.gm import GM_TOPIC, GmBridge, frames_taken
from service.runtime.leases import LeaseKeeper
from service.runtime.rejections import Rejections
from service.runtime.unknown_fields import UnknownFields

log = logging.getLogger(__name__)

READ_BATCH = 500
SESSION_EXPIRY_S = 7 * 24 * 3600
STORE_RETRY_S = 0.5

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
        gm_factory: GmFactory | None = None,
    ) -> None:
        self._downstream_topic = config.downstream_topic()
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
        accepted: list[tuple[Inbound, int, bytes, str | None]] = []
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
            shard = shard_of(target_of(event.event))
            accepted.append((msg, shard, encode_accepted(event), digest))
        if accepted and self._append(accepted):
            failpoints.hit("intake-before-ack")
            self._ack_all([msg for msg, *_ in accepted])

    def _append(self, accepted: list[tuple[Inbound, int, bytes, str | None]]) -> bool:
        """Make the batch durable; False when stopping first (then it is not acknowledged,
        and the broker redelivers it to the next holder)."""
        failpoints.hit("intake-before-durable")
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
            return accept_downstream(
                msg.topic, msg.payload, now_ms, data_roots=self._data_roots
            )
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
            client = self._client
            if client is None:
                return
            with client.batch():
                for msg in msgs:
                    client.ack(msg)


def _digest(msg: Inbound) -> str:
    return hashlib.sha256(msg.topic.encode() + b"\0" + msg.payload).hexdigest()
