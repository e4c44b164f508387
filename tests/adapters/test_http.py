"""The HTTP adapter on a real socket: routes, status codes, limits, failing callbacks, metrics."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from service.adapters.http_server import HttpServer
from service.errors import ConfigError
from service.metrics import Metrics
from tests.harness import still_open
from tests.wait import wait_until

TIMEOUT_S = 5.0
MAX_BODY_BYTES = 1024


@dataclass
class Callbacks:
    """What the runtime would provide; records calls and can be told to fail."""

    metrics: Metrics = field(default_factory=Metrics)
    ready_state: tuple[bool, str] = (True, "ready: redis ok, broker ok")
    fail: bool = False
    calls: list[tuple[str, bytes]] = field(default_factory=list)

    def ready(self) -> tuple[bool, str]:
        if self.fail:
            raise RuntimeError("ready exploded")
        return self.ready_state

    def render(self) -> tuple[bytes, str]:
        return self.metrics.render()

    def worker_info(self, worker: str, body: bytes) -> tuple[int, str]:
        if self.fail:
            raise RuntimeError("secret internals /etc/passwd")
        self.calls.append((worker, body))
        name = json.loads(body).get("name")
        if name != worker:
            return 400, f"worker name {name!r} does not match path {worker!r}"
        return 200, "OK"


@pytest.fixture
def callbacks() -> Callbacks:
    return Callbacks()


@pytest.fixture
def server(callbacks: Callbacks) -> Iterator[HttpServer]:
    srv = HttpServer(
        "127.0.0.1",
        0,
        ready=callbacks.ready,
        metrics=callbacks.render,
        worker_info=callbacks.worker_info,
        max_body_bytes=MAX_BODY_BYTES,
    )
    srv.start()
    yield srv
    srv.stop()


def request(
    server: HttpServer,
    path: str,
    method: str = "GET",
    body: bytes | None = None,
    timeout_s: float = TIMEOUT_S,
) -> tuple[int, bytes, dict[str, str]]:
    """Send one request; HTTP errors are returned like successes, not raised."""
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", body, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read(), dict(e.headers)


def raw_request(server: HttpServer, method: str, path: str, headers: dict[str, str],
                body: bytes = b"") -> tuple[int, bytes]:  # fmt: skip
    """Send exactly the given headers (urllib would add a Content-Length)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT_S)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders(body or None)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def worker_body(name: str) -> bytes:
    return json.dumps({"name": name, "namespace": "default", "ownerName": "job",
                       "ownerKind": "lifelonglearningjob", "kind": "train",
                       "status": "completed", "results": []}).encode()  # fmt: skip


def test_healthz(server: HttpServer) -> None:
    assert request(server, "/healthz")[:2] == (200, b"ok")


def test_readyz_follows_the_callback(server: HttpServer, callbacks: Callbacks) -> None:
    assert request(server, "/readyz")[:2] == (200, b"ready: redis ok, broker ok")
    callbacks.ready_state = (False, "redis unreachable")
    assert request(server, "/readyz")[:2] == (503, b"redis unreachable")


def test_metrics_render(server: HttpServer, callbacks: Callbacks) -> None:
    callbacks.metrics.events.labels(type="insert", outcome="applied").inc(3)
    callbacks.metrics.rejections.labels(reason="invalid_json").inc()
    callbacks.metrics.transition_seconds.observe(0.002)
    callbacks.metrics.dataset_samples.labels(namespace="default", name="ds").set(42)
    status, body, headers = request(server, "/metrics")
    text = body.decode()
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    assert 'lifelong_events_total{outcome="applied",type="insert"} 3.0' in text
    assert 'lifelong_rejections_total{reason="invalid_json"} 1.0' in text
    assert 'lifelong_transition_seconds_bucket{le="0.0025"} 1.0' in text
    assert 'lifelong_transition_seconds_bucket{le="0.0005"} 0.0' in text
    assert 'lifelong_dataset_samples{name="ds",namespace="default"} 42.0' in text
    assert "lifelong_outbox_depth 0.0" in text
    assert "lifelong_leases_held 0.0" in text
    assert "# TYPE lifelong_effects_total counter" in text


def test_metrics_registries_are_private() -> None:
    first, second = Metrics(), Metrics()
    first.events.labels(type="insert", outcome="applied").inc()
    assert b'type="insert"' in first.render()[0]
    assert b'type="insert"' not in second.render()[0]


