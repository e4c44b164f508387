"""The MQTT adapter against a real mosquitto: round trips, reconnects, sessions, wills, TLS."""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from paho.mqtt.enums import MQTTProtocolVersion

from service.adapters.mqtt import (
    Inbound,
    MqttClient,
    MqttEndpoint,
    MqttSettings,
    TlsOptions,
    fallback_protocol,
    parse_mqtt_url,
)
from service.errors import ConfigError
from service.urls import redact_url
from tests.servers import Server, free_port, mosquitto_server, running

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
        yield client
    finally:
        client.stop()


def get(q: queue.SimpleQueue[Inbound], timeout_s: float = 5.0) -> Inbound:
    return q.get(timeout=timeout_s)


def assert_nothing(q: queue.SimpleQueue[Inbound], wait_s: float) -> None:
    with pytest.raises(queue.Empty):
        item = q.get(timeout=wait_s)
        pytest.fail(f"unexpected message {item}")


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


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


# -- URL parsing ----------------------------------------------------------------------------


def test_parse_plain_url_defaults_port() -> None:
    assert parse_mqtt_url("mqtt://broker.local") == MqttEndpoint(
        "broker.local", 1883, None, None, False, TlsOptions()
    )


def test_parse_url_with_credentials_and_port() -> None:
    host, port, user, password, tls, _ = parse_mqtt_url("mqtt://edge%40x:p%2Fss@10.0.0.5:1999")
    assert (host, port, user, password, tls) == ("10.0.0.5", 1999, "edge@x", "p/ss", False)


def test_parse_mqtts_with_tls_options() -> None:
    endpoint = parse_mqtt_url(
        "mqtts://u:pw@broker?ca=/etc/ca.pem&cert=/c.pem&key=/k.pem&insecure=1"
    )
    assert endpoint.port == 8883
    assert endpoint.tls
    assert endpoint.tls_options == TlsOptions("/etc/ca.pem", "/c.pem", "/k.pem", insecure=True)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://user:s3cret@broker:1883", "unsupported scheme 'http'"),
        ("mqtt://user:s3cret@:1883", "no host"),
        ("mqtt://user:s3cret@broker:99999", "port"),
        ("mqtt://user:s3cr/et@broker", "port"),
        ("mqtt://user:s3cret@broker/topic", "no path"),
        ("mqtt://user:s3cret@broker?ca=/ca.pem", "need the mqtts:// scheme"),
        ("mqtts://user:s3cret@broker?color=red", "unknown query parameter 'color'"),
        ("mqtts://user:s3cret@broker?cert=/c.pem", "together"),
        ("mqtts://user:s3cret@broker?insecure=maybe", "insecure="),
    ],
)
def test_bad_urls_raise_config_error_without_the_password(url: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_mqtt_url(url)
    message = str(caught.value)
    assert problem in message
    assert "s3cr" not in message
    # Nor anywhere in the printed traceback (no chained urllib error quoting it).
    assert "s3cr" not in "".join(traceback.format_exception(caught.value))


def test_redact_url_masks_only_the_password() -> None:
    assert redact_url("mqtts://edge:hunter2@b:8883?ca=/x") == "mqtts://edge:***@b:8883?ca=/x"
    assert redact_url("mqtt://b:1883") == "mqtt://b:1883"


def test_client_rejects_unreadable_tls_files_as_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="TLS"):
        MqttClient(MqttSettings(url=f"mqtts://b?ca={tmp_path}/missing.pem", client_id="x"))


@pytest.mark.parametrize("overrides", [
    {"client_id": "", "clean_start": False},
    {"reconnect_min_s": 0.0},
    {"reconnect_min_s": 5.0, "reconnect_max_s": 1.0},
    {"will": ("", b"offline", True)},
])
def test_bad_settings_raise_config_error(overrides: dict[str, object]) -> None:
    fields: dict[str, object] = {"url": "mqtt://b", "client_id": "x", **overrides}
    with pytest.raises(ConfigError):
        MqttClient(MqttSettings(**fields))  # type: ignore[arg-type]


# -- protocol fallback ----------------------------------------------------------------------


