"""The HTTP server plumbing: waitress, with a deadline per request and a cap on connections.

waitress runs one event-loop thread that accepts connections and reads every request in full
(headers, then the body, held in memory) before one of a few worker threads runs it, so a
client that sends slowly costs a socket and a buffer, never a thread. On top of waitress's own
limits this module adds a deadline per request: a request whose headers and body have not all
arrived within `request_timeout_s` of its first byte is answered 408 and its connection closed
(waitress alone only closes connections that stay silent, which a client trickling a byte at a
time never does). At most `max_connections` connections are open at once; more wait in the
kernel's accept queue. waitress's own refusals (400, 413, 431, ...) get the JSON replies every
route gives, and the body of a request refused as too large is read and dropped, so the client
sees the 413. The routes themselves are `service.adapters.http.routes`.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from http import HTTPStatus
from typing import Any, cast

from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser
from waitress.server import TcpWSGIServer
from waitress.task import ErrorTask
from waitress.trigger import trigger as Trigger  # noqa: N812 (waitress names the class so)
from waitress.utilities import RequestEntityTooLarge

from service.adapters.http.routes import (
    JSON,
    App,
    LiveFn,
    MetricsFn,
    ReadyFn,
    Routes,
    WorkerInfoFn,
    json_body,
)
from service.errors import ConfigError

log = logging.getLogger("service.adapters.http")

DEFAULT_MAX_CONNECTIONS = 100
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


class _Channel(HTTPChannel):
    """One connection; remembers when its request in progress began (for the deadline)."""

    parser_class = _Parser
    error_task_class = _ErrorTask
    request_started: float | None = None

    def received(self, data: bytes) -> bool:
        if self.request is None:
            self.request_started = time.monotonic()
        taken = super().received(data)
        if self.request is None:
            self.request_started = None
        return taken

    def began_before(self, moment: float) -> bool:
        """Whether a request is in progress that began before `moment` (monotonic seconds)."""
        return self.request_started is not None and self.request_started < moment

    def time_out(self, timeout_s: float) -> None:
        """Answer 408 and close; runs on the event loop while no task owns the connection."""
        status = HTTPStatus.REQUEST_TIMEOUT
        body = json_body(status, f"request not received in full within {timeout_s:g} s")
        head = (
            f"HTTP/1.1 {status.value} {status.phrase}\r\nContent-Type: {JSON}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        reply = head.encode() + body
        with self.outbuf_lock:
            self.outbufs[-1].append(reply)
            self.total_outbufs_len += len(reply)
        if self.request is not None:
            self.request.close()
            self.request = None
        self.request_started = None
        self.close_when_flushed = True
        log.info(
            "HTTP request from %s not received in full within %g s: answered 408, closed",
            self.addr[0], timeout_s,
        )  # fmt: skip


class _Server(TcpWSGIServer):
    """Waitress's TCP server with our channel and the per-request deadline."""

    channel_class = _Channel

    def __init__(
        self, app: App, sock: socket.socket, adj: Adjustments, request_timeout_s: float
    ) -> None:
        self.request_timeout_s = request_timeout_s
        self.socket_map: dict[int, Any] = {}  # waitress's dispatchers, keyed by descriptor
        sockinfo = (sock.family, sock.type, sock.proto, sock.getsockname())
        super().__init__(app, self.socket_map, True, sock, None, adj, sockinfo, bind_socket=False)

    def maintenance(self, now: float) -> None:
        """Waitress closes silent connections; this also ends requests past their deadline."""
        super().maintenance(now)  # type: ignore[arg-type]  # stubs say int; it is time.time()
        cutoff = time.monotonic() - self.request_timeout_s
        channels = cast(dict[int, HTTPChannel], self.active_channels)
        for channel in list(channels.values()):
            # a connection whose complete request a worker thread is running is not late
            if (
                isinstance(channel, _Channel)
                and channel.began_before(cutoff)
                and not channel.requests
            ):
                channel.time_out(self.request_timeout_s)

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
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        threads: int = DEFAULT_THREADS,
    ) -> None:
        self._host = host
        self._port = port
        self._routes = Routes.of(ready, metrics, worker_info, token, live)
        self._max_body_bytes = max_body_bytes
        self._max_connections = max_connections
        self._request_timeout_s = request_timeout_s
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
            channel_timeout=max(1, round(self._request_timeout_s)),
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
        server = _Server(App(self._routes), sock, adj, self._request_timeout_s)
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
