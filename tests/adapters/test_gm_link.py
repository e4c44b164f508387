"""The GM link against a GM stand-in (tests/gm_standin.py) over real sockets.

Frames both ways byte for byte, the Node-Name header, redialing after a GM restart, what
`send` answers while the link is down, garbage and oversized frames, a silent GM and a hung
one, prompt stops, a second connection for one node, wss:// with a CA and a client
certificate, and the metrics.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import queue
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as sync_connect

from service.adapters.gm_frames import GmFrame, GmRejected
from service.adapters.gm_link import (
    GmEndpoint,
    GmLink,
    GmLinkSettings,
    LinkStatus,
    parse_gm_address,
)
from service.core.events import DatasetApplied, DatasetDeleted, JobApplied
from service.embedded.processes import free_port
from service.errors import InvalidMessage, PermanentError
from service.metrics import Metrics
from service.runtime.intake import accept_downstream
from tests.gm_standin import GmStandIn
from tests.harness import dataset_resource, job_resource
from tests.wait import wait_until
from tests.wire.test_gm_frames import STATUS_HEADER

NODE = "edge-1"
FAST = GmLinkSettings(redial_s=0.3, open_timeout_s=5.0, close_timeout_s=1.0)
HELLO = b'{"namespace":"","resourceKind":"","resourceName":"","operation":""}\n'


@dataclass
class Endpoint:
    """One GmLink with what it handed on."""

    link: GmLink
    frames: queue.Queue[GmFrame] = field(default_factory=queue.Queue)
    rejected: queue.Queue[GmRejected] = field(default_factory=queue.Queue)

    def next_frame(self, timeout_s: float = 10.0) -> bytes:
        return self.frames.get(timeout=timeout_s).data


@contextlib.contextmanager
def linked(
    endpoint: GmEndpoint | str,
    *,
    node: str = NODE,
    settings: GmLinkSettings = FAST,
    metrics: Metrics | None = None,
) -> Iterator[Endpoint]:
    """A started GmLink to ``endpoint``; stopped at the end."""
    frames: queue.Queue[GmFrame] = queue.Queue()
    rejected: queue.Queue[GmRejected] = queue.Queue()
    link = GmLink(
        parse_gm_address(endpoint) if isinstance(endpoint, str) else endpoint,
        node,
        frames.put,
        on_reject=rejected.put,
        observer=metrics.gm if metrics is not None else None,
        settings=settings,
    )
    link.start()
    try:
        yield Endpoint(link, frames, rejected)
    finally:
        link.stop()


@pytest.fixture
def gm() -> Iterator[GmStandIn]:
    with GmStandIn() as standin:
        yield standin


def up(endpoint: Endpoint) -> Endpoint:
    wait_link(endpoint.link, "up")
    return endpoint


# ------------------------------------------------------------------------------ frames


def wait_link(link: GmLink, status: str) -> None:
    """Until the link's status is ``status`` (10 s at most)."""
    wait_until(lambda: link.state.status == status, 10, f"the GM link {status}",
               detail=lambda: str(link.state))  # fmt: skip


def test_status_frames_reach_the_gm_as_sednas_local_controller_writes_them(
    gm: GmStandIn,
) -> None:
    """Bytes as gorilla's WriteJSON writes them (checked once against Go): the empty-header
    hello first, then each status as a text frame with base64 content and header.id kept."""
    with linked(gm.address) as end:
        up(end)
        job_status = (
            b'{"phase":"train","status":"ready","input":{"dataURL":'
            b'"/out/data/train/1/data.txt","outputDir":"/out/train/1"}}'
        )
        job_header = {**STATUS_HEADER, "resourceKind": "lifelonglearningjob", "id": "s2-9-1"}
        assert end.link.send(STATUS_HEADER, b'{"numberOfSamples":42}')
        assert end.link.send(job_header, job_status)
        assert gm.wait(lambda: len(gm.received(NODE)) == 3)
    hello, dataset, job = gm.received(NODE)
    assert all(frame.text for frame in (hello, dataset, job))
    assert hello.data == HELLO
    assert dataset.data == (
        b'{"header":{"namespace":"default","resourceKind":"dataset","resourceName":"ds-1",'
        b'"operation":"status","id":"s1-17-0"},"content":"eyJudW1iZXJPZlNhbXBsZXMiOjQyfQ=="}\n'
    )
    assert job.data == (
        b'{"header":{"namespace":"default","resourceKind":"lifelonglearningjob",'
        b'"resourceName":"ds-1","operation":"status","id":"s2-9-1"},"content":"eyJwaGFzZSI6'
        b"InRyYWluIiwic3RhdHVzIjoicmVhZHkiLCJpbnB1dCI6eyJkYXRhVVJMIjoiL291dC9kYXRhL3RyYWluLz"
        b'EvZGF0YS50eHQiLCJvdXRwdXREaXIiOiIvb3V0L3RyYWluLzEifX0="}\n'
    )
    assert gm.statuses(NODE)[1] == (job_header, job_status)


