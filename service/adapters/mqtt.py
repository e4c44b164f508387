"""MQTT adapter: paho-mqtt 2.x held by composition, speaking MQTT 5 with a 3.1.1 fallback.

`MqttClient` is one connection under one client id, reconnecting by itself until `stop`;
`MqttSettings` is what it is told (the broker URL, parsed by `service.adapters.broker_url`,
the session to hold there, its will, timings), and `check_settings` refuses a combination
the client could not honour, as a `ConfigError`, before anything connects.

The client. paho's callbacks run on its network thread and stay thin: they record the
connection's steps in `ConnectionStatus`, ask `ConnectionPolicy` what to do about a refused
or lost connection, and hand messages on. ``on_message`` only enqueues an `Inbound`; with
``manual_ack=True`` the runtime calls `MqttClient.ack` once the message is durable, and an
ack for a message of an earlier connection is dropped (packet ids are reused; the broker
redelivers it anyway). Subscriptions are re-issued on every CONNACK: a broker restart or an
expired session may have lost them, and re-subscribing is harmless. TCP_NODELAY is set on
every socket paho opens: without it each request/response hop pays ~44 ms of Nagle +
delayed-ACK. A fallback to 3.1.1 builds a new paho client and moves the publishes queued
so far (and their tickets) onto it.

What the client decides. `ConnectionPolicy` is pure: fed what paho reported (reason codes,
who closed the connection, how long it lasted), it answers with what to do, and
`MqttClient` applies the answer on paho's thread. Its decisions:

- Protocol fallback. MQTT 5 is tried first, unless the URL pins a protocol. A broker that
  only speaks 3.1.1 either answers a v5 CONNECT with the 3.1.1 return code 1 ("unacceptable
  protocol version", which paho reports as reason code 0x84) or, like RabbitMQ 3.10's MQTT
  plugin, closes the socket without any CONNACK. Both switch the client to 3.1.1 for this
  and every later connect. Only a close after the whole CONNECT went out counts; a refused
  or timed-out TCP connect, or a broker that stays silent until the keep-alive runs out, is
  an ordinary outage. The switch is only taken before the first successful connect, after
  which the protocol is settled (switching then could strand concurrent publishes; a broker
  downgraded under a running client needs a restart). A CONNECT refused for any other
  reason (bad password, not authorised) is a `ConnectRefusal`.
- Takeover backoff. A fixed client id may be held by one process only; the next holder
  displaces the first, so two live processes configured with one id would fight, each
  reconnect displacing the other. mosquitto 2.0 says nothing when it hands our session to
  the newcomer (it closes our socket; MQTT 5 brokers that say it send DISCONNECT 0x8E), so a
  connection the broker closes without a reason before it lasted twice
  ``takeover_backoff_max_s`` counts as taken over: each such close in a row doubles the
  reconnect delay from ``reconnect_min_s``, up to ``takeover_backoff_max_s``, instead of
  paho's fixed short delay; any other end resets it. One silent close may be a network
  fault, so the takeover is named from the second one in a row (a 0x8E at once). A failed
  connect ends the run: another client holding our id never keeps the broker from letting us
  in, so that broker went away, and the outage backoff starts afresh.

Publish tickets. `MqttClient.publish` returns a `PublishTicket`, done once the broker's
PUBACK arrived. Publishing while disconnected is allowed: paho keeps QoS 1 messages in its
(unbounded) queue and sends them after the next CONNACK; `PublishTicket.wait` simply times
out until the PUBACK arrives. A PUBACK with a failure reason code (MQTT 5 only; e.g. 0x87
"Not authorized" from an ACL) completes the ticket as refused, with the broker's reason.
Under 3.1.1 a PUBACK carries no reason code: a broker that drops a publish it may not accept
still acknowledges it. `TicketBook` files the tickets awaiting their PUBACK by packet id.
Callbacks run on paho's network thread, where an exception would end it: `run_callback`
logs and swallows them.

What the client knows of its current connection, kept for every thread to read. paho's
network thread reports each step of a connection (`ConnectionStatus.opened`, the CONNACK's
answer, SUBACKs, the end); callers on other threads read `connected`, `subscribed` and
`refusal`, and block in `wait_connected`. ``subscribed`` turns true once the broker
acknowledged (SUBACK) every subscription of the current connection: only then is a message
published by someone else sure to reach us on a first connect, when the broker holds no
session for our client id yet. ``seq`` numbers the accepted connections, and each `Inbound`
message carries the number of the one it came on: an ack is only meaningful on that
connection, since packet ids are reused across connections.

One paho client object: made for our settings, started, and stopped for good. paho fixes the
protocol per client object, so `MqttClient` makes a new one when it falls back to 3.1.1;
`new_client`, `connect_in_background` and `shut_down` give such an object what it needs
whatever the protocol:

- ``suppress_exceptions``: a raising callback would otherwise end paho's network thread.
- An unbounded queue: publishing while disconnected keeps QoS 1 messages until the next
  CONNACK.
- Under MQTT 5 the clean start flag and the session expiry go with each CONNECT; under
  3.1.1 the clean session flag is fixed when the object is made.
- `LeanClient`: a bare PUBACK (the broker took the message; no properties) completes its
  publish without paho decoding a reason code and a properties object for it. A packet
  another thread queues is written by that thread (at the end of its `LeanClient.batch`),
  not by paho's thread woken to write it; over TLS paho's thread writes, woken once per
  batch; a packet paho's own thread queues writes it no wake-up byte. It reads the socket
  in blocks and joins the packets it writes into one send, where paho makes a system call
  per packet written and several per packet read, and it takes in a plain PUBLISH (no
  properties) without paho's decoder.
- `shut_down` makes paho stop reconnecting for good, so a holder displaced from its client
  id never grabs the id back (the ping-pong seen on mosquitto 2.0 + paho 2.2). A normal
  DISCONNECT discards the will; ``send_will`` asks the broker to publish it anyway: reason
  code 0x04 under MQTT 5; under 3.1.1 (which has no such code) the socket is closed without
  DISCONNECT.
"""


import contextlib
import logging
import queue
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import paho.mqtt.client as paho
from paho.mqtt.client import DISCONNECT, PUBACK, PUBLISH
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion, _ConnectionState
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from service.adapters.broker_url import MqttEndpoint, parse_mqtt_url
from service.errors import BrokerUnavailable, ConfigError, PermanentError

log = logging.getLogger("service.mqtt")


