"""Reports are bound to their round and stage over HTTP too, and a job whose workers' names
could not fit is refused when it arrives: a real controller on a real broker and Redis.

Over HTTP (no broker login, and no token unless one is configured) Sedna's library names
(`train-worker-<suffix>`) say nothing of the job. A round's `failed` replayed in the next
round under the runner's round-carrying name used to fail that round; a library-named
`failed` of a stage the job had left was forwarded upstream (a condition injected into the
cloud's job). Both are refused now with the reason, change nothing and go nowhere.
"""

from __future__ import annotations

import json

from tests.harness import NODE, NS, PREFIX, worker_message
from tests.stack import Stack

JOB, DATASET = "bound-job", "bound-dataset"


def _failed(worker: str, kind: str) -> dict[str, object]:
    return worker_message(JOB, kind, "failed", worker=worker)


def test_http_reports_of_another_round_or_stage_change_nothing(stack: Stack) -> None:
    cloud = stack.cloud
    controller, out = stack.job_at_train_ready(JOB, DATASET)

    # round 1 fails by its runner-named worker; round 2 starts once its backoff is over
    status, _ = controller.post_worker(f"{JOB}-train-1", _failed(f"{JOB}-train-1", "train"))
    assert status == 200
    cloud.wait_status(JOB, "train", "failed")
    before = len(cloud.upstream(JOB))
    ready = cloud.wait_status(JOB, "train", "ready", timeout_s=30, after=before)
    assert ready["content"]["input"]["outputDir"] == f"{out}/train/2"

    # round 1's failure again, in round 2: refused, and round 2 still runs
    at_ready = len(cloud.upstream(JOB))
    status, answer = controller.post_worker(f"{JOB}-train-1", _failed(f"{JOB}-train-1", "train"))
    assert status == 400, answer
    assert f"for round 1, but job {NS}/{JOB} is at round 2" in answer["message"]

    # Sedna's library name, for the eval stage the job has not begun: refused, not forwarded
    status, answer = controller.post_worker(
        "eval-worker-x7k2p", _failed("eval-worker-x7k2p", "eval")
    )
    assert status == 400, answer
    assert "is not running its eval stage (it is train/running at round 2)" in answer["message"]

    # the valid neighbour: round 2's own train worker, by its library name, is heard
    model = out / "train" / "2" / "model.pkl"
    model.parent.mkdir(parents=True)
    model.write_bytes(b"round 2")
    done = worker_message(JOB, "train", "completed", str(model), worker="train-worker-b4c9d")
    assert controller.post_worker("train-worker-b4c9d", done)[0] == 200
    cloud.wait_status(JOB, "eval", "ready", after=at_ready)
    statuses = [
        (m["content"]["phase"], m["content"]["status"]) for m in cloud.upstream(JOB)[at_ready:]
    ]
    assert ("train", "failed") not in statuses and ("eval", "failed") not in statuses, statuses


def test_a_job_name_its_workers_names_cannot_carry_is_refused(stack: Stack) -> None:
    """228 characters: `{job}-train-{version}` would pass 253 from some round on (at once
    for a 246-character name): refused at intake with the reason. 227 still works, and its
    runner-named worker's reports are heard."""
    cloud = stack.cloud
    stack.job_at_train_ready(JOB, DATASET)
    data = stack.workdir / "data" / "train.txt"
    too_long, longest = "j" * 228, "j" * 227
    cloud.insert_job(too_long, DATASET, stack.workdir / "a")
    refusal = cloud.wait_for(cloud.errors, 10, "the long name's refusal")[0]
    assert "$.metadata.name" in refusal["reason"]
    assert "at most 227 characters (228 given)" in refusal["reason"]

    cloud.insert_dataset(DATASET, data)
    cloud.insert_job(longest, DATASET, stack.workdir / "b")
    cloud.wait_status(longest, "train", "ready")
    worker = f"{longest}-train-1"
    running = worker_message(longest, "train", "running", worker=worker)
    cloud.publish(f"{PREFIX}/{NODE}/workers/{NS}/{worker}/info", json.dumps(running).encode())
    cloud.wait_for(
        lambda: any(m["content"].get("status") == "running" for m in cloud.upstream(longest)),
        10,
        "the longest name's report forwarded",
    )
    assert len(cloud.errors()) == 1, cloud.errors()
