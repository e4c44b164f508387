"""The HTTP face of the service: health, readiness, metrics and Sedna's worker report endpoint.

The routes. What each route means lives in the callbacks the runtime passes in (`Routes`);
this module only speaks HTTP: it refuses what is not a well-formed request for a route
(wrong method, a worker name that is not a DNS-1123 subdomain, a body that is not
`application/json`, a missing or wrong bearer token when one is configured, a `Host` it does
not answer to when none is) before any callback sees it. Whatever a callback does, the
client gets a short JSON reason (never a traceback): `App` is the WSGI application, and
never lets an exception reach the server.

The server, `HttpServer`: waitress, with deadlines per request and caps on connections.
waitress runs one event-loop thread that accepts connections and reads every request in full
(headers, then the body, held in memory) before one of a few worker threads runs it, so a
client that sends slowly costs a socket and a buffer, never a thread. On top of waitress's own
limits this module adds:
- deadlines: a request whose head (request line and headers) has not arrived within
  `head_timeout_s` of its first byte, or whose head and body have not all arrived within
  `request_timeout_s`, is answered 408 and its connection closed (waitress alone only closes
  connections that stay silent, which a client trickling a byte at a time never does);
- caps: at most `max_connections` connections are open at once (more wait in the kernel's
  accept queue), and at most `max_connections_per_client` from one address: one more is
  answered 429 and closed at once, so a single client cannot take every slot;
- probes outside the pool: `/healthz` and `/readyz` are answered on the event loop as soon as
  their head is in, never queued behind worker threads busy with other requests, so the
  kubelet's probes are answered while the pool is saturated.
waitress's own refusals (400, 413, 431, ...) get the JSON replies every route gives, and the
body of a request refused as too large is read and dropped, so the client sees the 413.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote, urlsplit

from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser
from waitress.server import TcpWSGIServer
from waitress.task import ErrorTask
from waitress.trigger import trigger as Trigger  # noqa: N812 (waitress names the class so)
from waitress.utilities import RequestEntityTooLarge

from service.errors import ConfigError
from service.wire import DNS_SUBDOMAIN_PATTERN

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

log = logging.getLogger("service.adapters.http")

WORKER_PREFIX = "/sedna/workers/"
WORKER_SUFFIX = "/info"
#: The kubelet's probes: never guarded, and answered without waiting for a worker thread.
PROBE_PATHS = frozenset({"/healthz", "/readyz"})
_GET_ROUTES = PROBE_PATHS | {"/metrics"}
_MAX_WORKER_NAME_CHARS = 253
_WORKER_NAME_RE = re.compile(DNS_SUBDOMAIN_PATTERN)
_BAD_WORKER_NAME = (
    "the worker name in the path must be a DNS-1123 subdomain (lowercase letters, digits, '-' "
    f"and '.', each part starting and ending with a letter or digit, at most "
    f"{_MAX_WORKER_NAME_CHARS} characters)"
)
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"

ReadyFn = Callable[[], tuple[bool, str]]
LiveFn = Callable[[], tuple[bool, str]]
MetricsFn = Callable[[], tuple[bytes, str]]
WorkerInfoFn = Callable[[str, bytes], tuple[int, str]]


@dataclass(frozen=True)
class Routes:
    """The callbacks and the token a request needs."""

    ready: ReadyFn
    metrics: MetricsFn
    worker_info: WorkerInfoFn
    token_digest: bytes | None  # SHA-256 of the bearer token, None when none is required
    live: LiveFn
    # host names answered to without a token (IP addresses always are); None: any
    allowed_hosts: frozenset[str] | None = None

    @classmethod
    def of(
        cls,
        ready: ReadyFn,
        metrics: MetricsFn,
        worker_info: WorkerInfoFn,
        token: str,
        live: LiveFn,
        *,
        allowed_hosts: Sequence[str] | None = None,
    ) -> Routes:
        """The routes answering with these callbacks; ``token``, unless empty, is required,
        else a `Host` naming one of ``allowed_hosts`` (or an IP address), unless that is None."""
        digest = hashlib.sha256(token.encode("latin-1")).digest() if token else None
        hosts = None if allowed_hosts is None else frozenset(h.lower() for h in allowed_hosts)
        return cls(ready, metrics, worker_info, digest, live, hosts)


@dataclass(frozen=True)
class _Reply:
    status: int
    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()


def json_body(status: int, message: str) -> bytes:
    """Sedna's worker library expects `{"status": code, "message": text}`."""
    return json.dumps({"status": status, "message": message}).encode()


