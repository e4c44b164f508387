"""Models, joint-inference services and federated-learning jobs on the wire: Sedna's own
shapes decode (unknown spec fields tolerated, as templates are), bad names and oversized
templates are refused naming the field, and worker reports dispatch by `ownerKind`."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from service import wire
from service.core.events import OwnerReported, ResourceApplied, ResourceDeleted, WorkerReported
from service.errors import InvalidMessage
from service.runtime.intake import accept_downstream, accept_report
from service.wire.base import MAX_TEMPLATE_BYTES
from tests.sedna_kinds import FEDERATED_LEARNING, FL_REPORT, JI_REPORT, JOINT_INFERENCE, MODELS
from tests.wire.test_messages import WORKER


def envelope(kind: str, operation: str, resource: dict[str, Any] | None, name: str = "") -> bytes:
    meta = (resource or {}).get("metadata", {})
    header = {
        "namespace": meta.get("namespace", "default"),
        "resourceKind": kind,
        "resourceName": name or meta.get("name"),
        "operation": operation,
    }
    return json.dumps({"header": header, "content": resource}).encode()


def refused(data: bytes) -> InvalidMessage:
    with pytest.raises(InvalidMessage) as caught:
        accept_downstream("t", data, 0)
    return caught.value


@pytest.mark.parametrize("resource", [*MODELS, JOINT_INFERENCE, FEDERATED_LEARNING])
def test_sedna_examples_decode_unchanged(resource: dict[str, Any]) -> None:
    decoded = wire.decode_resource(json.dumps(resource).encode())
    assert decoded.kind == resource["kind"]
    accepted = accept_downstream("t", envelope(resource["kind"], "insert", resource), 0)
    assert isinstance(accepted.event, ResourceApplied)
    assert accepted.resource is not None, "stored beside its state, for describe"


def test_a_model_keeps_url_format_devices_and_whether_it_names_a_credential() -> None:
    model = copy.deepcopy(MODELS[1])
    model["metadata"]["annotations"] = {wire.CREDENTIAL_ANNOTATION: json.dumps(
        {"ACCESS_KEY_ID": "a", "SECRET_ACCESS_KEY": "b"})}  # fmt: skip
    event = accept_downstream("t", envelope("model", "insert", model), 0).event
    assert isinstance(event, ResourceApplied) and event.model is not None
    assert (event.kind, event.model.url, event.model.format) == ("model", "/model", "pb")
    assert event.model.devices == ("Ascend310", "Ascend710") and event.model.credential


def test_what_sedna_gm_sends_decodes_too() -> None:
    """The GM re-marshals from Go types: base64 content, a lower-case kind, unset optional
    references as `{"name": ""}`, `hpa: null`, a status, and fields we do not know."""
    job = copy.deepcopy(FEDERATED_LEARNING)
    job["kind"] = "federatedlearningjob"
    job["spec"]["pretrainedModel"] = {"name": ""}
    job["spec"]["futureField"] = {"anything": [1, 2]}
    job["status"] = {"phase": "Running", "active": 2}
    content = base64.b64encode(json.dumps(job).encode()).decode()
    data = json.loads(envelope("federatedlearningjob", "insert", job))
    data["content"] = content
    accepted = accept_downstream("gm", json.dumps(data).encode(), 0)
    assert isinstance(accepted.event, ResourceApplied)
    assert accepted.resource is not None and b"futureField" in accepted.resource
    assert b"Running" not in accepted.resource, "the GM's status is read once, never stored"
    service = copy.deepcopy(JOINT_INFERENCE)
    service["spec"]["edgeWorker"]["hpa"] = None
    service["spec"]["cloudWorker"]["hpa"] = {"maxReplicas": 3}
    assert isinstance(
        accept_downstream("gm", envelope("jointinferenceservice", "insert", service), 0).event,
        ResourceApplied,
    )


def test_deletes_name_the_kind() -> None:
    for kind, stored in (("Model", "model"), ("JointInferenceService", "jointinference"),
                         ("federatedlearningjob", "federatedlearning")):  # fmt: skip
        event = accept_downstream("t", envelope(kind, "delete", None, name="x"), 0).event
        assert event == ResourceDeleted(kind=stored, namespace="default", name="x")


@pytest.mark.parametrize(
    ("resource", "change", "path"),
    [
        (MODELS[0], lambda r: r["metadata"].update(name="Little_Model"), "$.metadata.name"),
        (MODELS[0], lambda r: r["spec"].update(url="http://x/m.pb"), "$.spec.url"),
        (MODELS[0], lambda r: r["spec"].update(device_soc_versions="x"),
         "$.spec.device_soc_versions"),
        (JOINT_INFERENCE, lambda r: r["spec"]["edgeWorker"]["model"].update(name="Bad Name"),
         "$.spec.edgeWorker.model.name"),
        (JOINT_INFERENCE, lambda r: r["spec"].pop("cloudWorker"), "$.spec"),
        (FEDERATED_LEARNING, lambda r: r["spec"]["trainingWorkers"][1]["dataset"].update(name=""),
         "$.spec.trainingWorkers[1].dataset.name"),
        (FEDERATED_LEARNING, lambda r: r["spec"]["pretrainedModel"].update(name="-x"),
         "$.spec.pretrainedModel.name"),
        (FEDERATED_LEARNING, lambda r: r["spec"]["transmitter"]["s3"].update(aggDataPath="/a/../b"),
         "$.spec.transmitter.s3.aggDataPath"),
    ],
)  # fmt: skip
def test_bad_fields_are_refused_naming_them(
    resource: dict[str, Any], change: Any, path: str
) -> None:
    bad = copy.deepcopy(resource)
    change(bad)
    with pytest.raises(InvalidMessage) as caught:
        wire.decode_resource(json.dumps(bad).encode())
    assert caught.value.path == path


def test_an_oversized_template_is_refused_and_a_large_one_passes() -> None:
    job = copy.deepcopy(FEDERATED_LEARNING)
    spec = job["spec"]["trainingWorkers"][1]["template"]["spec"]
    spec["containers"][0]["env"] = [{"name": "BLOB", "value": "x" * MAX_TEMPLATE_BYTES}]
    error = refused(envelope("FederatedLearningJob", "insert", job))
    assert (error.path, error.code) == ("$.spec.trainingWorkers[1].template", "too_large")
    spec["containers"][0]["env"] = [{"name": "BLOB", "value": "x" * (MAX_TEMPLATE_BYTES // 2)}]
    assert accept_downstream("t", envelope("FederatedLearningJob", "insert", job), 0)


def test_unknown_kinds_are_refused_with_the_reason() -> None:
    error = refused(envelope("ReidJob", "delete", None, name="r"))
    assert "unknown resourceKind 'ReidJob'" in error.reason
    assert "jointinferenceservice" in error.reason
    error = refused(envelope("Model", "rollback", None, name="m"))
    assert error.reason == "unknown operation 'rollback'; expected insert or delete"


# ================================================================= worker reports
def report(body: dict[str, Any], worker: str | None = None) -> OwnerReported | WorkerReported:
    name = worker or body["name"]
    event = accept_report("t", name, json.dumps(body).encode(), 0, channel="http").event
    assert isinstance(event, OwnerReported | WorkerReported)
    return event


def test_reports_dispatch_by_owner_kind_in_any_case() -> None:
    ji = report({**JI_REPORT, "ownerKind": "JointInferenceService"})
    assert isinstance(ji, OwnerReported)
    assert (ji.kind, ji.phase, ji.status) == ("jointinference", "inference", "")
    assert json.loads(ji.owner_info)["inferenceNumber"] == 120
    fl = report(FL_REPORT)
    assert isinstance(fl, OwnerReported)
    assert (fl.kind, fl.status, fl.results) == ("federatedlearning", "running",
                                                tuple(FL_REPORT["results"]))  # fmt: skip
    assert isinstance(report(WORKER), WorkerReported)


def test_only_a_joint_inference_report_may_leave_its_status_out() -> None:
    for body in (FL_REPORT, WORKER):
        without = {k: v for k, v in body.items() if k != "status"}
        with pytest.raises(InvalidMessage) as caught:
            report(without)
        assert caught.value.path == "$.status"
    assert report({**JI_REPORT, "status": "running"}).status == "running"


@pytest.mark.parametrize(
    ("owner_kind", "reason"),
    [
        ("dataset", "must be one of 'lifelonglearningjob', 'incrementallearningjob', "
                    "'jointinferenceservice', 'federatedlearningjob' (any case)"),
        ("reidjob", "must be one of"),
    ],
)  # fmt: skip
def test_other_owner_kinds_are_refused_with_the_reason(owner_kind: str, reason: str) -> None:
    with pytest.raises(InvalidMessage) as caught:
        report({**FL_REPORT, "ownerKind": owner_kind})
    assert caught.value.path == "$.ownerKind" and reason in caught.value.reason
