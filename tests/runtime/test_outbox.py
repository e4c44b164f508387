"""The outbox on a graceful stop, against real mosquitto and Redis: what the broker
acknowledged is forgotten before the replica lets its shards go, so the next owner's sweep
does not send it upstream a second time. And the committing thread and the sweep, coming to
the same entry at once, publish it once."""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Mapping, Sequence

from service.adapters.mqtt import MqttClient, MqttSettings, PublishTicket
from service.adapters.redis_store import Commit, OutboxEntry, Outboxes, Records, RedisStore
from service.heartbeat import SystemClock
from service.keys import Keys, rkey, shard_of
from service.metrics import Metrics
from service.runtime.outbox import OutboxPublisher
from service.runtime.rejections import Publisher, Rejections
from tests.servers import Server

JOB = rkey("job", "default", "outbox-job")
SHARD = shard_of(JOB)
TOPIC = "sedna/node1/upstream"


def rejections(dead_letters: Records, publisher: Publisher) -> Rejections:
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
        store.ingress.ensure_groups()
        token = store.leases.acquire(store.keys.lease(SHARD), store.keys.fence(SHARD), "r1", 10_000)
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
        [[ids]] = store.states.commit([(SHARD, token, [Commit(JOB, b"s", outbox=(entry,))])])
        outbox = OutboxPublisher(
            store.outboxes, publisher, lambda: [SHARD], clock=SystemClock(),
            rejections=rejections(store.records, publisher),
        )  # fmt: skip
        outbox.send([(SHARD, [(stream_id, entry) for stream_id in ids])])
        assert inbound.get(timeout=5).payload == entry.payload
        # acknowledged, but no outbox thread ran to delete it: a stop now would leave it
        assert [i for i, _ in store.outboxes.read([SHARD])[SHARD]] == ids
        outbox.finish(5.0)
        assert store.outboxes.read([SHARD])[SHARD] == []
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

    def batch(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def publish(self, topic: str, payload: bytes, qos: int = 1) -> PublishTicket:
        self.published.append(payload)
        while self.meanwhile:
            step = self.meanwhile.pop()
            assert callable(step)
            step()
        return PublishTicket(len(self.published))


class _OneEntryOutbox(Outboxes):
    def __init__(self, entry: OutboxEntry) -> None:
        self.entry = entry

    def read(
        self, shards: list[int], skip: object = None
    ) -> dict[int, list[tuple[str, OutboxEntry]]]:
        return {shard: [("1-0", self.entry)] for shard in shards}

    def done(self, done: object) -> None:
        return None


def test_an_entry_the_sweep_is_publishing_is_not_sent_again_by_the_committer() -> None:
    entry = OutboxEntry("m-1", TOPIC, b"{}")
    mqtt = _RacingMqtt()
    outbox = OutboxPublisher(
        _OneEntryOutbox(entry), mqtt, lambda: [SHARD], clock=SystemClock(),  # type: ignore[arg-type]
        rejections=rejections(None, mqtt),  # type: ignore[arg-type]
    )  # fmt: skip
    mqtt.meanwhile.append(lambda: outbox.send([(SHARD, [("1-0", entry)])]))
    outbox.run_once()  # the sweep publishes the entry; the committer's send comes meanwhile
    assert mqtt.published == [b"{}"]
    outbox.send([(SHARD, [("1-0", entry)])])  # and once it is in flight
    assert mqtt.published == [b"{}"]


class _Acking:
    """A publisher whose tickets the test completes, as PUBACKs would."""

    def __init__(self) -> None:
        self.tickets: dict[bytes, PublishTicket] = {}

    def batch(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def publish(self, topic: str, payload: bytes, qos: int = 1) -> PublishTicket:
        self.tickets[payload] = PublishTicket(len(self.tickets) + 1)
        return self.tickets[payload]

    def ack(self, payload: bytes) -> None:
        self.tickets[payload]._complete()


class _Recording(Outboxes):
    """An outbox store that records what it is asked: reads (with their skipped spans) and
    deletes, one list item per round trip."""

    def __init__(self, stream: dict[int, list[tuple[str, OutboxEntry]]]) -> None:
        self.stream = stream
        self.reads: list[dict[int, tuple[str, str] | None]] = []
        self.deletes: list[dict[int, list[str]]] = []

    def read(
        self,
        shards: Sequence[int],
        count: int = 1000,
        skip: Mapping[int, tuple[str, str]] | None = None,
    ) -> dict[int, list[tuple[str, OutboxEntry]]]:
        spans = skip or {}
        self.reads.append({shard: spans.get(shard) for shard in shards})
        return {shard: self.stream.get(shard, []) for shard in shards}

    def done(self, done: Mapping[int, Sequence[str]]) -> None:
        self.deletes.append({shard: list(ids) for shard, ids in done.items() if ids})


def _entries(shard: int, n: int) -> list[tuple[str, OutboxEntry]]:
    return [
        (f"{shard}-{i}", OutboxEntry(f"m{shard}-{i}", TOPIC, f"{shard}/{i}".encode()))
        for i in range(n)
    ]


def test_acknowledged_entries_of_every_shard_are_deleted_in_one_round_trip() -> None:
    stream = {1: _entries(1, 3), 2: _entries(2, 2)}
    store, mqtt = _Recording(stream), _Acking()
    outbox = OutboxPublisher(
        store, mqtt, lambda: [], clock=SystemClock(),  # type: ignore[arg-type]
        rejections=rejections(None, mqtt),  # type: ignore[arg-type]
    )  # fmt: skip
    outbox.send(list(stream.items()))
    for payload in (b"1/0", b"2/1", b"1/2", b"2/0"):
        mqtt.ack(payload)
    outbox.run_once()
    assert store.deletes == [{1: ["1-0", "1-2"], 2: ["2-1", "2-0"]}]
    assert outbox.depth == 1  # 1-1 still in flight
    outbox.run_once()
    assert len(store.deletes) == 1  # nothing acknowledged since: no round trip


def test_the_periodic_sweep_does_not_read_back_what_is_in_flight() -> None:
    stream = {1: _entries(1, 5), 2: _entries(2, 2)}
    store, mqtt = _Recording(stream), _Acking()
    outbox = OutboxPublisher(
        store, mqtt, lambda: [1, 2, 3], clock=SystemClock(),  # type: ignore[arg-type]
        rejections=rejections(None, mqtt),  # type: ignore[arg-type]
    )  # fmt: skip
    outbox.send([(1, [stream[1][3], stream[1][1], stream[1][2]])])
    outbox.wake({2})  # shard 2 is dirty: read whole
    outbox.run_once()
    assert store.reads == [{1: ("1-1", "1-3"), 2: None, 3: None}]
    assert set(mqtt.tickets) == {b"1/0", b"1/1", b"1/2", b"1/3", b"1/4", b"2/0", b"2/1"}
