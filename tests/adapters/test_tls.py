"""TLS to the broker (`mqtts://`) and to Redis (`rediss://`), with a CA made in the test.

The broker runs mosquitto.prod.conf with tls.conf.example appended (as mosquitto/README.md
says), so the controller logs in as `lifelong` over TLS under the shipped ACL; redis-server
listens on a TLS port only. The controller gets ready and a round reaches train ready, and
clients without TLS, or that do not trust the CA, are turned away.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as paho
import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from paho.mqtt.enums import CallbackAPIVersion

from service.adapters.mqtt import MqttClient, MqttSettings
from service.embedded.processes import Server, find_binary, free_port, redis_server
from tests.harness import (
    Cloud,
    append_lines,
    lines,
    wait_ingress,
    worker_message,
)
from tests.service.test_intruders import make_passwd, prod_conf_text
from tests.stack import Stack

REPO = Path(__file__).resolve().parents[2]
TLS_EXAMPLE = REPO / "mosquitto" / "tls.conf.example"
JOB = "tls-job"
DATASET = "tls-dataset"


# ------------------------------------------------------------------------------ certificates


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def make_pki(directory: Path) -> Pki:
    """A self-signed CA and a server certificate for 127.0.0.1 and localhost, signed by it."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("lifelong test CA"))
        .issuer_name(_name("lifelong test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca_cert.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pki = Pki(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    pki.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    pki.cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.key, server_key)
    return pki


# ------------------------------------------------------------------------------ servers


def tls_conf_text(port: int, pki: Pki) -> str:
    """tls.conf.example with its listener and certificate paths pointed at this test."""
    replacements = {
        "listener": f"listener {port} 127.0.0.1",
        "cafile": f"cafile {pki.ca}",
        "certfile": f"certfile {pki.cert}",
        "keyfile": f"keyfile {pki.key}",
    }
    out, seen = [], set()
    for line in TLS_EXAMPLE.read_text().splitlines():
        key = line.split(" ", 1)[0]
        seen.update({key} & replacements.keys())
        out.append(replacements.get(key, line))
    assert seen == set(replacements), f"{TLS_EXAMPLE.name} lacks {set(replacements) - seen}"
    return "\n".join(out) + "\n"


@dataclass
class TlsServers:
    broker: Server
    redis: Server
    pki: Pki
    passwords: dict[str, str]


@pytest.fixture
def tls_servers(tmp_path: Path) -> Iterator[TlsServers]:
    pki = make_pki(tmp_path / "pki")
    workdir = tmp_path / "mosquitto-tls"
    workdir.mkdir()
    passwords = {user: secrets.token_urlsafe(12) for user in ("lifelong", "eventbus")}
    passwd = workdir / "passwd"
    make_passwd(passwd, passwords)
    tls_port = free_port()
    conf = workdir / "mosquitto.conf"
    # as root, mosquitto drops to the `mosquitto` user, who cannot read a 0700 tmp_path
    as_root = "user root\n" if os.geteuid() == 0 else ""
    conf.write_text(
        prod_conf_text(free_port(), workdir, passwd) + tls_conf_text(tls_port, pki) + as_root
    )
    broker = Server("mosquitto", [find_binary("mosquitto"), "-c", str(conf)], tls_port, workdir)
    redis_port = free_port()
    store = redis_server(
        tmp_path / "redis-tls",
        "--port", "0",  # no plain listener at all: whoever gets in speaks TLS
        "--tls-port", str(redis_port),
        "--tls-cert-file", str(pki.cert),
        "--tls-key-file", str(pki.key),
        "--tls-ca-cert-file", str(pki.ca),
        "--tls-auth-clients", "no",
        port=redis_port,
    )  # fmt: skip
    broker.start()
    try:
        store.start()
        try:
            yield TlsServers(broker, store, pki, passwords)
        finally:
            store.stop()
    finally:
        broker.stop()


@dataclass
class TlsStack(Stack):
    """A stack whose URLs are given (with their TLS options) rather than derived."""

    mqtt_url: str = ""
    redis_url: str = ""


# ------------------------------------------------------------------------------ tests


def test_round_over_mqtts_and_rediss(tmp_path: Path, tls_servers: TlsServers) -> None:
    servers = tls_servers
    ca = servers.pki.ca
    cloud = Cloud(
        servers.broker.port,
        username="eventbus",
        password=servers.passwords["eventbus"],
        ca_path=str(ca),
    )
    stack = TlsStack(
        tmp_path,
        servers.broker,
        servers.redis,
        cloud,
        mqtt_url=f"mqtts://lifelong:{servers.passwords['lifelong']}@127.0.0.1:{servers.broker.port}"
        f"?ca={ca}",
        redis_url=f"rediss://127.0.0.1:{servers.redis.port}/0?ssl_ca_certs={ca}",
    )
    try:
        data = tmp_path / "data" / "train.txt"
        data.parent.mkdir()
        append_lines(data, lines(0, 10))
        out = tmp_path / "out"
        controller = stack.controller()
        wait_ingress(controller, cloud)
        cloud.insert_dataset(DATASET, data)
        cloud.insert_job(JOB, DATASET, out)
        ready = cloud.wait_status(JOB, "train", "ready")
        assert ready["content"]["input"]["outputDir"] == f"{out}/train/1"
        assert (out / "data" / "train" / "1" / "data.txt").read_text().splitlines() == lines(0, 8)
        # a worker reports over HTTP; the state moves through TLS Redis, the status over TLS MQTT
        model = out / "train" / "1" / "model.pkl"
        model.parent.mkdir(parents=True)
        model.write_bytes(b"trained")
        message = worker_message(JOB, "train", "completed", str(model))
        assert controller.post_worker(message["name"], message)[0] == 200
        cloud.wait_status(JOB, "eval", "ready")
        assert cloud.errors() == []
        # the state really is in the TLS-only Redis
        client = redis.Redis.from_url(stack.redis_url)
        try:
            assert any(b":state:job:" in key for key in client.scan_iter(count=1000))
        finally:
            client.close()
    finally:
        for c in stack.controllers:
            c.stop()
        cloud.close()


def test_clients_without_tls_or_trust_are_turned_away(tls_servers: TlsServers) -> None:
    servers = tls_servers
    password = servers.passwords["lifelong"]
    # plain MQTT to the TLS listener: no CONNACK ever
    assert _mqtt_connack(servers.broker.port, password, tls_ca=None) is None
    # TLS without our CA (the system trust store): the handshake fails
    with (
        socket.create_connection(("127.0.0.1", servers.broker.port), timeout=5) as raw,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        ssl.create_default_context().wrap_socket(raw, server_hostname="127.0.0.1").close()
    # with the CA: in
    assert _mqtt_connack(servers.broker.port, password, tls_ca=str(servers.pki.ca)) == 0
    # Redis: plain is refused, TLS without the CA fails verification, with it answers
    port = servers.redis.port
    with redis.Redis(port=port, socket_timeout=2) as plain, pytest.raises(redis.ConnectionError):
        plain.ping()
    untrusted = redis.Redis.from_url(f"rediss://127.0.0.1:{port}/0", socket_timeout=2)
    with untrusted, pytest.raises(redis.ConnectionError):
        untrusted.ping()
    with redis.Redis.from_url(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={servers.pki.ca}") as ok:
        assert ok.ping() is True


def _mqtt_connack(port: int, password: str, *, tls_ca: str | None) -> int | None:
    """The CONNACK reason code of one login as `lifelong`, or None if none came in 3 s.

    `tls_ca` None speaks plain MQTT, else TLS trusting that CA.
    """
    client = paho.Client(
        CallbackAPIVersion.VERSION2, client_id=f"probe-{free_port()}", protocol=paho.MQTTv5
    )
    client.username_pw_set("lifelong", password)
    if tls_ca is not None:
        client.tls_set(ca_certs=tls_ca)
    codes: list[int] = []
    client.on_connect = lambda _c, _u, _f, rc, _p: codes.append(rc.value)
    try:
        client.connect("127.0.0.1", port, keepalive=5)
        for _ in range(30):
            client.loop(timeout=0.1)
            if codes:
                return codes[0]
        return None
    except OSError:
        return None
    finally:
        client.disconnect()


def test_over_tls_only_pahos_thread_writes(tls_servers: TlsServers) -> None:
    """OpenSSL does not let two threads use one connection at once, so over TLS a batch
    published from another thread wakes paho's thread to write it, as paho does, instead
    of being written by the publishing thread (as on plain TCP). Every publish is taken."""
    servers = tls_servers
    url = (
        f"mqtts://lifelong:{servers.passwords['lifelong']}@127.0.0.1:{servers.broker.port}"
        f"?ca={servers.pki.ca}"
    )
    client = MqttClient(MqttSettings(url=url, client_id="tls-writer"))
    client.start()
    try:
        assert client.wait_connected(10)
        lean = client._paho  # test-only peek
        wake_ups: list[str] = []
        wake = lean._wake

        def counting() -> None:
            wake_ups.append(threading.current_thread().name)
            wake()

        lean._wake = counting  # type: ignore[method-assign]
        with client.batch():
            tickets = [client.publish("sedna/tls/upstream", b"m") for _ in range(50)]
        assert wake_ups == [threading.current_thread().name]
        assert all(ticket.wait(10) for ticket in tickets)
        assert not any(ticket.refused for ticket in tickets)
    finally:
        client.stop()
