"""The operator's round trip as a user runs it: apply, watch, get, describe, delete, each a
subprocess against a real broker, Redis and controller.

Exit codes and stderr are the real ones, so "one clear line, never a traceback" is checked
for what a user would actually see.
"""

from __future__ import annotations

from pathlib import Path

from tests.cli.runner import (
    assert_one_clean_line,
    cli_env,
    get_json,
    run_cli,
    start_cli,
    wait_rows,
)
from tests.harness import NODE, append_lines, lines
from tests.stack import Stack

JOB = "atcii-classifier"
DATASET = "lifelong-dataset"
SECRET = "hunter2-very-secret"

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

    watch = start_cli(env, "watch", "--count", "3", "--timeout", "40")
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
            "version": 1,
            "pending": 0,
            "eval-batches": 1,
            "age": rows[0]["age"],
            "deployed": None,
            "metric": None,
        }
    ]
    table = run_cli(env, "get", "jobs")
    assert table.returncode == 0
    header, row = table.stdout.splitlines()
    assert header.split() == [
        "NAMESPACE", "NAME", "PHASE", "STATE", "VERSION", "PENDING", "EVAL-BATCHES", "AGE",
        "DEPLOYED", "METRIC",
    ]  # fmt: skip
    assert row.split()[:7] == ["default", JOB, "train", "running", "1", "0", "1"]
    datasets = get_json(env, "datasets")
    assert [(d["name"], d["samples"], d["format"]) for d in datasets] == [(DATASET, 10, "txt")]

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
