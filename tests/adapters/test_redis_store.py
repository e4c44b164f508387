"""The Redis store against a real redis-server: atomic, fenced, exactly-once primitives."""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence

import pytest
import redis

from service.adapters.redis_store import Commit, Known, Markers, OutboxEntry, RedisStore
from service.errors import LeaseLost, StoreUnavailable
from service.keys import INGRESS_GROUP, NUM_SHARDS, Keys, rkey, shard_of
from tests.servers import Server
from tests.wait import wait_until

JOB = rkey("job", "default", "fruits")
SHARD = shard_of(JOB)
TTL_MS = 10_000


def commit(store: RedisStore, shard: int, token: str, commits: Sequence[Commit]) -> list[list[str]]:
    """One shard's batch through the store's multi-shard commit; LeaseLost raised."""
    [outcome] = store.states.commit([(shard, token, commits)])
    if isinstance(outcome, LeaseLost):
        raise outcome
    return outcome


def url_of(server: Server) -> str:
    return f"redis://127.0.0.1:{server.port}/0"


@pytest.fixture
def store(redis_proc: Server) -> Iterator[RedisStore]:
    s = RedisStore(url_of(redis_proc), Keys("t"), socket_timeout_s=2.0)
    s.ingress.ensure_groups()
    yield s
    s.close()


def take_shard(
    store: RedisStore, shard: int = SHARD, replica: str = "r1", ttl_ms: int = TTL_MS
) -> str:
    token = store.leases.acquire(store.keys.lease(shard), store.keys.fence(shard), replica, ttl_ms)
    assert token is not None
    return token


def lapsed(store: RedisStore, shard: int) -> None:
    """Until the shard's lease has expired in Redis (no one holds it)."""
    lease = store.keys.lease(shard)
    wait_until(
        lambda: store.leases.lease_holder(lease) is None,
        10,
        f"the lease of shard {shard} to expire",
    )


def appended(store: RedisStore, event: bytes, shard: int = SHARD) -> str:
    entry_id = store.ingress.append(shard, event)
    assert entry_id is not None
    return entry_id


def pending_ids(raw: redis.Redis[bytes], store: RedisStore, shard: int = SHARD) -> set[str]:
    rows = raw.xpending_range(store.keys.ingress(shard), INGRESS_GROUP, "-", "+", 100)
    return {row["message_id"].decode() for row in rows}


def full_commit(ack_ids: tuple[str, ...] = ()) -> Commit:
    return Commit(
        JOB,
        b"state-1",
        resource=b'{"kind":"LifelongLearningJob"}',
        timer_due_ms=5_000,
        ack_ids=ack_ids,
        outbox=(OutboxEntry("m-1", "sedna/n/upstream", b'{"a":1}'),),
        effects=(("e-1", b"write samples"),),
        history=(b"h-1", b"h-2"),
        rounds=(b"r-1",),
    )


# -- keys ------------------------------------------------------------------------------


def hash_tag(key: str) -> str:
    start = key.index("{")
    return key[start + 1 : key.index("}", start)]


def test_shard_of_is_crc32_and_every_key_of_a_resource_shares_its_shard_slot() -> None:
    keys = Keys("p")
    assert shard_of(JOB) == zlib.crc32(JOB.encode()) % NUM_SHARDS
    per_resource = [keys.state(JOB), keys.resource(JOB), keys.history(JOB), keys.rounds(JOB)]
    per_shard = [
        keys.ingress(SHARD),
        keys.outbox(SHARD),
        keys.timers(SHARD),
        keys.effects(SHARD),
        keys.index(SHARD),
        keys.lease(SHARD),
        keys.fence(SHARD),
        keys.seen(SHARD, "x/y z"),
    ]
    assert {hash_tag(k) for k in per_resource + per_shard} == {f"s{SHARD}"}
    assert all(k.startswith("p:") for k in per_resource + per_shard)
    assert hash_tag(keys.ingress_lease()) == hash_tag(keys.ingress_fence())
    assert keys.state(JOB) == f"p:{{s{SHARD}}}:state:{JOB}"
    with pytest.raises(ValueError):
        keys.ingress(NUM_SHARDS)


# -- commit ----------------------------------------------------------------------------