@dataclass(frozen=True)
class MqttSettings:
    """How to reach the broker and which session to hold there.

    ``reconnect_min_s``..``reconnect_max_s`` bound paho's doubling delay between connect
    attempts during an outage. ``takeover_backoff_max_s`` caps the doubling delay after
    connections another client with our id took over; a connection that lasted twice this
    long resets that doubling (see `ConnectionPolicy`).
    """

    url: str
    client_id: str
    clean_start: bool = True
    session_expiry_s: int = 0
    keepalive_s: int = 30
    will: tuple[str, bytes, bool] | None = None
    manual_ack: bool = False
    reconnect_min_s: float = 0.2
    reconnect_max_s: float = 10.0
    connect_timeout_s: float = 5.0
    takeover_backoff_max_s: float = 30.0


def check_settings(settings: MqttSettings) -> None:
    """Raise `ConfigError` for settings no client could honour."""
    if not settings.client_id and not settings.clean_start:
        raise ConfigError("MQTT client_id is required for a persistent session (clean_start=False)")
    if not 0 < settings.reconnect_min_s <= settings.reconnect_max_s:
        raise ConfigError("MQTT reconnect delays need 0 < reconnect_min_s <= reconnect_max_s")
    if settings.takeover_backoff_max_s < settings.reconnect_min_s:
        raise ConfigError("MQTT takeover_backoff_max_s must be >= reconnect_min_s")
    if settings.keepalive_s < 1 or settings.session_expiry_s < 0:
        raise ConfigError("MQTT keepalive_s must be >= 1 and session_expiry_s >= 0")


# MQTT 5 reason codes used here (MQTT 5.0 spec, 2.4).
UNSUPPORTED_PROTOCOL_VERSION = 0x84
SESSION_TAKEN_OVER = 0x8E
# paho's code for a connection that ended without a DISCONNECT (the peer closed the socket).
UNSPECIFIED_ERROR = 0x80
# Bad user name or password, not authorized, banned, bad authentication method; paho maps
# the 3.1.1 return codes 4 and 5 onto the first two.
_NOT_AUTHORISED = frozenset({0x86, 0x87, 0x8A, 0x8C})
# MQTT 3.1.1 CONNACK return code 1: "unacceptable protocol version".
_V311_REFUSED_PROTOCOL_VERSION = 1
_SAID_TAKEN_OVER = "handed our session to another client with the same id (DISCONNECT 0x8E)"
_CLOSED_SILENTLY = (
    "closed our connection without a reason, soon after accepting it: most "
    "likely another client connected with the same id and took the session over"
)


def fallback_protocol(current: MQTTProtocolVersion, reason_code: int) -> MQTTProtocolVersion | None:
    """The protocol to retry with after a refused CONNECT, or None to keep the current one.

    Only MQTT 5 falls back (to 3.1.1), and only when the broker said it does not speak the
    protocol: reason code 0x84, or the raw 3.1.1 return code 1 such a broker sends.
    """
    if current != MQTTProtocolVersion.MQTTv5:
        return None
    if reason_code in (UNSUPPORTED_PROTOCOL_VERSION, _V311_REFUSED_PROTOCOL_VERSION):
        return MQTTProtocolVersion.MQTTv311
    return None


@dataclass(frozen=True)
class ConnectRefusal:
    """The broker's answer to a CONNECT it refused: the MQTT 5 reason code and its text.

    Under 3.1.1 paho maps the return code onto the MQTT 5 one (4 -> 0x86, 5 -> 0x87).
    """

    code: int
    reason: str

    @property
    def not_authorised(self) -> bool:
        """Bad user name or password, not authorised, banned or a bad auth method."""
        return self.code in _NOT_AUTHORISED

    def __str__(self) -> str:
        what = "not authorised" if self.not_authorised else "refused"
        return f"{what} (the broker said: {self.reason})"


@dataclass(frozen=True)
class FailedAttempt:
    """A connect attempt that failed: its number in the outage (1 for the first), and the
    reconnect delay to restore when it ended a run of takeovers (None: leave paho's)."""

    number: int
    reset_delay_s: float | None


@dataclass(frozen=True)
class Reconnect:
    """How to go on after an established connection ended.

    ``delay_s``: wait this long before reconnecting. ``in_a_row``: takeovers in a row, this
    end included (0 when it is not one). ``takeover``: why the end is named a takeover, or
    None when it is reported as an ordinary disconnect.
    """

    delay_s: float
    in_a_row: int
    takeover: str | None


class ConnectionPolicy:
    """The protocol in use and the reconnect delays of one client; see the module docstring.

    Not thread-safe: paho calls back on one thread at a time. `fall_back` is the exception,
    since the client switches protocols under its own lock.
    """

    def __init__(
        self,
        pinned: MQTTProtocolVersion | None,
        *,
        reconnect_min_s: float,
        takeover_backoff_max_s: float,
    ) -> None:
        self._pinned = pinned is not None
        self._protocol = pinned or MQTTProtocolVersion.MQTTv5
        self._settled = False
        self._reconnect_min_s = reconnect_min_s
        self._takeover_max_s = takeover_backoff_max_s
        self._failed_attempts = 0
        self._taken_over_in_a_row = 0

    @property
    def protocol(self) -> MQTTProtocolVersion:
        """The pinned protocol, else MQTT 5 unless the broker made us fall back to 3.1.1."""
        return self._protocol

    @property
    def pinned(self) -> bool:
        return self._pinned

    @property
    def settled(self) -> bool:
        """True once a CONNECT was accepted: the protocol no longer changes."""
        return self._settled

    def connected(self) -> None:
        """A CONNECT was accepted: the protocol is settled and the outage is over."""
        self._settled = True
        self._failed_attempts = 0

    def fall_back(self, protocol: MQTTProtocolVersion) -> None:
        """Use ``protocol`` from the next connect on (one that `refused` or
        `closed_before_connack` chose)."""
        self._protocol = protocol

    def refused(self, reason_code: int, reason: str) -> MQTTProtocolVersion | ConnectRefusal:
        """After a CONNACK with a failure ``reason_code``: the protocol to fall back to, or
        the refusal to report."""
        if not self._pinned and not self._settled:
            fallback = fallback_protocol(self._protocol, reason_code)
            if fallback is not None:
                return fallback
        return ConnectRefusal(reason_code, reason)

    def closed_before_connack(
        self, *, by_disconnect_packet: bool, reason_code: int, connect_sent: bool
    ) -> MQTTProtocolVersion | None:
        """After a connection that ended with no CONNACK on it: the protocol to fall back to,
        or None for an ordinary failed attempt (count it with `failed_attempt`).

        It is the broker refusing MQTT 5 only if the broker closed the socket (not our
        keep-alive running out) after the whole CONNECT was written (``connect_sent``).
        """
        closed_by_broker = not by_disconnect_packet and reason_code == UNSPECIFIED_ERROR
        if (
            closed_by_broker
            and connect_sent
            and not self._pinned
            and not self._settled
            and self._protocol == MQTTProtocolVersion.MQTTv5
        ):
            return MQTTProtocolVersion.MQTTv311
        return None

    def failed_attempt(self) -> FailedAttempt:
        """A connect attempt failed: no TCP connection, or it ended before a CONNACK."""
        reset_delay_s = None
        if self._taken_over_in_a_row:
            self._taken_over_in_a_row = 0
            reset_delay_s = self._reconnect_min_s
        self._failed_attempts += 1
        return FailedAttempt(self._failed_attempts, reset_delay_s)

    def connection_lost(
        self, *, by_disconnect_packet: bool, reason_code: int, lasted_s: float
    ) -> Reconnect:
        """An established connection ended after ``lasted_s``, with a DISCONNECT from the
        broker (``by_disconnect_packet``) or not, for ``reason_code``."""
        said_taken_over = by_disconnect_packet and reason_code == SESSION_TAKEN_OVER
        closed_silently = (
            not by_disconnect_packet
            and reason_code == UNSPECIFIED_ERROR
            and lasted_s < 2 * self._takeover_max_s
        )
        if said_taken_over or closed_silently:
            self._taken_over_in_a_row += 1
        else:
            self._taken_over_in_a_row = 0
        in_a_row = self._taken_over_in_a_row
        delay_s = min(self._reconnect_min_s * 2 ** max(in_a_row - 1, 0), self._takeover_max_s)
        takeover = None
        if said_taken_over:
            takeover = _SAID_TAKEN_OVER
        elif in_a_row >= 2:
            takeover = _CLOSED_SILENTLY
        return Reconnect(delay_s, in_a_row, takeover)


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