def test_worker_info_ok(server: HttpServer, callbacks: Callbacks) -> None:
    status, body, headers = request(server, "/sedna/workers/w-1/info", "POST", worker_body("w-1"))
    assert (status, json.loads(body)) == (200, {"status": 200, "message": "OK"})
    assert headers["Content-Type"] == "application/json"
    assert callbacks.calls == [("w-1", worker_body("w-1"))]


def test_worker_info_rejected(server: HttpServer) -> None:
    status, body, _ = request(server, "/sedna/workers/w-1/info", "POST", worker_body("other"))
    assert status == 400
    assert json.loads(body) == {
        "status": 400,
        "message": "worker name 'other' does not match path 'w-1'",
    }


def test_body_without_content_type_is_415(server: HttpServer, callbacks: Callbacks) -> None:
    """A browser sends a Blob body without a type cross-site with no preflight: refused too."""
    body = worker_body("w-2")
    status, reply = raw_request(
        server, "POST", "/sedna/workers/w-2/info", {"Content-Length": str(len(body))}, body
    )
    assert (status, json.loads(reply)["message"]) == (415, "Content-Type application/json required")
    assert callbacks.calls == []


def test_body_over_limit_is_413(server: HttpServer, callbacks: Callbacks) -> None:
    for size in (MAX_BODY_BYTES + 1, 4 << 20):  # the large one outgrows the socket buffers
        status, body, _ = request(server, "/sedna/workers/w-1/info", "POST", b"x" * size)
        assert status == 413
        assert json.loads(body)["message"] == f"body of {size} bytes exceeds {MAX_BODY_BYTES}"
    assert callbacks.calls == []
    assert request(server, "/healthz")[0] == 200


def test_an_oversize_body_awaiting_100_continue_is_refused_before_it_is_sent(
    server: HttpServer, callbacks: Callbacks
) -> None:
    client = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT_S)
    with client:
        client.sendall(b"POST /sedna/workers/w-1/info HTTP/1.1\r\nHost: lifelong\r\n"
                       b"Content-Type: application/json\r\nContent-Length: 4194304\r\n"
                       b"Expect: 100-continue\r\n\r\n")  # fmt: skip
        received = b""
        while chunk := client.recv(4096):
            received += chunk
    assert received.startswith(b"HTTP/1.1 413 "), received
    assert json.loads(received.partition(b"\r\n\r\n")[2])["message"] == (
        f"body of 4194304 bytes exceeds {MAX_BODY_BYTES}"
    )
    assert callbacks.calls == []


def test_missing_content_length_is_411(server: HttpServer, callbacks: Callbacks) -> None:
    status, body = raw_request(server, "POST", "/sedna/workers/w-1/info", {})
    assert status == 411
    assert json.loads(body)["status"] == 411
    assert callbacks.calls == []


def test_bad_content_length_is_400(server: HttpServer) -> None:
    status, _ = raw_request(server, "POST", "/sedna/workers/w-1/info", {"Content-Length": "-5"})
    assert status == 400


@pytest.mark.parametrize(
    "path", ["/", "/nope", "/sedna/workers//info", "/sedna/workers/a/b/info", "/healthz/x"]
)
def test_unknown_path_is_404(server: HttpServer, path: str) -> None:
    assert request(server, path)[0] == 404
    assert request(server, path, "POST", b"{}")[0] == 404


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/sedna/workers/w-1/info", "POST"),
        ("PUT", "/sedna/workers/w-1/info", "POST"),
        ("POST", "/healthz", "GET, HEAD"),
        ("DELETE", "/metrics", "GET, HEAD"),
    ],
)
def test_wrong_method_is_405(server: HttpServer, method: str, path: str, allow: str) -> None:
    body = b"{}" if method in ("POST", "PUT") else None
    status, _, headers = request(server, path, method, body)
    assert (status, headers["Allow"]) == (405, allow)


def test_head_has_no_body(server: HttpServer) -> None:
    status, body = raw_request(server, "HEAD", "/healthz", {})
    assert (status, body) == (200, b"")


