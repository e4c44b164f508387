"""A stand-in for Sedna's global manager (GM) in tests: a real websocket server on a port.

It behaves as Sedna's GM (kubeedge/sedna ``pkg/globalmanager/messagelayer/ws``, gorilla
websocket 1.5) wherever a local controller can tell:

- It serves any path and files each connection under its ``Node-Name`` request header. A
  request without the header is refused with HTTP 400; the GM itself files it under the
  empty node name, which a test could not tell from "no connection", so refusing is the
  observable equivalent.
- One queue per node, shared by every connection of that node: a frame sent while the node
  has no connection waits for one; with several connections each frame goes to one of them
  (here in turn; in the GM, whichever connection's writer asks first); a frame whose write
  failed is queued again; a frame still queued for the same (kind, namespace, name) is
  replaced by the newer one (the GM's work queue keeps the latest object per key).
- Frames are written as gorilla's ``WriteJSON`` writes Sedna's ``Message``: compact JSON,
  header fields in Go's order, ``content`` the base64 of the resource's JSON, a trailing
  newline. Frames are built here by hand (`go_frame`), independently of the adapter.
- It reads and records every frame (raw), never pings, and answers pings (as gorilla does).

``on_frame``, when given, is called with every frame read (on the stand-in's thread: it must
not block), which is how a GM that acts on what it reads is built on this transport
(tests/sedna_gm); `send_content` queues a resource already marshalled.

Test controls beyond the GM's own behaviour: `stop` then `start` on the same port (a GM
restart: connections dropped without a close frame, as when the process dies, and the queue
lost), `send_raw` (garbage frames), `flood` (many frames, written as fast as they are
read), `freeze` (stop reading a node's connections, so pings go unanswered: a hung GM), and
`close_connections` (the GM closes the node's connections with a close frame). It stays
silent unless told to send.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from service.embedded.processes import free_port
from tests.wait import wait_until

T = TypeVar("T")
# (resourceKind, namespace, resourceName): the GM's queue key; raw frames get unique keys.
Key = tuple[str, str, str]


def go_frame(namespace: str, kind: str, name: str, operation: str, content: bytes | None) -> str:
    """A frame as gorilla's WriteJSON writes Sedna's Message (plain header values only)."""
    header = (
        f'{{"namespace":{json.dumps(namespace)},"resourceKind":{json.dumps(kind)},'
        f'"resourceName":{json.dumps(name)},"operation":{json.dumps(operation)}}}'
    )
    body = "null" if content is None else '"' + base64.b64encode(content).decode() + '"'
    return f'{{"header":{header},"content":{body}}}\n'


def resource_json(resource: dict[str, Any]) -> bytes:
    """The resource as Go's json.Marshal writes it: compact (keys in the given order)."""
    return json.dumps(resource, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Received:
    """One frame the stand-in read: the node it came from, its bytes, its type, when."""

    node: str
    data: bytes
    text: bool
    at: float

    def message(self) -> tuple[dict[str, Any], bytes | None]:
        """Header and content as Go's ReadJSON reads them (content base64-decoded)."""
        obj = json.loads(self.data)
        content = obj.get("content")
        return obj.get("header", {}), None if content is None else base64.b64decode(content)


class Started:
    """A context manager that starts its server on entry and closes it on exit."""

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


@dataclass
class _Node:
    connections: list[ServerConnection] = field(default_factory=list)
    queue: dict[Any, str | bytes] = field(default_factory=dict)
    turn: int = 0


class GmStandIn(Started):
    """A GM stand-in on 127.0.0.1; a context manager that starts and stops it."""

    def __init__(
        self,
        port: int | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        on_frame: Callable[[Received], None] | None = None,
    ):
        self.port = port or free_port()
        self._ssl = ssl_context
        self._on_frame = on_frame
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gm-standin")
        self._thread.start()
        self._server: Server | None = None
        self._nodes: dict[str, _Node] = {}
        self._changed = threading.Condition()
        self._received: list[Received] = []
        self._handshakes: list[Headers] = []
        self._refused = 0
        self._connects: dict[str, int] = {}
        self._dropped: dict[str, list[ConnectionClosed]] = {}
        self._raw_keys = 0
        self._flushing: asyncio.Future[None] | None = None  # a flood's writer, kept alive

    # -- life cycle -----------------------------------------------------------------------

    @property
    def address(self) -> str:
        """``host:port``, the form of Sedna's GM_ADDRESS."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self._call(self._start())

    def stop(self) -> None:
        """Go away as a killed GM does: no close frames, queued frames lost, port closed."""
        self._call(self._stop())

    def close(self) -> None:
        """Stop and end the stand-in's thread."""
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    # -- what it saw ----------------------------------------------------------------------

    def received(self, node: str | None = None) -> list[Received]:
        with self._changed:
            return [r for r in self._received if node is None or r.node == node]

    def statuses(self, node: str) -> list[tuple[dict[str, Any], bytes | None]]:
        """Decoded status frames from ``node``, in order."""
        messages = [r.message() for r in self.received(node)]
        return [(h, c) for h, c in messages if h.get("operation") == "status"]

    @property
    def handshakes(self) -> list[Headers]:
        """Request headers of every accepted websocket handshake, in order."""
        with self._changed:
            return list(self._handshakes)

    @property
    def refused(self) -> int:
        """Handshakes refused for want of a Node-Name header."""
        with self._changed:
            return self._refused

    def connections(self, node: str) -> int:
        """Open connections of ``node`` now."""
        with self._changed:
            return len(self._nodes.get(node, _Node()).connections)

    def connects(self, node: str) -> int:
        """Connections ``node`` opened since the stand-in was made."""
        with self._changed:
            return self._connects.get(node, 0)

    def dropped(self, node: str) -> list[ConnectionClosed]:
        """How ``node``'s connections that ended without a clean close ended."""
        with self._changed:
            return list(self._dropped.get(node, []))

    def wait(self, predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
        """Wait until ``predicate()`` (evaluated on every change) holds; False on timeout."""
        try:
            return wait_until(predicate, timeout_s, "the GM stand-in", condition=self._changed)
        except TimeoutError:
            return False

    # -- what it sends --------------------------------------------------------------------

    def insert(self, node: str, resource: dict[str, Any]) -> str:
        """Queue an ``insert`` of ``resource`` for ``node``, as the GM does; returns the frame."""
        return self._resource_frame(node, "insert", resource)

    def delete(self, node: str, resource: dict[str, Any]) -> str:
        """Queue a ``delete`` (the GM sends the whole deleted object as content)."""
        return self._resource_frame(node, "delete", resource)

    def send_content(self, node: str, operation: str, key: Key, content: bytes) -> str:
        """Queue a frame whose content is ``content`` as is, for the resource ``key`` (kind,
        namespace, name); latest wins per key, as for `insert`. Returns the frame."""
        kind, namespace, name = key
        frame = go_frame(namespace, kind, name, operation, content)
        self._call(self._enqueue(node, key, frame))
        return frame

    def send_raw(self, node: str, data: str | bytes) -> None:
        """Queue any frame as is: str as a text frame, bytes as a binary one."""
        self._raw_keys += 1
        self._call(self._enqueue(node, ("raw", self._raw_keys), data))

    def flood(self, node: str, frames: list[str]) -> None:
        """Queue many frames and return at once; they go out as fast as the node reads them
        (`queued` tells how many wait)."""
        self._call(self._flood(node, frames))

    def queued(self, node: str) -> int:
        """Frames queued for ``node`` and not yet written to a connection."""
        return self._call(self._queued(node))

    def send_text_bytes(self, node: str, data: bytes) -> None:
        """Queue a text frame with exactly these bytes (invalid UTF-8 included)."""
        self._call(self._send_text_bytes(node, data))

    def freeze(self, node: str) -> None:
        """Stop reading the node's connections: frames and pings pile up unanswered."""
        self._call(self._freeze(node))

    def close_connections(self, node: str) -> None:
        """Close the node's connections with a close frame (1001, going away)."""
        self._call(self._close_connections(node))

    # -- on the stand-in's loop -----------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def _resource_frame(self, node: str, operation: str, resource: dict[str, Any]) -> str:
        meta = resource["metadata"]
        kind = resource["kind"].lower()
        namespace = meta.get("namespace", "")
        frame = go_frame(namespace, kind, meta["name"], operation, resource_json(resource))
        self._call(self._enqueue(node, (kind, namespace, meta["name"]), frame))
        return frame

    async def _start(self) -> None:
        if self._server is None:
            self._server = await serve(
                self._serve,
                "127.0.0.1",
                self.port,
                process_request=self._check_node_name,
                compression=None,
                ping_interval=None,
                max_size=None,
                ssl=self._ssl,
            )

    async def _stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        for state in self._nodes.values():
            state.queue.clear()
            for connection in state.connections:
                connection.transport.abort()
        server.close(close_connections=False)
        await server.wait_closed()

    def _check_node_name(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.headers.get("Node-Name"):
            return None
        with self._changed:
            self._refused += 1
            self._changed.notify_all()
        return connection.respond(400, "missing Node-Name header\n")

    async def _serve(self, connection: ServerConnection) -> None:
        assert connection.request is not None
        node = connection.request.headers["Node-Name"]
        state = self._nodes.setdefault(node, _Node())
        with self._changed:
            self._handshakes.append(connection.request.headers)
            state.connections.append(connection)
            self._connects[node] = self._connects.get(node, 0) + 1
            self._changed.notify_all()
        try:
            await self._flush(node)
            async for message in connection:
                text = isinstance(message, str)
                data = message.encode() if isinstance(message, str) else bytes(message)
                received = Received(node, data, text, time.time())
                with self._changed:
                    self._received.append(received)
                    self._changed.notify_all()
                if self._on_frame is not None:
                    self._on_frame(received)
        except ConnectionClosed as e:
            # the node went away without a clean close: recorded for the tests, as a GM logs
            # it and then serves the node's next connection
            with self._changed:
                self._dropped.setdefault(node, []).append(e)
        finally:
            with self._changed:
                state.connections.remove(connection)
                self._changed.notify_all()

    async def _enqueue(self, node: str, key: Any, frame: str | bytes) -> None:
        state = self._nodes.setdefault(node, _Node())
        state.queue[key] = frame
        await self._flush(node)

    async def _flush(self, node: str) -> None:
        state = self._nodes[node]
        while state.queue and state.connections:
            key = next(iter(state.queue))
            frame = state.queue.pop(key)
            state.turn = (state.turn + 1) % len(state.connections)
            try:
                await state.connections[state.turn].send(frame)
            except ConnectionClosed:
                state.queue.setdefault(key, frame)
                await asyncio.sleep(0.05)  # the handler is removing the dead connection

    async def _flood(self, node: str, frames: list[str]) -> None:
        state = self._nodes.setdefault(node, _Node())
        for frame in frames:
            self._raw_keys += 1
            state.queue[("raw", self._raw_keys)] = frame
        self._flushing = asyncio.ensure_future(self._flush(node))

    async def _queued(self, node: str) -> int:
        return len(self._nodes.get(node, _Node()).queue)

    async def _send_text_bytes(self, node: str, data: bytes) -> None:
        for connection in self._nodes[node].connections:
            await connection.send(data, text=True)

    async def _freeze(self, node: str) -> None:
        for connection in self._nodes[node].connections:
            connection.transport.pause_reading()

    async def _close_connections(self, node: str) -> None:
        for connection in list(self._nodes[node].connections):
            await connection.close(1001)