@dataclass(frozen=True)
class Inbound:
    """One received PUBLISH, as handed to the runtime.

    ``connection_seq`` names the connection it arrived on: an ack is only meaningful on that
    connection, because packet ids are reused across connections.
    """

    topic: str
    payload: bytes
    qos: int
    dup: bool
    mid: int
    received_at: float
    connection_seq: int = 0


class ConnectionStatus:
    """The current connection's state; written on paho's thread, read anywhere.

    ``on_change`` hears every change of `connected` (on paho's thread, or on the thread
    that calls `down`); an exception from it is logged and swallowed.
    """

    def __init__(self, on_change: Callable[[bool], None] | None = None) -> None:
        self._on_change = on_change
        self._connected = threading.Event()
        # Notified whenever a CONNACK arrives, so `wait_connected` can stop on a refusal.
        self._connack = threading.Condition()
        self._refusal: ConnectRefusal | None = None
        self._subscribed = threading.Event()
        self._pending_subacks: set[int] = set()  # touched on paho's thread only
        self._seq = 0
        # The TCP connection in progress (paho's thread only): whether a CONNACK came on
        # it, and when a successful one did.
        self._answered = False
        self._connected_at: float | None = None

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def subscribed(self) -> bool:
        """Connected, and every subscription of this connection acknowledged (SUBACK)."""
        return self._subscribed.is_set()

    @property
    def refusal(self) -> ConnectRefusal | None:
        """Why the broker refused our last CONNECT; None once a connect succeeded."""
        return self._refusal

    @property
    def seq(self) -> int:
        """The number of the latest accepted connection (0 before the first)."""
        return self._seq

    @property
    def answered(self) -> bool:
        """Whether a CONNACK came on the TCP connection in progress."""
        return self._answered

    def wait_connected(self, timeout_s: float, *, stop_on_refusal: bool = False) -> bool:
        """True once connected, False after ``timeout_s`` (or at a refusal, if asked)."""
        if not stop_on_refusal:
            return self._connected.wait(timeout_s)
        with self._connack:
            self._connack.wait_for(
                lambda: self._connected.is_set() or self._refusal is not None, timeout_s
            )
        return self._connected.is_set()

    def wait_subscribed(self, timeout_s: float) -> bool:
        """True once connected with every subscription acknowledged, False after
        ``timeout_s``."""
        return self._subscribed.wait(timeout_s)

    def opened(self) -> None:
        """A new TCP connection: no CONNACK on it yet."""
        self._answered = False
        self._connected_at = None

    def connack(self) -> None:
        """A CONNACK came, whatever it says (call before acting on it)."""
        self._answered = True

    def refused(self, refusal: ConnectRefusal | None) -> None:
        """The CONNACK refused us: ``refusal`` to report, or None when we retry otherwise."""
        if refusal is not None:
            self._refusal = refusal
        self._notify_connack()

    def accepted(self) -> None:
        """The CONNACK accepted us: a new connection, whose subscriptions follow."""
        self._refusal = None
        self._connected_at = time.monotonic()
        self._seq += 1
        self._pending_subacks.clear()

    def awaiting_suback(self, mid: int) -> None:
        """A SUBSCRIBE (packet id ``mid``) went out on this connection."""
        self._pending_subacks.add(mid)

    def up(self) -> None:
        """The connection is ready for use: every SUBSCRIBE of it went out."""
        if not self._pending_subacks:
            self._subscribed.set()
        self._connected.set()
        self._notify_connack()
        self._notify(True)

    def suback(self, mid: int, *, granted: bool) -> bool:
        """The SUBACK of ``mid``; False if it is one of an earlier connection. A refused
        subscription stays pending: nothing will arrive on that filter, so this connection
        never counts as subscribed."""
        if mid not in self._pending_subacks:
            return False
        if granted:
            self._pending_subacks.discard(mid)
            if not self._pending_subacks:
                self._subscribed.set()
        return True

    def closed(self) -> float | None:
        """The TCP connection ended: when it was accepted (monotonic), or None if never."""
        connected_at, self._connected_at = self._connected_at, None
        return connected_at

    def down(self) -> None:
        """Not connected (after `closed`, or once the client stopped)."""
        self._subscribed.clear()
        if self._connected.is_set():
            self._connected.clear()
            self._notify(False)

    def _notify_connack(self) -> None:
        with self._connack:
            self._connack.notify_all()

    def _notify(self, connected: bool) -> None:
        callback = self._on_change
        if callback is not None:
            run_callback(lambda: callback(connected))


_QOS_WILL = 1
_PACKET_ID_LENGTH = 2
_WAKE_UP = b"0"  # the byte paho writes to its wake-up socket pair
#: How much `LeanClient` reads from its socket at once: many small packets (a burst of
#: reports, of PUBACKs) in one system call.
READ_BLOCK = 65536
#: About how much `LeanClient` joins into one send of the packets queued for the broker.
WRITE_BLOCK = 65536
_CONNECTED = _ConnectionState.MQTT_CS_CONNECTED
# MQTT 5 reason code of a DISCONNECT asking the broker to publish the will (spec, 2.4).
DISCONNECT_WITH_WILL = 0x04


