"""MQTT adapter: paho-mqtt 2.x held by composition, speaking MQTT 5 with a 3.1.1 fallback.

Why it looks the way it does:

- paho's callbacks run on its network thread, so ``on_message`` only enqueues an `Inbound`;
  the runtime does the real work elsewhere and, with ``manual_ack=True``, calls `ack` only
  once the message is durable in Redis.
- Subscriptions are re-issued on every CONNACK: a broker restart or an expired session may
  have lost them, and re-subscribing to an existing subscription is harmless.
- A fixed client id may be held by one process only; the next holder displaces the first.
  `MqttClient.stop` therefore makes paho stop reconnecting for good, so a displaced holder
  never grabs the id back (the ping-pong seen on mosquitto 2.0 + paho 2.2).
- Two live processes configured with one client id would still fight: each reconnect
  displaces the other. mosquitto 2.0 says nothing when it hands our session to the newcomer
  (it closes our socket; MQTT 5 brokers that say it send DISCONNECT 0x8E), so a connection
  the broker closes without a reason soon after accepting it counts as taken over: each such
  close in a row doubles the reconnect delay, up to ``takeover_backoff_max_s``, instead of
  paho's fixed short delay, and from the second one (the first may be a network fault) the
  log names the takeover. A failed connect ends the run: that broker went away.
- TCP_NODELAY is set on every socket paho opens: without it each request/response hop pays
  ~44 ms of Nagle + delayed-ACK.
- Publishing while disconnected is allowed: paho keeps QoS 1 messages in its (unbounded)
  queue and sends them after the next CONNACK; `PublishTicket.wait` simply times out until
  the PUBACK arrives. A PUBACK with a failure reason code (MQTT 5 only; e.g. 0x87 "Not
  authorized" from an ACL) completes the ticket as refused, with the broker's reason.
- MQTT 5 is tried first, unless the URL pins a protocol (``?protocol=5`` or
  ``?protocol=3.1.1``). A broker that only speaks 3.1.1 either answers a v5 CONNECT with the
  3.1.1 return code 1 ("unacceptable protocol version", which paho reports as reason code
  0x84) or, like RabbitMQ 3.10's MQTT plugin, closes the socket without any CONNACK. Both
  switch the client to 3.1.1 for this and every later connect. Only a close after the whole
  CONNECT went out counts; a refused or timed-out TCP connect, or a broker that stays
  silent until the keep-alive runs out, is an ordinary outage. paho fixes the protocol per
  client object, so the switch builds a new one (and moves publishes queued so far onto
  it); it is only taken before the first successful connect, after which the protocol is
  settled. A CONNECT refused for any other reason (bad password, not authorised) is kept
  in `MqttClient.refusal` for callers to report.
- Under 3.1.1 everything above works the same except that a PUBACK carries no reason code:
  a broker that drops a publish it may not accept still acknowledges it.
- Acks are dropped for messages from an earlier connection (`Inbound.connection_seq`):
  packet ids restart or get reused there, and the broker redelivers the message anyway.
- `subscribed` turns true once the broker acknowledged (SUBACK) every subscription of the
  current connection: only then is a message published by someone else sure to reach us on
  a first connect, when the broker holds no session for our client id yet.
"""

from __future__ import annotations

import logging
import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast
from urllib.parse import parse_qsl, unquote, urlsplit

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from service.errors import BrokerUnavailable, ConfigError, PermanentError
from service.urls import redact_url

log = logging.getLogger("service.mqtt")

