"""The Redis store: the only place state lives.

Durable, atomic, fenced primitives over redis-py. State and effects are opaque ``bytes``; the
runtime decides what they mean. Every write that depends on owning a shard runs as a Lua
script (``*.lua`` beside this module) that first compares the shard's lease with the caller's
token, so a replica whose lease expired or was taken can never write again (fencing).

The hot path per batch is exactly three round trips: ``read_ingress``, ``load`` and
``commit``. Scripts run via EVALSHA; they are loaded on every new connection (so a restarted
Redis is transparent) and, should they still be missing (``SCRIPT FLUSH``), loaded and the
refused calls retried once. Library errors never leave this module: connection-level
failures become ``StoreUnavailable``, a fenced script ``LeaseLost``, anything else
``PermanentError``.
"""

from __future__ import annotations

import contextlib
import hashlib
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.connection import Connection
from redis.exceptions import NoScriptError, ResponseError
from redis.retry import Retry

from service.errors import LeaseLost, PermanentError, StoreUnavailable
from service.keys import INGRESS_CONSUMER, INGRESS_GROUP, NUM_SHARDS, Keys, shard_of

HISTORY_MAXLEN = 100
DLQ_MAXLEN = 10_000
HEALTH_CHECK_INTERVAL_S = 30
# Error replies that mean "the server cannot serve right now", not "the request is wrong".
_TRANSIENT_REPLIES = ("LOADING", "READONLY", "OOM", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN")
_SCRIPT_NAMES = (
    "commit",
    "append_ingress",
    "fire_timers",
    "complete_effect",
    "acquire",
    "renew",
    "release",
    "quarantine",
    "claim",
)


@dataclass(frozen=True)
class OutboxEntry:
    """One upstream message, written with the state that caused it; ``id`` is stable."""

    id: str
    topic: str
    payload: bytes


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

    ``delete`` removes state, resource, timer, history and index membership (``state`` must
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
    #: upstream messages for the GM link, (id, envelope JSON), when a GM is configured
    gm: tuple[tuple[str, bytes], ...] = ()
    clear_mark: bool = False  # the resource's quarantine ended

    def __post_init__(self) -> None:
        if self.delete and (self.state is not None or self.keep_state):
            raise ValueError(f"{self.rkey}: delete takes neither state nor keep_state")
        if not self.delete and not self.keep_state and self.state is None:
            raise ValueError(f"{self.rkey}: state is None without delete or keep_state")


@dataclass(frozen=True)
class Quarantine:
    """Entries taken out of the ingress (their records dead-lettered by the caller) and,
    unless ``rkey`` is None (entries of no known resource), the resource's quarantine mark
    set (``mark``) and a retry timer (``retry_at_ms``) set; applied all-or-nothing."""

    rkey: str | None
    ack_ids: tuple[str, ...]
    mark: bytes | None = None
    retry_at_ms: int | None = None


@dataclass(frozen=True)
class _Lua:
    """A script from ``<name>.lua`` and its SHA1, for EVALSHA.

    Not redis-py's ``Script``: calling one inside a pipeline costs an extra SCRIPT EXISTS
    round trip per execute, which the hot path cannot afford.
    """

    name: str
    text: str
    sha: str

    @classmethod
    def named(cls, name: str) -> _Lua:
        text = resources.files(__package__).joinpath(f"{name}.lua").read_text()
        return cls(name, text, hashlib.sha1(text.encode()).hexdigest())


@dataclass(frozen=True)
class _Call:
    """One EVALSHA: a script with its keys and arguments."""

    script: _Lua
    keys: tuple[str, ...]
    args: tuple[bytes | str | int, ...]


@contextlib.contextmanager
def _store_errors(what: str) -> Iterator[None]:
    """Translate redis-py errors into the service's at the adapter boundary."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as e:
        raise StoreUnavailable(f"redis {what}: {e}") from e
    except ResponseError as e:
        if str(e).startswith(_TRANSIENT_REPLIES):
            raise StoreUnavailable(f"redis {what}: {e}") from e
        raise PermanentError(f"redis {what}: {e}") from e
    except redis.RedisError as e:
        raise PermanentError(f"redis {what}: {e}") from e


def _checked(result: Any) -> Any:
    """A pipeline reply, or its error raised (a fenced script as ``LeaseLost``)."""
    if isinstance(result, ResponseError):
        if str(result).startswith("FENCED"):
            raise LeaseLost(str(result))
        raise result
    return result


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisStore:
    """Durable state, ingress, outbox, timers, effects and leases in one Redis."""

    def __init__(self, url: str, keys: Keys, *, socket_timeout_s: float = 5.0) -> None:
        self.keys = keys
        self._socket_timeout_s = socket_timeout_s
        self._scripts = {name: _Lua.named(name) for name in _SCRIPT_NAMES}
        self._pool = redis.ConnectionPool.from_url(
            url,
            protocol=2,  # pinned: reply shapes below are RESP2's
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=socket_timeout_s,
            health_check_interval=HEALTH_CHECK_INTERVAL_S,
            # no retries here: a retried EVALSHA after a timeout could apply twice; the
            # runtime retries whole operations above us
            retry=Retry(NoBackoff(), 0),
            redis_connect_func=self._on_connect,
        )
        self._client: redis.Redis[bytes] = redis.Redis(connection_pool=self._pool)
        # XREADGROUP replies as they come: redis-py would build a dict per entry, in Python,
        # for the hundreds of entries a busy read returns (_ingress_entry reads the pairs)
        self._client.set_response_callback("XREADGROUP", _as_is)  # type: ignore[no-untyped-call]

    def _on_connect(self, connection: Connection) -> None:
        """Handshake, then load every script, so EVALSHA works on a fresh or restarted Redis."""
        connection.on_connect()
        for script in self._scripts.values():  # sent back to back: one round trip
            connection.send_command("SCRIPT", "LOAD", script.text)
        for _ in self._scripts:
            connection.read_response()

    def ping(self) -> bool:
        """Whether Redis answers now (for readiness), never raising."""
        try:
            return bool(self._client.ping())
        except redis.RedisError:
            return False

    def close(self) -> None:
        self._client.close()
        self._pool.disconnect()

    # -- scripts -----------------------------------------------------------------------

    def _eval(self, calls: Sequence[_Call], *, what: str, transaction: bool = False) -> list[Any]:
        """Run scripts in one round trip; the first error reply is raised (fenced: LeaseLost)."""
        with _store_errors(what):
            return [_checked(r) for r in self._eval_raw(calls, what=what, transaction=transaction)]

    def _eval_raw(
        self, calls: Sequence[_Call], *, what: str, transaction: bool = False
    ) -> list[Any]:
        """Run scripts in one round trip, replies as they came (errors as values); reload and
        retry once the calls refused NOSCRIPT."""
        with _store_errors(what):
            results = self._send(calls, transaction)
            missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
            if missing:
                self._load_scripts()
                retried = self._send([calls[i] for i in missing], transaction)
                for i, result in zip(missing, retried, strict=True):
                    results[i] = result
            return results

    def _load_scripts(self) -> None:
        """Load every script (after ``SCRIPT FLUSH``: reconnects already load them)."""
        pipe = self._client.pipeline(transaction=False)
        for script in self._scripts.values():
            pipe.script_load(script.text)
        pipe.execute()

    def _send(self, calls: Sequence[_Call], transaction: bool) -> list[Any]:
        pipe = self._client.pipeline(transaction=transaction)
        for call in calls:
            pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
        try:
            return list(pipe.execute(raise_on_error=False))
        except NoScriptError as e:  # a transaction aborted at queue time: nothing ran
            return [e] * len(calls)

    # -- ingress -----------------------------------------------------------------------

    def ensure_groups(self) -> None:
        """Create every shard's ingress stream and consumer group (idempotent).

        The group starts at id 0 so entries appended before it existed are still delivered.
        """
        with _store_errors("ensure_groups"):
            pipe = self._client.pipeline(transaction=False)
            for shard in range(NUM_SHARDS):
                pipe.xgroup_create(self.keys.ingress(shard), INGRESS_GROUP, id="0", mkstream=True)
            for result in pipe.execute(raise_on_error=False):
                if isinstance(result, ResponseError) and not str(result).startswith("BUSYGROUP"):
                    raise result

    def _append_call(
        self,
        shard: int,
        event: bytes,
        dedupe: str | None,
        *,
        dup: bool,
        dedupe_ttl_ms: int,
        token: str,
    ) -> _Call:
        keys: tuple[str, ...] = (self.keys.ingress(shard),)
        if dedupe is not None:
            keys += (self.keys.seen(shard, dedupe),)
        args = (event, "1" if dup else "0", dedupe_ttl_ms, token)
        return _Call(self._scripts["append_ingress"], keys, args)

    def append_ingress(
        self,
        shard: int,
        event: bytes,
        *,
        dedupe: str | None = None,
        dup: bool = False,
        dedupe_ttl_ms: int = 60_000,
        token: str = "",
    ) -> str | None:
        """Append an event; None when it is one already taken in: a redelivery (``dup``), or
        a message another ingress holder (``token``) took in first."""
        return self.append_many(
            [(shard, event, dedupe, dup)], dedupe_ttl_ms=dedupe_ttl_ms, token=token
        )[0]

    def append_many(
        self,
        items: Sequence[tuple[int, bytes, str | None, bool]],
        *,
        dedupe_ttl_ms: int = 60_000,
        token: str = "",
    ) -> list[str | None]:
        """``append_ingress`` for (shard, event, dedupe, dup) items, in one round trip."""
        if not items:
            return []
        calls = [
            self._append_call(s, e, d, dup=dup, dedupe_ttl_ms=dedupe_ttl_ms, token=token)
            for s, e, d, dup in items
        ]
        return [None if r is None else _text(r) for r in self._eval(calls, what="append")]

    def read_ingress(
        self, shards: Sequence[int], *, count: int, block_ms: int, pending: bool
    ) -> list[IngressEntry]:
        """Read the owned shards' ingress in one round trip.

        ``pending=True`` re-reads entries delivered but never acknowledged (the previous
        owner's, since all owners share one consumer name) and never blocks; ``pending=False``
        reads new entries, blocking up to ``block_ms`` (0: do not block).
        """
        if not shards:
            return []
        if not pending and block_ms / 1000 >= self._socket_timeout_s:
            raise ValueError(f"block_ms {block_ms} must stay below the socket timeout")
        streams = {self.keys.ingress(s): ("0" if pending else ">") for s in shards}
        block = None if pending or block_ms <= 0 else block_ms
        with _store_errors("read_ingress"):
            try:
                reply = self._client.xreadgroup(
                    INGRESS_GROUP, INGRESS_CONSUMER, streams, count=count, block=block
                )
            except ResponseError as e:
                if not str(e).startswith("NOGROUP"):
                    raise
                self.ensure_groups()  # the streams vanished (Redis restarted empty)
                reply = self._client.xreadgroup(
                    INGRESS_GROUP, INGRESS_CONSUMER, streams, count=count, block=block
                )
        shard_by_key = {self.keys.ingress(s): s for s in shards}
        return [
            _ingress_entry(shard_by_key[_text(name)], entry_id, fields)
            for name, entries in reply or []
            for entry_id, fields in entries
        ]

    # -- state -------------------------------------------------------------------------

    def load(self, rkeys: Sequence[str]) -> dict[str, bytes | None]:
        """The opaque state of each resource (None: none), in one round trip."""
        if not rkeys:
            return {}
        with _store_errors("load"):
            pipe = self._client.pipeline(transaction=False)
            for rkey in rkeys:
                pipe.get(self.keys.state(rkey))
            values = pipe.execute()
        return dict(zip(rkeys, values, strict=True))

    def load_resource(self, rkey: str) -> bytes | None:
        """The resource's canonical JSON as stored by its last insert (kept compressed)."""
        with _store_errors("load_resource"):
            stored = self._client.get(self.keys.resource(rkey))
        return None if stored is None else zlib.decompress(stored)

    def list_rkeys(
        self, kind: str | None = None, shards: Sequence[int] = range(NUM_SHARDS)
    ) -> list[str]:
        """Every resource with state (of these shards), sorted; ``kind`` (``job``/``dataset``)
        filters."""
        with _store_errors("list_rkeys"):
            pipe = self._client.pipeline(transaction=False)
            for shard in shards:
                pipe.smembers(self.keys.index(shard))
            members = pipe.execute()
        prefix = f"{kind}:" if kind else ""
        return sorted(
            rkey
            for shard_members in members
            for rkey in map(_text, shard_members)
            if rkey.startswith(prefix)
        )

    def history(self, rkey: str, count: int = 100) -> list[bytes]:
        """The newest ``count`` history records of a resource, oldest first."""
        with _store_errors("history"):
            return list(self._client.lrange(self.keys.history(rkey), -count, -1))

    def commit(
        self, batches: Sequence[tuple[int, str, Sequence[Commit | Quarantine]]]
    ) -> list[list[list[str]] | LeaseLost]:
        """Apply (shard, token, commits) batches, every shard's in one round trip.

        Each commit is one script run, all-or-nothing, fenced by its shard's token; all of
        them run in one MULTI/EXEC, so no other client's write (a new owner's) lands between
        them. Per batch, in order: the outbox stream ids of each commit's entries (for
        ``outbox_done`` after PUBACK), or ``LeaseLost`` when the shard's lease is not held
        by its token, in which case none of that shard's commits wrote anything (the lease
        cannot change inside the transaction) while the other shards' went through. A
        ``Quarantine`` has no outbox entries (its ids are empty); a commit that clears its
        resource's mark runs the quarantine script after the commit script.
        """
        calls: list[_Call] = []
        spans: list[tuple[int, int]] = []
        firsts: list[list[int]] = []  # per batch, the call index of each commit's reply
        for shard, token, commits in batches:
            for c in commits:
                if c.rkey is not None and shard_of(c.rkey) != shard:
                    raise ValueError(f"{c.rkey} belongs to shard {shard_of(c.rkey)}, not {shard}")
            start, first = len(calls), []
            for c in commits:
                first.append(len(calls))
                calls.extend(self._commit_calls(shard, token, c))
            spans.append((start, len(calls)))
            firsts.append([i - start for i in first])
        results = self._eval_raw(calls, what="commit", transaction=len(calls) > 1) if calls else []
        outcomes: list[list[list[str]] | LeaseLost] = []
        with _store_errors("commit"):
            for (start, end), first in zip(spans, firsts, strict=True):
                try:
                    replies = [_checked(r) for r in results[start:end]]
                except LeaseLost as e:
                    outcomes.append(e)
                    continue
                outcomes.append(
                    [
                        [_text(stream_id) for stream_id in replies[i]]
                        if isinstance(replies[i], list)
                        else []
                        for i in first
                    ]
                )
        return outcomes

    def _commit_calls(self, shard: int, token: str, c: Commit | Quarantine) -> list[_Call]:
        if isinstance(c, Quarantine):
            return [self._quarantine_call(shard, token, c)]
        calls = [self._commit_call(shard, token, c)]
        if c.clear_mark:
            calls.append(self._quarantine_call(shard, token, Quarantine(c.rkey, ()), clear=True))
        return calls

    def _quarantine_call(
        self, shard: int, token: str, q: Quarantine, *, clear: bool = False
    ) -> _Call:
        k = self.keys
        keys = (k.lease(shard), k.broken(shard), k.ingress(shard), k.timers(shard))
        mode = "clear" if clear else "set" if q.mark is not None else ""
        retry = "" if q.retry_at_ms is None else str(q.retry_at_ms)
        args: tuple[bytes | str, ...] = (
            token, INGRESS_GROUP, q.rkey or "", mode, q.mark or b"", retry, *q.ack_ids,
        )  # fmt: skip
        return _Call(self._scripts["quarantine"], keys, args)

    def quarantine_marks(self, shards: Sequence[int]) -> dict[int, dict[str, bytes]]:
        """Per shard, the quarantine mark of each quarantined resource, in one round trip."""
        with _store_errors("quarantine_marks"):
            pipe = self._client.pipeline(transaction=False)
            for shard in shards:
                pipe.hgetall(self.keys.broken(shard))
            replies = pipe.execute()
        return {
            shard: {_text(rkey): mark for rkey, mark in marks.items()}
            for shard, marks in zip(shards, replies, strict=True)
        }

    def quarantined(self) -> dict[str, bytes]:
        """Every quarantined resource and its mark (for `describe` and listings)."""
        marks = self.quarantine_marks(range(NUM_SHARDS))
        return dict(sorted((rkey, m) for shard in marks.values() for rkey, m in shard.items()))

    def quarantine_mark(self, rkey: str) -> bytes | None:
        """The resource's quarantine mark, or None when it is not quarantined."""
        with _store_errors("quarantine_mark"):
            mark = self._client.hget(self.keys.broken(shard_of(rkey)), rkey)
        return None if mark is None else bytes(mark)

    def _commit_call(self, shard: int, token: str, c: Commit) -> _Call:
        k = self.keys
        keys = (
            k.lease(shard),
            k.state(c.rkey),
            k.resource(c.rkey),
            k.history(c.rkey),
            k.timers(shard),
            k.effects(shard),
            k.index(shard),
            k.outbox(shard),
            k.ingress(shard),
            k.gm_outbox(shard),
        )
        mode = "delete" if c.delete else "keep" if c.keep_state else "set"
        timer = "" if c.timer_due_ms is None else str(max(c.timer_due_ms, -1))
        args: list[bytes | str | int] = [
            token,
            c.rkey,
            mode,
            c.state if mode == "set" and c.state is not None else b"",
            "keep" if c.resource is None else "set",
            b"" if c.resource is None else zlib.compress(c.resource),
            timer,
            INGRESS_GROUP,
            HISTORY_MAXLEN,
            len(c.ack_ids),
            len(c.outbox),
            len(c.effects),
            len(c.history),
            len(c.gm),
            *c.ack_ids,
        ]
        for entry in c.outbox:
            args += [entry.id, entry.topic, entry.payload]
        for effect_id, intent in c.effects:
            args += [effect_id, intent]
        args += c.history
        for gm_id, payload in c.gm:
            args += [gm_id, payload]
        return _Call(self._scripts["commit"], keys, tuple(args))

    # -- outbox ------------------------------------------------------------------------

    def outbox_read(
        self, shards: Sequence[int], count: int = 1000
    ) -> dict[int, list[tuple[str, OutboxEntry]]]:
        """Per shard, unpublished upstream messages, oldest first, with their stream ids; all
        shards in one round trip."""
        with _store_errors("outbox_read"):
            pipe = self._client.pipeline(transaction=False)
            for shard in shards:
                pipe.xrange(self.keys.outbox(shard), count=count)
            replies = pipe.execute()
        return {
            shard: [
                (
                    _text(entry_id),
                    OutboxEntry(_text(f[b"id"]), _text(f[b"topic"]), f[b"payload"]),
                )
                for entry_id, f in entries
            ]
            for shard, entries in zip(shards, replies, strict=True)
        }

    def gm_outbox_read(
        self, shards: Sequence[int], count: int = 100
    ) -> dict[int, list[tuple[str, bytes]]]:
        """Per shard, upstream messages not yet sent to the GM, oldest first, as (stream id,
        envelope JSON); all shards in one round trip."""
        with _store_errors("gm_outbox_read"):
            pipe = self._client.pipeline(transaction=False)
            for shard in shards:
                pipe.xrange(self.keys.gm_outbox(shard), count=count)
            replies = pipe.execute()
        return {
            shard: [(_text(entry_id), fields[b"payload"]) for entry_id, fields in entries]
            for shard, entries in zip(shards, replies, strict=True)
        }

    def gm_outbox_done(self, shard: int, stream_ids: Sequence[str]) -> None:
        """Forget messages the GM link sent."""
        if not stream_ids:
            return
        with _store_errors("gm_outbox_done"):
            self._client.xdel(self.keys.gm_outbox(shard), *stream_ids)

    def outbox_done(self, shard: int, stream_ids: Sequence[str]) -> None:
        """Forget published messages (after the broker's PUBACK)."""
        if not stream_ids:
            return
        with _store_errors("outbox_done"):
            self._client.xdel(self.keys.outbox(shard), *stream_ids)

    # -- timers ------------------------------------------------------------------------

    def fire_due_timers(
        self, tokens: Mapping[int, str], now_ms: int, limit: int = 500
    ) -> dict[int, int | None]:
        """Move timers due by ``now_ms`` into their shard's ingress, for every shard of
        ``tokens`` (shard -> lease token) in one round trip. Per shard: how many fired, or
        None when the lease is not held by that token (fenced: nothing moved)."""
        k = self.keys
        shards = sorted(tokens)
        calls = [
            _Call(
                self._scripts["fire_timers"],
                (k.lease(shard), k.timers(shard), k.ingress(shard)),
                (tokens[shard], now_ms, limit),
            )
            for shard in shards
        ]
        results = self._eval_raw(calls, what="fire_due_timers")
        fired: dict[int, int | None] = {}
        for shard, result in zip(shards, results, strict=True):
            try:
                fired[shard] = int(_checked(result))
            except LeaseLost:
                fired[shard] = None
        return fired

    def next_timer_ms(self, shard: int) -> int | None:
        """When the shard's earliest timer is due, or None without timers."""
        with _store_errors("next_timer_ms"):
            first = self._client.zrange(self.keys.timers(shard), 0, 0, withscores=True)
        return int(first[0][1]) if first else None

    # -- effects -----------------------------------------------------------------------

    def pending_effects(self, shards: Sequence[int]) -> dict[int, dict[str, bytes]]:
        """Per shard, the effect intents committed but not yet completed (a new owner redoes
        them), in one round trip."""
        with _store_errors("pending_effects"):
            pipe = self._client.pipeline(transaction=False)
            for shard in shards:
                pipe.hgetall(self.keys.effects(shard))
            replies = pipe.execute()
        return {
            shard: {_text(effect_id): intent for effect_id, intent in intents.items()}
            for shard, intents in zip(shards, replies, strict=True)
        }

    def complete_effect(
        self, shard: int, token: str, effect_id: str, result_event: bytes | None
    ) -> bool:
        """Retire an intent and append its result event, once; False if already retired."""
        k = self.keys
        call = _Call(
            self._scripts["complete_effect"],
            (k.lease(shard), k.effects(shard), k.ingress(shard)),
            (token, effect_id, "0" if result_event is None else "1", result_event or b""),
        )
        return bool(self._eval([call], what="complete_effect")[0])

    # -- leases ------------------------------------------------------------------------

    def acquire(self, lease_key: str, fence_key: str, replica: str, ttl_ms: int) -> str | None:
        """Take a free lease: its token ``<replica>:<fence>``, or None while it is held."""
        call = _Call(self._scripts["acquire"], (lease_key, fence_key), (replica, ttl_ms))
        token = self._eval([call], what="acquire")[0]
        return None if token is None else _text(token)

    def renew(self, lease_key: str, token: str, ttl_ms: int) -> bool:
        """Extend the lease if ``token`` still holds it."""
        call = _Call(self._scripts["renew"], (lease_key,), (token, ttl_ms))
        return bool(self._eval([call], what="renew")[0])

    def release(self, lease_key: str, token: str) -> bool:
        """Give the lease up if ``token`` still holds it."""
        call = _Call(self._scripts["release"], (lease_key,), (token,))
        return bool(self._eval([call], what="release")[0])

    def lease_holder(self, lease_key: str) -> str | None:
        """The current holder's token ``<replica>:<fence>``, or None when the lease is free."""
        with _store_errors("lease_holder"):
            token = self._client.get(lease_key)
        return None if token is None else _text(token)

    def mark_ingress_subscribed(self, token: str, ttl_ms: int) -> None:
        """Say that the ingress lease holder ``token`` has its subscription acknowledged,
        for ``ttl_ms`` (renewed with the lease, so it lapses with a dead holder)."""
        with _store_errors("mark_ingress_subscribed"):
            self._client.set(self.keys.ingress_subscribed(), token, px=ttl_ms)

    def ingress_subscribed(self) -> bool:
        """Whether the current ingress lease holder said its subscription is acknowledged."""
        keys = (self.keys.ingress_lease(), self.keys.ingress_subscribed())  # one slot
        with _store_errors("ingress_subscribed"):
            lease, marker = self._client.mget(keys)
        return lease is not None and lease == marker

    # -- replicas ----------------------------------------------------------------------

    def heartbeat(self, replica: str, now_ms: int, ttl_ms: int) -> list[str]:
        """Announce ``replica`` alive until now+ttl; the live replicas, sorted."""
        key = self.keys.replicas()
        with _store_errors("heartbeat"):
            pipe = self._client.pipeline(transaction=True)
            pipe.zadd(key, {replica: now_ms + ttl_ms})
            pipe.zremrangebyscore(key, "-inf", now_ms)
            pipe.zrange(key, 0, -1)
            live = pipe.execute()[-1]
        return sorted(map(_text, live))

    def put_gm_link(self, status: bytes, ttl_ms: int) -> None:
        """Record the GM link's state (written by its holder, read by the CLI)."""
        with _store_errors("put_gm_link"):
            self._client.set(self.keys.gm_link(), status, px=ttl_ms)

    def gm_link(self) -> bytes | None:
        with _store_errors("gm_link"):
            return self._client.get(self.keys.gm_link())

    def leave(self, replica: str) -> None:
        with _store_errors("leave"):
            self._client.zrem(self.keys.replicas(), replica)

    # -- misc --------------------------------------------------------------------------

    def dead_letter(self, rejection: bytes, maxlen: int = DLQ_MAXLEN) -> None:
        """Keep a rejection for inspection; the stream is capped (approximately) at maxlen."""
        with _store_errors("dead_letter"):
            self._client.xadd(self.keys.dlq(), {"r": rejection}, maxlen=maxlen, approximate=True)

    def dlq(self, count: int = 100) -> list[bytes]:
        """The newest ``count`` rejections, oldest first."""
        with _store_errors("dlq"):
            entries = self._client.xrevrange(self.keys.dlq(), count=count)
        return [fields[b"r"] for _, fields in reversed(entries)]

    def claim_output_dir(
        self, output_dir: str, job_rkey: str, now_ms: int, *, stale: str = "", grace_ms: int
    ) -> str | None:
        """Claim an outputDir for a job: None when the job holds it now, else the rkey of the
        job that does (`stale`: a holder found gone, taken over once its claim is older than
        `grace_ms`)."""
        call = _Call(
            self._scripts["claim"],
            (self.keys.output_claim(output_dir),),
            ("claim", job_rkey, now_ms, stale, grace_ms),
        )
        holder = self._eval([call], what="claim_output_dir")[0]
        return None if holder is None else _text(holder)

    def release_output_dir(self, output_dir: str, job_rkey: str) -> bool:
        """Give up a job's claim on an outputDir; False when the job did not hold it."""
        call = _Call(
            self._scripts["claim"],
            (self.keys.output_claim(output_dir),),
            ("release", job_rkey, 0, "", 0),
        )
        return bool(self._eval([call], what="release_output_dir")[0])

    def dataset_jobs_add(self, dataset: str, job_rkey: str) -> None:
        with _store_errors("dataset_jobs_add"):
            self._client.sadd(self.keys.dataset_jobs(dataset), job_rkey)

    def dataset_jobs_remove(self, dataset: str, job_rkey: str) -> None:
        with _store_errors("dataset_jobs_remove"):
            self._client.srem(self.keys.dataset_jobs(dataset), job_rkey)

    def dataset_jobs(self, dataset: str) -> list[str]:
        """Job rkeys using ``dataset`` (the dataset's rkey), sorted."""
        with _store_errors("dataset_jobs"):
            members = self._client.smembers(self.keys.dataset_jobs(dataset))
        return sorted(map(_text, members))


def _as_is(response: Any, **_options: Any) -> Any:
    return response


def _ingress_entry(shard: int, entry_id: bytes | str, pairs: list[bytes] | None) -> IngressEntry:
    """Decode one stream entry (its field/value list as Redis sent it; None for an entry
    deleted while pending); one without known fields yields neither event nor timer."""
    fields = dict(zip(pairs[::2], pairs[1::2], strict=True)) if pairs else {}
    due = fields.get(b"due")
    timer = fields.get(b"t")
    return IngressEntry(
        shard=shard,
        entry_id=_text(entry_id),
        event=fields.get(b"e"),
        timer_rkey=None if timer is None else _text(timer),
        timer_due_ms=None if due is None else int(float(due)),
    )