def test_commit_writes_everything_and_acks_exactly_its_entries(
    store: RedisStore, raw: redis.Redis[bytes]
) -> None:
    token = take_shard(store)
    ids = [appended(store, f"ev-{i}".encode()) for i in range(3)]
    read = store.ingress.read([SHARD], count=10, block_ms=100, pending=False)
    assert [e.entry_id for e in read] == ids
    assert [e.event for e in read] == [b"ev-0", b"ev-1", b"ev-2"]
    assert pending_ids(raw, store) == set(ids)

    commit(store, SHARD, token, [full_commit(ack_ids=(ids[0], ids[1]))])

    assert pending_ids(raw, store) == {ids[2]}
    assert store.states.load([JOB]) == {JOB: b"state-1"}
    assert store.states.load_resource(JOB) == b'{"kind":"LifelongLearningJob"}'
    assert store.states.list_rkeys() == [JOB]
    assert store.states.list_rkeys("job") == [JOB]
    assert store.states.list_rkeys("dataset") == []
    assert store.ingress.next_timer_ms(SHARD) == 5_000
    assert store.outboxes.pending_effects([SHARD])[SHARD] == {"e-1": b"write samples"}
    assert store.states.history(JOB) == [b"h-1", b"h-2"]
    assert store.states.rounds(JOB) == [b"r-1"]
    [(stream_id, entry)] = store.outboxes.read([SHARD])[SHARD]
    assert entry == OutboxEntry("m-1", "sedna/n/upstream", b'{"a":1}')
    store.outboxes.done({SHARD: [stream_id]})
    assert store.outboxes.read([SHARD])[SHARD] == []


def test_outbox_read_leaves_out_a_span_and_done_deletes_every_shards_at_once(
    store: RedisStore,
) -> None:
    """The sweep skips the stream ids a publisher holds in flight: what lies before the span
    and after it is read, the span's own ends and all between are not."""
    token = take_shard(store)
    other = next(s for s in range(NUM_SHARDS) if s != SHARD)
    other_token = take_shard(store, other)
    entries = [OutboxEntry(f"m-{i}", "sedna/n/upstream", b"{}") for i in range(6)]
    [ids] = commit(store, SHARD, token, [Commit(JOB, b"s", outbox=tuple(entries))])
    other_job = next(
        rkey("job", "default", f"j{i}") for i in range(1000)
        if shard_of(rkey("job", "default", f"j{i}")) == other
    )  # fmt: skip
    [other_ids] = commit(store, other, other_token, [Commit(other_job, b"s", outbox=entries[:2])])
    read = store.outboxes.read([SHARD, other], skip={SHARD: (ids[1], ids[3])})
    assert [stream_id for stream_id, _ in read[SHARD]] == [ids[0], ids[4], ids[5]]
    assert [stream_id for stream_id, _ in read[other]] == other_ids
    assert store.outboxes.read([SHARD], skip={SHARD: (ids[0], ids[5])}) == {SHARD: []}
    store.outboxes.done({SHARD: ids[:5], other: other_ids})
    assert [i for i, _ in store.outboxes.read([SHARD, other])[SHARD]] == [ids[5]]
    assert store.outboxes.read([other]) == {other: []}


def test_keep_state_leaves_state_and_timer_cancel(
    store: RedisStore, raw: redis.Redis[bytes]
) -> None:
    token = take_shard(store)
    commit(store, SHARD, token, [full_commit()])
    entry_id = appended(store, b"rejected")
    store.ingress.read([SHARD], count=10, block_ms=0, pending=False)
    commit(
        store,
        SHARD,
        token,
        [Commit(JOB, None, keep_state=True, timer_due_ms=-1, ack_ids=(entry_id,))],
    )
    assert store.states.load([JOB]) == {JOB: b"state-1"}
    assert store.ingress.next_timer_ms(SHARD) is None
    assert pending_ids(raw, store) == set()


def test_delete_removes_everything_of_the_resource(store: RedisStore) -> None:
    token = take_shard(store)
    commit(store, SHARD, token, [full_commit()])
    commit(store, SHARD, token, [Commit(JOB, None, delete=True)])
    assert store.states.load([JOB]) == {JOB: None}
    assert store.states.load_resource(JOB) is None
    assert store.states.list_rkeys() == []
    assert store.ingress.next_timer_ms(SHARD) is None
    assert store.states.history(JOB) == []
    assert store.states.rounds(JOB) == []


def test_commit_with_stale_token_writes_nothing(store: RedisStore, raw: redis.Redis[bytes]) -> None:
    token = take_shard(store)
    entry_id = appended(store, b"ev")
    store.ingress.read([SHARD], count=10, block_ms=0, pending=False)
    other = rkey("job", "default", "other")
    batch = [full_commit(ack_ids=(entry_id,))]
    batch += [Commit(other, b"x")] if shard_of(other) == SHARD else []
    with pytest.raises(LeaseLost):
        commit(store, SHARD, token + "0", batch)
    assert store.states.load([JOB, other]) == {JOB: None, other: None}
    assert store.outboxes.read([SHARD])[SHARD] == []
    assert store.outboxes.pending_effects([SHARD])[SHARD] == {}
    assert store.ingress.next_timer_ms(SHARD) is None
    assert store.states.history(JOB) == []
    assert store.states.rounds(JOB) == []
    assert pending_ids(raw, store) == {entry_id}