def test_gm_frames_reach_the_handler_unchanged_and_decode_as_downstream_messages(
    gm: GmStandIn, tmp_path: Path
) -> None:
    """What the GM writes arrives as is; the intake's downstream decoder takes it. A frame
    the GM queued before the node connected arrives once it does (the GM's per-node queue)."""
    dataset = {
        "apiVersion": "sedna.io/v1alpha1",
        "kind": "Dataset",
        "metadata": {"name": "ds-1", "namespace": "default"},
        "spec": {"url": "/data/ds-1.txt", "format": "txt", "nodeName": "edge-1"},
    }
    early = gm.insert(NODE, dataset)
    with linked(gm.address) as end:
        data = end.next_frame()
        assert data == (
            b'{"header":{"namespace":"default","resourceKind":"dataset","resourceName":"ds-1",'
            b'"operation":"insert"},"content":"eyJhcGlWZXJzaW9uIjoic2VkbmEuaW8vdjFhbHBoYTEiLCJ'
            b"raW5kIjoiRGF0YXNldCIsIm1ldGFkYXRhIjp7Im5hbWUiOiJkcy0xIiwibmFtZXNwYWNlIjoiZGVmYXV"
            b"sdCJ9LCJzcGVjIjp7InVybCI6Ii9kYXRhL2RzLTEudHh0IiwiZm9ybWF0IjoidHh0Iiwibm9kZU5hbWU"
            b'iOiJlZGdlLTEifX0="}\n'
        )
        assert data == early.encode()
        applied = accept_downstream("gm", data, 1).event
        assert isinstance(applied, DatasetApplied)
        assert (applied.name, applied.url) == ("ds-1", "/data/ds-1.txt")

        gm.insert(NODE, job_resource("job-1", "ds-1", str(tmp_path / "out")))
        assert isinstance(accept_downstream("gm", end.next_frame(), 1).event, JobApplied)
        gm.delete(NODE, dataset)
        deleted = accept_downstream("gm", end.next_frame(), 1).event
        assert deleted == DatasetDeleted(namespace="default", name="ds-1")
        assert end.link.state.frames_in == 3


def test_the_node_name_header_is_sent_and_a_dial_without_it_is_refused(gm: GmStandIn) -> None:
    with linked(gm.address, node="node-a.example") as end:
        up(end)
    assert gm.handshakes[0]["Node-Name"] == "node-a.example"
    assert gm.connects("node-a.example") == 1
    with pytest.raises(InvalidStatus), sync_connect(f"ws://{gm.address}/", open_timeout=5):
        pass
    assert gm.refused == 1


# ------------------------------------------------------------------------------ down and up


def test_send_is_false_while_the_gm_cannot_be_reached() -> None:
    with linked(f"127.0.0.1:{free_port()}") as end:
        wait_link(end.link, "down")
        assert end.link.send(STATUS_HEADER, b"{}") is False
        state = end.link.state
    assert state.last_error is not None
    assert "Connect call failed" in state.last_error
    assert (state.frames_out, state.reconnects) == (0, 0)


def test_the_link_redials_after_the_gm_restarts_and_send_works_again(gm: GmStandIn) -> None:
    with linked(gm.address) as end:
        up(end)
        gm.stop()
        assert gm.wait(lambda: end.link.state.status != "up")
        assert end.link.send(STATUS_HEADER, b'{"numberOfSamples":1}') is False
        assert end.link.state.last_error is not None
        gm.start()
        up(end)
        assert end.link.send(STATUS_HEADER, b'{"numberOfSamples":2}')
        assert gm.wait(lambda: len(gm.statuses(NODE)) == 1)
        state = end.link.state
    assert (state.reconnects, state.frames_out) == (1, 1)
    assert gm.connects(NODE) == 2
    assert [r.data for r in gm.received(NODE)].count(HELLO) == 2
    assert gm.statuses(NODE) == [(STATUS_HEADER, b'{"numberOfSamples":2}')]


