"""The outbox on a graceful stop, against real mosquitto and Redis: what the broker
acknowledged is forgotten before the replica lets its shards go, so the next owner's sweep
does not send it upstream a second time."""

from __future__ import annotations

import queue

from service.adapters.mqtt import MqttClient, MqttSettings
from service.adapters.redis_store import Commit, OutboxEntry, RedisStore
from service.keys import Keys, rkey, shard_of
from service.runtime.clock import SystemClock
from service.runtime.outbox import OutboxPublisher
from tests.servers import Server

JOB = rkey("job", "default", "outbox-job")
SHARD = shard_of(JOB)
TOPIC = "sedna/node1/upstream"


def test_finish_forgets_what_the_broker_acknowledged(
    mosquitto: Server, redis_proc: Server
) -> None:
    store = RedisStore(f"redis://127.0.0.1:{redis_proc.port}/0", Keys("t"))
    url = f"mqtt://127.0.0.1:{mosquitto.port}"
    inbound: queue.SimpleQueue = queue.SimpleQueue()  # type: ignore[type-arg]
    cloud = MqttClient(
        MqttSettings(url=url, client_id="cloud"), subscriptions=[TOPIC], inbound=inbound
    )
    publisher = MqttClient(MqttSettings(url=url, client_id="publisher"))
    try:
        store.ensure_groups()
        token = store.acquire(store.keys.lease(SHARD), store.keys.fence(SHARD), "r1", 10_000)
        assert token is not None
        cloud.start()
        publisher.start()
        assert cloud.wait_connected(10) and publisher.wait_connected(10)
        while True:  # the cloud's subscription is active once a probe gets through
            assert publisher.publish(TOPIC, b"probe").wait(5)
            try:
                if inbound.get(timeout=0.2).payload == b"probe":
                    break
            except queue.Empty:
                continue
        entry = OutboxEntry("m-1", TOPIC, b'{"deploy":"ready"}')
        [[ids]] = store.commit([(SHARD, token, [Commit(JOB, b"s", outbox=(entry,))])])
        outbox = OutboxPublisher(store, publisher, lambda: [SHARD], clock=SystemClock())
        outbox.send(SHARD, [(stream_id, entry) for stream_id in ids])
        assert inbound.get(timeout=5).payload == entry.payload
        # acknowledged, but no outbox thread ran to delete it: a stop now would leave it
        assert [i for i, _ in store.outbox_read([SHARD])[SHARD]] == ids
        outbox.finish(5.0)
        assert store.outbox_read([SHARD])[SHARD] == []
    finally:
        cloud.stop()
        publisher.stop()
        store.close()
