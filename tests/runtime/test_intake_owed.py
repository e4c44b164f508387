"""A message of a shard whose earlier message the processor still owes goes behind that one,
also once the replica lost its leases (a Redis outage outlasting them): appended to the
stream by the intake, it would overtake the owed one, which the processor appends only when
Redis is back (a worker's `completed` applied before its `running`)."""

from __future__ import annotations

import json
import threading
from typing import Any, cast

from service.adapters.mqtt import Inbound
from service.adapters.redis_store import Ingress
from service.config import Config
from service.core.events import Tick
from service.heartbeat import SystemClock
from service.keys import shard_of
from service.runtime.handoff import Handoff, TakenMessage
from service.runtime.intake import Accepted, Admission, Intake, encode_accepted
from service.runtime.leases import LeaseKeeper
from service.runtime.rejections import Rejections
from tests.harness import worker_message

SHARD = shard_of("job:default/job-a")
TOPIC = "sedna/edge-1/workers/job-a-train-x/info"


class NoLeases:
    """Every lease given up: no ingress token, no shard."""

    ingress_token = ""

    def token(self, _shard: int) -> None:
        return None


def report(mid: int, status: str) -> Inbound:
    payload = json.dumps(worker_message("job-a", "train", status, worker="job-a-train-x"))
    return Inbound(topic=TOPIC, payload=payload.encode(), qos=1, dup=False, mid=mid,
                   received_at=0.0)  # fmt: skip


def owed_message() -> TakenMessage:
    event = Accepted(event=Tick(kind="job", namespace="default", name="job-a", due_ms=0))
    return TakenMessage(shard=SHARD, accepted=event, digest="d1", dup=False, ingress_token="i:1",
                        msg=report(1, "running"), ack=lambda _: None)  # fmt: skip


def intake_with(handoff: Handoff) -> Intake:
    unused: Any = None
    return Intake(
        config=Config(node_name="edge-1"), ingress=cast(Ingress, unused),
        leases=cast(LeaseKeeper, NoLeases()), rejections=cast(Rejections, unused),
        clock=SystemClock(), stop=threading.Event(), client_factory=unused,
        admission=cast(Admission, unused), handoff=handoff,
    )  # fmt: skip


def accepted(intake: Intake, msg: Inbound) -> tuple[Inbound, int, Accepted, str | None]:
    return msg, SHARD, intake._accept(msg, 0), "d2"


def test_after_the_leases_a_message_of_an_owed_shard_goes_behind_the_owed_one() -> None:
    handoff = Handoff()
    assert handoff.offer_messages([owed_message()])  # the processor holds it, Redis down
    handoff.close()  # its pass failed on Redis
    intake = intake_with(handoff)
    completed = report(2, "completed")
    to_append = intake._hand_over([accepted(intake, completed)])
    assert to_append == [], "not appended ahead of the owed message"
    _, messages = handoff.take()
    assert [m.msg.mid for m in messages] == [1, 2]
    assert messages[1].ingress_token == "", "taken in under no ingress lease"
    messages[1].ack([completed])  # no client: nothing to acknowledge, and nothing raised


def test_after_the_leases_a_message_of_a_shard_owing_nothing_is_appended() -> None:
    intake = intake_with(Handoff())
    completed = report(2, "completed")
    item = accepted(intake, completed)
    assert intake._hand_over([item]) == [(completed, SHARD, encode_accepted(item[2]), "d2")]