def test_the_link_redials_when_the_gm_closes_the_connection(gm: GmStandIn) -> None:
    with linked(gm.address) as end:
        up(end)
        gm.close_connections(NODE)
        assert gm.wait(lambda: end.link.state.reconnects == 1)
        up(end)
        assert end.link.state.last_error is not None
        assert "1001" in end.link.state.last_error


# ------------------------------------------------------------------------------ bad frames

GARBAGE: list[tuple[str | bytes, str]] = [
    ("not json\n", "not valid JSON"),
    (b"\x00\xffbinary", "not valid JSON"),
    ("[1,2]\n", "expected a JSON object"),
    (
        '{"header":{"namespace":"default","resourceKind":"dataset","resourceName":"x",'
        '"operation":"insert"},"content":"%%%"}\n',
        "not valid base64",
    ),
    (
        '{"header":{"namespace":"default","resourceKind":"dataset","resourceName":"x",'
        '"operation":"insert"},"content":null}\n',
        "$.content",
    ),
    (
        '{"header":{"namespace":"default","resourceKind":"reidjob",'
        '"resourceName":"x","operation":"update"},"content":null}\n',
        "unknown resourceKind",
    ),
]


def test_garbage_frames_reach_the_handler_as_sent_and_the_link_stays_up(gm: GmStandIn) -> None:
    """Sedna's local controller drops the connection on a frame it cannot read; this link
    hands every frame on (the intake's decoder rejects it with a reason) and keeps going."""
    with linked(gm.address) as end:
        up(end)
        for data, _reason in GARBAGE:
            gm.send_raw(NODE, data)
        gm.send_text_bytes(NODE, b'{"header":\xff\xfe}\n')  # a text frame that is not UTF-8
        gm.insert(NODE, dataset_resource("ds-after", "/data/x.txt"))
        for data, reason in GARBAGE:
            got = end.next_frame()
            assert got == (data.encode() if isinstance(data, str) else data)
            with pytest.raises(InvalidMessage) as caught:
                accept_downstream("gm", got, 1)
            assert reason in str(caught.value)
        assert end.next_frame() == b'{"header":\xff\xfe}\n'
        after = accept_downstream("gm", end.next_frame(), 1).event
        assert isinstance(after, DatasetApplied)
        state = end.link.state
    assert (state.status, state.reconnects, state.frames_in) == ("up", 0, len(GARBAGE) + 2)
    assert gm.connects(NODE) == 1
    assert end.rejected.empty()


def test_an_oversized_frame_is_rejected_and_the_link_comes_back(gm: GmStandIn) -> None:
    settings = GmLinkSettings(redial_s=0.3, close_timeout_s=1.0, max_frame_bytes=1024)
    with linked(gm.address, settings=settings) as end:
        up(end)
        gm.send_raw(NODE, "x" * 2000)
        rejected = end.rejected.get(timeout=10)
        assert "larger than 1024 bytes" in rejected.reason
        assert gm.wait(lambda: end.link.state.reconnects == 1)
        gm.insert(NODE, dataset_resource("ds-1", "/data/x.txt"))
        assert b'"resourceName":"ds-1"' in end.next_frame()
    assert end.frames.empty()


def test_a_handler_that_raises_does_not_stop_the_link(gm: GmStandIn) -> None:
    seen: list[bytes] = []

    def handler(frame: GmFrame) -> None:
        seen.append(frame.data)
        raise RuntimeError("handler bug")

    link = GmLink(parse_gm_address(gm.address), NODE, handler, settings=FAST)
    link.start()
    try:
        wait_link(link, "up")
        gm.send_raw(NODE, "one")
        gm.send_raw(NODE, "two")
        assert gm.wait(lambda: len(seen) == 2)
        assert (link.state.status, link.state.reconnects) == ("up", 0)
    finally:
        link.stop()
    assert seen == [b"one", b"two"]
    assert gm.connects(NODE) == 1


