"""A worker that always fails must not make its job spin: failed rounds back off.

The reference runner (`service.worker`) runs a command that exits 3 with a stderr line, over
a real broker and Redis, for a job that checks its trigger every second. Without backoff the
job started a new round as soon as the last one failed (hundreds of rounds, each writing a
round data file, in a few seconds); now the n-th consecutive failure waits 2^(n-1) check
periods before the next round, and the job's state says how many failures, when the next try
is due, and why the last one failed (exit code and stderr tail).
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as paho
import pytest

from service.config import Config
from service.core.state import JobState
from service.keys import job_key
from service.worker import Worker, WorkerSettings
from tests.harness import NODE, NS
from tests.stack import Stack
from tests.wait import wait_until

JOB = "always-failing"
DATASET = "failing-data"
FAIL = "import sys; sys.stderr.write('loading data\\nboom: no GPU here\\n'); sys.exit(3)"
ROUNDS = 4  # the first round and three retries: 1 + 2 + 4 check periods apart
PERIOD_S = 1


@pytest.fixture
def failing_worker(stack: Stack) -> Iterator[Worker]:
    cfg = Config.from_env({"LIFELONG_MQTT_URL": stack.mqtt_url, "LIFELONG_NODE_NAME": NODE})
    settings = WorkerSettings(
        commands={"train": (sys.executable, "-c", FAIL)}, lc_server="http://127.0.0.1:1"
    )
    worker = Worker(cfg, settings, client_id="failing-worker")
    worker.start()
    yield worker
    worker.stop()


class ReadyClock:
    """Arrival times (monotonic) of the job's train `ready` messages."""

    def __init__(self, client: paho.Client) -> None:
        self.times: list[float] = []
        self._lock = threading.Lock()
        self._inner = client.on_message
        client.on_message = self._on_message

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        if msg.topic.endswith("/upstream"):
            body = json.loads(msg.payload)
            content = body["content"]
            if body["header"]["resourceName"] == JOB and (
                content.get("phase"), content.get("status")
            ) == ("train", "ready"):
                with self._lock:
                    self.times.append(time.monotonic())
        assert self._inner is not None
        self._inner(client, userdata, msg)

    def snapshot(self) -> list[float]:
        with self._lock:
            return list(self.times)


def job_state(stack: Stack) -> JobState:
    state = stack.stored_state(job_key(NS, JOB))
    assert isinstance(state, JobState)
    return state


def test_a_worker_that_always_fails_backs_off(stack: Stack, failing_worker: Worker) -> None:
    clock = ReadyClock(stack.cloud.client)
    stack.controller()
    data = stack.samples()
    out = stack.workdir / "out"
    trigger = {
        "checkPeriodSeconds": PERIOD_S,
        "condition": {"operator": ">", "threshold": 0, "metric": "num_of_samples"},
    }
    stack.cloud.insert_dataset(DATASET, data)
    stack.cloud.insert_job(JOB, DATASET, out, trigger=trigger)
    wait_until(lambda: len(clock.snapshot()) >= ROUNDS, 60, f"{ROUNDS} train readies")
    times = clock.snapshot()[:ROUNDS]

    # a spinning job starts its rounds back to back: the gaps below rule that out
    rounds = len(times)
    written = sorted(p.name for p in (out / "data" / "train").iterdir())
    assert len(written) <= rounds + 1, f"{len(written)} round data files for {rounds} rounds"
    gaps = [b - a for a, b in itertools.pairwise(times)]
    for n, gap in enumerate(gaps, start=1):
        # the n-th failure waits 2^(n-1) periods (timers fire within ~0.1 s of due)
        assert gap >= PERIOD_S * 2 ** (n - 1) - 0.2, f"gap {n} was {gap:.2f} s: {gaps}"

    # the last round seen fails too: its failure is counted and the next try scheduled
    failed = wait_until(
        lambda: (s := job_state(stack)).consecutive_failures >= rounds and s, 10, "state"
    )
    assert failed.retry_at_ms is not None
    assert failed.last_error is not None
    assert "exit code 3" in failed.last_error
    assert "boom: no GPU here" in failed.last_error
    assert failed.consecutive_failures in (rounds - 1, rounds)
    assert stack.cloud.errors() == []
