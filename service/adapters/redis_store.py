"""The Redis store: the only place state lives.

Durable, atomic, fenced primitives over redis-py, on one server, behind Sentinel or on a
Cluster (``service.urls.parse_redis_url`` reads which from the URL; ``redis_links`` carries
the commands). State and effects are opaque ``bytes``; the runtime decides what they mean.
Every write that depends on owning a shard runs as a Lua script (``*.lua`` beside this
module) that first compares the shard's lease with the caller's token, so a replica whose
lease expired or was taken can never write again (fencing). Every script touches one hash
slot: a shard's keys share the tag ``{s<N>}``, the ingress lease and its fence ``{ingress}``.

The hot path per batch is exactly three round trips: ``read_ingress``, ``load`` and
``commit`` (on a Cluster an idle read takes a second one, to block on one shard). Scripts
run via EVALSHA; they are loaded on every new connection (so a restarted Redis, a promoted
replica or a Cluster node is transparent) and, should they still be missing (``SCRIPT
FLUSH``), loaded and the refused calls retried once.

Replication is asynchronous, so a failover may lose the last writes the old master took.
With ``min_replicas`` > 0 every write the controller acts on (an event taken in before the
broker or an HTTP client is answered, a commit before its upstream messages and effects, a
lease before its fencing token is used, an effect's outcome) is followed, in the same
exchange, by ``WAIT min_replicas``; too few confirmations within the bound raise
``StoreUnavailable``, and the caller treats the write as not done. Reads whose content is
about to be acted on (unsent outbox and GM outbox entries, pending effect intents) end with
a barrier write and the same WAIT, so nothing a failover could take back goes out.

Library errors never leave this module: connection-level failures, a topology in motion
and unconfirmed writes become ``StoreUnavailable``, a fenced script ``LeaseLost``, anything
else ``PermanentError``.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import Connection
from redis.exceptions import NoScriptError, RedisClusterException, ResponseError
from redis.retry import Retry
from redis.sentinel import Sentinel

from service.adapters.redis_links import (
    ClusterLink,
    Confirm,
    Link,
    NotReplicated,
    Routed,
    SingleLink,
)
from service.errors import LeaseLost, PermanentError, StoreUnavailable
from service.keys import INGRESS_CONSUMER, INGRESS_GROUP, NUM_SHARDS, Keys, shard_of
from service.urls import RedisTarget, parse_redis_url

HISTORY_MAXLEN = 100
ROUNDS_MAXLEN = 50
DLQ_MAXLEN = 10_000
HEALTH_CHECK_INTERVAL_S = 30
#: How long a write waits for its replicas before it counts as not done.
WAIT_TIMEOUT_MS = 1_000
#: On a Cluster one blocking read cannot span shards (they live in different slots): an
#: idle read polls every owned shard, then blocks on one of them (in turn) this long.
CLUSTER_BLOCK_MS = 50
# Error replies that mean "the server cannot serve right now", not "the request is wrong".
_TRANSIENT_REPLIES = (
    "LOADING",
    "READONLY",
    "OOM",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "MASTERDOWN",
    "NOREPLICAS",
)
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
    #: upstream messages for the GM link, (id, envelope JSON), when a GM is configured
    gm: tuple[tuple[str, bytes], ...] = ()
    #: records of the job's rounds that ended, for its capped round history
    rounds: tuple[bytes, ...] = ()
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
    """One EVALSHA: a script with its keys and arguments (routed by its first key, every
    key of a call being in one hash slot)."""

    script: _Lua
    keys: tuple[str, ...]
    args: tuple[bytes | str | int, ...]

    def routed(self) -> Routed:
        return Routed(
            self.keys[0], ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)
        )


@contextlib.contextmanager
def _store_errors(what: str) -> Iterator[None]:
    """Translate redis-py errors into the service's at the adapter boundary."""
    try:
        yield
    except NotReplicated as e:
        raise StoreUnavailable(f"redis {what}: written, but {e}") from e
    except (redis.ConnectionError, redis.TimeoutError, RedisClusterException) as e:
        raise StoreUnavailable(f"redis {what}: {e}") from e
    except ResponseError as e:
        if str(e).startswith(_TRANSIENT_REPLIES):
            raise StoreUnavailable(f"redis {what}: {e}") from e
        raise PermanentError(f"redis {what}: {e}") from e
    except redis.RedisError as e:
        raise PermanentError(f"redis {what}: {e}") from e


