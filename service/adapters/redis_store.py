"""The Redis store: the only place state lives, one concern object per kind of record.

Durable, atomic, fenced primitives over redis-py, on one server, behind Sentinel or on a
Cluster (``service.urls.parse_redis_url`` reads which from the URL; ``redis_link`` carries
the commands). State and effects are opaque ``bytes``; the runtime decides what they mean.
Every write that depends on owning a shard runs as a Lua script (``redis_scripts/*.lua``)
that first compares the shard's lease with the caller's token, so a replica whose lease
expired or was taken can never write again (fencing). Every script touches one hash slot: a
shard's keys share the tag ``{s<N>}``, the ingress lease and its fence ``{ingress}``.

The hot path per batch is exactly three round trips: ``Ingress.read``,
``States.load`` and ``States.commit`` (on a Cluster an idle read takes a second one, to
block on one shard).

Replication is asynchronous, so a failover may lose the last writes the old master took.
With ``min_replicas`` > 0 every write the controller acts on (an event taken in before the
broker or an HTTP client is answered, a commit before its upstream messages and effects, a
lease before its fencing token is used, an effect's outcome) is followed, in the same
exchange, by ``WAIT min_replicas``; too few confirmations within the bound raise
``StoreUnavailable``, and the caller treats the write as not done. Reads whose content is
about to be acted on (unsent outbox and GM outbox entries, pending effect intents, the state
an HTTP report is judged against) end with a barrier write and the same WAIT, so nothing a
failover could take back goes out.

Library errors never leave this module: connection-level failures, a topology in motion
and unconfirmed writes become ``StoreUnavailable``, a fenced script ``LeaseLost``, anything
else ``PermanentError``.

`RedisStore` opens the link and holds one object per concern; each runtime collaborator
takes the concern it uses (a test fake subclasses it):

- `Ingress` (``store.ingress``): the per-shard ingress streams and the timers firing into them.
- `States` (``store.states``): resource state, the fenced commit, quarantine marks.
- `Outboxes` (``store.outboxes``): the outbox, the GM outbox and effect intents.
- `Leases` (``store.leases``): leases with fencing tokens, the replica registry, the GM
  link's state.
- `Records` (``store.records``): the dead-letter stream, outputDir claims, which jobs use
  each dataset.

The values they take and give (`Commit`, `Quarantine`, `IngressEntry`, `OutboxEntry`,
`Unreadable`) are plain frozen dataclasses, defined first.
"""

import contextlib
import logging
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from redis.exceptions import ResponseError

from service.adapters.redis_link import (
    Call,
    Commands,
    NotReplicated,
    Routed,
    SingleLink,
    as_str,
    checked,
    field_map,
    load_scripts,
    open_link,
    store_errors,
)
from service.core.paths import ancestors, canonical_dir
from service.errors import LeaseLost, PermanentError, StoreUnavailable
from service.keys import INGRESS_CONSUMER, INGRESS_GROUP, NUM_SHARDS, Keys, shard_of
from service.urls import parse_redis_url

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OutboxEntry:
    """One upstream message, written with the state that caused it; ``id`` is stable.

    ``gm``: the GM link is a second sink of the entry: the commit also appends it to the
    shard's GM outbox, from which it is read back as a `GmMessage`."""

    id: str
    topic: str
    payload: bytes
    gm: bool = False


@dataclass(frozen=True)
class GmMessage:
    """An upstream message as the GM link sends it: its envelope's header values and its
    content JSON."""

    header: Mapping[str, str]
    content: bytes


@dataclass(frozen=True)
class Unreadable:
    """A queue entry that cannot be read as what its queue holds (written by something other
    than this service): why, and its bytes as found, for the dead-letter stream."""

    reason: str
    raw: bytes


@dataclass(frozen=True)
class IngressEntry:
    """One ingress stream entry: an encoded event, or a fired timer for ``timer_rkey``."""

    shard: int
    entry_id: str
    event: bytes | None
    timer_rkey: str | None
    timer_due_ms: int | None


@dataclass(frozen=True)
class Commit:
    """Everything one transition of one resource writes, applied all-or-nothing.

    ``delete`` removes state, resource, timer, histories and index membership (``state`` must
    then be None); ``keep_state`` leaves the state untouched (a rejected or ignored event);
    otherwise ``state`` is the new state. ``timer_due_ms``: None unchanged, -1 cancel.
    """

    rkey: str
    state: bytes | None
    delete: bool = False
    keep_state: bool = False
    resource: bytes | None = None
    timer_due_ms: int | None = None
    ack_ids: tuple[str, ...] = ()
    outbox: tuple[OutboxEntry, ...] = ()
    effects: tuple[tuple[str, bytes], ...] = ()
    history: tuple[bytes, ...] = ()
    #: records of the job's rounds that ended, for its capped round history
    rounds: tuple[bytes, ...] = ()
    clear_mark: bool = False  # the resource's quarantine ended
    #: effect intents retired by this commit: those whose results (handed over in process)
    #: it applies, so the result applies exactly once, with the intent's retirement
    retire: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.delete and (self.state is not None or self.keep_state):
            raise ValueError(f"{self.rkey}: delete takes neither state nor keep_state")
        if not self.delete and not self.keep_state and self.state is None:
            raise ValueError(f"{self.rkey}: state is None without delete or keep_state")


