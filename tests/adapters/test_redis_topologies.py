"""The store on a real Redis Cluster and behind real sentinels: every operation stays in one
slot, commits and reads span nodes, a write too few replicas confirmed is not done, and (in
`make soak`) failovers are transient outages after which every confirmed write is there."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from service.adapters.redis_store import Commit, OutboxEntry, RedisStore
from service.errors import LeaseLost, StoreUnavailable
from service.keys import NUM_SHARDS, Keys, rkey, shard_of
from tests.servers import (
    ClusterTopology,
    SentinelTopology,
    Server,
    cluster_topology,
    running_topology,
    sentinel_topology,
)

TTL_MS = 10_000
# one job per shard, so a call over every shard reaches every node of a cluster
JOBS = {shard_of(k): k for k in (rkey("job", "ns", f"j{i}") for i in range(400))}
assert len(JOBS) == NUM_SHARDS


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterTopology]:
    with running_topology(cluster_topology(tmp_path_factory.mktemp("cluster"))) as topology:
        yield topology


@pytest.fixture(scope="module")
def shared_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelTopology]:
    with running_topology(sentinel_topology(tmp_path_factory.mktemp("sentinel"))) as topology:
        yield topology


@contextlib.contextmanager
def store_on(url: str, prefix: str, **kw: int) -> Iterator[RedisStore]:
    store = RedisStore(url, Keys(prefix), socket_timeout_s=3.0, **kw)
    try:
        yield store
    finally:
        store.close()


def retried(what: str, call: object, timeout_s: float = 20) -> object:
    """Call until the store stops answering StoreUnavailable (a topology settling)."""
    assert callable(call)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def take_all(store: RedisStore, replica: str = "r1") -> dict[int, str]:
    tokens = {}
    for shard in range(NUM_SHARDS):
        token = store.leases.acquire(
            store.keys.lease(shard), store.keys.fence(shard), replica, TTL_MS
        )
        assert token is not None
        tokens[shard] = token
    return tokens


def round_trip_every_shard(store: RedisStore, tokens: dict[int, str], tag: str) -> None:
    """Append, read, commit (state, outbox, effect, history, timer) on every shard at once."""
    for shard in range(NUM_SHARDS):
        assert store.ingress.append(
            shard, f"{tag}-{shard}".encode(), dedupe=f"{tag}{shard}"
        )
    read = store.ingress.read(
        list(range(NUM_SHARDS)), count=100, block_ms=100, pending=False
    )
    assert sorted(e.event or b"" for e in read) == sorted(
        f"{tag}-{s}".encode() for s in range(NUM_SHARDS)
    )
    by_shard = {e.shard: e.entry_id for e in read}
    outcomes = store.states.commit(
        [
            (
                shard,
                tokens[shard],
                [
                    Commit(
                        JOBS[shard],
                        f"{tag}-state".encode(),
                        timer_due_ms=1,
                        ack_ids=(by_shard[shard],),
                        outbox=(OutboxEntry(f"{tag}-m{shard}", "up", b"{}"),),
                        effects=((f"{tag}-e{shard}", b"intent"),),
                        history=(tag.encode(),),
                    )
                ],
            )
            for shard in range(NUM_SHARDS)
        ]
    )
    assert all(isinstance(o, list) and len(o[0]) == 1 for o in outcomes), outcomes
    assert store.states.load(list(JOBS.values())) == {
        k: f"{tag}-state".encode() for k in JOBS.values()
    }
    assert (
        store.ingress.read(list(range(NUM_SHARDS)), count=100, block_ms=0, pending=True)
        == []
    )


def test_every_operation_on_a_cluster(shared_cluster: ClusterTopology) -> None:
    """Each call spans the three masters; a script whose keys crossed slots would be refused
    (CROSSSLOT), so every operation succeeding is the proof."""
    with store_on(shared_cluster.url, "ops") as store:
        store.ingress.ensure_groups()
        tokens = take_all(store)
        round_trip_every_shard(store, tokens, "a")

        assert len(store.states.list_rkeys("job")) == NUM_SHARDS
        assert store.states.history(JOBS[3]) == [b"a"]
        assert store.ingress.fire_due_timers(tokens, now_ms=10) == dict.fromkeys(
            range(NUM_SHARDS), 1
        )
        fired = store.ingress.read(
            list(range(NUM_SHARDS)), count=100, block_ms=0, pending=False
        )
        assert sorted(e.timer_rkey or "" for e in fired) == sorted(JOBS.values())
        outbox = store.outboxes.read(list(range(NUM_SHARDS)))
        assert {s: [e.id for _, e in entries] for s, entries in outbox.items()} == {
            s: [f"a-m{s}"] for s in range(NUM_SHARDS)
        }
        store.outboxes.done(
            {shard: [stream_id for stream_id, _ in entries] for shard, entries in outbox.items()}
        )
        assert store.outboxes.read([0, 7]) == {0: [], 7: []}
        effects = store.outboxes.pending_effects(list(range(NUM_SHARDS)))
        assert effects == {s: {f"a-e{s}": b"intent"} for s in range(NUM_SHARDS)}
        assert store.outboxes.complete_effect(5, tokens[5], "a-e5", b"result")
        assert not store.outboxes.complete_effect(5, tokens[5], "a-e5", b"result")
        [result] = store.ingress.read([5], count=10, block_ms=0, pending=False)
        assert result.event == b"result"

        lease, fence = store.keys.ingress_lease(), store.keys.ingress_fence()
        ingress = store.leases.acquire(lease, fence, "r1", TTL_MS)
        assert ingress is not None and store.leases.lease_holder(lease) == ingress
        assert not store.leases.ingress_subscribed()
        store.leases.mark_ingress_subscribed(ingress, TTL_MS)
        assert store.leases.ingress_subscribed()  # lease and marker read in one MGET, one slot
        assert store.leases.renew(lease, ingress, TTL_MS) and store.leases.release(lease, ingress)
        assert store.leases.heartbeat("r1", 1_000, TTL_MS) == ["r1"]
        assert store.leases.heartbeat("r2", 1_000, TTL_MS) == ["r1", "r2"]
        store.leases.leave("r2")
        assert store.leases.heartbeat("r1", 1_000, TTL_MS) == ["r1"]
        store.records.dead_letter(b"bad")
        assert store.records.dlq() == [b"bad"]
        store.records.dataset_jobs_add("ns/d", JOBS[1])
        store.records.dataset_jobs_add("ns/d", JOBS[2])
        store.records.dataset_jobs_remove("ns/d", JOBS[1])
        assert store.records.dataset_jobs("ns/d") == [JOBS[2]]
        assert store.ping()


def test_a_cluster_fences_each_shard_alone(shared_cluster: ClusterTopology) -> None:
    with store_on(shared_cluster.url, "fence") as store:
        tokens = take_all(store)
        outcomes = store.states.commit(
            [
                (shard, tokens[shard] + ("-stale" if shard == 9 else ""), [Commit(job, b"v")])
                for shard, job in JOBS.items()
            ]
        )
        assert [isinstance(o, LeaseLost) for o in outcomes] == [s == 9 for s in JOBS]
        assert store.states.load([JOBS[9], JOBS[10]]) == {JOBS[9]: None, JOBS[10]: b"v"}


def test_a_cluster_read_blocks_and_wakes(shared_cluster: ClusterTopology) -> None:
    with store_on(shared_cluster.url, "block") as store:
        store.ingress.ensure_groups()
        shards = list(range(NUM_SHARDS))
        started = time.monotonic()
        assert store.ingress.read(shards, count=10, block_ms=200, pending=False) == []
        assert time.monotonic() - started >= 0.04  # it waited rather than spin
        store.ingress.append(11, b"late")
        got = store.ingress.read(shards, count=10, block_ms=200, pending=False)
        assert [(e.shard, e.event) for e in got] == [(11, b"late")]


def test_flushed_scripts_are_reloaded_on_every_cluster_node(
    shared_cluster: ClusterTopology,
) -> None:
    with store_on(shared_cluster.url, "flush") as store:
        tokens = take_all(store)
        for node in shared_cluster.primaries():
            with redis.Redis(port=node.port) as raw:
                raw.script_flush()
        outcomes = store.states.commit([(s, tokens[s], [Commit(JOBS[s], b"x")]) for s in JOBS])
        assert all(isinstance(o, list) for o in outcomes)


@contextlib.contextmanager
def before_a_kill(url: str) -> Iterator[tuple[RedisStore, dict[int, str]]]:
    """A store on `url` with its groups made, every shard's lease taken and one round trip
    ("before") on every shard: what a master kill must not lose."""
    with store_on(url, "kill") as store:
        store.ingress.ensure_groups()
        tokens = take_all(store)
        round_trip_every_shard(store, tokens, "before")
        yield store, tokens


def all_there_after_the_failover(store: RedisStore, tokens: dict[int, str]) -> None:
    """What was confirmed by a replica before the kill is all there, and every shard takes a
    round trip again (its scripts loaded on the new master)."""
    loaded = retried("load", lambda: store.states.load(list(JOBS.values())))
    assert loaded == {k: b"before-state" for k in JOBS.values()}
    round_trip_every_shard(store, tokens, "after")


@pytest.mark.soak  # make test keeps one failover per kind: faults/test_redis_failover.py
def test_a_cluster_master_killed_is_an_outage_then_its_replica_serves(
    shared_cluster: ClusterTopology,
) -> None:
    with before_a_kill(shared_cluster.url) as (store, tokens):
        victim = shared_cluster.master_of(store.keys.ingress(4))
        victim.kill()
        with pytest.raises(StoreUnavailable):
            store.states.load([JOBS[4]])
        shared_cluster.wait_promoted(victim)
        victim.start()  # back as a replica of the promoted node
        shared_cluster.wait_healthy()
        all_there_after_the_failover(store, tokens)


@pytest.mark.soak  # as above
def test_a_sentinel_master_killed_is_an_outage_then_the_replica_serves(
    shared_sentinel: SentinelTopology,
) -> None:
    with before_a_kill(shared_sentinel.url) as (store, tokens):
        old = shared_sentinel.master()
        old.kill()
        with pytest.raises(StoreUnavailable):
            store.states.load([JOBS[4]])
        shared_sentinel.wait_promoted(old)
        shared_sentinel.restart_as_replica(old)
        shared_sentinel.wait_synced()
        all_there_after_the_failover(store, tokens)


@contextlib.contextmanager
def frozen(server: Server) -> Iterator[None]:
    server.freeze()
    try:
        yield
    finally:
        server.thaw()


def test_a_write_no_replica_confirms_is_not_done(shared_sentinel: SentinelTopology) -> None:
    with (
        store_on(shared_sentinel.url, "wait") as store,
        store_on(shared_sentinel.url, "wait", min_replicas=0) as hasty,
    ):
        assert store.min_replicas == 1 and hasty.min_replicas == 0
        store.ingress.ensure_groups()
        tokens = take_all(store)
        store.states.commit([(3, tokens[3], [Commit(JOBS[3], b"v1", effects=(("e", b"i"),))])])
        [replica] = [s for s in shared_sentinel.data if s is not shared_sentinel.master()]
        with frozen(replica):
            with pytest.raises(StoreUnavailable, match="replica"):
                store.ingress.append(3, b"unconfirmed")
            with pytest.raises(StoreUnavailable, match="replica"):
                store.states.commit([(3, tokens[3], [Commit(JOBS[3], b"v2")])])
            with pytest.raises(StoreUnavailable, match="replica"):
                store.outboxes.pending_effects([3])  # nothing is acted on before replicas hold it
            with pytest.raises(StoreUnavailable, match="replica"):
                store.outboxes.read([3])
            lease, fence = store.keys.ingress_lease(), store.keys.ingress_fence()
            with pytest.raises(StoreUnavailable, match="replica"):
                store.leases.acquire(lease, fence, "r1", TTL_MS)
            assert store.leases.lease_holder(lease) is None  # the unconfirmed lease was given back
            assert hasty.ingress.append(3, b"hasty") is not None  # 0 required: not waited
        shared_sentinel.wait_synced()
        assert store.states.commit([(3, tokens[3], [Commit(JOBS[3], b"v3")])]) == [[[]]]
        assert store.outboxes.pending_effects([3]) == {3: {"e": b"i"}}


def test_cluster_waits_on_the_node_that_took_the_write(shared_cluster: ClusterTopology) -> None:
    """WAIT goes to each written node: a write whose master's replica is frozen is not done,
    while a write to another master in the same call's neighbourhood goes through."""
    with store_on(shared_cluster.url, "node-wait") as store:
        store.ingress.ensure_groups()
        slow_master = shared_cluster.master_of(store.keys.ingress(2))
        other = next(
            s for s in range(NUM_SHARDS)
            if shared_cluster.master_of(store.keys.ingress(s)) is not slow_master
        )  # fmt: skip
        replica = replica_of(shared_cluster, slow_master)
        with frozen(replica):
            assert store.ingress.append(other, b"fine") is not None
            with pytest.raises(StoreUnavailable, match="replica"):
                store.ingress.append(2, b"unconfirmed")
            for items in ([(other, b"a", None, False), (2, b"b", None, False)],
                          [(2, b"c", None, False), (other, b"d", None, False)]):  # fmt: skip
                with pytest.raises(StoreUnavailable, match="replica"):
                    store.ingress.append_many(items)  # one call, two nodes: each node's WAIT counts
        shared_cluster.wait_healthy()


def replica_of(topology: ClusterTopology, master: Server) -> Server:
    with redis.Redis(port=master.port, decode_responses=True) as raw:
        info = raw.info("replication")
    port = int(info["slave0"]["port"])
    return next(n for n in topology.nodes if n.port == port)


def test_topology_fixtures_stop_every_process(tmp_path: Path) -> None:
    topology = sentinel_topology(tmp_path / "s")
    with running_topology(topology):
        procs = [s.proc for s in [*topology.data, *topology.sentinels]]
    assert all(p is not None and p.poll() is not None for p in procs)
