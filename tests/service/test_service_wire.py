"""The service's wire behaviour, from outside: the HTTP worker endpoint, rejections of every
class on both inbound topics, and Sedna's bugs 11-13 (temporary files, restarts, re-reads;
docs/lifecycle.md).

Every test drives a real `lifelong serve` subprocess over a real broker and Redis.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from service.adapters.redis_store import RedisStore
from service.keys import NUM_SHARDS, Keys
from tests.harness import (
    NODE,
    NS,
    PREFIX,
    Cloud,
    Controller,
    append_lines,
    dataset_resource,
    job_resource,
    lines,
    metric_sum,
    model_file,
    wait_ingress,
    worker_message,
)
from tests.stack import Stack
from tests.wait import wait_until

DATASET = "wire-dataset"
JOB = "wire-job"
DOWNSTREAM = f"{PREFIX}/{NODE}/downstream"
OK = {"status": 200, "message": "OK"}


def worker_topic(worker: str) -> str:
    return f"{PREFIX}/{NODE}/workers/{worker}/info"


def read_lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines()


def local_setup(stack: Stack, rows: int = 10) -> tuple[Path, Path]:
    """A local txt dataset of `rows` samples and an empty output dir."""
    data = stack.samples(rows)
    out = stack.workdir / "out"
    out.mkdir()
    return data, out


def start(stack: Stack, env: dict[str, str] | None = None) -> Controller:
    controller = stack.serving(env=env)
    return controller


def apply(cloud: Cloud, data: Path, out: Path, job: str = JOB) -> None:
    cloud.insert_dataset(DATASET, data)
    cloud.insert_job(job, DATASET, out)


def forwarded(cloud: Cloud, job: str) -> list[tuple[str, str]]:
    """(phase, status) of every worker message forwarded upstream for `job`, in order."""
    return [
        (m["content"]["phase"], m["content"]["status"])
        for m in cloud.upstream(job)
        if "output" in m["content"]
    ]


def full_round(cloud: Cloud, out: Path, job: str = JOB) -> None:
    """Round 1 on the 10 samples of `local_setup`: train, eval, deploy, each checked."""
    ready = cloud.wait_status(job, "train", "ready")["content"]["input"]
    assert read_lines(ready["dataURL"]) == lines(0, 8)
    model = model_file(out / "train" / "1" / "model.pkl", b"trained")
    cloud.report(job, "train", "completed", model)
    evaluate = cloud.wait_status(job, "eval", "ready")["content"]["input"]
    assert read_lines(evaluate["dataURL"]) == lines(8, 10)
    scored = model_file(out / "eval" / "1" / "model.pkl", b"evaluated")
    cloud.report(job, "eval", "completed", scored)
    cloud.wait_status(job, "deploy", "ready")
    assert (out / "deploy" / "index.pkl").read_bytes() == b"evaluated"


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


# ================================================================ HTTP worker endpoint


def test_worker_reports_over_http_drive_a_round(stack: Stack) -> None:
    cloud = stack.cloud
    data, out = local_setup(stack)
    controller = start(stack)
    apply(cloud, data, out)
    ready = cloud.wait_status(JOB, "train", "ready")["content"]["input"]
    assert ready == {"dataURL": f"{out}/data/train/1/data.txt", "outputDir": f"{out}/train/1"}
    rejected_before = metric_sum(controller, "lifelong_rejections_total")

    # refused reports: had any of them been applied, the job would have left train/running
    failed = worker_message(JOB, "train", "failed")
    status, body = controller.post_worker("someone-else", failed)
    assert status == 400 and body["status"] == 400
    assert "does not match" in body["message"] and "someone-else" in body["message"]
    ghost = worker_message("ghost-job", "train", "failed")
    status, body = controller.post_worker(ghost["name"], ghost)
    assert status == 400 and "unknown job default/ghost-job" in body["message"]
    status, body = controller.post_worker(failed["name"], b'{"name": "wire-job-train-worker",')
    assert status == 400 and "not valid JSON" in body["message"]
    assert metric_sum(controller, "lifelong_rejections_total") == rejected_before + 3

    # the valid reports, all through HTTP
    running = worker_message(JOB, "train", "running")
    assert controller.post_worker(running["name"], running) == (200, OK)
    model = model_file(out / "train" / "1" / "model.pkl", b"trained")
    completed = worker_message(JOB, "train", "completed", model)
    assert controller.post_worker(completed["name"], completed) == (200, OK)
    evaluate = cloud.wait_status(JOB, "eval", "ready")["content"]["input"]
    assert evaluate["models"] == [{"format": "pkl", "url": model}]
    assert evaluate["outputDir"] == f"{out}/eval/1"
    assert read_lines(evaluate["dataURL"]) == lines(8, 10)

    scored = model_file(out / "eval" / "1" / "model.pkl", b"evaluated over http")
    eval_done = worker_message(JOB, "eval", "completed", scored)
    assert controller.post_worker(eval_done["name"], eval_done) == (200, OK)
    deploy = cloud.wait_status(JOB, "deploy", "ready")["content"]["input"]
    assert deploy["models"] == [{"format": "pkl", "url": scored}]
    assert (out / "deploy" / "index.pkl").read_bytes() == b"evaluated over http"

    # forwarded upstream exactly as posted, and nothing of the refused ones
    outputs = [m["content"] for m in cloud.upstream(JOB) if "output" in m["content"]]
    assert [(o["phase"], o["status"]) for o in outputs] == [
        ("train", "running"),
        ("train", "completed"),
        ("eval", "completed"),
    ]
    assert outputs[1]["output"] == {"models": completed["results"], "ownerInfo": {"kind": "train"}}
    assert cloud.upstream("ghost-job") == []

    # and the lifecycle carries on into round 2
    before = len(cloud.upstream(JOB))
    append_lines(data, lines(10, 20))
    ready2 = cloud.wait_status(JOB, "train", "ready", after=before)["content"]["input"]
    assert ready2["outputDir"] == f"{out}/train/2"
    assert read_lines(ready2["dataURL"]) == lines(10, 18)
    assert cloud.errors() == []  # HTTP refusals are answered to the worker, not broadcast


# ================================================================ rejections


def envelope(kind: str, operation: str, content: Any, name: str = "some-job") -> dict[str, Any]:
    header = {"namespace": NS, "resourceKind": kind, "resourceName": name, "operation": operation}
    return {"header": header, "content": content}


DEEP = "@deep@"
JOB_KIND = "lifelonglearningjob"


def nest(payload: bytes, depth: int = 1000) -> bytes:
    """Put arrays nested `depth` deep where the DEEP marker string is (json.dumps cannot)."""
    return payload.replace(f'"{DEEP}"'.encode(), b"[" * depth + b"]" * depth)


def downstream_rejects(out: Path) -> list[tuple[str, bytes, list[str]]]:
    """(label, payload, words the reason must contain) for each downstream reject class."""
    good = job_resource("some-job", DATASET, str(out))
    spec = good["spec"]

    def job(**changes: Any) -> dict[str, Any]:
        return {**good, "spec": {**spec, **changes}}

    def encoded(value: Any) -> bytes:
        return json.dumps(value).encode()

    wrong_type = job(dataset={"name": DATASET, "trainProb": "high"})
    bad_name = {**good, "metadata": {"name": "Bad_Name", "namespace": NS}}
    bad_dataset = dataset_resource("web-dataset", "http://x")
    padding = {"padding": "x" * (1 << 20)}
    deep_template = job(trainSpec={"template": nested_object(33)})
    annotated = {
        **good,
        "metadata": {
            "name": "some-job",
            "namespace": NS,
            "annotations": {"note": "n" * (256 * 1024)},
        },
    }
    def case(
        label: str, kind: str, operation: str, content: Any, *reasons: str, name: str = "some-job"
    ) -> tuple[str, bytes, list[str]]:
        """A reject class whose payload is one envelope, as JSON."""
        return label, encoded(envelope(kind, operation, content, name)), list(reasons)

    bad_utf8 = encoded(envelope("dataset", "insert", None)).replace(b"null", b'"\xff\xfe"')
    escape = job(outputDir=f"{out}/../escape")
    plain_words = base64.b64encode(b"plain words").decode()
    deep = nest(encoded(envelope(JOB_KIND, "insert", {"nested": DEEP})))
    return [
        ("not json", b"this is { not json", ["not valid JSON"]),
        ("invalid utf-8", bad_utf8, ["UTF-8"]),
        case("wrong type", JOB_KIND, "insert", wrong_type, "$.spec.dataset.trainProb"),
        case("unknown kind", "pod", "insert", good,
             "$.header.resourceKind", "unknown resourceKind 'pod'"),
        case("unknown operation", JOB_KIND, "upsert", good,
             "$.header.operation", "unknown operation 'upsert'"),
        case("bad dns name", JOB_KIND, "insert", bad_name, "resourceName", "DNS-1123",
             name="Bad_Name"),
        case("dotdot", JOB_KIND, "insert", escape, "$.spec.outputDir", "'..'"),
        case("http url", "dataset", "insert", bad_dataset, "$.spec.url", "s3://",
             name="web-dataset"),
        case("oversize", JOB_KIND, "insert", {**good, **padding}, "too large"),
        case("base64 not json", "dataset", "insert", plain_words, "$.content", "not valid JSON"),
        ("deep", deep, ["nesting deeper than"]),
        case("template too deep", JOB_KIND, "insert", deep_template,
             "$.spec.trainSpec.template", "nesting deeper than 32 levels"),
        case("annotations too large", JOB_KIND, "insert", annotated,
             "$.metadata.annotations", "larger than 262144 bytes"),
    ]  # fmt: skip


def nested_object(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"k": value}
    return value


def worker_rejects() -> list[tuple[str, str, bytes, list[str]]]:
    """(label, topic, payload, reason words) for each worker-topic reject class."""
    report = worker_message(JOB, "train", "running", worker="steady-worker")
    topic = worker_topic("steady-worker")

    def encoded(**changes: Any) -> bytes:
        return json.dumps({**report, **changes}).encode()

    ghost = worker_message("ghost-job", "train", "completed", "/models/m.pkl")
    stranger = worker_message("steady-job", "train", "running", worker="intruder")
    replayed = worker_message(
        "steady-job", "eval", "completed", "/etc/passwd", worker="steady-job-eval-x9"
    )
    other_round = worker_message("steady-job", "eval", "failed", worker="steady-job-eval-9")
    return [
        ("not json", topic, b"\x00\x01 binary junk", ["not valid JSON"]),
        ("invalid utf-8", topic, encoded(ownerName="x").replace(b'"x"', b'"\xc3\x28"'), ["UTF-8"]),
        ("wrong type", topic, encoded(namespace=7), ["$.namespace", "str"]),
        (
            "bad dns name",
            worker_topic("Bad_Worker"),
            encoded(name="Bad_Worker"),
            ["$.name", "DNS-1123"],
        ),
        ("oversize", topic, encoded(ownerInfo={"padding": "x" * (1 << 20)}), ["too large"]),
        ("deep", topic, nest(encoded(ownerInfo={"nested": DEEP})), ["nesting deeper than"]),
        (
            "unknown job",
            worker_topic(ghost["name"]),
            json.dumps(ghost).encode(),
            ["unknown job default/ghost-job"],
        ),
        (
            "foreign worker",
            worker_topic("intruder"),
            json.dumps(stranger).encode(),
            ["'intruder' may not report for job default/steady-job", "steady-job-train-<suffix>"],
        ),
        (
            "model outside its round",
            worker_topic("steady-job-eval-x9"),
            json.dumps(replayed).encode(),
            ["'/etc/passwd'", "/eval/1/, the output dir of round 1"],
        ),
        (
            "report of another round",
            worker_topic("steady-job-eval-9"),
            json.dumps(other_round).encode(),
            ["failed for round 9, but job default/steady-job is at round 1"],
        ),
        (
            "too many results",
            topic,
            encoded(results=[{"url": "/m"}] * 101),
            ["$.results", "more than 100 results"],
        ),
        (
            "owner info too deep",
            topic,
            encoded(ownerInfo=nested_object(9)),
            ["$.ownerInfo", "nesting deeper than 8 levels"],
        ),
        (
            "too many arrays",
            topic,
            encoded(results=[{"url": "/m", "x": [[]] * 10_001}]),
            ["more than 10000 arrays and objects"],
        ),
    ]


def test_every_reject_class_on_both_topics(stack: Stack) -> None:
    cloud = stack.cloud
    data, out = local_setup(stack)
    fragile_out = stack.workdir / "fragile-out"
    controller = start(stack)
    apply(cloud, data, out, "steady-job")
    cloud.insert_job("fragile-job", DATASET, fragile_out)
    rejected_before = metric_sum(controller, "lifelong_rejections_total")
    started = datetime.now(UTC) - timedelta(seconds=1)

    sent: list[tuple[str, str, bytes, list[str]]] = [
        (f"downstream {label}", DOWNSTREAM, payload, words)
        for label, payload, words in downstream_rejects(out)
    ]
    sent += [(f"worker {label}", t, p, w) for label, t, p, w in worker_rejects()]

    # the steady job runs a whole round with the bad messages interleaved
    steady = cloud.wait_status("steady-job", "train", "ready")["content"]["input"]
    assert read_lines(steady["dataURL"]) == lines(0, 8)
    half = len(sent) // 2
    for _, topic, payload, _ in sent[:half]:
        cloud.publish(topic, payload)
    model = model_file(out / "train" / "1" / "model.pkl", b"steady model")
    cloud.report("steady-job", "train", "completed", model, worker="steady-job-train-1")
    cloud.wait_status("steady-job", "eval", "ready")
    for _, topic, payload, _ in sent[half:]:
        cloud.publish(topic, payload)
    scored = model_file(out / "eval" / "1" / "model.pkl", b"steady scored")
    cloud.report("steady-job", "eval", "completed", scored, worker="steady-job-eval-1")
    cloud.wait_status("steady-job", "deploy", "ready")
    assert (out / "deploy" / "index.pkl").read_bytes() == b"steady scored"

    # each refused message has exactly one rejection, telling what and why
    cloud.wait_for(lambda: len(cloud.errors()) >= len(sent), 15, "all rejections")
    rejections = cloud.errors()
    by_payload = {base64.b64decode(r["payload"]): r for r in rejections}
    assert len(by_payload) == len(rejections) == len(sent)
    for label, topic, payload, words in sent:
        rejection = by_payload.get(payload[:4096])
        assert rejection is not None, f"{label}: no rejection"
        assert set(rejection) == {"topic", "reason", "payload", "receivedAt"}, label
        assert rejection["topic"] == topic, label
        for word in words:
            assert word in rejection["reason"], f"{label}: {rejection['reason']!r} lacks {word!r}"
        received = datetime.fromisoformat(rejection["receivedAt"])
        assert started <= received <= datetime.now(UTC), label
    for topic_kind in ("downstream", "worker"):
        reasons = [by_payload[p[:4096]]["reason"] for k, _, p, _ in sent if topic_kind in k]
        assert len(set(reasons)) == len(reasons), f"{topic_kind}: each reason is its own"

    # a malformed report for a known job in train/running is accepted, forwarded, and sends
    # the job back to train with its samples: round 2 retrains exactly round 1's samples
    fragile = cloud.wait_status("fragile-job", "train", "ready")["content"]["input"]
    assert read_lines(fragile["dataURL"]) == lines(0, 8)
    malformed = worker_message("fragile-job", "train", "completed")
    malformed["results"] = [1, "x"]
    before = len(cloud.upstream("fragile-job"))
    cloud.publish(worker_topic(malformed["name"]), json.dumps(malformed).encode())
    retry = cloud.wait_status("fragile-job", "train", "ready", after=before)["content"]["input"]
    assert retry["outputDir"] == f"{fragile_out}/train/2"
    assert read_lines(retry["dataURL"]) == lines(0, 8)
    assert forwarded(cloud, "fragile-job") == [("train", "completed")]
    # the journal logs a commit's transitions right after sending its messages
    wait_until(lambda: "completed without a usable model" in controller.log(), 10,
               "the journal's line")  # fmt: skip

    # the steady job saw nothing of it all; the controller is alive and counted every refusal
    assert forwarded(cloud, "steady-job") == [("train", "completed"), ("eval", "completed")]
    assert controller.proc is not None and controller.proc.poll() is None
    assert len(cloud.errors()) == len(sent)
    rejected = metric_sum(controller, "lifelong_rejections_total") - rejected_before
    assert rejected == len(sent)
    assert metric_sum(controller, "lifelong_rejections_total", reason="too_large") == 3
    assert metric_sum(controller, "lifelong_rejections_total", reason="too_deep") == 4
    assert metric_sum(controller, "lifelong_rejections_total", reason="too_many") == 2
    assert metric_sum(controller, "lifelong_rejections_total", reason="unknown_job") == 1
    assert metric_sum(controller, "lifelong_rejections_total", reason="foreign_worker") == 1
    assert metric_sum(controller, "lifelong_rejections_total", reason="outside_round") == 2
    assert metric_sum(controller, "lifelong_rejections_total", reason="invalid_utf8") == 2


# ================================================================ hostile HTTP and log lines

FORGED = "2026-01-01T00:00:00.000Z ERROR service.runtime forged"
TOKEN = "wire-token-0123456789abcdef"


def post_raw(
    controller: Controller, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, str]:
    """POST exactly this path (no quoting) and headers; the status and the reply's message."""
    conn = http.client.HTTPConnection("127.0.0.1", controller.http_port, timeout=5)
    try:
        conn.request("POST", path, body, headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())["message"]
    finally:
        conn.close()


