"""Pure parts of reaching a Redis Cluster: every script's keys share one hash slot, barriers
land in their key's slot, and one exchange's wire format (transactions, WAIT) and replies."""

from __future__ import annotations

import pytest
from redis.crc import key_slot
from redis.exceptions import NoScriptError, ResponseError

from service.adapters.redis_link import Confirm, Routed, _Exchange
from service.keys import NUM_SHARDS, Keys, hash_tag, rkey, shard_of

KEYS = Keys("site-a:lifelong")
RKEYS = [rkey(kind, "ns", f"r{i}") for kind in ("job", "dataset") for i in range(100)]


def slot(key: str) -> int:
    return int(key_slot(key.encode()))


def script_key_sets() -> list[tuple[str, ...]]:
    """The keys each Lua script is called with, for every shard and many resources."""
    k = KEYS
    sets: list[tuple[str, ...]] = []
    for resource in RKEYS:
        s = shard_of(resource)
        sets.append(  # commit.lua
            (k.lease(s), k.state(resource), k.resource(resource), k.history(resource),
             k.timers(s), k.effects(s), k.index(s), k.outbox(s), k.ingress(s))
        )  # fmt: skip
    for s in range(NUM_SHARDS):
        sets.append((k.ingress(s), k.seen(s, "sedna/n/workers/w/info\0{payload}")))  # append
        sets.append((k.lease(s), k.timers(s), k.ingress(s)))  # fire_timers
        sets.append((k.lease(s), k.effects(s), k.ingress(s)))  # complete_effect
        sets.append((k.lease(s), k.fence(s)))  # acquire
    sets.append((k.ingress_lease(), k.ingress_fence()))  # acquire of the ingress lease
    sets.append((k.ingress_lease(), k.ingress_subscribed()))  # one MGET
    return sets


def test_every_script_touches_one_slot() -> None:
    for keys in script_key_sets():
        assert len({slot(key) for key in keys}) == 1, keys


def test_shards_spread_over_slots() -> None:
    """Different shards hash to different slots, so a Cluster spreads them over its nodes."""
    assert len({slot(KEYS.ingress(s)) for s in range(NUM_SHARDS)}) == NUM_SHARDS


def test_a_barrier_shares_its_keys_slot() -> None:
    families = [key for keys in script_key_sets() for key in keys]
    families += [KEYS.replicas(), KEYS.dlq(), KEYS.dataset_jobs("ns/{odd}name")]
    for key in families:
        assert slot(KEYS.barrier(key)) == slot(key), key
        assert KEYS.barrier(key).startswith("site-a:lifelong:{")


@pytest.mark.parametrize(
    ("key", "tag"),
    [
        ("p:{s3}:ingress", "s3"),
        ("p:{ingress}-lease", "ingress"),
        ("p:replicas", "p:replicas"),
        ("p:{}:x", "p:{}:x"),  # an empty tag hashes the whole key
        ("p:{a}{b}", "a"),
        ("p:{unclosed", "p:{unclosed"),
    ],
)
def test_hash_tag_follows_redis_rules(key: str, tag: str) -> None:
    assert hash_tag(key) == tag
    assert slot(key) == slot(tag)


# -- one exchange -----------------------------------------------------------------------


def commands(n: int) -> list[Routed]:
    return [Routed(f"k{i}", ("SET", f"k{i}", i)) for i in range(n)]


def test_atomic_groups_become_transactions_and_wait_follows_them() -> None:
    exchange = _Exchange([[0, 1], [2]], atomic=True, confirm=Confirm(1, 500), barrier_key="b")
    assert exchange.wire(commands(3)) == [
        ("MULTI",),
        ("SET", "k0", 0),
        ("SET", "k1", 1),
        ("EXEC",),
        ("SET", "k2", 2),  # a group of one needs no transaction
        ("WAIT", 1, 500),
    ]
    results: list[object] = [None] * 3
    replies: list[object] = [b"OK", b"QUEUED", b"QUEUED", [b"OK", b"OK"], b"OK", 1]
    exchange.unpack(replies, results)
    assert results == [b"OK", b"OK", b"OK"]
    assert exchange.shortfall(replies) is None


def test_a_barrier_write_comes_after_the_reads() -> None:
    exchange = _Exchange([[0]], atomic=False, confirm=Confirm(2, 100, True), barrier_key="b")
    wire = exchange.wire([Routed("k", ("HGETALL", "k"))])
    assert wire[0] == ("HGETALL", "k")
    assert wire[1][:2] == ("SET", "b")
    assert wire[2] == ("WAIT", 2, 100)


def test_an_aborted_transaction_reports_why_for_each_command() -> None:
    exchange = _Exchange([[0, 1]], atomic=True, confirm=None, barrier_key="b")
    refused = NoScriptError("NOSCRIPT No matching script")
    aborted = ResponseError("EXECABORT Transaction discarded")
    results: list[object] = [None, None]
    exchange.unpack([b"OK", b"QUEUED", refused, aborted], results)
    assert results == [aborted, refused]


def test_too_few_replicas_is_a_shortfall() -> None:
    exchange = _Exchange([[0]], atomic=False, confirm=Confirm(2, 100), barrier_key="b")
    short = exchange.shortfall([b"OK", 1])
    assert short is not None and short.confirmed == 1
    assert "only 1 of 2 replica(s)" in str(short)
    error = ResponseError("ERR WAIT cannot be used with replica instances")
    assert exchange.shortfall([b"OK", error]) is not None
    assert _Exchange([[0]], False, None, "b").shortfall([b"OK"]) is None
