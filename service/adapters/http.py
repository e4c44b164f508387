"""The HTTP face of the service: health, readiness, metrics and Sedna's worker report endpoint.

Built on the standard library's `ThreadingHTTPServer`: the traffic is a probe every few
seconds, a scrape, and a worker report per state change, so a thread per request is ample
and no framework is needed. What each route means lives in the callbacks the runtime passes
in; this module only speaks HTTP. Whatever a callback does, the client gets a short JSON
reason (never a traceback) and the server keeps serving.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from service.errors import ConfigError

log = logging.getLogger(__name__)

WORKER_PREFIX = "/sedna/workers/"
WORKER_SUFFIX = "/info"
_GET_ROUTES = frozenset({"/healthz", "/readyz", "/metrics"})
_REQUEST_TIMEOUT_S = 10.0
_POLL_INTERVAL_S = 0.1
# An oversized body is read and dropped up to this size so the client, still sending, sees the
# 413 rather than a reset connection; beyond it the connection is simply closed.
_DISCARD_MAX_BYTES = 16 << 20
_DISCARD_CHUNK_BYTES = 64 << 10
_JSON = "application/json"
_TEXT = "text/plain; charset=utf-8"

ReadyFn = Callable[[], tuple[bool, str]]
MetricsFn = Callable[[], tuple[bytes, str]]
WorkerInfoFn = Callable[[str, bytes], tuple[int, str]]


@dataclass(frozen=True)
class _Routes:
    """The callbacks and limits a request handler needs."""

    ready: ReadyFn
    metrics: MetricsFn
    worker_info: WorkerInfoFn
    max_body_bytes: int


@dataclass(frozen=True)
class _Reply:
    status: int
    body: bytes
    content_type: str
    allow: str = ""


def _json_reply(status: int, message: str, allow: str = "") -> _Reply:
    """Sedna's worker library expects `{"status": code, "message": text}`."""
    body = json.dumps({"status": status, "message": message}).encode()
    return _Reply(status, body, _JSON, allow)


def _worker_name(path: str) -> str | None:
    """The `{worker}` of `/sedna/workers/{worker}/info`, or None when the path is another."""
    if not (path.startswith(WORKER_PREFIX) and path.endswith(WORKER_SUFFIX)):
        return None
    segment = path[len(WORKER_PREFIX) : -len(WORKER_SUFFIX)]
    if not segment or "/" in segment:
        return None
    return unquote(segment)


def _not_allowed(path: str) -> _Reply:
    """405 for a known path with the wrong method, 404 for anything else."""
    if path in _GET_ROUTES:
        return _json_reply(HTTPStatus.METHOD_NOT_ALLOWED, "method not allowed", "GET, HEAD")
    if _worker_name(path) is not None:
        return _json_reply(HTTPStatus.METHOD_NOT_ALLOWED, "method not allowed", "POST")
    return _json_reply(HTTPStatus.NOT_FOUND, "not found")


def _get(routes: _Routes, path: str) -> _Reply:
    if path == "/healthz":
        return _Reply(HTTPStatus.OK, b"ok", _TEXT)
    if path == "/readyz":
        ready, detail = routes.ready()
        status = HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE
        return _Reply(status, detail.encode(), _TEXT)
    if path == "/metrics":
        body, content_type = routes.metrics()
        return _Reply(HTTPStatus.OK, body, content_type)
    return _not_allowed(path)