def test_fallback_decision() -> None:
    v5, v311 = MQTTProtocolVersion.MQTTv5, MQTTProtocolVersion.MQTTv311
    assert fallback_protocol(v5, 0x84) == v311
    assert fallback_protocol(v5, 1) == v311
    assert fallback_protocol(v5, 0x86) is None  # bad user name or password: not a version issue
    assert fallback_protocol(v5, 0x87) is None
    assert fallback_protocol(v311, 1) is None  # never below 3.1.1


class V5RefusingProxy:
    """Stands in front of mosquitto like a 3.1.1-only broker: a v5 CONNECT gets the 3.1.1
    CONNACK "unacceptable protocol version"; anything else is piped to the real broker."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.levels_seen: list[int] = []
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.sockets.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            first = self._read_packet(conn)
            level = first[8]  # type byte, 1-byte length, 0x0004 "MQTT", then the level
            self.levels_seen.append(level)
            if level == 5:
                conn.sendall(b"\x20\x02\x00\x01")
                conn.close()
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            self.sockets.append(upstream)
            upstream.sendall(first)
            threading.Thread(target=self._pipe, args=(upstream, conn), daemon=True).start()
            self._pipe(conn, upstream)

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

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def test_falls_back_to_311_when_broker_refuses_v5(mosquitto: Server) -> None:
    proxy = V5RefusingProxy(mosquitto.port)
    try:
        url = f"mqtt://127.0.0.1:{proxy.port}"
        settings = MqttSettings(url=url, client_id=unique("fb"), reconnect_min_s=0.1)
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
    finally:
        proxy.close()


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


def test_subscriptions_renewed_after_broker_restart(mosquitto: Server) -> None:
    url = url_of(mosquitto)
    changes: list[bool] = []
    with client_for(url, subscriptions=("r/in",), on_change=changes.append) as sub:
        subscribed(sub, url, "r/in")
        mosquitto.restart()
        assert wait_until(lambda: changes.count(True) >= 2), changes
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
                assert wait_until(lambda c=sub: c.subscribed, 10)  # type: ignore[misc]
                assert pub.publish(topic, b"right away").wait(5)
                assert get(sub.inbound).payload == b"right away"
        with client_for(url, subscriptions=("r/in",)) as sub:
            assert wait_until(lambda: sub.subscribed, 10)
            mosquitto.stop()
            assert wait_until(lambda: not sub.subscribed, 5)
            mosquitto.start()
            assert wait_until(lambda: sub.subscribed, 10)
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
        assert wait_until(lambda: client.subscribed, 10)
        assert at_connack == [False]
    finally:
        client.stop()


def test_publish_while_broker_down_is_sent_after_reconnect(mosquitto: Server) -> None:
    url = url_of(mosquitto)
    with client_for(url, subscriptions=("q/in",)) as client:
        mosquitto.stop()
        assert wait_until(lambda: not client.connected, 5)
        ticket = client.publish("q/in", b"while down")
        assert not ticket.wait(0.3)
        mosquitto.start()
        assert ticket.wait(10)
        assert get(client.inbound).payload == b"while down"


# -- manual ack + persistent session --------------------------------------------------------


def test_unacked_message_redelivered_to_next_holder_and_not_after_ack(
    mosquitto: Server, holder_factory: Callable[..., Holder]
) -> None:
    url, client_id, topic = url_of(mosquitto), unique("ingress"), "sedna/node1/downstream"
    holder = holder_factory(url, client_id, topic)
    assert holder.line() == "ready"
    with client_for(url) as pub:
        holder.wait_subscribed(pub, topic)
        assert pub.publish(topic, b"m1").wait(5)
        assert holder.line() == "got m1 False"
        holder.kill()  # never acked, no DISCONNECT

        persistent = {"clean_start": False, "session_expiry_s": 300, "manual_ack": True}
        with client_for(url, client_id, subscriptions=(topic,), **persistent) as second:
            msg = get(second.inbound)
            assert (msg.payload, msg.dup) == (b"m1", True)
            second.ack(msg)
            assert pub.publish(topic, b"m2").wait(5)
            m2 = get(second.inbound)
            assert m2.payload == b"m2"
            second.ack(m2)
        with client_for(url, client_id, subscriptions=(topic,), **persistent) as third:
            assert_nothing(third.inbound, 1.0)
            assert pub.publish(topic, b"m3").wait(5)
            msg = get(third.inbound)
            assert (msg.payload, msg.dup) == (b"m3", False)
            third.ack(msg)


def drop_connection(client: MqttClient) -> None:
    """Test-only hack: cut the TCP connection under paho, as a network fault would."""
    sock = client._paho.socket()
    assert sock is not None
    sock.shutdown(socket.SHUT_RDWR)


def test_session_resumes_on_reconnect_and_stale_acks_are_dropped(mosquitto: Server) -> None:
    url, topic = url_of(mosquitto), "s/in"
    changes: list[bool] = []
    persistent = {"clean_start": False, "session_expiry_s": 300, "manual_ack": True}
    with (
        client_for(url, subscriptions=(topic,), on_change=changes.append, **persistent) as client,
        client_for(url) as pub,
    ):
        assert pub.publish(topic, b"m1").wait(5)
        first = get(client.inbound)
        drop_connection(client)
        again = get(client.inbound)  # paho reconnects by itself; the session is resumed
        assert (again.payload, again.dup) == (b"m1", True)
        assert again.connection_seq != first.connection_seq
        client.ack(first)  # from the dead connection: must not be sent on this one
        time.sleep(0.3)
        drop_connection(client)
        third = get(client.inbound)  # so the broker still holds it unacknowledged
        assert (third.payload, third.dup) == (b"m1", True)
        client.ack(third)
        time.sleep(0.3)
        drop_connection(client)
        assert wait_until(lambda: changes.count(True) == 4 and client.connected, 10), changes
        assert_nothing(client.inbound, 0.7)


# -- will, stop -----------------------------------------------------------------------------


def test_will_published_when_holder_dies(
    mosquitto: Server, holder_factory: Callable[..., Holder]
) -> None:
    url, will_topic = url_of(mosquitto), "sedna/node1/controllers/r-0"
    holder = holder_factory(url, unique("will"), "unused/topic", will_topic)
    assert holder.line() == "ready"
    holder.kill()
    with client_for(url, subscriptions=(will_topic,)) as watcher:
        msg = get(watcher.inbound)  # retained: arrives even though we subscribed late
        assert (msg.topic, msg.payload) == (will_topic, b"offline")


def test_stop_does_not_send_the_will_unless_asked(mosquitto: Server) -> None:
    url = url_of(mosquitto)
    quiet, loud = "ctl/quiet", "ctl/loud"
    with client_for(url, subscriptions=("ctl/#",)) as watcher:
        subscribed(watcher, url, "ctl/probe")
        with client_for(url, will=(quiet, b"offline", True)):
            pass  # stop(): normal DISCONNECT discards the will
        assert_nothing(watcher.inbound, 0.7)
        client = MqttClient(
            MqttSettings(url=url, client_id=unique("l"), will=(loud, b"offline", True))
        )
        client.start()
        assert client.wait_connected(10)
        client.stop(send_will=True)
        msg = get(watcher.inbound)
        assert (msg.topic, msg.payload) == (loud, b"offline")
        client.stop()  # idempotent


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
            assert wait_until(lambda: first_changes.count(True) >= 2, 5), first_changes
            first.stop()
            assert wait_until(lambda: second.connected, 5)
            before = len(second_changes)
            time.sleep(1.5)
            assert second.connected
            assert len(second_changes) == before, second_changes[before:]
            assert not first.connected
    finally:
        first.stop()


def test_stop_while_broker_down_ends_retries(mosquitto: Server) -> None:
    changes: list[bool] = []
    client = MqttClient(MqttSettings(url=url_of(mosquitto), client_id=unique("down"),
                                     reconnect_min_s=0.1, reconnect_max_s=0.2),
                        on_connection_change=changes.append)
    client.start()
    assert client.wait_connected(10)
    mosquitto.stop()
    assert wait_until(lambda: changes == [True, False], 5), changes
    time.sleep(0.3)  # let paho go round its retry loop at least once
    started = time.monotonic()
    client.stop()
    assert time.monotonic() - started < 2.0
    mosquitto.start()
    time.sleep(0.6)  # several reconnect periods
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
