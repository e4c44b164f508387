"""What an MQTT client knows of its current connection, kept for every thread to read.

paho's network thread reports each step of a connection (`ConnectionStatus.opened`, the
CONNACK's answer, SUBACKs, the end); callers on other threads read `connected`,
`subscribed` and `refusal`, and block in `wait_connected`. ``subscribed`` turns true once
the broker acknowledged (SUBACK) every subscription of the current connection: only then is
a message published by someone else sure to reach us on a first connect, when the broker
holds no session for our client id yet. ``seq`` numbers the accepted connections, and each
`Inbound` message carries the number of the one it came on: an ack is only meaningful on
that connection, since packet ids are reused across connections.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from service.adapters.mqtt.policy import ConnectRefusal
from service.adapters.mqtt.tickets import run_callback


@dataclass(frozen=True)
class Inbound:
    """One received PUBLISH, as handed to the runtime.

    ``connection_seq`` names the connection it arrived on: an ack is only meaningful on that
    connection, because packet ids are reused across connections.
    """

    topic: str
    payload: bytes
    qos: int
    dup: bool
    mid: int
    received_at: float
    connection_seq: int = 0


class ConnectionStatus:
    """The current connection's state; written on paho's thread, read anywhere.

    ``on_change`` hears every change of `connected` (on paho's thread, or on the thread
    that calls `down`); an exception from it is logged and swallowed.
    """

    def __init__(self, on_change: Callable[[bool], None] | None = None) -> None:
        self._on_change = on_change
        self._connected = threading.Event()
        # Notified whenever a CONNACK arrives, so `wait_connected` can stop on a refusal.
        self._connack = threading.Condition()
        self._refusal: ConnectRefusal | None = None
        self._subscribed = threading.Event()
        self._pending_subacks: set[int] = set()  # touched on paho's thread only
        self._seq = 0
        # The TCP connection in progress (paho's thread only): whether a CONNACK came on
        # it, and when a successful one did.
        self._answered = False
        self._connected_at: float | None = None

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def subscribed(self) -> bool:
        """Connected, and every subscription of this connection acknowledged (SUBACK)."""
        return self._subscribed.is_set()

    @property
    def refusal(self) -> ConnectRefusal | None:
        """Why the broker refused our last CONNECT; None once a connect succeeded."""
        return self._refusal

    @property
    def seq(self) -> int:
        """The number of the latest accepted connection (0 before the first)."""
        return self._seq

    @property
    def answered(self) -> bool:
        """Whether a CONNACK came on the TCP connection in progress."""
        return self._answered

    def wait_connected(self, timeout_s: float, *, stop_on_refusal: bool = False) -> bool:
        """True once connected, False after ``timeout_s`` (or at a refusal, if asked)."""
        if not stop_on_refusal:
            return self._connected.wait(timeout_s)
        with self._connack:
            self._connack.wait_for(
                lambda: self._connected.is_set() or self._refusal is not None, timeout_s
            )
        return self._connected.is_set()

    def wait_subscribed(self, timeout_s: float) -> bool:
        """True once connected with every subscription acknowledged, False after
        ``timeout_s``."""
        return self._subscribed.wait(timeout_s)

    def opened(self) -> None:
        """A new TCP connection: no CONNACK on it yet."""
        self._answered = False
        self._connected_at = None

    def connack(self) -> None:
        """A CONNACK came, whatever it says (call before acting on it)."""
        self._answered = True

    def refused(self, refusal: ConnectRefusal | None) -> None:
        """The CONNACK refused us: ``refusal`` to report, or None when we retry otherwise."""
        if refusal is not None:
            self._refusal = refusal
        self._notify_connack()

    def accepted(self) -> None:
        """The CONNACK accepted us: a new connection, whose subscriptions follow."""
        self._refusal = None
        self._connected_at = time.monotonic()
        self._seq += 1
        self._pending_subacks.clear()

    def awaiting_suback(self, mid: int) -> None:
        """A SUBSCRIBE (packet id ``mid``) went out on this connection."""
        self._pending_subacks.add(mid)

    def up(self) -> None:
        """The connection is ready for use: every SUBSCRIBE of it went out."""
        if not self._pending_subacks:
            self._subscribed.set()
        self._connected.set()
        self._notify_connack()
        self._notify(True)

    def suback(self, mid: int, *, granted: bool) -> bool:
        """The SUBACK of ``mid``; False if it is one of an earlier connection. A refused
        subscription stays pending: nothing will arrive on that filter, so this connection
        never counts as subscribed."""
        if mid not in self._pending_subacks:
            return False
        if granted:
            self._pending_subacks.discard(mid)
            if not self._pending_subacks:
                self._subscribed.set()
        return True

    def closed(self) -> float | None:
        """The TCP connection ended: when it was accepted (monotonic), or None if never."""
        connected_at, self._connected_at = self._connected_at, None
        return connected_at

    def down(self) -> None:
        """Not connected (after `closed`, or once the client stopped)."""
        self._subscribed.clear()
        if self._connected.is_set():
            self._connected.clear()
            self._notify(False)

    def _notify_connack(self) -> None:
        with self._connack:
            self._connack.notify_all()

    def _notify(self, connected: bool) -> None:
        callback = self._on_change
        if callback is not None:
            run_callback(lambda: callback(connected))