def _worker_reply(code: int, message: str) -> _Reply:
    if not 200 <= code <= 599:
        log.error("worker_info returned HTTP code %r; answering 500", code)
        return _json_reply(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error")
    return _json_reply(code, message)


class _Handler(BaseHTTPRequestHandler):
    """One request; all routing decisions are delegated to the module functions above."""

    server_version = "lifelong"
    sys_version = ""
    timeout = _REQUEST_TIMEOUT_S

    def __init__(self, *args: Any, routes: _Routes, **kwargs: Any) -> None:
        self.routes = routes  # set before super().__init__, which handles the request
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:
        self._answer(lambda path: _get(self.routes, path), with_body=True)

    def do_HEAD(self) -> None:
        self._answer(lambda path: _get(self.routes, path), with_body=False)

    def do_POST(self) -> None:
        self._answer(self._post, with_body=True)

    def do_PUT(self) -> None:
        self._answer(_not_allowed, with_body=True)

    def do_DELETE(self) -> None:
        self._answer(_not_allowed, with_body=True)

    def do_PATCH(self) -> None:
        self._answer(_not_allowed, with_body=True)

    def _post(self, path: str) -> _Reply:
        worker = _worker_name(path)
        if worker is None:
            return _not_allowed(path)
        body = self._read_body()
        if isinstance(body, _Reply):
            return body
        return _worker_reply(*self.routes.worker_info(worker, body))

    def _read_body(self) -> bytes | _Reply:
        """The request body, or the reply refusing it (missing, malformed or too long)."""
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            return _json_reply(HTTPStatus.LENGTH_REQUIRED, "Content-Length required")
        if not length_text.strip().isdigit():
            return _json_reply(HTTPStatus.BAD_REQUEST, "Content-Length is not a number")
        length = int(length_text)
        if length > self.routes.max_body_bytes:
            limit = self.routes.max_body_bytes
            self._discard(length)
            return _json_reply(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body of {length} bytes exceeds {limit}"
            )
        body = self.rfile.read(length)
        if len(body) < length:
            return _json_reply(HTTPStatus.BAD_REQUEST, "body shorter than Content-Length")
        return body

    def _discard(self, length: int) -> None:
        """Read and drop a refused body (bounded), so the reply reaches the client."""
        self.close_connection = True
        remaining = length if length <= _DISCARD_MAX_BYTES else 0
        while remaining > 0:
            chunk = self.rfile.read(min(remaining, _DISCARD_CHUNK_BYTES))
            if not chunk:
                return
            remaining -= len(chunk)

    def _answer(self, route: Callable[[str], _Reply], *, with_body: bool) -> None:
        path = urlsplit(self.path).path
        try:
            reply = route(path)
        except (TimeoutError, ConnectionError):
            log.debug("client went away during %s %s", self.command, path)
            self.close_connection = True
            return
        except Exception:
            log.exception("HTTP %s %s failed", self.command, path)
            reply = _json_reply(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error")
        self._send(reply, with_body=with_body)

    def _send(self, reply: _Reply, *, with_body: bool) -> None:
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            if reply.allow:
                self.send_header("Allow", reply.allow)
            self.end_headers()
            if with_body:
                self.wfile.write(reply.body)
        except OSError as e:
            log.debug("could not answer %s %s: %s", self.command, self.path, e)
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class _Server(ThreadingHTTPServer):
    """ThreadingHTTPServer whose stray errors go to our log instead of stderr."""

    daemon_threads = True
    request_queue_size = 128  # the default of 5 drops SYNs when workers report in a burst

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.warning("HTTP connection from %s failed", client_address, exc_info=True)


class _Server6(_Server):
    address_family = socket.AF_INET6


class HttpServer:
    """Serves /healthz, /readyz, /metrics and POST /sedna/workers/{worker}/info on a thread."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ready: ReadyFn,
        metrics: MetricsFn,
        worker_info: WorkerInfoFn,
        max_body_bytes: int = 1 << 20,
    ) -> None:
        self._host = host
        self._port = port
        self._routes = _Routes(ready, metrics, worker_info, max_body_bytes)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port once started (the real one when 0 was asked for)."""
        return self._port

    def start(self) -> None:
        """Bind and serve in a daemon thread; a bind failure is a ConfigError naming the address."""
        if self._server is not None:
            return
        server_class = _Server6 if ":" in self._host else _Server
        routes = self._routes

        def handler(*args: Any) -> _Handler:
            return _Handler(*args, routes=routes)

        try:
            self._server = server_class((self._host, self._port), handler)
        except OSError as e:
            raise ConfigError(
                f"cannot listen for HTTP on {self._host}:{self._port}: {e.strerror or e}"
            ) from e
        self._port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": _POLL_INTERVAL_S},
            name="lifelong-http",
            daemon=True,
        )
        self._thread.start()
        log.info("HTTP listening on %s:%d", self._host, self.port)

    def stop(self) -> None:
        """Stop accepting, close the socket and wait for the serving loop to end."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.shutdown()
        server.server_close()
        thread.join()
        self._server, self._thread = None, None
