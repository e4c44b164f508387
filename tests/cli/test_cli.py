"""The operator CLI as a user runs it: a subprocess against a real broker, Redis and controller.

Exit codes and stderr are the real ones, so "one clear line, never a traceback" is checked
for what a user would actually see.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from service.embedded import Server, free_port
from tests.harness import NODE, append_lines, lines
from tests.servers import locked_mosquitto, running
from tests.stack import Stack

JOB = "atcii-classifier"
DATASET = "lifelong-dataset"
SECRET = "hunter2-very-secret"
ROOT = Path(__file__).resolve().parents[2]

MANIFEST = """\
apiVersion: sedna.io/v1alpha1
kind: Dataset
metadata:
  name: {dataset}
spec:
  url: "{data}"
  format: "txt"
  nodeName: {node}
---
apiVersion: sedna.io/v1alpha1
kind: LifelongLearningJob
metadata:
  name: {job}
  annotations:
    sedna.io/credential: '{{"ACCESS_KEY_ID": "AKIA1", "SECRET_ACCESS_KEY": "{secret}"}}'
spec:
  dataset:
    name: "{dataset}"
    trainProb: 0.8
  trainSpec:
    template:
      spec:
        containers:
          - image: kubeedge/sedna-example-lifelong-learning-atcii-classifier:v0.3.0
            name: train-worker
    trigger:
      checkPeriodSeconds: 1
      timer:
        start: 00:00
        end: 24:00
      condition:
        operator: ">"
        threshold: 0
        metric: num_of_samples
  evalSpec:
    template: {{}}
  deploySpec:
    template: {{}}
  outputDir: "{out}"
"""

BAD_MANIFEST = """\
apiVersion: sedna.io/v1alpha1
kind: LifelongLearningJob
metadata:
  name: bad-job
spec:
  dataset:
    name: ds
    trainProb: 1.5
  trainSpec:
    trigger:
      checkPeriodSeconds: 0
  evalSpec: {}
  deploySpec: {}
  outputDir: relative/out
---
apiVersion: sedna.io/v1alpha1
kind: Dataset
metadata:
  name: ds
spec:
  url: /data/d.txt
  format: xml
  nodeName: edge-node
