"""The wire contract: decoding, validation with field paths, encoding, and robustness."""

from __future__ import annotations

import base64
import copy
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service import wire
from service.core import reports
from service.errors import InvalidMessage
from service.runtime.intake import worker_event
from service.wire import (
    DatasetDelete,
    DatasetInsert,
    JobDelete,
    JobInsert,
    decode_envelope,
    decode_worker_message,
)
from tests.harness import envelope, status_header

JOB: dict[str, Any] = {
    "apiVersion": "sedna.io/v1alpha1",
    "kind": "LifelongLearningJob",
    "metadata": {"name": "atcii-classifier-demo", "namespace": "default"},
    "spec": {
        "dataset": {"name": "lifelong-dataset", "trainProb": 0.8},
        "trainSpec": {
            "template": {
                "spec": {
                    "nodeName": "edge-node",
                    "containers": [
                        {
                            "image": "kubeedge/sedna-example-lifelong-learning-atcii-classifier"
                            ":v0.3.0",
                            "name": "train-worker",
                            "imagePullPolicy": "IfNotPresent",
                            "args": ["train.py"],
                            "env": [{"name": "early_stopping_rounds", "value": "100"}],
                        }
                    ],
                }
            },
            "trigger": {
                "checkPeriodSeconds": 60,
                "timer": {"start": "02:00", "end": "20:00"},
                "condition": {"operator": ">", "threshold": 500, "metric": "num_of_samples"},
            },
        },
        "evalSpec": {
            "template": {
                "spec": {
                    "nodeName": "edge-node",
                    "containers": [{"image": "x", "name": "eval-worker", "args": ["eval.py"]}],
                }
            }
        },
        "deploySpec": {
            "template": {
                "spec": {
                    "nodeName": "edge-node",
                    "containers": [
                        {"image": "x", "name": "infer-worker", "args": ["inference.py"]}
                    ],
                }
            }
        },
        "outputDir": "/output",
    },
}
DATASET: dict[str, Any] = {
    "apiVersion": "sedna.io/v1alpha1",
    "kind": "Dataset",
    "metadata": {"name": "lifelong-dataset", "namespace": "default"},
    "spec": {"url": "/data/trainData.csv", "format": "csv", "nodeName": "edge-node"},
}
WORKER: dict[str, Any] = {
    "name": "atcii-classifier-demo-train-x1",
    "namespace": "default",
    "ownerName": "atcii-classifier-demo",
    "ownerKind": "lifelonglearningjob",
    "kind": "train",
    "status": "completed",
    "ownerInfo": {},
    "results": [{"format": "pkl", "url": "/output/train/1/model.pkl", "metrics": {"acc": 0.9}}],
}
SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
CREDENTIAL = json.dumps(
    {
        "s3-endpoint": "127.0.0.1:9000",
        "s3-usehttps": "0",
        "ACCESS_KEY_ID": "AKIAEXAMPLE",
        "SECRET_ACCESS_KEY": SECRET,
    }
)


def b64(resource: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(resource).encode()).decode()


def job_with(mutate: Callable[[dict[str, Any]], None]) -> bytes:
    job = copy.deepcopy(JOB)
    mutate(job)
    return envelope(job)


def dataset_with(mutate: Callable[[dict[str, Any]], None]) -> bytes:
    dataset = copy.deepcopy(DATASET)
    mutate(dataset)
    return envelope(dataset, kind="dataset", name="lifelong-dataset")


def worker_with(**changes: Any) -> bytes:
    return json.dumps({**WORKER, **changes}).encode()


def invalid(data: bytes, decode: Callable[[bytes], object] = decode_envelope) -> InvalidMessage:
    with pytest.raises(InvalidMessage) as caught:
        decode(data)
    return caught.value


# --- valid messages ---------------------------------------------------------------------------


@pytest.mark.parametrize("as_base64", [False, True])
def test_job_envelope_decodes(as_base64: bool) -> None:
    decoded = decode_envelope(envelope(b64(JOB) if as_base64 else JOB))
    assert isinstance(decoded, JobInsert)
    job = decoded.job
    assert (job.metadata.namespace, job.metadata.name) == ("default", "atcii-classifier-demo")
    assert job.spec.dataset.name == "lifelong-dataset"
    assert job.spec.dataset.train_prob == 0.8
    trigger = job.spec.train_spec.trigger
    assert trigger.check_period_seconds == 60
    assert trigger.timer == wire.Timer(start="02:00", end="20:00")
    assert trigger.condition is not None
    assert trigger.condition.operator == ">"
    assert trigger.condition.threshold_value == 500.0
    assert trigger.condition.metric == "num_of_samples"
    assert job.spec.output_dir == "/output"
    assert job.spec.train_spec.template == JOB["spec"]["trainSpec"]["template"]
    assert job.spec.deploy_spec.template == JOB["spec"]["deploySpec"]["template"]