DEFAULT_PORT = 1883
DEFAULT_TLS_PORT = 8883
_QOS_SUBSCRIBE = 1
_QOS_WILL = 1
# MQTT 5 reason codes used here (MQTT 5.0 spec, 2.4).
UNSUPPORTED_PROTOCOL_VERSION = 0x84
DISCONNECT_WITH_WILL = 0x04
SESSION_TAKEN_OVER = 0x8E
# paho's code for a connection that ended without a DISCONNECT (the peer closed the socket).
_UNSPECIFIED_ERROR = 0x80
# Bad user name or password, not authorized, banned, bad authentication method; paho maps
# the 3.1.1 return codes 4 and 5 onto the first two.
_NOT_AUTHORISED = frozenset({0x86, 0x87, 0x8A, 0x8C})
# MQTT 3.1.1 CONNACK return code 1: "unacceptable protocol version".
_V311_REFUSED_PROTOCOL_VERSION = 1
_TLS_QUERY_KEYS = frozenset({"ca", "cert", "key", "insecure"})
_QUERY_KEYS = frozenset({*_TLS_QUERY_KEYS, "protocol"})
# What ``?protocol=`` accepts.
PROTOCOL_WORDS: dict[str, MQTTProtocolVersion] = {
    "5": MQTTProtocolVersion.MQTTv5,
    "5.0": MQTTProtocolVersion.MQTTv5,
    "3.1.1": MQTTProtocolVersion.MQTTv311,
    "311": MQTTProtocolVersion.MQTTv311,
}
_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})


@dataclass(frozen=True)
class MqttSettings:
    """How to reach the broker and which session to hold there."""

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
    # Cap of the doubling reconnect delay after connections the broker took over (see
    # the module docstring); a connection that lasted twice this long resets the doubling.
    takeover_backoff_max_s: float = 30.0


@dataclass(frozen=True)
class TlsOptions:
    """TLS files from the URL query (``ca=``, ``cert=``, ``key=``, ``insecure=1``).

    ``insecure`` follows mosquitto_sub's ``--insecure``: the certificate chain is still
    verified, only the host name check is skipped.
    """

    ca_path: str | None = None
    cert_path: str | None = None
    key_path: str | None = None
    insecure: bool = False


class MqttEndpoint(NamedTuple):
    """The parsed broker URL.

    ``protocol`` is the one ``?protocol=`` pins, or None to try MQTT 5 and fall back to 3.1.1.
    """

    host: str
    port: int
    username: str | None
    password: str | None
    tls: bool
    tls_options: TlsOptions
    protocol: MQTTProtocolVersion | None = None


def _url_error(url: str, problem: str) -> ConfigError:
    return ConfigError(f"MQTT URL {redact_url(url)!r}: {problem}")


def _parse_flag(url: str, name: str, value: str) -> bool:
    word = value.strip().lower()
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    raise _url_error(url, f"{name}= must be 1 or 0, not {value!r}")


def _parse_query(url: str, query: str) -> dict[str, str]:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise _url_error(url, "the query string is malformed") from None
    options: dict[str, str] = {}
    for name, value in pairs:
        if name not in _QUERY_KEYS:
            raise _url_error(
                url,
                f"unknown query parameter {name!r} (allowed: ca, cert, key, insecure, protocol)",
            )
        if name in options:
            raise _url_error(url, f"query parameter {name!r} given twice")
        options[name] = value
    return options


def _tls_options(url: str, options: dict[str, str], tls: bool) -> TlsOptions:
    if not tls and not _TLS_QUERY_KEYS.isdisjoint(options):
        raise _url_error(url, "ca=, cert=, key= and insecure= need the mqtts:// scheme")
    if ("cert" in options) != ("key" in options):
        raise _url_error(url, "cert= and key= must be given together")
    return TlsOptions(
        ca_path=options.get("ca") or None,
        cert_path=options.get("cert") or None,
        key_path=options.get("key") or None,
        insecure=_parse_flag(url, "insecure", options.get("insecure", "")),
    )


def _protocol_option(url: str, options: dict[str, str]) -> MQTTProtocolVersion | None:
    if "protocol" not in options:
        return None
    word = options["protocol"].strip().lower()
    if word not in PROTOCOL_WORDS:
        allowed = ", ".join(PROTOCOL_WORDS)
        raise _url_error(url, f"protocol= must be one of {allowed}, not {options['protocol']!r}")
    return PROTOCOL_WORDS[word]


