"""What a commit leaves to be done: upstream messages for the broker (the outbox) and for
the GM link (the GM outbox), and effect intents, each kept per shard until done.

Reads whose content is about to be acted on end with the barrier: with replicas required,
nothing a failover could take back goes out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from service.adapters.redis_links import Routed
from service.adapters.redis_store.calls import Commands, as_str, field_map
from service.adapters.redis_store.values import OutboxEntry, Unreadable


class Outboxes:
    """The outbox, the GM outbox and the effect intents of every shard."""

    def __init__(self, redis: Commands, *, cluster: bool, socket_timeout_s: float) -> None:
        self._redis = redis
        self._keys = redis.keys
        self._cluster = cluster
        self._socket_timeout_s = socket_timeout_s

    def outbox_read(
        self,
        shards: Sequence[int],
        count: int,
        skip: Mapping[int, tuple[str, str]] | None = None,
    ) -> dict[int, list[tuple[str, OutboxEntry | Unreadable]]]:
        """Per shard, unpublished upstream messages, oldest first, with their stream ids; all
        shards in one round trip. With replicas required, only once they hold all of it.
        An entry that is not an upstream message comes as `Unreadable`, in its place.

        ``skip``: per shard, the first and last stream id of a span not to read (the entries
        a publisher holds in flight): up to ``count`` entries before it and after it are."""
        spans = skip or {}
        ranges = [(shard, bounds) for shard in shards for bounds in _around(spans.get(shard))]
        if not ranges:
            return {}
        keys = [self._keys.outbox(shard) for shard, _ in ranges]
        replies = self._redis.run(
            [
                Routed(k, ("XRANGE", k, first, last, "COUNT", count))
                for k, (_, (first, last)) in zip(keys, ranges, strict=True)
            ],
            what="outbox_read",
            confirm=self._redis.barrier,
        )
        read: dict[int, list[tuple[str, OutboxEntry | Unreadable]]] = {s: [] for s in shards}
        for (shard, _), entries in zip(ranges, replies, strict=True):
            read[shard] += [
                (as_str(entry_id), _outbox_entry(field_map(pairs))) for entry_id, pairs in entries
            ]
        return read

    def outbox_done(self, done: Mapping[int, Sequence[str]]) -> None:
        """Forget published messages (after the broker's PUBACK), every shard's in one round
        trip."""
        commands = [
            Routed(key, ("XDEL", key, *stream_ids))
            for key, stream_ids in ((self._keys.outbox(s), ids) for s, ids in done.items() if ids)
        ]
        if commands:
            self._redis.run(commands, what="outbox_done")

    def gm_outbox_read(
        self, shards: Sequence[int], count: int
    ) -> dict[int, list[tuple[str, bytes | Unreadable]]]:
        """Per shard, upstream messages not yet sent to the GM, oldest first, as (stream id,
        envelope JSON); all shards in one round trip. With replicas required, only once they
        hold all of it. An entry without a payload comes as `Unreadable`, in its place."""
        read = self._read(self._keys.gm_outbox, shards, count, "gm_outbox_read")
        return {
            shard: [(stream_id, _gm_payload(f)) for stream_id, f in entries]
            for shard, entries in read.items()
        }

    def gm_outbox_done(self, shard: int, stream_ids: Sequence[str]) -> None:
        """Forget messages the GM link sent."""
        self._delete(self._keys.gm_outbox(shard), stream_ids, "gm_outbox_done")

    def gm_outbox_wait(self, shards: Sequence[int], block_ms: int) -> bool:
        """Return once a GM outbox of ``shards`` holds a message, or after ``block_ms`` (kept
        under half the socket timeout): a commit on any replica ends the wait at once.
        False, at once, where no such wait exists: the caller waits its own way.

        Sent messages are deleted, so any entry is one to send: a blocking XREAD from id 0
        on every stream returns at once when one is waiting and otherwise when the first is
        added. A Redis Cluster refuses one read across the shards' slots."""
        block_ms = min(block_ms, int(self._socket_timeout_s * 500))
        if self._cluster or not shards or block_ms <= 0:
            return False
        keys = [self._keys.gm_outbox(shard) for shard in shards]
        command: tuple[str | int, ...] = (
            "XREAD", "COUNT", 1, "BLOCK", block_ms, "STREAMS", *keys, *["0"] * len(keys)
        )  # fmt: skip
        self._redis.run([Routed(keys[0], command)], what="gm_outbox_wait")
        return True

    def _read(
        self, key_of: Callable[[int], str], shards: Sequence[int], count: int, what: str
    ) -> dict[int, list[tuple[str, dict[bytes, bytes]]]]:
        """The oldest ``count`` entries of each shard's stream, behind the barrier."""
        if not shards:
            return {}
        keys = [key_of(shard) for shard in shards]
        replies = self._redis.run(
            [Routed(k, ("XRANGE", k, "-", "+", "COUNT", count)) for k in keys],
            what=what,
            confirm=self._redis.barrier,
        )
        return {
            shard: [(as_str(entry_id), field_map(pairs)) for entry_id, pairs in entries]
            for shard, entries in zip(shards, replies, strict=True)
        }

    def _delete(self, key: str, stream_ids: Sequence[str], what: str) -> None:
        if stream_ids:
            self._redis.run([Routed(key, ("XDEL", key, *stream_ids))], what=what)

    def pending_effects(self, shards: Sequence[int]) -> dict[int, dict[str, bytes]]:
        """Per shard, the effect intents committed but not yet completed (a new owner redoes
        them), in one round trip. With replicas required, only once they hold all of it."""
        if not shards:
            return {}
        keys = [self._keys.effects(shard) for shard in shards]
        replies = self._redis.run(
            [Routed(k, ("HGETALL", k)) for k in keys],
            what="pending_effects",
            confirm=self._redis.barrier,
        )
        return {
            shard: {as_str(effect_id): intent for effect_id, intent in field_map(flat).items()}
            for shard, flat in zip(shards, replies, strict=True)
        }

    def complete_effect(
        self, shard: int, token: str, effect_id: str, result_event: bytes | None
    ) -> bool:
        """Retire an intent and append its result event, once; False if already retired."""
        k = self._keys
        call = self._redis.call(
            "complete_effect",
            (k.lease(shard), k.effects(shard), k.ingress(shard)),
            (token, effect_id, "0" if result_event is None else "1", result_event or b""),
        )
        return bool(
            self._redis.eval([call], what="complete_effect", confirm=self._redis.confirm)[0]
        )


def _around(span: tuple[str, str] | None) -> list[tuple[str, str]]:
    """The XRANGE bounds of a whole stream but ``span`` (its first and last id left out too)."""
    if span is None:
        return [("-", "+")]
    first, last = span
    return [("-", f"({first}"), (f"({last}", "+")]


def _outbox_entry(fields: dict[bytes, bytes]) -> OutboxEntry | Unreadable:
    try:
        entry = OutboxEntry(as_str(fields[b"id"]), as_str(fields[b"topic"]), fields[b"payload"])
    except KeyError as e:
        return Unreadable(f"no {as_str(e.args[0])!r} field", _flat(fields))
    except UnicodeDecodeError:
        return Unreadable("its id or topic is not UTF-8", _flat(fields))
    if not entry.topic or any(c in entry.topic for c in "+#\0"):
        return Unreadable("its topic is not one a message can be published to", _flat(fields))
    return entry


def _gm_payload(fields: dict[bytes, bytes]) -> bytes | Unreadable:
    payload = fields.get(b"payload")
    return payload if payload is not None else Unreadable("no 'payload' field", _flat(fields))


def _flat(fields: dict[bytes, bytes]) -> bytes:
    """A stream entry's fields as ``name=value`` pairs, one per line, for the dead letter."""
    return b"\n".join(name + b"=" + value for name, value in fields.items())