@pytest.mark.parametrize("as_base64", [False, True])
def test_dataset_envelope_decodes(as_base64: bool) -> None:
    content = b64(DATASET) if as_base64 else DATASET
    decoded = decode_envelope(envelope(content, kind="dataset", name="lifelong-dataset"))
    assert isinstance(decoded, DatasetInsert)
    spec = decoded.dataset.spec
    assert (spec.url, spec.format, spec.node_name) == ("/data/trainData.csv", "csv", "edge-node")
    assert spec.normalized_format == "csv"


def test_object_and_base64_content_give_identical_raw() -> None:
    plain = decode_envelope(envelope(JOB))
    encoded = decode_envelope(envelope(b64(JOB)))
    assert plain == encoded


def test_raw_is_canonical_whatever_the_key_order() -> None:
    reordered = json.loads(json.dumps(JOB), object_pairs_hook=lambda kv: dict(reversed(kv)))
    assert list(reordered) != list(JOB)
    first = decode_envelope(envelope(JOB))
    second = decode_envelope(envelope(reordered))
    assert isinstance(first, JobInsert)
    assert isinstance(second, JobInsert)
    assert first.raw == second.raw
    changed = decode_envelope(job_with(lambda j: j["spec"].update(outputDir="/other")))
    assert isinstance(changed, JobInsert)
    assert changed.raw != first.raw


def test_raw_decodes_back_to_the_same_resource() -> None:
    job = decode_envelope(envelope(JOB))
    dataset = decode_envelope(envelope(DATASET, kind="dataset", name="lifelong-dataset"))
    assert isinstance(job, JobInsert)
    assert isinstance(dataset, DatasetInsert)
    assert wire.decode_job(job.raw) == job.job
    assert wire.decode_resource(job.raw) == job.job
    assert wire.decode_dataset(dataset.raw) == dataset.dataset
    assert wire.decode_resource(dataset.raw) == dataset.dataset


def test_informer_objects_without_type_meta_or_namespace_are_accepted() -> None:
    bare = copy.deepcopy(JOB)
    del bare["apiVersion"], bare["kind"], bare["metadata"]["namespace"]
    decoded = decode_envelope(envelope(bare, namespace="team-a"))
    assert isinstance(decoded, JobInsert)
    assert decoded.job.metadata.namespace == "team-a"
    assert decoded.job.kind == "LifelongLearningJob"
    stored = wire.decode_resource(decoded.raw)  # raw describes itself
    assert stored == decoded.job


@pytest.mark.parametrize(
    ("kind", "name", "expected"),
    [
        ("lifelonglearningjob", "atcii-classifier-demo", JobDelete),
        ("LifelongLearningJob", "atcii-classifier-demo", JobDelete),
        ("dataset", "lifelong-dataset", DatasetDelete),
        ("DataSet", "lifelong-dataset", DatasetDelete),
    ],
)
def test_delete_uses_header_names_and_needs_no_content(
    kind: str, name: str, expected: type
) -> None:
    header = {
        "namespace": "ns-1",
        "resourceKind": kind,
        "resourceName": name,
        "operation": "delete",
    }
    decoded = decode_envelope(json.dumps({"header": header}).encode())
    assert decoded == expected(namespace="ns-1", name=name)
    with_content = decode_envelope(envelope("", kind=kind, name=name, operation="delete"))
    assert with_content == expected(namespace="default", name=name)


