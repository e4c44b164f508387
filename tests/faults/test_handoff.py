"""A message the intake hands straight to its processor (no ingress entry): committed with
its dedupe marker, the replica dies before the broker heard "got it". The broker redelivers
it to the next holder, whose append finds the marker and drops it: every message is applied
exactly once, whichever way it came in."""

from __future__ import annotations

import json
from collections import Counter

from service.failpoints import EXIT_CODE
from tests.faults.conftest import (
    JOB,
    QUIET_POLLS,
    Round,
    distinct_upstream,
    kind_of,
    probe_of,
    wait_exit,
)
from tests.harness import NODE, PREFIX, worker_message
from tests.stack import Stack
from tests.wait import wait_until

#: Reports in one burst: enough for the processor to be busy when most arrive (a message
#: arriving while it waits in Redis takes the stream), few enough for the job's capped
#: history to keep every one of them.
BURST = 60


def test_a_handed_over_message_committed_but_not_acknowledged_applies_once(
    stack: Stack,
) -> None:
    cloud = stack.cloud
    game = Round(stack)
    a = game.start("a")
    with probe_of(stack.redis_url) as probe:
        wait_until(lambda: probe.outbox_depth() == 0, 10, "A's outbox to drain")
        assert a.stop() == 0
        before = probe.events(JOB)

        b = stack.controller("b", env={**QUIET_POLLS, "LIFELONG_FAILPOINTS": "taken-before-ack"})
        for i in range(BURST):  # distinct workers: distinct messages, none waiting for another
            message = worker_message(JOB, "inference", "running", worker=f"{JOB}-inference-{i}")
            topic = f"{PREFIX}/{NODE}/workers/{message['name']}/info"
            cloud.client.publish(topic, json.dumps(message).encode(), qos=1)
        assert wait_exit(b) == EXIT_CODE, "B never handed a message over"
        assert "failpoint taken-before-ack" in b.log()

        c = stack.controller("c")

        def forwarded() -> int:
            statuses = [kind_of(m["content"]) for m in distinct_upstream(cloud, JOB).values()]
            return Counter(statuses)[("inference", "running", "output")]

        wait_until(
            lambda: forwarded() >= BURST, 30, f"{BURST} reports forwarded",
            detail=lambda: f"{forwarded()}; C's log: {c.log()[-3000:]}; B's: {b.log()[-3000:]}",
        )  # fmt: skip
        wait_until(lambda: probe.outbox_depth() == 0, 10, "C's outbox to drain")
        assert forwarded() == BURST, "a report was applied twice (two upstream ids)"
        applied = probe.events(JOB)
        applied.subtract(before)
        assert +applied == Counter({"WorkerReported": BURST}), applied
        assert cloud.errors() == []
