"""The outbox on a graceful stop, against real mosquitto and Redis: what the broker
acknowledged is forgotten before the replica lets its shards go, so the next owner's sweep
does not send it upstream a second time. And the committing thread and the sweep, coming to
the same entry at once, publish it once."""

from __future__ import annotations

import queue

from service.adapters.mqtt import MqttClient, MqttSettings, PublishTicket
from service.adapters.redis_store import Commit, OutboxEntry, RedisStore
from service.keys import Keys, rkey, shard_of
from service.metrics import Metrics
from service.runtime.clock import SystemClock
from service.runtime.outbox import OutboxPublisher
from service.runtime.ports import DeadLetters, Publisher
from service.runtime.rejections import Rejections
from tests.servers import Server

JOB = rkey("job", "default", "outbox-job")
SHARD = shard_of(JOB)
TOPIC = "sedna/node1/upstream"


def rejections(dead_letters: DeadLetters, publisher: Publisher) -> Rejections:
    return Rejections(dead_letters=dead_letters, publisher=publisher,
                      errors_topic="sedna/node1/errors", metrics=Metrics())  # fmt: skip


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
        outbox = OutboxPublisher(
            store, publisher, lambda: [SHARD], clock=SystemClock(),
            rejections=rejections(store, publisher),
        )  # fmt: skip
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


class _RacingMqtt:
    """A publisher whose first publish lets the other thread's path come to the same entry
    mid-call, as the committing thread's `send` can while the sweep publishes it."""

    def __init__(self) -> None:
        self.published: list[bytes] = []
        self.meanwhile: list[object] = []

    def publish(self, topic: str, payload: bytes, qos: int = 1) -> PublishTicket:
        self.published.append(payload)
        while self.meanwhile:
            step = self.meanwhile.pop()
            assert callable(step)
            step()
        return PublishTicket(len(self.published))


class _OneEntryOutbox:
    def __init__(self, entry: OutboxEntry) -> None:
        self.entry = entry

    def outbox_read(self, shards: list[int]) -> dict[int, list[tuple[str, OutboxEntry]]]:
        return {shard: [("1-0", self.entry)] for shard in shards}

    def outbox_done(self, shard: int, stream_ids: list[str]) -> None:
        return None


def test_an_entry_the_sweep_is_publishing_is_not_sent_again_by_the_committer() -> None:
    entry = OutboxEntry("m-1", TOPIC, b"{}")
    mqtt = _RacingMqtt()
    outbox = OutboxPublisher(
        _OneEntryOutbox(entry), mqtt, lambda: [SHARD], clock=SystemClock(),  # type: ignore[arg-type]
        rejections=rejections(None, mqtt),  # type: ignore[arg-type]
    )  # fmt: skip
    mqtt.meanwhile.append(lambda: outbox.send(SHARD, [("1-0", entry)]))
    outbox.run_once()  # the sweep publishes the entry; the committer's send comes meanwhile
    assert mqtt.published == [b"{}"]
    outbox.send(SHARD, [("1-0", entry)])  # and once it is in flight
    assert mqtt.published == [b"{}"]
