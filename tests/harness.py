"""Drive the real service from outside, as Sedna's cloud and workers would: over MQTT and HTTP.

`Controller` runs `lifelong serve` as a subprocess (so tests can SIGKILL it); `Cloud` is an
MQTT peer that sends downstream resources and worker reports and records every upstream and
errors message.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from service import wire
from service.embedded.processes import ControllerProcess
from tests.wait import wait_until

NODE = "edge-node"
PREFIX = "sedna"
NS = "default"


class Controller(ControllerProcess):
    """One `lifelong serve` replica as a child process, with the tests' settings and their
    ways of talking to its HTTP endpoint."""

    def __init__(
        self,
        workdir: Path,
        mqtt_url: str,
        redis_url: str,
        *,
        name: str = "r1",
        extra_env: dict[str, str] | None = None,
    ) -> None:
        env = {
            "LIFELONG_MQTT_URL": mqtt_url,
            "LIFELONG_REDIS_URL": redis_url,
            "LIFELONG_NODE_NAME": NODE,
            "LIFELONG_LEASE_SECONDS": "2",
            "LIFELONG_DATASET_POLL_SECONDS": "1",
            "LIFELONG_LOG_FORMAT": "text",
            # a test's datasets and output dirs lie in its temporary directory, beside this
            "LIFELONG_DATA_ROOTS": str(workdir.parent),
            **(extra_env or {}),
        }
        super().__init__(name, workdir / f"controller-{name}.log", env)
        self.workdir = workdir
        # sent as a bearer token by the helpers below when the controller requires one
        self.http_token = ""

    def start(self) -> None:
        """Start it and wait until it listens (a controller that exits or stays silent
        fails the test with its log)."""
        super().start()
        self.wait_listening(30)

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.http_token}"} if self.http_token else {}

    def get(self, path: str, timeout_s: float = 5) -> tuple[int, str]:
        """GET `path` of its HTTP endpoint (with the token, if any): see `http_get`."""
        url = f"http://127.0.0.1:{self.http_port}{path}"
        return http_get(url, self.auth_headers(), timeout_s)

    def post_worker(self, worker: str, body: dict[str, Any] | bytes) -> tuple[int, dict[str, Any]]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}/sedna/workers/{worker}/info",
            data=data,
            headers={"Content-Type": "application/json", **self.auth_headers()},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())


class Cloud:
    """The cloud and the workers, as one MQTT peer; records upstream and errors traffic."""

    def __init__(
        self,
        port: int,
        *,
        username: str | None = None,
        password: str | None = None,
        ca_path: str | None = None,
        protocol: MQTTProtocolVersion = MQTTProtocolVersion.MQTTv5,
        durable: bool = False,
    ) -> None:
        """`username`/`password` log in (a broker with a password file); `ca_path` speaks TLS;
        `protocol` is MQTT 5 unless the broker speaks only 3.1.1 (RabbitMQ's MQTT plugin).

        `durable` keeps a persistent session and reconnects fast: a clean-session peer loses
        its subscriptions when the broker restarts and misses what the controller publishes
        before it has re-subscribed; with a persistent session the broker keeps them and
        queues QoS 1 messages while we reconnect, so "every upstream message appears at
        least once" is something a test can check."""
        self.messages: list[tuple[str, dict[str, Any]]] = []
        self._cond = threading.Condition()
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2, client_id=f"cloud-{time.time_ns()}", protocol=protocol
        )
        if username is not None:
            self.client.username_pw_set(username, password)
        if ca_path is not None:
            self.client.tls_set(ca_certs=ca_path)
        self.client.on_message = self._on_message
        self.client.on_connect = self._on_connect
        if durable:
            self.client.reconnect_delay_set(1, 1)
            properties = Properties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = 3600
            self.client.connect("127.0.0.1", port, clean_start=False, properties=properties)
        else:
            self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        self.wait_for(lambda: self._subscribed, 10, "subscription")

    _subscribed = False

    def _on_connect(self, client: paho.Client, *_args: Any) -> None:
        client.subscribe(
            [
                (f"{PREFIX}/{NODE}/upstream", 1),
                (f"{PREFIX}/{NODE}/errors", 1),
                (f"{PREFIX}/{NODE}/controllers/+", 1),
            ]
        )
        self._subscribed = True

    def _on_message(self, _client: paho.Client, _userdata: Any, msg: paho.MQTTMessage) -> None:
        try:
            body = json.loads(msg.payload)
        except ValueError:
            body = {"raw": msg.payload.decode(errors="replace")}
        with self._cond:
            self.messages.append((msg.topic, body))
            self._cond.notify_all()

    def close(self) -> None:
        stop_paho(self.client)

    # ------------------------------------------------------------ sending
    def publish(self, topic: str, payload: bytes) -> None:
        info = self.client.publish(topic, payload, qos=1)
        info.wait_for_publish(10)

    def downstream(
        self,
        kind: str,
        operation: str,
        resource: dict[str, Any] | None,
        *,
        name: str | None = None,
        as_base64: bool = False,
    ) -> None:
        meta = (resource or {}).get("metadata", {})
        content: Any = resource
        if resource is not None and as_base64:
            content = base64.b64encode(json.dumps(resource).encode()).decode()
        data = envelope(
            content,
            kind=kind,
            name=name or meta.get("name"),
            namespace=meta.get("namespace", NS),
            operation=operation,
        )
        self.publish(f"{PREFIX}/{NODE}/downstream", data)

    def insert_dataset(
        self, name: str, url: str | Path, fmt: str = "txt", **options: Any
    ) -> None:
        """Send a Dataset insert (`fmt` and `options` as `dataset_resource` takes them)."""
        self.downstream("dataset", "insert", dataset_resource(name, str(url), fmt, **options))

    def insert_job(self, name: str, dataset: str, output_dir: str | Path, **options: Any) -> None:
        """Send a LifelongLearningJob insert (`options` as `job_resource` takes them)."""
        resource = job_resource(name, dataset, str(output_dir), **options)
        self.downstream("lifelonglearningjob", "insert", resource)

    def report(
        self, job: str, kind: str, status: str, *models: str, worker: str | None = None
    ) -> dict[str, Any]:
        message = worker_message(job, kind, status, *models, worker=worker)
        self.publish_report(message)
        return message

    def publish_report(self, message: dict[str, Any]) -> None:
        """Publish a worker's message on its own worker topic (returns once PUBACKed)."""
        topic = f"{PREFIX}/{NODE}/workers/{message['name']}/info"
        self.publish(topic, json.dumps(message).encode())

    # ------------------------------------------------------------ waiting
    def wait_for(self, predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
        return wait_until(predicate, timeout_s, what, condition=self._cond, detail=self.summary)

    def upstream(self, job: str | None = None) -> list[dict[str, Any]]:
        with self._cond:
            return [
                m
                for t, m in self.messages
                if t.endswith("/upstream") and (job is None or m["header"]["resourceName"] == job)
            ]

    def errors(self) -> list[dict[str, Any]]:
        with self._cond:
            return [m for t, m in self.messages if t.endswith("/errors")]

    def status(self, job: str, phase: str, status: str, after: int = 0) -> dict[str, Any] | None:
        for message in self.upstream(job)[after:]:
            content = message["content"]
            if (
                content.get("phase") == phase
                and content.get("status") == status
                and ("input" in content or status == "failed")
            ):
                return message
        return None

    def wait_status(
        self, job: str, phase: str, status: str, timeout_s: float = 20, after: int = 0
    ) -> dict[str, Any]:
        return self.wait_for(
            lambda: self.status(job, phase, status, after), timeout_s, f"{job} {phase} {status}"
        )  # type: ignore[no-any-return]

    def samples(self, dataset: str) -> list[int]:
        return [
            m["content"]["numberOfSamples"]
            for m in self.upstream(dataset)
            if "numberOfSamples" in m["content"]
        ]

    def assert_each_message_once(self) -> None:
        """Copies of an upstream message share its id and are equal; no message went out
        under two ids (which would mean a transition applied twice)."""
        ids_by_message: dict[str, set[str]] = defaultdict(set)
        messages_by_id: dict[str, set[str]] = defaultdict(set)
        for message in self.upstream():
            ids_by_message[canonical(message)].add(message["header"]["id"])
            messages_by_id[message["header"]["id"]].add(canonical(message))
        shared = {i: m for i, m in messages_by_id.items() if len(m) > 1}
        assert not shared, f"different messages share an id: {shared}"
        twice = {m: i for m, i in ids_by_message.items() if len(i) > 1}
        assert not twice, f"a message went out under several ids: {twice}"

    def summary(self) -> str:
        return "; ".join(
            f"{t.rsplit('/', 1)[-1]}:{json.dumps(m)[:160]}" for t, m in self.messages[-12:]
        )


def stop_paho(client: paho.Client) -> None:
    """Disconnect a test's paho client, end its thread and close its sockets. paho closes
    its thread's wake-up socket pair only when the client is collected, which for a client
    in a reference cycle (its callbacks hold what holds it) falls to the garbage collector,
    and a socket the collector finds open is a ResourceWarning in whatever test runs then."""
    client.disconnect()
    client.loop_stop()
    client._reset_sockets()  # paho has no public way to close the socket pair


def envelope(
    content: Any,
    *,
    kind: str = "lifelonglearningjob",
    name: str = "atcii-classifier-demo",
    namespace: str = "default",
    operation: str = "insert",
) -> bytes:
    """A downstream envelope as Sedna's cloud sends it: JSON, the resource as `content`."""
    header = {
        "namespace": namespace,
        "resourceKind": kind,
        "resourceName": name,
        "operation": operation,
    }
    return json.dumps({"header": header, "content": content}).encode()


def status_header(kind: str, name: str, message_id: str | None = None) -> wire.Header:
    """The header of an upstream status of a resource in namespace `default`."""
    return wire.Header(
        namespace="default",
        resource_kind=kind,
        resource_name=name,
        operation="status",
        id=message_id,
    )
def canonical(message: dict[str, Any]) -> str:
    """A message without its id: equal strings mean the same message."""
    header = {k: v for k, v in message["header"].items() if k != "id"}
    return json.dumps({"header": header, "content": message["content"]}, sort_keys=True)


def worker_message(
    job: str, kind: str, status: str, *models: str, worker: str | None = None
) -> dict[str, Any]:
    return {
        "name": worker or f"{job}-{kind}-worker",
        "namespace": NS,
        "ownerName": job,
        "ownerKind": "LifelongLearningJob",
        "ownerInfo": {"kind": kind},
        "kind": kind,
        "status": status,
        "results": [{"format": "pkl", "url": url, "metrics": {"acc": 0.9}} for url in models],
    }


def dataset_resource(
    name: str, url: str, fmt: str = "txt", *, credential: dict[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if credential is not None:
        meta["annotations"] = {"sedna.io/credential": json.dumps(credential)}
    return {
        "apiVersion": "sedna.io/v1alpha1",
        "kind": "Dataset",
        "metadata": meta,
        "spec": {"url": url, "format": fmt, "nodeName": NODE},
    }


def job_resource(
    name: str,
    dataset: str,
    output_dir: str,
    *,
    train_prob: float = 0.8,
    trigger: dict[str, Any] | None = None,
    credential: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if credential is not None:
        meta["annotations"] = {"sedna.io/credential": json.dumps(credential)}
    template = {"spec": {"nodeName": NODE, "containers": [{"image": "x", "name": "w"}]}}
    return {
        "apiVersion": "sedna.io/v1alpha1",
        "kind": "LifelongLearningJob",
        "metadata": meta,
        "spec": {
            "dataset": {"name": dataset, "trainProb": train_prob},
            "trainSpec": {
                "template": template,
                "trigger": trigger
                or {
                    "checkPeriodSeconds": 1,
                    "timer": {"start": "00:00", "end": "24:00"},
                    "condition": {"operator": ">", "threshold": 0, "metric": "num_of_samples"},
                },
            },
            "evalSpec": {"template": template},
            "deploySpec": {"template": template},
            "outputDir": output_dir,
        },
    }


def lines(start: int, end: int) -> list[str]:
    return [f"sample-{i} label-{i % 3}" for i in range(start, end)]


def append_lines(path: Path, rows: list[str]) -> None:
    with open(path, "a") as f:
        f.write("".join(row + "\n" for row in rows))


def samples_file(path: Path, rows: int = 10) -> Path:
    """A txt dataset of `rows` samples (`lines(0, rows)`) at `path`, its folder made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    append_lines(path, lines(0, rows))
    return path


def http_get(
    url: str, headers: dict[str, str] | None = None, timeout_s: float = 5
) -> tuple[int, str]:
    """GET `url`: the status and body, error statuses included; (0, "") when nothing
    answers (a controller not listening yet, or gone)."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as e:
        with e:
            return int(e.code), e.read().decode()
    except (urllib.error.URLError, OSError):
        return 0, ""


def still_open(client: socket.socket) -> bool:
    """True while the server has neither answered nor closed this connection."""
    client.setblocking(False)
    try:
        client.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        client.setblocking(True)
    return False


def model_file(path: Path, content: bytes) -> str:
    """A model file as a worker leaves it (its folders made); its path, for a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return str(path)


def metric_sum(controller: Controller, name: str, /, **labels: str) -> float:
    """The sum of a metric's samples on the controller's /metrics whose labels match."""
    url = f"http://127.0.0.1:{controller.http_port}/metrics"
    request = urllib.request.Request(url, headers=controller.auth_headers())
    with urllib.request.urlopen(request, timeout=5) as response:
        exposition = response.read().decode()
    total = 0.0
    for line in exposition.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        metric, _, label_text = series.partition("{")
        if metric != name:
            continue
        if all(f'{key}="{val}"' in label_text for key, val in labels.items()):
            total += float(value)
    return total


def wait_ingress(controller: Controller, cloud: Cloud, timeout_s: float = 15) -> None:
    """Block until the controller takes in what is published on its downstream topic,
    proved end to end: a delete of a job nobody knows (harmless, not rejected, and counted
    in lifelong_events_total) is sent until one is counted. The retained `online` presence
    says the same (it waits for the ingress subscription); this also covers a controller
    whose presence a test cannot see.
    """
    deadline = time.monotonic() + timeout_s
    while metric_sum(controller, "lifelong_events_total", type="JobDeleted") == 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"controller {controller.name} never took in the probe")
        cloud.downstream("lifelonglearningjob", "delete", None, name="ingress-probe")
        time.sleep(0.3)
