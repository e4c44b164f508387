"""What the HTTP face answers: health, readiness, metrics and Sedna's worker report endpoint.

What each route means lives in the callbacks the runtime passes in (`Routes`); this module
only speaks HTTP: it refuses what is not a well-formed request for a route (wrong method, a
worker name that is not a DNS-1123 subdomain, a body that is not `application/json`, a
missing or wrong bearer token when one is configured, a `Host` it does not answer to when
none is) before any callback sees it. Whatever
a callback does, the client gets a short JSON reason (never a traceback): `App` is the WSGI
application, and never lets an exception reach the server.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

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