def _checked(result: Any) -> Any:
    """A reply, or its error raised (a fenced script as ``LeaseLost``)."""
    if isinstance(result, ResponseError):
        if str(result).startswith("FENCED"):
            raise LeaseLost(str(result))
        raise result
    return result


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisStore:
    """Durable state, ingress, outbox, timers, effects and leases in Redis.

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
        self._socket_timeout_s = socket_timeout_s
        self._scripts = {name: _Lua.named(name) for name in _SCRIPT_NAMES}
        self._cluster = target.topology == "cluster"
        self._rotation = 0
        replicas = target.default_min_replicas if min_replicas is None else min_replicas
        # the WAIT must end well before the socket gives up on its reply
        timeout_ms = min(WAIT_TIMEOUT_MS, int(socket_timeout_s * 500))
        self._confirm = Confirm(replicas, timeout_ms) if replicas > 0 else None
        self._barrier = Confirm(replicas, timeout_ms, barrier=True) if replicas > 0 else None
        self._link = self._link_for(target)

    @property
    def min_replicas(self) -> int:
        return 0 if self._confirm is None else self._confirm.replicas

    def _link_for(self, target: RedisTarget) -> Link:
        timeouts: dict[str, Any] = {
            "socket_timeout": self._socket_timeout_s,
            "socket_connect_timeout": self._socket_timeout_s,
        }
        # no retries here: a retried EVALSHA after a timeout could apply twice; the runtime
        # retries whole operations above us
        no_retry = Retry(NoBackoff(), 0)
        if target.topology == "single":
            pool = redis.ConnectionPool.from_url(
                target.url,
                protocol=2,  # pinned: the reply shapes read below are RESP2's
                health_check_interval=HEALTH_CHECK_INTERVAL_S,
                retry=no_retry,
                redis_connect_func=self._on_connect,
                **timeouts,
            )
            return SingleLink(pool, self.keys.barrier)
        tls = _tls_kwargs(target)
        auth: dict[str, Any] = {"username": target.username, "password": target.password}
        if target.topology == "sentinel":
            # the URL's credentials are the data nodes'; sentinels are asked without them
            sentinel = Sentinel(list(target.hosts), sentinel_kwargs={**timeouts, **tls})
            master = sentinel.master_for(
                target.master,
                db=target.db,
                protocol=2,
                health_check_interval=HEALTH_CHECK_INTERVAL_S,
                retry=no_retry,
                redis_connect_func=self._on_connect,
                **timeouts,
                **auth,
                **tls,
            )
            close = sentinel.close  # type: ignore[attr-defined]  # (stubs predate it)
            return SingleLink(master.connection_pool, self.keys.barrier, close)

        def make() -> RedisCluster[bytes]:
            return RedisCluster(
                startup_nodes=[ClusterNode(host, port) for host, port in target.hosts],
                retry=no_retry,
                protocol=2,
                redis_connect_func=self._load_on,  # the cluster client does the handshake
                **timeouts,
                **auth,
                **tls,
            )

        return ClusterLink(make, self.keys.barrier)

    def _on_connect(self, connection: Connection) -> None:
        """Handshake, then load every script, so EVALSHA works on a fresh or restarted Redis."""
        connection.on_connect()
        self._load_on(connection)

    def _load_on(self, connection: Connection) -> None:
        for script in self._scripts.values():  # sent back to back: one round trip
            connection.send_command("SCRIPT", "LOAD", script.text)
        for _ in self._scripts:
            connection.read_response()

    def ping(self) -> bool:
        """Whether Redis answers now (for readiness), never raising."""
        try:
            self._run([Routed(None, ("PING",))], what="ping")
        except (StoreUnavailable, PermanentError):
            return False
        return True

    def close(self) -> None:
        self._link.close()

    # -- commands and scripts ----------------------------------------------------------

    def _run(
        self,
        commands: Sequence[Routed],
        *,
        what: str,
        atomic: bool = False,
        confirm: Confirm | None = None,
    ) -> list[Any]:
        """Commands in one round trip; replies as Redis sent them, error replies raised."""
        with _store_errors(what):
            return [_checked(r) for r in self._link.run(commands, atomic=atomic, confirm=confirm)]

    def _eval(
        self, calls: Sequence[_Call], *, what: str, confirm: Confirm | None = None
    ) -> list[Any]:
        """Run scripts in one round trip; the first error reply is raised (fenced: LeaseLost)."""
        with _store_errors(what):
            return [_checked(r) for r in self._eval_raw(calls, what=what, confirm=confirm)]

    def _eval_raw(
        self,
        calls: Sequence[_Call],
        *,
        what: str,
        atomic: bool = False,
        confirm: Confirm | None = None,
    ) -> list[Any]:
        """Run scripts in one round trip, replies as they came (errors as values); reload and
        retry once the calls refused NOSCRIPT."""
        with _store_errors(what):
            routed = [call.routed() for call in calls]
            results = self._link.run(routed, atomic=atomic, confirm=confirm)
            missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
            if missing:
                self._link.load_scripts([s.text for s in self._scripts.values()])
                retried = self._link.run(
                    [routed[i] for i in missing], atomic=atomic, confirm=confirm
                )
                for i, result in zip(missing, retried, strict=True):
                    results[i] = result
            return results

    # -- ingress -----------------------------------------------------------------------

    def ensure_groups(self) -> None:
        """Create every shard's ingress stream and consumer group (idempotent).

        The group starts at id 0 so entries appended before it existed are still delivered.
        """
        commands = [
            Routed(key, ("XGROUP", "CREATE", key, INGRESS_GROUP, "0", "MKSTREAM"))
            for key in map(self.keys.ingress, range(NUM_SHARDS))
        ]
        with _store_errors("ensure_groups"):
            for result in self._link.run(commands):
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
        """``append_ingress`` for (shard, event, dedupe, dup) items, in one round trip.

        Returns once the appends are durable: with replicas required, once they hold them
        (else ``StoreUnavailable``: some appends may have happened; retrying them as
        redeliveries, ``dup``, takes in exactly what did not)."""
        if not items:
            return []
        calls = [
            self._append_call(s, e, d, dup=dup, dedupe_ttl_ms=dedupe_ttl_ms, token=token)
            for s, e, d, dup in items
        ]
        results = self._eval(calls, what="append", confirm=self._confirm)
        return [None if r is None else _text(r) for r in results]

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
            streams = [self.keys.ingress(s) for s in group]
            blocking = ("BLOCK", block_ms) if block_ms > 0 else ()
            args = ("XREADGROUP", "GROUP", INGRESS_GROUP, INGRESS_CONSUMER, "COUNT", count)
            commands.append(
                Routed(streams[0], (*args, *blocking, "STREAMS", *streams, *[start] * len(group)))
            )
        with _store_errors("read_ingress"):
            replies = self._link.run(commands)
            if any(isinstance(r, ResponseError) and str(r).startswith("NOGROUP") for r in replies):
                self.ensure_groups()
                replies = self._link.run(commands)
            replies = [_checked(r) for r in replies]
        shard_by_key = {self.keys.ingress(s): s for group in groups for s in group}
        return [
            _ingress_entry(shard_by_key[_text(name)], entry_id, fields)
            for reply in replies
            for name, entries in reply or []
            for entry_id, fields in entries
        ]

    # -- state -------------------------------------------------------------------------

    def load(self, rkeys: Sequence[str]) -> dict[str, bytes | None]:
        """The opaque state of each resource (None: none), in one round trip."""
        if not rkeys:
            return {}
        keys = [self.keys.state(rkey) for rkey in rkeys]
        values = self._run([Routed(k, ("GET", k)) for k in keys], what="load")
        return dict(zip(rkeys, values, strict=True))

    def load_resource(self, rkey: str) -> bytes | None:
        """The resource's canonical JSON as stored by its last insert (kept compressed)."""
        key = self.keys.resource(rkey)
        [stored] = self._run([Routed(key, ("GET", key))], what="load_resource")
        return None if stored is None else zlib.decompress(stored)

    def list_rkeys(
        self, kind: str | None = None, shards: Sequence[int] = range(NUM_SHARDS)
    ) -> list[str]:
        """Every resource with state (of these shards), sorted; ``kind`` (``job``/``dataset``)
        filters."""
        keys = [self.keys.index(shard) for shard in shards]
        members = self._run([Routed(k, ("SMEMBERS", k)) for k in keys], what="list_rkeys")
        prefix = f"{kind}:" if kind else ""
        return sorted(
            rkey
            for shard_members in members
            for rkey in map(_text, shard_members)
            if rkey.startswith(prefix)
        )

    def history(self, rkey: str, count: int = 100) -> list[bytes]:
        """The newest ``count`` history records of a resource, oldest first."""
        key = self.keys.history(rkey)
        [records] = self._run([Routed(key, ("LRANGE", key, -count, -1))], what="history")
        return list(records)

    def rounds(self, rkey: str, count: int = ROUNDS_MAXLEN) -> list[bytes]:
        """The newest ``count`` round records of a job, oldest first."""
        key = self.keys.rounds(rkey)
        [records] = self._run([Routed(key, ("LRANGE", key, -count, -1))], what="rounds")
        return list(records)

    def commit(
        self, batches: Sequence[tuple[int, str, Sequence[Commit | Quarantine]]]
    ) -> list[list[list[str]] | LeaseLost]:
        """Apply (shard, token, commits) batches, every shard's in one round trip.

        Each commit is one script run, all-or-nothing, fenced by its shard's token. A
        shard's commits run as one MULTI/EXEC, so none of them writes when its lease is not
        held by its token (the lease cannot change inside the transaction). On one server
        every shard's commits share that one transaction; on a Cluster, which refuses a
        transaction across slots, each shard's is its own, pipelined per node. Nothing
        needs more: each commit carries its own resource's state, outbox, effects, history
        and the ingress entries it acknowledges, so two shards' commits never depend on
        each other, and a shard that committed while another was fenced is exactly what the
        next owner of the fenced one expects (its entries still pending, its effects and
        outbox in Redis for it to redo and send).

        Per batch, in order: the outbox stream ids of each commit's entries (for
        ``outbox_done`` after PUBACK), or ``LeaseLost`` when the shard's lease is not held
        by its token. With replicas required, returns only once they hold every commit,
        else raises ``StoreUnavailable`` (the commits' fate then unknown to the caller). A
        ``Quarantine`` has no outbox entries (its ids are empty); a commit that clears its
        resource's mark runs the quarantine script after the commit script, in the same
        transaction (same shard, same slot).
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
        if not calls:
            return [[] for _ in batches]
        results = self._eval_raw(calls, what="commit", atomic=True, confirm=self._confirm)
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
        if not shards:
            return {}
        keys = [self.keys.broken(shard) for shard in shards]
        replies = self._run([Routed(k, ("HGETALL", k)) for k in keys], what="quarantine_marks")
        return {
            shard: {_text(rkey): mark for rkey, mark in _fields(flat).items()}
            for shard, flat in zip(shards, replies, strict=True)
        }

    def quarantined(self) -> dict[str, bytes]:
        """Every quarantined resource and its mark (for `describe` and listings)."""
        marks = self.quarantine_marks(range(NUM_SHARDS))
        return dict(sorted((rkey, m) for shard in marks.values() for rkey, m in shard.items()))

    def quarantine_mark(self, rkey: str) -> bytes | None:
        """The resource's quarantine mark, or None when it is not quarantined."""
        key = self.keys.broken(shard_of(rkey))
        [mark] = self._run([Routed(key, ("HGET", key, rkey))], what="quarantine_mark")
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
            k.rounds(c.rkey),
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
            len(c.rounds),
            ROUNDS_MAXLEN,
            *c.ack_ids,
        ]
        for entry in c.outbox:
            args += [entry.id, entry.topic, entry.payload]
        for effect_id, intent in c.effects:
            args += [effect_id, intent]
        args += c.history
        for gm_id, payload in c.gm:
            args += [gm_id, payload]
        args += c.rounds
        return _Call(self._scripts["commit"], keys, tuple(args))

    # -- outbox ------------------------------------------------------------------------

    def outbox_read(
        self, shards: Sequence[int], count: int = 1000
    ) -> dict[int, list[tuple[str, OutboxEntry]]]:
        """Per shard, unpublished upstream messages, oldest first, with their stream ids; all
        shards in one round trip. With replicas required, only once they hold all of it."""
        if not shards:
            return {}
        keys = [self.keys.outbox(shard) for shard in shards]
        replies = self._run(
            [Routed(k, ("XRANGE", k, "-", "+", "COUNT", count)) for k in keys],
            what="outbox_read",
            confirm=self._barrier,
        )
        result: dict[int, list[tuple[str, OutboxEntry]]] = {}
        for shard, entries in zip(shards, replies, strict=True):
            result[shard] = []
            for entry_id, pairs in entries:
                f = _fields(pairs)
                entry = OutboxEntry(_text(f[b"id"]), _text(f[b"topic"]), f[b"payload"])
                result[shard].append((_text(entry_id), entry))
        return result

    def gm_outbox_read(
        self, shards: Sequence[int], count: int = 100
    ) -> dict[int, list[tuple[str, bytes]]]:
        """Per shard, upstream messages not yet sent to the GM, oldest first, as (stream id,
        envelope JSON); all shards in one round trip. With replicas required, only once they
        hold all of it."""
        if not shards:
            return {}
        keys = [self.keys.gm_outbox(shard) for shard in shards]
        replies = self._run(
            [Routed(k, ("XRANGE", k, "-", "+", "COUNT", count)) for k in keys],
            what="gm_outbox_read",
            confirm=self._barrier,
        )
        return {
            shard: [(_text(entry_id), _fields(pairs)[b"payload"]) for entry_id, pairs in entries]
            for shard, entries in zip(shards, replies, strict=True)
        }

    def gm_outbox_done(self, shard: int, stream_ids: Sequence[str]) -> None:
        """Forget messages the GM link sent."""
        if not stream_ids:
            return
        key = self.keys.gm_outbox(shard)
        self._run([Routed(key, ("XDEL", key, *stream_ids))], what="gm_outbox_done")

    def outbox_done(self, shard: int, stream_ids: Sequence[str]) -> None:
        """Forget published messages (after the broker's PUBACK)."""
        if not stream_ids:
            return
        key = self.keys.outbox(shard)
        self._run([Routed(key, ("XDEL", key, *stream_ids))], what="outbox_done")

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
        with _store_errors("fire_due_timers"):
            for shard, result in zip(shards, results, strict=True):
                try:
                    fired[shard] = int(_checked(result))
                except LeaseLost:
                    fired[shard] = None
        return fired

    def next_timer_ms(self, shard: int) -> int | None:
        """When the shard's earliest timer is due, or None without timers."""
        key = self.keys.timers(shard)
        [first] = self._run(
            [Routed(key, ("ZRANGE", key, 0, 0, "WITHSCORES"))], what="next_timer_ms"
        )
        return int(float(first[1])) if first else None

    # -- effects -----------------------------------------------------------------------

    def pending_effects(self, shards: Sequence[int]) -> dict[int, dict[str, bytes]]:
        """Per shard, the effect intents committed but not yet completed (a new owner redoes
        them), in one round trip. With replicas required, only once they hold all of it."""
        if not shards:
            return {}
        keys = [self.keys.effects(shard) for shard in shards]
        replies = self._run(
            [Routed(k, ("HGETALL", k)) for k in keys],
            what="pending_effects",
            confirm=self._barrier,
        )
        return {
            shard: {_text(effect_id): intent for effect_id, intent in _fields(flat).items()}
            for shard, flat in zip(shards, replies, strict=True)
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
        return bool(self._eval([call], what="complete_effect", confirm=self._confirm)[0])

    # -- leases ------------------------------------------------------------------------

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
        call = _Call(self._scripts["acquire"], (lease_key, fence_key), (replica, ttl_ms, floor_ms))
        try:
            with _store_errors("acquire"):
                token = _checked(self._eval_raw([call], what="acquire", confirm=self._confirm)[0])
        except StoreUnavailable as e:
            cause = e.__cause__
            if isinstance(cause, NotReplicated) and isinstance(cause.results[0], bytes):
                with contextlib.suppress(StoreUnavailable, PermanentError):
                    self.release(lease_key, _text(cause.results[0]))
            raise
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
        [token] = self._run([Routed(lease_key, ("GET", lease_key))], what="lease_holder")
        return None if token is None else _text(token)

    def mark_ingress_subscribed(self, token: str, ttl_ms: int) -> None:
        """Say that the ingress lease holder ``token`` has its subscription acknowledged,
        for ``ttl_ms`` (renewed with the lease, so it lapses with a dead holder)."""
        key = self.keys.ingress_subscribed()
        self._run([Routed(key, ("SET", key, token, "PX", ttl_ms))], what="mark_ingress_subscribed")

    def ingress_subscribed(self) -> bool:
        """Whether the current ingress lease holder said its subscription is acknowledged."""
        keys = (self.keys.ingress_lease(), self.keys.ingress_subscribed())  # one slot
        [(lease, marker)] = self._run([Routed(keys[0], ("MGET", *keys))], what="ingress_subscribed")
        return lease is not None and lease == marker

    # -- replicas ----------------------------------------------------------------------

    def heartbeat(self, replica: str, now_ms: int, ttl_ms: int) -> list[str]:
        """Announce ``replica`` alive until now+ttl; the live replicas, sorted."""
        key = self.keys.replicas()
        replies = self._run(
            [
                Routed(key, ("ZADD", key, now_ms + ttl_ms, replica)),
                Routed(key, ("ZREMRANGEBYSCORE", key, "-inf", now_ms)),
                Routed(key, ("ZRANGE", key, 0, -1)),
            ],
            what="heartbeat",
            atomic=True,
        )
        return sorted(map(_text, replies[-1]))

    def put_gm_link(self, status: bytes, ttl_ms: int) -> None:
        """Record the GM link's state (written by its holder, read by the CLI)."""
        key = self.keys.gm_link()
        self._run([Routed(key, ("SET", key, status, "PX", ttl_ms))], what="put_gm_link")

    def gm_link(self) -> bytes | None:
        key = self.keys.gm_link()
        [status] = self._run([Routed(key, ("GET", key))], what="gm_link")
        return None if status is None else bytes(status)

    def leave(self, replica: str) -> None:
        key = self.keys.replicas()
        self._run([Routed(key, ("ZREM", key, replica))], what="leave")

    # -- misc --------------------------------------------------------------------------

    def dead_letter(self, rejection: bytes, maxlen: int = DLQ_MAXLEN) -> None:
        """Keep a rejection for inspection; the stream is capped (approximately) at maxlen."""
        key = self.keys.dlq()
        command = ("XADD", key, "MAXLEN", "~", maxlen, "*", "r", rejection)
        self._run([Routed(key, command)], what="dead_letter")

    def dlq(self, count: int = 100) -> list[bytes]:
        """The newest ``count`` rejections, oldest first."""
        key = self.keys.dlq()
        command = ("XREVRANGE", key, "+", "-", "COUNT", count)
        [entries] = self._run([Routed(key, command)], what="dlq")
        return [_fields(pairs)[b"r"] for _, pairs in reversed(entries)]

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
        holder = self._eval([call], what="claim_output_dir", confirm=self._confirm)[0]
        return None if holder is None else _text(holder)

    def release_output_dir(self, output_dir: str, job_rkey: str) -> bool:
        """Give up a job's claim on an outputDir; False when the job did not hold it."""
        call = _Call(
            self._scripts["claim"],
            (self.keys.output_claim(output_dir),),
            ("release", job_rkey, 0, "", 0),
        )
        return bool(self._eval([call], what="release_output_dir", confirm=self._confirm)[0])

    def dataset_jobs_add(self, dataset: str, job_rkey: str) -> None:
        key = self.keys.dataset_jobs(dataset)
        self._run(
            [Routed(key, ("SADD", key, job_rkey))], what="dataset_jobs_add", confirm=self._confirm
        )

    def dataset_jobs_remove(self, dataset: str, job_rkey: str) -> None:
        key = self.keys.dataset_jobs(dataset)
        self._run(
            [Routed(key, ("SREM", key, job_rkey))],
            what="dataset_jobs_remove",
            confirm=self._confirm,
        )

    def dataset_jobs(self, dataset: str) -> list[str]:
        """Job rkeys using ``dataset`` (the dataset's rkey), sorted."""
        key = self.keys.dataset_jobs(dataset)
        [members] = self._run([Routed(key, ("SMEMBERS", key))], what="dataset_jobs")
        return sorted(map(_text, members))


def _tls_kwargs(target: RedisTarget) -> dict[str, Any]:
    """redis-py's TLS arguments for a Sentinel or Cluster target (none without TLS)."""
    if not target.tls:
        return {}
    return {"ssl": True, **dict(target.tls_options)}


def _fields(flat: list[bytes] | None) -> dict[bytes, bytes]:
    """A field/value list as Redis sends it (a stream entry, HGETALL) as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True)) if flat else {}


def _ingress_entry(shard: int, entry_id: bytes | str, pairs: list[bytes] | None) -> IngressEntry:
    """Decode one stream entry (its field/value list as Redis sent it; None for an entry
    deleted while pending); one without known fields yields neither event nor timer."""
    fields = _fields(pairs)
    due = fields.get(b"due")
    timer = fields.get(b"t")
    return IngressEntry(
        shard=shard,
        entry_id=_text(entry_id),
        event=fields.get(b"e"),
        timer_rkey=None if timer is None else _text(timer),
        timer_due_ms=None if due is None else int(float(due)),
    )