def test_send_from_the_frame_handler_is_refused(gm: GmStandIn) -> None:
    """The handler runs on the link's thread; a send there would wait on itself."""
    errors: list[Exception] = []
    link: GmLink

    def handler(_frame: GmFrame) -> None:
        try:
            link.send(STATUS_HEADER, b"{}")
        except PermanentError as e:
            errors.append(e)

    link = GmLink(parse_gm_address(gm.address), NODE, handler, settings=FAST)
    link.start()
    try:
        wait_link(link, "up")
        gm.send_raw(NODE, "x")
        assert gm.wait(lambda: len(errors) == 1)
    finally:
        link.stop()
    assert "own thread" in str(errors[0])


def test_a_write_the_gm_does_not_read_times_out_and_the_link_redials(gm: GmStandIn) -> None:
    settings = GmLinkSettings(redial_s=0.3, send_timeout_s=0.5, close_timeout_s=0.5)
    with linked(gm.address, settings=settings) as end:
        up(end)
        gm.freeze(NODE)
        huge = b'{"pad":"' + b"x" * (64 << 20) + b'"}'  # far more than the socket buffers hold
        assert end.link.send(STATUS_HEADER, huge) is False
        assert gm.wait(lambda: end.link.state.reconnects == 1)
        up(end)
        assert end.link.send(STATUS_HEADER, b'{"numberOfSamples":1}')
        assert gm.wait(lambda: len(gm.statuses(NODE)) == 1)
        assert end.link.state.frames_out == 1


# ------------------------------------------------------------------------------ silence


def pings_answered(link: GmLink) -> list[int]:
    """A counter, from now on, of the keepalive pings of the link's connection the GM
    answered (test-only: wraps the connection's ping(), which the keepalive calls)."""
    connection = link._connection
    assert connection is not None
    answered = [0]
    ping = connection.ping

    async def counted(data: Any = None) -> Any:
        pong = await ping(data)

        def count(done: Any) -> None:
            if not done.cancelled() and done.exception() is None:
                answered[0] += 1

        pong.add_done_callback(count)
        return pong

    connection.ping = counted  # type: ignore[method-assign]
    return answered


def test_a_silent_gm_keeps_the_link_up(gm: GmStandIn) -> None:
    """The GM never sends unless it has something; pings (answered as gorilla answers them)
    keep the link up through many ping intervals."""
    settings = GmLinkSettings(redial_s=0.3, ping_interval_s=0.05, ping_timeout_s=2.0)
    with linked(gm.address, settings=settings) as end:
        up(end)
        since = end.link.state.since
        answered = pings_answered(end.link)
        # twenty ping intervals of silence, each ping answered
        wait_until(lambda: answered[0] >= 20, 30, "twenty pings answered")
        state = end.link.state
    assert (state.status, state.since, state.reconnects) == ("up", since, 0)
    assert gm.connects(NODE) == 1


def test_a_hung_gm_is_found_by_pings_and_the_link_redials(gm: GmStandIn) -> None:
    """A GM that stops reading (so answers no ping) is dropped after the ping timeout."""
    settings = GmLinkSettings(
        redial_s=0.3, ping_interval_s=0.1, ping_timeout_s=0.5, close_timeout_s=0.5
    )
    with linked(gm.address, settings=settings) as end:
        up(end)
        gm.freeze(NODE)
        assert gm.wait(lambda: end.link.state.reconnects == 1, timeout_s=20)
        up(end)
        assert gm.wait(lambda: gm.connects(NODE) == 2)


# ------------------------------------------------------------------------------ stop


def _gm_link_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gm-link"]


@pytest.mark.parametrize("where", ["up", "waiting to redial", "in the handshake"])
def test_stop_is_prompt_idempotent_and_ends_the_thread(gm: GmStandIn, where: str) -> None:
    """Redial and dial timeouts are a minute here; stop must not wait for them."""
    slow = GmLinkSettings(redial_s=60.0, open_timeout_s=60.0, close_timeout_s=1.0)
    with (
        contextlib.ExitStack() as stack,
        socket.socket() as mute,  # accepts TCP connections, never answers the upgrade
    ):
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        address = {
            "up": gm.address,
            "waiting to redial": f"127.0.0.1:{free_port()}",
            "in the handshake": f"127.0.0.1:{mute.getsockname()[1]}",
        }[where]
        link = GmLink(parse_gm_address(address), NODE, lambda _f: None, settings=slow)
        assert link.state.status == "disabled"
        link.start()
        link.start()  # a second start does nothing
        expected: dict[str, LinkStatus] = {
            "up": "up",
            "waiting to redial": "down",
            "in the handshake": "connecting",
        }
        wait_link(link, expected[where])
        if where == "in the handshake":  # the dial is under way: its upgrade request came
            mute.settimeout(10)
            dialled, _ = mute.accept()
            stack.enter_context(dialled)
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = dialled.recv(4096)
                assert chunk, "the link closed before sending its upgrade request"
                request += chunk
            assert request.startswith(b"GET ")
        assert len(_gm_link_threads()) == 1
        link.stop(timeout_s=10.0)
        assert _gm_link_threads() == []
        link.stop()
        link.start()  # a stopped link stays stopped
        assert _gm_link_threads() == []
        assert link.state.status == "disabled"
        assert link.send(STATUS_HEADER, b"{}") is False
    if where == "up":  # a polite close: the GM saw the connection end
        assert gm.wait(lambda: gm.connections(NODE) == 0)