def test_failing_callback_is_500_and_server_survives(
    server: HttpServer, callbacks: Callbacks
) -> None:
    callbacks.fail = True
    status, body, _ = request(server, "/sedna/workers/w-1/info", "POST", worker_body("w-1"))
    assert status == 500
    assert json.loads(body) == {"status": 500, "message": "internal error"}
    assert b"Traceback" not in body and b"passwd" not in body
    assert request(server, "/readyz")[0] == 500
    callbacks.fail = False
    assert request(server, "/sedna/workers/w-1/info", "POST", worker_body("w-1"))[0] == 200
    assert request(server, "/healthz")[:2] == (200, b"ok")


def test_concurrent_reports(server: HttpServer, callbacks: Callbacks) -> None:
    statuses: list[int] = []

    def report(i: int) -> None:
        statuses.append(
            request(server, f"/sedna/workers/w-{i}/info", "POST", worker_body(f"w-{i}"))[0]
        )

    threads = [threading.Thread(target=report, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    assert statuses == [200] * 20
    assert sorted(w for w, _ in callbacks.calls) == sorted(f"w-{i}" for i in range(20))


def test_stop_releases_the_port(callbacks: Callbacks) -> None:
    srv = HttpServer("127.0.0.1", 0, ready=callbacks.ready, metrics=callbacks.render,
                     worker_info=callbacks.worker_info)  # fmt: skip
    srv.start()
    port = srv.port
    assert port > 0
    srv.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=TIMEOUT_S)
    again = HttpServer("127.0.0.1", port, ready=callbacks.ready, metrics=callbacks.render,
                       worker_info=callbacks.worker_info)  # fmt: skip
    again.start()
    try:
        assert request(again, "/healthz")[0] == 200
    finally:
        again.stop()


def test_port_in_use_is_one_clear_error(server: HttpServer, callbacks: Callbacks) -> None:
    clash = HttpServer("127.0.0.1", server.port, ready=callbacks.ready, metrics=callbacks.render,
                       worker_info=callbacks.worker_info)  # fmt: skip
    with pytest.raises(ConfigError, match=rf"^cannot listen for HTTP on .*:{server.port}: "):
        clash.start()
    assert request(server, "/healthz")[0] == 200


# ================================================================ hostile clients

TOKEN = "s3cr3t-t0ken-0123456789"
ServerFactory = Callable[..., HttpServer]


@pytest.fixture
def make_server(callbacks: Callbacks) -> Iterator[ServerFactory]:
    """Start servers with non-default options; every one is stopped at the end."""
    started: list[HttpServer] = []

    def make(**options: Any) -> HttpServer:
        srv = HttpServer("127.0.0.1", 0, ready=callbacks.ready, metrics=callbacks.render,
                         worker_info=callbacks.worker_info, **options)  # fmt: skip
        srv.start()
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()


def post(
    server: HttpServer, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, dict[str, Any], http.client.HTTPMessage]:
    """POST with exactly these headers (plus Content-Length); the JSON reply and its headers."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT_S)
    try:
        conn.request("POST", path, body, {**headers, "Content-Length": str(len(body))})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read()), resp.headers
    finally:
        conn.close()


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",  # a browser's cross-site "simple" POST needs no preflight with these
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonp",
        "application/json-seq",
        "",
    ],
)
def test_only_json_bodies_reach_the_worker_endpoint(
    server: HttpServer, callbacks: Callbacks, content_type: str
) -> None:
    status, reply, _ = post(server, "/sedna/workers/w-1/info", worker_body("w-1"),
                            {"Content-Type": content_type})  # fmt: skip
    assert status == 415
    assert reply["message"] in (
        "Content-Type must be application/json",
        "Content-Type application/json required",
    )
    assert callbacks.calls == []


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", "Application/JSON"]
)
def test_json_bodies_with_parameters_are_taken(
    server: HttpServer, callbacks: Callbacks, content_type: str
) -> None:
    body = worker_body("w-1")
    status, reply, _ = post(server, "/sedna/workers/w-1/info", body, {"Content-Type": content_type})
    assert (status, reply) == (200, {"status": 200, "message": "OK"})
    assert callbacks.calls == [("w-1", body)]


def test_what_sedna_sends_is_taken(server: HttpServer, callbacks: Callbacks) -> None:
    """Sedna's worker library itself posts with `requests.request("POST", url, json=message)`
    (sedna.service.client.LCClient.send): the same call, through the same library."""
    message = json.loads(worker_body("w-1"))
    url = f"http://127.0.0.1:{server.port}/sedna/workers/w-1/info"
    with requests.Session() as session:  # keep-alive, as LCReporter's repeated reports
        for _ in range(2):
            response = session.request(method="POST", url=url, json=message, timeout=TIMEOUT_S)
            assert response.status_code == 200
            assert response.json() == {"status": 200, "message": "OK"}
    taken = [(worker, json.loads(body)) for worker, body in callbacks.calls]
    assert taken == [("w-1", message)] * 2


def test_a_token_guards_the_worker_endpoint_and_metrics(
    make_server: ServerFactory, callbacks: Callbacks
) -> None:
    srv = make_server(token=TOKEN)
    path, body = "/sedna/workers/w-1/info", worker_body("w-1")
    json_type = {"Content-Type": "application/json"}
    required = "bearer token required (Authorization: Bearer <token>)"
    refused = [
        ({}, required),
        ({"Authorization": f"Basic {TOKEN}"}, required),
        ({"Authorization": "Bearer"}, required),
        ({"Authorization": "Bearer wrong-token-0123456789"}, "bearer token invalid"),
        ({"Authorization": f"Bearer {TOKEN}x"}, "bearer token invalid"),
        ({"Authorization": f"Bearer {TOKEN[:-1]}"}, "bearer token invalid"),
    ]  # fmt: skip
    for headers, message in refused:
        status, reply, reply_headers = post(srv, path, body, {**json_type, **headers})
        assert (status, reply["message"]) == (401, message), headers
        assert reply_headers["WWW-Authenticate"].startswith('Bearer realm="lifelong"')
    assert callbacks.calls == []
    for scheme in ("Bearer", "bearer"):
        authorization = {"Authorization": f"{scheme} {TOKEN}"}
        status, reply, _ = post(srv, path, body, {**json_type, **authorization})
        assert (status, reply) == (200, {"status": 200, "message": "OK"})
    assert callbacks.calls == [("w-1", body)] * 2

    # the probes stay open; the metrics name every job, so they need the token too
    assert request(srv, "/healthz")[:2] == (200, b"ok")
    assert request(srv, "/readyz")[0] == 200
    assert request(srv, "/metrics")[0] == 401
    metrics = urllib.request.Request(f"http://127.0.0.1:{srv.port}/metrics",
                                     headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
    with urllib.request.urlopen(metrics, timeout=TIMEOUT_S) as resp:
        assert resp.status == 200 and b"lifelong_events_total" in resp.read()


@pytest.mark.parametrize(
    "segment",
    [
        "w%0A2026-01-01T00:00:00.000Z%20ERROR%20forged",  # a newline: forged a log line once
        "%0A", "w%0D", "w%1B%5B2J", "w%00", "w%E2%80%A8", "W-1", "w_1", "w%2F..%2Fx", "-w",
        "w-", "w..x", "%ZZ", "%C3%A9", "w" * 254,
    ],
)  # fmt: skip
def test_worker_name_is_checked_before_the_body(
    server: HttpServer, callbacks: Callbacks, segment: str
) -> None:
    # the body is not even JSON: the name is refused before anything reads it
    status, reply, _ = post(server, f"/sedna/workers/{segment}/info", b"{not json",
                            {"Content-Type": "application/json"})  # fmt: skip
    assert status == 400
    assert reply["message"].startswith("the worker name in the path must be a DNS-1123 subdomain")
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in reply["message"])
    assert "forged" not in reply["message"] and "%" not in reply["message"]
    assert callbacks.calls == []


def test_a_percent_encoded_valid_name_is_decoded(server: HttpServer, callbacks: Callbacks) -> None:
    body = worker_body("w-1")
    status, _, _ = post(server, "/sedna/workers/w%2D1/info", body,
                        {"Content-Type": "application/json"})  # fmt: skip
    assert status == 200
    assert callbacks.calls == [("w-1", body)]


def test_oversize_headers_and_chunked_bodies_are_refused(
    server: HttpServer, callbacks: Callbacks
) -> None:
    # the head is refused at 16 KiB with a 431 the client rarely reads: the connection is
    # closed while it is still sending, which resets it (a broken pipe while it sends, a
    # reset while it reads); nothing else may happen
    padded = {"Content-Type": "application/json", "X-Pad": "x" * (64 << 10)}
    outcome: int | type[OSError]
    try:
        status, reply, _ = post(server, "/sedna/workers/w-1/info", worker_body("w-1"), padded)
        assert reply["status"] == status
        outcome = status
    except (BrokenPipeError, ConnectionResetError) as e:
        outcome = type(e)
    assert outcome in (431, BrokenPipeError, ConnectionResetError)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT_S)
    try:
        conn.request("POST", "/sedna/workers/w-1/info", iter([b"x" * 600, b"x" * 600]),
                     {"Content-Type": "application/json"}, encode_chunked=True)  # fmt: skip
        resp = conn.getresponse()
        assert resp.status == 413
        assert json.loads(resp.read())["message"] == f"body exceeds {MAX_BODY_BYTES} bytes"
    finally:
        conn.close()
    assert callbacks.calls == []
    assert request(server, "/healthz")[0] == 200


# ================================================================ slow clients

PARTIAL_HEAD = b"POST /sedna/workers/w-1/info HTTP/1.1\r\nHost: lifelong\r\n"


def slow_clients(server: HttpServer, count: int) -> list[socket.socket]:
    """`count` connections that each sent half a request head and then nothing."""
    clients = []
    for _ in range(count):
        client = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT_S)
        client.sendall(PARTIAL_HEAD)
        clients.append(client)
    return clients


def open_sockets() -> int:
    """Sockets this process holds, client and server ends alike."""
    fds = Path("/proc/self/fd")
    count = 0
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):
            count += os.readlink(fd).startswith("socket:")
    return count


def test_200_slow_connections_hold_no_thread(make_server: ServerFactory) -> None:
    srv = make_server(
        max_connections=250, max_connections_per_client=250, head_timeout_s=60,
        request_timeout_s=60,
    )  # fmt: skip
    threads_before = threading.active_count()
    clients = slow_clients(srv, 200)
    try:
        # connections are accepted in order, so this one is served after all 200 are held
        status, body, _ = request(srv, "/sedna/workers/w-1/info", "POST", worker_body("w-1"))
        assert (status, json.loads(body)["status"]) == (200, 200)
        assert threading.active_count() <= threads_before
        assert all(still_open(client) for client in clients)
    finally:
        for client in clients:
            client.close()


@pytest.mark.parametrize("stage", ["head", "body"])
def test_a_slowloris_is_cut_off_at_the_deadline(make_server: ServerFactory, stage: str) -> None:
    """A byte every 0.2 s keeps a connection busy forever, unless the request has a deadline."""
    srv = make_server(request_timeout_s=1)
    client = socket.create_connection(("127.0.0.1", srv.port), timeout=0.2)
    head = PARTIAL_HEAD + b"Content-Type: application/json\r\nContent-Length: 1000\r\n"
    client.sendall(PARTIAL_HEAD if stage == "head" else head + b"\r\n{")
    received = b""
    give_up = time.monotonic() + 30
    try:
        while time.monotonic() < give_up:
            try:
                chunk = client.recv(4096)
            except TimeoutError:
                client.sendall(b"X-Slow: 1\r\n" if stage == "head" else b" ")
                continue
            if not chunk:
                break  # closed after the answer
            received += chunk
    finally:
        client.close()
    head_text, _, body = received.partition(b"\r\n\r\n")
    assert head_text.startswith(b"HTTP/1.1 408 "), received
    what = "request head" if stage == "head" else "request"
    assert json.loads(body) == {
        "status": 408,
        "message": f"{what} not received in full within 1 s",
    }


def test_connections_beyond_the_cap_wait_for_a_free_slot(
    make_server: ServerFactory, callbacks: Callbacks
) -> None:
    cap, count = 10, 40
    srv = make_server(max_connections=cap, request_timeout_s=1)
    sockets_before, threads_before = open_sockets(), threading.active_count()
    clients = slow_clients(srv, count)
    answered: list[int] = []
    normal = threading.Thread(
        target=lambda: answered.append(
            request(srv, "/sedna/workers/w-1/info", "POST", worker_body("w-1"), 60)[0]
        )
    )
    try:
        normal.start()
        most_accepted = 0
        while normal.is_alive():
            # the server's end of every connection it accepted is a socket of this process
            accepted = open_sockets() - sockets_before - count - 1
            most_accepted = max(most_accepted, accepted)
            assert threading.active_count() <= threads_before + 1  # + the normal client
            time.sleep(0.05)
        normal.join()
    finally:
        for client in clients:
            client.close()
    assert answered == [200]  # it got in once the deadline freed slots
    assert cap // 2 <= most_accepted <= cap
    assert callbacks.calls == [("w-1", worker_body("w-1"))]


def test_stop_closes_connections_and_leaves_no_thread(callbacks: Callbacks) -> None:
    threads_before = set(threading.enumerate())
    for _ in range(3):
        srv = HttpServer("127.0.0.1", 0, ready=callbacks.ready, metrics=callbacks.render,
                         worker_info=callbacks.worker_info)  # fmt: skip
        srv.start()
        (client,) = slow_clients(srv, 1)
        assert request(srv, "/healthz")[0] == 200  # accepted after the slow one: both are in
        stopper = threading.Thread(target=srv.stop)
        stopper.start()
        stopper.join(TIMEOUT_S)
        assert not stopper.is_alive(), "stop() did not return"
        assert client.recv(1) == b""  # closed by the server
        client.close()
    wait_until(
        lambda: not set(threading.enumerate()) - threads_before,
        TIMEOUT_S,
        "the servers' threads to end",
        detail=lambda: str(set(threading.enumerate()) - threads_before),
    )


# ================================================================ one client, probes, hosts


def connect_from(server: HttpServer, address: str) -> socket.socket:
    """A connection from `address`: any address of 127.0.0.0/8 is this machine's loopback."""
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.settimeout(TIMEOUT_S)
    client.bind((address, 0))
    client.connect(("127.0.0.1", server.port))
    return client


def read_reply(client: socket.socket) -> bytes:
    """Everything the server sent before closing the connection."""
    received = b""
    while chunk := client.recv(4096):
        received += chunk
    return received


def test_one_address_holds_at_most_its_cap_of_connections(make_server: ServerFactory) -> None:
    cap = 5
    srv = make_server(max_connections_per_client=cap, head_timeout_s=60, request_timeout_s=60)
    held = [connect_from(srv, "127.0.0.2") for _ in range(cap)]
    over = [connect_from(srv, "127.0.0.2") for _ in range(3)]
    try:
        for client in over:  # accepted in order: the cap is reached before these
            head, _, body = read_reply(client).partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 429 "), head
            assert json.loads(body) == {
                "status": 429,
                "message": f"more than {cap} connections from your address: close one first",
            }
        assert all(still_open(client) for client in held)
        # another address is served meanwhile, and a freed slot takes the next connection
        assert request(srv, "/sedna/workers/w-1/info", "POST", worker_body("w-1"))[0] == 200
        held.pop().close()
        status = wait_until(
            lambda: _status_from(srv, "127.0.0.2"), TIMEOUT_S, "a slot freed for 127.0.0.2"
        )
        assert status == 200
    finally:
        for client in held + over:
            client.close()


def _status_from(server: HttpServer, address: str) -> int | None:
    """The status of GET /readyz sent from `address`, or None when refused for the cap."""
    client = connect_from(server, address)
    try:
        client.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status = int(read_reply(client).split(b" ", 2)[1])
    finally:
        client.close()
    return None if status == 429 else status


def test_a_head_trickled_past_its_deadline_is_cut_but_a_slow_body_is_not(
    make_server: ServerFactory, callbacks: Callbacks
) -> None:
    """Two clients trickle a byte every 0.2 s, one its head, the other its body after a whole
    head: once the head deadline has cut the first, the second's body still completes."""
    srv = make_server(head_timeout_s=1, request_timeout_s=60)
    slow_head = socket.create_connection(("127.0.0.1", srv.port), timeout=0.2)
    slow_body = socket.create_connection(("127.0.0.1", srv.port), timeout=TIMEOUT_S)
    body = worker_body("w-1")
    slow_body.sendall(
        PARTIAL_HEAD + b"Content-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )  # fmt: skip
    sent = 0
    received = b""
    try:
        while True:
            try:
                chunk = slow_head.recv(4096)
            except TimeoutError:
                slow_head.sendall(b"X")
                slow_body.sendall(body[sent : sent + 1])
                sent += 1
                assert sent < len(body), "the head deadline never cut the slow head"
                continue
            if not chunk:
                break
            received += chunk
        assert received.startswith(b"HTTP/1.1 408 "), received
        assert b"request head not received in full within 1 s" in received
        slow_body.sendall(body[sent:])
        reply = slow_body.recv(4096)
        assert reply.startswith(b"HTTP/1.1 200 "), reply
    finally:
        slow_head.close()
        slow_body.close()
    assert callbacks.calls == [("w-1", body)]


def test_probes_are_answered_while_every_worker_thread_is_busy(callbacks: Callbacks) -> None:
    threads = 2
    entered = threading.Semaphore(0)
    release = threading.Event()

    def stuck_worker_info(worker: str, body: bytes) -> tuple[int, str]:
        entered.release()
        release.wait(60)
        return 200, "OK"

    srv = HttpServer("127.0.0.1", 0, ready=callbacks.ready, metrics=callbacks.render,
                     worker_info=stuck_worker_info, threads=threads)  # fmt: skip
    srv.start()
    posts = [
        threading.Thread(
            target=request, args=(srv, "/sedna/workers/w-1/info", "POST", worker_body("w-1"), 60)
        )
        for _ in range(threads + 2)  # every thread busy, and more requests queued
    ]
    try:
        for post_thread in posts:
            post_thread.start()
        for _ in range(threads):
            assert entered.acquire(timeout=30), "the reports never reached the worker threads"
        assert request(srv, "/healthz", timeout_s=30)[:2] == (200, b"ok")
        assert request(srv, "/readyz", timeout_s=30)[0] == 200
        assert request(srv, "/healthz", "HEAD", timeout_s=30)[:2] == (200, b"")
        # answered while the pool was still held: nothing had let a report finish
        assert all(post_thread.is_alive() for post_thread in posts)
    finally:
        release.set()
        for post_thread in posts:
            post_thread.join()
        srv.stop()


def send_with_host(server: HttpServer, method: str, path: str, host: str | None,
                   headers: dict[str, str] | None = None) -> int:  # fmt: skip
    """The status of one request with exactly this Host header (None: no Host at all)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT_S)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        if host is not None:
            conn.putheader("Host", host)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        body = worker_body("w-1") if method == "POST" else b""
        if method == "POST":
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body or None)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


FOREIGN_HOSTS = ["evil.example", "evil.example:9100", "lifelong-controller.evil.example",
                 "localhost.evil.example", "lifelong-controller:9100x"]  # fmt: skip
ALLOWED_HOSTS = ["localhost", "localhost:9100", "LIFELONG-CONTROLLER", "lifelong-controller.",
                 "127.0.0.1:9100", "10.1.2.3", "[::1]:9100", None]  # fmt: skip


@pytest.mark.parametrize("host", FOREIGN_HOSTS)
def test_a_host_name_not_allowed_is_refused_without_a_token(
    make_server: ServerFactory, callbacks: Callbacks, host: str
) -> None:
    """DNS rebinding: a page from evil.example, its name now pointing here, sends its own
    name as Host; the worker endpoint and /metrics refuse it, the probes stay open."""
    srv = make_server(allowed_hosts=["localhost", "lifelong-controller"])
    assert send_with_host(srv, "POST", "/sedna/workers/w-1/info", host) == 403
    assert send_with_host(srv, "GET", "/metrics", host) == 403
    assert send_with_host(srv, "GET", "/healthz", host) == 200
    assert send_with_host(srv, "GET", "/readyz", host) == 200
    assert callbacks.calls == []
    # with a token required, the token is the guard: any Host will do
    guarded = make_server(allowed_hosts=["localhost"], token=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert send_with_host(guarded, "POST", "/sedna/workers/w-1/info", host, auth) == 200


@pytest.mark.parametrize("host", ALLOWED_HOSTS)
def test_allowed_host_names_and_any_address_are_answered(
    make_server: ServerFactory, callbacks: Callbacks, host: str | None
) -> None:
    srv = make_server(allowed_hosts=["localhost", "lifelong-controller"])
    assert send_with_host(srv, "POST", "/sedna/workers/w-1/info", host) == 200
    assert send_with_host(srv, "GET", "/metrics", host) == 200
    assert len(callbacks.calls) == 1