def test_hostile_http_requests_change_nothing_and_forge_no_log_line(stack: Stack) -> None:
    cloud = stack.cloud
    data, out = local_setup(stack)
    token_file = stack.workdir / "http-token"
    token_file.write_text(TOKEN + "\n")  # as a mounted secret often ends
    controller = stack.controller(env={"LIFELONG_HTTP_TOKEN_FILE": str(token_file)})
    controller.http_token = TOKEN
    wait_ingress(controller, cloud)
    apply(cloud, data, out)
    cloud.wait_status(JOB, "train", "ready")

    # each of these is a `failed` report: had one been applied, the round would have failed
    failed = json.dumps(worker_message(JOB, "train", "failed")).encode()
    path = f"/sedna/workers/{JOB}-train-worker/info"
    as_json = {"Content-Type": "application/json"}
    authorized = {"Authorization": f"Bearer {TOKEN}"}
    refusals = [
        # a browser's cross-site form or text POST, even one carrying the token
        (path, {"Content-Type": "text/plain", **authorized}, 415,
         "Content-Type must be application/json"),
        (path, {"Content-Type": "application/x-www-form-urlencoded", **authorized}, 415,
         "Content-Type must be application/json"),
        (path, as_json, 401, "bearer token required (Authorization: Bearer <token>)"),
        (path, {**as_json, "Authorization": "Bearer not-the-token-0123456789"}, 401,
         "bearer token invalid"),
        # a newline in the worker name once wrote a forged line into the log
        ("/sedna/workers/w%0A" + FORGED.replace(" ", "%20") + "/info", {**as_json, **authorized},
         400, "the worker name in the path must be a DNS-1123 subdomain"),
    ]  # fmt: skip
    for target, headers, code, message in refusals:
        status, reply = post_raw(controller, target, failed, headers)
        assert (status, reply[: len(message)]) == (code, message), target

    # the metrics need the token too; the probes do not
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://127.0.0.1:{controller.http_port}/metrics", timeout=5)
    assert refused.value.code == 401
    refused.value.close()
    with urllib.request.urlopen(f"http://127.0.0.1:{controller.http_port}/readyz", timeout=5):
        pass

    # Sedna's report with the token is taken, and only it reached the job
    running = worker_message(JOB, "train", "running")
    assert controller.post_worker(running["name"], running) == (200, OK)
    cloud.wait_for(lambda: forwarded(cloud, JOB), 10, "the running report forwarded")
    assert forwarded(cloud, JOB) == [("train", "running")]

    # a sender-chosen topic with a line separator is logged on one line, escaped
    cloud.publish(worker_topic(f"w\u2028{FORGED}"), json.dumps(running).encode())
    cloud.wait_for(cloud.errors, 10, "the rejection of the forged topic")
    log = controller.log()
    assert not [line for line in log.splitlines() if line.startswith(FORGED)]
    assert f"workers/w\\u2028{FORGED}/info" in log
    assert "400 the worker name in the path must be a DNS-1123 subdomain" in log
    assert forwarded(cloud, JOB) == [("train", "running")]