@dataclass(frozen=True)
class Markers:
    """The dedupe markers a shard's commit sets for the messages it takes in directly (handed
    over by the intake, never appended to the ingress stream): (digest, redelivered) each,
    set under ``token``, the ingress lease token they were taken in under."""

    token: str
    items: tuple[tuple[str, bool], ...]


@dataclass(frozen=True)
class Known:
    """A shard's commit refused, nothing written: the messages of these markers (indexes
    into its `Markers.items`) were taken in already."""

    markers: tuple[int, ...]


@dataclass(frozen=True)
class Quarantine:
    """Entries taken out of the ingress (their records dead-lettered by the caller) and,
    unless ``rkey`` is None (entries of no known resource), the resource's quarantine mark
    set (``mark``) and a retry timer (``retry_at_ms``) set; applied all-or-nothing."""

    rkey: str | None
    ack_ids: tuple[str, ...]
    mark: bytes | None = None
    retry_at_ms: int | None = None


#: How long a message's dedupe marker lives: one lifetime for the markers an append sets and
#: those a commit of messages handed over in process sets, since either checks the other's.
DEDUPE_TTL_MS = 60_000

#: On a Cluster one blocking read cannot span shards (they live in different slots): an
#: idle read polls every owned shard, then blocks on one of them (in turn) this long.
CLUSTER_BLOCK_MS = 50


class _StreamReads:
    """What the readers of the shards' streams share: the commands, and what bounds a
    blocking read (on a Cluster one read cannot span shards; a block must end within the
    socket timeout)."""

    def __init__(self, redis: Commands, *, cluster: bool, socket_timeout_s: float) -> None:
        self._redis = redis
        self.keys = redis.keys
        self._cluster = cluster
        self._socket_timeout_s = socket_timeout_s


