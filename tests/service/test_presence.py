"""`online` means the controller can take messages: a cloud peer may send on first sight.

On a first start there is no MQTT session yet for the ingress client id, so a message
published before the ingress subscription exists is dropped by the broker. The retained
`online` used to be published as soon as the publishing connection was up, before the
ingress client had subscribed: a peer that sent a resource the moment it saw `online` lost
it. Each trial here starts a controller on a fresh key prefix (so a fresh ingress client id,
never seen by the broker), and the peer sends a dataset insert from inside its message
callback, the instant the replica's `online` arrives; the dataset must be taken in.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import paho.mqtt.client as paho

from tests.harness import NODE, PREFIX, Cloud, append_lines, dataset_resource, lines
from tests.stack import Stack

TRIALS = 5
SAMPLES = 3


class EagerCloud:
    """Sends a dataset insert for each replica the instant its `online` is first seen."""

    def __init__(self, cloud: Cloud, data_url: str) -> None:
        self._cloud = cloud
        self._data_url = data_url
        self._greeted: set[str] = set()
        self._lock = threading.Lock()
        self._inner = cloud.client.on_message
        cloud.client.on_message = self._on_message

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        if "/controllers/" in msg.topic and not msg.retain:
            body = json.loads(msg.payload)
            replica = body["replica"]
            with self._lock:
                first = body["state"] == "online" and replica not in self._greeted
                self._greeted.add(replica)
            if first:
                self._send(client, replica)
        assert self._inner is not None
        self._inner(client, userdata, msg)

    def _send(self, client: paho.Client, replica: str) -> None:
        resource = dataset_resource(dataset_name(replica), self._data_url)
        envelope = {
            "header": {"namespace": "default", "resourceKind": "dataset",
                       "resourceName": dataset_name(replica), "operation": "insert"},
            "content": resource,
        }  # fmt: skip
        # from paho's own thread: no waiting here, the PUBACK comes on this very thread
        client.publish(f"{PREFIX}/{NODE}/downstream", json.dumps(envelope).encode(), qos=1)


def dataset_name(replica: str) -> str:
    return f"greeting-{replica}"


def test_a_peer_that_sends_on_first_sight_of_online_loses_nothing(stack: Stack) -> None:
    data = stack.workdir / "data.txt"
    append_lines(data, lines(0, SAMPLES))
    EagerCloud(stack.cloud, str(data))
    for trial in range(TRIALS):
        replica = f"fresh{trial}"
        env = {"LIFELONG_KEY_PREFIX": f"trial{trial}"}
        controller = stack.controller(replica, start=False, env=env)
        controller.start()
        stack.cloud.wait_for(
            lambda r=replica: SAMPLES in stack.cloud.samples(dataset_name(r)),  # type: ignore[misc]
            15,
            f"trial {trial}: the dataset sent on first sight of {replica}'s online",
        )
        controller.kill()


def test_two_replicas_starting_together_say_online_only_when_someone_listens(
    stack: Stack,
) -> None:
    """The replica without the ingress lease may say online once the holder is subscribed;
    a peer that trusts whichever `online` comes first loses nothing either."""
    data = stack.workdir / "data.txt"
    append_lines(data, lines(0, SAMPLES))
    EagerCloud(stack.cloud, str(data))
    for trial in range(TRIALS):
        env = {"LIFELONG_KEY_PREFIX": f"pair{trial}"}
        pair = [stack.controller(f"p{trial}{side}", start=False, env=env) for side in "ab"]
        for controller in pair:
            controller.start()
        for controller in pair:
            stack.cloud.wait_for(
                lambda r=controller.name: SAMPLES in stack.cloud.samples(dataset_name(r)),  # type: ignore[misc]
                15,
                f"trial {trial}: the dataset sent on first sight of {controller.name}'s online",
            )
        for controller in pair:
            controller.kill()
