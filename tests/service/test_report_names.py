"""Sedna's worker library keeps working under the name rule: it reports over HTTP under the
`WORKER_NAME` Sedna's GM gives a lifelong-learning worker (`train-worker-<5 random>`,
`eval-worker-<5 random>`), which names no job. Over HTTP such a name is accepted for reports
of its kind; over MQTT, where the broker's ACL ties a name to a login, it is refused like any
name not of the form `{job}-{kind}-<suffix>`."""

from __future__ import annotations

import json
from typing import Any

from tests.harness import (
    NODE,
    NS,
    PREFIX,
    worker_message,
)
from tests.stack import Stack

JOB, DATASET = "library-job", "library-dataset"
LIBRARY_TRAIN, LIBRARY_EVAL = "train-worker-x7k2p", "eval-worker-b4c9d"


def library_report(worker: str, kind: str, url: str) -> dict[str, Any]:
    """What `sedna.core.base.JobBase.report_task_info` posts (no ownerInfo: task_info None)."""
    return {
        "name": worker,
        "namespace": NS,
        "ownerName": JOB,
        "ownerKind": "lifelonglearningjob",
        "kind": kind,
        "status": "completed",
        "results": [{"format": "pkl", "url": url, "metrics": None}],
    }


def test_sedna_library_names_work_over_http_and_not_over_mqtt(stack: Stack) -> None:
    cloud = stack.cloud
    controller, out = stack.job_at_train_ready(JOB, DATASET)
    index = f"{out}/train/1/index.pkl"  # the library's KB index, under OUTPUT_URL

    over_mqtt = worker_message(JOB, "train", "completed", index, worker=LIBRARY_TRAIN)
    cloud.publish(f"{PREFIX}/{NODE}/workers/{LIBRARY_TRAIN}/info", json.dumps(over_mqtt).encode())
    refusal = cloud.wait_for(cloud.errors, 10, "the MQTT refusal")[0]
    assert f"'{LIBRARY_TRAIN}' may not report for job default/{JOB}" in refusal["reason"]
    assert cloud.status(JOB, "eval", "ready") is None

    status, answer = controller.post_worker(LIBRARY_TRAIN, library_report(LIBRARY_TRAIN, "train",
                                                                          index))  # fmt: skip
    assert (status, answer) == (200, {"status": 200, "message": "OK"})
    cloud.wait_status(JOB, "eval", "ready")

    # a train worker's library name does not report evaluation
    scored = f"{out}/eval/1/index.pkl"
    status, answer = controller.post_worker(LIBRARY_TRAIN, library_report(LIBRARY_TRAIN, "eval",
                                                                          scored))  # fmt: skip
    assert status == 400 and "may not report" in answer["message"]
    (out / "eval" / "1").mkdir(parents=True)
    (out / "eval" / "1" / "index.pkl").write_bytes(b"kb index")
    status, _ = controller.post_worker(LIBRARY_EVAL, library_report(LIBRARY_EVAL, "eval", scored))
    assert status == 200
    cloud.wait_status(JOB, "deploy", "ready")
    assert (out / "deploy" / "index.pkl").read_bytes() == b"kb index"
