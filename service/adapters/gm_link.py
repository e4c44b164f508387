"""The GM link: one websocket from a node to Sedna's GM, spoken as Sedna's local controller.

The connection, as Sedna's own code has it (kubeedge/sedna: the local controller's client in
``pkg/localcontroller/gmclient/websocket.go``, the GM's server in
``pkg/globalmanager/messagelayer/ws/``; both on gorilla/websocket 1.5):

- The local controller dials the GM with the HTTP header ``Node-Name: {node}``; the GM files
  the connection under that node (it does not refuse a request without the header: it files
  it under the empty name). After a failed dial the local controller waits 5 s and dials
  again; after a connection ends it dials at once. Right after the handshake it writes
  `HELLO_FRAME`, and so does this link.
- The GM keeps one outgoing queue per node name, shared by every connection of that node: a
  second connection for the same node is accepted beside the first, and each queued message
  goes to whichever connection's writer takes it first. Hence only one replica of a node may
  hold the link at a time. A message queued while the node has no connection waits for one;
  a message whose write failed is queued again; a message that was written is forgotten by
  the GM even if the connection then drops before the local controller read it.
- Neither side sends pings or sets read deadlines or limits; gorilla answers pings with pongs.
  So this link sends websocket pings (every ``ping_interval_s``) to find a GM that died
  without closing the connection, which Sedna's local controller never notices.

Where the link dials: Sedna's ``GM_ADDRESS`` (``host:port``; Sedna's local controller dials
``ws://{GM_ADDRESS}/``) or a ``ws://``/``wss://`` URL, whose query may name TLS files
(``ca=``, ``cert=``, ``key=``, ``insecure=1``; see `service.adapters.broker_url`).
Configuration validates the address with `parse_gm_address` at startup; the link builds its
TLS context with `ssl_context`.

How this link differs from Sedna's client, on purpose: it follows no HTTP redirect (the dial
fails with the reason), and a frame that is not a valid message does not end the connection
(Sedna's ``ReadJSON`` error does): every received frame goes to ``on_frame`` as bytes,
unparsed, and the caller's decoder rejects it with a reason. Only a frame larger than
``max_frame_bytes`` ends the connection (close code 1009, the bytes are not kept);
``on_reject`` hears about it. The hand-off to ``on_frame`` is bounded: while the frames
handed on and not yet `GmFrame.taken` are at ``max_pending_frames`` or
``max_pending_bytes``, the link reads nothing more (websockets stops reading the socket
once ``READ_QUEUE_FRAMES`` wait, and TCP slows the GM down); a pause longer than the ping
timeout drops the connection, as a GM that stopped answering pings would, and the link
redials. A send never queues here: while the link is down `GmLink.send` returns False and
the caller keeps the message to send again.

What the link reports: its state (`LinkState`), for ``/readyz`` and ``describe``, and the
metrics hooks of a `GmObserver` it calls as frames pass and the connection comes and goes.

All I/O runs on one asyncio event loop on the link's own thread; `GmLink.send` hands the
frame to it and waits for the write. Library errors never leave this module: they become
``False`` from `GmLink.send` and the ``last_error`` of `GmLink.state`.
"""


import asyncio
import concurrent.futures
import contextlib
import logging
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, SecurityError, WebSocketException
from websockets.frames import CloseCode

from service.adapters.broker_url import TLS_QUERY_KEYS, TlsFiles, query_options, tls_files
from service.adapters.gm_frames import HELLO_FRAME, GmFrame, GmRejected, encode_frame
from service.errors import ConfigError, PermanentError
from service.heartbeat import Heartbeats, progress
from service.urls import redact_url

log = logging.getLogger("service.gm")


@dataclass(frozen=True)
class GmEndpoint:
    """Where the link dials: the websocket URL (TLS query removed) and, for ``wss://``, its
    TLS files."""

    url: str
    tls: TlsFiles | None = None

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
    fail = partial(_address_error, address)
    options = query_options(parts.query, TLS_QUERY_KEYS, fail)
    if scheme == "ws" and options:
        raise fail("ca=, cert=, key= and insecure= need wss://")
    tls = tls_files(options, fail) if scheme == "wss" else None
    url = urlunsplit((scheme, parts.netloc, parts.path or "/", "", ""))
    return GmEndpoint(url=url, tls=tls)


