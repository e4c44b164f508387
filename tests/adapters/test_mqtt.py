"""The MQTT adapter against a real mosquitto: round trips, reconnects, sessions, wills, TLS."""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import queue
import re
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt import _packet as paho_packet
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from service.adapters.mqtt import (
    PUBACK_NO_PROPERTIES,
    PUBACK_TAKEN,
    Inbound,
    LeanClient,
    MqttClient,
    MqttSettings,
    plain_publish,
)
from service.errors import ConfigError
from tests.servers import Server, free_port, locked_mosquitto, mosquitto_server, pipe, running
from tests.wait import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
_ids = itertools.count()

# A holder of a client id that the test can SIGKILL: nothing is acked, no DISCONNECT is sent.
HOLDER_SCRIPT = """
import sys
from service.adapters.mqtt import MqttClient, MqttSettings
url, client_id, topic, will_topic = sys.argv[1:5]
settings = MqttSettings(
    url=url, client_id=client_id, clean_start=False, session_expiry_s=300, manual_ack=True,
    will=(will_topic, b"offline", True) if will_topic else None, reconnect_min_s=0.1,
)
client = MqttClient(settings, subscriptions=[topic])
client.start()
if not client.wait_connected(10):
    sys.exit("holder could not connect")
print("ready", flush=True)
subscribed = False
while True:
    msg = client.inbound.get()
    if msg.payload == b"probe":  # the test proving the subscription active: ack, say so once
        client.ack(msg)
        if not subscribed:
            subscribed = True
            print("subscribed", flush=True)
        continue
    print("got", msg.payload.decode(), msg.dup, flush=True)
"""


def url_of(server: Server) -> str:
    return f"mqtt://127.0.0.1:{server.port}"


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}-{time.monotonic_ns() % 1_000_000}"


@contextlib.contextmanager
def client_for(
    url: str,
    client_id: str | None = None,
    *,
    subscriptions: tuple[str, ...] = (),
    on_change: Callable[[bool], None] | None = None,
    connect: bool = True,
    **overrides: object,
) -> Iterator[MqttClient]:
    settings = MqttSettings(
        url=url,
        client_id=client_id or unique("c"),
        reconnect_min_s=0.1,
        reconnect_max_s=0.5,
        **overrides,
    )  # type: ignore[arg-type]
    client = MqttClient(settings, subscriptions=subscriptions, on_connection_change=on_change)
    client.start()
    try:
        if connect:
            assert client.wait_connected(10), "client did not connect"
        if connect and subscriptions:  # a message published before the SUBACK would be lost
            assert client.wait_subscribed(10), "client did not subscribe"
        yield client
    finally:
        client.stop()


def get(q: queue.SimpleQueue[Inbound], timeout_s: float = 5.0) -> Inbound:
    return q.get(timeout=timeout_s)


def subscribed(client: MqttClient, url: str, topic: str) -> None:
    """Subscriptions are sent on CONNACK; prove one is active by a message through it."""
    with client_for(url) as probe:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            probe.publish(topic, b"probe").wait(5)
            with contextlib.suppress(queue.Empty):
                if get(client.inbound, 0.2).payload == b"probe":
                    return
        pytest.fail(f"subscription to {topic} never became active")


def past_probes(client: MqttClient, count: int) -> list[Inbound]:
    """The next ``count`` messages, leaving out late copies of `subscribed`'s proof."""
    received: list[Inbound] = []
    while len(received) < count:
        message = get(client.inbound)
        if message.payload != b"probe":
            received.append(message)
    return received


# -- holder subprocess ----------------------------------------------------------------------


