"""The generated contract in schemas/: no drift, a sound AsyncAPI document, schemas that
accept what the service sends and refuse what it refuses."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from service import schemas, wire
from tests.harness import status_header
from tests.sedna_kinds import FEDERATED_LEARNING, FL_REPORT, JI_REPORT, JOINT_INFERENCE, MODELS
from tests.wire.test_messages import DATASET, JOB, WORKER

SCHEMAS_DIR = Path(__file__).resolve().parents[2] / "schemas"
EXPECTED_FILES = {
    "envelope.json",
    "dataset.json",
    "lifelonglearningjob.json",
    "incrementallearningjob.json",
    "model.json",
    "jointinferenceservice.json",
    "federatedlearningjob.json",
    "report-status.json",
    "worker-message.json",
    "job-status.json",
    "dataset-status.json",
    "upstream-envelope.json",
    "rejection.json",
    "presence.json",
    "rollback-envelope.json",
    "asyncapi.yaml",
}
ROLLBACK: dict[str, Any] = {
    "header": {
        "namespace": "default",
        "resourceKind": "LifelongLearningJob",
        "resourceName": "atcii-classifier-demo",
        "operation": "rollback",
    },
    "content": {"version": 3},
}
EXPECTED_ADDRESSES = {
    "{prefix}/{node}/downstream",
    "{prefix}/{node}/workers/{worker}/info",
    "{prefix}/{node}/workers/{namespace}/{worker}/info",
    "{prefix}/{node}/upstream",
    "{prefix}/{node}/errors",
    "{prefix}/{node}/controllers/{replica}",
}


def test_committed_schemas_match_a_fresh_generation() -> None:
    generated = schemas.generate()
    assert set(generated) == EXPECTED_FILES
    stale = [
        name
        for name, content in generated.items()
        if not (SCHEMAS_DIR / name).is_file() or (SCHEMAS_DIR / name).read_bytes() != content
    ]
    assert stale == [], f"schemas/ drifted from the code; run `python -m service.schemas`: {stale}"


def test_generation_is_deterministic_and_stable_text() -> None:
    first, second = schemas.generate(), schemas.generate()
    assert first == second
    for name, content in first.items():
        assert content.endswith(b"\n"), name
        document = json.loads(content)
        assert content.decode() == json.dumps(document, sort_keys=True, indent=2) + "\n"


def test_check_mode_reports_stale_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert schemas.main(["--check", "--out", str(tmp_path)]) == 1
    assert "worker-message.json" in capsys.readouterr().err
    assert schemas.main(["--out", str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.iterdir()} == EXPECTED_FILES
    assert schemas.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "presence.json").write_text("{}\n")
    assert schemas.main(["--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "presence.json" in err
    assert "dataset.json" not in err


def _asyncapi() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(schemas.generate()["asyncapi.yaml"])
    return document


def test_asyncapi_parses_as_json_and_yaml() -> None:
    text = (SCHEMAS_DIR / "asyncapi.yaml").read_text()
    assert json.loads(text)["asyncapi"] == "3.0.0"
    yaml = pytest.importorskip("yaml")
    assert yaml.safe_load(text) == json.loads(text)


def test_asyncapi_lists_the_six_channels_with_parameters() -> None:
    document = _asyncapi()
    channels = document["channels"]
    assert {c["address"] for c in channels.values()} == EXPECTED_ADDRESSES
    parameters = document["components"]["parameters"]
    for channel in channels.values():
        named = {
            p
            for p in ("prefix", "node", "namespace", "worker", "replica")
            if f"{{{p}}}" in channel["address"]
        }
        assert set(channel["parameters"]) == named
        assert named <= set(parameters)
    assert parameters["prefix"]["default"] == "sedna"


def _resolve(document: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/")
    node: Any = document
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def test_asyncapi_operations_and_messages_resolve() -> None:
    document = _asyncapi()
    files = schemas.generate()
    actions = {}
    for name, operation in document["operations"].items():
        channel = _resolve(document, operation["channel"]["$ref"])
        actions[channel["address"]] = operation["action"]
        assert operation["bindings"]["mqtt"]["qos"] == 1, name
        for ref in operation["messages"]:
            message = _resolve(document, _resolve(document, ref["$ref"])["$ref"])
            payload_file = message["payload"]["$ref"]
            assert payload_file.startswith("./")
            assert payload_file[2:] in files
    assert actions == {
        "{prefix}/{node}/downstream": "receive",
        "{prefix}/{node}/workers/{worker}/info": "receive",
        "{prefix}/{node}/workers/{namespace}/{worker}/info": "receive",
        "{prefix}/{node}/upstream": "send",
        "{prefix}/{node}/errors": "send",
        "{prefix}/{node}/controllers/{replica}": "send",
    }
    presence = document["operations"]["sendPresence"]["bindings"]["mqtt"]
    assert presence["retain"] is True
    worker_message = document["components"]["messages"]["workerMessage"]
    assert worker_message["payload"] == {"$ref": "./worker-message.json"}


# --- samples validate against the generated schemas -----------------------------------------


def _upstream_status() -> bytes:
    header = status_header("lifelonglearningjob", "atcii-classifier-demo", "m-1")
    status = wire.JobStatus(
        phase="train",
        status="ready",
        input=wire.JobInput(data_url="/output/data/train/1/data.csv", output_dir="/o/train/1"),
    )
    return wire.encode(wire.UpstreamEnvelope(header=header, content=status))


def _forwarded_report() -> bytes:
    """A joint-inference report forwarded as Sedna's LC forwards it: no status given."""
    header = status_header("jointinferenceservice", "helmet-detection-inference-example", "m-2")
    output = wire.ReportOutput(owner_info=msgspec.Raw(b'{"inferenceNumber": 3}'))
    status = wire.ReportStatus(phase="inference", status="", output=output)
    return wire.encode(wire.UpstreamEnvelope(header=header, content=status))