def parse_mqtt_url(url: str) -> MqttEndpoint:
    """Split ``mqtt[s]://[user:pass@]host[:port][?ca=..&cert=..&key=..&insecure=1&protocol=5]``.

    ``protocol=5`` (or ``5.0``) and ``protocol=3.1.1`` (or ``311``) pin the MQTT version:
    no fallback. Raises `ConfigError` naming the problem; the message shows the URL with its
    password masked and the exception is raised ``from None`` so no library message leaks it.
    """
    try:
        parts = urlsplit(url.strip())
        scheme = parts.scheme.lower()
        host = parts.hostname
        port = parts.port
    except ValueError:
        raise _url_error(url, "not a valid URL (port must be a number in 1..65535)") from None
    if scheme not in ("mqtt", "mqtts"):
        raise _url_error(url, f"unsupported scheme {scheme or '(none)'!r}; use mqtt:// or mqtts://")
    if not host:
        raise _url_error(url, "no host")
    if parts.path not in ("", "/") or parts.fragment:
        raise _url_error(url, "an MQTT URL takes no path or fragment")
    if port == 0:
        raise _url_error(url, "port must be in 1..65535")
    tls = scheme == "mqtts"
    username = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    options = _parse_query(url, parts.query)
    return MqttEndpoint(
        host=host,
        port=port or (DEFAULT_TLS_PORT if tls else DEFAULT_PORT),
        username=username or None,
        password=password,
        tls=tls,
        tls_options=_tls_options(url, options, tls),
        protocol=_protocol_option(url, options),
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
        _run_callback(fn)

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
            _run_callback(fn)


def _check_settings(settings: MqttSettings) -> None:
    if not settings.client_id and not settings.clean_start:
        raise ConfigError("MQTT client_id is required for a persistent session (clean_start=False)")
    if not 0 < settings.reconnect_min_s <= settings.reconnect_max_s:
        raise ConfigError("MQTT reconnect delays need 0 < reconnect_min_s <= reconnect_max_s")
    if settings.takeover_backoff_max_s < settings.reconnect_min_s:
        raise ConfigError("MQTT takeover_backoff_max_s must be >= reconnect_min_s")
    if settings.keepalive_s < 1 or settings.session_expiry_s < 0:
        raise ConfigError("MQTT keepalive_s must be >= 1 and session_expiry_s >= 0")


def _run_callback(fn: Callable[[], None]) -> None:
    """Call a user callback; an exception must never reach (and kill) paho's thread."""
    try:
        fn()
    except Exception:
        log.exception("MQTT callback %r failed", fn)


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
        _check_settings(settings)
        self._settings = settings
        self._endpoint = parse_mqtt_url(settings.url)
        self._broker = f"{self._endpoint.host}:{self._endpoint.port}"
        self._subscriptions = tuple(subscriptions)
        self._inbound: queue.SimpleQueue[Inbound] = (
            inbound if inbound is not None else queue.SimpleQueue()
        )
        self._on_connection_change = on_connection_change
        # Guards which paho client is current and the start/stop flags. The client changes
        # only on protocol fallback, before the first CONNACK; until then publish() holds
        # this lock so nothing lands on a retired client. Afterwards it must not: a ticket
        # callback publishing from paho's thread (inside paho's lock) would deadlock with it.
        self._client_lock = threading.Lock()
        self._protocol_settled = False
        # Guards the ticket maps; taken inside paho's own locks (on_publish), so nothing may
        # be acquired while holding it.
        self._tickets_lock = threading.Lock()
        self._pinned = self._endpoint.protocol is not None
        self._protocol = self._endpoint.protocol or MQTTProtocolVersion.MQTTv5
        self._started = False
        self._stopped = False
        self._connected = threading.Event()
        # Notified whenever a CONNACK arrives, so `wait_connected` can stop on a refusal.
        self._connack = threading.Condition()
        self._refusal: ConnectRefusal | None = None
        self._subscribed = threading.Event()
        self._pending_subacks: set[int] = set()  # touched on paho's thread only
        self._connection_seq = 0
        self._connect_failures = 0
        # The TCP connection in progress (written and read on paho's thread only): whether a
        # CONNACK came on it, and when a successful one did.
        self._answered = False
        self._connected_at: float | None = None
        self._taken_over_in_a_row = 0
        self._tickets: dict[int, PublishTicket] = {}
        self._early_acks: dict[int, str | None] = {}
        self._paho = self._build_paho(self._protocol)

    @property
    def inbound(self) -> queue.SimpleQueue[Inbound]:
        """Where received messages are put (the queue passed in, or one made here)."""
        return self._inbound

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def subscribed(self) -> bool:
        """Connected, and every subscription of this connection acknowledged (SUBACK)."""
        return self._subscribed.is_set()

    @property
    def protocol(self) -> MQTTProtocolVersion:
        """The protocol in use: the pinned one, else MQTT 5 unless the broker made us fall
        back to 3.1.1."""
        return self._protocol

    @property
    def refusal(self) -> ConnectRefusal | None:
        """Why the broker refused our last CONNECT; None once a connect succeeded."""
        return self._refusal

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
        if not stop_on_refusal:
            return self._connected.wait(timeout_s)
        with self._connack:
            self._connack.wait_for(
                lambda: self._connected.is_set() or self._refusal is not None, timeout_s
            )
        return self._connected.is_set()

    def publish(
        self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False
    ) -> PublishTicket:
        """Queue a PUBLISH; while disconnected paho keeps it and sends it after reconnecting."""
        try:
            if self._protocol_settled:
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
        return self._register_ticket(info.mid)

    def ack(self, msg: Inbound) -> None:
        """Send the PUBACK for ``msg``; a no-op unless manual_ack and still on its connection."""
        if not self._settings.manual_ack or msg.qos == 0:
            return
        client = self._paho
        if not client.is_connected() or msg.connection_seq != self._connection_seq:
            log.debug("not acking mid %d: its connection is gone (broker will redeliver)", msg.mid)
            return
        client.ack(msg.mid, msg.qos)

    def stop(self, *, timeout_s: float = 5.0, send_will: bool = False) -> None:
        """Disconnect and never reconnect again. Idempotent.

        A normal DISCONNECT discards the will. ``send_will=True`` asks the broker to publish
        it anyway: reason code 0x04 under MQTT 5; under 3.1.1 (which has no such code) the
        socket is closed without DISCONNECT.
        """
        with self._client_lock:
            if self._stopped:
                return
            self._stopped = True
            client = self._paho
            started = self._started
        if started:
            self._shut_down(client, timeout_s, send_will)
        self._mark_disconnected()
        log.info("MQTT client %s stopped", self._settings.client_id)

    # -- construction ---------------------------------------------------------------------

    def _build_paho(self, protocol: MQTTProtocolVersion) -> paho.Client:
        settings = self._settings
        clean_session = None if protocol == MQTTProtocolVersion.MQTTv5 else settings.clean_start
        client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=settings.client_id,
            clean_session=clean_session,
            protocol=protocol,
            manual_ack=settings.manual_ack,
        )
        # A raising callback would otherwise end paho's network thread.
        client.suppress_exceptions = True
        client.max_queued_messages_set(0)
        client.connect_timeout = settings.connect_timeout_s
        self._set_reconnect_delay(client, settings.reconnect_min_s)
        self._configure_auth(client)
        if settings.will is not None:
            will_topic, will_payload, will_retain = settings.will
            try:
                client.will_set(will_topic, will_payload, qos=_QOS_WILL, retain=will_retain)
            except ValueError as e:
                raise ConfigError(f"MQTT will on {will_topic!r} is invalid: {e}") from e
        client.on_socket_open = self._on_socket_open
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        client.on_subscribe = self._on_subscribe
        return client

    def _set_reconnect_delay(self, client: paho.Client, first_s: float) -> None:
        """paho waits ``first_s`` before the next reconnect, doubling on each failed one."""
        longest_s = max(first_s, self._settings.reconnect_max_s)
        # paho annotates the delays as int but computes with them as floats.
        client.reconnect_delay_set(cast(int, first_s), cast(int, longest_s))

    def _configure_auth(self, client: paho.Client) -> None:
        endpoint = self._endpoint
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

    def _connect_properties(self, protocol: MQTTProtocolVersion) -> Properties | None:
        if protocol != MQTTProtocolVersion.MQTTv5 or self._settings.session_expiry_s <= 0:
            return None
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = self._settings.session_expiry_s
        return properties

    def _launch(self, client: paho.Client) -> None:
        """connect_async + loop_start: paho's thread connects and retries on its own."""
        protocol = self._protocol
        clean_start: paho.CleanStartOption = (
            self._settings.clean_start
            if protocol == MQTTProtocolVersion.MQTTv5
            else paho.MQTT_CLEAN_START_FIRST_ONLY
        )
        client.connect_async(
            self._endpoint.host,
            self._endpoint.port,
            keepalive=self._settings.keepalive_s,
            clean_start=clean_start,
            properties=self._connect_properties(protocol),
        )
        client.loop_start()
        log.info(
            "MQTT connecting to %s:%d as %s (%s%s)",
            self._endpoint.host,
            self._endpoint.port,
            self._settings.client_id,
            protocol.name,
            ", pinned by the URL" if self._pinned else "",
        )

    # -- shutdown -------------------------------------------------------------------------

    def _shut_down(self, client: paho.Client, timeout_s: float, send_will: bool) -> None:
        v5 = self._protocol == MQTTProtocolVersion.MQTTv5
        if not send_will:
            client.disconnect()
        elif v5:
            client.disconnect(
                reasoncode=ReasonCode(PacketTypes.DISCONNECT, identifier=DISCONNECT_WITH_WILL)
            )
        # loop_stop sets paho's terminate flag first: no reconnect after this point.
        stopper = threading.Thread(target=client.loop_stop, name="mqtt-stop", daemon=True)
        stopper.start()
        stopper.join(timeout_s)
        if stopper.is_alive():
            log.warning("MQTT network thread did not end within %.1fs", timeout_s)
        sock = client.socket()
        if sock is not None:
            # The loop ended while a (re)connect was in flight, or 3.1.1 with send_will:
            # closing without DISCONNECT is what makes the broker publish the will.
            if not send_will and client.is_connected():
                client.disconnect()
                client.loop_write()
            _close_quietly(sock)

    # -- paho callbacks (network thread: never block) -------------------------------------

    def _on_socket_open(self, _client: paho.Client, _userdata: Any, sock: Any) -> None:
        # A new TCP connection: no CONNACK on it yet; our CONNECT is queued right after this.
        self._answered = False
        self._connected_at = None
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
        self._answered = True
        if reason_code.is_failure:
            self._on_refused(client, reason_code)
            self._notify_connack()
            return
        self._refusal = None
        self._protocol_settled = True
        self._connected_at = time.monotonic()
        self._connection_seq += 1
        self._connect_failures = 0
        self._pending_subacks.clear()
        for topic in self._subscriptions:
            _result, mid = client.subscribe(topic, qos=_QOS_SUBSCRIBE)
            if mid is not None:
                self._pending_subacks.add(mid)
        if not self._pending_subacks:
            self._subscribed.set()
        log.info(
            "MQTT connected to %s:%d as %s (%s, session present: %s)",
            self._endpoint.host,
            self._endpoint.port,
            self._settings.client_id,
            self._protocol.name,
            flags.session_present,
        )
        self._connected.set()
        self._notify_connack()
        self._notify(True)

    def _on_connect_fail(self, client: paho.Client, _userdata: Any) -> None:
        # No TCP connection (refused, unreachable, timed out): no CONNECT went out.
        self._count_failed_attempt(client, f"cannot reach {self._broker}")

    def _count_failed_attempt(self, client: paho.Client, what: str) -> None:
        """Warn once per outage; paho keeps retrying every reconnect_min_s..reconnect_max_s.

        A failed attempt also ends a run of takeovers: another client holding our id never
        keeps the broker from letting us in, so the broker itself went away, and the outage
        backoff starts afresh.
        """
        if self._taken_over_in_a_row:
            self._taken_over_in_a_row = 0
            self._set_reconnect_delay(client, self._settings.reconnect_min_s)
        self._connect_failures += 1
        level = logging.WARNING if self._connect_failures == 1 else logging.DEBUG
        log.log(level, "MQTT %s (attempt %d); retrying", what, self._connect_failures)

    def _on_refused(self, client: paho.Client, reason_code: ReasonCode) -> None:
        fallback = None if self._pinned else fallback_protocol(self._protocol, reason_code.value)
        if fallback is None or self._protocol_settled:
            # After a successful connect the protocol stays: switching clients then could
            # strand concurrent publishes. A broker downgraded under us needs a restart.
            self._refusal = ConnectRefusal(reason_code.value, str(reason_code))
            log.warning(
                "MQTT broker %s refused client %s: %s",
                self._broker,
                self._settings.client_id,
                self._refusal,
            )
            return
        self._fall_back(client, fallback, f"answered our CONNECT with {reason_code}")

    def _fall_back(self, client: paho.Client, fallback: MQTTProtocolVersion, why: str) -> None:
        log.warning(
            "MQTT broker %s %s: it does not speak %s; client %s switches to %s for this "
            "and every later connect (pin one with ?protocol=5 or ?protocol=3.1.1 in the URL)",
            self._broker,
            why,
            self._protocol.name,
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
            self._protocol = fallback
            self._paho = self._build_paho(fallback)
            self._move_queued_publishes(client, self._paho)
            self._launch(self._paho)

    def _move_queued_publishes(self, old: paho.Client, new: paho.Client) -> None:
        """Carry publishes queued before the fallback over to the new client, tickets too.

        The new client numbers its messages afresh, so tickets are re-keyed; QoS 0 ones,
        which paho drops while disconnected, could never complete and are left behind.
        """
        moved = [
            (
                message.mid,
                new.publish(
                    message.topic, message.payload, qos=message.qos, retain=message.retain
                ).mid,
            )
            for message in old.drop_out_messages()
        ]
        with self._tickets_lock:
            old_tickets, self._tickets = self._tickets, {}
            for old_mid, new_mid in moved:
                ticket = old_tickets.get(old_mid)
                if ticket is not None:
                    self._tickets[new_mid] = ticket

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
        connected_at, self._connected_at = self._connected_at, None
        if self._stopped:
            if self._connected.is_set():
                log.info("MQTT disconnected from %s", self._broker)
        elif connected_at is not None:
            self._on_connection_lost(client, flags, reason_code, connected_at)
        elif not self._answered:
            self._on_closed_before_connack(client, flags, reason_code)
        self._mark_disconnected()

    def _on_closed_before_connack(
        self, client: paho.Client, flags: paho.DisconnectFlags, reason_code: ReasonCode
    ) -> None:
        """The TCP connection was accepted but ended with no CONNACK on it.

        It counts as the broker refusing MQTT 5 only if the broker closed it (not our
        keep-alive running out) after the whole CONNECT was written: paho's write queue,
        which held the CONNECT first, is empty.
        """
        closed_by_broker = (
            not flags.is_disconnect_packet_from_server
            and reason_code.value == _UNSPECIFIED_ERROR
            and not client.want_write()
        )
        if (
            closed_by_broker
            and not self._pinned
            and not self._protocol_settled
            and self._protocol == MQTTProtocolVersion.MQTTv5
        ):
            self._fall_back(
                client,
                MQTTProtocolVersion.MQTTv311,
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
        """Log why, and pick the delay before paho reconnects.

        A connection the broker handed to another client with our id (DISCONNECT 0x8E, or
        closed without a reason before it lasted twice the backoff cap) doubles the delay
        each time in a row, up to the cap; any other end resets it. One silent close may be
        a network fault, so the takeover is named from the second one in a row.
        """
        lasted_s = time.monotonic() - connected_at
        said_taken_over = (
            flags.is_disconnect_packet_from_server and reason_code.value == SESSION_TAKEN_OVER
        )
        closed_silently = (
            not flags.is_disconnect_packet_from_server
            and reason_code.value == _UNSPECIFIED_ERROR
            and lasted_s < 2 * self._settings.takeover_backoff_max_s
        )
        if said_taken_over or closed_silently:
            self._taken_over_in_a_row += 1
        else:
            self._taken_over_in_a_row = 0
        in_a_row = self._taken_over_in_a_row
        delay_s = min(
            self._settings.reconnect_min_s * 2 ** max(in_a_row - 1, 0),
            self._settings.takeover_backoff_max_s,
        )
        self._set_reconnect_delay(client, delay_s)
        if not (said_taken_over or in_a_row >= 2):
            log.warning(
                "MQTT disconnected from %s after %.1fs: %s", self._broker, lasted_s, reason_code
            )
            return
        why = (
            "handed our session to another client with the same id (DISCONNECT 0x8E)"
            if said_taken_over
            else "closed our connection without a reason, soon after accepting it: most "
            "likely another client connected with the same id and took the session over"
        )
        log.warning(
            "MQTT broker %s %s; client id %s, connected for %.1fs, %d such close(s) in a "
            "row; reconnecting in %.1fs. Give each process its own client id.",
            self._broker,
            why,
            self._settings.client_id,
            lasted_s,
            in_a_row,
            delay_s,
        )

    def _on_subscribe(
        self,
        _client: paho.Client,
        _userdata: Any,
        mid: int,
        reason_codes: list[ReasonCode],
        _properties: Properties | None,
    ) -> None:
        if mid not in self._pending_subacks:
            return  # a SUBACK of an earlier connection
        refused = [str(code) for code in reason_codes if code.is_failure]
        if refused:
            # nothing will arrive on that filter: this connection never counts as subscribed
            log.error("MQTT broker refused a subscription of %s: %s",
                      self._settings.client_id, ", ".join(refused))  # fmt: skip
            return
        self._pending_subacks.discard(mid)
        if not self._pending_subacks:
            self._subscribed.set()

    def _on_message(self, _client: paho.Client, _userdata: Any, msg: paho.MQTTMessage) -> None:
        item = Inbound(
            topic=msg.topic,
            payload=bytes(msg.payload),
            qos=msg.qos,
            dup=bool(msg.dup),
            mid=msg.mid,
            received_at=time.time(),
            connection_seq=self._connection_seq,
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
        with self._tickets_lock:
            ticket = self._tickets.pop(mid, None)
            if ticket is None:
                # PUBACK overtook publish() registering its ticket.
                self._early_acks[mid] = refusal
                return
        ticket._complete(refusal)

    # -- helpers --------------------------------------------------------------------------

    def _register_ticket(self, mid: int) -> PublishTicket:
        ticket = PublishTicket(mid)
        with self._tickets_lock:
            acked_early = mid in self._early_acks
            refusal = self._early_acks.pop(mid, None)
            if not acked_early:
                self._tickets[mid] = ticket
        if acked_early:
            ticket._complete(refusal)
        return ticket

    def _mark_disconnected(self) -> None:
        self._subscribed.clear()
        if self._connected.is_set():
            self._connected.clear()
            self._notify(False)

    def _notify_connack(self) -> None:
        with self._connack:
            self._connack.notify_all()

    def _notify(self, connected: bool) -> None:
        callback = self._on_connection_change
        if callback is not None:
            _run_callback(lambda: callback(connected))


def _close_quietly(sock: Any) -> None:
    try:
        sock.close()
    except OSError as e:
        log.debug("closing MQTT socket: %s", e)