class Holder:
    def __init__(self, url: str, client_id: str, topic: str, will_topic: str = "") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER_SCRIPT, url, client_id, topic, will_topic],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )

    def line(self, timeout_s: float = 10.0) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        assert ready, "holder printed nothing"
        return self.proc.stdout.readline().strip()

    def wait_subscribed(self, pub: MqttClient, topic: str) -> None:
        """Probe until the holder's subscription is active: SUBSCRIBE goes out on CONNACK,
        after "ready", and a message published before the broker took it would be lost."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            assert pub.publish(topic, b"probe").wait(5)
            if select.select([self.proc.stdout], [], [], 0.2)[0]:
                assert self.proc.stdout.readline().strip() == "subscribed"
                return
        pytest.fail(f"the holder's subscription to {topic} never became active")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def holder_factory() -> Iterator[Callable[..., Holder]]:
    holders: list[Holder] = []

    def make(*args: str) -> Holder:
        holder = Holder(*args)
        holders.append(holder)
        return holder

    yield make
    for holder in holders:
        if holder.proc.poll() is None:
            holder.kill()


# -- settings ------------------------------------------------------------------------------


def test_client_rejects_unreadable_tls_files_as_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="TLS"):
        MqttClient(MqttSettings(url=f"mqtts://b?ca={tmp_path}/missing.pem", client_id="x"))


@pytest.mark.parametrize(
    "overrides",
    [
        {"client_id": "", "clean_start": False},
        {"reconnect_min_s": 0.0},
        {"reconnect_min_s": 5.0, "reconnect_max_s": 1.0},
        {"will": ("", b"offline", True)},
    ],
)
def test_bad_settings_raise_config_error(overrides: dict[str, object]) -> None:
    fields: dict[str, object] = {"url": "mqtt://b", "client_id": "x", **overrides}
    with pytest.raises(ConfigError):
        MqttClient(MqttSettings(**fields))  # type: ignore[arg-type]


# -- protocol fallback ----------------------------------------------------------------------


# The broker's side of a few exchanges, as raw MQTT packets.
CONNACK_311_BAD_PROTOCOL = b"\x20\x02\x00\x01"  # 3.1.1: "unacceptable protocol version"
CONNACK_V5_SUCCESS = b"\x20\x03\x00\x00\x00"
DISCONNECT_V5_TAKEN_OVER = b"\xe0\x02\x8e\x00"  # reason 0x8E "session taken over"


class ConnectProxy:
    """Stands in front of mosquitto and acts on each CONNECT by its protocol level.

    Actions: "pipe" (to the real broker), "refuse" (the 3.1.1 CONNACK "unacceptable protocol
    version", as a 3.1.1-only broker answers a v5 CONNECT, then close), "close" (close with no
    CONNACK: what RabbitMQ 3.10 does to a v5 CONNECT), "silent" (read it, never answer, keep
    the socket open), "take-over" (a v5 CONNACK, then DISCONNECT 0x8E). ``first`` overrides
    the action for the first connections, in order.
    """

    def __init__(
        self,
        upstream_port: int,
        *,
        on_v5: str = "refuse",
        first: tuple[str, ...] = (),
        port: int = 0,
    ) -> None:
        self.upstream_port = upstream_port
        self.on_v5 = on_v5
        self.first = list(first)
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = self.listener.getsockname()[1]
        self.levels_seen: list[int] = []
        self.sockets: list[socket.socket] = [self.listener]
        self._closed = False
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets = list(self.sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _keep(self, sock: socket.socket) -> bool:
        """Hold ``sock`` for `close`; or, once closed, close it now (False)."""
        with self._lock:
            if not self._closed:
                self.sockets.append(sock)
                return True
        sock.close()
        return False

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if not self._keep(conn):
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _action(self, level: int) -> str:
        with self._lock:
            self.levels_seen.append(level)
            if self.first:
                return self.first.pop(0)
        return self.on_v5 if level == 5 else "pipe"

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            first = self._read_packet(conn)
            action = self._action(first[8])  # type byte, 1-byte length, "MQTT", then the level
            if action == "silent":
                return  # the socket stays open (closed with the proxy)
            if action in ("refuse", "close", "take-over"):
                if action == "refuse":
                    conn.sendall(CONNACK_311_BAD_PROTOCOL)
                if action == "take-over":
                    conn.sendall(CONNACK_V5_SUCCESS + DISCONNECT_V5_TAKEN_OVER)
                    # the client reads both in order; close once it has closed its end, so
                    # nothing it sent after the CONNACK is left unread to reset the
                    # connection before the DISCONNECT is read
                    conn.shutdown(socket.SHUT_WR)
                    conn.settimeout(10)
                    while conn.recv(4096):
                        pass
                conn.close()
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            if not self._keep(upstream):
                return
            upstream.sendall(first)
            threading.Thread(target=pipe, args=(upstream, conn), daemon=True).start()
            pipe(conn, upstream)

    @staticmethod
    def _read_packet(conn: socket.socket) -> bytes:
        header = conn.recv(2)
        assert len(header) == 2 and header[1] < 0x80, "CONNECT longer than 127 bytes"
        body = b""
        while len(body) < header[1]:
            chunk = conn.recv(header[1] - len(body))
            if not chunk:
                raise OSError("closed")
            body += chunk
        return header + body


@contextlib.contextmanager
def proxy_for(broker: Server, **options: Any) -> Iterator[ConnectProxy]:
    proxy = ConnectProxy(broker.port, **options)
    try:
        yield proxy
    finally:
        proxy.close()


def test_falls_back_to_311_when_broker_refuses_v5(mosquitto: Server) -> None:
    with proxy_for(mosquitto, on_v5="refuse") as proxy:
        settings = MqttSettings(url=proxy.url, client_id=unique("fb"), reconnect_min_s=0.1)
        client = MqttClient(settings, subscriptions=["fb/in"])
        # Published before the first CONNACK: must survive the switch to a new paho client.
        early = client.publish("fb/in", b"queued before fallback")
        client.start()
        try:
            assert client.wait_connected(10)
            assert client.protocol == MQTTProtocolVersion.MQTTv311
            assert proxy.levels_seen[:2] == [5, 4]
            assert early.wait(5)
            late = client.publish("fb/in", b"after fallback")
            assert late.wait(5)
            payloads = {get(client.inbound).payload, get(client.inbound).payload}
            assert b"after fallback" in payloads
        finally:
            client.stop()


def test_falls_back_to_311_when_broker_closes_after_v5_connect(
    mosquitto: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """RabbitMQ 3.10 answers an MQTT 5 CONNECT by closing the socket: no CONNACK at all."""
    caplog.set_level(logging.WARNING, "service.mqtt")
    changes: list[bool] = []
    with (
        proxy_for(mosquitto, on_v5="close") as proxy,
        client_for(proxy.url, subscriptions=("fbc/in",), on_change=changes.append) as client,
    ):
        assert client.protocol == MQTTProtocolVersion.MQTTv311
        assert proxy.levels_seen == [5, 4]
        assert "closed the connection after our MQTT 5 CONNECT" in caplog.text
        assert "switches to MQTTv311 for this and every later connect" in caplog.text
        subscribed(client, url_of(mosquitto), "fbc/in")
        drop_connection(client)  # later connects remember 3.1.1
        wait_until(
            lambda: changes.count(True) == 2 and client.connected,
            10,
            "changes.count(True) == 2 and client.connected",
        )
        assert proxy.levels_seen == [5, 4, 4]


def test_the_new_client_up_before_the_old_ones_close_ends_stays_up(
    mosquitto: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback's new client runs on its own thread: it can connect while the old
    client's close callback, which launched it, has yet to return. What that callback does
    after the launch must not mark the new connection down."""
    launch = MqttClient._launch

    def launch_then_wait_until_up(self: MqttClient, client: paho.Client) -> None:
        fallback = client is not first  # the fallback's launch, on the old client's thread
        if fallback:  # recorded first: the new client may be up before launch returns
            old_threads.append(threading.current_thread())
        launch(self, client)
        if fallback:
            assert self.wait_subscribed(10), "the new client did not subscribe"

    monkeypatch.setattr(MqttClient, "_launch", launch_then_wait_until_up)
    old_threads: list[threading.Thread] = []
    changes: list[bool] = []
    with proxy_for(mosquitto, on_v5="close") as proxy:
        settings = MqttSettings(url=proxy.url, client_id=unique("fbr"), reconnect_min_s=0.1)
        client = MqttClient(settings, subscriptions=["fbr/in"], on_connection_change=changes.append)
        first = client._paho
        client.start()
        try:
            assert client.wait_connected(10)
            [old_thread] = old_threads
            old_thread.join(10)  # its close callback, which launched the new client, is over
            assert not old_thread.is_alive()
            assert proxy.levels_seen == [5, 4]
            assert client.connected and client.subscribed
            assert changes == [True]
        finally:
            client.stop()


def test_no_fallback_when_nothing_listens_yet(tmp_path: Path) -> None:
    """Connection refused means no CONNECT ever went out: an outage, not a protocol answer."""
    port = free_port()
    with client_for(f"mqtt://127.0.0.1:{port}", connect=False) as client:
        assert not client.wait_connected(0.8)  # several refused attempts
        broker = mosquitto_server(tmp_path / "late", port=port)
        with running(broker):
            assert client.wait_connected(10)
            assert client.protocol == MQTTProtocolVersion.MQTTv5


def test_no_fallback_when_broker_stays_silent(mosquitto: Server) -> None:
    """A broker that never answers (our keep-alive runs out) has not refused MQTT 5."""
    with (
        proxy_for(mosquitto, on_v5="pipe", first=("silent",)) as proxy,
        client_for(proxy.url, keepalive_s=1, connect=False) as client,
    ):
        assert client.wait_connected(15)
        assert client.protocol == MQTTProtocolVersion.MQTTv5
        assert proxy.levels_seen == [5, 5]