def _upstream_count() -> bytes:
    header = status_header("dataset", "d")
    count = wire.DatasetStatus(number_of_samples=12)
    return wire.encode(wire.UpstreamEnvelope(header=header, content=count))


def _valid_samples() -> list[tuple[str, Any]]:
    now = datetime(2024, 1, 1, tzinfo=UTC)
    envelope = {
        "header": {
            "namespace": "default",
            "resourceKind": "lifelonglearningjob",
            "resourceName": "atcii-classifier-demo",
            "operation": "insert",
        },
        "content": JOB,
    }
    forwarded = wire.JobStatus(
        phase="eval",
        status="completed",
        output=wire.JobOutput(models=WORKER["results"], owner_info={}),
    )
    return [
        ("envelope.json", envelope),
        ("dataset.json", DATASET),
        ("lifelonglearningjob.json", JOB),
        ("worker-message.json", WORKER),
        ("worker-message.json", JI_REPORT),
        ("worker-message.json", FL_REPORT),
        ("model.json", MODELS[0]),
        ("model.json", MODELS[1]),
        ("jointinferenceservice.json", JOINT_INFERENCE),
        ("federatedlearningjob.json", FEDERATED_LEARNING),
        ("upstream-envelope.json", json.loads(_forwarded_report())),
        ("job-status.json", json.loads(wire.encode(forwarded))),
        ("dataset-status.json", {"numberOfSamples": 3}),
        ("rollback-envelope.json", ROLLBACK),
        ("rollback-envelope.json", {"header": {**ROLLBACK["header"], "operation": "Rollback"}}),
        ("upstream-envelope.json", json.loads(_upstream_status())),
        ("upstream-envelope.json", json.loads(_upstream_count())),
        (
            "rejection.json",
            json.loads(wire.encode(wire.make_rejection("t", "r", b"x", now))),
        ),
        (
            "presence.json",
            json.loads(
                wire.encode(
                    wire.Presence(replica="r1", state="online", since=wire.rfc3339_utc(now))
                )
            ),
        ),
    ]


def _invalid_samples() -> list[tuple[str, Any]]:
    return [
        ("dataset.json", {**DATASET, "spec": {**DATASET["spec"], "url": "http://x/data.csv"}}),
        ("dataset.json", {**DATASET, "metadata": {"name": "bad\n"}}),
        ("lifelonglearningjob.json", {**JOB, "spec": {**JOB["spec"], "outputDir": "/a/../b"}}),
        ("worker-message.json", {**WORKER, "status": "done"}),
        ("worker-message.json", {**WORKER, "ownerKind": "dataset"}),
        ("worker-message.json", {k: v for k, v in WORKER.items() if k != "status"}),
        ("worker-message.json", {k: v for k, v in FL_REPORT.items() if k != "status"}),
        ("model.json", {**MODELS[0], "spec": {"url": "/a/../b", "format": "pb"}}),
        ("jointinferenceservice.json", {**JOINT_INFERENCE, "spec": {"edgeWorker": {}}}),
        ("federatedlearningjob.json", {**FEDERATED_LEARNING, "metadata": {"name": "Yolo"}}),
        ("dataset-status.json", {"numberOfSamples": -1}),
        ("rollback-envelope.json", {**ROLLBACK, "content": {"version": 0}}),
        ("rollback-envelope.json", {**ROLLBACK, "header": {**ROLLBACK["header"],
                                                            "operation": "insert"}}),
        ("rollback-envelope.json", {**ROLLBACK, "header": {**ROLLBACK["header"],
                                                            "resourceKind": "dataset"}}),
        ("presence.json", {"replica": "r1", "state": "away", "since": "x"}),
        ("upstream-envelope.json", {"header": json.loads(_upstream_status())["header"]}),
    ]


@pytest.fixture(scope="module")
def validators() -> dict[str, Any]:
    jsonschema = pytest.importorskip("jsonschema")
    out = {}
    for name, content in schemas.generate().items():
        if name.endswith(".json"):
            schema = json.loads(content)
            jsonschema.Draft202012Validator.check_schema(schema)
            out[name] = jsonschema.Draft202012Validator(schema)
    return out


@pytest.mark.parametrize(("name", "sample"), _valid_samples())
def test_valid_messages_validate(validators: dict[str, Any], name: str, sample: Any) -> None:
    errors = [e.message for e in validators[name].iter_errors(sample)]
    assert errors == []


@pytest.mark.parametrize(("name", "sample"), _invalid_samples())
def test_invalid_messages_do_not_validate(
    validators: dict[str, Any], name: str, sample: Any
) -> None:
    assert not validators[name].is_valid(sample)


def test_schema_requires_the_contract_fields() -> None:
    """Without jsonschema too: the key fields are required where the contract needs them."""
    files = schemas.generate()
    worker = json.loads(files["worker-message.json"])["$defs"]["WorkerMessage"]
    assert set(worker["required"]) == {"name", "namespace", "ownerName", "ownerKind", "kind"}
    assert worker["else"] == {"required": ["status"]}, "status: required but of joint inference"
    job_input = json.loads(files["job-status.json"])["$defs"]["JobInput"]["properties"]
    assert {"models", "dataURL", "dataIndexURL", "outputDir", "deployedModel"} == set(job_input)
    rejection = json.loads(files["rejection.json"])["$defs"]["Rejection"]
    assert set(rejection["required"]) == {"topic", "reason", "payload", "receivedAt"}
