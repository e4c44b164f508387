"""Publish tickets: what `MqttClient.publish` returns, done once the broker's PUBACK arrived.

Publishing while disconnected is allowed: paho keeps QoS 1 messages in its (unbounded) queue
and sends them after the next CONNACK; `PublishTicket.wait` simply times out until the PUBACK
arrives. A PUBACK with a failure reason code (MQTT 5 only; e.g. 0x87 "Not authorized" from an
ACL) completes the ticket as refused, with the broker's reason. Under 3.1.1 a PUBACK carries
no reason code: a broker that drops a publish it may not accept still acknowledges it.

`TicketBook` files the tickets awaiting their PUBACK by packet id. Callbacks run on paho's
network thread, where an exception would end it: `run_callback` logs and swallows them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

log = logging.getLogger("service.mqtt")


def run_callback(fn: Callable[[], None]) -> None:
    """Call a user callback; an exception must never reach (and kill) paho's thread."""
    try:
        fn()
    except Exception:
        log.exception("MQTT callback %r failed", fn)


class PublishTicket:
    """Completion of one publish: done once the broker's PUBACK (QoS 1) arrived.

    A PUBACK may refuse the message (MQTT 5 reason code >= 0x80, e.g. 0x87 "Not authorized"
    from an ACL): the ticket is done all the same, since retrying cannot help, and `refused`
    and `reason` say so. Under MQTT 3.1.1 a PUBACK carries no reason, so nothing is refused.
    Cheap by design (one per upstream message, thousands per second): a plain flag and one
    lock; the Event that `wait` needs is only made when someone waits.
    """

    def __init__(self, mid: int) -> None:
        self._mid = mid
        self._done = False
        self._refusal: str | None = None
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self._event: threading.Event | None = None

    @property
    def mid(self) -> int:
        return self._mid

    @property
    def done(self) -> bool:
        return self._done

    @property
    def refused(self) -> bool:
        """True once the broker answered the publish with a failure reason code."""
        return self._refusal is not None

    @property
    def reason(self) -> str | None:
        """The broker's reason for refusing (e.g. "Not authorized"); None unless `refused`."""
        return self._refusal

    def wait(self, timeout_s: float) -> bool:
        """True once acknowledged; False if ``timeout_s`` passed first."""
        with self._lock:
            if self._done:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout_s)

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on completion (on paho's thread: keep it cheap), or now if already done."""
        with self._lock:
            if not self._done:
                self._callbacks.append(fn)
                return
        run_callback(fn)

    def _complete(self, refusal: str | None = None) -> None:
        with self._lock:
            if self._done:
                return
            self._refusal = refusal
            self._done = True
            callbacks, self._callbacks = self._callbacks, []
            event = self._event
        if event is not None:
            event.set()
        for fn in callbacks:
            run_callback(fn)


class TicketBook:
    """The tickets of publishes awaiting their PUBACK, by packet id (mid).

    A PUBACK may overtake `register` (paho's thread handles it before the publishing thread
    files the ticket): its answer is kept until the ticket comes. The one lock is taken
    inside paho's own locks (on_publish), so nothing may be acquired while holding it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tickets: dict[int, PublishTicket] = {}
        self._early_acks: dict[int, str | None] = {}

    def register(self, mid: int) -> PublishTicket:
        """The ticket of the publish paho numbered ``mid`` (done at once if acked already)."""
        ticket = PublishTicket(mid)
        with self._lock:
            acked_early = mid in self._early_acks
            refusal = self._early_acks.pop(mid, None)
            if not acked_early:
                self._tickets[mid] = ticket
        if acked_early:
            ticket._complete(refusal)
        return ticket

    def acked(self, mid: int, refusal: str | None) -> None:
        """The PUBACK of ``mid`` arrived (``refusal``: the broker's reason, if it refused)."""
        with self._lock:
            ticket = self._tickets.pop(mid, None)
            if ticket is None:
                # PUBACK overtook publish() registering its ticket.
                self._early_acks[mid] = refusal
                return
        ticket._complete(refusal)

    def renumber(self, moves: Sequence[tuple[int, int]]) -> None:
        """Keep only the tickets of ``(old mid, new mid)`` pairs, filed under the new mid: the
        publishes another paho client took over and numbered afresh. A sequence, not a
        generator: publishing on that client must be done before the lock is taken."""
        with self._lock:
            old_tickets, self._tickets = self._tickets, {}
            for old_mid, new_mid in moves:
                ticket = old_tickets.get(old_mid)
                if ticket is not None:
                    self._tickets[new_mid] = ticket
