"""A flood of hostile reports degrades for their sender, not for the node.

The issue's payload: ~1 MiB worker reports of 62-deep nested lists in `ownerInfo`, for a job
that need not exist, within the size and depth limits. Each used to cost 0.5-1.3 s of CPU,
twice (intake, then processor); 20 of them lost 109 leases and held an unrelated job's next
`ready` back 84 s. Now they are refused at their shape before parsing, while an unrelated
job runs a whole round: it completes, no lease is lost, and /readyz answers 200 throughout.
"""

from __future__ import annotations

import json
import threading

from service import wire
from tests.harness import NODE, PREFIX, metric_sum, model_file, worker_message
from tests.stack import Stack

FLOOD = 24
JOB, DATASET = "steady-job", "steady-dataset"
ROUND_TIMEOUT_S = 60  # generous: a 2-core VM shared with other test runs


def hostile_report(i: int) -> tuple[str, bytes]:
    """(topic, payload): ~1 MiB, lists nested 62 deep in ownerInfo, for a job nobody knows."""
    worker = f"nobody-{i}-train-1"
    head = json.dumps(worker_message(f"nobody-{i}", "train", "completed", worker=worker))
    unit = "[" * 61 + "0" + "]" * 61
    body = ",".join([unit] * ((wire.MAX_PAYLOAD_BYTES - len(head) - 64) // (len(unit) + 1)))
    payload = head.replace('"ownerInfo": {"kind": "train"}', '"ownerInfo": {"x": [' + body + "]}")
    assert len(payload) <= wire.MAX_PAYLOAD_BYTES
    return f"{PREFIX}/{NODE}/workers/{worker}/info", payload.encode()


def test_a_flood_of_deeply_nested_reports_leaves_an_unrelated_round_alone(stack: Stack) -> None:
    cloud = stack.cloud
    controller, out = stack.job_at_train_ready(JOB, DATASET)

    statuses: list[int] = []
    done = threading.Event()

    def watch_readiness() -> None:
        while not done.wait(0.2):
            statuses.append(controller.get("/readyz")[0])

    watcher = threading.Thread(target=watch_readiness, daemon=True)
    watcher.start()
    flood = [hostile_report(i) for i in range(FLOOD)]
    try:
        for topic, payload in flood[: FLOOD // 2]:
            cloud.publish(topic, payload)
        model = model_file(out / "train" / "1" / "model.pkl", b"trained")
        cloud.report(JOB, "train", "completed", model)
        for topic, payload in flood[FLOOD // 2 :]:
            cloud.publish(topic, payload)
        cloud.wait_status(JOB, "eval", "ready", timeout_s=ROUND_TIMEOUT_S)
        scored = model_file(out / "eval" / "1" / "model.pkl", b"scored")
        cloud.report(JOB, "eval", "completed", scored)
        cloud.wait_status(JOB, "deploy", "ready", timeout_s=ROUND_TIMEOUT_S)
        cloud.wait_for(lambda: len(cloud.errors()) >= FLOOD, ROUND_TIMEOUT_S, "every refusal")
    finally:
        done.set()
        watcher.join(5)

    assert (out / "deploy" / "index.pkl").read_bytes() == b"scored"
    errors = cloud.errors()
    assert len(errors) == FLOOD
    assert all("more than 10000 arrays and objects" in e["reason"] for e in errors), errors[0]
    assert metric_sum(controller, "lifelong_rejections_total", reason="too_many") == FLOOD
    log = controller.log()
    assert "lost" not in log and "given up" not in log, "a lease was lost"
    assert metric_sum(controller, "lifelong_leases_held") == 16
    assert statuses and set(statuses) == {200}, statuses
