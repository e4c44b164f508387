"""Redis goes away: killed and restarted from its AOF, or down for 10 s.

The controller waits (never crashes, never acknowledges an MQTT message it could not make
durable), says not-ready on /readyz meanwhile, and carries on from what Redis kept once it
is back. What each appendfsync policy may lose is in docs/reliability.md (Limits):
`always` loses nothing Redis acknowledged; `everysec` may lose about the last second of
writes on a crash of the Redis host (this test kills redis-server only, waits out the second
first and then expects nothing lost).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from service.embedded import Server
from tests.faults.conftest import JOB, QUIET_POLLS, Round, probe_of, readyz, stack_on
from tests.harness import wait_ingress, worker_message
from tests.wait import wait_until

OUTAGE_S = 10.0
EVERYSEC_FLUSH_S = 1.5  # past everysec's one-second fsync window


@pytest.mark.parametrize("aof_redis", ["always", "everysec"], indirect=True)
def test_redis_killed_and_restarted_from_its_aof(
    tmp_path: Path, mosquitto: Server, aof_redis: Server
) -> None:
    policy = aof_redis.argv[-1]
    with stack_on(tmp_path, mosquitto, aof_redis) as stack, probe_of(stack.redis_url) as probe:
        cloud = stack.cloud
        game = Round(stack)
        game.prepare()
        controller = stack.controller(env=QUIET_POLLS)
        wait_ingress(controller, cloud)
        game.create()
        game.train_completed()
        cloud.wait_status(JOB, "eval", "ready")
        if policy == "everysec":
            time.sleep(EVERYSEC_FLUSH_S)
        before = probe.job(JOB)
        assert (before.phase, before.step, before.version) == ("eval", "running", 1)

        aof_redis.kill()
        wait_until(lambda: readyz(controller) == 503, 5, "/readyz to say not ready")
        aof_redis.start()
        wait_until(lambda: readyz(controller) == 200, 15, "/readyz to recover")
        assert probe.job(JOB) == before, "everything Redis acknowledged was kept"

        game.eval_completed()
        cloud.wait_status(JOB, "deploy", "ready", timeout_s=20)
        wait_until(lambda: probe.outbox_depth() == 0, 10, "the outbox to drain")
        game.assert_complete(probe)
        assert controller.proc is not None and controller.proc.poll() is None


@pytest.mark.slow
@pytest.mark.parametrize("aof_redis", ["everysec"], indirect=True)
def test_redis_down_for_10s(tmp_path: Path, mosquitto: Server, aof_redis: Server) -> None:
    """An MQTT report arriving while Redis is down is held unacknowledged until it can be
    made durable; the HTTP endpoint answers 503 (retry) meanwhile; nothing is lost or
    applied twice (the broker's redelivery after the ingress lease moved is deduplicated)."""
    with stack_on(tmp_path, mosquitto, aof_redis) as stack, probe_of(stack.redis_url) as probe:
        cloud = stack.cloud
        game = Round(stack)
        game.prepare()
        controller = stack.controller(env=QUIET_POLLS)
        wait_ingress(controller, cloud)
        game.create()

        aof_redis.stop()
        down_at = time.monotonic()
        wait_until(lambda: readyz(controller) == 503, 5, "/readyz to say not ready")
        game.train_completed()  # over MQTT: taken in, but it cannot be made durable yet
        message = worker_message(JOB, "train", "running")
        status, _ = controller.post_worker(message["name"], message)
        assert status == 503

        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
        assert cloud.status(JOB, "eval", "ready") is None
        assert readyz(controller) == 503
        aof_redis.start()
        wait_until(lambda: readyz(controller) == 200, 15, "/readyz to recover")
        cloud.wait_status(JOB, "eval", "ready", timeout_s=15)
        game.eval_completed()
        cloud.wait_status(JOB, "deploy", "ready")
        wait_until(lambda: probe.outbox_depth() == 0, 10, "the outbox to drain")
        game.assert_complete(probe)
        assert "ingress not durable yet" in controller.log()
