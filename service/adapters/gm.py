"""Sedna global manager (GM) link: one websocket to the GM, spoken as Sedna's local controller.

The protocol, as Sedna's own code has it (kubeedge/sedna: the local controller's client in
``pkg/localcontroller/gmclient/websocket.go``, the GM's server in
``pkg/globalmanager/messagelayer/ws/``; both on gorilla/websocket 1.5):

- The local controller dials ``ws://{GM_ADDRESS}/`` (``host:port``, no scheme) with the HTTP
  header ``Node-Name: {node}``; the GM files the connection under that node (it does not
  refuse a request without the header: it files it under the empty name). After a failed
  dial the local controller waits 5 s and dials again; after a connection ends it dials at
  once.
- Right after the handshake the local controller writes one frame holding an empty message
  header, ``{"namespace":"","resourceKind":"","resourceName":"","operation":""}``; the GM
  reads it as a message with an empty operation and ignores it (with a log line).
  `HELLO_FRAME` is that frame, sent the same way here.
- Every frame is one text message written by gorilla's ``WriteJSON``: Go's ``encoding/json``
  encoder, so compact JSON, ``<``, ``>``, ``&``, U+2028 and U+2029 escaped as ``\\u003c``
  and so on, and a trailing newline. The message is
  ``{"header":{"namespace","resourceKind","resourceName","operation"},"content":...}`` where
  ``content`` is a Go ``[]byte``: standard base64 with padding of the resource's or status's
  JSON, ``null`` when nil. Readers use ``ReadJSON`` and so accept text or binary messages,
  ignore unknown fields (the ``id`` we add to the header) and decode base64 leniently.
- The GM sends ``insert`` and ``delete`` of datasets and lifelong-learning jobs (an update is
  sent as ``insert``; the informers' resyncs, every 30-60 s by default, re-send every
  resource); ``content`` is the whole resource, also on delete. The local controller sends
  ``status`` frames. Nothing is acknowledged in either direction. The GM replaces a
  dataset's status with each dataset status it reads, but appends one condition to a
  lifelong-learning job's status per job status it reads (so one read twice shows twice,
  and one whose ``status`` is not ready/completed/failed/waiting is logged and dropped).
- The GM keeps one outgoing queue per node name, shared by every connection of that node: a
  second connection for the same node is accepted beside the first, and each queued message
  goes to whichever connection's writer takes it first. Hence only one replica of a node may
  hold the link at a time. A message queued while the node has no connection waits for one;
  a message whose write failed is queued again; a message that was written is forgotten by
  the GM even if the connection then drops before the local controller read it.
- Neither side sends pings or sets read deadlines or limits; gorilla answers pings with pongs.
  So this link sends websocket pings (every ``ping_interval_s``) to find a GM that died
  without closing the connection, which Sedna's local controller never notices.

How this module differs from Sedna's client, on purpose: a frame that is not a valid message
does not end the connection (Sedna's ``ReadJSON`` error does): every received frame goes to
``on_frame`` as bytes, unparsed, and the caller's decoder rejects it with a reason. Only a
frame larger than ``max_frame_bytes`` ends the connection (close code 1009, the bytes
are not kept); ``on_reject`` hears about it. A send never queues here: while the link is
down `GmLink.send` returns False and the caller keeps the message to send again.

All I/O runs on one asyncio event loop on the link's own thread; `GmLink.send` hands the
frame to it and waits for the write. Library errors never leave this module: they become
``False`` from `GmLink.send` and the ``last_error`` of `GmLink.state`.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import json
import logging
import re
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.frames import CloseCode

from service.errors import ConfigError, PermanentError
from service.urls import redact_url

log = logging.getLogger("service.gm")

NODE_NAME_HEADER = "Node-Name"
# What Sedna's local controller writes first on every connection: an empty message header.
HELLO_FRAME = '{"namespace":"","resourceKind":"","resourceName":"","operation":""}\n'
# The header fields of Sedna's MessageHeader, in the order Go marshals them.
HEADER_FIELDS = ("namespace", "resourceKind", "resourceName", "operation")
DEFAULT_REDIAL_S = 5.0
# Far above the largest envelope the intake accepts, so an oversized resource is rejected
# with a reason by the decoder instead of costing the connection.
DEFAULT_MAX_FRAME_BYTES = 4 << 20
_TLS_QUERY_KEYS = ("ca", "cert", "key", "insecure")
_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})

LinkStatus = Literal["disabled", "connecting", "up", "down"]
Direction = Literal["in", "out"]


# --- the address -----------------------------------------------------------------------------


@dataclass(frozen=True)
class GmTls:
    """TLS files from a ``wss://`` URL's query (``ca=``, ``cert=``, ``key=``, ``insecure=1``).

    As for the MQTT URL, ``insecure`` skips only the host name check; the certificate chain
    is still verified (against ``ca`` or the system's trust store).
    """

    ca_path: str | None = None
    cert_path: str | None = None
    key_path: str | None = None
    insecure: bool = False


@dataclass(frozen=True)
class GmEndpoint:
    """Where the link dials: the websocket URL (TLS query removed) and its TLS files."""

    url: str
    tls: GmTls | None = None

    @property
    def shown(self) -> str:
        """The URL fit for logs: a password in it masked."""
        return redact_url(self.url)


def _address_error(address: str, problem: str) -> ConfigError:
    shown = redact_url(address if "://" in address else f"ws://{address}")
    if "://" not in address:
        shown = shown.removeprefix("ws://")
    return ConfigError(f"GM address {shown!r}: {problem}")


def parse_gm_address(address: str) -> GmEndpoint:
    """Parse ``host:port`` (Sedna's GM_ADDRESS, dialed as ``ws://host:port/``) or a
    ``ws://`` / ``wss://`` URL, whose query may name TLS files
    (``wss://gm:443/?ca=/ca.pem&cert=/tls.crt&key=/tls.key``).

    Raises `ConfigError` saying what is wrong; a password in the URL is never shown.
    """
    text = address.strip()
    if not text:
        raise _address_error(address, "empty")
    bare = "://" not in text
    if bare and any(c in text for c in "/?#@"):
        raise _address_error(address, "expected host:port or a ws:// or wss:// URL")
    try:
        parts = urlsplit(f"ws://{text}/" if bare else text)
        port = parts.port
    except ValueError:
        raise _address_error(address, "port must be a number in 1..65535") from None
    scheme = parts.scheme.lower()
    if scheme not in ("ws", "wss"):
        raise _address_error(address, f"scheme {scheme!r} is not ws:// or wss://")
    if not parts.hostname:
        raise _address_error(address, "no host")
    if port == 0:
        raise _address_error(address, "port must be in 1..65535")
    if parts.fragment:
        raise _address_error(address, "a GM URL takes no #fragment")
    tls = _parse_tls_query(address, parts.query, scheme == "wss")
    url = urlunsplit((scheme, parts.netloc, parts.path or "/", "", ""))
    return GmEndpoint(url=url, tls=tls)


def _parse_tls_query(address: str, query: str, secure: bool) -> GmTls | None:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise _address_error(address, "the query string is malformed") from None
    options: dict[str, str] = {}
    for name, value in pairs:
        if name not in _TLS_QUERY_KEYS:
            allowed = ", ".join(_TLS_QUERY_KEYS)
            raise _address_error(address, f"unknown query parameter {name!r} (allowed: {allowed})")
        if name in options:
            raise _address_error(address, f"query parameter {name!r} given twice")
        options[name] = value
    if not secure:
        if options:
            raise _address_error(address, "ca=, cert=, key= and insecure= need wss://")
        return None
    if ("cert" in options) != ("key" in options):
        raise _address_error(address, "cert= and key= must be given together")
    insecure = options.get("insecure", "").strip().lower()
    if insecure not in _TRUE_WORDS | _FALSE_WORDS:
        raise _address_error(address, f"insecure= must be 1 or 0, not {insecure!r}")
    return GmTls(
        ca_path=options.get("ca") or None,
        cert_path=options.get("cert") or None,
        key_path=options.get("key") or None,
        insecure=insecure in _TRUE_WORDS,
    )


def _ssl_context(tls: GmTls) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=tls.ca_path)
        if tls.cert_path is not None:
            context.load_cert_chain(tls.cert_path, tls.key_path)
    except (OSError, ssl.SSLError, ValueError) as e:
        raise ConfigError(f"GM TLS files (ca/cert/key) could not be loaded: {e}") from e
    if tls.insecure:
        context.check_hostname = False
    return context


# --- frames ----------------------------------------------------------------------------------

# Go's encoding/json escapes these in strings (HTML safety, JavaScript line terminators);
# Python's json module leaves them alone.
_GO_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def go_json_string(value: str) -> str:
    """``value`` as Go's ``encoding/json`` writes a string (Go 1.22 and later).

    Both escape ``"``, ``\\``, ``\\b``, ``\\f``, ``\\n``, ``\\r``, ``\\t`` by their short forms
    and other control characters as ``\\u00xx`` (lower-case hex), and keep other non-ASCII as
    UTF-8; Go also escapes ``< > &`` and U+2028/U+2029, and writes ``\\ufffd`` for what is not
    valid Unicode (a lone surrogate here).
    """
    text = json.dumps(value, ensure_ascii=False).translate(_GO_ESCAPES)
    return _LONE_SURROGATE.sub(r"\\ufffd", text)


def encode_frame(header: Mapping[str, str], content_json: bytes | None) -> str:
    """One frame as Sedna's local controller writes it with gorilla's ``WriteJSON``.

    The header's four Sedna fields come first in Go's order (a missing one as ``""``, Go's
    zero value), then any other keys of ``header`` (``id``) in their given order, which Go
    readers ignore. ``content_json`` goes as standard base64 with padding (Go's ``[]byte``);
    None is Go's nil slice, ``null``. The frame ends with the newline Go's encoder adds.
    """
    fields = [(name, header.get(name, "")) for name in HEADER_FIELDS]
    fields += [(name, value) for name, value in header.items() if name not in HEADER_FIELDS]
    head = ",".join(f"{go_json_string(name)}:{go_json_string(value)}" for name, value in fields)
    if content_json is None:
        content = "null"
    else:
        content = '"' + base64.b64encode(content_json).decode("ascii") + '"'
    return f'{{"header":{{{head}}},"content":{content}}}\n'


@dataclass(frozen=True)
class GmFrame:
    """One frame received from the GM: its bytes as they came (text frames as UTF-8, never
    decoded or checked here) and when it arrived (``time.time()``)."""

    data: bytes
    received_at: float


@dataclass(frozen=True)
class GmRejected:
    """A frame the link could not take (too large: the connection was closed to drop it)."""

    reason: str
    received_at: float


# --- the link --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkState:
    """What `/readyz` and ``describe`` show of the link.

    ``since`` is when ``status`` last changed (``time.time()``); ``last_error`` why the latest
    dial failed or connection ended (kept after the link is up again, None if none has);
    ``reconnects`` counts the times the link came back up after having been up.
    """

    status: LinkStatus
    since: float
    last_error: str | None = None
    reconnects: int = 0
    frames_in: int = 0
    frames_out: int = 0


class GmObserver(Protocol):
    """Metrics hooks; called on the link's thread (``frame("out")`` on the sender's)."""

    def frame(self, direction: Direction) -> None: ...

    def reconnected(self) -> None: ...

    def link_up(self, up: bool) -> None: ...


@dataclass(frozen=True)
class GmLinkSettings:
    """Timing and limits of the link; the defaults suit production.

    ``redial_s`` spaces dial attempts (Sedna's local controller waits 5 s after a failed
    dial); a connection that ends is redialled at once if the last dial was longer ago.
    Keepalive pings find a GM that vanished without closing the connection within
    ``ping_interval_s + ping_timeout_s`` (None turns them off).
    """

    redial_s: float = DEFAULT_REDIAL_S
    open_timeout_s: float = 10.0
    ping_interval_s: float | None = 20.0
    ping_timeout_s: float | None = 20.0
    close_timeout_s: float = 2.0
    send_timeout_s: float = 10.0
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES

    def __post_init__(self) -> None:
        if self.redial_s <= 0 or self.open_timeout_s <= 0 or self.send_timeout_s <= 0:
            raise ConfigError("GM link redial_s, open_timeout_s and send_timeout_s must be > 0")
        if self.close_timeout_s < 0 or self.max_frame_bytes < 1:
            raise ConfigError("GM link close_timeout_s must be >= 0 and max_frame_bytes >= 1")


class _NoObserver:
    def frame(self, direction: Direction) -> None:
        pass

    def reconnected(self) -> None:
        pass

    def link_up(self, up: bool) -> None:
        pass


class GmLink:
    """The websocket link of one node to Sedna's GM, redialled until `stop`.

    ``on_frame`` gets every received frame, in order, on the link's thread: it must be
    quick (hand the frame on) and must not call `send`. ``on_reject`` hears of frames that
    could not be taken at all. Exceptions from either are logged and swallowed.
    """

    def __init__(
        self,
        endpoint: GmEndpoint,
        node: str,
        on_frame: Callable[[GmFrame], None],
        *,
        on_reject: Callable[[GmRejected], None] | None = None,
        observer: GmObserver | None = None,
        settings: GmLinkSettings | None = None,
    ) -> None:
        if not node:
            raise ConfigError("the GM link needs a node name (the Node-Name header)")
        self._endpoint = endpoint
        self._node = node
        self._on_frame = on_frame
        self._on_reject = on_reject
        self._observer: GmObserver = observer if observer is not None else _NoObserver()
        self._settings = settings if settings is not None else GmLinkSettings()
        self._ssl = _ssl_context(endpoint.tls) if endpoint.tls is not None else None
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._state = LinkState(status="disabled", since=time.time())
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._connection: ClientConnection | None = None
        self._stopped = False
        self._ever_up = False
        self._failures = 0  # dials or connections that failed since the link was last up

    @property
    def endpoint(self) -> GmEndpoint:
        return self._endpoint

    @property
    def state(self) -> LinkState:
        with self._lock:
            return self._state

    def start(self) -> None:
        """Start dialing in the background; returns at once. A second call does nothing."""
        with self._lock:
            if self._thread is not None or self._stopped:
                return
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._task = loop.create_task(self._run())
            self._thread = threading.Thread(
                target=self._thread_main, args=(loop, self._task), name="gm-link", daemon=True
            )
            self._set_status("connecting")
            self._thread.start()
        log.info("GM link for node %s: dialing %s", self._node, self._endpoint.shown)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Close the connection (politely, within ``close_timeout_s``) and stop redialing.

        Idempotent; the link cannot be started again. Returns once the link's thread ended,
        or after ``timeout_s`` with a warning.
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            loop, task, thread = self._loop, self._task, self._thread
        if loop is None or task is None or thread is None:
            return
        with contextlib.suppress(RuntimeError):  # RuntimeError: the loop already ended
            loop.call_soon_threadsafe(task.cancel)
        thread.join(timeout_s)
        if thread.is_alive():
            log.warning("GM link thread did not end within %.1fs", timeout_s)
        else:
            log.info("GM link for node %s stopped", self._node)

    def wait_status(self, status: LinkStatus, timeout_s: float) -> bool:
        """Block until the link's status is ``status``; False if ``timeout_s`` passed first."""
        with self._changed:
            return self._changed.wait_for(lambda: self._state.status == status, timeout_s)

    def send(self, header: Mapping[str, str], content_json: bytes | None) -> bool:
        """Write one frame (`encode_frame`) to the GM; True once it was written to the open
        connection.

        False, at once, while the link is not up; False also when the connection failed
        during the write, or the write did not finish within ``send_timeout_s`` (the GM is
        not reading), in which case the connection is dropped and redialled. Websocket has
        no acknowledgement: True means the whole frame went to the connection's send
        buffer, not that the GM read it (a frame written just before the connection died is
        lost, as with Sedna's local controller); after False the frame was almost surely
        not read (only bytes that left before the connection ended could make a whole
        frame). Frames sent in order on one connection are read in that order.
        """
        frame = encode_frame(header, content_json)
        with self._lock:
            connection, loop, thread = self._connection, self._loop, self._thread
        if connection is None or loop is None:
            return False
        if threading.current_thread() is thread:
            raise PermanentError("GmLink.send must not be called from the link's own thread")
        write = connection.send(frame)
        try:
            future = asyncio.run_coroutine_threadsafe(write, loop)
        except RuntimeError:  # the loop ended and closed since we looked
            write.close()
            return False
        try:
            future.result(self._settings.send_timeout_s)
        except TimeoutError:
            # Drop the connection with whatever of the frame is still unsent: the GM reads no
            # partial frame, so the caller's resend after the redial is unlikely to duplicate.
            future.cancel()
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(connection.transport.abort)
            log.warning(
                "GM link: a write did not finish within %.1fs; dropping the connection",
                self._settings.send_timeout_s,
            )
            return False
        except (WebSocketException, OSError, concurrent.futures.CancelledError) as e:
            log.info("GM link: a write failed: %s", _describe(e))
            return False
        with self._lock:
            self._state = replace(self._state, frames_out=self._state.frames_out + 1)
        self._observer.frame("out")
        return True

    # -- the link's thread ------------------------------------------------------------------

    @staticmethod
    def _thread_main(loop: asyncio.AbstractEventLoop, task: asyncio.Task[None]) -> None:
        """Run the link until it is cancelled, then end every task and close the loop (as
        ``asyncio.run`` does) so no socket or task outlives the thread."""
        try:
            loop.run_until_complete(task)
        except asyncio.CancelledError:
            pass
        except Exception:  # never let anything reach the thread's top
            log.exception("GM link thread failed")
        finally:
            try:
                # A send racing the stop may add a task while others end: repeat until none.
                while leftover := asyncio.all_tasks(loop):
                    for pending in leftover:
                        pending.cancel()
                    loop.run_until_complete(asyncio.gather(*leftover, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            except Exception:
                log.exception("GM link: ending its tasks failed")
            finally:
                loop.close()

    async def _run(self) -> None:
        """Dial, serve, and dial again, each dial at least ``redial_s`` after the last."""
        last_dial = -self._settings.redial_s
        try:
            while True:
                wait_s = last_dial + self._settings.redial_s - time.monotonic()
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
                last_dial = time.monotonic()
                with self._lock:
                    self._set_status("connecting")
                try:
                    await self._session()
                except (OSError, TimeoutError, WebSocketException) as e:
                    self._connection_ended(e)
                except Exception as e:  # a bug here must not end the link for good
                    log.exception("GM link: unexpected failure")
                    self._connection_ended(e)
        finally:
            with self._lock:
                self._connection = None
                self._set_status("disabled")
            self._observer.link_up(False)

    async def _session(self) -> None:
        """One connection: dial, say hello as Sedna's local controller does, hand every frame
        on until the connection ends, which it always does by an exception."""
        settings = self._settings
        options: dict[str, Any] = {}
        if self._ssl is not None:
            options["ssl"] = self._ssl
        async with connect(
            self._endpoint.url,
            additional_headers={NODE_NAME_HEADER: self._node},
            compression=None,  # gorilla's default, and Sedna's GM does not enable it
            open_timeout=settings.open_timeout_s,
            ping_interval=settings.ping_interval_s,
            ping_timeout=settings.ping_timeout_s,
            close_timeout=settings.close_timeout_s,
            max_size=settings.max_frame_bytes,
            **options,
        ) as connection:
            await connection.send(HELLO_FRAME)
            self._link_up(connection)
            while True:
                data = await connection.recv(decode=False)
                self._deliver(GmFrame(data=data, received_at=time.time()))

    def _link_up(self, connection: ClientConnection) -> None:
        # The observer hears first, so metrics are current once the new status shows.
        been_up, self._ever_up = self._ever_up, True
        if been_up:
            self._observer.reconnected()
        self._observer.link_up(True)
        with self._lock:
            self._failures = 0
            self._connection = connection
            reconnects = self._state.reconnects + (1 if been_up else 0)
            self._state = replace(self._state, reconnects=reconnects)
            self._set_status("up")
        log.info("GM link for node %s is up (%s)", self._node, self._endpoint.shown)

    def _deliver(self, frame: GmFrame) -> None:
        with self._lock:
            self._state = replace(self._state, frames_in=self._state.frames_in + 1)
        self._observer.frame("in")
        try:
            self._on_frame(frame)
        except Exception:
            log.exception("GM link: the frame handler failed")

    def _connection_ended(self, error: Exception) -> None:
        reason = _describe(error)
        with self._lock:
            was_up = self._connection is not None
            self._connection = None  # no send starts on it from now on
        if was_up:
            self._observer.link_up(False)
        with self._lock:
            self._failures += 1
            first = self._failures == 1
            self._state = replace(self._state, last_error=reason)
            self._set_status("down")
        # Warn once per outage; while the GM stays away, each failed dial is debug noise.
        level = logging.WARNING if first else logging.DEBUG
        log.log(level, "GM link for node %s is down: %s", self._node, reason)
        if _too_big(error):
            self._reject(f"GM frame larger than {self._settings.max_frame_bytes} bytes: dropped")

    def _reject(self, reason: str) -> None:
        callback = self._on_reject
        if callback is None:
            log.warning("GM link: %s", reason)
            return
        try:
            callback(GmRejected(reason=reason, received_at=time.time()))
        except Exception:
            log.exception("GM link: the rejection handler failed")

    def _set_status(self, status: LinkStatus) -> None:
        """Record a status change; the caller holds ``self._lock``."""
        if self._state.status != status:
            self._state = replace(self._state, status=status, since=time.time())
            self._changed.notify_all()


def _too_big(error: Exception) -> bool:
    return (
        isinstance(error, ConnectionClosed)
        and error.sent is not None
        and error.sent.code == CloseCode.MESSAGE_TOO_BIG
    )


def _describe(error: BaseException) -> str:
    """A one-line reason for logs and `LinkState.last_error`."""
    if isinstance(error, InvalidStatus):
        return f"the GM refused the websocket upgrade: HTTP {error.response.status_code}"
    if isinstance(error, ConnectionClosed):
        return f"connection closed: {error}"
    if isinstance(error, TimeoutError):
        return "timed out opening the connection"
    text = str(error) or type(error).__name__
    return f"{type(error).__name__}: {text}"