def _json_reply(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> _Reply:
    return _Reply(status, json_body(status, message), JSON, headers)


def _refuse(
    environ: WSGIEnvironment, status: int, message: str, headers: tuple[tuple[str, str], ...] = ()
) -> _Reply:
    """A request refused before any callback saw it: said to the client and logged."""
    log.info(
        "HTTP %s refused from %s: %d %s",
        environ.get("REQUEST_METHOD"), environ.get("REMOTE_ADDR"), status, message,
    )  # fmt: skip
    return _json_reply(status, message, headers)


def _worker_segment(path: str) -> str | None:
    """The raw `{worker}` of `/sedna/workers/{worker}/info`, or None when the path is another."""
    if not (path.startswith(WORKER_PREFIX) and path.endswith(WORKER_SUFFIX)):
        return None
    segment = path[len(WORKER_PREFIX) : -len(WORKER_SUFFIX)]
    if not segment or "/" in segment:
        return None
    return segment


def _worker_name(segment: str) -> str | None:
    """The percent-decoded worker name when it is a DNS-1123 subdomain, else None."""
    name = unquote(segment, errors="strict") if "%" in segment else segment
    if len(name) > _MAX_WORKER_NAME_CHARS or not _WORKER_NAME_RE.match(name):
        return None
    return name


def _not_allowed(path: str) -> _Reply:
    """405 for a known path with the wrong method, 404 for anything else."""
    if path in _GET_ROUTES:
        return _json_reply(
            HTTPStatus.METHOD_NOT_ALLOWED, "method not allowed", (("Allow", "GET, HEAD"),)
        )
    if _worker_segment(path) is not None:
        return _json_reply(
            HTTPStatus.METHOD_NOT_ALLOWED, "method not allowed", (("Allow", "POST"),)
        )
    return _json_reply(HTTPStatus.NOT_FOUND, "not found")


def _host_name(host: str) -> str | None:
    """The name or address of a `Host` header, without port, brackets or final dot; None
    when what follows it is not a port."""
    host = host.strip().lower()
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
    elif host.count(":") == 1:
        name, colon, port = host.partition(":")
        rest = colon + port
    else:
        name, rest = host, ""
    if rest and not (rest.startswith(":") and rest[1:].isdigit()):
        return None
    return name.rstrip(".")


def _foreign_host(routes: Routes, environ: WSGIEnvironment) -> _Reply | None:
    """403 when the `Host` header names a host name not allowed. An IP address (or no Host at
    all) passes: a browser sends the page's own host name, and DNS rebinding needs a name."""
    if routes.allowed_hosts is None or "HTTP_HOST" not in environ:
        return None
    name = _host_name(str(environ["HTTP_HOST"]))
    try:
        ipaddress.ip_address(name or "")
    except ValueError:
        if name not in routes.allowed_hosts:
            reason = (
                "the Host header names a host this endpoint does not answer to (add it to "
                "LIFELONG_HTTP_ALLOWED_HOSTS, or require a token)"
            )
            return _refuse(environ, HTTPStatus.FORBIDDEN, reason)
    return None


def _unauthorized(routes: Routes, environ: WSGIEnvironment) -> _Reply | None:
    """401 unless the request carries the configured bearer token; with none configured,
    403 unless its `Host` is one answered to."""
    if routes.token_digest is None:
        return _foreign_host(routes, environ)
    scheme, _, credentials = str(environ.get("HTTP_AUTHORIZATION", "")).strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return _refuse(
            environ,
            HTTPStatus.UNAUTHORIZED,
            "bearer token required (Authorization: Bearer <token>)",
            (("WWW-Authenticate", 'Bearer realm="lifelong"'),),
        )
    # Digests have one length whatever was sent, so the comparison time says nothing of it.
    given = hashlib.sha256(credentials.strip().encode("latin-1")).digest()
    if not hmac.compare_digest(given, routes.token_digest):
        return _refuse(
            environ,
            HTTPStatus.UNAUTHORIZED,
            "bearer token invalid",
            (("WWW-Authenticate", 'Bearer realm="lifelong", error="invalid_token"'),),
        )
    return None


def _get(routes: Routes, path: str, environ: WSGIEnvironment) -> _Reply:
    if path == "/healthz":
        live, detail = routes.live()
        status = HTTPStatus.OK if live else HTTPStatus.SERVICE_UNAVAILABLE
        return _Reply(status, detail.encode(), TEXT)
    if path == "/readyz":
        ready, detail = routes.ready()
        status = HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE
        return _Reply(status, detail.encode(), TEXT)
    if path == "/metrics":
        refusal = _unauthorized(routes, environ)
        if refusal is not None:
            return refusal
        body, content_type = routes.metrics()
        return _Reply(HTTPStatus.OK, body, content_type)
    return _not_allowed(path)


def _post(routes: Routes, path: str, environ: WSGIEnvironment) -> _Reply:
    """The worker endpoint: token, name, then body, each checked before the next is looked at."""
    segment = _worker_segment(path)
    if segment is None:
        return _not_allowed(path)
    refusal = _unauthorized(routes, environ)
    if refusal is not None:
        return refusal
    worker = _worker_name(segment)
    if worker is None:
        return _refuse(environ, HTTPStatus.BAD_REQUEST, _BAD_WORKER_NAME)
    length_text = environ.get("CONTENT_LENGTH")
    if length_text is None:
        return _refuse(environ, HTTPStatus.LENGTH_REQUIRED, "Content-Length required")
    media_type = str(environ.get("CONTENT_TYPE", "")).partition(";")[0].strip().lower()
    if media_type != JSON:
        reason = (
            "Content-Type must be application/json"
            if media_type
            else "Content-Type application/json required"
        )
        return _refuse(environ, HTTPStatus.UNSUPPORTED_MEDIA_TYPE, reason)
    body = environ["wsgi.input"].read(int(length_text))  # waitress has checked the number
    code, message = routes.worker_info(worker, body)
    if not 200 <= code <= 599:
        log.error("worker_info returned HTTP code %r; answering 500", code)
        return _json_reply(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error")
    return _json_reply(code, message)


def _refuse_other(routes: Routes, path: str, environ: WSGIEnvironment) -> _Reply:
    return _not_allowed(path)


_METHODS: dict[str, Callable[[Routes, str, WSGIEnvironment], _Reply]] = {
    "GET": _get,
    "HEAD": _get,
    "POST": _post,
}


class App:
    """The WSGI application: route, answer, and never let an exception reach waitress."""

    def __init__(self, routes: Routes) -> None:
        self._routes = routes

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        method = str(environ["REQUEST_METHOD"])
        # The raw request target, so a percent-encoded '/' stays inside its path segment.
        path = urlsplit(str(environ.get("REQUEST_URI", ""))).path
        try:
            reply = _METHODS.get(method, _refuse_other)(self._routes, path, environ)
        except Exception:
            log.exception("HTTP %s %s failed", method, path)
            reply = _json_reply(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error")
        log.debug("%s %s %s %d", environ.get("REMOTE_ADDR"), method, path, reply.status)
        headers = [
            ("Content-Type", reply.content_type),
            ("Content-Length", str(len(reply.body))),
            *reply.headers,
        ]
        start_response(f"{reply.status} {HTTPStatus(reply.status).phrase}", headers)
        return [] if method == "HEAD" else [reply.body]


DEFAULT_MAX_CONNECTIONS = 100
#: A fifth of the connections: a few workers, Prometheus and the kubelet from one node fit.
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 20
#: Sedna's worker library sends its request head (a few hundred bytes) in one segment.
DEFAULT_HEAD_TIMEOUT_S = 5.0
DEFAULT_REQUEST_TIMEOUT_S = 10.0
DEFAULT_THREADS = 4
# Request line and headers together; Sedna's worker library sends a few hundred bytes.
_MAX_HEADER_BYTES = 16 << 10
# An oversized body is read and dropped up to this size so the client, still sending, sees the
# 413 rather than a reset connection; beyond it the connection is closed at once.
_DISCARD_MAX_BYTES = 16 << 20
# How often (s) the event loop wakes to enforce deadlines; waitress takes whole seconds.
_CHECK_INTERVAL_S = 1
_STOP_WAIT_S = 5


class _Parser(HTTPRequestParser):
    """Waitress's request parser, reading and dropping the body of a request refused as too
    large (up to `_DISCARD_MAX_BYTES`), so the client, still sending, reads the 413. A client
    that asked `Expect: 100-continue` has sent no body yet and gets the 413 at once."""

    _discard_left = 0

    def received(self, data: bytes) -> int:
        if self._discard_left:
            taken = min(len(data), self._discard_left)
            self._discard_left -= taken
            self.completed = self._discard_left == 0
            return taken
        consumed = super().received(data)
        refused_unread = (
            self.completed
            and isinstance(self.error, RequestEntityTooLarge)
            and self.body_bytes_received == 0  # refused on its Content-Length
        )
        if refused_unread and self.expect_continue:
            self.expect_continue = False  # else waitress says "100 Continue" and awaits the body
        elif refused_unread and 0 < self.content_length <= _DISCARD_MAX_BYTES:
            self._discard_left = self.content_length
            self.completed = False
        return consumed


class _ErrorTask(ErrorTask):
    """Waitress's own refusals (400, 413, 431, ...) as the JSON replies every route gives."""

    def execute(self) -> None:
        request = cast(HTTPRequestParser, self.request)
        error = request.error
        if error is None:  # waitress runs this task only for a request with an error
            return
        message = str(error.body)
        if isinstance(error, RequestEntityTooLarge):
            limit = self.channel.adj.max_request_body_size - 1
            length = request.content_length
            message = (
                f"body of {length} bytes exceeds {limit}"
                if length > limit
                else f"body exceeds {limit} bytes"
            )
        body = json_body(error.code, message)
        self.status = f"{error.code} {error.reason}"
        cast(list[tuple[str, str]], self.response_headers).append(("Content-Type", JSON))
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


def _reply_bytes(status: HTTPStatus, message: str) -> bytes:
    """A whole JSON reply that closes the connection, for answers written on the event loop."""
    body = json_body(status, message)
    head = (
        f"HTTP/1.1 {status.value} {status.phrase}\r\nContent-Type: {JSON}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def _is_probe(request: HTTPRequestParser) -> bool:
    """Whether a complete request is a probe: answered on the event loop, not by the pool."""
    # waitress's stubs say bytes and omit `path`: both are str (the path percent-decoded)
    command, path = cast(str, request.command), cast(str, getattr(request, "path", ""))
    return request.error is None and command in ("GET", "HEAD") and path in PROBE_PATHS


class _Channel(HTTPChannel):
    """One connection; remembers when its request in progress began (for the deadlines) and
    serves a probe itself, on the event loop, instead of queueing it for a worker thread."""

    parser_class = _Parser
    error_task_class = _ErrorTask
    request_started: float | None = None
    # set while waitress parses received bytes; a probe completed then is served right after
    receiving = False
    probe_waiting = False

    def received(self, data: bytes) -> bool:
        if self.request is None:
            self.request_started = time.monotonic()
        self.receiving = True
        try:
            taken = super().received(data)
        finally:
            self.receiving = False
        if self.request is None:
            self.request_started = None
        if self.probe_waiting:
            # `service` answers it and queues a pipelined request after it for the pool
            self.probe_waiting = False
            self.service()
        return taken

    def missed_deadline(self, head_cutoff: float, request_cutoff: float) -> str | None:
        """What of the request in progress is late: its head, begun before `head_cutoff` and
        not all in, or the whole request, begun before `request_cutoff` (monotonic seconds)."""
        started = self.request_started
        if started is None:
            return None
        head_done = self.request is not None and self.request.headers_finished
        if started < head_cutoff and not head_done:
            return "request head"
        return "request" if started < request_cutoff else None

    def time_out(self, what: str, timeout_s: float) -> None:
        """Answer 408 and close; runs on the event loop while no task owns the connection."""
        reply = _reply_bytes(
            HTTPStatus.REQUEST_TIMEOUT, f"{what} not received in full within {timeout_s:g} s"
        )
        with self.outbuf_lock:
            self.outbufs[-1].append(reply)
            self.total_outbufs_len += len(reply)
        if self.request is not None:
            self.request.close()
            self.request = None
        self.request_started = None
        self.close_when_flushed = True
        log.info(
            "HTTP %s from %s not received in full within %g s: answered 408, closed",
            what, self.addr[0], timeout_s,
        )  # fmt: skip


@dataclass(frozen=True)
class _Limits:
    """What `_Server` enforces beyond waitress's own adjustments."""

    head_timeout_s: float
    request_timeout_s: float
    max_connections_per_client: int


class _Server(TcpWSGIServer):
    """Waitress's TCP server with our channel, the deadlines, the per-client cap and probes
    served on the event loop."""

    channel_class = _Channel

    def __init__(self, app: App, sock: socket.socket, adj: Adjustments, limits: _Limits) -> None:
        self.limits = limits
        self.socket_map: dict[int, Any] = {}  # waitress's dispatchers, keyed by descriptor
        # addresses refused for being at their cap, logged once until they drop below it
        self._capped: set[str] = set()
        sockinfo = (sock.family, sock.type, sock.proto, sock.getsockname())
        super().__init__(app, self.socket_map, True, sock, None, adj, sockinfo, bind_socket=False)

    def _channels(self) -> Iterable[HTTPChannel]:
        return list(cast(dict[int, HTTPChannel], self.active_channels).values())

    def handle_accept(self) -> None:
        """Accept one connection, or refuse it (429, closed) when its address is at its cap."""
        try:
            accepted = self.accept()
        except OSError:  # a connection the client already abandoned, as waitress says
            return
        if accepted is None:
            return
        conn, addr = accepted
        client = str(addr[0])
        held = sum(1 for channel in self._channels() if channel.addr[0] == client)
        if held >= self.limits.max_connections_per_client:
            self._refuse(conn, client)
            return
        self._capped.discard(client)
        self.channel_class(self, conn, addr, self.adj, map=self.socket_map)

    def _refuse(self, conn: socket.socket, client: str) -> None:
        cap = self.limits.max_connections_per_client
        with contextlib.suppress(OSError):
            conn.setblocking(False)
            message = f"more than {cap} connections from your address: close one first"
            conn.send(_reply_bytes(HTTPStatus.TOO_MANY_REQUESTS, message))
            conn.shutdown(socket.SHUT_WR)
        conn.close()
        if client not in self._capped:
            self._capped.add(client)
            log.warning(
                "HTTP client %s holds %d connections, the cap per client: further ones are "
                "answered 429 and closed until it holds fewer", client, cap,
            )  # fmt: skip

    def add_task(self, task: object) -> None:
        """Queue a connection's request for the pool, unless it is a probe arriving now: the
        channel answers that itself as soon as waitress has parsed it."""
        if isinstance(task, _Channel) and task.receiving and _is_probe(task.requests[0]):
            task.probe_waiting = True
            return
        super().add_task(cast(Any, task))  # the stubs say Task: waitress passes the channel

    def maintenance(self, now: float) -> None:
        """Waitress closes silent connections; this also ends requests past their deadlines."""
        super().maintenance(now)  # type: ignore[arg-type]  # stubs say int; it is time.time()
        limits = self.limits
        moment = time.monotonic()
        head_cutoff = moment - limits.head_timeout_s
        request_cutoff = moment - limits.request_timeout_s
        timeouts = {"request head": limits.head_timeout_s, "request": limits.request_timeout_s}
        for channel in self._channels():
            # a connection whose complete request a worker thread is running is not late
            if not isinstance(channel, _Channel) or channel.requests:
                continue
            missed = channel.missed_deadline(head_cutoff, request_cutoff)
            if missed is not None:
                channel.time_out(missed, timeouts[missed])

    def close(self) -> None:
        """Close the listener only: the wake-up pipe outlives the loop (see `end_loop`)."""
        wasyncore.dispatcher.close(self)

    def end_loop(self) -> None:
        """Have the event loop close the listener and every connection, then return.

        Callable from any thread. The wake-up pipe this pulls is left open (another thread
        may be pulling it at the same moment, or its descriptor would be reused under that
        thread's feet); `release` closes it once the loop and the worker threads are done.
        """
        wake = cast(Trigger, self.trigger)

        def close_all_but_the_pipe(*_: object) -> None:
            for dispatcher in list(self.socket_map.values()):
                with contextlib.suppress(OSError):
                    if isinstance(dispatcher, HTTPChannel):
                        dispatcher.handle_close()  # also wakes a task waiting to write
                    elif dispatcher is not wake:
                        dispatcher.close()
            wake.del_channel()  # the map is empty now, so the loop returns

        wake.pull_trigger(close_all_but_the_pipe)

    def release(self) -> None:
        """Stop the worker threads (waiting a bounded time) and close the wake-up pipe."""
        self.task_dispatcher.shutdown(timeout=_STOP_WAIT_S)
        cast(Trigger, self.trigger).close()


def always_live() -> tuple[bool, str]:
    return True, "ok"


class HttpServer:
    """Serves /healthz, /readyz, /metrics and POST /sedna/workers/{worker}/info on a thread.

    `live` answers /healthz (200 with "ok", or 503 with its reason): by default always live.

    `token`, when not empty, is required as `Authorization: Bearer <token>` on the worker
    endpoint and on /metrics (which names every job and dataset); the probes stay open.
    Without a token, `allowed_hosts` (unless None) are the host names those two routes answer
    to besides IP addresses, so a page a browser loaded from a name that the attacker points
    at this address (DNS rebinding) cannot reach them.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ready: ReadyFn,
        metrics: MetricsFn,
        worker_info: WorkerInfoFn,
        live: LiveFn = always_live,
        max_body_bytes: int = 1 << 20,
        token: str = "",
        allowed_hosts: Sequence[str] | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_connections_per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
        head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        threads: int = DEFAULT_THREADS,
    ) -> None:
        self._host = host
        self._port = port
        self._routes = Routes.of(
            ready, metrics, worker_info, token, live, allowed_hosts=allowed_hosts
        )
        self._max_body_bytes = max_body_bytes
        self._max_connections = max_connections
        self._limits = _Limits(
            head_timeout_s=min(head_timeout_s, request_timeout_s),
            request_timeout_s=request_timeout_s,
            max_connections_per_client=max_connections_per_client,
        )
        self._threads = threads
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
        sock = self._bind()
        adj = Adjustments(
            sockets=[sock],
            threads=self._threads,
            # waitress counts its listener and its wake-up pipe among the connections
            connection_limit=self._max_connections + 2,
            channel_timeout=max(1, round(self._limits.request_timeout_s)),
            cleanup_interval=_CHECK_INTERVAL_S,
            asyncore_loop_timeout=_CHECK_INTERVAL_S,
            asyncore_use_poll=True,  # select() fails on descriptors above 1023
            # waitress refuses a body of this size or more: one byte past ours is allowed
            max_request_body_size=self._max_body_bytes + 1,
            inbuf_overflow=self._max_body_bytes + 1,  # keep bodies in memory, never in /tmp
            max_request_header_size=_MAX_HEADER_BYTES,
            ident="lifelong",
            expose_tracebacks=False,
            clear_untrusted_proxy_headers=True,
        )
        server = _Server(App(self._routes), sock, adj, self._limits)
        self._port = int(sock.getsockname()[1])
        self._server = server
        self._thread = threading.Thread(
            target=self._serve, args=(server,), name="lifelong-http", daemon=True
        )
        self._thread.start()
        log.info("HTTP listening on %s:%d", self._host, self.port)

    def _bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self._host, self._port))
        except OSError as e:
            sock.close()
            raise ConfigError(
                f"cannot listen for HTTP on {self._host}:{self._port}: {e.strerror or e}"
            ) from e
        return sock

    @staticmethod
    def _serve(server: _Server) -> None:
        try:
            server.run()
        except Exception:
            log.exception("HTTP event loop failed; the endpoint is down")

    def stop(self) -> None:
        """Stop accepting, close every connection, wait for the loop and the worker threads."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.end_loop()
        thread.join()
        server.release()
        self._server, self._thread = None, None
