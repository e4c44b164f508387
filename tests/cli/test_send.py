"""`apply` and `delete` against a real broker: where each resource goes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from service.embedded import Server
from tests.cli.documents import DATASET, UNROUTED_JOB
from tests.cli.runner import cli_env, run_cli
from tests.harness import NODE


def test_apply_routes_each_resource_to_its_node(mosquitto: Server, tmp_path: Path) -> None:
    received: list[tuple[str, dict[str, Any]]] = []
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="router-check")
    client.on_message = lambda _c, _u, msg: received.append((msg.topic, json.loads(msg.payload)))
    client.connect("127.0.0.1", mosquitto.port)
    client.subscribe("sedna/+/downstream", qos=1)
    client.loop_start()
    try:
        time.sleep(0.3)
        job = json.loads(json.dumps(UNROUTED_JOB))
        job["spec"]["trainSpec"]["template"] = {"spec": {"nodeName": "edge-2"}}
        unrouted = json.loads(json.dumps(UNROUTED_JOB))
        unrouted["metadata"]["name"] = "unrouted"
        stdin = json.dumps([DATASET, job, unrouted])
        env = cli_env(f"mqtt://127.0.0.1:{mosquitto.port}", "redis://127.0.0.1:1/0")
        result = run_cli(env, "apply", "-f", "-", "-n", "team-a", stdin=stdin)
        assert result.returncode == 0, result.stderr
        deadline = time.monotonic() + 10
        while len(received) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        client.loop_stop()
        client.disconnect()
    routes = sorted((t, m["header"]["resourceName"]) for t, m in received)
    assert routes == [
        ("sedna/edge-1/downstream", "ds"),
        ("sedna/edge-2/downstream", "job"),
        (f"sedna/{NODE}/downstream", "unrouted"),
    ]
    for _topic, envelope in received:
        assert envelope["header"]["namespace"] == "team-a"
        assert envelope["header"]["operation"] == "insert"
        assert envelope["content"]["metadata"]["namespace"] == "team-a"