# ================================================================ Sedna's bugs 11-13


def test_bug11_no_temporary_file_survives_a_round(stack: Stack) -> None:
    cloud = stack.cloud
    data, out = local_setup(stack)
    controller_tmp = stack.workdir / "controller-tmp"
    controller_tmp.mkdir()
    start(stack, env={"TMPDIR": str(controller_tmp)})
    apply(cloud, data, out)
    full_round(cloud, out)

    # round 2's deploy copy fails (the eval model is missing) after staging its temp file
    before = len(cloud.upstream(JOB))
    append_lines(data, lines(10, 20))
    cloud.wait_status(JOB, "train", "ready", after=before)
    trained = model_file(out / "train" / "2" / "model.pkl", b"trained 2")
    cloud.report(JOB, "train", "completed", trained)
    cloud.wait_status(JOB, "eval", "ready", after=before)
    cloud.report(JOB, "eval", "completed", str(out / "eval" / "2" / "missing.pkl"))
    failed = cloud.wait_status(JOB, "deploy", "failed", after=before)["content"]
    assert "missing.pkl" in failed["reason"]
    assert (out / "deploy" / "index.pkl").read_bytes() == b"evaluated"

    assert files_under(out) == {
        "data/train/1/data.txt",
        "data/eval/1/data.txt",
        "data/train/2/data.txt",
        "data/eval/2/data.txt",
        "train/1/model.pkl",
        "eval/1/model.pkl",
        "train/2/model.pkl",
        "deploy/index.pkl",
    }
    assert list(controller_tmp.iterdir()) == []


