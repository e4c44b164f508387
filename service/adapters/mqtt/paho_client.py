"""One paho-mqtt 2.x client object: made for our settings, started, and stopped for good.

paho fixes the protocol per client object, so `MqttClient` makes a new one when it falls
back to 3.1.1; everything here is what such an object needs whatever the protocol:

- ``suppress_exceptions``: a raising callback would otherwise end paho's network thread.
- An unbounded queue: publishing while disconnected keeps QoS 1 messages until the next
  CONNACK.
- Under MQTT 5 the clean start flag and the session expiry go with each CONNECT; under
  3.1.1 the clean session flag is fixed when the object is made.
- `LeanClient`: a bare PUBACK (the broker took the message; no properties) completes its
  publish without paho decoding a reason code and a properties object for it; a packet
  paho's own thread queues writes it no wake-up byte, and a `LeanClient.batch` of packets
  one in all.
- `shut_down` makes paho stop reconnecting for good, so a holder displaced from its client
  id never grabs the id back (the ping-pong seen on mosquitto 2.0 + paho 2.2). A normal
  DISCONNECT discards the will; ``send_will`` asks the broker to publish it anyway: reason
  code 0x04 under MQTT 5; under 3.1.1 (which has no such code) the socket is closed without
  DISCONNECT.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import threading
from collections.abc import Iterator
from typing import Any, Literal, cast

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from service.adapters.mqtt.settings import MqttSettings
from service.adapters.mqtt.url import MqttEndpoint
from service.errors import ConfigError

log = logging.getLogger("service.mqtt")

_QOS_WILL = 1
_PACKET_ID_LENGTH = 2
_WAKE_UP = b"0"  # the byte paho writes to its wake-up socket pair
# MQTT 5 reason code of a DISCONNECT asking the broker to publish the will (spec, 2.4).
DISCONNECT_WITH_WILL = 0x04


# The reason codes of a PUBACK whose message the broker took, each made once: every such
# PUBACK hands these same objects to ``on_publish``, which must only read them.
PUBACK_TAKEN = {
    code: ReasonCode(PacketTypes.PUBACK, identifier=code)
    for code in (0x00, 0x10)  # Success; No matching subscribers
}
PUBACK_NO_PROPERTIES = Properties(PacketTypes.PUBACK)  # type: ignore[no-untyped-call]


class LeanClient(paho.Client):
    """A paho client that completes a publish on a bare PUBACK without decoding it.

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
                self._wake()

    def _wake(self) -> None:
        """What paho does after queueing a packet: one byte on its wake-up socket pair, so
        that its thread leaves ``select`` and writes."""
        sock = self._sockpairW
        if sock is not None:
            with contextlib.suppress(BlockingIOError):  # full: a wake-up is pending anyway
                sock.send(_WAKE_UP)

    def _packet_queue(
        self,
        command: int,
        packet: bytes | bytearray,
        mid: int,
        qos: int,
        info: paho.MQTTMessageInfo | None = None,
    ) -> MQTTErrorCode:
        """Queue a packet for paho's thread to write. paho also wakes that thread each time
        (`_wake`); here it is not woken for a packet queued inside `batch` (`batch` wakes it
        once at the end), nor for one queued on that thread itself: it computes what to
        wait for after handling what it read, and a non-empty queue makes it wait for the
        socket to be writable. A PUBACK letting the next queued publish out is queued on
        that thread."""
        thread = self._thread
        if thread is None:
            return super()._packet_queue(command, packet, mid, qos, info)
        if threading.current_thread() is not thread:
            if not getattr(self._batch, "open", False):
                return super()._packet_queue(command, packet, mid, qos, info)
            self._batch.queued = True
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
        return MQTTErrorCode.MQTT_ERR_SUCCESS

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
    client: paho.Client, protocol: MQTTProtocolVersion, timeout_s: float, send_will: bool
) -> None:
    """Disconnect (see the module docstring for ``send_will``) and end paho's thread, so
    the client never reconnects; waits up to ``timeout_s`` for the thread."""
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
