"""CPU per worst-case message: what one inbound message can cost the controller.

Intake decodes and validates a message into an event and encodes it for the ingress stream;
the processor decodes it from there. For the worst messages the limits allow (and the worst
the limits refuse, such as ~1 MiB reports of 62-deep nested lists), this measures that whole
path in this process: `accept_*` + msgpack encode + decode of the accepted event, or, for a
refused message, `accept_*` up to its refusal + the errors-topic record. The baseline is
msgspec decoding the same bytes as plain JSON, untyped: what parsing them costs without the
limits (for the deeply nested report, the cost that stalled the node).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime

import msgspec

from bench.common import Result
from service import wire
from service.errors import InvalidMessage
from service.runtime.intake import (
    Accepted,
    accept_downstream,
    accept_report,
    decode_accepted,
    encode_accepted,
)

REPEATS = 7
TARGET_MS = 50.0
WORKER = "bench-job-train-1"
_REPORT_HEAD = {
    "name": WORKER,
    "namespace": "default",
    "ownerName": "bench-job",
    "ownerKind": "LifelongLearningJob",
    "kind": "train",
    "status": "completed",
}


def _report(**fields: object) -> bytes:
    return json.dumps({**_REPORT_HEAD, **fields}, separators=(",", ":")).encode()


def _nested(depth: int) -> str:
    return "[" * depth + "0" + "]" * depth


def deep_report() -> bytes:
    """~1 MiB report for a job that need not exist, 62-deep nested lists in ownerInfo."""
    unit = _nested(61)
    body = ",".join([unit] * ((wire.MAX_PAYLOAD_BYTES - 400) // (len(unit) + 1)))
    head = _report(results=[], ownerInfo={"x": []})[: -len(b"]}}")]
    return head + body.encode() + b"]}}"


def many_values_report() -> bytes:
    """~1 MiB of small numbers in results: over the value cap."""
    return _report(results=[{"url": "/o/train/1/m", "x": [0] * 400_000}])


def worst_report() -> bytes:
    """A report at every cap at once: 100 results, each with a 950-number metric list,
    ownerInfo just under 64 KiB and 8 levels deep; ~1 MiB."""
    metric = [0.123456] * 950
    results = [
        {"format": "pkl", "url": f"/out/train/1/m{i}.pkl", "metrics": {"acc": metric}}
        for i in range(wire.MAX_RESULTS)
    ]
    deep: object = "x" * 60_000
    for _ in range(wire.MAX_OWNER_INFO_DEPTH - 1):
        deep = {"k": deep}
    return _report(results=results, ownerInfo=deep)


def worst_job() -> bytes:
    """A job at its caps: three pod templates of ~256 KiB and 3,000 nested objects each,
    32 levels deep, and 256 KiB of annotations, within the message's 10,000 containers."""
    template: dict[str, object] = {"spec": {}}
    chain: dict[str, object] = template
    for _ in range(wire.MAX_TEMPLATE_DEPTH - 3):  # + the env list and its items
        inner: dict[str, object] = {}
        chain["c"] = inner
        chain = inner
    chain["env"] = [{"name": f"V{i}", "value": "v" * 62} for i in range(2_900)]
    job = {
        "apiVersion": "sedna.io/v1alpha1",
        "kind": "LifelongLearningJob",
        "metadata": {
            "name": "bench-job",
            "namespace": "default",
            "annotations": {"note": "n" * 60_000},
        },
        "spec": {
            "dataset": {"name": "ds", "trainProb": 0.8},
            "trainSpec": {"template": template},
            "evalSpec": {"template": template},
            "deploySpec": {"template": template},
            "outputDir": "/out",
        },
    }
    header = {
        "namespace": "default",
        "resourceKind": "lifelonglearningjob",
        "resourceName": "bench-job",
        "operation": "insert",
    }
    return json.dumps({"header": header, "content": job}, separators=(",", ":")).encode()


def _accept(data: bytes) -> Accepted:
    if data.startswith(b'{"header"'):
        return accept_downstream("bench/downstream", data, 0)
    return accept_report("bench/report", WORKER, data, 0)


def _path_cost(data: bytes) -> tuple[float, str]:
    """CPU seconds of the whole path for one message (best of REPEATS), and its verdict."""
    best, verdict = float("inf"), ""
    for _ in range(REPEATS):
        started = time.process_time()
        try:
            decode_accepted(encode_accepted(_accept(data)))
            verdict = "accepted"
        except InvalidMessage as e:
            wire.make_rejection("bench", e.detail, data, datetime.now(UTC))
            verdict = e.detail
        best = min(best, time.process_time() - started)
    return best, verdict


def _plain_cost(data: bytes) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        started = time.process_time()
        msgspec.json.decode(data)
        best = min(best, time.process_time() - started)
    return best


VALID: dict[str, Callable[[], bytes]] = {"report": worst_report, "job": worst_job}
REFUSED: dict[str, Callable[[], bytes]] = {
    "1 MiB of 62-deep lists": deep_report,
    "400,000 numbers": many_values_report,
}


def decode_cost() -> list[Result]:
    results = []
    for figure, shapes in (("valid", VALID), ("refused", REFUSED)):
        costs = {}
        for name, make in shapes.items():
            data = make()
            cost, verdict = _path_cost(data)
            if (verdict == "accepted") != (figure == "valid"):
                raise AssertionError(f"{name}: expected {figure}, got {verdict}")
            costs[name] = (cost, _plain_cost(data), len(data), verdict)
        worst = max(costs, key=lambda n: costs[n][0])
        cost, plain, size, _ = costs[worst]
        results.append(
            Result(
                f"9.decode_{figure}",
                f"CPU per worst-case message, {figure} ({worst})",
                cost * 1000,
                "ms",
                baseline=plain * 1000,
                baseline_name="msgspec decoding the same bytes as plain JSON",
                ratio=cost / plain,
                target=f"<= {TARGET_MS:g} ms",
                passed=cost * 1000 <= TARGET_MS,
                details={
                    n: {"ms": c * 1000, "plain_ms": p * 1000, "bytes": b, "verdict": v}
                    for n, (c, p, b, v) in costs.items()
                }
                | {"size_bytes": size},
            )
        )
    return results
