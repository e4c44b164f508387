"""Redis goes away: killed and restarted from its AOF, or down past every lease.

The controller waits (never crashes, never acknowledges an MQTT message it could not make
durable), says not-ready on /readyz meanwhile, and carries on from what Redis kept once it
is back. What each appendfsync policy may lose is in docs/reliability.md (Limits):
`always` loses nothing Redis acknowledged; `everysec` may lose about the last second of
writes on a crash of the Redis host (this test kills redis-server only, once Redis has
written everything it acknowledged to the AOF file, and then expects nothing lost).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from service.embedded.processes import Server
from tests.faults.conftest import JOB, Round, probe_of, readyz
from tests.harness import worker_message
from tests.stack import Stack, stack_on
from tests.wait import wait_until

LEASE_S = 2.0  # the harness's LIFELONG_LEASE_SECONDS
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