@pytest.mark.parametrize("action", ["close", "refuse"])
def test_pinned_mqtt5_never_falls_back(mosquitto: Server, action: str) -> None:
    with (
        proxy_for(mosquitto, on_v5=action) as proxy,
        client_for(f"{proxy.url}?protocol=5", connect=False) as client,
    ):
        wait_until(lambda: len(proxy.levels_seen) >= 3, 10, "len(proxy.levels_seen) >= 3")
        assert not client.connected
        assert set(proxy.levels_seen) == {5}
        assert client.protocol == MQTTProtocolVersion.MQTTv5
        if action == "refuse":
            assert client.refusal is not None
            assert client.refusal.code == 0x84
            assert not client.refusal.not_authorised


def test_pinned_311_speaks_it_from_the_first_connect(mosquitto: Server) -> None:
    with (
        proxy_for(mosquitto, on_v5="close") as proxy,
        client_for(f"{proxy.url}?protocol=311") as client,
    ):
        assert client.protocol == MQTTProtocolVersion.MQTTv311
        assert proxy.levels_seen == [4]


# -- refusals -------------------------------------------------------------------------------

LOCKED_USERS = {"cli": "right-password"}
LOCKED_ACL = "user cli\ntopic readwrite allowed/#\n"


@pytest.fixture
def locked(tmp_path: Path) -> Iterator[Server]:
    """mosquitto with a password file and an ACL: user cli may use allowed/# only."""
    with running(locked_mosquitto(tmp_path / "locked", LOCKED_USERS, LOCKED_ACL)) as server:
        yield server


@pytest.mark.parametrize("pin", ["", "?protocol=3.1.1"])
def test_refused_connect_says_not_authorised(locked: Server, pin: str) -> None:
    wrong = f"mqtt://cli:wrong-password@127.0.0.1:{locked.port}{pin}"
    with client_for(wrong, connect=False) as client:
        assert not client.wait_connected(20, stop_on_refusal=True)
        refusal = client.refusal
        assert refusal is not None and refusal.not_authorised, refusal
        assert str(refusal).startswith("not authorised (the broker said: ")
        if not pin:
            assert client.protocol == MQTTProtocolVersion.MQTTv5  # a refusal is no fallback
    with client_for(f"mqtt://cli:right-password@127.0.0.1:{locked.port}{pin}") as client:
        assert client.refusal is None


def test_refused_publish_carries_the_brokers_reason(locked: Server) -> None:
    with client_for(f"mqtt://cli:right-password@127.0.0.1:{locked.port}") as client:
        denied = client.publish("denied/x", b"m")
        assert denied.wait(5)
        assert (denied.refused, denied.reason) == (True, "Not authorized")
        allowed = client.publish("allowed/x", b"m")
        assert allowed.wait(5)
        assert (allowed.refused, allowed.reason) == (False, None)


def test_under_311_a_refused_publish_cannot_be_told(locked: Server) -> None:
    """MQTT 3.1.1's PUBACK has no reason code: the broker drops the message and acks it."""
    url = f"mqtt://cli:right-password@127.0.0.1:{locked.port}?protocol=3.1.1"
    with client_for(url) as client:
        denied = client.publish("denied/x", b"m")
        assert denied.wait(5)
        assert (denied.refused, denied.reason) == (False, None)


# -- one client id, two connections ---------------------------------------------------------


def takeover_delays(caplog: pytest.LogCaptureFixture) -> list[float]:
    return [float(d) for d in re.findall(r"reconnecting in ([\d.]+)s", caplog.text)]


@pytest.mark.parametrize("pin", ["", "?protocol=3.1.1"])
def test_two_clients_with_one_id_back_off_instead_of_fighting(
    mosquitto: Server, caplog: pytest.LogCaptureFixture, pin: str
) -> None:
    """mosquitto hands the id to the newest connection and closes the older one without a
    word (no DISCONNECT 0x8E, under either protocol); the loser must say so and back off."""
    caplog.set_level(logging.WARNING, "service.mqtt")
    url, client_id = url_of(mosquitto) + pin, unique("twin")
    connects: list[bool] = []

    def count(connected: bool) -> None:
        if connected:
            connects.append(True)

    with (
        client_for(url, client_id, on_change=count, takeover_backoff_max_s=1.6),
        client_for(url, client_id, on_change=count, takeover_backoff_max_s=1.6, connect=False),
    ):
        # paho alone would reconnect every 0.1 s and never reach the cap
        wait_until(
            lambda: "reconnecting in 1.6s" in caplog.text,
            30,
            "'reconnecting in 1.6s' in caplog.text",
        )
        fights = len(connects)
    delays = takeover_delays(caplog)
    assert delays == sorted(delays), delays  # each close in a row doubles the delay
    assert delays[:4] == [0.2, 0.2, 0.4, 0.4], delays
    assert fights <= 14, fights  # 0.1, 0.1, 0.2, 0.2, 0.4, 0.4, 0.8, 0.8, 1.6: not ~a hundred
    assert "most likely another client connected with the same id" in caplog.text
    assert f"client id {client_id}" in caplog.text


def test_disconnect_0x8e_is_named_and_backed_off_until_a_stable_connection(
    mosquitto: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "service.mqtt")
    taken = ("take-over",) * 4
    with (
        proxy_for(mosquitto, on_v5="pipe", first=taken) as proxy,
        client_for(proxy.url, takeover_backoff_max_s=0.4, connect=False) as client,
    ):
        wait_until(
            lambda: len(proxy.levels_seen) == 5 and client.connected,
            15,
            "len(proxy.levels_seen) == 5 and client.connected",
        )
        assert takeover_delays(caplog) == [0.1, 0.2, 0.4, 0.4]
        assert caplog.text.count("(DISCONNECT 0x8E)") == 4
        lasted(client, 1.0)  # stable: more than twice the cap, by the client's own reckoning
        caplog.clear()
        drop_connection(client)
        wait_until(
            lambda: len(proxy.levels_seen) == 6 and client.connected,
            15,
            "len(proxy.levels_seen) == 6 and client.connected",
        )
        assert "MQTT disconnected from" in caplog.text
        assert takeover_delays(caplog) == []


