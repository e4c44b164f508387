"""The controller on RabbitMQ's MQTT plugin (3.10, MQTT 3.1.1 only), with nothing pinned.

RabbitMQ answers an MQTT 5 CONNECT by closing the socket; the controller must find 3.1.1 by
itself and then run a whole round, keep its ingress session across a SIGKILL without losing
a message, and keep presence (retained online, offline through the will) as on mosquitto.
One private node serves the module (see tests/rabbitmq.py); each test uses its own key
prefix and replica name, hence its own client ids, sessions and presence topic.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.enums import MQTTProtocolVersion

from service.adapters.mqtt import MqttClient, MqttSettings
from service.embedded.processes import Server
from tests.harness import (
    NODE,
    PREFIX,
    Cloud,
    Controller,
    append_lines,
    lines,
    model_file,
    samples_file,
    wait_ingress,
)
from tests.rabbitmq import RabbitNode

DATASET = "rabbit-dataset"
FALLBACK = "closed the connection after our MQTT 5 CONNECT without answering it"
#: How long a controller may take to be ready on RabbitMQ: its subscriptions' queues are set
#: up by the broker's Erlang node, which took over 15 s (the default) once while the test
#: suite's three workers loaded the machine's two cores.
READY_S = 60


@pytest.fixture
def cloud(rabbitmq_node: RabbitNode) -> Iterator[Cloud]:
    peer = Cloud(rabbitmq_node.mqtt_port, protocol=MQTTProtocolVersion.MQTTv311)
    try:
        yield peer
    finally:
        peer.close()


def controller_on(
    node: RabbitNode, redis: Server, workdir: Path, replica: str, key_prefix: str
) -> Controller:
    return Controller(
        workdir / "controllers",
        node.mqtt_url,  # nothing pinned: the controller must find 3.1.1 by itself
        f"redis://127.0.0.1:{redis.port}/0",
        name=replica,
        extra_env={"LIFELONG_KEY_PREFIX": key_prefix},
    )


def retained_presence(node: RabbitNode, replica: str) -> dict[str, Any]:
    """What a newcomer subscribing to the replica's presence topic gets: the retained one.
    (RabbitMQ 3.10 hands retained messages to exact-topic subscriptions only.)"""
    topic = f"{PREFIX}/{NODE}/controllers/{replica}"
    client = MqttClient(
        MqttSettings(url=f"{node.mqtt_url}?protocol=3.1.1", client_id=f"probe-{replica}"),
        subscriptions=[topic],
    )
    client.start()
    try:
        assert client.wait_connected(10)
        body: dict[str, Any] = json.loads(client.inbound.get(timeout=10).payload)
        return body
    finally:
        client.stop()


def presences(cloud: Cloud, replica: str) -> list[str]:
    return [m["state"] for t, m in cloud.messages if t.endswith(f"/controllers/{replica}")]


def test_full_round_on_rabbitmq_found_by_itself(
    rabbitmq_node: RabbitNode, redis_proc: Server, cloud: Cloud, tmp_path: Path
) -> None:
    data = samples_file(tmp_path / "data" / "train.txt")
    out = tmp_path / "out"
    controller = controller_on(rabbitmq_node, redis_proc, tmp_path, "rabbit-round", "rround")
    controller.start()
    try:
        controller.wait_ready(READY_S)
        wait_ingress(controller, cloud)
        log = controller.log()
        assert FALLBACK in log
        assert "as rround-edge-node-ingress (MQTTv311, session present:" in log
        assert retained_presence(rabbitmq_node, "rabbit-round")["state"] == "online"

        cloud.insert_dataset(DATASET, data)
        job = "rabbit-job"
        cloud.insert_job(job, DATASET, out)
        train = cloud.wait_status(job, "train", "ready")["content"]["input"]
        assert Path(train["dataURL"]).read_text().splitlines() == lines(0, 8)
        model = model_file(out / "train" / "1" / "model.pkl", b"trained")
        cloud.report(job, "train", "running")
        cloud.report(job, "train", "completed", model)
        evaluate = cloud.wait_status(job, "eval", "ready")["content"]["input"]
        assert evaluate["models"] == [{"format": "pkl", "url": model}]
        scored = model_file(out / "eval" / "1" / "model.pkl", b"evaluated")
        cloud.report(job, "eval", "completed", scored)
        cloud.wait_status(job, "deploy", "ready")
        assert (out / "deploy" / "index.pkl").read_bytes() == b"evaluated"

        before = len(cloud.upstream(job))
        append_lines(data, lines(10, 20))
        again = cloud.wait_status(job, "train", "ready", after=before)["content"]["input"]
        assert again["outputDir"] == f"{out}/train/2"
        forwarded = {
            (m["content"]["phase"], m["content"]["status"])
            for m in cloud.upstream(job)
            if "output" in m["content"]
        }
        assert forwarded == {("train", "running"), ("train", "completed"), ("eval", "completed")}
        assert cloud.errors() == []
    finally:
        assert controller.stop() == 0
    assert retained_presence(rabbitmq_node, "rabbit-round")["state"] == "offline"


def test_sigkill_resumes_on_the_persistent_session_and_the_will_says_offline(
    rabbitmq_node: RabbitNode, redis_proc: Server, cloud: Cloud, tmp_path: Path
) -> None:
    data = samples_file(tmp_path / "data" / "train.txt")
    controller = controller_on(rabbitmq_node, redis_proc, tmp_path, "rabbit-kill", "rkill")
    controller.start()
    try:
        controller.wait_ready(READY_S)
        wait_ingress(controller, cloud)  # the ingress session now exists on the broker
        assert retained_presence(rabbitmq_node, "rabbit-kill")["state"] == "online"

        controller.kill()
        cloud.wait_for(lambda: presences(cloud, "rabbit-kill")[-1:] == ["offline"], 10, "will")
        assert retained_presence(rabbitmq_node, "rabbit-kill")["state"] == "offline"

        # sent while no controller runs: RabbitMQ queues them in the ingress session
        job = "resumed-job"
        cloud.insert_dataset(DATASET, data)
        cloud.insert_job(job, DATASET, tmp_path / "out")

        controller.start()
        controller.wait_ready(READY_S)
        cloud.wait_for(lambda: 10 in cloud.samples(DATASET), 20, "numberOfSamples 10")
        cloud.wait_status(job, "train", "ready")
        log = controller.log()
        assert log.count(FALLBACK) >= 2  # each process finds 3.1.1 by itself
        assert "as rkill-edge-node-ingress (MQTTv311, session present: True)" in log
        cloud.wait_for(lambda: presences(cloud, "rabbit-kill")[-1:] == ["online"], 10, "online")
        assert retained_presence(rabbitmq_node, "rabbit-kill")["state"] == "online"
        assert cloud.errors() == []
    finally:
        controller.kill()
