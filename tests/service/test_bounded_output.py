"""What one report can make the controller keep and send is bounded.

75,000 models in one report used to make a 1.3 MB job state, rewritten every check period,
and a 2.2 MB upstream message, larger than the controller's own 1 MiB inbound limit. Now a
report holds at most 100 results (refused at intake otherwise), a job keeps the first 16
models of a report, and a forwarded report that would exceed 1 MiB goes out trimmed with a
reason. Every message the cloud receives is within the inbound limit.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import paho.mqtt.client as paho
import redis

from service import wire
from service.keys import Keys, job_key
from tests.harness import (
    NODE,
    NS,
    PREFIX,
    Cloud,
    metric_sum,
    worker_message,
)
from tests.stack import Stack
from tests.wait import wait_until

JOB, DATASET = "bounded-job", "bounded-dataset"
WORKER = f"{JOB}-train-1"


class SizedCloud(Cloud):
    """`Cloud` that also keeps the size of every payload it receives."""

    def __init__(self, port: int) -> None:
        self.sizes: list[tuple[str, int]] = []
        self._sizes_lock = threading.Lock()
        super().__init__(port)

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        with self._sizes_lock:
            self.sizes.append((msg.topic, len(msg.payload)))
        super()._on_message(client, userdata, msg)


def send(cloud: Cloud, status: str, results: list[dict[str, Any]], big: str = "") -> None:
    """A report of these results; `big` replaces each "BIG" string with JSON text as is."""
    message = worker_message(JOB, "train", status, worker=WORKER)
    message["results"] = results
    data = json.dumps(message, separators=(",", ":")).replace('"BIG"', big).encode()
    cloud.publish(f"{PREFIX}/{NODE}/workers/{WORKER}/info", data)


def test_models_kept_and_messages_sent_stay_within_the_limits(stack: Stack) -> None:
    stack.cloud.close()
    cloud = SizedCloud(stack.broker.port)
    stack.cloud = cloud
    controller, out = stack.job_at_train_ready(JOB, DATASET)
    round_dir = f"{out}/train/1"

    # 75,000 models in one report (short urls, to fit in 1 MiB), and 101: refused at intake
    send(cloud, "completed", [{"url": "/m"}] * 75_000)
    send(cloud, "completed", [{"format": "pkl", "url": f"{round_dir}/m{i}"} for i in range(101)])
    refusals = cloud.wait_for(lambda: len(cloud.errors()) == 2 and cloud.errors(), 15, "refusals")
    assert "$: more than 10000 arrays and objects (75" in refusals[0]["reason"]
    assert "$.results: more than 100 results (101)" in refusals[1]["reason"]

    # a progress report whose forward would exceed 1 MiB (its numbers written longer)
    heavy = [{"format": "pkl", "url": f"{round_dir}/m{i}", "metrics": {"loss": "BIG"}}
             for i in range(100)]  # fmt: skip
    send(cloud, "running", heavy, "[" + ",".join(["1e15"] * 950) + "]")  # 18 bytes out each
    running = cloud.wait_for(
        lambda: next((m for m in cloud.upstream(JOB)
                      if m["content"].get("status") == "running"), None), 15, "the forward",
    )  # fmt: skip
    content = running["content"]
    assert "over the 1048576-byte limit" in content["reason"]
    assert content["output"]["models"][99] == {"format": "pkl", "url": f"{round_dir}/m99"}
    assert content["output"]["ownerInfo"] == {}

    # 100 models completed: the job keeps 16, its state stays small, eval gets the 16
    send(cloud, "completed", [{"format": "pkl", "url": f"{round_dir}/m{i}"} for i in range(100)])
    ready = cloud.wait_status(JOB, "eval", "ready")
    assert [m["url"] for m in ready["content"]["input"]["models"]] == [
        f"{round_dir}/m{i}" for i in range(16)
    ]
    client = redis.Redis.from_url(stack.redis_url)
    try:
        state = client.get(Keys().state(job_key(NS, JOB)))
    finally:
        client.close()
    assert state is not None and len(state) < 4096, len(state or b"")
    # the journal logs a commit's transitions right after sending its messages
    wait_until(lambda: "kept the first 16 of the 100 models" in controller.log(), 10,
               "the journal's line")  # fmt: skip

    assert metric_sum(controller, "lifelong_rejections_total", reason="too_many") == 2
    with cloud._sizes_lock:
        sizes = list(cloud.sizes)
    assert sizes and max(size for _topic, size in sizes) <= wire.MAX_PAYLOAD_BYTES, sizes