def test_resource_kind_is_case_insensitive_on_insert() -> None:
    decoded = decode_envelope(envelope(JOB, kind="LifelongLearningJob"))
    assert isinstance(decoded, JobInsert)
    decoded_ds = decode_envelope(envelope(DATASET, kind="Dataset", name="lifelong-dataset"))
    assert isinstance(decoded_ds, DatasetInsert)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda j: j["spec"].update(outputDir="s3://bucket/jobs/out"),
        lambda j: j["spec"].update(outputDir="s3://bucket"),
        lambda j: j["spec"].update(outputDir="/a..b/c"),
        lambda j: j["spec"]["trainSpec"]["trigger"].update(condition={"operator": ""}),
        lambda j: j["spec"]["trainSpec"]["trigger"].update(
            condition={"operator": "ge", "threshold": "0.5", "metric": "acc[0]"}
        ),
        lambda j: j["spec"]["trainSpec"]["trigger"].update(
            timer={"start": "22:00", "end": "24:00"}
        ),
        lambda j: j["spec"]["trainSpec"].pop("trigger"),
        lambda j: j["spec"]["dataset"].update(trainProb=1),
        lambda j: j["spec"]["dataset"].update(trainProb=0),
        lambda j: j["metadata"].update(unknownField={"x": 1}, generation=3),
        lambda j: j.update(status={"phase": "train"}),
    ],
)
def test_valid_variants_are_accepted(mutate: Callable[[dict[str, Any]], None]) -> None:
    assert isinstance(decode_envelope(job_with(mutate)), JobInsert)


def test_defaults_when_trigger_is_absent() -> None:
    decoded = decode_envelope(job_with(lambda j: j["spec"]["trainSpec"].pop("trigger")))
    assert isinstance(decoded, JobInsert)
    trigger = decoded.job.spec.train_spec.trigger
    assert trigger == wire.Trigger(check_period_seconds=60, timer=None, condition=None)


@pytest.mark.parametrize("fmt", ["TXT", "Csv", "txt"])
def test_dataset_format_any_case_normalised(fmt: str) -> None:
    decoded = decode_envelope(dataset_with(lambda d: d["spec"].update(format=fmt)))
    assert isinstance(decoded, DatasetInsert)
    assert decoded.dataset.spec.format == fmt
    assert decoded.dataset.spec.normalized_format == fmt.lower()


# --- validation failures, each with its field path ----------------------------------------------