def checked_and_polled(controller: Controller, times: int) -> bool:
    """The controller has processed ``times`` trigger checks and dataset polls. Every
    timer that came due counts as a Tick, a dataset's as well as a job's; a dataset's Tick
    becomes a DatasetPolled once its poll ran, so at most one dataset Tick is ahead of
    the polls, and the rest of the Ticks beyond the polls are the job's checks."""
    ticks = metric_sum(controller, "lifelong_events_total", type="Tick")
    polls = metric_sum(controller, "lifelong_events_total", type="DatasetPolled")
    return polls >= times and ticks - polls - 1 >= times


def upstream_flushed(stack: Stack, store: RedisStore) -> None:
    """Until everything committed for upstream has reached the cloud: the outbox is empty
    (each entry is deleted after the broker's PUBACK, so the broker has routed it to the
    cloud), then a marker the test publishes to the upstream topic reaches the cloud, which
    the broker delivers after whatever it routed there before."""
    wait_until(
        lambda: not any(store.outboxes.read(range(NUM_SHARDS)).values()),
        10,
        "the outbox to drain",
    )
    marker = {"header": {"resourceName": "upstream-marker"}, "content": {}}
    stack.cloud.publish(f"{PREFIX}/{NODE}/upstream", json.dumps(marker).encode())
    stack.cloud.wait_for(lambda: stack.cloud.upstream("upstream-marker"), 10, "the marker")