def test_commit_of_a_batch_is_one_transaction(store: RedisStore) -> None:
    token = take_shard(store)
    rkeys = [k for k in (rkey("job", "ns", f"j{i}") for i in range(200)) if shard_of(k) == SHARD]
    commit(store, SHARD, token, [Commit(k, k.encode(), timer_due_ms=7) for k in rkeys])
    assert store.states.load(rkeys) == {k: k.encode() for k in rkeys}
    assert store.states.list_rkeys("job") == sorted(rkeys)


def calls_of(raw: redis.Redis[bytes]) -> dict[str, int]:
    """Commands run since the last CONFIG RESETSTAT, by name (those inside scripts too), but
    for the reset and this reading."""
    stats = raw.info("commandstats")
    calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()}
    return {k: n for k, n in calls.items() if k not in ("info", "config|resetstat")}


def test_a_shards_commits_are_one_script_run_writing_only_what_changed(
    store: RedisStore, raw: redis.Redis[bytes]
) -> None:
    """One lease check and one acknowledgement for all of a shard's commits; a kept state is
    not rewritten nor re-indexed, and a capped list is trimmed only once it outgrew its cap."""
    token = take_shard(store)
    rkeys = [k for k in (rkey("job", "ns", f"j{i}") for i in range(100)) if shard_of(k) == SHARD]
    rkeys = rkeys[:3]
    commit(store, SHARD, token, [Commit(k, b"s-" + k.encode()) for k in rkeys])
    ids = [appended(store, f"ev-{i}".encode()) for i in range(3)]
    store.ingress.read([SHARD], count=10, block_ms=0, pending=False)
    raw.config_resetstat()
    outbox = (OutboxEntry("m", "t", b"p"),)
    kept = [
        Commit(k, None, keep_state=True, ack_ids=(i,), outbox=outbox, history=(b"h1", b"h2"))
        for k, i in zip(rkeys, ids, strict=True)
    ]
    per_commit = commit(store, SHARD, token, kept)
    assert [len(stream_ids) for stream_ids in per_commit] == [1, 1, 1]
    calls = calls_of(raw)
    assert calls == {"evalsha": 1, "get": 1, "xack": 1, "xdel": 1, "xadd": 3, "rpush": 3}
    assert store.states.load(rkeys) == {k: b"s-" + k.encode() for k in rkeys}
    assert pending_ids(raw, store) == set()
    assert store.states.list_rkeys("job") == sorted(rkeys)


def test_commit_refuses_a_resource_of_another_shard(store: RedisStore) -> None:
    token = take_shard(store)
    with pytest.raises(ValueError):
        commit(store, (SHARD + 1) % NUM_SHARDS, token, [Commit(JOB, b"x")])
    with pytest.raises(ValueError):
        Commit(JOB, None)
    with pytest.raises(ValueError):
        Commit(JOB, b"x", delete=True)


def test_expired_lease_fences_the_old_owner(store: RedisStore) -> None:
    old = take_shard(store, replica="r1", ttl_ms=200)
    commit(store, SHARD, old, [Commit(JOB, b"v1", effects=(("e", b"i"),))])
    lapsed(store, SHARD)
    with pytest.raises(LeaseLost):  # expired, not yet taken: still refused
        commit(store, SHARD, old, [Commit(JOB, b"zombie")])
    new = take_shard(store, replica="r2")
    assert int(new.rsplit(":", 1)[1]) > int(old.rsplit(":", 1)[1])
    with pytest.raises(LeaseLost):
        commit(store, SHARD, old, [Commit(JOB, b"zombie")])
    assert store.ingress.fire_due_timers({SHARD: old}, now_ms=10**13) == {SHARD: None}
    with pytest.raises(LeaseLost):
        store.outboxes.complete_effect(SHARD, old, "e", b"done")
    assert not store.leases.renew(store.keys.lease(SHARD), old, TTL_MS)
    assert store.states.load([JOB]) == {JOB: b"v1"}
    commit(store, SHARD, new, [Commit(JOB, b"v2")])
    assert store.states.load([JOB]) == {JOB: b"v2"}


def test_one_round_trip_commits_several_shards_and_fences_each_alone(
    store: RedisStore,
) -> None:
    """A fenced shard's commits write nothing; the other shards' in the same call go through."""
    jobs = {shard_of(k): k for k in (rkey("job", "ns", f"m{i}") for i in range(200))}
    held, lost = sorted(jobs)[:2]
    token = take_shard(store, held)
    stale = take_shard(store, lost, ttl_ms=100)
    lapsed(store, lost)
    take_shard(store, lost, replica="r2")
    outbox = (OutboxEntry("m-1", "sedna/n/upstream", b"{}"),)
    outcomes = store.states.commit(
        [
            (lost, stale, [Commit(jobs[lost], b"zombie")]),
            (held, token, [Commit(jobs[held], b"kept", outbox=outbox)]),
        ]
    )
    assert isinstance(outcomes[0], LeaseLost)
    assert isinstance(outcomes[1], list) and len(outcomes[1][0]) == 1
    assert store.states.load([jobs[held], jobs[lost]]) == {jobs[held]: b"kept", jobs[lost]: None}
    assert store.states.commit([]) == []


