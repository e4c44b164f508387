"""The HTTP adapter on a real socket: routes, status codes, limits, failing callbacks, metrics."""

from __future__ import annotations

import http.client
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from service.adapters.http import HttpServer
from service.errors import ConfigError
from service.metrics import Metrics

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
    server: HttpServer, path: str, method: str = "GET", body: bytes | None = None
) -> tuple[int, bytes, dict[str, str]]:
    """Send one request; HTTP errors are returned like successes, not raised."""
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", body, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
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