def test_bug12_a_restart_loses_no_progress(stack: Stack) -> None:
    cloud = stack.cloud
    data, out = local_setup(stack)
    first = start(stack)
    apply(cloud, data, out)
    full_round(cloud, out)
    assert first.stop() == 0

    second = stack.controller("r2")
    before = len(cloud.upstream(JOB))
    # a few poll and check periods, run by the second: nothing old may be trained again
    wait_until(lambda: checked_and_polled(second, 2), 20, "two checks and polls by r2")
    store = RedisStore(stack.redis_url, Keys())
    try:
        upstream_flushed(stack, store)
    finally:
        store.close()
    assert cloud.upstream(JOB)[before:] == []
    append_lines(data, lines(10, 20))
    ready = cloud.wait_status(JOB, "train", "ready", after=before)["content"]["input"]
    assert ready["outputDir"] == f"{out}/train/2"
    assert read_lines(ready["dataURL"]) == lines(10, 18)
    model = model_file(out / "train" / "2" / "model.pkl", b"trained 2")
    cloud.report(JOB, "train", "completed", model)
    evaluate = cloud.wait_status(JOB, "eval", "ready", after=before)["content"]["input"]
    assert evaluate["outputDir"] == f"{out}/eval/2"
    assert read_lines(evaluate["dataURL"]) == lines(8, 10) + lines(18, 20)
    assert 20 in cloud.samples(DATASET)
    assert "r2" in second.log() and cloud.errors() == []


