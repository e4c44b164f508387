"""The deploy gate, round history and rollback through the whole service: a real broker and
Redis, a `lifelong serve` replica, the reference worker runner running train and eval
commands, and the `lifelong` CLI as an operator runs it.

Round 1 deploys (nothing to beat), round 2's model is worse and is held back (the deploy file
keeps round 1's bytes), round 3's is better and deploys; a rollback then restores round 1's
model byte for byte; a rollback to a round never deployed, and one whose model file is gone,
are refused with the reason. `describe`, `get` and /metrics show all of it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.worker import Worker
from tests.harness import NODE, Controller, append_lines, job_resource, lines, metric_sum
from tests.stack import Stack
from tests.wait import wait_until

JOB = "gated-job"
DATASET = "gated-data"
ROOT = Path(__file__).resolve().parents[2]
#: each round's model scores this on every eval (the deployed model too, by its round)
SCORES = {1: 0.7, 2: 0.6, 3: 0.9}
CONDITION = {"operator": ">", "threshold": 0, "metric": "accuracy_delta[0]"}

# Train: a model file whose bytes name its round (and differ in length from round to round).
TRAIN = """
import json, os, pathlib
out = pathlib.Path(os.environ["OUTPUT_URL"]); out.mkdir(parents=True, exist_ok=True)
version = int(out.name)
model = out / "model.bin"
model.write_bytes(b"model of round %d " % version * (10 * version))
pathlib.Path(os.environ["LIFELONG_RESULTS_FILE"]).write_text(
    json.dumps([{"format": "bin", "url": str(model), "metrics": {}}]))
"""

# Eval: the new model first, then the deployed one, each scored by its round (SCORES).
EVAL = """
import json, os, pathlib, sys
scores = json.loads(sys.argv[1])
def scored(url):
    version = pathlib.Path(url).parent.name
    return {"format": "bin", "url": url, "metrics": {"accuracy": [scores[version]]}}
urls = os.environ["MODEL_URLS"].split(";")
deployed = os.environ.get("DEPLOYED_MODEL_URL")
results = [scored(urls[0])] + ([scored(deployed)] if deployed else [])
pathlib.Path(os.environ["LIFELONG_RESULTS_FILE"]).write_text(json.dumps(
    {"results": results, "ownerInfo": {"deployed": deployed, "modelUrls": urls}}))
"""


def model_bytes(version: int) -> bytes:
    return b"model of round %d " % version * (10 * version)


@pytest.fixture
def worker(stack: Stack) -> Iterator[Worker]:
    commands = {
        "train": (sys.executable, "-c", TRAIN),
        "eval": (sys.executable, "-c", EVAL, json.dumps(SCORES)),
    }
    with stack.runner("gate-worker", commands) as runner:
        yield runner


def cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "LIFELONG_MQTT_URL": stack.mqtt_url,
        "LIFELONG_REDIS_URL": stack.redis_url,
        "LIFELONG_NODE_NAME": NODE,
    }
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        env=env, capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
    )  # fmt: skip


def deploy_statuses(stack: Stack) -> list[dict[str, Any]]:
    """The controller's deploy decisions for the job, in order (no deploy worker here)."""
    seen: dict[str, dict[str, Any]] = {}
    for message in stack.cloud.upstream(JOB):
        if message["content"].get("phase") == "deploy":
            seen.setdefault(message["header"]["id"], message["content"])
    return list(seen.values())


def gated_job(stack: Stack) -> tuple[Path, Path, Path]:
    """An empty dataset and the job on it, gated by `CONDITION`, sent by the cloud: the
    dataset file, the job's outputDir and its deploy file."""
    data = stack.workdir / "data" / "train.txt"
    data.parent.mkdir(parents=True)
    data.touch()
    out = stack.workdir / "out"
    job = job_resource(JOB, DATASET, str(out))
    job["spec"]["deploySpec"]["trigger"] = {"condition": CONDITION}
    stack.cloud.insert_dataset(DATASET, data)
    stack.cloud.downstream("lifelonglearningjob", "insert", job)
    return data, out, out / "deploy" / "index.pkl"