# The reason codes of a PUBACK whose message the broker took, each made once: every such
# PUBACK hands these same objects to ``on_publish``, which must only read them.
PUBACK_TAKEN = {
    code: ReasonCode(PacketTypes.PUBACK, identifier=code)
    for code in (0x00, 0x10)  # Success; No matching subscribers
}
PUBACK_NO_PROPERTIES = Properties(PacketTypes.PUBACK)  # type: ignore[no-untyped-call]
# What a plain received PUBLISH (`plain_publish`) carries: under MQTT 5 this one empty
# `Properties`, and the publish-tracking object paho makes for every message though only a
# publish of ours uses it. Every such message shares them; they must only be read.
PUBLISH_NO_PROPERTIES = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
_NO_INFO = paho.MQTTMessageInfo(0)


def plain_publish(
    command: int, packet: bytes | bytearray, *, v5: bool
) -> tuple[int, bytes, bytes] | None:
    """The packet id, topic and payload of a plain PUBLISH (``packet``: what follows its
    fixed header, whose first byte is ``command``): QoS 0 or 1, a topic of one byte or more
    and, under MQTT 5, no properties (a property length of 0). None for any other, which
    paho's decoder is to read (it also raises for a malformed one)."""
    qos = (command & 0x06) >> 1
    size = len(packet)
    if qos > 1 or size < 2:
        return None
    topic_end = 2 + ((packet[0] << 8) | packet[1])
    start = topic_end + 2 * qos  # the property length under MQTT 5, else the payload
    if topic_end == 2 or start + v5 > size or (v5 and packet[start] != 0):
        return None
    mid = (packet[topic_end] << 8) | packet[topic_end + 1] if qos else 0
    return mid, bytes(packet[2:topic_end]), bytes(packet[start + v5 :])


class _Received(paho.MQTTMessage):
    """A plain received message, as paho's handler fills in its `MQTTMessage`, with the
    shared `_NO_INFO` in place of the `MQTTMessageInfo` paho would make for it."""

    def __init__(  # paho's __init__ is what this avoids: it makes the info object
        self, mid: int, topic: bytes, payload: bytes, command: int, properties: Properties | None
    ) -> None:
        self.timestamp = time.monotonic()  # paho's clock for messages
        self.state = paho.mqtt_ms_invalid
        self.dup = bool(command & 0x08)
        self.mid = mid
        self._topic = topic
        self.payload = payload
        self.qos = (command & 0x06) >> 1
        self.retain = bool(command & 0x01)
        self.info = _NO_INFO
        self.properties = properties