POLL_LINE = re.compile(r"polled dataset default/(\S+): (\d+) samples, (\d+) bytes read")


def polls(controller: Controller, dataset: str) -> list[tuple[int, int]]:
    """(samples, bytes read) of each logged poll of `dataset`, oldest first."""
    return [(int(m[2]), int(m[3])) for m in POLL_LINE.finditer(controller.log()) if m[1] == dataset]


def test_bug13_growing_a_dataset_reads_only_the_new_bytes(stack: Stack) -> None:
    cloud = stack.cloud
    data, _ = local_setup(stack, rows=20_000)
    size = data.stat().st_size
    controller = start(stack)
    cloud.insert_dataset(DATASET, data)
    cloud.wait_for(lambda: 20_000 in cloud.samples(DATASET), 15, "numberOfSamples 20000")
    assert polls(controller, DATASET)[0] == (20_000, size)  # the first poll reads it all

    appended = lines(20_000, 20_010)
    append_lines(data, appended)
    appended_bytes = data.stat().st_size - size
    cloud.wait_for(lambda: 20_010 in cloud.samples(DATASET), 15, "numberOfSamples 20010")
    cloud.wait_for(
        lambda: any(n == 20_010 for n, _ in polls(controller, DATASET)), 5, "the poll log line"
    )
    samples, bytes_read = polls(controller, DATASET)[-1]
    assert samples == 20_010
    assert appended_bytes <= bytes_read <= 2 * appended_bytes