# -- ingress ---------------------------------------------------------------------------


def test_new_owner_reads_the_previous_owners_unacked_entries(
    store: RedisStore, redis_proc: Server
) -> None:
    old = take_shard(store, replica="r1", ttl_ms=200)
    ids = [appended(store, f"ev-{i}".encode()) for i in range(3)]
    assert len(store.ingress.read([SHARD], count=10, block_ms=0, pending=False)) == 3
    commit(store, SHARD, old, [Commit(JOB, b"v1", ack_ids=(ids[0],))])
    lapsed(store, SHARD)

    successor = RedisStore(url_of(redis_proc), Keys("t"))
    try:
        take_shard(successor, replica="r2")
        pending = successor.ingress.read([SHARD], count=10, block_ms=0, pending=True)
        assert [(e.entry_id, e.event) for e in pending] == [(ids[1], b"ev-1"), (ids[2], b"ev-2")]
        assert successor.ingress.read([SHARD], count=10, block_ms=50, pending=False) == []
    finally:
        successor.close()


def test_read_ingress_spans_shards_and_blocks_until_an_entry(store: RedisStore) -> None:
    a, b = SHARD, (SHARD + 1) % NUM_SHARDS
    store.ingress.append(b, b"on-b")
    got = store.ingress.read([a, b], count=10, block_ms=100, pending=False)
    assert [(e.shard, e.event) for e in got] == [(b, b"on-b")]
    start = time.monotonic()
    assert store.ingress.read([a, b], count=10, block_ms=200, pending=False) == []
    assert time.monotonic() - start >= 0.15
    with pytest.raises(ValueError):
        store.ingress.read([a], count=1, block_ms=5_000, pending=False)


def test_gm_outbox_wait_ends_when_a_message_is_or_becomes_there(
    redis_proc: Server, raw: redis.Redis[bytes]
) -> None:
    """The wait ends at once while a message waits, and when another client adds one, long
    before its block (a minute here) would end it."""
    store = RedisStore(url_of(redis_proc), Keys("t"), socket_timeout_s=120.0)
    waiter = threading.Thread(
        target=store.outboxes.wait_gm, args=(range(NUM_SHARDS), 60_000), daemon=True
    )
    try:
        waiter.start()
        wait_until(lambda: any(c.get("cmd") == "xread" for c in raw.client_list()), 10,
                   "the blocked read")  # fmt: skip
        raw.xadd(store.keys.gm_outbox(SHARD), {"payload": b"{}"})
        waiter.join(30)
        assert not waiter.is_alive(), "a new message ends the wait"
        # one waits: returns at once
        assert store.outboxes.wait_gm(range(NUM_SHARDS), 60_000)
    finally:
        store.close()


def test_append_ingress_dedupe(store: RedisStore, raw: redis.Redis[bytes]) -> None:
    first = store.ingress.append(SHARD, b"m", dedupe="mid-1")
    assert first is not None
    assert store.ingress.append(SHARD, b"m", dedupe="mid-1", dup=True) is None
    assert store.ingress.append(SHARD, b"m", dedupe="mid-1", dup=False) is not None
    assert store.ingress.append(SHARD, b"m", dedupe="mid-2", dup=True) is not None
    assert store.ingress.append(SHARD, b"m", dup=True) is not None  # no key: no dedupe
    # the marker expires
    assert store.ingress.append(SHARD, b"n", dedupe="mid-3", dedupe_ttl_ms=50) is not None
    seen = store.keys.seen(SHARD, "mid-3")
    wait_until(lambda: not raw.exists(seen), 10, "the dedupe marker of mid-3 to expire")
    assert store.ingress.append(SHARD, b"n", dedupe="mid-3", dup=True) is not None
    got = store.ingress.read([SHARD], count=100, block_ms=0, pending=False)
    assert len(got) == 6

    results = store.ingress.append_many(
        [(SHARD, b"x", "mid-1", True), (SHARD, b"y", "mid-9", True), (0, b"z", None, False)]
    )
    assert results[0] is None
    assert results[1] is not None
    assert results[2] is not None