def next_round(stack: Stack, data: Path, version: int) -> dict[str, Any]:
    """Grow the dataset by 10 samples; wait for round `version`'s deploy decision."""
    before = len(deploy_statuses(stack))
    append_lines(data, lines((version - 1) * 10, version * 10))
    wait_until(lambda: len(deploy_statuses(stack)) > before, 40, f"round {version}'s decision",
               detail=stack.cloud.summary)  # fmt: skip
    decision = deploy_statuses(stack)[before]
    assert decision["gate"]["version"] == version
    return decision


def test_gate_holds_back_a_worse_model_and_rollback_restores_the_previous(
    stack: Stack, worker: Worker
) -> None:
    controller = stack.controller()
    data, out, deployed = gated_job(stack)

    first = next_round(stack, data, 1)
    assert first["status"] == "ready" and first["gate"]["holds"] is True
    assert deployed.read_bytes() == model_bytes(1)

    held = next_round(stack, data, 2)
    assert held["status"] == "completed"
    assert held["reason"] == (
        "held back by the deploy gate: accuracy_delta[0] = -0.1: "
        "accuracy_delta[0] > 0 does not hold"
    )
    assert held["gate"] == {
        "metric": "accuracy_delta[0]", "operator": ">", "threshold": 0.0,
        "value": pytest.approx(-0.1), "holds": False, "version": 2, "deployedVersion": 1,
    }  # fmt: skip
    assert [m["metrics"] for m in held["output"]["models"]] == [
        {"accuracy": [0.6]}, {"accuracy": [0.7]}
    ]
    assert deployed.read_bytes() == model_bytes(1), "a held-back model never reaches the file"

    better = next_round(stack, data, 3)
    assert better["status"] == "ready" and better["gate"]["value"] == pytest.approx(0.2)
    assert deployed.read_bytes() == model_bytes(3)
    # the eval was told which model is deployed: round 3 compared with round 1's file
    evals = [
        m["content"]["input"]
        for m in stack.cloud.upstream(JOB)
        if (m["content"].get("phase"), m["content"]["status"]) == ("eval", "ready")
    ]
    assert evals[-1]["deployedModel"] == {"format": "bin", "url": f"{out}/train/1/model.bin"}
    assert evals[-1]["models"][-1] == evals[-1]["deployedModel"]
    assert "deployedModel" not in evals[0]

    # rollback to the previously deployed version: round 1's model, byte for byte
    rolled = cli(stack, "rollback", "job", JOB)
    assert rolled.returncode == 0, rolled.stderr
    assert rolled.stdout.splitlines()[-1] == (
        f"job default/{JOB} rolled back from version 3 to version 1"
    )
    assert deployed.read_bytes() == model_bytes(1)
    ready = deploy_statuses(stack)[-1]
    assert ready["status"] == "ready" and ready["rollback"] == {"toVersion": 1, "fromVersion": 3}

    # refused: round 2 was never deployed; round 3's model file is gone
    never = cli(stack, "rollback", "job", JOB, "--to-version", "2")
    assert never.returncode == 1
    assert never.stderr.strip() == (
        f"lifelong: rollback of job default/{JOB} refused: version 2 was not deployed recently "
        "(it can restore: 3)"
    )
    (out / "train" / "3" / "model.bin").unlink()
    gone = cli(stack, "rollback", "job", JOB, "--to-version", "3")
    assert gone.returncode == 1
    assert gone.stderr.startswith(f"lifelong: rollback of job default/{JOB} to version 3 refused")
    assert "does not exist" in gone.stderr
    assert deployed.read_bytes() == model_bytes(1)
    assert not list(deployed.parent.glob(".*.tmp")), "no staging file left behind"

    _describe_and_get_show_it_all(stack)
    _metrics_show_it(controller)

    # with no controller serving the node, nothing is sent (its presence says offline)
    controller.stop()
    unserved = cli(stack, "rollback", "job", JOB)
    assert unserved.returncode == 1
    assert "no live controller serves node edge-node" in unserved.stderr