class LeanClient(paho.Client):
    """A paho client that spends less per message: it completes a publish on a bare PUBACK
    without decoding it, takes in a plain PUBLISH without paho's decoder (`_handle_publish`),
    reads its socket in blocks, joins the packets it writes, and has a thread that queues
    packets write them itself rather than wake its network thread to write them.

    A bare PUBACK says the broker took the message and carries no properties: its packet id
    alone (under 3.1.1 every PUBACK), or under MQTT 5 also a reason code of `PUBACK_TAKEN`,
    alone or with an empty property length (mosquitto sends the reason code). paho's decoder
    builds a `ReasonCode` and a `Properties` for each PUBACK, which cost paho's network
    thread more than the rest of its handling; here the packet id and reason code are read
    and paho's own completion (`_do_on_publish`, under its lock, as paho calls it) runs with
    the shared objects. Any other PUBACK (a refusal, properties), and every PUBCOMP, goes
    through paho's handler. This overrides a private paho method; the tests pin that a bare
    PUBACK from a real broker takes this path and completes the publish, so a paho that
    renames or reshapes it fails them instead of quietly decoding again.

    paho reads each packet with two or more system calls (its first byte, each byte of its
    length, its rest) and writes each packet with one; a burst of reports cost the ingress
    client four reads and a write per message. Here reads take up to `READ_BLOCK` bytes
    and paho's reader is served from them, and the packets queued together go out in one
    send. Both override private paho methods too (`_sock_recv`, `_packet_write`, and
    `loop_read`, which goes on while a block holds more); the tests pin each by counting
    the system calls a burst takes.

    paho wakes its network thread to write every packet another thread queues; here that
    thread writes them itself (`_write_queued`), and paho's thread is woken only for what
    the socket cannot take now. The tests pin which thread writes, and that what is left
    arrives once the broker reads again.
    """

    def _handle_pubackcomp(self, cmd: Literal["PUBACK", "PUBCOMP"]) -> MQTTErrorCode:
        packet = self._in_packet["packet"]
        reason = self._bare_puback_reason(packet) if cmd == "PUBACK" else None
        if reason is None:
            return super()._handle_pubackcomp(cmd)
        mid = (packet[0] << 8) | packet[1]
        with self._out_message_mutex:
            if mid in self._out_messages:  # a duplicate PUBACK completes nothing twice
                return self._do_on_publish(mid, reason, PUBACK_NO_PROPERTIES)
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._batch = threading.local()  # per thread: inside `batch`, and anything queued
        # held while writing to the socket: by paho's thread, or by a thread writing what it
        # queued itself (`_write_queued`)
        self._write_lock = threading.Lock()
        # bytes read from the socket ``_read_from`` and not handed to paho yet
        self._read: bytes = b""
        self._read_pos = 0
        self._read_from: object = None

    def _sock_recv(self, bufsize: int) -> bytes:
        """What paho's packet reader asks of the socket (a packet's first byte, a byte of its
        length, its rest), served from blocks of up to `READ_BLOCK` bytes read at once. The
        block belongs to one socket: a new connection starts with nothing read."""
        sock = self._sock
        if sock is not self._read_from:
            self._read, self._read_pos, self._read_from = b"", 0, sock
        if self._read_pos >= len(self._read):
            block = super()._sock_recv(READ_BLOCK)  # BlockingIOError: nothing to read now
            if not block:
                return block  # the connection ended
            self._read, self._read_pos = block, 0
        start = self._read_pos
        chunk = self._read[start : start + bufsize]
        self._read_pos = start + len(chunk)
        return chunk

    def loop_read(self, max_packets: int = 1) -> MQTTErrorCode:
        """paho's read of up to ``max_packets`` packets, again while a block read holds
        more: paho waits for the socket to be readable before it reads again, and the
        socket says nothing of packets already read from it."""
        rc = super().loop_read(max_packets)
        while (
            rc == MQTTErrorCode.MQTT_ERR_SUCCESS
            and self._sock is not None
            and self._sock is self._read_from
            and self._read_pos < len(self._read)
        ):
            rc = super().loop_read(max_packets)
        return rc

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Packets this thread queues inside (publishes, acks) wake paho's thread once, at
        the end, instead of once each: it then writes them in one pass."""
        if getattr(self._batch, "open", False):
            yield
            return
        self._batch.open, self._batch.queued = True, False
        try:
            yield
        finally:
            self._batch.open = False
            if self._batch.queued:
                self._write_queued()

    def _write_queued(self) -> None:
        """Write what this thread queued, from this thread, when paho's thread need not: on a
        plain TCP connection that is up, while no other thread writes, every packet at the
        head of the queue that paho does nothing with once written (`_plain`). Whatever is
        left (the socket full, another writer, a packet paho must complete) wakes paho's
        thread, as paho does after queueing. Waking paho's thread costs a system call and a
        pass of its loop, and the caller then waits for the interpreter lock while that
        thread writes: on a one-at-a-time round trip, a hand-off between threads for each
        message sent. A TLS socket is left to paho's thread: OpenSSL does not let two threads
        read and write one connection at once."""
        sock = self._sock
        if (
            type(sock) is socket.socket
            and self._state == _CONNECTED
            and self._write_lock.acquire(blocking=False)
        ):
            try:
                written = self._send_plain(sock, self._out_packet)
            finally:
                self._write_lock.release()
            if written:
                return
        self._wake()

    def _send_plain(self, sock: socket.socket, packets: deque[Any]) -> bool:
        """Send the plain packets at the head of ``packets``, paho's queue (joined, as
        `_packet_write` does), with the writer lock held; True once the queue is empty. A
        packet sent in part keeps its place and its position, for paho's thread to go on
        with. They go on ``sock``, the connection found up: should paho's thread close it
        meanwhile and open the next (with a new queue), a send fails on the closed one
        rather than reach the next before its CONNECT."""
        while packets and _plain(packets[0]["command"], packets[0]["qos"]):
            _join_head(packets)
            packet = packets[0]
            try:
                sent = self._sock_send(packet["packet"][packet["pos"] :], sock)
            except OSError:  # full (paho's thread waits for room) or broken (it finds out)
                return False
            packet["pos"] += sent
            packet["to_process"] -= sent
            if packet["to_process"]:
                return False
            packets.popleft()
        with self._msgtime_mutex:
            self._last_msg_out = time.monotonic()  # paho's clock for its keepalive
        return not packets

    def _wake(self) -> None:
        """What paho does after queueing a packet: one byte on its wake-up socket pair, so
        that its thread leaves ``select`` and writes."""
        sock = self._sockpairW
        if sock is not None:
            # full: a wake-up is pending anyway; closed: the client was shut down meanwhile
            with contextlib.suppress(OSError):
                sock.send(_WAKE_UP)

    def release_wake_pair(self) -> None:
        """Close the wake-up socket pair, once paho's thread has ended. paho closes it only
        when the client is collected, and a client in a reference cycle (its callbacks are
        methods of the object that holds it) leaves both sockets to the garbage collector,
        which finds them open and warns."""
        self._reset_sockets(sockpair_only=True)

    def _packet_queue(
        self,
        command: int,
        packet: bytes | bytearray,
        mid: int,
        qos: int,
        info: paho.MQTTMessageInfo | None = None,
    ) -> MQTTErrorCode:
        """Queue a packet to be written. paho then wakes its thread to write it (`_wake`).
        Here a packet queued on another thread is written by that thread (`_write_queued`),
        at once or, inside `batch`, with the rest of the batch at its end. paho's thread is
        not woken for a packet it queued itself: it computes what to wait for after handling
        what it read, and a non-empty queue makes it wait for the socket to be writable (a
        PUBACK letting the next queued publish out is queued on that thread)."""
        thread = self._thread
        if thread is None:
            return super()._packet_queue(command, packet, mid, qos, info)
        now = True
        if threading.current_thread() is thread:
            now = False
        elif getattr(self._batch, "open", False):
            self._batch.queued, now = True, False
        self._out_packet.append(
            {
                "command": command,
                "mid": mid,
                "qos": qos,
                "pos": 0,
                "to_process": len(packet),
                "packet": packet,
                "info": info,
            }
        )
        if now:
            self._write_queued()
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def _packet_write(self) -> MQTTErrorCode:
        """paho's writer (on paho's thread), with the packets at the head of the queue that
        need nothing done once written joined into one send (`_join_head`). Packets leave
        the queue only from its head, with the writer lock held (here, or in
        `_write_queued`); other threads add at its tail."""
        with self._write_lock:
            _join_head(self._out_packet)
            return super()._packet_write()

    def _sock_send(self, buf: bytes | bytearray, sock: socket.socket | None = None) -> int:
        """paho's send on its current socket, or (`_send_plain`) a send on ``sock``."""
        if sock is None:
            return super()._sock_send(buf)
        return sock.send(buf)

    def _handle_publish(self) -> MQTTErrorCode:
        """A PUBLISH received: paho's handling, without its decoder for a plain one (QoS 0 or
        1, a topic, no properties; `plain_publish`). paho builds a `Properties` for every
        MQTT 5 PUBLISH, even one with none, and an `MQTTMessageInfo` with its Condition for
        every message, which only a publish of ours uses: together more than a third of
        its thread's time in a burst of reports. Any other PUBLISH goes to paho's handler."""
        command = self._in_packet["command"]
        v5 = self._protocol == MQTTProtocolVersion.MQTTv5
        plain = plain_publish(command, self._in_packet["packet"], v5=v5)
        if plain is None:
            return super()._handle_publish()
        mid, topic, payload = plain
        message = _Received(mid, topic, payload, command, PUBLISH_NO_PROPERTIES if v5 else None)
        if self._logger is not None or self.on_log is not None:
            self._easy_log(
                paho.MQTT_LOG_DEBUG, "Received PUBLISH (d%d, q%d, r%d, m%d), %r, ...  (%d bytes)",
                message.dup, message.qos, message.retain, mid, topic, len(payload),
            )  # fmt: skip
        self._handle_on_message(message)
        if message.qos == 0 or self._manual_ack:
            return MQTTErrorCode.MQTT_ERR_SUCCESS
        return self._send_puback(mid)

    def _bare_puback_reason(self, packet: bytearray) -> ReasonCode | None:
        """The reason code of a bare PUBACK (the packet after its fixed header); None for any
        other, which paho's decoder is to read."""
        size = len(packet)
        if size == _PACKET_ID_LENGTH:
            return PUBACK_TAKEN[0x00]
        if self._protocol != MQTTProtocolVersion.MQTTv5 or size > _PACKET_ID_LENGTH + 2:
            return None
        if size == _PACKET_ID_LENGTH + 2 and packet[3] != 0:  # properties follow
            return None
        return PUBACK_TAKEN.get(packet[2])


