"""At-least-once upstream: publish committed outbox entries, forget them after PUBACK.

Outbox entries are written in the same atomic commit as the state that caused them, so an
upstream message exists if and only if its transition happened. The publisher sends each at
QoS 1 and deletes it once the broker acknowledged it; after a crash, a timeout or a lease
move the entry is sent again with the same `id`, which is how receivers drop duplicates.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from service import failpoints
from service.adapters.mqtt import MqttClient, PublishTicket
from service.adapters.redis_store import RedisStore
from service.errors import ServiceError

log = logging.getLogger("service.outbox")

SWEEP_INTERVAL_S = 5.0


class OutboxPublisher:
    def __init__(
        self,
        store: RedisStore,
        mqtt: MqttClient,
        held_shards: Callable[[], list[int]],
        *,
        puback_timeout_s: float = 10.0,
        on_depth: Callable[[int], None] = lambda _depth: None,
    ) -> None:
        self._store = store
        self._mqtt = mqtt
        self._held_shards = held_shards
        self._timeout_s = puback_timeout_s
        self._on_depth = on_depth
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._dirty: set[int] = set()
        self._inflight: dict[tuple[int, str], tuple[PublishTicket, float]] = {}
        self._last_sweep = 0.0

    def wake(self, shards: set[int] | None = None) -> None:
        """New entries may be waiting in these shards (None: look at every held shard)."""
        with self._lock:
            if shards is None:
                self._last_sweep = 0.0
            else:
                self._dirty |= shards
        self._wake.set()

    def run_once(self) -> None:
        """Send what is new, forget what was acknowledged, resend what timed out."""
        self._wake.clear()
        self._send_new()
        self._forget_acknowledged()
        self._on_depth(len(self._inflight))

    def wait(self, stop: threading.Event) -> None:
        timeout = 0.05 if self._inflight else 1.0
        self._wake.wait(timeout)
        if stop.is_set():
            self._wake.set()

    @property
    def depth(self) -> int:
        return len(self._inflight)

    def _send_new(self) -> None:
        now = time.monotonic()
        with self._lock:
            shards = set(self._dirty)
            self._dirty.clear()
            if now - self._last_sweep >= SWEEP_INTERVAL_S:
                shards |= set(self._held_shards())
                self._last_sweep = now
        for shard in sorted(shards):
            for stream_id, entry in self._store.outbox_read(shard):
                key = (shard, stream_id)
                if key in self._inflight:
                    continue
                failpoints.hit("outbox-before-publish")
                try:
                    ticket = self._mqtt.publish(entry.topic, entry.payload, qos=1)
                except ServiceError as e:
                    log.warning("publishing %s to %s failed: %s", entry.id, entry.topic, e)
                    continue
                ticket.add_done_callback(self._wake.set)
                self._inflight[key] = (ticket, now)

    def _forget_acknowledged(self) -> None:
        now = time.monotonic()
        done: dict[int, list[str]] = {}
        for key, (ticket, sent_at) in list(self._inflight.items()):
            if ticket.done:
                done.setdefault(key[0], []).append(key[1])
            elif now - sent_at > self._timeout_s:
                del self._inflight[key]  # sent again on the next sweep, same id
                with self._lock:
                    self._dirty.add(key[0])
        for shard, stream_ids in done.items():
            self._store.outbox_done(shard, stream_ids)
            for stream_id in stream_ids:
                del self._inflight[(shard, stream_id)]