# ------------------------------------------------------------------------------ the GM's queue


def test_a_second_connection_for_the_node_takes_a_share_of_the_gms_frames(
    gm: GmStandIn,
) -> None:
    """Why only one replica may hold the link: the GM keeps both connections and hands each
    queued frame to one of them."""
    with linked(gm.address) as first, linked(gm.address) as second:
        up(first)
        up(second)
        assert gm.wait(lambda: gm.connections(NODE) == 2)
        gm.insert(NODE, dataset_resource("ds-1", "/data/1.txt"))
        gm.insert(NODE, dataset_resource("ds-2", "/data/2.txt"))
        got = sorted([first.next_frame(), second.next_frame()])
        assert b'"resourceName":"ds-1"' in got[0]
        assert b'"resourceName":"ds-2"' in got[1]


# ------------------------------------------------------------------------------ TLS


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    usage: x509.ObjectIdentifier | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer or (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if usage == ExtendedKeyUsageOID.SERVER_AUTH:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Path:
    path.with_suffix(".key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def make_pki(directory: Path) -> Pki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, signed by it."""
    ca_key, server_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in "abc")
    ca = _issue("gm test CA", ca_key, None)
    server = _issue(
        "127.0.0.1", server_key, (ca.subject, ca_key), usage=ExtendedKeyUsageOID.SERVER_AUTH
    )
    client = _issue(NODE, client_key, (ca.subject, ca_key), usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write(directory / "server.pem", server, server_key)
    _write(directory / "client.pem", client, client_key)
    return Pki(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
    )


def test_wss_with_a_ca_and_a_client_certificate(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(pki.server_cert, pki.server_key)
    server_tls.load_verify_locations(pki.ca)
    server_tls.verify_mode = ssl.CERT_REQUIRED
    with GmStandIn(ssl_context=server_tls) as gm:
        base = f"wss://127.0.0.1:{gm.port}/"
        full = f"{base}?ca={pki.ca}&cert={pki.client_cert}&key={pki.client_key}"
        with linked(full) as end:
            up(end)
            assert end.link.send(STATUS_HEADER, b'{"numberOfSamples":3}')
            assert gm.wait(lambda: len(gm.statuses(NODE)) == 1)
        with linked(f"{base}?ca={pki.ca}") as no_cert, linked(base) as no_ca:
            wait_link(no_cert.link, "down")
            wait_link(no_ca.link, "down")
            assert "CERTIFICATE_VERIFY_FAILED" in (no_ca.link.state.last_error or "")
        assert gm.connects(NODE) == 1


# ------------------------------------------------------------------------------ metrics


def test_frames_reconnects_and_link_up_are_counted(gm: GmStandIn) -> None:
    metrics = Metrics(gm_link=True)

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    with linked(gm.address, metrics=metrics) as end:
        up(end)
        assert sample("lifelong_gm_link_up") == 1.0
        gm.send_raw(NODE, "x")
        end.next_frame()
        gm.stop()
        assert gm.wait(lambda: end.link.state.status != "up")
        assert sample("lifelong_gm_link_up") == 0.0
        gm.start()
        assert gm.wait(lambda: end.link.state.reconnects == 1)
        up(end)
        assert end.link.send(STATUS_HEADER, b"{}")
        assert sample("lifelong_gm_frames_total", direction="in") == 1.0
        assert sample("lifelong_gm_frames_total", direction="out") == 1.0
        assert sample("lifelong_gm_reconnects_total") == 1.0
    assert sample("lifelong_gm_link_up") == 0.0
