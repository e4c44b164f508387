"""Resource state: reads, and the fenced commit that writes one transition's all.

A commit writes a resource's state, stored resource, timer, history, round records, outbox
and GM outbox entries and effect intents, and acknowledges the ingress entries it applied,
in one Lua script that first checks the shard's lease token. Quarantine marks, set and
cleared in the same transactions, are read here too.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from service.adapters.redis_links import Routed
from service.adapters.redis_store.calls import (
    Call,
    Commands,
    as_str,
    checked,
    field_map,
    store_errors,
)
from service.adapters.redis_store.values import Commit, Quarantine
from service.errors import LeaseLost
from service.keys import INGRESS_GROUP, NUM_SHARDS, shard_of

HISTORY_MAXLEN = 100
ROUNDS_MAXLEN = 50


class States:
    """Reads resources' state and commits transitions, fenced by the shard's lease."""

    def __init__(self, redis: Commands) -> None:
        self._redis = redis
        self._keys = redis.keys

    def load(self, rkeys: Sequence[str]) -> dict[str, bytes | None]:
        """The opaque state of each resource (None: none), in one round trip."""
        if not rkeys:
            return {}
        keys = [self._keys.state(rkey) for rkey in rkeys]
        values = self._redis.run([Routed(k, ("GET", k)) for k in keys], what="load")
        return dict(zip(rkeys, values, strict=True))

    def load_resource(self, rkey: str) -> bytes | None:
        """The resource's canonical JSON as stored by its last insert (kept compressed)."""
        key = self._keys.resource(rkey)
        [stored] = self._redis.run([Routed(key, ("GET", key))], what="load_resource")
        return None if stored is None else zlib.decompress(stored)

    def list_rkeys(self, kind: str | None, shards: Sequence[int]) -> list[str]:
        """Every resource with state (of these shards), sorted; ``kind`` (a resource key's
        kind: ``job``, ``dataset``, ``model``...) filters."""
        keys = [self._keys.index(shard) for shard in shards]
        members = self._redis.run([Routed(k, ("SMEMBERS", k)) for k in keys], what="list_rkeys")
        prefix = f"{kind}:" if kind else ""
        return sorted(
            rkey
            for shard_members in members
            for rkey in map(as_str, shard_members)
            if rkey.startswith(prefix)
        )

    def history(self, rkey: str, count: int) -> list[bytes]:
        """The newest ``count`` history records of a resource, oldest first."""
        key = self._keys.history(rkey)
        [records] = self._redis.run([Routed(key, ("LRANGE", key, -count, -1))], what="history")
        return list(records)

    def rounds(self, rkey: str, count: int) -> list[bytes]:
        """The newest ``count`` round records of a job, oldest first."""
        key = self._keys.rounds(rkey)
        [records] = self._redis.run([Routed(key, ("LRANGE", key, -count, -1))], what="rounds")
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
        calls: list[Call] = []
        plans: list[tuple[int, int, list[int]]] = []  # per batch: its calls, each commit's first
        for shard, token, commits in batches:
            start, firsts = len(calls), []
            for c in commits:
                firsts.append(len(calls) - start)
                calls.extend(self._commit_calls(shard, token, c))
            plans.append((start, len(calls), firsts))
        if not calls:
            return [[] for _ in batches]
        results = self._redis.eval_raw(
            calls, what="commit", atomic=True, confirm=self._redis.confirm
        )
        with store_errors("commit"):
            return [_outcome(results[start:end], firsts) for start, end, firsts in plans]

    def _commit_calls(self, shard: int, token: str, c: Commit | Quarantine) -> list[Call]:
        if c.rkey is not None and shard_of(c.rkey) != shard:
            raise ValueError(f"{c.rkey} belongs to shard {shard_of(c.rkey)}, not {shard}")
        if isinstance(c, Quarantine):
            return [self._quarantine_call(shard, token, c)]
        calls = [self._commit_call(shard, token, c)]
        if c.clear_mark:
            calls.append(self._quarantine_call(shard, token, Quarantine(c.rkey, ()), clear=True))
        return calls

    def _commit_call(self, shard: int, token: str, c: Commit) -> Call:
        k = self._keys
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
        return self._redis.call("commit", keys, tuple(args))

    def _quarantine_call(
        self, shard: int, token: str, q: Quarantine, *, clear: bool = False
    ) -> Call:
        k = self._keys
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
        keys = [self._keys.broken(shard) for shard in shards]
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
        key = self._keys.broken(shard_of(rkey))
        [mark] = self._redis.run([Routed(key, ("HGET", key, rkey))], what="quarantine_mark")
        return None if mark is None else bytes(mark)


def _outcome(results: list[Any], firsts: list[int]) -> list[list[str]] | LeaseLost:
    """One batch's outcome from its replies: the outbox stream ids of each commit (whose
    first reply is at ``firsts``), or ``LeaseLost`` when the shard's lease is not held."""
    try:
        replies = [checked(r) for r in results]
    except LeaseLost as e:
        return e
    return [[as_str(i) for i in replies[f]] if isinstance(replies[f], list) else [] for f in firsts]