class Ingress(_StreamReads):
    """Appends to, reads and fires timers into the shards' ingress streams."""

    def __init__(self, redis: Commands, *, cluster: bool, socket_timeout_s: float) -> None:
        super().__init__(redis, cluster=cluster, socket_timeout_s=socket_timeout_s)
        self._rotation = 0
        #: whether a blocking read can be ended early: one server, allowing CLIENT UNBLOCK
        self._unblocking = isinstance(redis.link, SingleLink)

    def ensure_groups(self) -> None:
        """Create every shard's ingress stream and consumer group (idempotent).

        The group starts at id 0 so entries appended before it existed are still delivered.
        """
        commands = [
            Routed(key, ("XGROUP", "CREATE", key, INGRESS_GROUP, "0", "MKSTREAM"))
            for key in map(self.keys.ingress, range(NUM_SHARDS))
        ]
        with store_errors("ensure_groups"):
            for result in self._redis.link.run(commands):
                if isinstance(result, ResponseError) and not str(result).startswith("BUSYGROUP"):
                    raise result

    def append_many(
        self,
        items: Sequence[tuple[int, bytes, str | None, bool]],
        *,
        dedupe_ttl_ms: int = DEDUPE_TTL_MS,
        token: str = "",
    ) -> list[str | None]:
        """Append (shard, event, dedupe, dup) items, in one round trip (one script run per
        shard, appending its items in order): per item its entry
        id, or None when it is one already taken in: a redelivery (``dup``), or a message
        another ingress holder (``token``) took in first (``dedupe``: the message's id, kept
        ``dedupe_ttl_ms``).

        Returns once the appends are durable: with replicas required, once they hold them
        (else ``StoreUnavailable``: some appends may have happened; retrying them as
        redeliveries, ``dup``, takes in exactly what did not)."""
        if not items:
            return []
        by_shard: dict[int, list[int]] = {}
        for n, (shard, *_) in enumerate(items):
            by_shard.setdefault(shard, []).append(n)
        calls = [
            self._append_call(shard, [items[n] for n in ns], dedupe_ttl_ms, token)
            for shard, ns in by_shard.items()
        ]
        results = self._redis.eval(calls, what="append", confirm=self._redis.confirm)
        ids: list[str | None] = [None] * len(items)
        for ns, replies in zip(by_shard.values(), results, strict=True):
            for n, reply in zip(ns, replies, strict=True):
                ids[n] = None if reply is None else as_str(reply)
        return ids

    def append(
        self,
        shard: int,
        event: bytes,
        *,
        dedupe: str | None = None,
        dup: bool = False,
        dedupe_ttl_ms: int = DEDUPE_TTL_MS,
        token: str = "",
    ) -> str | None:
        """Append one event, as `append_many` does: its entry id, or None when taken in already."""
        items = [(shard, event, dedupe, dup)]
        return self.append_many(items, dedupe_ttl_ms=dedupe_ttl_ms, token=token)[0]

    def _append_call(
        self,
        shard: int,
        items: Sequence[tuple[int, bytes, str | None, bool]],
        dedupe_ttl_ms: int,
        token: str,
    ) -> Call:
        """One script run appending a shard's items, in order."""
        keys = [self.keys.ingress(shard)]
        args: list[bytes | str | int] = [token, dedupe_ttl_ms]
        for _, event, dedupe, dup in items:
            marker = 0
            if dedupe is not None:
                keys.append(self.keys.seen(shard, dedupe))
                marker = len(keys)
            args += [event, "1" if dup else "0", marker]
        return self._redis.call("append_ingress", tuple(keys), tuple(args))

    def read(
        self,
        shards: Sequence[int],
        *,
        count: int,
        block_ms: int,
        pending: bool,
        on_blocked: Callable[[Callable[[], bool]], None] | None = None,
    ) -> list[IngressEntry]:
        """Read the owned shards' ingress in one round trip.

        ``pending=True`` re-reads entries delivered but never acknowledged (the previous
        owner's, since all owners share one consumer name) and never blocks; ``pending=False``
        reads new entries, blocking up to ``block_ms`` (0: do not block).

        One server: one XREADGROUP over every stream. Once it blocks there, ``on_blocked``
        (if given) is handed a wake-up: called from another thread, it ends the read at
        once, with no entries, and says whether it did (False: the read had ended, or the
        server refuses CLIENT UNBLOCK; then no later read offers one). An empty read ended
        by it saw every stream at its end when woken. A Cluster refuses a command whose keys
        span slots, so there each shard is read alone (all in one round trip, pipelined per
        node); with nothing new, the read then blocks on one shard (each in turn) for at most
        ``CLUSTER_BLOCK_MS``, and offers no wake-up.
        """
        if not shards:
            return []
        if not pending and block_ms / 1000 >= self._socket_timeout_s:
            raise ValueError(f"block_ms {block_ms} must stay below the socket timeout")
        start = "0" if pending else ">"
        block = 0 if pending else max(0, block_ms)
        if not self._cluster:
            if block and on_blocked is not None and self._unblocking:
                return self._read_blocking(list(shards), count, block, on_blocked)
            return self._read_streams([list(shards)], count, block, start)
        entries = self._read_streams([[s] for s in shards], count, 0, start)
        if entries or pending or block == 0:
            return entries
        self._rotation = (self._rotation + 1) % len(shards)
        return self._read_streams(
            [[shards[self._rotation]]], count, min(block, CLUSTER_BLOCK_MS), start
        )

    def _read_blocking(
        self,
        shards: list[int],
        count: int,
        block_ms: int,
        on_blocked: Callable[[Callable[[], bool]], None],
    ) -> list[IngressEntry]:
        """`read` of new entries that blocks on one server and hands ``on_blocked`` its
        wake-up."""
        link = self._redis.link
        assert isinstance(link, SingleLink)  # `_unblocking` says so
        command = self._group_read(shards, count, block_ms, ">")

        def blocked(client_id: int | ResponseError) -> None:
            if isinstance(client_id, int):
                on_blocked(lambda: self._unblock(client_id))
            else:
                self._refused(client_id)

        with store_errors("ingress.read"):
            reply = link.run_blocking(command, blocked)
            if isinstance(reply, ResponseError) and str(reply).startswith("NOGROUP"):
                self.ensure_groups()
                reply = link.run_blocking(command, blocked)
            reply = checked(reply)
        return self._entries({self.keys.ingress(s): s for s in shards}, [reply])

    def _unblock(self, client_id: int) -> bool:
        """End the blocking read of connection ``client_id``; whether one was ended. Redis
        out of reach ends nothing (the read fails or waits out its BLOCK, and its caller
        finds the message then); a server refusing CLIENT UNBLOCK (an ACL): `_refused`."""
        try:
            (ended,) = self._redis.run(
                [Routed(None, ("CLIENT", "UNBLOCK", client_id))], what="ingress.unblock"
            )
        except StoreUnavailable:
            return False
        except PermanentError as e:
            self._refused(e)
            return False
        return bool(ended == 1)

    def _refused(self, why: Exception) -> None:
        """The server refuses CLIENT ID or CLIENT UNBLOCK: said once, and no later read
        offers a wake-up."""
        if self._unblocking:
            log.warning("an idle processor is not woken early (%s): messages handed over "
                        "while it waits in Redis take the ingress stream", why)  # fmt: skip
        self._unblocking = False

    def _read_streams(
        self, groups: list[list[int]], count: int, block_ms: int, start: str
    ) -> list[IngressEntry]:
        """One XREADGROUP per group of shards, in one round trip; the groups recreated once
        if they vanished (a Redis that restarted empty)."""
        commands = [self._group_read(group, count, block_ms, start) for group in groups]
        with store_errors("ingress.read"):
            replies = self._redis.link.run(commands)
            if any(isinstance(r, ResponseError) and str(r).startswith("NOGROUP") for r in replies):
                self.ensure_groups()
                replies = self._redis.link.run(commands)
            replies = [checked(r) for r in replies]
        return self._entries({self.keys.ingress(s): s for group in groups for s in group}, replies)

    def _group_read(self, shards: list[int], count: int, block_ms: int, start: str) -> Routed:
        """The XREADGROUP of the shards' streams from ``start`` (blocking if ``block_ms``)."""
        streams = [self.keys.ingress(s) for s in shards]
        blocking = ("BLOCK", block_ms) if block_ms > 0 else ()
        args = ("XREADGROUP", "GROUP", INGRESS_GROUP, INGRESS_CONSUMER, "COUNT", count)
        return Routed(streams[0], (*args, *blocking, "STREAMS", *streams, *[start] * len(shards)))

    @staticmethod
    def _entries(shard_by_key: Mapping[str, int], replies: list[Any]) -> list[IngressEntry]:
        """The entries of XREADGROUP replies, with the shard of each one's stream."""
        return [
            _ingress_entry(shard_by_key[as_str(name)], entry_id, fields)
            for reply in replies
            for name, entries in reply or []
            for entry_id, fields in entries
        ]

    def fire_due_timers(
        self, tokens: Mapping[int, str], now_ms: int, limit: int = 500
    ) -> dict[int, int | None]:
        """Move timers due by ``now_ms`` into their shard's ingress, for every shard of
        ``tokens`` (shard -> lease token) in one round trip. Per shard: how many fired, or
        None when the lease is not held by that token (fenced: nothing moved)."""
        k = self.keys
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
        key = self.keys.timers(shard)
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


