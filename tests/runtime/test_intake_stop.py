"""Giving the ingress up stops the subscribing client without holding the intake's lock, so
a slow stop (a broker or GM slow to answer) freezes neither acknowledgements nor readiness."""

from __future__ import annotations

import queue
import threading
from typing import Any, cast

from service.adapters.mqtt import Inbound, MqttClient
from service.adapters.redis_store import Ingress
from service.config import Config
from service.heartbeat import SystemClock
from service.runtime.handoff import Handoff
from service.runtime.intake import Admission, Intake
from service.runtime.leases import LeaseKeeper
from service.runtime.rejections import Rejections
from tests.wait import wait_until


class SlowClient:
    """An ingress client whose `stop` waits until the test lets it end."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.may_stop = threading.Event()
        self.acked: list[int] = []
        self.subscribed = True

    def start(self) -> None:
        return None

    def stop(self) -> None:
        self.stopping.set()
        self.may_stop.wait(30)

    def ack(self, msg: Inbound) -> None:
        self.acked.append(msg.mid)


def test_a_slow_stop_blocks_neither_state_nor_acks() -> None:
    client = SlowClient()

    def factory(_inbound: queue.SimpleQueue[Inbound]) -> MqttClient:
        return cast(MqttClient, client)

    unused: Any = None
    intake = Intake(
        config=Config(node_name="edge-1"), ingress=cast(Ingress, unused),
        leases=cast(LeaseKeeper, unused), rejections=cast(Rejections, unused),
        clock=SystemClock(), stop=threading.Event(), client_factory=factory,
        admission=cast(Admission, unused), handoff=Handoff(),
    )  # fmt: skip
    intake.on_ingress_lease(True)
    assert intake.state == "up"

    giving_up = threading.Thread(target=intake.on_ingress_lease, args=(False,))
    giving_up.start()
    try:
        wait_until(client.stopping.is_set, 10, "the client stopping")
        seen: list[str] = []
        reader = threading.Thread(target=lambda: seen.append(intake.state), daemon=True)
        reader.start()
        reader.join(5)
        assert seen == ["standby"], "state waited for the client's stop"
        # a message taken in before the lease went is not acknowledged on a stopped client
        message = Inbound(topic="t", payload=b"", qos=1, dup=False, mid=7, received_at=0.0)
        acking = threading.Thread(target=intake._ack, args=(message,), daemon=True)
        acking.start()
        acking.join(5)
        assert not acking.is_alive(), "acknowledging waited for the client's stop"
        assert client.acked == []
    finally:
        client.may_stop.set()
        giving_up.join(10)
