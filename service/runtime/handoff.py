"""The processor's in-process inbox: what other threads of this replica hand it directly,
instead of through a shard's ingress stream in Redis.

Two kinds of items come this way, both for shards this replica holds:

- an effect's result (`LocalResult`), from the effect runner: the commit that applies it
  retires its intent;
- a message the intake took in (`TakenMessage`), first delivered over MQTT: the commit that
  applies it sets its dedupe marker, and only then is it acknowledged to the broker.

Either saves a Redis round trip (the append, then the processor's read) and the event's
encoding for the stream. While the processor blocks in its Redis read (idle, nothing else
to wait for), a message offered ends that read early with CLIENT UNBLOCK from the offering
thread: the read comes back empty, so every stream was at its end when the message was
offered, and the message is applied at once (one offered after that wake-up waits for the
next read: the intake may have appended to its shard's stream in between). A result
offered while the processor blocks, a message while it blocks in a read that cannot be
ended that way (a Redis Cluster; an ACL refusing the command), and every offer while Redis
fails (it cannot commit) are refused: the item then takes the stream, whose append ends
that read (or is retried until Redis answers, the message held unacknowledged meanwhile).

A shard's messages are applied in the order they came, and the processor applies what its
read returns before what was handed over: so once a message of a shard is handed over, the
shard's later messages follow it the same way until it is settled (committed, or appended
to the stream by the processor), whatever the processor is doing. The intake asks which
shards those are (`owed`), and an offer of their messages is never refused. Otherwise a
report held in process across a Redis outage (its commit failed) was overtaken by the next
one, which the intake appended meanwhile: the worker's `completed` applied before its
`running`, and the `running` refused as a report of a stage that is over.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from service.adapters.mqtt import Inbound
from service.core.events import Event

if TYPE_CHECKING:  # the intake hands messages over through this module
    from service.runtime.intake import Accepted


@dataclass(frozen=True)
class LocalResult:
    """An intent's result handed to this replica's processor: applied in the commit that
    retires the intent, fenced by ``token``, the lease token the intent was pending under
    when it was submitted (the processor drops the result under any other token)."""

    shard: int
    token: str
    effect_id: str
    event: Event


@dataclass(frozen=True)
class TakenMessage:
    """A message the intake took in, handed to the processor instead of being appended.

    ``digest`` names it for deduplication (its marker is set by the commit that applies
    it, under ``ingress_token``, the ingress lease token it was taken in under); ``ack``
    sends its PUBACK on the connection it came on, once that commit is durable."""

    shard: int
    accepted: Accepted
    digest: str | None
    dup: bool
    ingress_token: str
    msg: Inbound
    ack: Callable[[Sequence[Inbound]], None]


class Handoff:
    """Thread-safe: offered by the intake and the effect runner, taken by the processor."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._results: list[LocalResult] = []
        self._messages: list[TakenMessage] = []
        self._blocking = False
        self._closed = False  # the processor's last pass failed on Redis
        #: while the processor blocks in its Redis read: what ends that read early (None:
        #: not known yet, or none), whether an offer has called it, how many messages had
        #: been offered when it was called, and whether it ended the read; `_read` numbers
        #: the blocking reads, so that a wake-up's answer coming back after its read ended
        #: counts for no later one
        self._wake: Callable[[], bool] | None = None
        self._waking = False
        self._vouched = 0
        self._woken = False
        self._read = 0
        #: per shard, how many messages handed over are not settled yet
        self._owed: dict[int, int] = {}

    def offer_result(self, result: LocalResult) -> bool:
        """Hand a result over; False when the processor blocks in Redis or cannot commit
        (then the result takes the stream, which ends the read)."""
        with self._lock:
            if self._blocking or self._closed:
                return False
            self._results.append(result)
            self._ready.notify_all()
            return True

    def offer_messages(self, messages: Sequence[TakenMessage]) -> bool:
        """Hand messages over, in order; False when the processor cannot commit, or blocks
        in a Redis read that cannot be ended early, unless a message of the same shard is
        still owed (`owed`): then they are taken all the same, to be applied behind it. The
        first offer into a read that can be ended ends it (on the offering thread: a round
        trip to Redis)."""
        with self._lock:
            behind = any(self._owed.get(m.shard) for m in messages)
            if not behind and (self._closed or (self._blocking and self._wake is None)):
                return False
            self._messages.extend(messages)
            for m in messages:
                self._owed[m.shard] = self._owed.get(m.shard, 0) + 1
            self._ready.notify_all()
            wake, read = None, self._read
            if self._blocking and not self._waking:
                wake, self._waking, self._vouched = self._wake, True, len(self._messages)
        if wake is not None:
            woken = wake()
            with self._lock:
                if self._blocking and self._read == read:
                    self._woken = woken
        return True

    def owed(self) -> frozenset[int]:
        """The shards with messages handed over and not settled: their next messages must
        be handed over too, or they could be applied first."""
        with self._lock:
            return frozenset(self._owed)

    def settled(self, messages: Sequence[TakenMessage]) -> None:
        """These messages handed over are done with: committed (their markers set) or in
        their shard's stream, each acknowledged once."""
        with self._lock:
            for m in messages:
                left = self._owed.get(m.shard, 0) - 1
                if left > 0:
                    self._owed[m.shard] = left
                else:
                    self._owed.pop(m.shard, None)

    def take(self, limit: int | None = None) -> tuple[list[LocalResult], list[TakenMessage]]:
        """Everything handed over since the last call, in order; with ``limit``, only the
        first that many messages (the rest stay for the next call)."""
        with self._lock:
            results, self._results = self._results, []
            cut = len(self._messages) if limit is None else limit
            messages, self._messages = self._messages[:cut], self._messages[cut:]
            return results, messages

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for anything to be handed over; whether it is there."""
        with self._ready:
            return self._ready.wait_for(lambda: bool(self._results or self._messages), timeout_s)

    def begin_blocking(self) -> bool:
        """The processor is about to block in its Redis read: from now on results are
        refused (they take the stream, which ends the read), and messages too until the
        read says how to end it (`blocked`). False, and nothing changes, if items wait."""
        with self._lock:
            if self._results or self._messages:
                return False
            self._blocking, self._read, self._woken = True, self._read + 1, False
            return True

    def blocked(self, wake: Callable[[], bool]) -> None:
        """The processor's read blocks in Redis now; ``wake`` ends it early (called once,
        by the first message offered), and says whether it did."""
        with self._lock:
            if self._blocking:
                self._wake = wake

    def end_blocking(self) -> int:
        """The processor's read returned: how many of the messages offered meanwhile may be
        applied without reading the streams again. When an offer's wake-up ended the read,
        the read saw every stream at its end after the messages offered until then: those.
        A message offered after the wake-up may follow an entry the intake appended after
        the read ended (a redelivery of its shard), so it waits for a read; as do all when
        the read ended otherwise (0)."""
        with self._lock:
            vouched = self._vouched if self._woken else 0
            self._blocking, self._wake, self._waking, self._woken = False, None, False, False
            self._vouched = 0
            return vouched

    def close(self) -> None:
        """The processor's pass failed on Redis: offers are refused until `open`."""
        with self._lock:
            self._closed = True

    def open(self) -> None:
        """The processor's pass went through: offers are taken again."""
        with self._lock:
            self._closed = False
