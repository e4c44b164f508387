"""One garbage entry in an internal queue no longer stalls the queue: written straight into
Redis (the outbox stream, the GM outbox stream, the effect intents hash) beside valid
entries, against a real `lifelong serve`, redis-server and GM stand-in.

Before, the outbox sweep raised on the entry's missing field and the GM outbox on its
undecodable payload, for ever, and nothing after the entry went out; an undecodable intent
made every recovery fail and the intents after it never ran. Now each such entry is set
aside (dead-letter stream with the reason, `lifelong_set_aside_entries_total{queue}`, a log
line), removed, and the entries after it go on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from service.adapters.redis_store import RedisStore
from service.core.effects import DetachDataset, encode_work
from service.keys import NUM_SHARDS, Keys, dataset_key, job_key, shard_of
from tests.gm_standin import GmStandIn
from tests.harness import NODE, NS, PREFIX, metric_sum
from tests.stack import Stack
from tests.wait import wait_until

GARBAGE = b"\xc1 not msgpack, not JSON"


@pytest.fixture
def gm() -> Iterator[GmStandIn]:
    with GmStandIn() as standin:
        yield standin


def envelope(name: str) -> bytes:
    header = {"namespace": NS, "resourceKind": "lifelonglearningjob", "resourceName": name,
              "operation": "status", "id": f"{name}-id"}  # fmt: skip
    return json.dumps({"header": header, "content": {"phase": "probe"}}).encode()


def dead_letter_reasons(store: RedisStore) -> list[str]:
    return [json.loads(record)["reason"] for record in store.records.dlq()]


def test_garbage_outbox_entries_are_set_aside_and_later_ones_go_out(stack: Stack) -> None:
    controller = stack.controller()
    keys, raw = Keys(), redis.Redis.from_url(stack.redis_url)
    store = RedisStore(stack.redis_url, keys)
    try:
        for shard in range(NUM_SHARDS):
            stream = keys.outbox(shard)
            raw.xadd(stream, {"junk": GARBAGE})  # no id, topic or payload
            raw.xadd(stream, {"id": "x", "topic": f"{PREFIX}/#", "payload": b"{}"})
            raw.xadd(stream, {"id": f"probe-{shard}", "topic": f"{PREFIX}/{NODE}/upstream",
                              "payload": envelope(f"probe-{shard}")})  # fmt: skip
        probes = {f"probe-{shard}" for shard in range(NUM_SHARDS)}
        stack.cloud.wait_for(
            lambda: probes <= {m["header"]["resourceName"] for m in stack.cloud.upstream()},
            20, "every valid entry after the garbage published",
        )  # fmt: skip
        wait_until(
            lambda: metric_sum(controller, "lifelong_set_aside_entries_total", queue="outbox")
            == 2 * NUM_SHARDS,
            10, "both garbage entries of each shard set aside",
        )  # fmt: skip
        wait_until(lambda: all(raw.xlen(keys.outbox(s)) == 0 for s in range(NUM_SHARDS)), 10,
                   "the outbox streams emptied")  # fmt: skip
        reasons = dead_letter_reasons(store)
        assert reasons.count("no 'id' field") == NUM_SHARDS, reasons
        assert reasons.count("its topic is not one a message can be published to") == NUM_SHARDS
        assert "Traceback" not in controller.log()
    finally:
        store.close()
        raw.close()


def test_garbage_gm_outbox_entries_are_set_aside_and_later_ones_go_out(
    stack: Stack, gm: GmStandIn
) -> None:
    controller = stack.controller(env={"LIFELONG_GM_ADDRESS": gm.address})
    assert gm.wait(lambda: gm.connections(NODE) == 1), "the link is up"
    keys, raw = Keys(), redis.Redis.from_url(stack.redis_url)
    store = RedisStore(stack.redis_url, keys)
    shard = 5
    try:
        stream = keys.gm_outbox(shard)
        raw.xadd(stream, {"junk": GARBAGE})
        raw.xadd(stream, {"payload": GARBAGE})
        raw.xadd(stream, {"payload": b'{"header": ["not", "an", "object"]}'})
        raw.xadd(stream, {"payload": envelope("after-the-garbage")})
        assert gm.wait(
            lambda: any(h.get("resourceName") == "after-the-garbage" for h, _ in gm.statuses(NODE))
        ), "the valid entry after the garbage reaches the GM"
        wait_until(
            lambda: metric_sum(controller, "lifelong_set_aside_entries_total", queue="gm-outbox")
            == 3,
            10, "the three garbage entries set aside",
        )  # fmt: skip
        # set aside and sent entries leave the stream in the sender's next delete
        wait_until(lambda: raw.xlen(stream) == 0, 10, "the GM outbox stream emptied")
        reasons = dead_letter_reasons(store)
        assert "no 'payload' field" in reasons
        assert sum(r.startswith("not an upstream envelope") for r in reasons) == 2, reasons
    finally:
        store.close()
        raw.close()


def test_garbage_effect_intents_are_set_aside_and_later_ones_run(stack: Stack) -> None:
    keys, raw = Keys(), redis.Redis.from_url(stack.redis_url)
    store = RedisStore(stack.redis_url, keys)
    dataset, job = dataset_key(NS, "a-dataset"), job_key(NS, "a-job")
    try:
        # Intents are redone when a replica takes their shard: put them there before it does.
        raw.sadd(keys.dataset_jobs(dataset), job)
        for shard in range(NUM_SHARDS):
            raw.hset(keys.effects(shard), "garbage", GARBAGE)
        detach = DetachDataset(id="detach-1", namespace=NS, name="a-job", dataset="a-dataset")
        raw.hset(keys.effects(shard_of(job)), "detach-1", encode_work(detach))

        controller = stack.controller()
        wait_until(lambda: raw.scard(keys.dataset_jobs(dataset)) == 0, 15,
                   "the valid intent after the garbage ran")  # fmt: skip
        wait_until(
            lambda: metric_sum(controller, "lifelong_set_aside_entries_total", queue="effects")
            == NUM_SHARDS,
            10, "every garbage intent set aside",
        )  # fmt: skip
        assert all(raw.hlen(keys.effects(s)) == 0 for s in range(NUM_SHARDS))
        reasons = dead_letter_reasons(store)
        assert sum(r.startswith("not an effect intent") for r in reasons) == NUM_SHARDS
        assert "Traceback" not in controller.log()
    finally:
        store.close()
        raw.close()