HISTORY_MAXLEN = 100
ROUNDS_MAXLEN = 50


class States:
    """Reads resources' state and commits transitions, fenced by the shard's lease."""

    def __init__(self, redis: Commands) -> None:
        self._redis = redis
        self.keys = redis.keys

    def load(self, rkeys: Sequence[str], *, barrier: bool = False) -> dict[str, bytes | None]:
        """The opaque state of each resource (None: none), in one round trip; with
        ``barrier``, only once the replicas hold it (a state about to be acted on)."""
        if not rkeys:
            return {}
        keys = [self.keys.state(rkey) for rkey in rkeys]
        values = self._redis.run(
            [Routed(k, ("GET", k)) for k in keys],
            what="load",
            confirm=self._redis.barrier if barrier else None,
        )
        return dict(zip(rkeys, values, strict=True))

    def load_resource(self, rkey: str) -> bytes | None:
        """The resource's canonical JSON as stored by its last insert (kept compressed)."""
        key = self.keys.resource(rkey)
        [stored] = self._redis.run([Routed(key, ("GET", key))], what="load_resource")
        return None if stored is None else zlib.decompress(stored)

    def list_rkeys(
        self, kind: str | None = None, shards: Sequence[int] = range(NUM_SHARDS)
    ) -> list[str]:
        """Every resource with state (of these shards), sorted; ``kind`` (a resource key's
        kind: ``job``, ``dataset``, ``model``...) filters."""
        keys = [self.keys.index(shard) for shard in shards]
        members = self._redis.run([Routed(k, ("SMEMBERS", k)) for k in keys], what="list_rkeys")
        prefix = f"{kind}:" if kind else ""
        return sorted(
            rkey
            for shard_members in members
            for rkey in map(as_str, shard_members)
            if rkey.startswith(prefix)
        )

    def history(self, rkey: str, count: int = HISTORY_MAXLEN) -> list[bytes]:
        """The newest ``count`` history records of a resource, oldest first."""
        key = self.keys.history(rkey)
        [records] = self._redis.run([Routed(key, ("LRANGE", key, -count, -1))], what="history")
        return list(records)

    def rounds(self, rkey: str, count: int = ROUNDS_MAXLEN) -> list[bytes]:
        """The newest ``count`` round records of a job, oldest first."""
        key = self.keys.rounds(rkey)
        [records] = self._redis.run([Routed(key, ("LRANGE", key, -count, -1))], what="rounds")
        return list(records)

    def commit(
        self,
        batches: Sequence[tuple[int, str, Sequence[Commit | Quarantine]]],
        *,
        markers: Mapping[int, Markers] | None = None,
        dedupe_ttl_ms: int = DEDUPE_TTL_MS,
    ) -> list[list[list[str]] | LeaseLost | Known]:
        """Apply (shard, token, commits) batches, every shard's in one round trip.

        A shard's commits are one script run, all-or-nothing, fenced by its token: one lease
        check and one acknowledgement of their ingress entries for all of them. Its
        quarantine ops (rare) are script runs of their own after it, in one MULTI/EXEC with
        it, so none of them writes when its lease is not held by its token (the lease cannot
        change inside the transaction). On one server every shard's calls share that one
        transaction; on a Cluster, which refuses a transaction across slots, each shard's is
        its own, pipelined per node. Nothing needs more: each shard's commits carry their
        resources' states, outbox, effects, histories and the ingress entries they
        acknowledge, so two shards' commits never depend on each other, and a shard that
        committed while another was fenced is exactly what the next owner of the fenced one
        expects (its entries still pending, its effects and outbox in Redis for it to redo
        and send).

        Per batch, in order: per op, the outbox stream ids of a commit's entries (for
        ``Outboxes.done`` after PUBACK), or ``LeaseLost`` when the shard's lease is not held
        by its token, or ``Known`` when messages its ``markers`` (by shard) name were taken
        in already (then its commits wrote nothing; see commit.lua). With replicas required,
        returns only once they hold every commit, else raises ``StoreUnavailable`` (the
        commits' fate then unknown to the caller). A
        ``Quarantine`` has no outbox entries (its ids are empty); a commit that clears its
        resource's mark is followed by the quarantine script clearing it, in the same
        transaction (same shard, same slot).
        """
        calls: list[Call] = []
        spans: list[tuple[int, int, int]] = []  # per batch: its calls, and its commits' count
        for shard, token, ops in batches:
            start = len(calls)
            commits = [op for op in ops if isinstance(op, Commit)]
            for op in ops:
                if op.rkey is not None and shard_of(op.rkey) != shard:
                    raise ValueError(f"{op.rkey} belongs to shard {shard_of(op.rkey)}, not {shard}")
            marked = (markers or {}).get(shard)
            if commits:
                calls.append(self._commit_call(shard, token, commits, marked, dedupe_ttl_ms))
            # after the commits: a mark is cleared once its resource's commit applied
            calls += [
                self._quarantine_call(shard, token, Quarantine(c.rkey, ()), clear=True)
                for c in commits
                if c.clear_mark
            ]
            calls += [
                self._quarantine_call(shard, token, q) for q in ops if isinstance(q, Quarantine)
            ]
            spans.append((start, len(calls), len(commits)))
        if not calls:
            return [[] for _ in batches]
        results = self._redis.eval_raw(
            calls, what="commit", atomic=True, confirm=self._redis.confirm
        )
        with store_errors("commit"):
            return [
                _outcome(results[start:end], ops, commits)
                for (start, end, commits), (_, _, ops) in zip(spans, batches, strict=True)
            ]

    def _commit_call(
        self,
        shard: int,
        token: str,
        commits: Sequence[Commit],
        markers: Markers | None,
        dedupe_ttl_ms: int,
    ) -> Call:
        """One script run applying a shard's commits (see commit.lua for the layout)."""
        k = self.keys
        keys = [
            k.lease(shard), k.timers(shard), k.effects(shard), k.index(shard),
            k.outbox(shard), k.ingress(shard), k.gm_outbox(shard),
        ]  # fmt: skip
        acks = [i for c in commits for i in c.ack_ids]
        marked = markers.items if markers is not None else ()
        args: list[bytes | str | int] = [
            token, INGRESS_GROUP, HISTORY_MAXLEN, ROUNDS_MAXLEN, len(commits), len(acks),
            len(marked), markers.token if markers is not None else "", dedupe_ttl_ms, *acks,
            *("1" if dup else "0" for _, dup in marked),
        ]  # fmt: skip
        for c in commits:
            keys += [k.state(c.rkey), k.resource(c.rkey), k.history(c.rkey), k.rounds(c.rkey)]
            mode = "delete" if c.delete else "keep" if c.keep_state else "set"
            to_gm = [entry for entry in c.outbox if entry.gm]
            args += [
                c.rkey,
                mode,
                c.state if mode == "set" and c.state is not None else b"",
                "keep" if c.resource is None else "set",
                b"" if c.resource is None else zlib.compress(c.resource),
                "" if c.timer_due_ms is None else str(max(c.timer_due_ms, -1)),
                len(c.outbox), len(c.effects), len(c.history), len(to_gm), len(c.rounds),
                len(c.retire),
            ]  # fmt: skip
            for entry in c.outbox:
                args += [entry.id, entry.topic, entry.payload]
            for effect_id, intent in c.effects:
                args += [effect_id, intent]
            args += c.history
            for entry in to_gm:
                args += [entry.id, entry.payload]
            args += c.rounds
            args += c.retire
        keys += [k.seen(shard, digest) for digest, _ in marked]
        return self._redis.call("commit", tuple(keys), tuple(args))

    def _quarantine_call(
        self, shard: int, token: str, q: Quarantine, *, clear: bool = False
    ) -> Call:
        k = self.keys
        keys = (k.lease(shard), k.broken(shard), k.ingress(shard), k.timers(shard))
        mode = "clear" if clear else "set" if q.mark is not None else ""
        retry = "" if q.retry_at_ms is None else str(q.retry_at_ms)
        args: tuple[bytes | str, ...] = (
            token, INGRESS_GROUP, q.rkey or "", mode, q.mark or b"", retry, *q.ack_ids,
        )  # fmt: skip
        return self._redis.call("quarantine", keys, args)

    def quarantine_marks(self, shards: Sequence[int]) -> dict[int, dict[str, bytes]]:
        """Per shard, the quarantine mark of each quarantined resource, in one round trip."""
        if not shards:
            return {}
        keys = [self.keys.broken(shard) for shard in shards]
        replies = self._redis.run(
            [Routed(k, ("HGETALL", k)) for k in keys], what="quarantine_marks"
        )
        return {
            shard: {as_str(rkey): mark for rkey, mark in field_map(flat).items()}
            for shard, flat in zip(shards, replies, strict=True)
        }

    def quarantined(self) -> dict[str, bytes]:
        """Every quarantined resource and its mark (for `describe` and listings)."""
        marks = self.quarantine_marks(range(NUM_SHARDS))
        return dict(sorted((rkey, m) for shard in marks.values() for rkey, m in shard.items()))

    def quarantine_mark(self, rkey: str) -> bytes | None:
        """The resource's quarantine mark, or None when it is not quarantined."""
        key = self.keys.broken(shard_of(rkey))
        [mark] = self._redis.run([Routed(key, ("HGET", key, rkey))], what="quarantine_mark")
        return None if mark is None else bytes(mark)