def _join_head(packets: deque[Any]) -> None:
    """Join the packets at the head of paho's queue that need nothing done once written
    into one: PUBACKs of a batch of reports taken in, publishes let out by PUBACKs read in
    one block (up to about `WRITE_BLOCK` bytes)."""
    if len(packets) < 2:
        return
    joined, size = [], 0
    while packets and size < WRITE_BLOCK and _plain(packets[0]["command"], packets[0]["qos"]):
        joined.append(packet := packets.popleft())
        size += packet["to_process"]
    if len(joined) == 1:
        packets.appendleft(joined[0])
    elif joined:
        data = b"".join(p["packet"][p["pos"] :] for p in joined)
        packets.appendleft(
            {
                "command": PUBACK,  # a packet paho writes and then forgets
                "mid": 0,
                "qos": 1,
                "pos": 0,
                "to_process": len(data),
                "packet": data,
                "info": None,
            }
        )


def _plain(command: int, qos: int) -> bool:
    """Whether paho does nothing with a queued packet once it is written: all but a QoS 0
    PUBLISH (its publish completes then) and a DISCONNECT (the connection ends)."""
    kind = command & 0xF0
    return not ((kind == PUBLISH and qos == 0) or kind == DISCONNECT)


def new_client(
    settings: MqttSettings, endpoint: MqttEndpoint, protocol: MQTTProtocolVersion
) -> LeanClient:
    """A paho client speaking ``protocol``, with credentials, TLS and will set; no callbacks."""
    clean_session = None if protocol == MQTTProtocolVersion.MQTTv5 else settings.clean_start
    client = LeanClient(
        callback_api_version=CallbackAPIVersion.VERSION2,
        client_id=settings.client_id,
        clean_session=clean_session,
        protocol=protocol,
        manual_ack=settings.manual_ack,
    )
    client.suppress_exceptions = True
    client.max_queued_messages_set(0)
    client.connect_timeout = settings.connect_timeout_s
    set_reconnect_delay(client, settings.reconnect_min_s, settings.reconnect_max_s)
    _configure_auth(client, endpoint)
    if settings.will is not None:
        will_topic, will_payload, will_retain = settings.will
        try:
            client.will_set(will_topic, will_payload, qos=_QOS_WILL, retain=will_retain)
        except ValueError as e:
            raise ConfigError(f"MQTT will on {will_topic!r} is invalid: {e}") from e
    return client


def set_reconnect_delay(client: paho.Client, first_s: float, max_s: float) -> None:
    """paho waits ``first_s`` before the next reconnect, doubling on each failed one up to
    ``max_s`` (or ``first_s`` if that is longer)."""
    longest_s = max(first_s, max_s)
    # paho annotates the delays as int but computes with them as floats.
    client.reconnect_delay_set(cast(int, first_s), cast(int, longest_s))


def _configure_auth(client: paho.Client, endpoint: MqttEndpoint) -> None:
    if endpoint.username is not None:
        client.username_pw_set(endpoint.username, endpoint.password)
    if not endpoint.tls:
        return
    tls = endpoint.tls_options
    try:
        client.tls_set(ca_certs=tls.ca_path, certfile=tls.cert_path, keyfile=tls.key_path)
    except (OSError, ssl.SSLError, ValueError) as e:
        raise ConfigError(f"MQTT TLS files (ca/cert/key) could not be loaded: {e}") from e
    if tls.insecure:
        client.tls_insecure_set(True)


def _connect_properties(settings: MqttSettings, protocol: MQTTProtocolVersion) -> Properties | None:
    if protocol != MQTTProtocolVersion.MQTTv5 or settings.session_expiry_s <= 0:
        return None
    properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    properties.SessionExpiryInterval = settings.session_expiry_s
    return properties


def connect_in_background(
    client: paho.Client,
    settings: MqttSettings,
    endpoint: MqttEndpoint,
    protocol: MQTTProtocolVersion,
) -> None:
    """connect_async + loop_start: paho's thread connects and retries on its own."""
    clean_start: paho.CleanStartOption = (
        settings.clean_start
        if protocol == MQTTProtocolVersion.MQTTv5
        else paho.MQTT_CLEAN_START_FIRST_ONLY
    )
    client.connect_async(
        endpoint.host,
        endpoint.port,
        keepalive=settings.keepalive_s,
        clean_start=clean_start,
        properties=_connect_properties(settings, protocol),
    )
    client.loop_start()


def move_queued_publishes(old: paho.Client, new: paho.Client) -> list[tuple[int, int]]:
    """Publish on ``new`` what ``old`` still holds queued; return each message's packet id on
    ``old`` with its new one (``new`` numbers its messages afresh). QoS 0 messages, which
    paho drops while disconnected, are not queued and do not move."""
    return [
        (
            message.mid,
            new.publish(message.topic, message.payload, qos=message.qos, retain=message.retain).mid,
        )
        for message in old.drop_out_messages()
    ]


def shut_down(
    client: LeanClient, protocol: MQTTProtocolVersion, timeout_s: float, send_will: bool
) -> None:
    """Disconnect (see the module docstring for ``send_will``) and end paho's thread, so
    the client never reconnects; waits up to ``timeout_s`` for the thread, then closes the
    client's sockets."""
    if not send_will:
        client.disconnect()
    elif protocol == MQTTProtocolVersion.MQTTv5:
        client.disconnect(
            reasoncode=ReasonCode(PacketTypes.DISCONNECT, identifier=DISCONNECT_WITH_WILL)
        )
    # loop_stop sets paho's terminate flag first: no reconnect after this point.
    stopper = threading.Thread(target=client.loop_stop, name="mqtt-stop", daemon=True)
    stopper.start()
    stopper.join(timeout_s)
    if stopper.is_alive():
        log.warning("MQTT network thread did not end within %.1fs", timeout_s)
    else:
        client.release_wake_pair()
    sock = client.socket()
    if sock is not None:
        # The loop ended while a (re)connect was in flight, or 3.1.1 with send_will:
        # closing without DISCONNECT is what makes the broker publish the will.
        if not send_will and client.is_connected():
            client.disconnect()
            client.loop_write()
        _close_quietly(sock)


def _close_quietly(sock: Any) -> None:
    try:
        sock.close()
    except OSError as e:
        log.debug("closing MQTT socket: %s", e)


_QOS_SUBSCRIBE = 1