def _set(path: list[str | int], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(obj: dict[str, Any]) -> None:
        target: Any = obj
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    return mutate


def _pop(path: list[str]) -> Callable[[dict[str, Any]], None]:
    def mutate(obj: dict[str, Any]) -> None:
        target: Any = obj
        for part in path[:-1]:
            target = target[part]
        del target[path[-1]]

    return mutate


TRIGGER = ["spec", "trainSpec", "trigger"]
CONDITION = [*TRIGGER, "condition"]
CONDITION_PATH = "$.spec.trainSpec.trigger.condition"

JOB_FAILURES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("uppercase name", _set(["metadata", "name"], "Bad_Name"), "$.metadata.name"),
    ("name with newline", _set(["metadata", "name"], "atcii-classifier-demo\n"), "$.metadata.name"),
    ("name too long", _set(["metadata", "name"], "a" * 254), "$.metadata.name"),
    ("name mismatch", _set(["metadata", "name"], "other-job"), "$.metadata.name"),
    ("namespace mismatch", _set(["metadata", "namespace"], "other"), "$.metadata.namespace"),
    ("namespace not a label", _set(["metadata", "namespace"], "a.b"), "$.metadata.namespace"),
    ("namespace too long", _set(["metadata", "namespace"], "a" * 64), "$.metadata.namespace"),
    ("http outputDir", _set(["spec", "outputDir"], "http://host/out"), "$.spec.outputDir"),
    ("file outputDir", _set(["spec", "outputDir"], "file:///out"), "$.spec.outputDir"),
    ("ftp outputDir", _set(["spec", "outputDir"], "ftp:out"), "$.spec.outputDir"),
    ("relative outputDir", _set(["spec", "outputDir"], "output"), "$.spec.outputDir"),
    ("dotdot outputDir", _set(["spec", "outputDir"], "/out/../etc"), "$.spec.outputDir"),
    ("trailing dotdot", _set(["spec", "outputDir"], "/out/.."), "$.spec.outputDir"),
    ("empty outputDir", _set(["spec", "outputDir"], ""), "$.spec.outputDir"),
    ("missing outputDir", _pop(["spec", "outputDir"]), "$.spec"),
    ("control char outputDir", _set(["spec", "outputDir"], "/out\x00x"), "$.spec.outputDir"),
    ("s3 without bucket", _set(["spec", "outputDir"], "s3:///key"), "$.spec.outputDir"),
    ("s3 dotdot key", _set(["spec", "outputDir"], "s3://b/k/../../x"), "$.spec.outputDir"),
    ("trainProb above 1", _set(["spec", "dataset", "trainProb"], 1.5), "$.spec.dataset.trainProb"),
    ("trainProb below 0", _set(["spec", "dataset", "trainProb"], -0.1), "$.spec.dataset.trainProb"),
    ("trainProb string", _set(["spec", "dataset", "trainProb"], "0.5"), "$.spec.dataset.trainProb"),
    ("dataset name", _set(["spec", "dataset", "name"], "A B"), "$.spec.dataset.name"),
    (
        "checkPeriodSeconds 0",
        _set([*TRIGGER, "checkPeriodSeconds"], 0),
        "$.spec.trainSpec.trigger.checkPeriodSeconds",
    ),
    (
        "checkPeriodSeconds huge",
        _set([*TRIGGER, "checkPeriodSeconds"], 10**12),
        "$.spec.trainSpec.trigger.checkPeriodSeconds",
    ),
    ("operator", _set([*CONDITION, "operator"], "~"), f"{CONDITION_PATH}.operator"),
    ("threshold word", _set([*CONDITION, "threshold"], "many"), f"{CONDITION_PATH}.threshold"),
    ("threshold bool", _set([*CONDITION, "threshold"], True), f"{CONDITION_PATH}.threshold"),
    ("threshold inf", _set([*CONDITION, "threshold"], "1e999"), f"{CONDITION_PATH}.threshold"),
    ("threshold huge int", _set([*CONDITION, "threshold"], 10**400), f"{CONDITION_PATH}.threshold"),
    ("metric digit", _set([*CONDITION, "metric"], "1acc"), f"{CONDITION_PATH}.metric"),
    ("metric index", _set([*CONDITION, "metric"], "acc[x]"), f"{CONDITION_PATH}.metric"),
    ("operator without metric", _pop([*CONDITION, "metric"]), f"{CONDITION_PATH}.metric"),
    ("operator without threshold", _pop([*CONDITION, "threshold"]), f"{CONDITION_PATH}.threshold"),
    (
        "timer hour",
        _set([*TRIGGER, "timer", "start"], "25:00"),
        "$.spec.trainSpec.trigger.timer.start",
    ),
    (
        "timer short",
        _set([*TRIGGER, "timer", "start"], "2:00"),
        "$.spec.trainSpec.trigger.timer.start",
    ),
    (
        "timer 24:01",
        _set([*TRIGGER, "timer", "end"], "24:01"),
        "$.spec.trainSpec.trigger.timer.end",
    ),
    ("timer missing end", _pop([*TRIGGER, "timer", "end"]), "$.spec.trainSpec.trigger.timer"),
    ("template not object", _set(["spec", "evalSpec", "template"], []), "$.spec.evalSpec.template"),
    ("kind mismatch", _set(["kind"], "Dataset"), "$.kind"),
    ("generation huge", _set(["metadata", "generation"], 2**63), "$.metadata.generation"),
    (
        "credential not JSON",
        _set(["metadata", "annotations"], {"sedna.io/credential": "{nope"}),
        '$.metadata.annotations["sedna.io/credential"]',
    ),
    (
        "credential usehttps",
        _set(["metadata", "annotations"], {"sedna.io/credential": '{"s3-usehttps": "yes"}'}),
        '$.metadata.annotations["sedna.io/credential"].s3-usehttps',
    ),
    (
        "credential key without secret",
        _set(["metadata", "annotations"], {"sedna.io/credential": '{"ACCESS_KEY_ID": "AK"}'}),
        '$.metadata.annotations["sedna.io/credential"]',
    ),
]


@pytest.mark.parametrize(("mutate", "path"), [pytest.param(m, p, id=i) for i, m, p in JOB_FAILURES])
def test_job_validation_names_the_field(
    mutate: Callable[[dict[str, Any]], None], path: str
) -> None:
    error = invalid(job_with(mutate))
    assert error.path == path
    assert error.reason
    assert str(error).startswith(path)


def test_pattern_failures_read_as_rules_not_regexes() -> None:
    error = invalid(job_with(_set(["spec", "outputDir"], "http://host/out")))
    assert "regex" not in error.reason
    assert "s3://" in error.reason
    error = invalid(job_with(_set(["metadata", "name"], "Bad")))
    assert "DNS-1123" in error.reason


