"""Spoofed retained presence, against real mosquitto, Redis and `lifelong serve`: anyone
allowed to publish on the presence topics can leave a retained `online` for a replica that
does not exist, or an `offline` over a live one's (before: either lasted for ever, and
`apply` sent resources to a node nobody serves, told "sent")."""

from __future__ import annotations

import json

from tests.cli.runner import cli_env, run_cli
from tests.harness import NODE, PREFIX, wait_ingress
from tests.stack import Stack


def presence(replica: str, state: str) -> bytes:
    return json.dumps(
        {"replica": replica, "state": state, "since": "2030-01-01T00:00:00.000+00:00"}
    ).encode()


def dataset_on(node: str) -> str:
    return json.dumps({
        "apiVersion": "sedna.io/v1alpha1", "kind": "Dataset",
        "metadata": {"name": "ds", "namespace": "default"},
        "spec": {"url": "/data/train.txt", "format": "txt", "nodeName": node},
    })  # fmt: skip


def test_spoofed_presence_serves_no_node_and_does_not_last(stack: Stack) -> None:
    controller = stack.controller()  # replica r1 serves NODE
    wait_ingress(controller, stack.cloud)
    env = cli_env(stack.mqtt_url, stack.redis_url)
    cloud = stack.cloud

    def retain(topic: str, payload: bytes) -> None:
        cloud.client.publish(topic, payload, qos=1, retain=True).wait_for_publish(10)

    # a replica nobody runs, and one whose payload names a live replica but not its topic's
    retain(f"{PREFIX}/edge-2/controllers/ghost", presence("ghost", "online"))
    retain(f"{PREFIX}/edge-3/controllers/ghost", presence("r1", "online"))
    for node in ("edge-2", "edge-3"):
        refused = run_cli(env, "apply", "-f", "-", stdin=dataset_on(node))
        assert refused.returncode == 1, refused.stderr
        assert f"no live controller serves node {node} (nodes served: {NODE})" in refused.stderr
    served = run_cli(env, "apply", "-f", "-", stdin=dataset_on(NODE))  # the live one counts
    assert served.returncode == 0, served.stderr

    # an `offline` left over the live replica's own presence is put right
    topic = f"{PREFIX}/{NODE}/controllers/r1"
    retain(topic, presence("r1", "offline"))
    cloud.wait_for(
        lambda: [m for t, m in cloud.messages if t == topic][-1]["state"] == "online",
        20, "r1 to say online again",
    )  # fmt: skip
    again = run_cli(env, "apply", "-f", "-", stdin=dataset_on(NODE))
    assert again.returncode == 0, again.stderr


def test_without_redis_the_cli_does_not_guess(stack: Stack) -> None:
    stack.serving()
    env = cli_env(stack.mqtt_url, "redis://127.0.0.1:1/0")
    refused = run_cli(env, "apply", "-f", "-", stdin=dataset_on(NODE))
    assert refused.returncode == 3, refused.stderr
    assert "cannot reach Redis" in refused.stderr and "--force" in refused.stderr
    forced = run_cli(env, "apply", "-f", "-", "--force", stdin=dataset_on(NODE))
    assert forced.returncode == 0, forced.stderr
