"""The one wrapper the demo, the tests and the benchmarks run a replica with: a replica that
cannot start fails the wait at once with its log, not after the timeout; a frozen replica
still stops on SIGTERM."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.embedded.processes import ControllerProcess
from tests.harness import Controller
from tests.servers import Server


def test_a_replica_that_exits_fails_the_wait_with_its_log(tmp_path: Path) -> None:
    env = {"LIFELONG_MQTT_URL": "nonsense://", "LIFELONG_DATA_ROOTS": str(tmp_path)}
    replica = ControllerProcess("r1", tmp_path / "r1.log", env)
    replica.start()
    with pytest.raises(RuntimeError, match=r"controller r1 exited \(\d+\) before it was ready"):
        replica.wait_ready(600)  # the exit ends the wait, long before this
    assert "nonsense" in replica.log()
    assert replica.stop() not in (None, 0)


def test_a_frozen_replica_stops_on_sigterm(
    tmp_path: Path, mosquitto: Server, redis_proc: Server
) -> None:
    replica = Controller(
        tmp_path / "controllers",
        f"mqtt://127.0.0.1:{mosquitto.port}",
        f"redis://127.0.0.1:{redis_proc.port}/0",
    )
    replica.start()
    replica.wait_ready()
    replica.freeze()
    assert replica.stop(grace_s=60) == 0, "thawed, it shut down on SIGTERM"
    assert "shutting down" in replica.log()
