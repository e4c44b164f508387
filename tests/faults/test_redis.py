"""Redis goes away: killed and restarted from its AOF, or down past every lease.

The controller waits (never crashes, never acknowledges an MQTT message it could not make
durable), says not-ready on /readyz meanwhile, and carries on from what Redis kept once it
is back; reports held in process across the outage keep their order. What each appendfsync
policy may lose is in docs/reliability.md (Limits):
`always` loses nothing Redis acknowledged; `everysec` may lose about the last second of
writes on a crash of the Redis host (this test kills redis-server only, once Redis has
written everything it acknowledged to the AOF file, and then expects nothing lost).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from service.core.effects import Context, Outcome
from service.core.events import Event, WorkerReported
from service.core.lifecycle import transition
from service.core.state import State
from service.embedded.processes import Server
from service.runtime.handoff import TakenMessage
from tests.faults.conftest import (
    JOB,
    Round,
    distinct_upstream,
    kind_of,
    probe_of,
    readyz,
    replica_on,
)
from tests.harness import worker_message
from tests.stack import Stack, stack_on
from tests.wait import wait_until

LEASE_S = 2.0  # the harness's LIFELONG_LEASE_SECONDS
RUNNING, COMPLETED = ("train", "running", "output"), ("train", "completed", "output")
RETRIES = 4  # failed attempts to make the held report durable, before Redis comes back


def aof_written(url: str) -> bool:
    """Redis has written every acknowledged write to its AOF file (its AOF buffer is
    empty). With `everysec` it may reply before that write; once it is done, killing
    redis-server (not its host) loses nothing, fsynced yet or not."""
    client = redis.Redis.from_url(url)
    try:
        return int(client.info("persistence")["aof_buffer_length"]) == 0
    finally:
        client.close()


@pytest.fixture
def stack(tmp_path: Path, mosquitto: Server, aof_redis: Server) -> Iterator[Stack]:
    """The fault tests' `stack`, on the AOF Redis."""
    with stack_on(tmp_path, mosquitto, aof_redis, durable=True) as s:
        yield s


@pytest.mark.parametrize("aof_redis", ["always", "everysec"], indirect=True)
def test_redis_killed_and_restarted_from_its_aof(stack: Stack, aof_redis: Server) -> None:
    policy = aof_redis.argv[-1]
    with probe_of(stack.redis_url) as probe:
        cloud = stack.cloud
        game = Round(stack)
        controller = game.start()
        game.train_completed()
        cloud.wait_status(JOB, "eval", "ready")
        if policy == "everysec":
            wait_until(lambda: aof_written(stack.redis_url), 10, "the AOF buffer to be written")
        before = probe.job(JOB)
        assert (before.phase, before.step, before.version) == ("eval", "running", 1)

        aof_redis.kill()
        wait_until(lambda: readyz(controller) == 503, 5, "/readyz to say not ready")
        aof_redis.start()
        wait_until(lambda: readyz(controller) == 200, 15, "/readyz to recover")
        assert probe.job(JOB) == before, "everything Redis acknowledged was kept"

        game.eval_completed()
        cloud.wait_status(JOB, "deploy", "ready", timeout_s=20)
        game.assert_complete(probe)
        assert controller.proc is not None and controller.proc.poll() is None


@pytest.mark.slow
@pytest.mark.parametrize("aof_redis", ["everysec"], indirect=True)
def test_redis_down_past_every_lease(stack: Stack, aof_redis: Server) -> None:
    """An MQTT report arriving while Redis is down is held unacknowledged until it can be
    made durable; the HTTP endpoint answers 503 (retry) meanwhile; nothing is lost or
    applied twice (the broker's redelivery after the ingress lease moved is deduplicated).
    Redis stays down until every lease it held has run out and the controller has failed
    to make the report durable several times."""
    with probe_of(stack.redis_url) as probe:
        cloud = stack.cloud
        game = Round(stack)
        controller = game.start()

        aof_redis.stop()
        down_at = time.time()  # no lease is renewed after this; Redis expires by this clock
        wait_until(lambda: readyz(controller) == 503, 5, "/readyz to say not ready")
        game.train_completed()  # over MQTT: taken in, but it cannot be made durable yet
        message = worker_message(JOB, "train", "running")
        status, _ = controller.post_worker(message["name"], message)
        assert status == 503

        wait_until(
            lambda: controller.log().count("ingress not durable yet") >= RETRIES,
            30,
            f"{RETRIES} failed attempts to make the report durable",
        )
        # every lease expires at most LEASE_S after its last renewal, so the AOF brings
        # none of them back: the ingress lease must be taken anew
        wait_until(lambda: time.time() > down_at + LEASE_S, 30, "every lease to run out")
        assert cloud.status(JOB, "eval", "ready") is None
        assert readyz(controller) == 503
        aof_redis.start()
        wait_until(lambda: readyz(controller) == 200, 15, "/readyz to recover")
        cloud.wait_status(JOB, "eval", "ready", timeout_s=15)
        game.eval_completed()
        cloud.wait_status(JOB, "deploy", "ready")
        game.assert_complete(probe)
        assert "ingress not durable yet" in controller.log()