DATASET_FAILURES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("format json", _set(["spec", "format"], "json"), "$.spec.format"),
    ("http url", _set(["spec", "url"], "http://example.com/data.csv"), "$.spec.url"),
    ("relative url", _set(["spec", "url"], "data/train.csv"), "$.spec.url"),
    ("dotdot url", _set(["spec", "url"], "/data/../../etc/passwd"), "$.spec.url"),
    ("nodeName", _set(["spec", "nodeName"], "edge/node"), "$.spec.nodeName"),
    ("kind mismatch", _set(["kind"], "LifelongLearningJob"), "$.kind"),
]


@pytest.mark.parametrize(
    ("mutate", "path"), [pytest.param(m, p, id=i) for i, m, p in DATASET_FAILURES]
)
def test_dataset_validation_names_the_field(
    mutate: Callable[[dict[str, Any]], None], path: str
) -> None:
    assert invalid(dataset_with(mutate)).path == path


@pytest.mark.parametrize(
    ("data", "path"),
    [
        (envelope(JOB, namespace="Default"), "$.header.namespace"),
        (envelope(JOB, name="x/y"), "$.header.resourceName"),
        (envelope(JOB, kind="reidjob"), "$.header.resourceKind"),
        (envelope(JOB, operation="update"), "$.header.operation"),
        (envelope(42), "$.content"),
        (envelope("not base64!"), "$.content"),
        (envelope(base64.b64encode(b"[1, 2]").decode()), "$.content"),
        (envelope(base64.b64encode(b"{bad json").decode()), "$.content"),
        (envelope(None), "$.content"),
        (b'{"content": {}}', "$"),
        (b"[]", "$"),
        (b"", "$"),
        (b"\xff\xfe{}", "$"),
        (b'{"header": {"namespace": "\xff"}}', "$"),
    ],
)
def test_envelope_errors_name_the_field(data: bytes, path: str) -> None:
    assert invalid(data).path == path


def test_oversize_payload_is_refused() -> None:
    padded = copy.deepcopy(JOB)
    padded["metadata"]["annotations"] = {"pad": "x" * wire.MAX_PAYLOAD_BYTES}
    error = invalid(envelope(padded))
    assert "payload too large" in error.reason


def test_deep_nesting_is_refused_without_recursion_error() -> None:
    for depth in (65, 100_000):
        deep = b'{"a":' + b"[" * depth + b"]" * depth + b"}"
        assert "nesting" in invalid(deep).reason
        assert "nesting" in invalid(deep, decode_worker_message).reason
    inner = base64.b64encode(b'{"spec":' + b"[" * 70 + b"]" * 70 + b"}").decode()
    assert "nesting" in invalid(envelope(inner)).reason


@pytest.mark.parametrize(
    "data",
    [
        b'"' + b'\\"' * 400_000,  # an unterminated string of escaped quotes
        b'["' + b'\\"' * 400_000 + b"\\",
        b'""' * 400_000 + b'"',
        b"[" * 500_000 + b"]" * 500_000,
    ],
    ids=["escaped-quotes", "trailing-backslash", "many-strings", "brackets"],
)
def test_adversarial_input_is_refused_quickly(data: bytes) -> None:
    started = time.perf_counter()
    invalid(data)
    invalid(data, decode_worker_message)
    assert time.perf_counter() - started < 2.0


def test_nesting_inside_strings_does_not_count() -> None:
    job = copy.deepcopy(JOB)
    job["spec"]["trainSpec"]["template"]["note"] = "[" * 500 + '\\"{' * 100
    assert isinstance(decode_envelope(envelope(job)), JobInsert)


def test_integers_beyond_64_bits_are_refused_with_their_path() -> None:
    error = invalid(job_with(_set(["spec", "evalSpec", "template", "replicas"], 10**30)))
    assert error.path == "$.spec.evalSpec.template.replicas"
    worker = invalid(worker_with(results=[{"n": [-(2**64)]}]), decode_worker_message)
    assert worker.path == "$.results[0].n[0]"
    # ownerInfo is kept as its JSON text, never as values: it is forwarded as it came
    owner_info = decode_worker_message(worker_with(ownerInfo={"n": [-(2**64)]})).owner_info
    assert owner_info is not None and bytes(owner_info) == b'{"n": [-18446744073709551616]}'
    ok = decode_envelope(job_with(_set(["spec", "evalSpec", "template", "n"], 2**63 - 1)))
    assert isinstance(ok, JobInsert)