#: The error reply of a commit refused for messages taken in already.
KNOWN = "DUPLICATE"


def _outcome(
    results: list[Any], ops: Sequence[Commit | Quarantine], commits: int
) -> list[list[str]] | LeaseLost | Known:
    """One batch's outcome from its replies (its commits' script run first, when it has
    commits): per op, the outbox stream ids of a commit's entries ([] for a quarantine), or
    ``LeaseLost`` when the shard's lease is not held."""
    if commits and isinstance(results[0], ResponseError) and str(results[0]).startswith(KNOWN):
        return Known(tuple(int(i) - 1 for i in str(results[0]).split()[1:]))
    try:
        replies = [checked(r) for r in results]
    except LeaseLost as e:
        return e
    per_commit = iter(replies[0] if commits else [])
    return [[as_str(i) for i in next(per_commit)] if isinstance(op, Commit) else [] for op in ops]


class Outboxes(_StreamReads):
    """The outbox, the GM outbox and the effect intents of every shard."""

    def read(
        self,
        shards: Sequence[int],
        count: int = 1000,
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
        keys = [self.keys.outbox(shard) for shard, _ in ranges]
        replies = self._redis.run(
            [
                Routed(k, ("XRANGE", k, first, last, "COUNT", count))
                for k, (_, (first, last)) in zip(keys, ranges, strict=True)
            ],
            what="outboxes.read",
            confirm=self._redis.barrier,
        )
        read: dict[int, list[tuple[str, OutboxEntry | Unreadable]]] = {s: [] for s in shards}
        for (shard, _), entries in zip(ranges, replies, strict=True):
            read[shard] += [
                (as_str(entry_id), _outbox_entry(field_map(pairs))) for entry_id, pairs in entries
            ]
        return read

    def done(self, done: Mapping[int, Sequence[str]]) -> None:
        """Forget published messages (after the broker's PUBACK), every shard's in one round
        trip."""
        commands = [
            Routed(key, ("XDEL", key, *stream_ids))
            for key, stream_ids in ((self.keys.outbox(s), ids) for s, ids in done.items() if ids)
        ]
        if commands:
            self._redis.run(commands, what="outboxes.done")

    def read_gm(
        self, shards: Sequence[int], count: int = 100
    ) -> dict[int, list[tuple[str, GmMessage | Unreadable]]]:
        """Per shard, upstream messages not yet sent to the GM, oldest first, with their
        stream ids; all shards in one round trip. With replicas required, only once they hold
        all of it. An entry that is not an upstream message comes as `Unreadable`, in its
        place."""
        read = self._read(self.keys.gm_outbox, shards, count, "outboxes.read_gm")
        return {
            shard: [(stream_id, _gm_message(f)) for stream_id, f in entries]
            for shard, entries in read.items()
        }

    def done_gm(self, shard: int, stream_ids: Sequence[str]) -> None:
        """Forget messages the GM link sent."""
        self._delete(self.keys.gm_outbox(shard), stream_ids, "outboxes.done_gm")

    def wait_gm(self, shards: Sequence[int], block_ms: int) -> bool:
        """Return once a GM outbox of ``shards`` holds a message, or after ``block_ms`` (kept
        under half the socket timeout): a commit on any replica ends the wait at once.
        False, at once, where no such wait exists: the caller waits its own way.

        Sent messages are deleted, so any entry is one to send: a blocking XREAD from id 0
        on every stream returns at once when one is waiting and otherwise when the first is
        added. A Redis Cluster refuses one read across the shards' slots."""
        block_ms = min(block_ms, int(self._socket_timeout_s * 500))
        if self._cluster or not shards or block_ms <= 0:
            return False
        keys = [self.keys.gm_outbox(shard) for shard in shards]
        command: tuple[str | int, ...] = (
            "XREAD", "COUNT", 1, "BLOCK", block_ms, "STREAMS", *keys, *["0"] * len(keys)
        )  # fmt: skip
        self._redis.run([Routed(keys[0], command)], what="outboxes.wait_gm")
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
        keys = [self.keys.effects(shard) for shard in shards]
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
        k = self.keys
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


class _Envelope(msgspec.Struct, frozen=True):
    """A GM outbox entry's payload: the upstream envelope the commit wrote, the header's
    values strings, the content kept as the JSON it is."""

    header: dict[str, str]
    content: msgspec.Raw = msgspec.Raw(b"null")


_envelope_decoder = msgspec.json.Decoder(_Envelope)


def _gm_message(fields: dict[bytes, bytes]) -> GmMessage | Unreadable:
    payload = fields.get(b"payload")
    if payload is None:
        return Unreadable("no 'payload' field", _flat(fields))
    try:
        envelope = _envelope_decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        return Unreadable(f"not an upstream envelope: {e}", payload)
    return GmMessage(envelope.header, bytes(envelope.content))


def _flat(fields: dict[bytes, bytes]) -> bytes:
    """A stream entry's fields as ``name=value`` pairs, one per line, for the dead letter."""
    return b"\n".join(name + b"=" + value for name, value in fields.items())


class Leases:
    """Takes, renews and gives up leases; keeps the replica registry."""

    def __init__(self, redis: Commands) -> None:
        self._redis = redis
        self.keys = redis.keys

    def acquire(self, lease_key: str, fence_key: str, replica: str, ttl_ms: int) -> str | None:
        """Take a free lease: its token ``<replica>:<fence>``, or None while it is held.

        The fence never goes backwards, even when a failover lost the INCR that made the
        last token: it is also never below the wall clock in milliseconds (read here, not
        from a clock tests may move), so a token taken after a failover is larger than any
        taken before it as long as the controllers' clocks agree within the failover's
        duration. With replicas required, a token is returned only once they hold it; when
        they do not confirm it in time the lease is given back and ``StoreUnavailable``
        raised.
        """
        floor_ms = time.time_ns() // 1_000_000
        call = self._redis.call("acquire", (lease_key, fence_key), (replica, ttl_ms, floor_ms))
        try:
            with store_errors("acquire"):
                token = checked(
                    self._redis.eval_raw([call], what="acquire", confirm=self._redis.confirm)[0]
                )
        except StoreUnavailable as e:
            cause = e.__cause__
            if isinstance(cause, NotReplicated) and isinstance(cause.results[0], bytes):
                with contextlib.suppress(StoreUnavailable, PermanentError):
                    self.release(lease_key, as_str(cause.results[0]))
            raise
        return None if token is None else as_str(token)

    def renew(self, lease_key: str, token: str, ttl_ms: int) -> bool:
        """Extend the lease if ``token`` still holds it."""
        call = self._redis.call("renew", (lease_key,), (token, ttl_ms))
        return bool(self._redis.eval([call], what="renew")[0])

    def release(self, lease_key: str, token: str) -> bool:
        """Give the lease up if ``token`` still holds it."""
        call = self._redis.call("release", (lease_key,), (token,))
        return bool(self._redis.eval([call], what="release")[0])

    def lease_holder(self, lease_key: str) -> str | None:
        """The current holder's token ``<replica>:<fence>``, or None when the lease is free."""
        [token] = self._redis.run([Routed(lease_key, ("GET", lease_key))], what="lease_holder")
        return None if token is None else as_str(token)

    def mark_ingress_subscribed(self, token: str, ttl_ms: int) -> None:
        """Say that the ingress lease holder ``token`` has its subscription acknowledged,
        for ``ttl_ms`` (renewed with the lease, so it lapses with a dead holder)."""
        key = self.keys.ingress_subscribed()
        self._redis.run(
            [Routed(key, ("SET", key, token, "PX", ttl_ms))], what="mark_ingress_subscribed"
        )

    def ingress_subscribed(self) -> bool:
        """Whether the current ingress lease holder said its subscription is acknowledged."""
        keys = (self.keys.ingress_lease(), self.keys.ingress_subscribed())  # one slot
        [(lease, marker)] = self._redis.run(
            [Routed(keys[0], ("MGET", *keys))], what="ingress_subscribed"
        )
        return lease is not None and lease == marker

    def heartbeat(self, replica: str, now_ms: int, ttl_ms: int) -> list[str]:
        """Announce ``replica`` alive until now+ttl; the live replicas, sorted."""
        key = self.keys.replicas()
        replies = self._redis.run(
            [
                Routed(key, ("ZADD", key, now_ms + ttl_ms, replica)),
                Routed(key, ("ZREMRANGEBYSCORE", key, "-inf", now_ms)),
                Routed(key, ("ZRANGE", key, 0, -1)),
            ],
            what="heartbeat",
            atomic=True,
        )
        return sorted(map(as_str, replies[-1]))

    def live_replicas(self, now_ms: int) -> list[str]:
        """The replicas whose last heartbeat has not expired by ``now_ms``, sorted (a read:
        for the CLI, which is no replica)."""
        key = self.keys.replicas()
        [members] = self._redis.run(
            [Routed(key, ("ZRANGEBYSCORE", key, now_ms, "+inf"))], what="live_replicas"
        )
        return sorted(map(as_str, members))

    def leave(self, replica: str) -> None:
        key = self.keys.replicas()
        self._redis.run([Routed(key, ("ZREM", key, replica))], what="leave")

    def put_gm_link(self, status: bytes, ttl_ms: int) -> None:
        """Record the GM link's state (written by its holder, read by the CLI)."""
        key = self.keys.gm_link()
        self._redis.run([Routed(key, ("SET", key, status, "PX", ttl_ms))], what="put_gm_link")

    def gm_link(self) -> bytes | None:
        key = self.keys.gm_link()
        [status] = self._redis.run([Routed(key, ("GET", key))], what="gm_link")
        return None if status is None else bytes(status)


DLQ_MAXLEN = 10_000


class Records:
    """The dead-letter stream, outputDir claims and the dataset-to-jobs index."""

    def __init__(self, redis: Commands) -> None:
        self._redis = redis
        self.keys = redis.keys

    def dead_letter(self, rejection: bytes, maxlen: int = DLQ_MAXLEN) -> None:
        """Keep a rejection for inspection; the stream is capped (approximately) at maxlen."""
        key = self.keys.dlq()
        command = ("XADD", key, "MAXLEN", "~", maxlen, "*", "r", rejection)
        self._redis.run([Routed(key, command)], what="dead_letter")

    def dlq(self, count: int = 100) -> list[bytes]:
        """The newest ``count`` rejections, oldest first."""
        key = self.keys.dlq()
        command = ("XREVRANGE", key, "+", "-", "COUNT", count)
        [entries] = self._redis.run([Routed(key, command)], what="dlq")
        return [field_map(pairs)[b"r"] for _, pairs in reversed(entries)]

    def claim_output_dir(
        self, output_dir: str, job_rkey: str, now_ms: int, *, stale: str = "", grace_ms: int
    ) -> tuple[str, str] | None:
        """Claim an outputDir (as it lies on disk) for a job: None when the job holds it now,
        else the rkey of another job and the directory it holds: the same one, one inside it
        or one above it (`stale`: a holder found gone, whose claims in the way are taken over
        once older than `grace_ms`)."""
        found = self._claim(
            output_dir, ("claim", job_rkey, now_ms, stale, grace_ms), "claim_output_dir"
        )
        if not found:
            return None
        holder, held = found
        return as_str(holder), as_str(held)

    def release_output_dir(self, output_dir: str, job_rkey: str) -> bool:
        """Give up a job's claim on an outputDir; False when the job did not hold it."""
        return bool(self._claim(output_dir, ("release", job_rkey, 0, "", 0), "release_output_dir"))

    def _claim(self, output_dir: str, args: tuple[str | int, ...], what: str) -> Any:
        """The claim script's reply for ``args`` (operation, job, now, stale, grace) on the
        outputDir, canonical, with the directories above it."""
        directory = canonical_dir(output_dir)
        key = self.keys.output_claims()
        call = self._redis.call("claim", (key,), (*args, directory, *ancestors(directory)))
        return self._redis.eval([call], what=what, confirm=self._redis.confirm)[0]

    def dataset_jobs_add(self, dataset: str, job_rkey: str) -> None:
        """Say that the job ``job_rkey`` uses ``dataset`` (the dataset's rkey)."""
        self._dataset_jobs("SADD", dataset, job_rkey, "dataset_jobs_add")

    def dataset_jobs_remove(self, dataset: str, job_rkey: str) -> None:
        """Say that the job ``job_rkey`` no longer uses ``dataset``."""
        self._dataset_jobs("SREM", dataset, job_rkey, "dataset_jobs_remove")

    def _dataset_jobs(self, command: str, dataset: str, job_rkey: str, what: str) -> None:
        key = self.keys.dataset_jobs(dataset)
        self._redis.run(
            [Routed(key, (command, key, job_rkey))],
            what=what,
            confirm=self._redis.confirm,
        )

    def dataset_jobs(self, dataset: str) -> list[str]:
        """Job rkeys using ``dataset`` (the dataset's rkey), sorted."""
        key = self.keys.dataset_jobs(dataset)
        [members] = self._redis.run([Routed(key, ("SMEMBERS", key))], what="dataset_jobs")
        return sorted(map(as_str, members))


#: How long a write waits for its replicas before it counts as not done.
WAIT_TIMEOUT_MS = 1_000


class RedisStore:
    """Opens the link to Redis and holds its concerns: ``ingress``, ``states``,
    ``outboxes``, ``leases`` and ``records``.

    ``url``: any URL ``parse_redis_url`` takes. ``min_replicas``: replicas that must hold a
    write before it is acted on (None: 0 on one server, 1 behind Sentinel or on a Cluster).
    """

    def __init__(
        self,
        url: str,
        keys: Keys,
        *,
        socket_timeout_s: float = 5.0,
        min_replicas: int | None = None,
    ) -> None:
        target = parse_redis_url(url, "redis URL")
        self.keys = keys
        scripts = load_scripts()
        link = open_link(target, keys.barrier, socket_timeout_s, scripts.values())
        replicas = target.default_min_replicas if min_replicas is None else min_replicas
        # the WAIT must end well before the socket gives up on its reply
        wait_ms = min(WAIT_TIMEOUT_MS, int(socket_timeout_s * 500))
        self._redis = redis = Commands(link, keys, scripts, replicas, wait_ms)
        cluster = target.topology == "cluster"
        self.ingress = Ingress(redis, cluster=cluster, socket_timeout_s=socket_timeout_s)
        self.states = States(redis)
        self.outboxes = Outboxes(redis, cluster=cluster, socket_timeout_s=socket_timeout_s)
        self.leases = Leases(redis)
        self.records = Records(redis)

    @property
    def min_replicas(self) -> int:
        return 0 if self._redis.confirm is None else self._redis.confirm.replicas

    def ping(self) -> bool:
        """Whether Redis answers now (for readiness), never raising."""
        return self._redis.ping()

    def close(self) -> None:
        self._redis.link.close()
