"""A full round against moto's S3 server: dataset, round files and the deploy copy all in S3.

Credentials reach the controller only through the `sedna.io/credential` annotation, as Sedna
sends them. The controller runs with its own TMPDIR, so the test also sees that uploads leave
no temporary file behind (Sedna's bug 11, S3 side; docs/lifecycle.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from service.embedded.processes import Server
from tests.harness import job_resource, lines, wait_ingress
from tests.stack import Stack

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

JOB = "s3-classifier"
DATASET = "s3-dataset"




def text(rows: list[str]) -> bytes:
    return "".join(row + "\n" for row in rows).encode()


def get(s3c: S3Client, url: str) -> bytes:
    bucket, _, key = url.removeprefix("s3://").partition("/")
    return s3c.get_object(Bucket=bucket, Key=key)["Body"].read()


def test_s3_round_with_annotation_credentials(
    stack: Stack, s3_server: Server, s3c: S3Client, bucket: str, tmp_path: Path
) -> None:
    cloud = stack.cloud
    credential = {
        "s3-endpoint": f"127.0.0.1:{s3_server.port}",
        "s3-usehttps": "0",
        "ACCESS_KEY_ID": "testing",
        "SECRET_ACCESS_KEY": "testing",
    }
    s3c.put_object(Bucket=bucket, Key="data/train.txt", Body=text(lines(0, 10)))
    controller_tmp = tmp_path / "controller-tmp"
    controller_tmp.mkdir()
    controller = stack.controller(env={"TMPDIR": str(controller_tmp)})
    wait_ingress(controller, cloud)
    out = f"s3://{bucket}/out"

    cloud.insert_dataset(DATASET, f"s3://{bucket}/data/train.txt", credential=credential)
    cloud.downstream(
        "lifelonglearningjob",
        "insert",
        job_resource(JOB, DATASET, out, credential=credential),
        as_base64=True,
    )
    cloud.wait_for(lambda: 10 in cloud.samples(DATASET), 15, "numberOfSamples 10")

    # train: data and index in S3, exactly the train share
    train_input = cloud.wait_status(JOB, "train", "ready")["content"]["input"]
    assert train_input == {
        "dataURL": f"{out}/data/train/1/data.txt",
        "dataIndexURL": f"{out}/data/train/1/dataIndex.txt",
        "outputDir": f"{out}/train/1",
    }
    assert get(s3c, train_input["dataURL"]) == text(lines(0, 8))
    index = get(s3c, train_input["dataIndexURL"]).decode().splitlines()
    assert index == [f"s3://{bucket}/data/"] + [f"sample-{i}" for i in range(8)]

    # eval: the train model goes in, the last eval batch is the eval data
    s3c.put_object(Bucket=bucket, Key="out/train/1/model.pkl", Body=b"trained in s3")
    trained = f"{out}/train/1/model.pkl"
    cloud.report(JOB, "train", "completed", trained)
    eval_input = cloud.wait_status(JOB, "eval", "ready")["content"]["input"]
    assert eval_input["models"] == [{"format": "pkl", "url": trained}]
    assert eval_input["outputDir"] == f"{out}/eval/1"
    assert eval_input["dataURL"] == f"{out}/data/eval/1/data.txt"
    assert get(s3c, eval_input["dataURL"]) == text(lines(8, 10))
    eval_index = get(s3c, eval_input["dataIndexURL"]).decode().splitlines()
    assert eval_index == [f"s3://{bucket}/data/", "sample-8", "sample-9"]

    # deploy: an S3-to-S3 copy_object over an older, larger deploy object. copy_object keeps
    # the source's user metadata; a download-and-upload would not, so the metadata proves it.
    s3c.put_object(Bucket=bucket, Key="out/deploy/index.pkl", Body=b"an older, larger model" * 9)
    s3c.put_object(
        Bucket=bucket, Key="out/eval/1/model.pkl", Body=b"evaluated", Metadata={"origin": "eval-1"}
    )
    scored = f"{out}/eval/1/model.pkl"
    cloud.report(JOB, "eval", "completed", scored)
    deploy = cloud.wait_status(JOB, "deploy", "ready")
    assert deploy["content"]["input"]["models"] == [{"format": "pkl", "url": scored}]
    assert get(s3c, f"{out}/deploy/index.pkl") == b"evaluated"
    head = s3c.head_object(Bucket=bucket, Key="out/deploy/index.pkl")
    assert head["Metadata"] == {"origin": "eval-1"}

    # the dataset object is re-put larger: round 2 trains on exactly the new train share
    before = len(cloud.upstream(JOB))
    s3c.put_object(Bucket=bucket, Key="data/train.txt", Body=text(lines(0, 20)))
    ready2 = cloud.wait_status(JOB, "train", "ready", after=before)["content"]["input"]
    assert ready2["outputDir"] == f"{out}/train/2"
    assert get(s3c, ready2["dataURL"]) == text(lines(10, 18))
    assert get(s3c, ready2["dataIndexURL"]).decode().splitlines() == [f"s3://{bucket}/data/"] + [
        f"sample-{i}" for i in range(10, 18)
    ]
    assert 20 in cloud.samples(DATASET)

    # bug 11: every upload was staged in the controller's TMPDIR and none is left there
    assert sorted(p.name for p in controller_tmp.rglob("*")) == []
    keys = {o["Key"] for o in s3c.list_objects_v2(Bucket=bucket)["Contents"]}
    assert keys == {
        "data/train.txt",
        "out/data/train/1/data.txt",
        "out/data/train/1/dataIndex.txt",
        "out/data/eval/1/data.txt",
        "out/data/eval/1/dataIndex.txt",
        "out/data/train/2/data.txt",
        "out/data/train/2/dataIndex.txt",
        "out/train/1/model.pkl",
        "out/eval/1/model.pkl",
        "out/deploy/index.pkl",
    }
    assert cloud.errors() == []