"""


def cli_env(mqtt_url: str, redis_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "LIFELONG_MQTT_URL": mqtt_url,
        "LIFELONG_REDIS_URL": redis_url,
        "LIFELONG_NODE_NAME": NODE,
    }


def run_cli(
    env: dict[str, str], *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        check=False,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def assert_one_clean_line(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def get_json(env: dict[str, str], kind: str) -> list[dict[str, Any]]:
    result = run_cli(env, "get", kind, "-o", "json")
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


def wait_rows(
    env: dict[str, str], kind: str, predicate: Any, timeout_s: float = 15
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        rows = get_json(env, kind)
        if predicate(rows):
            return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; last rows: {rows}")
        time.sleep(0.3)


def test_apply_get_describe_watch_delete(stack: Stack, tmp_path: Path) -> None:
    cloud = stack.cloud
    data = tmp_path / "data" / "train.txt"
    data.parent.mkdir()
    append_lines(data, lines(0, 10))
    out = tmp_path / "out"
    manifest = tmp_path / "resources.yaml"
    manifest.write_text(
        MANIFEST.format(dataset=DATASET, job=JOB, data=data, out=out, node=NODE, secret=SECRET)
    )
    stack.controller()
    env = cli_env(stack.mqtt_url, stack.redis_url)

    watch = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "watch", "--count", "3", "--timeout", "40"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert watch.stderr is not None
        assert "watching sedna/edge-node/upstream" in watch.stderr.readline()

        applied = run_cli(env, "apply", "-f", str(manifest))
        assert applied.returncode == 0, applied.stderr
        assert applied.stdout.splitlines() == [
            f"dataset default/{DATASET} sent to sedna/{NODE}/downstream",
            f"lifelonglearningjob default/{JOB} sent to sedna/{NODE}/downstream",
        ]
        cloud.wait_status(JOB, "train", "ready")
        cloud.report(JOB, "train", "running")
        stdout, stderr = watch.communicate(timeout=40)
    finally:
        watch.kill()
        watch.wait()
    assert watch.returncode == 0, stderr
    watched = stdout.splitlines()
    assert len(watched) == 3, watched
    assert any(f"dataset default/{DATASET}  numberOfSamples=10" in line for line in watched)
    assert any(f"lifelonglearningjob default/{JOB}  train/ready" in line for line in watched)
    assert any("train/running" in line for line in watched)

    # get: the job is running round 1, its eval batch of 2 samples is kept
    rows = wait_rows(env, "jobs", lambda r: r and r[0]["state"] == "running")
    assert rows == [
        {
            "namespace": "default",
            "name": JOB,
            "phase": "train",
            "state": "running",
            "version": "1",
            "pending": "0",
            "eval-batches": "1",
            "age": rows[0]["age"],
        }
    ]
    table = run_cli(env, "get", "jobs")
    assert table.returncode == 0
    header, row = table.stdout.splitlines()
    assert header.split() == [
        "NAMESPACE", "NAME", "PHASE", "STATE", "VERSION", "PENDING", "EVAL-BATCHES", "AGE",
    ]  # fmt: skip
    assert row.split()[:7] == ["default", JOB, "train", "running", "1", "0", "1"]
    datasets = get_json(env, "datasets")
    assert [(d["name"], d["samples"], d["format"]) for d in datasets] == [(DATASET, "10", "txt")]

    # the train worker completes: describe shows the round's files and the history
    model = out / "train" / "1" / "model.pkl"
    model.parent.mkdir(parents=True)
    model.write_bytes(b"trained")
    cloud.report(JOB, "train", "completed", str(model))
    cloud.wait_status(JOB, "eval", "ready")
    described = run_cli(env, "describe", "job", JOB)
    assert described.returncode == 0, described.stderr
    text = described.stdout
    assert "Phase:          eval, running" in text
    assert "Files of round 1:" in text
    for path in (
        f"{out}/data/train/1/data.txt",
        f"{out}/train/1",
        f"{out}/data/eval/1/data.txt",
        f"{out}/eval/1",
    ):
        assert path in text
    assert f"pkl {model}" in text
    history = text.split("History")[1]
    assert "JobApplied" in history and "WorkerReported" in history
    assert "train/running v1" in history and "eval/running v1" in history
    assert "sedna.io/credential (hidden)" in text
    assert SECRET not in text + applied.stdout + applied.stderr

    # delete: the job leaves `get jobs`, the dataset stays
    deleted = run_cli(env, "delete", "lifelonglearningjob", JOB)
    assert deleted.returncode == 0, deleted.stderr
    wait_rows(env, "jobs", lambda r: r == [])
    assert [d["name"] for d in get_json(env, "datasets")] == [DATASET]
    missing = run_cli(env, "describe", "job", JOB)
    assert missing.returncode == 1
    assert_one_clean_line(missing)
    assert "not found" in missing.stderr
    assert cloud.errors() == []


def test_apply_routes_each_resource_to_its_node(mosquitto: Server, tmp_path: Path) -> None:
    received: list[tuple[str, dict[str, Any]]] = []
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="router-check")
    client.on_message = lambda _c, _u, msg: received.append((msg.topic, json.loads(msg.payload)))
    client.connect("127.0.0.1", mosquitto.port)
    client.subscribe("sedna/+/downstream", qos=1)
    client.loop_start()
    try:
        time.sleep(0.3)
        job = json.loads(json.dumps(JOB_JSON))
        job["spec"]["trainSpec"]["template"] = {"spec": {"nodeName": "edge-2"}}
        unrouted = json.loads(json.dumps(JOB_JSON))
        unrouted["metadata"]["name"] = "unrouted"
        stdin = json.dumps([DATASET_JSON, job, unrouted])
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


DATASET_JSON = {
    "apiVersion": "sedna.io/v1alpha1",
    "kind": "Dataset",
    "metadata": {"name": "ds"},
    "spec": {"url": "/data/d.txt", "format": "txt", "nodeName": "edge-1"},
}
JOB_JSON = {
    "apiVersion": "sedna.io/v1alpha1",
    "kind": "LifelongLearningJob",
    "metadata": {"name": "job"},
    "spec": {
        "dataset": {"name": "ds", "trainProb": 0.5},
        "trainSpec": {"template": {}},
        "evalSpec": {"template": {}},
        "deploySpec": {"template": {}},
        "outputDir": "/out",
    },
}


def test_validate_names_every_bad_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_MANIFEST)
    env = cli_env("mqtt://127.0.0.1:1", "redis://127.0.0.1:1/0")
    result = run_cli(env, "validate", "-f", str(bad))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    problems = result.stdout.splitlines()
    fields = [line.split(": ")[2] for line in problems]
    assert fields == [
        "$.spec.dataset.trainProb",
        "$.spec.trainSpec.trigger.checkPeriodSeconds",
        "$.spec.outputDir",
        "$.spec.format",
    ], problems
    assert problems[0].startswith(f"{bad}: document 1 (LifelongLearningJob bad-job): ")

    # nothing of an invalid file is sent, and apply says why with the same lines
    applied = run_cli(env, "apply", "-f", str(bad))
    assert applied.returncode == 1
    assert applied.stderr.splitlines()[:4] == problems


def test_sedna_examples_validate_as_they_are() -> None:
    env = cli_env("mqtt://127.0.0.1:1", "redis://127.0.0.1:1/0")
    result = run_cli(
        env, "validate", "-f", "examples/dataset.yaml", "-f", "examples/lifelonglearningjob.yaml"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "LifelongLearningJob default/atcii-classifier-demo is valid" in result.stdout


def test_unreachable_servers_exit_3_with_one_line() -> None:
    closed = free_port()
    env = cli_env(f"mqtt://127.0.0.1:{closed}", f"redis://127.0.0.1:{closed}/0")
    for args in (
        ("get", "jobs"),
        ("describe", "job", "x"),
        ("delete", "job", "x", "--timeout", "1"),
        ("watch", "--timeout", "1"),
        ("apply", "-f", "examples/dataset.yaml", "--timeout", "1"),
    ):
        result = run_cli(env, *args)
        assert result.returncode == 3, (args, result.stderr)
        assert_one_clean_line(result)
        assert result.stderr.startswith("lifelong: cannot reach"), result.stderr


def test_broker_refusals_exit_1_with_the_brokers_reason(tmp_path: Path) -> None:
    """An ACL refusing a publish (PUBACK 0x87) and a wrong password are the broker's answers,
    not outages: exit 1 naming them, and nothing refused is reported as sent."""
    acl = "user cli\ntopic readwrite sedna/edge-1/#\n"
    broker = locked_mosquitto(tmp_path / "locked", {"cli": "right-password"}, acl)
    with running(broker):
        url = f"mqtt://cli:right-password@127.0.0.1:{broker.port}"
        env = cli_env(url, "redis://127.0.0.1:1/0")
        routed = json.loads(json.dumps(JOB_JSON))  # to the default node, which cli may not use
        applied = run_cli(env, "apply", "-f", "-", stdin=json.dumps([DATASET_JSON, routed]))
        assert applied.returncode == 1, applied.stderr
        assert applied.stdout.splitlines() == ["dataset default/ds sent to sedna/edge-1/downstream"]
        assert_one_clean_line(applied)
        assert applied.stderr == (
            "lifelong: the MQTT broker refused lifelonglearningjob default/job "
            f"to sedna/{NODE}/downstream (Not authorized)\n"
        )

        deleted = run_cli(env, "delete", "job", "a", "b")
        assert deleted.returncode == 1, deleted.stderr
        assert "sent" not in deleted.stdout
        assert_one_clean_line(deleted)
        assert "refused delete of lifelonglearningjob default/a" in deleted.stderr
        assert "delete of lifelonglearningjob default/b" in deleted.stderr
        allowed = run_cli(env, "delete", "job", "a", "--node", "edge-1")
        assert allowed.returncode == 0, allowed.stderr

        for pin in ("", "?protocol=3.1.1"):
            wrong = cli_env(url.replace("right", "wrong") + pin, "redis://127.0.0.1:1/0")
            refused = run_cli(wrong, "apply", "-f", "-", stdin=json.dumps([DATASET_JSON]))
            assert refused.returncode == 1, refused.stderr
            assert_one_clean_line(refused)
            assert refused.stderr.startswith(
                f"lifelong: the MQTT broker at mqtt://cli:***@127.0.0.1:{broker.port}{pin} "
                "refused the connection: not authorised (the broker said: "
            ), refused.stderr
            assert "wrong-password" not in refused.stderr


def test_bad_usage_and_config_exit_2() -> None:
    env = cli_env("mqtt://127.0.0.1:1", "redis://127.0.0.1:1/0")
    assert run_cli(env, "get", "pods").returncode == 2
    assert run_cli(env, "delete", "job", "Not_A_Name").returncode == 2
    bad_url = run_cli({**env, "LIFELONG_REDIS_URL": "http://x"}, "get", "jobs")
    assert bad_url.returncode == 2
    assert_one_clean_line(bad_url)
    assert "LIFELONG_REDIS_URL" in bad_url.stderr
    missing = run_cli(env, "validate", "-f", "no/such/file.yaml")
    assert missing.returncode == 2
    assert_one_clean_line(missing)
