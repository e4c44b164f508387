"""The MQTT client: one connection under one client id, reconnecting by itself until `stop`.

paho's callbacks run on its network thread and stay thin: they record the connection's
steps in `ConnectionStatus`, ask `ConnectionPolicy` what to do about a refused or lost
connection, and hand messages on. ``on_message`` only enqueues an `Inbound`; with
``manual_ack=True`` the runtime calls `MqttClient.ack` once the message is durable, and an
ack for a message of an earlier connection is dropped (packet ids are reused; the broker
redelivers it anyway). Subscriptions are re-issued on every CONNACK: a broker restart or an
expired session may have lost them, and re-subscribing is harmless. TCP_NODELAY is set on
every socket paho opens: without it each request/response hop pays ~44 ms of Nagle +
delayed-ACK. A fallback to 3.1.1 builds a new paho client and moves the publishes queued
so far (and their tickets) onto it.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from service.adapters.mqtt.paho_client import (
    LeanClient,
    connect_in_background,
    move_queued_publishes,
    new_client,
    set_reconnect_delay,
    shut_down,
)
from service.adapters.mqtt.policy import ConnectionPolicy, ConnectRefusal
from service.adapters.mqtt.settings import MqttSettings, check_settings
from service.adapters.mqtt.status import ConnectionStatus, Inbound
from service.adapters.mqtt.tickets import PublishTicket, TicketBook
from service.adapters.mqtt.url import parse_mqtt_url
from service.errors import BrokerUnavailable, PermanentError

log = logging.getLogger("service.mqtt")

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

    def stop(self, *, timeout_s: float = 5.0, send_will: bool = False) -> None:
        """Disconnect and never reconnect again. Idempotent. ``send_will=True`` has the
        broker publish the will all the same (see `paho_client.shut_down`)."""
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
        connected_at = self._status.closed()
        if self._stopped:
            if self._status.connected:
                log.info("MQTT disconnected from %s", self._broker)
        elif connected_at is not None:
            self._on_connection_lost(client, flags, reason_code, connected_at)
        elif not self._status.answered:
            self._on_closed_before_connack(client, flags, reason_code)
        self._status.down()

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