def ssl_context(tls: TlsFiles) -> ssl.SSLContext:
    """The client TLS context for ``tls``; `ConfigError` if a file cannot be loaded."""
    try:
        context = ssl.create_default_context(cafile=tls.ca_path)
        if tls.cert_path is not None:
            context.load_cert_chain(tls.cert_path, tls.key_path)
    except (OSError, ssl.SSLError, ValueError) as e:
        raise ConfigError(f"GM TLS files (ca/cert/key) could not be loaded: {e}") from e
    if tls.insecure:
        context.check_hostname = False
    return context


LinkStatus = Literal["disabled", "connecting", "up", "down"]
Direction = Literal["in", "out"]


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

    def reading_paused(self, paused: bool) -> None: ...


class NoObserver:
    """The observer of a link nobody measures."""

    def frame(self, direction: Direction) -> None:
        pass

    def reconnected(self) -> None:
        pass

    def link_up(self, up: bool) -> None:
        pass

    def reading_paused(self, paused: bool) -> None:
        pass


NODE_NAME_HEADER = "Node-Name"
DEFAULT_REDIAL_S = 5.0
# Far above the largest envelope the intake accepts, so an oversized resource is rejected
# with a reason by the decoder instead of costing the connection.
DEFAULT_MAX_FRAME_BYTES = 4 << 20
# The hand-off to the intake holds at most this much: one intake batch of frames, and bytes
# for a few of the largest resources (as the MQTT ingress is bounded by the broker's
# in-flight window of messages of at most 1 MiB).
DEFAULT_MAX_PENDING_FRAMES = 500
DEFAULT_MAX_PENDING_BYTES = 16 << 20
# Frames websockets buffers off the socket while the hand-off is full (its default is 16).
READ_QUEUE_FRAMES = 4


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
    max_pending_frames: int = DEFAULT_MAX_PENDING_FRAMES
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES

    def __post_init__(self) -> None:
        if self.redial_s <= 0 or self.open_timeout_s <= 0 or self.send_timeout_s <= 0:
            raise ConfigError("GM link redial_s, open_timeout_s and send_timeout_s must be > 0")
        if self.close_timeout_s < 0 or self.max_frame_bytes < 1:
            raise ConfigError("GM link close_timeout_s must be >= 0 and max_frame_bytes >= 1")
        if self.max_pending_frames < 1 or self.max_pending_bytes < 1:
            raise ConfigError("GM link max_pending_frames and max_pending_bytes must be >= 1")


