"""A replica's retained presence topic: `online` once it can take messages, `offline` when
it stops (or, through its last will, when it dies).

"Can take messages" means a message published to the node now is taken in: the ingress is
subscribed (SUBACK received), by this replica or by another live one. Saying `online` any
earlier let a cloud peer that sends on first sight lose its message on a first start, when
the broker holds no session for the ingress client id yet to queue it.

`online` is published again every `REPUBLISH_LEASES` lease times while it holds: a retained
message anyone allowed on the topic left there (a spoofed `offline`, garbage) does not last.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime

from service import wire
from service.adapters.mqtt import PublishTicket
from service.config import Config
from service.runtime.clock import Clock
from service.runtime.rejections import Publisher

OFFLINE_WAIT_S = 2.0
REPUBLISH_LEASES = 3


def presence_payload(replica: str, state: wire.PresenceState, now_ms: int) -> bytes:
    since = datetime.fromtimestamp(now_ms / 1000, UTC).isoformat(timespec="milliseconds")
    return wire.encode(wire.Presence(replica=replica, state=state, since=since))


class Presence:
    def __init__(
        self,
        *,
        config: Config,
        replica: str,
        publisher: Publisher,
        clock: Clock,
        can_take_messages: Callable[[], bool],
    ) -> None:
        self._topic = config.presence_topic(replica)
        self._can_take_messages = can_take_messages
        self._replica = replica
        self._publisher = publisher
        self._clock = clock
        self._due = threading.Event()
        self._republish_s = REPUBLISH_LEASES * config.lease_s
        self._next_s = 0.0

    def on_connection(self, connected: bool) -> None:
        """The publisher (re)connected: say online again (the broker may have lost it)."""
        if connected:
            self._due.set()

    def announce(self) -> None:
        """Publish `online` when due (after a connection, and again every republish period),
        the publisher is connected and messages are taken in."""
        now_s = self._clock.monotonic_s()
        if now_s >= self._next_s:
            self._due.set()
        if self._due.is_set() and self._publisher.connected and self._can_take_messages():
            self._due.clear()
            self._next_s = now_s + self._republish_s
            self._publish("online")

    def offline(self) -> None:
        """Say `offline` (retained) and wait briefly for the broker to take it."""
        self._publish("offline").wait(OFFLINE_WAIT_S)

    def _publish(self, state: wire.PresenceState) -> PublishTicket:
        payload = presence_payload(self._replica, state, self._clock.now_ms())
        return self._publisher.publish(self._topic, payload, retain=True)
