"""10,000 random messages mixed with valid traffic through the running service.

Random bytes, random JSON, and valid messages mutated at random (fields dropped, retyped,
renamed) go to the downstream and worker topics while two real jobs run a round. The valid
rounds complete exactly as without the noise, the service stays up and logs no traceback,
and refused messages come back on the errors topic. The random messages use their own
names, so none of them may legitimately touch the two jobs.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from tests.harness import (
    NODE,
    PREFIX,
    dataset_resource,
    job_resource,
    lines,
    model_file,
    samples_file,
    worker_message,
)
from tests.stack import Stack

NOISE = 10_000
JOBS = ("steady-a", "steady-b")
DATASET = "fuzz-dataset"


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 3 or roll < 0.4:
        return rng.choice([None, True, 0, -1, 2**70, 1.5, "", "x" * rng.randint(0, 40), "../.."])
    if roll < 0.7:
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {
        rng.choice(["name", "kind", "status", "spec", "a"]): _random_json(rng, depth + 1)
        for _ in range(rng.randint(0, 4))
    }


def _mutate(rng: random.Random, obj: Any) -> Any:
    """A copy of `obj` with one random field dropped, retyped or replaced."""
    if not isinstance(obj, dict) or not obj:
        return _random_json(rng)
    copy = dict(obj)
    key = rng.choice(list(copy))
    action = rng.random()
    if action < 0.3:
        del copy[key]
    elif action < 0.6:
        copy[key] = _random_json(rng)
    else:
        copy[key] = _mutate(rng, copy[key])
    return copy


def _noise(rng: random.Random, i: int, out: Path) -> tuple[str, bytes]:
    downstream = f"{PREFIX}/{NODE}/downstream"
    worker = f"fz-worker-{i}"
    worker_topic = f"{PREFIX}/{NODE}/workers/{worker}/info"
    kind = rng.random()
    if kind < 0.15:
        return rng.choice([downstream, worker_topic]), rng.randbytes(rng.randint(0, 300))
    if kind < 0.3:
        return rng.choice([downstream, worker_topic]), json.dumps(_random_json(rng)).encode()
    if kind < 0.65:
        name = f"fz-job-{i}"
        resource = (
            job_resource(name, DATASET, str(out / name))
            if rng.random() < 0.5
            else (dataset_resource(f"fz-ds-{i}", "/nowhere/fz.txt"))
        )
        envelope = {
            "header": {
                "namespace": "default",
                "resourceKind": resource["kind"],
                "resourceName": resource["metadata"]["name"],
                "operation": rng.choice(["insert", "delete", "upsert"]),
            },
            "content": _mutate(rng, resource) if rng.random() < 0.8 else resource,
        }
        return downstream, json.dumps(
            _mutate(rng, envelope) if rng.random() < 0.3 else envelope
        ).encode()
    report = worker_message(
        f"fz-job-{i % 50}",
        rng.choice(["train", "eval"]),
        rng.choice(["running", "completed", "failed"]),
        "/m.pkl",
        worker=worker,
    )
    return worker_topic, json.dumps(_mutate(rng, report)).encode()


def test_ten_thousand_random_messages_leave_valid_rounds_intact(stack: Stack) -> None:
    rng = random.Random(20261202)
    cloud = stack.cloud
    data = samples_file(stack.workdir / "data.txt")
    out = stack.workdir / "out"
    controller = stack.serving()
    cloud.insert_dataset(DATASET, data)
    for job in JOBS:
        cloud.insert_job(job, DATASET, out / job)
    noise = [_noise(rng, i, out) for i in range(NOISE)]
    half = NOISE // 2
    for topic, payload in noise[:half]:
        cloud.client.publish(topic, payload, qos=1)
    for job in JOBS:
        cloud.wait_status(job, "train", "ready", timeout_s=60)
    for topic, payload in noise[half:]:
        cloud.client.publish(topic, payload, qos=1)
    for job in JOBS:
        trained = model_file(out / job / "train" / "1" / "model.pkl", b"trained " + job.encode())
        cloud.report(job, "train", "completed", trained)
    for job in JOBS:
        cloud.wait_status(job, "eval", "ready", timeout_s=60)
        scored = model_file(out / job / "eval" / "1" / "model.pkl", b"scored " + job.encode())
        cloud.report(job, "eval", "completed", scored)
    for job in JOBS:
        cloud.wait_status(job, "deploy", "ready", timeout_s=60)
        assert (out / job / "deploy" / "index.pkl").read_bytes() == b"scored " + job.encode()
        assert (out / job / "data" / "train" / "1" / "data.txt").read_text().splitlines() == (
            lines(0, 8)
        )
        forwarded = [
            (m["content"]["phase"], m["content"]["status"])
            for m in cloud.upstream(job)
            if "output" in m["content"]
        ]
        assert forwarded == [("train", "completed"), ("eval", "completed")], job
    assert controller.proc is not None and controller.proc.poll() is None, "service alive"
    assert "Traceback" not in controller.log()
    rejected = cloud.wait_for(lambda: len(cloud.errors()) >= NOISE // 4, 60, "rejections")
    assert rejected
    assert all(e["reason"] for e in cloud.errors())