# --- worker messages --------------------------------------------------------------------------


def test_worker_message_decodes_and_round_trips() -> None:
    message = decode_worker_message(worker_with(ownerKind="LifelongLearningJob"))
    assert message.owner_kind == "lifelonglearningjob"
    assert (message.kind, message.status) == ("train", "completed")
    assert message.owner_name == "atcii-classifier-demo"
    assert decode_worker_message(wire.encode(message)) == message
    assert json.loads(wire.encode(message))["ownerName"] == "atcii-classifier-demo"
    (model,) = reports.usable_models(message.results)
    assert model == wire.Model(
        format="pkl", url="/output/train/1/model.pkl", metrics={"acc": 0.9}
    )


def test_two_models_are_both_usable() -> None:
    results = [
        {"format": "pb", "url": "s3://models/train/1/saved_model"},
        {"format": "ckpt", "url": "/output/train/1/model.ckpt"},
        {"url": "/output/train/1/plain"},
    ]
    models = reports.usable_models(decode_worker_message(worker_with(results=results)).results)
    assert [(m.format, m.url) for m in models] == [
        ("pb", "s3://models/train/1/saved_model"),
        ("ckpt", "/output/train/1/model.ckpt"),
        ("", "/output/train/1/plain"),
    ]


@pytest.mark.parametrize(
    "results",
    [
        None,
        "model.pkl",
        {"url": "/m.pkl"},
        [],
        [1, "x", None, [1]],
        [{"url": ""}, {"url": 7}, {"format": "pkl"}, {"url": "/m.pkl", "format": 3}],
        [{"url": "http://evil/m.pkl"}, {"url": "../../etc/passwd"}, {"url": "/out/../m"}],
    ],
)
def test_malformed_results_decode_but_give_no_usable_model(results: Any) -> None:
    message = decode_worker_message(worker_with(results=results))
    assert message.status == "completed"
    assert reports.usable_models(message.results) == ()


def test_null_or_absent_owner_info_reads_as_none_and_is_forwarded_as_empty() -> None:
    assert decode_worker_message(worker_with(ownerInfo=None)).owner_info is None
    absent = {k: v for k, v in WORKER.items() if k != "ownerInfo"}
    message = decode_worker_message(json.dumps(absent).encode())
    assert message.owner_info is None
    assert worker_event(message).owner_info == b"{}"


@pytest.mark.parametrize(
    ("changes", "path"),
    [
        ({"name": "Train_Worker"}, "$.name"),
        ({"namespace": "a.b"}, "$.namespace"),
        ({"ownerName": "Job"}, "$.ownerName"),
        ({"ownerKind": "dataset"}, "$.ownerKind"),
        ({"kind": "predict"}, "$.kind"),
        ({"status": "done"}, "$.status"),
        ({"status": None}, "$.status"),
        ({"ownerInfo": []}, "$.ownerInfo"),
    ],
)
def test_worker_validation_names_the_field(changes: dict[str, Any], path: str) -> None:
    assert invalid(worker_with(**changes), decode_worker_message).path == path


def test_worker_message_missing_field() -> None:
    data = json.dumps({k: v for k, v in WORKER.items() if k != "status"}).encode()
    error = invalid(data, decode_worker_message)
    assert error.path == "$.status"
    assert "required" in error.reason and "joint-inference" in error.reason


# --- upstream encoding ------------------------------------------------------------------------


def test_job_status_uses_sedna_wire_names() -> None:
    status = wire.JobStatus(
        phase="eval",
        status="ready",
        input=wire.JobInput(
            models=[wire.ModelRef(format="pkl", url="/output/train/1/model.pkl")],
            data_url="/output/data/eval/1/data.csv",
            data_index_url="/output/data/eval/1/dataIndex.txt",
            output_dir="/output/eval/1",
        ),
    )
    header = status_header("lifelonglearningjob", "atcii-classifier-demo", "abc-1")
    sent = json.loads(wire.encode(wire.UpstreamEnvelope(header=header, content=status)))
    assert sent == {
        "header": {
            "namespace": "default",
            "resourceKind": "lifelonglearningjob",
            "resourceName": "atcii-classifier-demo",
            "operation": "status",
            "id": "abc-1",
        },
        "content": {
            "phase": "eval",
            "status": "ready",
            "input": {
                "models": [{"format": "pkl", "url": "/output/train/1/model.pkl"}],
                "dataURL": "/output/data/eval/1/data.csv",
                "dataIndexURL": "/output/data/eval/1/dataIndex.txt",
                "outputDir": "/output/eval/1",
            },
        },
    }