def test_a_shards_appends_are_one_script_run_and_a_new_marker_one_command(
    store: RedisStore, raw: redis.Redis[bytes]
) -> None:
    raw.config_resetstat()
    items = [(SHARD, b"a", "mid-a", False), (SHARD, b"b", "mid-b", False), (0, b"c", None, False)]
    assert all(entry_id is not None for entry_id in store.ingress.append_many(items))
    calls = calls_of(raw)
    assert calls == {"evalsha": 2, "set": 2, "xadd": 3}
    got = store.ingress.read([SHARD], count=10, block_ms=0, pending=False)
    assert [e.event for e in got] == [b"a", b"b"], "in order"


def test_a_commit_takes_messages_in_by_their_markers_and_refuses_known_ones(
    store: RedisStore, raw: redis.Redis[bytes]
) -> None:
    """Messages handed straight to a commit (no ingress entry) are deduplicated there as the
    append does: a redelivery, or a message another ingress holder took in first, refuses
    the whole commit with nothing written (a marker it set taken back), naming them."""
    token = take_shard(store)

    def run(state: bytes, markers: Markers) -> list[list[list[str]] | LeaseLost | Known]:
        batch = [(SHARD, token, [Commit(JOB, state, history=(state,))])]
        return store.states.commit(batch, markers={SHARD: markers})

    def marker(digest: str) -> bytes | None:
        return raw.get(store.keys.seen(SHARD, digest))

    assert run(b"s1", Markers("in:1", (("d1", False), ("d2", False)))) == [[[]]]
    assert (marker("d1"), marker("d2")) == (b"in:1", b"in:1")
    assert 0 < raw.pttl(store.keys.seen(SHARD, "d1")) <= 60_000

    assert run(b"s2", Markers("in:1", (("d3", False), ("d1", True)))) == [Known((1,))]
    assert marker("d3") is None, "the refused commit took back the marker it set"
    assert run(b"s2", Markers("in:2", (("d2", False),))) == [Known((0,))]
    assert store.states.load([JOB]) == {JOB: b"s1"} and store.states.history(JOB) == [b"s1"]

    # a first delivery under the same token: a second message with the same digest
    assert run(b"s3", Markers("in:1", (("d2", False), ("d3", True)))) == [[[]]]
    assert store.states.load([JOB]) == {JOB: b"s3"} and marker("d3") == b"in:1"


# -- timers ----------------------------------------------------------------------------


def test_timers_fire_exactly_once_into_ingress(store: RedisStore) -> None:
    token = take_shard(store)
    other = next(
        k for k in (rkey("job", "ns", f"t{i}") for i in range(500)) if shard_of(k) == SHARD
    )
    commit(
        store,
        SHARD,
        token,
        [
            Commit(JOB, b"s", timer_due_ms=1_700_000_000_100),
            Commit(other, b"s", timer_due_ms=1_700_000_000_300),
        ],
    )
    assert store.ingress.next_timer_ms(SHARD) == 1_700_000_000_100
    assert store.ingress.fire_due_timers({SHARD: token}, now_ms=1_700_000_000_200) == {SHARD: 1}
    assert store.ingress.fire_due_timers({SHARD: token}, now_ms=1_700_000_000_200) == {SHARD: 0}
    assert store.ingress.next_timer_ms(SHARD) == 1_700_000_000_300
    [fired] = store.ingress.read([SHARD], count=10, block_ms=0, pending=False)
    assert (fired.event, fired.timer_rkey, fired.timer_due_ms) == (None, JOB, 1_700_000_000_100)
    # one round trip for several shards: a fenced one moves nothing, the others fire
    other_shard = (SHARD + 1) % NUM_SHARDS
    both = {SHARD: "r9:999", other_shard: take_shard(store, shard=other_shard)}
    fired = store.ingress.fire_due_timers(both, now_ms=1_700_000_001_000)
    assert fired == {SHARD: None, other_shard: 0}
    assert store.ingress.fire_due_timers({SHARD: token}, now_ms=1_700_000_001_000) == {SHARD: 1}
    assert store.ingress.next_timer_ms(SHARD) is None
    [second] = store.ingress.read([SHARD], count=10, block_ms=0, pending=False)
    assert second.timer_rkey == other


# -- effects ---------------------------------------------------------------------------


def test_complete_effect_moves_an_intent_to_ingress_exactly_once(store: RedisStore) -> None:
    token = take_shard(store)
    commit(store, SHARD, token, [Commit(JOB, b"s", effects=(("e-1", b"a"), ("e-2", b"b")))])
    assert store.outboxes.complete_effect(SHARD, token, "e-1", b"result-1")
    assert not store.outboxes.complete_effect(SHARD, token, "e-1", b"result-1")
    assert store.outboxes.complete_effect(SHARD, token, "e-2", None)  # no event to report
    assert store.outboxes.pending_effects([SHARD])[SHARD] == {}
    got = store.ingress.read([SHARD], count=10, block_ms=0, pending=False)
    assert [e.event for e in got] == [b"result-1"]


