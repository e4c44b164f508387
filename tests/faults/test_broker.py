"""The broker goes away: restarted with persistence, or down while the controller retries.

An event the broker accepted (PUBACK to the sender) is not lost: it waits in the controller's
persistent ingress session, on the broker's disk across a restart. The controller reconnects
by itself, and what it committed while the broker was gone (the outbox) goes out after.
"""

from __future__ import annotations

import pytest

from tests.faults.conftest import JOB, QUIET_POLLS, Round, probe_of, readyz
from tests.harness import worker_message
from tests.stack import Stack
from tests.wait import wait_until


def test_broker_restart_keeps_an_accepted_event(stack: Stack) -> None:
    """The report reaches the broker while no controller runs, so it waits in the ingress
    session only; the broker restarts; the next controller resumes the session and gets it."""
    cloud = stack.cloud
    game = Round(stack)
    first = game.start("r1")

    first.kill()
    game.train_completed()  # PUBACKed by the broker: accepted, queued for the session
    stack.broker.restart()
    controller = stack.controller("r2", env=QUIET_POLLS)

    cloud.wait_status(JOB, "eval", "ready", timeout_s=20)
    game.eval_completed()
    cloud.wait_status(JOB, "deploy", "ready")
    with probe_of(stack.redis_url) as probe:
        game.assert_complete(probe)
    assert readyz(controller) == 200


@pytest.mark.slow
def test_broker_down_while_the_controller_retries(stack: Stack) -> None:
    """Not ready while the broker is gone; work accepted over HTTP meanwhile is committed
    and its upstream messages wait in the outbox, then go out once the controller is back
    on its own. The broker stays down until both of the controller's MQTT connections
    have failed a reconnect."""
    cloud = stack.cloud
    game = Round(stack)
    controller = game.start()

    with probe_of(stack.redis_url) as probe:
        stack.broker.stop()
        wait_until(lambda: readyz(controller) == 503, 5, "/readyz to say not ready")

        # the train worker reports over HTTP: accepted, applied, its messages queued
        message = worker_message(JOB, "train", "completed", game.train_model())
        assert controller.post_worker(message["name"], message) == (
            200,
            {"status": 200, "message": "OK"},
        )
        wait_until(lambda: probe.job(JOB).phase == "eval", 5, "the report to be applied")
        wait_until(lambda: probe.job(JOB).step == "running", 5, "the eval data to be written")
        queued = probe.outbox_depth()
        assert queued >= 2, "the forwarded report and eval ready wait in the outbox"
        assert cloud.status(JOB, "eval", "ready") is None
        assert readyz(controller) == 503

        # both of its connections (publisher and ingress) noticed, and their first
        # reconnect failed: the controller is retrying on its own
        wait_until(
            lambda: controller.log().count(f"MQTT cannot reach 127.0.0.1:{stack.broker.port}") >= 2,
            15,
            "both MQTT clients to fail a reconnect",
        )
        assert readyz(controller) == 503
        stack.broker.start()
        wait_until(lambda: readyz(controller) == 200, 15, "/readyz to recover")
        cloud.wait_status(JOB, "eval", "ready", timeout_s=15)
        game.eval_completed()
        cloud.wait_status(JOB, "deploy", "ready")
        game.assert_complete(probe)