def test_defaults_are_omitted_and_output_is_always_complete() -> None:
    train = wire.JobStatus(phase="train", status="ready", input=wire.JobInput())
    assert json.loads(wire.encode(train)) == {"phase": "train", "status": "ready", "input": {}}
    forwarded = wire.JobStatus(
        phase="train", status="failed", output=wire.JobOutput(models=[], owner_info={})
    )
    assert json.loads(wire.encode(forwarded))["output"] == {"models": [], "ownerInfo": {}}
    count = wire.DatasetStatus(number_of_samples=0)
    assert wire.encode(count) == b'{"numberOfSamples":0}'
    upstream = json.loads(
        wire.encode(
            wire.UpstreamEnvelope(
                header=status_header("dataset", "d"),
                content=wire.DatasetStatus(number_of_samples=7),
            )
        )
    )
    assert upstream["content"] == {"numberOfSamples": 7}
    assert "id" not in upstream["header"]


def test_rejection_keeps_first_4_kib_and_utc_time() -> None:
    payload = bytes(range(256)) * 20
    moment = datetime(2024, 5, 1, 14, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    rejection = wire.make_rejection("sedna/edge/downstream", "bad", payload, moment)
    assert base64.b64decode(rejection.payload) == payload[:4096]
    assert rejection.received_at == "2024-05-01T12:00:00.123Z"
    sent = json.loads(wire.encode(rejection))
    assert set(sent) == {"topic", "reason", "payload", "receivedAt"}
    naive = wire.make_rejection("t", "r", b"x", datetime(2024, 1, 1))
    assert naive.received_at == "2024-01-01T00:00:00.000Z"


def test_presence_encodes() -> None:
    since = wire.rfc3339_utc(datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC))
    presence = wire.Presence(replica="r-1", state="online", since=since)
    assert json.loads(wire.encode(presence)) == {
        "replica": "r-1",
        "state": "online",
        "since": "2024-01-02T03:04:05.000Z",
    }


# --- credentials ------------------------------------------------------------------------------


def _job_with_credential(text: str) -> bytes:
    return job_with(_set(["metadata", "annotations"], {wire.CREDENTIAL_ANNOTATION: text}))


def test_credential_is_parsed() -> None:
    decoded = decode_envelope(_job_with_credential(CREDENTIAL))
    assert isinstance(decoded, JobInsert)
    credential = wire.credential_of(decoded.job.metadata)
    assert credential == wire.S3Credential(
        endpoint="127.0.0.1:9000",
        use_https=False,
        access_key_id="AKIAEXAMPLE",
        secret_access_key=SECRET,
    )
    assert wire.credential_of(wire.ObjectMeta(name="x")) is None
    default = wire.credential_of(
        wire.ObjectMeta(name="x", annotations={wire.CREDENTIAL_ANNOTATION: "{}"})
    )
    assert default is not None
    assert default.use_https is True
    assert default.secret_access_key is None


def test_secret_never_appears_in_reprs() -> None:
    decoded = decode_envelope(_job_with_credential(CREDENTIAL))
    assert isinstance(decoded, JobInsert)
    credential = wire.credential_of(decoded.job.metadata)
    assert SECRET.encode() in decoded.raw  # stored for the executor, but never shown:
    for shown in (credential, decoded, decoded.job, decoded.job.metadata):
        assert SECRET not in repr(shown)
        assert SECRET not in str(shown)
    assert "AKIAEXAMPLE" in repr(credential)


@pytest.mark.parametrize(
    "text",
    [
        json.dumps({"SECRET_ACCESS_KEY": SECRET, "s3-usehttps": "maybe"}),
        json.dumps({"SECRET_ACCESS_KEY": SECRET}),
        json.dumps({"SECRET_ACCESS_KEY": SECRET, "ACCESS_KEY_ID": 5}),
        json.dumps({"SECRET_ACCESS_KEY": [SECRET], "ACCESS_KEY_ID": "AK"}),
        json.dumps({"SECRET_ACCESS_KEY": SECRET, "s3-endpoint": ""}),
        json.dumps([SECRET]),
        json.dumps({"SECRET_ACCESS_KEY": SECRET})[:-3],
        '{"SECRET_ACCESS_KEY": "' + SECRET + '\x01"}',
    ],
)
def test_malformed_credential_error_never_shows_the_secret(text: str) -> None:
    error = invalid(_job_with_credential(text))
    assert error.path.startswith('$.metadata.annotations["sedna.io/credential"]')
    assert SECRET not in str(error)
    assert SECRET[:8] not in error.reason


