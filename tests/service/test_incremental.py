"""Incremental-learning jobs through the whole service: a real broker and Redis, a `lifelong
serve` replica, Models and the job sent by the cloud over MQTT, the reference worker runner
running train and eval commands as Sedna's IL pods would.

Three rounds: round 1 trains from the initial Model and its eval compares the new model with
the deploy Model as it is; round 2 trains from round 1's model and is held back by the deploy
trigger (the deploy Model and the hot-update file keep round 1's); round 3 trains from round
2's model and deploys. Every deploy goes to the deploy Model's url and beside the inference
worker's hot-update config file, which is rewritten to name it; a rollback puts round 1's
model back in both. A replica SIGKILLed mid-round loses nothing."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.worker import Worker
from tests.harness import NODE, append_lines, lines
from tests.stack import Stack
from tests.wait import wait_until

JOB = "helmet-il"
DATASET = "helmet-data"
KIND = "incrementallearningjob"
#: what each model scores on every eval: a trained one by its round, the deploy Model's own
SCORES = {"1": 0.7, "2": 0.6, "3": 0.9, "deploy.bin": 0.5}
CONDITION = {"operator": ">", "threshold": 0, "metric": "accuracy_delta[0]"}

# Train: a model naming its round and the base model it started from (BASE_MODEL_URL).
TRAIN = """
import json, os, pathlib
out = pathlib.Path(os.environ["MODEL_URL"]); out.mkdir(parents=True, exist_ok=True)
base = pathlib.Path(os.environ["BASE_MODEL_URL"])
model = out / "model.bin"
model.write_bytes(b"round %s from %s" % (out.name.encode(), base.read_bytes()[:40]))
pathlib.Path(os.environ["LIFELONG_RESULTS_FILE"]).write_text(
    json.dumps([{"format": "bin", "url": str(model), "metrics": {}}]))
"""

# Eval: every model it is given, in order, scored by its round (or its file name).
EVAL = """
import json, os, pathlib, sys
scores = json.loads(sys.argv[1])
def scored(url):
    path = pathlib.Path(url)
    score = scores.get(path.parent.name, scores.get(path.name))
    return {"format": "bin", "url": url, "metrics": {"accuracy": [score]}}
urls = os.environ["MODEL_URLS"].split(";")
pathlib.Path(os.environ["LIFELONG_RESULTS_FILE"]).write_text(
    json.dumps([scored(url) for url in urls]))
"""


@pytest.fixture
def worker(stack: Stack) -> Iterator[Worker]:
    commands = {
        "train": (sys.executable, "-c", TRAIN),
        "eval": (sys.executable, "-c", EVAL, json.dumps(SCORES)),
    }
    with stack.runner("il-worker", commands) as runner:
        yield runner


def model_resource(name: str, url: Path) -> dict[str, Any]:
    return {
        "apiVersion": "sedna.io/v1alpha1", "kind": "Model",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"url": str(url), "format": "bin"},
    }  # fmt: skip


def il_job(out: Path, hot_config: Path) -> dict[str, Any]:
    """Sedna's IncrementalLearningJob, as its helmet-detection example writes it (templates
    cut short), deploying to the Model `deploy-model` with hot update."""
    template = {"spec": {"nodeName": NODE, "containers": [{"image": "il", "name": "w"}]}}
    return {
        "apiVersion": "sedna.io/v1alpha1",
        "kind": "IncrementalLearningJob",
        "metadata": {
            "name": JOB, "namespace": "default",
            "annotations": {"sedna.io/model-hot-update-config": str(hot_config)},
        },
        "spec": {
            "initialModel": {"name": "initial-model"},
            "dataset": {"name": DATASET, "trainProb": 0.8},
            "trainSpec": {
                "template": template,
                "trigger": {"checkPeriodSeconds": 1, "condition": {
                    "operator": ">=", "threshold": 8, "metric": "num_of_samples"}},
            },
            "evalSpec": {"template": template},
            "deploySpec": {
                "model": {"name": "deploy-model", "hotUpdateEnabled": True,
                          "pollPeriodSeconds": 60},
                "trigger": {"condition": CONDITION},
                "hardExampleMining": {"name": "IBT"},
                "template": template,
            },
            "outputDir": str(out),
        },
    }  # fmt: skip


class Incremental:
    """The job's files: dataset, outputDir, Models, hot-update config."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        root = stack.workdir
        self.data = root / "data" / "helmet.txt"
        self.out = root / "out"
        self.initial = root / "models" / "initial.bin"
        self.deploy = root / "models" / "deploy.bin"
        self.hot_config = root / "hot" / "model_config.json"
        self.hot_model = self.hot_config.parent / "model.bin"
        for path in (self.data, self.initial):
            path.parent.mkdir(parents=True, exist_ok=True)
        self.data.touch()
        self.initial.write_bytes(b"initial model")
        self.deploy.write_bytes(b"serving before any round")

    def send(self) -> None:
        cloud = self.stack.cloud
        cloud.downstream("model", "insert", model_resource("initial-model", self.initial))
        cloud.downstream("model", "insert", model_resource("deploy-model", self.deploy))
        cloud.insert_dataset(DATASET, self.data)
        cloud.downstream(KIND, "insert", il_job(self.out, self.hot_config))

    def statuses(self, phase: str, status: str | None = None) -> list[dict[str, Any]]:
        """The job's statuses of `phase` (and `status`), each once, in order."""
        seen: dict[str, dict[str, Any]] = {}
        for message in self.stack.cloud.upstream(JOB):
            content = message["content"]
            if content.get("phase") == phase and status in (None, content.get("status")):
                assert message["header"]["resourceKind"] == KIND
                seen.setdefault(message["header"]["id"], content)
        return list(seen.values())

    def round(self, version: int) -> dict[str, Any]:
        """Grow the dataset by 10 samples; round `version`'s deploy decision."""
        before = len(self.statuses("deploy"))
        append_lines(self.data, lines((version - 1) * 10, version * 10))
        wait_until(
            lambda: len(self.statuses("deploy")) > before, 60,
            f"round {version}'s deploy decision", detail=self.stack.cloud.summary,
        )  # fmt: skip
        return self.statuses("deploy")[before]

    def hot(self) -> dict[str, Any]:
        model_config: dict[str, Any] = json.loads(self.hot_config.read_text())["model_config"]
        return model_config