# -- leases and replicas ---------------------------------------------------------------


def fence_of(token: str) -> int:
    return int(token.rpartition(":")[2])


def clock_passed(ms: int) -> None:
    """Until the wall clock (the fence's floor, read by the acquiring client) is past ``ms``."""
    wait_until(lambda: time.time_ns() // 1_000_000 > ms, 10, f"the wall clock to pass {ms} ms")


def test_leases_compare_and_act(store: RedisStore) -> None:
    lease, fence = store.keys.ingress_lease(), store.keys.ingress_fence()
    before_ms = time.time_ns() // 1_000_000
    token = store.leases.acquire(lease, fence, "r1", TTL_MS)
    assert token is not None and token.startswith("r1:")
    assert fence_of(token) >= before_ms  # the first fence starts at the wall clock
    other = f"r2:{fence_of(token)}"
    assert store.leases.lease_holder(lease) == token
    assert store.leases.acquire(lease, fence, "r2", TTL_MS) is None
    assert store.leases.acquire(lease, fence, "r1", TTL_MS) is None
    assert not store.leases.renew(lease, other, TTL_MS)
    assert not store.leases.release(lease, other)
    assert store.leases.renew(lease, token, TTL_MS)
    assert store.leases.release(lease, token)
    assert not store.leases.release(lease, token)
    assert store.leases.lease_holder(lease) is None
    second = store.leases.acquire(lease, fence, "r2", TTL_MS)
    assert second is not None and second.startswith("r2:")
    assert fence_of(second) > fence_of(token)


def test_fence_never_goes_back_when_its_counter_was_lost(
    store: RedisStore, raw: redis.Redis[bytes]
) -> None:
    """A failover may lose the INCR behind the last token (an asynchronous replica promoted):
    the next token is still larger, because the fence never falls below the wall clock."""
    lease, fence = store.keys.lease(SHARD), store.keys.fence(SHARD)
    first = store.leases.acquire(lease, fence, "r1", TTL_MS)
    assert first is not None
    raw.delete(lease)
    raw.set(fence, fence_of(first) - 5)  # the promoted replica missed the last increments
    clock_passed(fence_of(first))
    second = store.leases.acquire(lease, fence, "r2", TTL_MS)
    assert second is not None
    assert fence_of(second) > fence_of(first)
    raw.delete(lease, fence)  # the counter gone altogether
    clock_passed(fence_of(second))
    third = store.leases.acquire(lease, fence, "r1", TTL_MS)
    assert third is not None and fence_of(third) > fence_of(second)


def test_renew_keeps_a_lease_alive_past_its_first_ttl(
    store: RedisStore, raw: redis.Redis[bytes]
) -> None:
    token = take_shard(store, ttl_ms=300)
    lease = store.keys.lease(SHARD)
    first_expiry_ms = int(raw.pexpiretime(lease))
    assert first_expiry_ms > 0

    def renewed_past_first_expiry() -> bool:
        assert store.leases.renew(lease, token, 300)
        seconds, micros = raw.time()
        return seconds * 1000 + micros // 1000 > first_expiry_ms

    # renewing on every probe, until Redis's own clock is past the first TTL's end
    wait_until(renewed_past_first_expiry, 10, "Redis's clock to pass the lease's first expiry")
    assert store.leases.lease_holder(lease) == token


def race_for(stores: list[RedisStore], shard: int) -> list[str | None]:
    """Every store tries to acquire ``shard`` at the same instant; their tokens."""
    barrier = threading.Barrier(len(stores))
    tokens: list[str | None] = [None] * len(stores)

    def attempt(i: int) -> None:
        s = stores[i]
        barrier.wait()
        tokens[i] = s.leases.acquire(s.keys.lease(shard), s.keys.fence(shard), f"r{i}", TTL_MS)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return tokens


def test_two_replicas_racing_for_a_shard_one_wins(redis_proc: Server) -> None:
    stores = [RedisStore(url_of(redis_proc), Keys("race")) for _ in range(2)]
    try:
        for shard in range(NUM_SHARDS):
            winners = [t for t in race_for(stores, shard) if t is not None]
            assert len(winners) == 1
            assert stores[0].leases.lease_holder(stores[0].keys.lease(shard)) == winners[0]
    finally:
        for s in stores:
            s.close()


def test_heartbeat_returns_the_live_set(store: RedisStore) -> None:
    assert store.leases.heartbeat("b", now_ms=1_000, ttl_ms=500) == ["b"]
    assert store.leases.heartbeat("a", now_ms=1_100, ttl_ms=500) == ["a", "b"]
    assert store.leases.heartbeat("c", now_ms=1_550, ttl_ms=500) == ["a", "c"]  # b expired at 1500
    store.leases.leave("a")
    assert store.leases.heartbeat("c", now_ms=1_600, ttl_ms=500) == ["c"]


# -- failures --------------------------------------------------------------------------


def test_redis_stopped_is_store_unavailable_and_restart_recovers(
    store: RedisStore, redis_proc: Server
) -> None:
    take_shard(store)
    redis_proc.stop()
    assert not store.ping()
    calls: list[Callable[[], object]] = [
        lambda: store.states.load([JOB]),
        lambda: commit(store, SHARD, "r1:1", [Commit(JOB, b"x")]),
        lambda: store.leases.acquire(
            store.keys.lease(SHARD), store.keys.fence(SHARD), "r1", TTL_MS
        ),
        lambda: store.ingress.read([SHARD], count=1, block_ms=0, pending=False),
        lambda: store.ingress.append(SHARD, b"x"),
        lambda: store.leases.heartbeat("r1", 0, 1),
    ]
    for call in calls:
        with pytest.raises(StoreUnavailable) as info:
            call()
        assert isinstance(info.value.__cause__, redis.RedisError)

    redis_proc.start()  # empty: no scripts, no streams, no groups
    assert store.ping()
    token = take_shard(store)
    entry_id = store.ingress.append(SHARD, b"after")  # stream re-created without a group
    [entry] = store.ingress.read([SHARD], count=10, block_ms=0, pending=False)
    assert entry.entry_id == entry_id
    commit(store, SHARD, token, [Commit(JOB, b"after", ack_ids=(entry.entry_id,))])
    assert store.states.load([JOB]) == {JOB: b"after"}


def test_flushed_scripts_are_reloaded(store: RedisStore, raw: redis.Redis[bytes]) -> None:
    token = take_shard(store)
    raw.script_flush()
    commit(store, SHARD, token, [Commit(JOB, b"a"), Commit(JOB, b"b")])  # transaction path
    raw.script_flush()
    commit(store, SHARD, token, [Commit(JOB, b"c")])  # single-call path
    raw.script_flush()
    items = [(SHARD, b"e", "k", False), (SHARD, b"e", "k", True)]
    assert store.ingress.append_many(items)[1] is None
    assert store.states.load([JOB]) == {JOB: b"c"}


def test_frozen_redis_is_store_unavailable(redis_proc: Server) -> None:
    s = RedisStore(url_of(redis_proc), Keys("t"), socket_timeout_s=0.3)
    try:
        token = take_shard(s)
        redis_proc.freeze()
        try:
            with pytest.raises(StoreUnavailable):
                commit(s, SHARD, token, [Commit(JOB, b"x")])
            with pytest.raises(StoreUnavailable):
                s.states.load([JOB])
        finally:
            redis_proc.thaw()
        assert s.ping()
    finally:
        s.close()


# -- caps and small sets ---------------------------------------------------------------


def test_history_is_capped(store: RedisStore, raw: redis.Redis[bytes]) -> None:
    token = take_shard(store)
    for i in range(5):
        entries = tuple(f"h-{i}-{j}".encode() for j in range(100))
        commit(store, SHARD, token, [Commit(JOB, b"s", history=entries)])
    assert raw.llen(store.keys.history(JOB)) == 100
    assert store.states.history(JOB, count=3) == [b"h-4-97", b"h-4-98", b"h-4-99"]


def test_round_records_are_capped_apart_from_the_event_history(
    store: RedisStore, raw: redis.Redis[bytes]
) -> None:
    token = take_shard(store)
    for i in range(60):
        history = tuple(f"h-{i}-{j}".encode() for j in range(10))
        commit(store, SHARD, token, [Commit(JOB, b"s", history=history, rounds=(b"r-%d" % i,))])
    assert raw.llen(store.keys.rounds(JOB)) == 50
    assert store.states.rounds(JOB, count=2) == [b"r-58", b"r-59"]
    assert store.states.rounds(JOB)[0] == b"r-10"
    assert raw.llen(store.keys.history(JOB)) == 100


def test_dlq_is_capped(store: RedisStore, raw: redis.Redis[bytes]) -> None:
    for i in range(350):
        store.records.dead_letter(f"r-{i}".encode(), maxlen=10)
    length = raw.xlen(store.keys.dlq())
    assert 10 <= length < 300
    assert store.records.dlq(count=2) == [b"r-348", b"r-349"]


def test_dataset_jobs(store: RedisStore) -> None:
    store.records.dataset_jobs_add("default/ds", "job:default/b")
    store.records.dataset_jobs_add("default/ds", "job:default/a")
    store.records.dataset_jobs_add("default/ds", "job:default/a")
    assert store.records.dataset_jobs("default/ds") == ["job:default/a", "job:default/b"]
    store.records.dataset_jobs_remove("default/ds", "job:default/b")
    assert store.records.dataset_jobs("default/ds") == ["job:default/a"]
    assert store.records.dataset_jobs("other/ds") == []


def test_a_message_taken_in_by_another_holder_is_dropped(redis_proc: Server) -> None:
    """The zombie case: the new ingress holder (token B) took a redelivery in; the old holder
    (token A), frozen past its lease, still appends its own copy as a first delivery."""
    store = RedisStore(f"redis://127.0.0.1:{redis_proc.port}/0", Keys())
    store.ingress.ensure_groups()
    assert store.ingress.append(3, b"e", dedupe="m1", dup=True, token="B") is not None
    assert store.ingress.append(3, b"e", dedupe="m1", dup=False, token="A") is None
    # the same holder may take in a distinct message that happens to share the key
    assert store.ingress.append(3, b"e", dedupe="m1", dup=False, token="B") is not None
    # and a redelivery is dropped whoever holds the ingress
    assert store.ingress.append(3, b"e", dedupe="m1", dup=True, token="B") is None


def test_a_blocking_read_hands_out_a_wake_up_that_ends_it_early(
    store: RedisStore, raw: redis.Redis[bytes]
) -> None:
    """The wake-up comes while the read is blocked in Redis (one blocked client); called,
    it ends the read with nothing, and says so; once the read ended it ends nothing. An
    entry appended meanwhile still ends a read as it always did, wake-up unused."""
    wakes: list[Callable[[], bool]] = []
    blocked_clients: list[int] = []

    def on_blocked(wake: Callable[[], bool]) -> None:
        blocked_clients.append(raw.info("clients")["blocked_clients"])
        wakes.append(wake)

    woken: list[bool] = []
    waker = threading.Thread(
        target=lambda: (wait_until(lambda: bool(wakes), 10, "the read to block"),
                        woken.append(wakes[0]())),
    )  # fmt: skip
    waker.start()
    # a block longer than this test may take (but below the socket timeout)
    entries = store.ingress.read([SHARD], count=10, block_ms=1900, pending=False,
                                 on_blocked=on_blocked)  # fmt: skip
    waker.join()
    assert (entries, woken, blocked_clients) == ([], [True], [1])
    assert wakes[0]() is False, "the read had ended: nothing to end"

    def append_soon() -> None:
        wait_until(lambda: len(wakes) == 2, 10, "the second read to block")
        appended(store, b"ev")

    appender = threading.Thread(target=append_soon)
    appender.start()
    entries = store.ingress.read([SHARD], count=10, block_ms=1900, pending=False,
                                 on_blocked=wakes.append)  # fmt: skip
    appender.join()
    assert [e.event for e in entries] == [b"ev"]


def test_a_server_refusing_client_commands_gets_no_wake_up_and_says_so_once(
    redis_proc: Server, raw: redis.Redis[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    """Under an ACL refusing CLIENT ID, a blocking read hands out no wake-up (it waits out
    its block, as before); the log says why once, and later reads do not ask again."""
    raw.acl_setuser("limited", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                    commands=["+@all", "-client|id", "-client|unblock"])  # fmt: skip
    url = f"redis://limited:pw@127.0.0.1:{redis_proc.port}/0"
    limited = RedisStore(url, Keys("t"), socket_timeout_s=2.0)
    try:
        limited.ingress.ensure_groups()
        raw.config_resetstat()
        wakes: list[Callable[[], bool]] = []
        for _ in range(2):
            entries = limited.ingress.read([SHARD], count=10, block_ms=50, pending=False,
                                           on_blocked=wakes.append)  # fmt: skip
            assert (entries, wakes) == ([], [])
        refused = [r for r in caplog.records if "not woken early" in r.getMessage()]
        assert len(refused) == 1 and "client|id" in refused[0].getMessage()
        stats = raw.info("commandstats")
        assert stats["cmdstat_client|id"]["rejected_calls"] == 1, "asked again"
        assert stats["cmdstat_xreadgroup"]["calls"] == 2
    finally:
        limited.close()
        raw.acl_deluser("limited")


def test_a_state_about_to_be_acted_on_waits_for_the_replicas(redis_proc: Server) -> None:
    """With replicas required and none confirming (a lone server here: WAIT answers 0), a
    state loaded behind the barrier is not given out: a failover could take it back. A plain
    load still is."""
    store = RedisStore(url_of(redis_proc), Keys("t"), socket_timeout_s=0.2, min_replicas=1)
    try:
        assert store.states.load([JOB]) == {JOB: None}
        with pytest.raises(StoreUnavailable, match="load"):
            store.states.load([JOB], barrier=True)
    finally:
        store.close()