def test_an_outage_ends_a_run_of_takeovers(
    mosquitto: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker that refuses the TCP connect went away; it did not hand our id to anyone."""
    caplog.set_level(logging.WARNING, "service.mqtt")
    with proxy_for(mosquitto, on_v5="take-over") as proxy:
        client = MqttClient(
            MqttSettings(url=proxy.url, client_id=unique("run"), takeover_backoff_max_s=0.4,
                         reconnect_min_s=0.1, reconnect_max_s=0.5)
        )  # fmt: skip
        client.start()
        try:
            wait_until(
                lambda: takeover_delays(caplog)[:3] == [0.1, 0.2, 0.4],
                15,
                "takeover_delays(caplog)[:3] == [0.1, 0.2, 0.4]",
            )
            proxy.close()
            wait_until(lambda: "cannot reach" in caplog.text, 15, "'cannot reach' in caplog.text")
            caplog.clear()
            with proxy_for(mosquitto, on_v5="take-over", port=proxy.port):
                wait_until(
                    lambda: takeover_delays(caplog) != [], 15, "takeover_delays(caplog) != []"
                )
                assert takeover_delays(caplog)[0] == 0.1
                assert "1 such close(s) in a row" in caplog.text
        finally:
            client.stop()


# -- round trip, reconnect ------------------------------------------------------------------


def test_publish_subscribe_round_trip_qos1(mosquitto: Server) -> None:
    url = url_of(mosquitto)
    with client_for(url, subscriptions=("jobs/+/in",)) as sub, client_for(url) as pub:
        assert sub.protocol == MQTTProtocolVersion.MQTTv5
        sock = pub._paho.socket()  # test-only peek: Nagle off, or every hop pays ~44 ms
        assert sock is not None
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        subscribed(sub, url, "jobs/probe/in")
        called = threading.Event()
        ticket = pub.publish("jobs/a/in", b'{"n":1}')
        ticket.add_done_callback(called.set)
        assert ticket.wait(5)
        assert ticket.done
        assert called.wait(5)
        late = threading.Event()
        ticket.add_done_callback(late.set)  # already done: runs at once
        assert late.is_set()
        msg = get(sub.inbound)
        assert (msg.topic, msg.payload, msg.qos, msg.dup) == ("jobs/a/in", b'{"n":1}', 1, False)
        assert abs(msg.received_at - time.time()) < 5


def test_done_callbacks_may_publish_while_other_threads_publish(mosquitto: Server) -> None:
    """An outbox pump publishes the next message from a PUBACK callback (paho's thread,
    inside paho's lock) while the runtime publishes from its own: neither may deadlock."""
    count = 2000
    chained_done = threading.Event()
    with client_for(url_of(mosquitto)) as client:

        def publish_next(n: int) -> None:
            if n == count:
                chained_done.set()
                return
            client.publish("chain/out", b"c").add_done_callback(lambda: publish_next(n + 1))

        publish_next(0)
        tickets = [client.publish("direct/out", b"d") for _ in range(count)]
        assert chained_done.wait(20)
        assert all(ticket.wait(10) for ticket in tickets)


@pytest.mark.parametrize("pin", ["", "?protocol=3.1.1"])
def test_a_bare_puback_completes_its_publish_without_pahos_decoder(
    mosquitto: Server, pin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`LeanClient` reads a bare PUBACK's packet id itself; should paho rename or reshape the
    method it overrides, its decoder would run again (or nothing would complete) and this
    fails."""
    decoded: list[int] = []
    decode_puback = paho_packet.decode_puback

    def counting(header: int, packet: bytes | bytearray, protocol: Any) -> Any:
        decoded.append(len(packet))
        return decode_puback(header, packet, protocol)

    monkeypatch.setattr(paho_packet, "decode_puback", counting)
    with client_for(url_of(mosquitto) + pin) as client:
        assert isinstance(client._paho, LeanClient)  # test-only peek
        tickets = [client.publish("lean/out", b"m") for _ in range(200)]
        assert all(ticket.wait(10) for ticket in tickets)
        assert not any(ticket.refused for ticket in tickets)
    assert decoded == []


class _CountingWakeUps:
    """Stands in for paho's wake-up socket: counts the bytes each thread writes to it."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self.by_thread: dict[str, int] = {}

    def send(self, data: bytes) -> int:
        name = threading.current_thread().name
        self.by_thread[name] = self.by_thread.get(name, 0) + 1
        return int(self._sock.send(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    @classmethod
    def installed_on(cls, client: MqttClient) -> _CountingWakeUps:
        """Put one in place of the wake-up socket of the client's paho (a test-only peek)."""
        lean = client._paho
        counting = cls(lean._sockpairW)
        lean._sockpairW = counting  # type: ignore[assignment]
        return counting


class _CountingBusyLock:
    """Stands in for the client's writer lock: counts, by thread, the attempts to take it
    without waiting that found it taken (another thread writing)."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self.busy: dict[str, int] = {}

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = bool(self._lock.acquire(blocking, timeout))
        if not got and not blocking:
            name = threading.current_thread().name
            self.busy[name] = self.busy.get(name, 0) + 1
        return got

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> _CountingBusyLock:
        self._lock.acquire()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._lock.release()


def _count_sends(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the sends to the broker each thread makes, by thread name."""
    by_thread: dict[str, int] = {}
    send = LeanClient._sock_send

    def counting(client: LeanClient, buffer: bytes | bytearray, *on: socket.socket) -> int:
        name = threading.current_thread().name
        by_thread[name] = by_thread.get(name, 0) + 1
        return send(client, buffer, *on)

    monkeypatch.setattr(LeanClient, "_sock_send", counting)
    return by_thread


def test_publishes_paho_lets_out_on_its_own_thread_need_no_wake_up(
    mosquitto: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """paho keeps 20 publishes in flight and lets the next one out on its own thread as a
    PUBACK comes: `LeanClient` queues those without writing paho a wake-up byte, and paho's
    thread writes them. The publishing thread writes the first ones itself, and wakes paho's
    thread only when it finds that thread writing (the writer lock taken: what it queued
    might otherwise wait for paho's next loop). Should paho rename or reshape what it
    overrides, its thread would be woken for each (or nothing would go out) and this
    fails."""
    sends = _count_sends(monkeypatch)
    with client_for(url_of(mosquitto)) as client:
        lean = client._paho  # test-only peek
        counting = _CountingWakeUps.installed_on(client)
        lock = lean._write_lock = _CountingBusyLock(lean._write_lock)  # type: ignore[assignment]
        tickets = [client.publish("lean/out", b"m") for _ in range(200)]
        assert all(ticket.wait(10) for ticket in tickets)
        assert lean._thread is not None
        publisher = threading.current_thread().name
        assert lean._thread.name not in counting.by_thread
        assert set(counting.by_thread) <= {publisher}
        assert counting.by_thread.get(publisher, 0) <= lock.busy.get(publisher, 0)
        assert sends.get(lean._thread.name, 0) >= 1
        assert sends.get(publisher, 0) >= 1


def test_a_batch_of_publishes_goes_out_from_its_thread_in_one_send(
    mosquitto: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside `MqttClient.batch` the publishing thread queues its packets, and at the end
    writes them itself, joined into one send: paho's thread is not woken, and all go out
    in order."""
    url = url_of(mosquitto)
    with client_for(url, subscriptions=("lean/+",)) as sub, client_for(url) as client:
        subscribed(sub, url, "lean/probe")
        counting = _CountingWakeUps.installed_on(client)
        sends = _count_sends(monkeypatch)
        with client.batch():
            tickets = [client.publish("lean/out", str(n).encode()) for n in range(10)]
            with client.batch():  # nested: the outer one writes
                tickets.append(client.publish("lean/out", b"10"))
            assert sends == {}
        # paho's thread also loops once a second, and writes whatever is queued then: it may
        # have written the first of these, never more than the one send the rest took
        assert sends.get(threading.current_thread().name) == 1
        assert sum(sends.values()) <= 2
        assert counting.by_thread == {}
        assert all(ticket.wait(10) for ticket in tickets)
        received = [m.payload for m in past_probes(sub, 11)]
        assert received == [str(n).encode() for n in range(11)]


def test_a_write_that_found_a_connection_up_goes_on_that_connection_only(
    mosquitto: Server,
) -> None:
    """A thread writes what it queued on the connection it found up. Should paho's thread
    close that connection and open the next before the send, the send fails on the closed
    one (and paho's thread is left to write) instead of reaching the next connection,
    whose first packet must be its CONNECT."""
    changes: list[bool] = []
    with client_for(url_of(mosquitto), on_change=changes.append) as client:
        lean = client._paho  # test-only peek
        found = lean._sock
        assert isinstance(found, socket.socket)
        drop_connection(client)
        wait_until(lambda: changes == [True, False, True], 10, "connected again")
        assert lean._sock is not found
        packet = b"\x40\x02\x00\x01"  # a PUBACK: plain
        queued: collections.deque[Any] = collections.deque(
            [{"command": paho.PUBACK, "mid": 1, "qos": 1, "pos": 0, "to_process": 4,
              "packet": packet, "info": None}]
        )  # fmt: skip
        with lean._write_lock:
            assert lean._send_plain(found, queued) is False
        assert queued[0]["pos"] == 0 and queued[0]["to_process"] == 4


def test_what_the_socket_cannot_take_now_paho_writes_later(tmp_path: Path) -> None:
    """A batch bigger than the socket takes while the broker reads nothing: the publishing
    thread writes what fits, wakes paho's thread for the rest and returns; once the broker
    reads again, everything arrives, in order and whole."""
    broker = mosquitto_server(tmp_path)
    with running(broker):
        url = url_of(broker)
        with client_for(url, subscriptions=("full/+",)) as sub, client_for(url) as client:
            subscribed(sub, url, "full/probe")
            lean = client._paho  # test-only peek
            counting = _CountingWakeUps.installed_on(client)
            payloads = [n.to_bytes(4, "big") * 262144 for n in range(20)]  # 1 MiB each
            broker.freeze()
            try:
                with client.batch():
                    tickets = [client.publish("full/in", p) for p in payloads]
                assert counting.by_thread == {threading.current_thread().name: 1}
                assert lean._out_packet, "the socket took 20 MiB with the broker stopped"
            finally:
                broker.thaw()
            assert all(ticket.wait(30) for ticket in tickets)
            assert [m.payload for m in past_probes(sub, len(payloads))] == payloads


def test_packets_read_in_one_block_are_all_handled_at_once(
    mosquitto: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`LeanClient` reads its socket in blocks: a burst that piled up while paho's thread was
    busy takes a few reads, not three per message, and every message read is handled then.
    paho reads one packet per readable socket here, and the socket says nothing of packets
    already read from it: the rest of a block would wait for the next bytes to arrive
    (nothing here: no ping falls due) and this fails."""
    reads: list[int] = []
    recv = paho.Client._sock_recv

    def counting(client: paho.Client, bufsize: int) -> bytes:
        reads.append(bufsize)
        return recv(client, bufsize)

    monkeypatch.setattr(paho.Client, "_sock_recv", counting)
    url = url_of(mosquitto)
    count = 50
    with client_for(url, subscriptions=("burst/+",)) as sub, client_for(url) as pub:
        subscribed(sub, url, "burst/probe")
        busy = sub._paho._in_callback_mutex  # test-only peek: paho's thread waits for it
        with busy:
            tickets = [pub.publish("burst/in", str(n).encode()) for n in range(count)]
            assert all(ticket.wait(10) for ticket in tickets)  # the broker sent them on
            reads.clear()
        received = [get(sub.inbound).payload for _ in range(count)]
    assert received == [str(n).encode() for n in range(count)]
    assert len(reads) < count, reads


def test_packets_queued_together_go_out_in_one_send_in_order(
    mosquitto: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`LeanClient` joins the packets queued for the broker into one send: a batch of
    publishes, and the PUBACKs of messages taken in together, take a few sends, not one
    each, and arrive in the order they were queued."""
    sends: list[int] = []
    send = LeanClient._sock_send

    def counting(client: LeanClient, buffer: bytes | bytearray, *on: socket.socket) -> int:
        sends.append(len(buffer))
        return send(client, buffer, *on)

    url = url_of(mosquitto)
    count = 50
    subscriber = client_for(url, subscriptions=("joined/+",), manual_ack=True)
    with subscriber as sub, client_for(url) as pub:
        subscribed(sub, url, "joined/probe")
        monkeypatch.setattr(LeanClient, "_sock_send", counting)
        with pub.batch():
            tickets = [pub.publish("joined/in", str(n).encode()) for n in range(count)]
        assert all(ticket.wait(10) for ticket in tickets)
        published = len(sends)
        received = past_probes(sub, count)
        sub.ack_all(received)
        puback = 4  # fixed header, length and packet id: a bare PUBACK
        wait_until(lambda: sum(sends[published:]) == count * puback, 10, "every PUBACK sent")
    assert [m.payload for m in received] == [str(n).encode() for n in range(count)]
    assert published < count / 2, sends
    assert len(sends) - published < count / 2, sends[published:]


@pytest.mark.parametrize("v5", [False, True])
@pytest.mark.parametrize("qos", [0, 1])
@pytest.mark.parametrize("flags", [0x00, 0x01, 0x08, 0x09])  # retain, dup
@pytest.mark.parametrize("topic", [b"t", b"lifelong/node/workers/ns/w-1/info", b"\xff/x"])
@pytest.mark.parametrize("payload", [b"", b"{}", bytes(range(256)) * 3])
def test_a_plain_publish_means_to_paho_what_lean_client_reads(
    v5: bool, qos: int, flags: int, topic: bytes, payload: bytes
) -> None:
    """paho's decoder reads a plain PUBLISH (QoS 0 or 1, a topic, no properties) as
    `plain_publish` does, and `LeanClient` makes of it the message paho would."""
    protocol = MQTTProtocolVersion.MQTTv5 if v5 else MQTTProtocolVersion.MQTTv311
    command = 0x30 | (qos << 1) | flags
    mid = b"\x12\x34" if qos else b""
    packet = len(topic).to_bytes(2, "big") + topic + mid + (b"\x00" if v5 else b"") + payload
    decoded = paho_packet.decode_publish(command, packet, protocol)
    read = plain_publish(command, packet, v5=v5)
    assert read == (decoded.mid, decoded.topic, decoded.payload)
    client = LeanClient(CallbackAPIVersion.VERSION2, protocol=protocol)
    made: list[paho.MQTTMessage] = []
    client.on_message = lambda _c, _u, message: made.append(message)
    client._in_packet["command"] = command
    client._in_packet["packet"] = packet
    client._manual_ack = True
    assert client._handle_publish() == 0
    [message] = made
    fields = ("mid", "_topic", "payload", "qos", "dup", "retain", "state")
    expected = paho.MQTTMessage(decoded.mid, decoded.topic)
    expected.qos, expected.dup, expected.retain = decoded.qos, decoded.dup, decoded.retain
    expected.payload = decoded.payload
    assert [getattr(message, f) for f in fields] == [getattr(expected, f) for f in fields]
    if v5:
        assert message.properties is not None and decoded.properties is not None
        assert message.properties.json() == decoded.properties.json() == {}
    else:
        assert message.properties is None is decoded.properties


@pytest.mark.parametrize(
    "v5, packet",
    [
        (True, b"\x00\x01t\x12\x34\x03\x23\x00\x01payload"),  # a topic alias property
        (True, b"\x00\x00\x12\x34\x03\x23\x00\x01payload"),  # no topic: the alias names it
        (False, b"\x00\x00\x12\x34payload"),  # no topic (malformed under 3.1.1)
        (False, b"\x00\x09t\x12"),  # cut short
        (True, b"\x00\x01t\x12\x34"),  # no property length
        (False, b"\x00"),
    ],
)
def test_any_other_publish_is_left_to_pahos_decoder(v5: bool, packet: bytes) -> None:
    assert plain_publish(0x32, packet, v5=v5) is None
    assert plain_publish(0x34, b"\x00\x01t\x12\x34\x00", v5=True) is None  # QoS 2


@pytest.mark.parametrize("pin", ["", "?protocol=3.1.1"])
def test_plain_publishes_arrive_without_pahos_decoder(
    mosquitto: Server, pin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages from a real broker take `LeanClient`'s way in and arrive whole; one with
    properties (MQTT 5) takes paho's. Should paho rename or reshape what it overrides, its
    decoder would run for every message (or none would arrive) and this fails."""
    decoded: list[bytes] = []
    decode_publish = paho_packet.decode_publish

    def counting(header: int, packet: bytes | bytearray, protocol: Any) -> Any:
        result = decode_publish(header, packet, protocol)
        decoded.append(result.payload)
        return result

    url = url_of(mosquitto) + pin
    with client_for(url, subscriptions=("plain/+",)) as sub, client_for(url) as pub:
        subscribed(sub, url, "plain/probe")
        monkeypatch.setattr(paho_packet, "decode_publish", counting)
        tickets = [pub.publish("plain/in", str(n).encode()) for n in range(20)]
        assert all(ticket.wait(10) for ticket in tickets)
        received = [m.payload for m in past_probes(sub, 20)]
        assert received == [str(n).encode() for n in range(20)]
        assert decoded == []
        if not pin:
            properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            properties.UserProperty = ("k", "v")
            pub._paho.publish("plain/in", b"with", qos=1, properties=properties).wait_for_publish(5)
            assert [m.payload for m in past_probes(sub, 1)] == [b"with"]
            assert decoded == [b"with"]


@pytest.mark.parametrize(
    "protocol, tail",
    [(MQTTProtocolVersion.MQTTv311, b""), (MQTTProtocolVersion.MQTTv5, b"")]
    + [(MQTTProtocolVersion.MQTTv5, bytes([code])) for code in PUBACK_TAKEN]
    + [(MQTTProtocolVersion.MQTTv5, bytes([code, 0])) for code in PUBACK_TAKEN],
)
@pytest.mark.parametrize("mid", [1, 255, 256, 4660, 65535])
def test_a_bare_puback_means_to_paho_what_lean_client_reads(
    protocol: MQTTProtocolVersion, tail: bytes, mid: int
) -> None:
    """paho's own decoder reads every bare PUBACK as its packet id, a reason code that is no
    failure and no properties, as `LeanClient` does; a refusal or properties are left to it."""
    client = LeanClient(CallbackAPIVersion.VERSION2, protocol=protocol)
    packet = bytearray(mid.to_bytes(2, "big") + tail)
    decoded = paho_packet.decode_puback(0x40, packet, protocol)
    read = client._bare_puback_reason(packet)
    assert read is not None
    assert (decoded.mid, decoded.reason.value) == (mid, read.value)
    assert not read.is_failure and not decoded.reason.is_failure
    assert decoded.properties.json() == PUBACK_NO_PROPERTIES.json() == {}
    refused = bytearray(mid.to_bytes(2, "big") + b"\x87")
    with_properties = bytearray(mid.to_bytes(2, "big") + b"\x00\x03\x1f\x00\x00")
    assert client._bare_puback_reason(refused) is None
    assert client._bare_puback_reason(with_properties) is None


def test_subscriptions_renewed_after_broker_restart(mosquitto: Server) -> None:
    url = url_of(mosquitto)
    changes: list[bool] = []
    with client_for(url, subscriptions=("r/in",), on_change=changes.append) as sub:
        subscribed(sub, url, "r/in")
        mosquitto.restart()
        wait_until(lambda: changes.count(True) >= 2, 10, "changes.count(True) >= 2")
        assert changes[:3] == [True, False, True]
        assert sub.connected
        with client_for(url) as pub:
            assert pub.publish("r/in", b"after restart").wait(5)
        assert get(sub.inbound).payload == b"after restart"


def test_subscribed_means_a_message_sent_now_arrives(mosquitto: Server) -> None:
    """`subscribed` turns true on the SUBACKs of the current connection: a message another
    client publishes from then on reaches a fresh clean-start client (no session yet to
    queue it before). It turns false while disconnected and true again after re-subscribing."""
    url = url_of(mosquitto)
    with client_for(url) as pub:
        for trial in range(10):
            topic = f"fresh/{trial}/in"
            with client_for(url, subscriptions=(topic, "other/in"), connect=False) as sub:
                wait_until(lambda c=sub: c.subscribed, 10, "c.subscribed")  # type: ignore[misc]
                assert pub.publish(topic, b"right away").wait(5)
                assert get(sub.inbound).payload == b"right away"
        with client_for(url, subscriptions=("r/in",)) as sub:
            wait_until(lambda: sub.subscribed, 10, "sub.subscribed")
            mosquitto.stop()
            wait_until(lambda: not sub.subscribed, 5, "not sub.subscribed")
            mosquitto.start()
            wait_until(lambda: sub.subscribed, 10, "sub.subscribed")
    with client_for(url) as plain:
        assert plain.subscribed, "nothing to subscribe to: subscribed once connected"

    # at CONNACK (the callback runs on paho's thread, before it can read any SUBACK) the
    # subscriptions are sent but not yet acknowledged: connected is not subscribed
    at_connack: list[bool] = []
    settings = MqttSettings(url=url, client_id=unique("c"), reconnect_min_s=0.1)
    client = MqttClient(
        settings,
        subscriptions=("a/in",),
        on_connection_change=lambda up: at_connack.append(up and client.subscribed),
    )
    client.start()
    try:
        wait_until(lambda: client.subscribed, 10, "client.subscribed")
        assert at_connack == [False]
    finally:
        client.stop()


def test_publish_while_broker_down_is_sent_after_reconnect(mosquitto: Server) -> None:
    url = url_of(mosquitto)
    with client_for(url, subscriptions=("q/in",)) as client:
        mosquitto.stop()
        wait_until(lambda: not client.connected, 5, "not client.connected")
        ticket = client.publish("q/in", b"while down")
        assert not ticket.wait(0.3)
        mosquitto.start()
        assert ticket.wait(10)
        assert get(client.inbound).payload == b"while down"


# -- manual ack + persistent session --------------------------------------------------------

# Each protocol (auto-detected, or pinned either way) must give the same sessions, acks, wills.
PINS = pytest.mark.parametrize("pin", ["", "?protocol=5", "?protocol=3.1.1"])


def assert_spoke(broker: Server, client_id: str, pin: str) -> None:
    """mosquitto logs each connect's protocol: p5 for MQTT 5, p2 for 3.1.1."""
    level = "p2" if pin.endswith("3.1.1") else "p5"
    assert f" as {client_id} ({level}, " in broker.log_text()


@PINS
def test_unacked_message_redelivered_to_next_holder_and_not_after_ack(
    mosquitto: Server, holder_factory: Callable[..., Holder], pin: str
) -> None:
    url, client_id, topic = url_of(mosquitto) + pin, unique("ingress"), "sedna/node1/downstream"
    holder = holder_factory(url, client_id, topic)
    assert holder.line() == "ready"
    assert_spoke(mosquitto, client_id, pin)
    with client_for(url) as pub:
        holder.wait_subscribed(pub, topic)
        assert pub.publish(topic, b"m1").wait(5)
        assert holder.line() == "got m1 False"
        holder.kill()  # never acked, no DISCONNECT

        persistent = {"clean_start": False, "session_expiry_s": 300, "manual_ack": True}
        with client_for(url, client_id, subscriptions=(topic,), **persistent) as second:
            msg = get(second.inbound)
            while msg.payload == b"probe":
                # a probe the holder acked just before its SIGKILL, too late to reach the
                # broker: redelivered like m1, but not what this test is about
                second.ack(msg)
                msg = get(second.inbound)
            assert (msg.payload, msg.dup) == (b"m1", True)
            second.ack(msg)
            assert pub.publish(topic, b"m2").wait(5)
            m2 = get(second.inbound)
            assert m2.payload == b"m2"
            second.ack(m2)
        with client_for(url, client_id, subscriptions=(topic,), **persistent) as third:
            # m3 is the marker: a redelivery of m1 or m2 would come as the session resumed,
            # before m3 (published after the CONNACK); so the first message must be m3
            assert pub.publish(topic, b"m3").wait(5)
            msg = get(third.inbound)
            assert (msg.payload, msg.dup) == (b"m3", False)
            third.ack(msg)
        # every holder resumed the one session: none asked for a clean one
        cleans = re.findall(rf" as {client_id} \(p\d, c(\d),", mosquitto.log_text())
        assert cleans == ["0", "0", "0"]


def lasted(client: MqttClient, seconds: float) -> None:
    """Until the client's current connection has lasted ``seconds`` by the monotonic clock
    the client itself measures a connection's length with (test-only: a private field)."""

    def long_enough() -> bool:
        accepted_at = client._status._connected_at
        return accepted_at is not None and time.monotonic() - accepted_at > seconds

    wait_until(long_enough, seconds + 15, f"the connection to last {seconds:g}s")


def broker_took(client: MqttClient, topic: str = "marker/out") -> None:
    """A QoS 1 publish from ``client`` and its PUBACK: the broker handles a connection's
    packets in order, so everything ``client`` queued before this reached the broker."""
    assert client.publish(topic, b"marker").wait(5)


def network_thread_ended(client: MqttClient) -> bool:
    """paho's network thread, the one that reconnects, is gone (test-only: private)."""
    thread = client._paho._thread
    return thread is None or not thread.is_alive()


def drop_connection(client: MqttClient) -> None:
    """Test-only hack: cut the TCP connection under paho, as a network fault would."""
    sock = client._paho.socket()
    assert sock is not None
    sock.shutdown(socket.SHUT_RDWR)


@PINS
def test_session_resumes_on_reconnect_and_stale_acks_are_dropped(
    mosquitto: Server, pin: str
) -> None:
    url, topic, client_id = url_of(mosquitto) + pin, "s/in", unique("s")
    changes: list[bool] = []
    persistent = {"clean_start": False, "session_expiry_s": 300, "manual_ack": True}
    with (
        client_for(
            url, client_id, subscriptions=(topic,), on_change=changes.append, **persistent
        ) as client,
        client_for(url) as pub,
    ):
        assert_spoke(mosquitto, client_id, pin)
        assert pub.publish(topic, b"m1").wait(5)
        first = get(client.inbound)
        drop_connection(client)
        again = get(client.inbound)  # paho reconnects by itself; the session is resumed
        assert (again.payload, again.dup) == (b"m1", True)
        assert again.connection_seq != first.connection_seq
        client.ack(first)  # from the dead connection: must not be sent on this one
        broker_took(client)  # had it been sent, the broker would hold m1 acknowledged now
        drop_connection(client)
        third = get(client.inbound)  # so the broker still holds it unacknowledged
        assert (third.payload, third.dup) == (b"m1", True)
        client.ack(third)
        broker_took(client)  # the broker holds m1 acknowledged before the connection drops
        drop_connection(client)
        wait_until(
            lambda: changes.count(True) == 4 and client.connected,
            10,
            "changes.count(True) == 4 and client.connected",
        )
        # a resumed session's unacknowledged messages are resent on reconnecting, before
        # anything published later: m2 arriving first proves m1 is not coming back
        assert pub.publish(topic, b"m2").wait(5)
        after = get(client.inbound)
        assert (after.payload, after.dup) == (b"m2", False)


# -- will, stop -----------------------------------------------------------------------------


@PINS
def test_presence_online_then_will_when_holder_dies(
    mosquitto: Server, holder_factory: Callable[..., Holder], pin: str
) -> None:
    url, will_topic, client_id = url_of(mosquitto) + pin, "sedna/node1/controllers/r-0", unique("w")
    holder = holder_factory(url, client_id, "unused/topic", will_topic)
    assert holder.line() == "ready"
    assert_spoke(mosquitto, client_id, pin)
    with client_for(url) as presence:  # the runtime's presence: retained online, on connect
        assert presence.publish(will_topic, b"online", retain=True).wait(5)
    with client_for(url, subscriptions=(will_topic,)) as watcher:
        assert get(watcher.inbound).payload == b"online"  # retained: a late subscriber sees it
    holder.kill()
    with client_for(url, subscriptions=(will_topic,)) as watcher:
        msg = get(watcher.inbound)  # the will, retained: arrives though we subscribed late
        assert (msg.topic, msg.payload) == (will_topic, b"offline")


def test_stop_does_not_send_the_will_unless_asked(mosquitto: Server) -> None:
    url = url_of(mosquitto)
    quiet, loud = "ctl/quiet", "ctl/loud"
    with client_for(url, subscriptions=("ctl/#",)) as watcher:
        subscribed(watcher, url, "ctl/probe")
        with client_for(url, will=(quiet, b"offline", True)):
            pass  # stop(): normal DISCONNECT discards the will
        client = MqttClient(
            MqttSettings(url=url, client_id=unique("l"), will=(loud, b"offline", True))
        )
        client.start()
        assert client.wait_connected(10)
        client.stop(send_will=True)
        # the loud will is the marker: the quiet one, had the broker sent it on the DISCONNECT
        # it read before this client even connected, would have come first
        msg = get(watcher.inbound)
        assert (msg.topic, msg.payload) == (loud, b"offline")
        client.stop()  # idempotent


def test_stop_closes_the_wake_up_socket_pair(mosquitto: Server) -> None:
    """paho closes its thread's wake-up socket pair only when the client is collected; a
    stopped client must not leave it open for the garbage collector to find (the pair of
    unclosed sockets a later test's collection then reported as a ResourceWarning)."""
    with client_for(url_of(mosquitto)) as client:
        lean = client._paho  # test-only peek
        pair = (lean._sockpairR, lean._sockpairW)
        assert all(sock is not None and sock.fileno() >= 0 for sock in pair)
    assert all(sock is not None and sock.fileno() == -1 for sock in pair)


def test_stop_ends_reconnection_so_the_next_holder_keeps_the_id(mosquitto: Server) -> None:
    url, client_id = url_of(mosquitto), unique("fixed")
    first_changes: list[bool] = []
    second_changes: list[bool] = []
    first = MqttClient(
        MqttSettings(url=url, client_id=client_id, reconnect_min_s=0.1, reconnect_max_s=0.2),
        on_connection_change=first_changes.append,
    )
    first.start()
    try:
        assert first.wait_connected(10)
        with client_for(url, client_id, on_change=second_changes.append, connect=False) as second:
            # The two now ping-pong for the id; prove it, then stop the first.
            wait_until(lambda: first_changes.count(True) >= 2, 5, "first_changes.count(True) >= 2")
            first.stop()
            wait_until(lambda: second.connected, 5, "second.connected")
            before = len(second_changes)
            assert network_thread_ended(first)
            # Anything the first sent before stop() returned reached the broker before this
            # publish; a CONNECT among it would have taken the id from the second by the
            # time the broker answers the publish (the broker reads every ready connection
            # in each turn of its loop).
            broker_took(second)
            assert second.connected
            assert len(second_changes) == before, second_changes[before:]
            assert not first.connected
    finally:
        first.stop()


def test_stop_while_broker_down_ends_retries(
    mosquitto: Server, caplog: pytest.LogCaptureFixture
) -> None:
    changes: list[bool] = []
    caplog.set_level(logging.DEBUG, "service.mqtt")
    client = MqttClient(
        MqttSettings(
            url=url_of(mosquitto),
            client_id=unique("down"),
            reconnect_min_s=0.1,
            reconnect_max_s=0.2,
        ),
        on_connection_change=changes.append,
    )
    client.start()
    assert client.wait_connected(10)
    mosquitto.stop()
    wait_until(lambda: changes == [True, False], 5, "changes == [True, False]")
    # paho has gone round its retry loop more than once
    wait_until(lambda: "(attempt 2); retrying" in caplog.text, 10, "a second failed attempt")
    client.stop()
    # stop() ended the network thread itself; it did not give up waiting for it
    assert network_thread_ended(client)
    assert "did not end within" not in caplog.text
    mosquitto.start()
    with client_for(url_of(mosquitto)):
        pass  # the broker is back and lets clients in; no thread is left to reconnect
    assert changes == [True, False]
    assert not client.connected


# -- TLS ------------------------------------------------------------------------------------


def make_certs(directory: Path, san: str) -> tuple[Path, Path, Path]:
    ca_key, ca, key, csr, cert = (
        directory / n for n in ("ca.key", "ca.pem", "srv.key", "srv.csr", "srv.pem")
    )
    ext = directory / "ext.cnf"
    ext.write_text(f"subjectAltName={san}\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    commands = [
        ["req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=test-ca"],
        ["req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=broker"],
        [
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            ca,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-out",
            cert,
            "-days",
            "2",
            "-extfile",
            ext,
        ],
    ]
    for args in commands:
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)
    for path in (ca, key, cert):
        path.chmod(0o644)
    directory.chmod(0o755)
    return ca, cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
@pytest.mark.parametrize(
    ("san", "insecure", "connects"),
    [
        ("IP:127.0.0.1", "0", True),
        # paho 2.2 leaks the SSLSocket of every failed TLS handshake (never closes it), which
        # the garbage collector reports as ResourceWarning: paho's, not ours to close.
        pytest.param(
            "DNS:elsewhere.example",
            "0",
            False,
            marks=pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
        ),
        ("DNS:elsewhere.example", "1", True),
    ],
)
def test_mqtts(tmp_path: Path, san: str, insecure: str, connects: bool) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    ca, cert, key = make_certs(certs, san)
    # Run as root, mosquitto drops to user "mosquitto", who cannot read pytest's 0700 tmp dir.
    as_root = "user root\n" if os.geteuid() == 0 else ""
    tls_conf = f"cafile {ca}\ncertfile {cert}\nkeyfile {key}\n{as_root}"
    broker = mosquitto_server(tmp_path / "mq", tls_conf, port=free_port())
    try:
        with running(broker):
            url = f"mqtts://127.0.0.1:{broker.port}?ca={ca}&insecure={insecure}"
            with client_for(url, subscriptions=("tls/in",), connect=False) as client:
                assert client.wait_connected(1.5 if not connects else 5) is connects
                if connects:
                    assert client.publish("tls/in", b"secret").wait(5)
                    assert get(client.inbound).payload == b"secret"
    finally:
        broker.stop()  # also when start() timed out: running() does not cover that