class MqttClient:
    """One MQTT connection under one client id, reconnecting by itself until `stop`."""

    def __init__(
        self,
        settings: MqttSettings,
        *,
        subscriptions: Sequence[str] = (),
        inbound: queue.SimpleQueue[Inbound] | None = None,
        on_connection_change: Callable[[bool], None] | None = None,
    ) -> None:
        check_settings(settings)
        self._settings = settings
        self._endpoint = parse_mqtt_url(settings.url)
        self._broker = f"{self._endpoint.host}:{self._endpoint.port}"
        self._subscriptions = tuple(subscriptions)
        self._inbound: queue.SimpleQueue[Inbound] = (
            inbound if inbound is not None else queue.SimpleQueue()
        )
        self._status = ConnectionStatus(on_connection_change)
        # Guards which paho client is current and the start/stop flags. The client changes
        # only on protocol fallback, before the first CONNACK; until then publish() holds
        # this lock so nothing lands on a retired client. Afterwards it must not: a ticket
        # callback publishing from paho's thread (inside paho's lock) would deadlock with it.
        self._client_lock = threading.Lock()
        self._policy = ConnectionPolicy(
            self._endpoint.protocol,
            reconnect_min_s=settings.reconnect_min_s,
            takeover_backoff_max_s=settings.takeover_backoff_max_s,
        )
        self._started = False
        self._stopped = False
        self._tickets = TicketBook()
        self._paho = self._build_paho(self._policy.protocol)

    @property
    def inbound(self) -> queue.SimpleQueue[Inbound]:
        """Where received messages are put (the queue passed in, or one made here)."""
        return self._inbound

    @property
    def connected(self) -> bool:
        return self._status.connected

    @property
    def subscribed(self) -> bool:
        """Connected, and every subscription of this connection acknowledged (SUBACK)."""
        return self._status.subscribed

    @property
    def protocol(self) -> MQTTProtocolVersion:
        """The protocol in use: the pinned one, else MQTT 5 unless the broker made us fall
        back to 3.1.1."""
        return self._policy.protocol

    @property
    def refusal(self) -> ConnectRefusal | None:
        """Why the broker refused our last CONNECT; None once a connect succeeded."""
        return self._status.refusal

    def start(self) -> None:
        """Begin connecting in the background; returns at once. Calling it twice is an error."""
        with self._client_lock:
            if self._started or self._stopped:
                raise PermanentError("MqttClient.start() may be called once, before stop()")
            self._started = True
            self._launch(self._paho)

    def wait_connected(self, timeout_s: float, *, stop_on_refusal: bool = False) -> bool:
        """True once connected, False after ``timeout_s``. With ``stop_on_refusal`` it also
        returns False as soon as the broker refuses a CONNECT (`refusal` says why); paho
        keeps retrying in the background either way."""
        return self._status.wait_connected(timeout_s, stop_on_refusal=stop_on_refusal)

    def wait_subscribed(self, timeout_s: float) -> bool:
        """True once connected with every subscription acknowledged (SUBACK), False after
        ``timeout_s``: from then on, what is published to them reaches this client."""
        return self._status.wait_subscribed(timeout_s)

    def publish(
        self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False
    ) -> PublishTicket:
        """Queue a PUBLISH; while disconnected paho keeps it and sends it after reconnecting."""
        try:
            if self._policy.settled:
                info = self._paho.publish(topic, payload, qos=qos, retain=retain)
            else:
                with self._client_lock:
                    info = self._paho.publish(topic, payload, qos=qos, retain=retain)
        except ValueError as e:
            raise PermanentError(f"cannot publish to {topic!r}: {e}") from e
        if info.rc == MQTTErrorCode.MQTT_ERR_QUEUE_SIZE:
            raise BrokerUnavailable(f"publish to {topic!r} refused: paho's queue is full")
        if info.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
            raise BrokerUnavailable(f"publish to {topic!r} failed: {paho.error_string(info.rc)}")
        return self._tickets.register(info.mid)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Publishes and acks this thread makes inside go to the network thread together:
        it is woken once, at the end, and writes them in one pass."""
        with self._paho.batch():
            yield

    def ack(self, msg: Inbound) -> None:
        """Send the PUBACK for ``msg``; a no-op unless manual_ack and still on its connection."""
        if not self._settings.manual_ack or msg.qos == 0:
            return
        client = self._paho
        if not client.is_connected() or msg.connection_seq != self._status.seq:
            log.debug("not acking mid %d: its connection is gone (broker will redeliver)", msg.mid)
            return
        client.ack(msg.mid, msg.qos)

    def ack_all(self, msgs: Sequence[Inbound]) -> None:
        """`ack` each of these messages, in one batch (one wake-up of the network thread)."""
        with self.batch():
            for msg in msgs:
                self.ack(msg)

    def stop(self, *, timeout_s: float = 5.0, send_will: bool = False) -> None:
        """Disconnect and never reconnect again. Idempotent. ``send_will=True`` has the
        broker publish the will all the same (see `shut_down`)."""
        with self._client_lock:
            if self._stopped:
                return
            self._stopped = True
            client = self._paho
            started = self._started
        if started:
            shut_down(client, self._policy.protocol, timeout_s, send_will)
        self._status.down()
        log.info("MQTT client %s stopped", self._settings.client_id)

    # -- construction ---------------------------------------------------------------------

    def _build_paho(self, protocol: MQTTProtocolVersion) -> LeanClient:
        client = new_client(self._settings, self._endpoint, protocol)
        client.on_socket_open = self._on_socket_open
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        client.on_subscribe = self._on_subscribe
        return client

    def _launch(self, client: paho.Client) -> None:
        protocol = self._policy.protocol
        connect_in_background(client, self._settings, self._endpoint, protocol)
        log.info(
            "MQTT connecting to %s:%d as %s (%s%s)",
            self._endpoint.host,
            self._endpoint.port,
            self._settings.client_id,
            protocol.name,
            ", pinned by the URL" if self._policy.pinned else "",
        )

    def _set_reconnect_delay(self, client: paho.Client, first_s: float) -> None:
        set_reconnect_delay(client, first_s, self._settings.reconnect_max_s)

    # -- paho callbacks (network thread: never block) -------------------------------------

    def _on_socket_open(self, _client: paho.Client, _userdata: Any, sock: Any) -> None:
        # A new TCP connection: no CONNACK on it yet; our CONNECT is queued right after this.
        self._status.opened()
        if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _on_connect(
        self,
        client: paho.Client,
        _userdata: Any,
        flags: paho.ConnectFlags,
        reason_code: ReasonCode,
        _properties: Properties | None,
    ) -> None:
        self._status.connack()
        if reason_code.is_failure:
            self._status.refused(self._on_refused(client, reason_code))
            return
        self._policy.connected()
        self._status.accepted()
        for topic in self._subscriptions:
            _result, mid = client.subscribe(topic, qos=_QOS_SUBSCRIBE)
            if mid is not None:
                self._status.awaiting_suback(mid)
        log.info(
            "MQTT connected to %s:%d as %s (%s, session present: %s)",
            self._endpoint.host,
            self._endpoint.port,
            self._settings.client_id,
            self._policy.protocol.name,
            flags.session_present,
        )
        self._status.up()

    def _on_connect_fail(self, client: paho.Client, _userdata: Any) -> None:
        # No TCP connection (refused, unreachable, timed out): no CONNECT went out.
        self._count_failed_attempt(client, f"cannot reach {self._broker}")

    def _count_failed_attempt(self, client: paho.Client, what: str) -> None:
        """Warn once per outage; paho keeps retrying every reconnect_min_s..reconnect_max_s.
        A failed attempt also ends a run of takeovers (see `ConnectionPolicy`)."""
        attempt = self._policy.failed_attempt()
        if attempt.reset_delay_s is not None:
            self._set_reconnect_delay(client, attempt.reset_delay_s)
        level = logging.WARNING if attempt.number == 1 else logging.DEBUG
        log.log(level, "MQTT %s (attempt %d); retrying", what, attempt.number)

    def _on_refused(self, client: paho.Client, reason_code: ReasonCode) -> ConnectRefusal | None:
        """Fall back to another protocol, or return the refusal to report."""
        answer = self._policy.refused(reason_code.value, str(reason_code))
        if not isinstance(answer, ConnectRefusal):
            self._fall_back(client, answer, f"answered our CONNECT with {reason_code}")
            return None
        log.warning(
            "MQTT broker %s refused client %s: %s", self._broker, self._settings.client_id, answer
        )
        return answer

    def _fall_back(self, client: paho.Client, fallback: MQTTProtocolVersion, why: str) -> None:
        log.warning(
            "MQTT broker %s %s: it does not speak %s; client %s switches to %s for this "
            "and every later connect (pin one with ?protocol=5 or ?protocol=3.1.1 in the URL)",
            self._broker,
            why,
            self._policy.protocol.name,
            self._settings.client_id,
            fallback.name,
        )
        # The old client's thread (we are on it) must not reconnect with the old protocol; a
        # new client takes over. disconnect() alone is not enough after a lost connection:
        # paho marks the state "connection lost" once this callback returns, and retries.
        client.disconnect()
        client.loop_stop()  # on its own thread: only sets the terminate flag
        with self._client_lock:
            if self._stopped:
                return
            self._policy.fall_back(fallback)
            self._paho = self._build_paho(fallback)
            # tickets of QoS 0 publishes, which paho drops while disconnected, are left behind
            self._tickets.renumber(move_queued_publishes(client, self._paho))
            self._launch(self._paho)

    def _on_disconnect(
        self,
        client: paho.Client,
        _userdata: Any,
        flags: paho.DisconnectFlags,
        reason_code: ReasonCode,
        _properties: Properties | None,
    ) -> None:
        if client is not self._paho:
            return
        was_connected = self._status.connected
        connected_at = self._status.closed()
        # Down before acting on the close: a fallback launches the next client, whose own
        # thread may be up before this callback returns.
        self._status.down()
        if self._stopped:
            if was_connected:
                log.info("MQTT disconnected from %s", self._broker)
        elif connected_at is not None:
            self._on_connection_lost(client, flags, reason_code, connected_at)
        elif not self._status.answered:
            self._on_closed_before_connack(client, flags, reason_code)

    def _on_closed_before_connack(
        self, client: paho.Client, flags: paho.DisconnectFlags, reason_code: ReasonCode
    ) -> None:
        """The TCP connection was accepted but ended with no CONNACK on it. The whole CONNECT
        went out if paho's write queue, which held it first, is empty."""
        fallback = self._policy.closed_before_connack(
            by_disconnect_packet=flags.is_disconnect_packet_from_server,
            reason_code=reason_code.value,
            connect_sent=not client.want_write(),
        )
        if fallback is not None:
            self._fall_back(
                client,
                fallback,
                "closed the connection after our MQTT 5 CONNECT without answering it",
            )
            return
        self._count_failed_attempt(
            client, f"broker {self._broker} closed the connection before CONNACK ({reason_code})"
        )

    def _on_connection_lost(
        self,
        client: paho.Client,
        flags: paho.DisconnectFlags,
        reason_code: ReasonCode,
        connected_at: float,
    ) -> None:
        """Log why, and set the delay before paho reconnects (see `ConnectionPolicy`)."""
        lasted_s = time.monotonic() - connected_at
        reconnect = self._policy.connection_lost(
            by_disconnect_packet=flags.is_disconnect_packet_from_server,
            reason_code=reason_code.value,
            lasted_s=lasted_s,
        )
        self._set_reconnect_delay(client, reconnect.delay_s)
        if reconnect.takeover is None:
            log.warning(
                "MQTT disconnected from %s after %.1fs: %s", self._broker, lasted_s, reason_code
            )
            return
        log.warning(
            "MQTT broker %s %s; client id %s, connected for %.1fs, %d such close(s) in a "
            "row; reconnecting in %.1fs. Give each process its own client id.",
            self._broker,
            reconnect.takeover,
            self._settings.client_id,
            lasted_s,
            reconnect.in_a_row,
            reconnect.delay_s,
        )

    def _on_subscribe(
        self,
        _client: paho.Client,
        _userdata: Any,
        mid: int,
        reason_codes: list[ReasonCode],
        _properties: Properties | None,
    ) -> None:
        refused = [str(code) for code in reason_codes if code.is_failure]
        # a SUBACK of an earlier connection is not ours to report
        if self._status.suback(mid, granted=not refused) and refused:
            log.error("MQTT broker refused a subscription of %s: %s",
                      self._settings.client_id, ", ".join(refused))  # fmt: skip

    def _on_message(self, _client: paho.Client, _userdata: Any, msg: paho.MQTTMessage) -> None:
        item = Inbound(
            topic=msg.topic,
            payload=bytes(msg.payload),
            qos=msg.qos,
            dup=bool(msg.dup),
            mid=msg.mid,
            received_at=time.time(),
            connection_seq=self._status.seq,
        )
        self._inbound.put(item)  # unbounded; with manual acks the broker's in-flight cap bounds it

    def _on_publish(
        self,
        _client: paho.Client,
        _userdata: Any,
        mid: int,
        reason_code: ReasonCode,
        _properties: Properties,
    ) -> None:
        refusal = str(reason_code) if reason_code.is_failure else None
        if refusal is not None:
            # the broker took the message and dropped it (an ACL refusal: 0x87); retrying
            # cannot help, so the ticket completes as refused, and the loss is logged
            log.error(
                "MQTT broker refused publish %d from %s: %s",
                mid,
                self._settings.client_id,
                refusal,
            )
        self._tickets.acked(mid, refusal)
