"""`apply` and `delete` against a real broker: where each resource goes, and nothing sent to
a node no live controller serves unless --force."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from service.embedded.processes import Server
from tests.cli.documents import DATASET, UNROUTED_JOB
from tests.cli.runner import assert_one_clean_line, cli_env, run_cli, wait_rows
from tests.harness import NODE, stop_paho, wait_ingress
from tests.stack import Stack
from tests.wait import wait_until

MARKER_TOPIC = "sedna/marker-node/downstream"  # a node nobody serves


class Downstream:
    """Every downstream envelope the broker carries, on any node."""

    def __init__(self, client: paho.Client) -> None:
        self.client = client
        self.received: list[tuple[str, dict[str, Any]]] = []
        self.subscribed = threading.Event()

    def envelopes(self) -> list[tuple[str, dict[str, Any]]]:
        return [r for r in self.received if r[0] != MARKER_TOPIC]

    def wait(self, count: int, timeout_s: float = 10) -> list[tuple[str, dict[str, Any]]]:
        wait_until(lambda: len(self.envelopes()) >= count, timeout_s, f"{count} envelopes")
        return self.envelopes()

    def so_far(self) -> list[tuple[str, dict[str, Any]]]:
        """Everything published before now: a marker sent now arrives after all of it (the
        broker keeps one queue per subscriber), so once it is here nothing earlier is due."""
        self.client.publish(MARKER_TOPIC, b"{}", qos=1).wait_for_publish(10)
        wait_until(lambda: (MARKER_TOPIC, {}) in self.received, 10, "the marker")
        return self.envelopes()


@contextlib.contextmanager
def downstream(port: int) -> Iterator[Downstream]:
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"router-check-{time.time_ns()}")
    seen = Downstream(client)
    client.on_message = lambda _c, _u, m: seen.received.append((m.topic, json.loads(m.payload)))
    client.on_subscribe = lambda *_args: seen.subscribed.set()
    client.connect("127.0.0.1", port)
    client.subscribe("sedna/+/downstream", qos=1)
    client.loop_start()
    try:
        assert seen.subscribed.wait(10)
        yield seen
    finally:
        stop_paho(client)


def test_apply_routes_each_resource_to_its_node(mosquitto: Server, tmp_path: Path) -> None:
    job = json.loads(json.dumps(UNROUTED_JOB))
    job["spec"]["trainSpec"]["template"] = {"spec": {"nodeName": "edge-2"}}
    unrouted = json.loads(json.dumps(UNROUTED_JOB))
    unrouted["metadata"]["name"] = "unrouted"
    stdin = json.dumps([DATASET, job, unrouted])
    env = cli_env(f"mqtt://127.0.0.1:{mosquitto.port}", "redis://127.0.0.1:1/0")
    with downstream(mosquitto.port) as seen:
        # no controller serves any of these nodes: --force sends all the same
        result = run_cli(env, "apply", "-f", "-", "-n", "team-a", "--force", stdin=stdin)
        assert result.returncode == 0, result.stderr
        received = seen.wait(3)
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


def test_sednas_incremental_job_applies_as_it_is(mosquitto: Server) -> None:
    """Sedna's helmet-detection job, `$WORKER_NODE` placeholders and all, goes as it is to
    LIFELONG_NODE_NAME (Sedna's GM sends it to its Dataset's node, which it does not name)."""
    helmet = Path(__file__).parent / "data" / "helmet_detection.yaml"
    env = cli_env(f"mqtt://127.0.0.1:{mosquitto.port}", "redis://127.0.0.1:1/0")
    with downstream(mosquitto.port) as seen:
        result = run_cli(env, "apply", "-f", str(helmet), "--force")
        assert result.returncode == 0, result.stderr
        ((topic, envelope),) = seen.wait(1)
    assert topic == f"sedna/{NODE}/downstream"
    assert envelope["header"]["resourceKind"] == "incrementallearningjob"
    spec = envelope["content"]["spec"]
    assert spec["trainSpec"]["template"]["spec"]["nodeName"] == "$WORKER_NODE"
    assert spec["trainSpec"]["trigger"]["timer"] == {"start": "02:00", "end": "20:00"}
    assert spec["deploySpec"]["trigger"]["condition"]["metric"] == "precision_delta"


def test_nothing_is_sent_to_a_node_no_controller_serves(stack: Stack) -> None:
    stack.controller()  # serves NODE
    env = cli_env(stack.mqtt_url, stack.redis_url)
    elsewhere = json.dumps({**DATASET, "spec": {**DATASET["spec"], "nodeName": "edge-2"}})
    with downstream(stack.broker.port) as seen:
        refused = run_cli(env, "apply", "-f", "-", stdin=elsewhere)
        assert refused.returncode == 1, refused.stderr
        assert_one_clean_line(refused)
        assert "no live controller serves node edge-2 (nodes served: edge-node)" in refused.stderr
        assert "--force" in refused.stderr and refused.stdout == ""
        deleted = run_cli(env, "delete", "dataset", "ds", "--node", "edge-2")
        assert deleted.returncode == 1, deleted.stderr
        assert "no live controller serves node edge-2" in deleted.stderr
        assert seen.so_far() == [], "nothing reached the broker"

        forced = run_cli(env, "apply", "-f", "-", "--force", stdin=elsewhere)
        assert forced.returncode == 0, forced.stderr
        assert forced.stdout == "dataset default/ds sent to sedna/edge-2/downstream\n"
        served = run_cli(env, "delete", "dataset", "ds")
        assert served.returncode == 0, served.stderr
        received = seen.wait(2)
    assert [(t, m["header"]["operation"]) for t, m in received] == [
        ("sedna/edge-2/downstream", "insert"),
        (f"sedna/{NODE}/downstream", "delete"),
    ]


def test_a_node_is_served_while_a_controller_says_online(stack: Stack) -> None:
    env = cli_env(stack.mqtt_url, stack.redis_url)
    url = str(stack.workdir / "data" / "d.txt")  # beneath the controllers' data root
    dataset = json.dumps({**DATASET, "spec": {**DATASET["spec"], "nodeName": NODE, "url": url}})
    before = run_cli(env, "apply", "-f", "-", stdin=dataset)
    assert before.returncode == 1, before.stderr
    assert f"serves node {NODE} (nodes served: none on sedna/+/controllers/+)" in before.stderr

    controller = stack.controller()
    wait_ingress(controller, stack.cloud)
    applied = run_cli(env, "apply", "-f", "-", stdin=dataset)
    assert applied.returncode == 0, applied.stderr
    wait_rows(env, "datasets", lambda rows: [r["name"] for r in rows] == ["ds"])

    controller.stop()  # a graceful stop leaves an offline presence behind
    after = run_cli(env, "apply", "-f", "-", stdin=dataset)
    assert after.returncode == 1, after.stderr
    assert f"serves node {NODE} (nodes served: none" in after.stderr