class _HandOff:
    """The frames handed to ``on_frame`` and not yet `GmFrame.taken`, in count and bytes.

    The reader waits (`room`) before each read while either is at its cap, so a GM sending
    faster than the intake takes frames in is slowed down by TCP instead of growing memory;
    `taken` (any thread) wakes it. A frame larger than the byte cap still goes alone.
    """

    def __init__(self, max_frames: int, max_bytes: int, observer: GmObserver) -> None:
        self._max_frames = max_frames
        self._max_bytes = max_bytes
        self._observer = observer
        self._lock = threading.Lock()
        self._frames = 0
        self._bytes = 0
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    def _full(self) -> bool:
        return self._frames >= self._max_frames or self._bytes >= self._max_bytes

    async def room(self) -> None:
        """Return once the hand-off is below both caps (on the link's loop)."""
        with self._lock:
            if not self._full():
                return
            event = asyncio.Event()
            self._waiter = (asyncio.get_running_loop(), event)
            held = (self._frames, self._bytes)
        log.warning("GM link: the intake has not taken in %d frames (%d bytes) yet; reading "
                    "paused until it does", *held)  # fmt: skip
        self._observer.reading_paused(True)
        paused_at = time.monotonic()
        try:
            await event.wait()
        finally:
            with self._lock:
                self._waiter = None
            self._observer.reading_paused(False)
        log.info("GM link: reading again after %.1fs", time.monotonic() - paused_at)

    def handed(self, size: int) -> Callable[[], None]:
        """Count a frame of ``size`` bytes handed on; returns its `GmFrame.taken`."""
        with self._lock:
            self._frames += 1
            self._bytes += size
        done = threading.Event()

        def taken() -> None:
            if done.is_set():
                return
            done.set()
            with self._lock:
                self._frames -= 1
                self._bytes -= size
                waiter = None if self._full() else self._waiter
            if waiter is not None:
                loop, event = waiter
                with contextlib.suppress(RuntimeError):  # the loop already ended
                    loop.call_soon_threadsafe(event.set)

        return taken


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
        heartbeats: Heartbeats | None = None,
    ) -> None:
        if not node:
            raise ConfigError("the GM link needs a node name (the Node-Name header)")
        self._endpoint = endpoint
        self._node = node
        self._on_frame = on_frame
        self._on_reject = on_reject
        self._observer: GmObserver = observer if observer is not None else NoObserver()
        self._settings = settings if settings is not None else GmLinkSettings()
        self._ssl = ssl_context(endpoint.tls) if endpoint.tls is not None else None
        self._heartbeats = heartbeats
        self._handoff = _HandOff(
            self._settings.max_pending_frames, self._settings.max_pending_bytes, self._observer
        )
        self._lock = threading.Lock()
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
        progress()  # a large frame takes a while to encode
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
            self._wait_written(future)
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

    def _wait_written(self, future: concurrent.futures.Future[None]) -> None:
        """Wait up to ``send_timeout_s`` for the write, in slices after each of which the
        caller's thread beats its heartbeat: waiting on the GM is not a stall of it."""
        deadline = time.monotonic() + self._settings.send_timeout_s
        slice_s = (
            self._heartbeats.check_interval_s
            if self._heartbeats is not None
            else self._settings.send_timeout_s
        )
        while True:
            remaining = deadline - time.monotonic()
            try:
                future.result(max(0.0, min(slice_s, remaining)))
                return
            except TimeoutError:
                if remaining <= slice_s:
                    raise
                progress()

    # -- the link's thread ------------------------------------------------------------------

    def _thread_main(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[None]) -> None:
        """Run the link until it is cancelled, watched by ``heartbeats`` when given: a task
        beats every `Heartbeats.check_interval_s`, so the beat stops when the event loop is
        blocked (a callback or a send that does not yield)."""
        heartbeats = self._heartbeats
        if heartbeats is None:
            self._run_loop(loop, task)
            return
        with heartbeats.watch("gm-link"):
            loop.create_task(_beat_every(heartbeats.check_interval_s))
            self._run_loop(loop, task)

    @staticmethod
    def _run_loop(loop: asyncio.AbstractEventLoop, task: asyncio.Task[None]) -> None:
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
        async with _Dial(
            self._endpoint.url,
            additional_headers={NODE_NAME_HEADER: self._node},
            compression=None,  # gorilla's default, and Sedna's GM does not enable it
            open_timeout=settings.open_timeout_s,
            ping_interval=settings.ping_interval_s,
            ping_timeout=settings.ping_timeout_s,
            close_timeout=settings.close_timeout_s,
            max_size=settings.max_frame_bytes,
            max_queue=READ_QUEUE_FRAMES,
            **options,
        ) as connection:
            await connection.send(HELLO_FRAME)
            self._link_up(connection)
            while True:
                await self._handoff.room()
                data = await connection.recv(decode=False)
                taken = self._handoff.handed(len(data))
                self._deliver(GmFrame(data=data, received_at=time.time(), taken=taken))

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
            frame.taken()  # it holds the frame no more

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


async def _beat_every(interval_s: float) -> None:
    """Beat the link thread's heartbeat while its event loop runs (cancelled at its end)."""
    while True:
        progress()
        await asyncio.sleep(interval_s)


class _Dial(connect):
    """websockets' ``connect``, refusing every redirect: the GM is dialed where configured
    and nowhere else (``connect`` follows up to 10, across hosts and ports, with our
    Node-Name header)."""

    def process_redirect(self, exc: Exception) -> Exception | str:
        if isinstance(exc, InvalidStatus) and 300 <= exc.response.status_code < 400:
            location = exc.response.headers.get("Location", "")
            return SecurityError(
                f"the GM answered HTTP {exc.response.status_code} redirecting to "
                f"{location!r}; redirects are not followed"
            )
        return exc


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