#: Long enough that the outage below costs no lease: the replica keeps its shards and the
#: ingress, so only the order of the two reports is at stake.
ORDER_LEASE_S = 10


@pytest.mark.parametrize("aof_redis", ["always"], indirect=True)
def test_a_report_held_across_an_outage_is_not_overtaken_by_the_next(
    stack: Stack, aof_redis: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """The first of a worker's reports, handed to the processor in process, waits there for
    Redis (its commit failed); the second arrives while the processor cannot commit. It
    must not overtake the first by another way: the ingress stream, whose entries the
    processor applies before what it holds. It did (met in a Sentinel failover): the
    worker's `completed` applied first, its `running` refused as "a report of a stage that
    is over" and never forwarded."""
    caplog.set_level(logging.WARNING)
    cloud = stack.cloud
    game = Round(stack)
    game.prepare()
    planning, planned = threading.Event(), threading.Event()

    def held_in_plan(state: State | None, event: Event, ctx: Context) -> Outcome:
        """The first `running` report waits in the processor's plan, before its commit."""
        running = isinstance(event, WorkerReported) and event.status == "running"
        if running and not planning.is_set():
            planning.set()
            planned.wait(30)
        return transition(state, event, ctx)

    def logged(text: str) -> bool:
        return any(text in r.getMessage() for r in caplog.records)

    with replica_on(stack, transition=held_in_plan, lease_s=ORDER_LEASE_S) as replica:
        game.create()
        # Once Redis is back, no read of the processor's goes to it before the second report
        # is in (appended by the intake, or handed over): the read would otherwise race the
        # intake's retry.
        second_in, restarting = threading.Event(), threading.Event()
        ingress, handoff = replica.store.ingress, replica.handoff
        real_read, real_append = ingress.read, ingress.append_many
        real_offer = handoff.offer_messages

        def read(*args: Any, **kwargs: Any) -> Any:
            if restarting.is_set():
                second_in.wait(30)
            return real_read(*args, **kwargs)

        def append_many(*args: Any, **kwargs: Any) -> Any:
            done = real_append(*args, **kwargs)
            if restarting.is_set():
                second_in.set()
            return done

        def offer_messages(messages: Sequence[TakenMessage]) -> bool:
            taken = real_offer(messages)
            if taken and restarting.is_set():
                second_in.set()
            return taken

        ingress.read = read  # type: ignore[method-assign]
        ingress.append_many = append_many  # type: ignore[method-assign]
        handoff.offer_messages = offer_messages  # type: ignore[method-assign]

        cloud.report(JOB, "train", "running")
        assert planning.wait(10), "the running report never reached the processor"
        aof_redis.kill()
        planned.set()  # its commit now fails
        wait_until(lambda: logged("processor: redis unavailable"), 20, "the commit to fail")
        restarting.set()
        game.train_completed()
        wait_until(
            lambda: second_in.is_set() or logged("ingress not durable yet"), 20,
            "the completed report taken in, or waiting for Redis",
        )  # fmt: skip
        aof_redis.start()
        cloud.wait_status(JOB, "eval", "ready")
        with probe_of(stack.redis_url) as probe:
            wait_until(lambda: probe.outbox_depth() == 0, 10, "the outbox to drain")
    order = [kind_of(m["content"]) for m in distinct_upstream(cloud, JOB).values()]
    assert order.count(RUNNING) == 1, order
    assert order.index(RUNNING) < order.index(COMPLETED), order
    assert not logged("a report of a stage that is over")
    assert cloud.errors() == []