def _describe_and_get_show_it_all(stack: Stack) -> None:
    described = cli(stack, "describe", "job", JOB, "-o", "json")
    assert described.returncode == 0, described.stderr
    data = json.loads(described.stdout)
    assert [(r["version"], r.get("kind", "round"), r["outcome"]) for r in data["rounds"]] == [
        (1, "round", "deployed"),
        (2, "round", "held_back"),
        (3, "round", "deployed"),
        (1, "rollback", "rolled_back"),
        (3, "rollback", "refused"),
    ]
    assert data["mainMetric"] == "accuracy[0]"
    assert data["mainMetricValues"] == [0.7, 0.6, 0.9, 0.7, None]
    assert data["deployed"]["version"] == 1
    for record in data["rounds"][:3]:
        assert record["trainStartedMs"] <= record["evalStartedMs"] <= record["deployStartedMs"]
        assert record["deployStartedMs"] <= record["endedMs"]
        assert record["trainSamples"] == 8 + 8 * (record["version"] == 3)
    text = cli(stack, "describe", "job", JOB)
    assert text.returncode == 0, text.stderr
    assert "Deploy gate:    deploy when accuracy_delta[0] > 0" in text.stdout
    assert "Deployed:       version 1 " in text.stdout
    assert "Rounds (last 5, oldest first), accuracy[0]: ▃▁█▃·" in text.stdout
    table = cli(stack, "get", "jobs", "-o", "json")
    [row] = json.loads(table.stdout)
    assert (row["deployed"], row["metric"]) == (1, "accuracy[0]=0.7")


def _metrics_show_it(controller: Controller) -> None:
    labels = {"namespace": "default", "name": JOB}
    assert metric_sum(controller, "lifelong_job_deployed_version", **labels) == 1
    metric = "lifelong_job_model_metric"
    candidate = metric_sum(controller, metric, model="candidate", metric="accuracy", **labels)
    assert candidate == pytest.approx(0.9)  # round 3, the latest eval
    deployed = metric_sum(controller, metric, model="deployed", metric="accuracy", **labels)
    assert deployed == pytest.approx(0.7)  # round 1's model, as round 3's eval measured it


def test_a_rollback_to_a_model_file_changed_since_its_deploy_is_refused(
    stack: Stack, worker: Worker
) -> None:
    """The deploy copy records each deployed model's size and SHA-256; a rollback whose file
    has changed since (rewritten in place, same length) is refused with the reason, and the
    deploy file keeps the model it holds. Put back, the same file rolls back."""
    stack.controller()
    data, out, deployed = gated_job(stack)
    for version in (1, 2, 3):  # 1 and 3 deployed, 2 held back
        next_round(stack, data, version)
    assert deployed.read_bytes() == model_bytes(3)

    round_1 = out / "train" / "1" / "model.bin"
    forged = bytes(reversed(model_bytes(1)))
    assert len(forged) == len(model_bytes(1))
    round_1.write_bytes(forged)
    refused = cli(stack, "rollback", "job", JOB)
    assert refused.returncode == 1
    assert refused.stderr.startswith(
        f"lifelong: rollback of job default/{JOB} to version 1 refused"
    ), refused.stderr
    assert f"model {round_1} is no longer the file that was deployed" in refused.stderr
    assert f"sha256 {hashlib.sha256(model_bytes(1)).hexdigest()} then" in refused.stderr
    assert deployed.read_bytes() == model_bytes(3), "the deploy file keeps its model"
    assert not list(deployed.parent.glob(".*.tmp")), "no staging file left behind"

    round_1.write_bytes(model_bytes(1))
    rolled = cli(stack, "rollback", "job", JOB)
    assert rolled.returncode == 0, rolled.stderr
    assert deployed.read_bytes() == model_bytes(1)