def trained(il: Incremental, version: int) -> Path:
    return il.out / "train" / str(version) / "model.bin"


def test_three_rounds_from_the_initial_model_with_the_gate_hot_update_and_rollback(
    stack: Stack, worker: Worker
) -> None:
    stack.controller()
    il = Incremental(stack)
    il.send()

    first = il.round(1)
    assert first["status"] == "ready" and first["gate"]["holds"] is True
    [train] = il.statuses("train", "ready")
    assert train["input"]["models"] == [{"format": "bin", "url": str(il.initial)}]
    assert trained(il, 1).read_bytes() == b"round 1 from initial model"
    [evaluation] = il.statuses("eval", "ready")
    assert [m["url"] for m in evaluation["input"]["models"]] == [
        str(trained(il, 1)), str(il.deploy)
    ], "round 1 compares with the deploy Model as it is"
    assert first["gate"]["deployedVersion"] == 0
    assert [m["url"] for m in first["input"]["models"]] == [str(trained(il, 1)), str(il.deploy)]
    assert il.deploy.read_bytes() == trained(il, 1).read_bytes()
    assert il.hot_model.read_bytes() == trained(il, 1).read_bytes()
    assert il.hot()["model_path"] == "/model-hot-update/model.bin"
    first_update = il.hot()["model_update_time"]

    held = il.round(2)
    assert held["status"] == "completed"
    assert held["reason"].startswith("held back by the deploy gate: accuracy_delta[0] = -0.1")
    train = il.statuses("train", "ready")[-1]
    assert train["input"]["models"] == [{"format": "bin", "url": str(trained(il, 1))}]
    assert trained(il, 2).read_bytes().startswith(b"round 2 from round 1 from initial")
    assert il.deploy.read_bytes() == trained(il, 1).read_bytes(), "held back: never copied"
    assert il.hot()["model_update_time"] == first_update

    better = il.round(3)
    assert better["status"] == "ready" and better["gate"]["value"] == pytest.approx(0.2)
    train = il.statuses("train", "ready")[-1]
    assert train["input"]["models"][0]["url"] == str(trained(il, 2)), "the last trained"
    evaluation = il.statuses("eval", "ready")[-1]
    assert evaluation["input"]["models"][-1]["url"] == str(trained(il, 1)), "the deployed"
    assert il.deploy.read_bytes() == trained(il, 3).read_bytes()
    assert il.hot_model.read_bytes() == trained(il, 3).read_bytes()
    third_update = il.hot()["model_update_time"]
    assert third_update > first_update

    # a rollback, sent by the cloud, puts round 1's model back in both places
    stack.cloud.downstream(KIND, "rollback", None, name=JOB)
    wait_until(lambda: il.statuses("deploy", "ready")[-1].get("rollback"), 30, "the rollback")
    assert il.statuses("deploy", "ready")[-1]["rollback"] == {"toVersion": 1, "fromVersion": 3}
    assert il.deploy.read_bytes() == trained(il, 1).read_bytes()
    assert il.hot_model.read_bytes() == trained(il, 1).read_bytes()
    assert il.hot()["model_update_time"] > third_update
    assert not stack.cloud.errors()


def test_a_missing_model_fails_the_round_with_the_reason_and_the_next_try_finds_it(
    stack: Stack, worker: Worker
) -> None:
    stack.controller()
    il = Incremental(stack)
    cloud = stack.cloud
    cloud.downstream("model", "insert", model_resource("deploy-model", il.deploy))
    cloud.insert_dataset(DATASET, il.data)
    cloud.downstream(KIND, "insert", il_job(il.out, il.hot_config))
    append_lines(il.data, lines(0, 10))
    failed = wait_until(lambda: il.statuses("train", "failed"), 30, "the round to fail")
    assert failed[0]["reason"] == (
        "Model default/initial-model (the job's initialModel) does not exist on this node: "
        "the round waits for it"
    )
    cloud.downstream("model", "insert", model_resource("initial-model", il.initial))
    wait_until(lambda: il.statuses("deploy", "ready"), 60, "a round once the Model is there")
    assert il.deploy.read_bytes() == b"round 2 from initial model"


def test_a_replica_killed_mid_round_loses_nothing(stack: Stack, worker: Worker) -> None:
    first = stack.serving("r1")
    il = Incremental(stack)
    il.send()
    il.round(1)
    stack.controller("r2")  # takes the shards over once r1 is gone
    append_lines(il.data, lines(10, 20))
    wait_until(lambda: len(il.statuses("eval", "ready")) == 2, 60, "round 2's eval")
    first.kill()
    wait_until(lambda: len(il.statuses("deploy")) == 2, 60, "round 2's decision after the kill")
    assert il.statuses("deploy")[1]["status"] == "completed", "held back, as without the kill"
    append_lines(il.data, lines(20, 30))
    wait_until(lambda: len(il.statuses("deploy")) == 3, 60, "round 3 after the kill")
    assert il.deploy.read_bytes() == trained(il, 3).read_bytes()
    assert [len(il.statuses(phase, "ready")) for phase in ("train", "eval")] == [3, 3]
