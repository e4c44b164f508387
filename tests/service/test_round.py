"""A full Sedna-style round over real MQTT and Redis, with real files on disk."""

from __future__ import annotations

from pathlib import Path

from tests.harness import NS, append_lines, job_resource, lines, worker_message
from tests.stack import Stack

JOB = "atcii-classifier"
DATASET = "lifelong-dataset"


def read_lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines()


def test_full_round_over_mqtt(stack: Stack) -> None:
    cloud = stack.cloud
    data = stack.samples()
    out = stack.workdir / "out"
    (out / "deploy").mkdir(parents=True)
    (out / "deploy" / "index.pkl").write_bytes(b"an older, larger model file" * 10)
    stack.controller()

    cloud.insert_dataset(DATASET, data)
    cloud.downstream(
        "lifelonglearningjob", "insert", job_resource(JOB, DATASET, str(out)), as_base64=True
    )

    cloud.wait_for(lambda: 10 in cloud.samples(DATASET), 15, "numberOfSamples 10")
    ready = cloud.wait_status(JOB, "train", "ready")
    assert ready["header"]["namespace"] == NS and ready["header"]["operation"] == "status"
    assert ready["header"]["id"]
    train_input = ready["content"]["input"]
    assert train_input == {
        "dataURL": f"{out}/data/train/1/data.txt",
        "outputDir": f"{out}/train/1",
    }
    assert read_lines(train_input["dataURL"]) == lines(0, 8)

    # the train worker runs and completes with a model
    model = out / "train" / "1" / "model.pkl"
    model.parent.mkdir(parents=True)
    model.write_bytes(b"trained")
    cloud.report(JOB, "train", "running")
    cloud.report(JOB, "train", "completed", str(model))
    evaluate = cloud.wait_status(JOB, "eval", "ready")
    eval_input = evaluate["content"]["input"]
    assert eval_input["models"] == [{"format": "pkl", "url": str(model)}]
    assert eval_input["outputDir"] == f"{out}/eval/1"
    assert read_lines(eval_input["dataURL"]) == lines(8, 10)

    # every worker message was forwarded upstream as it came
    forwarded = [m["content"] for m in cloud.upstream(JOB) if "output" in m["content"]]
    assert [(f["phase"], f["status"]) for f in forwarded] == [
        ("train", "running"),
        ("train", "completed"),
    ]
    assert (
        forwarded[1]["output"]["models"]
        == worker_message(JOB, "train", "completed", str(model))["results"]
    )
    assert forwarded[1]["output"]["ownerInfo"] == {"kind": "train"}

    # eval completes: the model is copied over the older, larger deploy file
    scored = out / "eval" / "1" / "model.pkl"
    scored.parent.mkdir(parents=True)
    scored.write_bytes(b"evaluated model")
    cloud.report(JOB, "eval", "completed", str(scored))
    deploy = cloud.wait_status(JOB, "deploy", "ready")
    assert deploy["content"]["input"]["models"] == [{"format": "pkl", "url": str(scored)}]
    assert (out / "deploy" / "index.pkl").read_bytes() == b"evaluated model"

    # back to train: new samples start round 2 with exactly the new train share
    before = len(cloud.upstream(JOB))
    append_lines(data, lines(10, 20))
    ready2 = cloud.wait_status(JOB, "train", "ready", after=before)
    assert ready2["content"]["input"]["outputDir"] == f"{out}/train/2"
    assert read_lines(ready2["content"]["input"]["dataURL"]) == lines(10, 18)

    ids = [m["header"]["id"] for m in cloud.upstream()]
    assert len(ids) == len(set(ids)), "upstream ids are unique"
    assert cloud.errors() == []