# --- robustness: nothing but InvalidMessage, whatever arrives --------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=30,
)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _only_invalid_message(decode: Callable[[bytes], object], data: bytes) -> None:
    try:
        decode(data)
    except InvalidMessage as e:
        assert isinstance(e.path, str)
        assert e.path.startswith("$")
        assert isinstance(e.reason, str)


@FAST
@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_invalid_message(data: bytes) -> None:
    _only_invalid_message(decode_envelope, data)
    _only_invalid_message(decode_worker_message, data)


@FAST
@given(json_values)
def test_arbitrary_json_raises_only_invalid_message(value: Any) -> None:
    data = json.dumps(value).encode()
    _only_invalid_message(decode_envelope, data)
    _only_invalid_message(decode_worker_message, data)


@FAST
@given(
    st.sampled_from(["dataset", "lifelonglearningjob", "LifelongLearningJob", "x"]),
    st.sampled_from(["insert", "delete", "INSERT", "status"]),
    json_values,
    st.booleans(),
)
def test_arbitrary_content_raises_only_invalid_message(
    kind: str, operation: str, content: Any, as_base64: bool
) -> None:
    if as_base64:
        content = base64.b64encode(json.dumps(content).encode()).decode()
    data = envelope(content, kind=kind, operation=operation)
    _only_invalid_message(decode_envelope, data)


def _mutations(base: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """The base object with one nested field replaced by an arbitrary JSON value."""
    paths: list[list[str]] = []

    def collect(obj: Any, prefix: list[str]) -> None:
        if isinstance(obj, dict):
            for key, value in obj.items():
                paths.append([*prefix, key])
                collect(value, [*prefix, key])

    collect(base, [])

    def apply(path: list[str], value: Any) -> dict[str, Any]:
        mutated = copy.deepcopy(base)
        _set(list(path), value)(mutated)
        return mutated

    return st.builds(apply, st.sampled_from(paths), json_values)


@FAST
@given(_mutations(JOB))
def test_mutated_jobs_raise_only_invalid_message(job: dict[str, Any]) -> None:
    _only_invalid_message(decode_envelope, envelope(job))


@FAST
@given(_mutations(DATASET))
def test_mutated_datasets_raise_only_invalid_message(dataset: dict[str, Any]) -> None:
    _only_invalid_message(
        decode_envelope, envelope(dataset, kind="dataset", name="lifelong-dataset")
    )


@FAST
@given(_mutations(WORKER))
def test_mutated_worker_messages_raise_only_invalid_message(worker: dict[str, Any]) -> None:
    data = json.dumps(worker).encode()
    try:
        message = decode_worker_message(data)
    except InvalidMessage:
        return
    reports.usable_models(message.results)  # never raises either
    assert msgspec.json.decode(wire.encode(message))["name"] == message.name


# --- job names its workers' names can carry ---------------------------------------------------


def _named(name: str) -> bytes:
    job = copy.deepcopy(JOB)
    job["metadata"]["name"] = name
    return envelope(job, name=name)


def test_a_job_name_too_long_for_its_workers_names_is_refused() -> None:
    """`{job}-train-{version}` must stay a DNS-1123 subdomain (253) for every version an
    int64 holds: a longer job name could never hear a report, so it is refused at once."""
    name = "j" * 228
    error = invalid(_named(name))
    assert (error.path, error.code) == ("$.metadata.name", "too_long")
    assert "at most 227 characters (228 given)" in error.reason


def test_the_longest_job_name_allowed_gets_valid_worker_names() -> None:
    name = "j" * 227
    decoded = decode_envelope(_named(name))
    assert isinstance(decoded, JobInsert) and decoded.job.metadata.name == name
    longest = f"{name}-train-{2**63 - 1}"
    assert len(longest) == 253
    report = decode_worker_message(worker_with(name=longest, ownerName=name))
    assert report.name == longest
