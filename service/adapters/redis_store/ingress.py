"""The ingress: per-shard Redis streams of accepted events, read by one consumer group, and
the timers that fire into them.

An event is appended once (deduplicated by the message that carried it) and stays pending
until the commit that applied it acknowledges it, so a new owner of a shard re-reads what
its previous owner took but never committed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from redis.exceptions import ResponseError

from service.adapters.redis_links import Routed
from service.adapters.redis_store.calls import (
    Call,
    Commands,
    as_str,
    checked,
    field_map,
    store_errors,
)
from service.adapters.redis_store.values import IngressEntry
from service.errors import LeaseLost
from service.keys import INGRESS_CONSUMER, INGRESS_GROUP, NUM_SHARDS

#: On a Cluster one blocking read cannot span shards (they live in different slots): an
#: idle read polls every owned shard, then blocks on one of them (in turn) this long.
CLUSTER_BLOCK_MS = 50


class Ingress:
    """Appends to, reads and fires timers into the shards' ingress streams."""

    def __init__(self, redis: Commands, *, cluster: bool, socket_timeout_s: float) -> None:
        self._redis = redis
        self._keys = redis.keys
        self._cluster = cluster
        self._socket_timeout_s = socket_timeout_s
        self._rotation = 0

    def ensure_groups(self) -> None:
        """Create every shard's ingress stream and consumer group (idempotent).

        The group starts at id 0 so entries appended before it existed are still delivered.
        """
        commands = [
            Routed(key, ("XGROUP", "CREATE", key, INGRESS_GROUP, "0", "MKSTREAM"))
            for key in map(self._keys.ingress, range(NUM_SHARDS))
        ]
        with store_errors("ensure_groups"):
            for result in self._redis.link.run(commands):
                if isinstance(result, ResponseError) and not str(result).startswith("BUSYGROUP"):
                    raise result

    def append_many(
        self,
        items: Sequence[tuple[int, bytes, str | None, bool]],
        *,
        dedupe_ttl_ms: int,
        token: str,
    ) -> list[str | None]:
        """Append (shard, event, dedupe, dup) items, in one round trip: per item its entry
        id, or None when it is one already taken in: a redelivery (``dup``), or a message
        another ingress holder (``token``) took in first (``dedupe``: the message's id, kept
        ``dedupe_ttl_ms``).

        Returns once the appends are durable: with replicas required, once they hold them
        (else ``StoreUnavailable``: some appends may have happened; retrying them as
        redeliveries, ``dup``, takes in exactly what did not)."""
        if not items:
            return []
        calls = [
            self._append_call(s, e, d, dup=dup, dedupe_ttl_ms=dedupe_ttl_ms, token=token)
            for s, e, d, dup in items
        ]
        results = self._redis.eval(calls, what="append", confirm=self._redis.confirm)
        return [None if r is None else as_str(r) for r in results]

    def _append_call(
        self,
        shard: int,
        event: bytes,
        dedupe: str | None,
        *,
        dup: bool,
        dedupe_ttl_ms: int,
        token: str,
    ) -> Call:
        keys: tuple[str, ...] = (self._keys.ingress(shard),)
        if dedupe is not None:
            keys += (self._keys.seen(shard, dedupe),)
        args = (event, "1" if dup else "0", dedupe_ttl_ms, token)
        return self._redis.call("append_ingress", keys, args)

    def read_ingress(
        self, shards: Sequence[int], *, count: int, block_ms: int, pending: bool
    ) -> list[IngressEntry]:
        """Read the owned shards' ingress in one round trip.

        ``pending=True`` re-reads entries delivered but never acknowledged (the previous
        owner's, since all owners share one consumer name) and never blocks; ``pending=False``
        reads new entries, blocking up to ``block_ms`` (0: do not block).

        One server: one XREADGROUP over every stream. A Cluster refuses a command whose keys
        span slots, so there each shard is read alone (all in one round trip, pipelined per
        node); with nothing new, the read then blocks on one shard (each in turn) for at most
        ``CLUSTER_BLOCK_MS``.
        """
        if not shards:
            return []
        if not pending and block_ms / 1000 >= self._socket_timeout_s:
            raise ValueError(f"block_ms {block_ms} must stay below the socket timeout")
        start = "0" if pending else ">"
        block = 0 if pending else max(0, block_ms)
        if not self._cluster:
            return self._read_streams([list(shards)], count, block, start)
        entries = self._read_streams([[s] for s in shards], count, 0, start)
        if entries or pending or block == 0:
            return entries
        self._rotation = (self._rotation + 1) % len(shards)
        return self._read_streams(
            [[shards[self._rotation]]], count, min(block, CLUSTER_BLOCK_MS), start
        )

    def _read_streams(
        self, groups: list[list[int]], count: int, block_ms: int, start: str
    ) -> list[IngressEntry]:
        """One XREADGROUP per group of shards, in one round trip; the groups recreated once
        if they vanished (a Redis that restarted empty)."""
        commands = []
        for group in groups:
            streams = [self._keys.ingress(s) for s in group]
            blocking = ("BLOCK", block_ms) if block_ms > 0 else ()
            args = ("XREADGROUP", "GROUP", INGRESS_GROUP, INGRESS_CONSUMER, "COUNT", count)
            commands.append(
                Routed(streams[0], (*args, *blocking, "STREAMS", *streams, *[start] * len(group)))
            )
        with store_errors("read_ingress"):
            replies = self._redis.link.run(commands)
            if any(isinstance(r, ResponseError) and str(r).startswith("NOGROUP") for r in replies):
                self.ensure_groups()
                replies = self._redis.link.run(commands)
            replies = [checked(r) for r in replies]
        shard_by_key = {self._keys.ingress(s): s for group in groups for s in group}
        return [
            _ingress_entry(shard_by_key[as_str(name)], entry_id, fields)
            for reply in replies
            for name, entries in reply or []
            for entry_id, fields in entries
        ]

    def fire_due_timers(
        self, tokens: Mapping[int, str], now_ms: int, limit: int
    ) -> dict[int, int | None]:
        """Move timers due by ``now_ms`` into their shard's ingress, for every shard of
        ``tokens`` (shard -> lease token) in one round trip. Per shard: how many fired, or
        None when the lease is not held by that token (fenced: nothing moved)."""
        k = self._keys
        shards = sorted(tokens)
        calls = [
            self._redis.call(
                "fire_timers",
                (k.lease(shard), k.timers(shard), k.ingress(shard)),
                (tokens[shard], now_ms, limit),
            )
            for shard in shards
        ]
        results = self._redis.eval_raw(calls, what="fire_due_timers")
        fired: dict[int, int | None] = {}
        with store_errors("fire_due_timers"):
            for shard, result in zip(shards, results, strict=True):
                try:
                    fired[shard] = int(checked(result))
                except LeaseLost:
                    fired[shard] = None
        return fired

    def next_timer_ms(self, shard: int) -> int | None:
        """When the shard's earliest timer is due, or None without timers."""
        key = self._keys.timers(shard)
        [first] = self._redis.run(
            [Routed(key, ("ZRANGE", key, 0, 0, "WITHSCORES"))], what="next_timer_ms"
        )
        return int(float(first[1])) if first else None


def _ingress_entry(shard: int, entry_id: bytes | str, pairs: list[bytes] | None) -> IngressEntry:
    """Decode one stream entry (its field/value list as Redis sent it; None for an entry
    deleted while pending); one without known fields yields neither event nor timer."""
    fields = field_map(pairs)
    due = fields.get(b"due")
    timer = fields.get(b"t")
    return IngressEntry(
        shard=shard,
        entry_id=as_str(entry_id),
        event=fields.get(b"e"),
        timer_rkey=None if timer is None else as_str(timer),
        timer_due_ms=None if due is None else int(float(due)),
    )
