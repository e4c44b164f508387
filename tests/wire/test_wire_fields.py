"""Unknown fields: named with their path and the declared field they most resemble, derived
from the wire types; the service's own decoders keep accepting them."""

from __future__ import annotations

import json
from typing import Any

from service import wire
from service.wire import unknown_fields, unknown_spec_fields

JOB: dict[str, Any] = {
    "apiVersion": "sedna.io/v1alpha1",
    "kind": "LifelongLearningJob",
    "metadata": {"name": "j", "creationTimestamp": "2024-01-01T00:00:00Z", "uid": "u"},
    "spec": {
        "dataset": {"name": "ds", "trainProbability": 0.5},
        "trainSpec": {
            "template": {"spec": {"anything": {"goes": 1}}},
            "trigger": {"checkPeriodSecond": 5, "timer": {"start": "00:00", "end": "24:00"},
                        "condition": {"operator": ">", "threshold": 1, "metrik": "x"}},
        },
        "evalSpec": {"template": {"free": "form"}},
        "deploySpec": {"template": {}, "strategy": "x"},
        "outputDirectory": "/out",
        "outputDir": "/out",
    },
    "status": {"conditions": []},
}  # fmt: skip


def reasons(obj: dict[str, Any]) -> dict[str, str]:
    return {field.path: field.reason for field in unknown_spec_fields(obj)}


def test_misspelt_spec_fields_are_named_with_a_hint() -> None:
    assert reasons(JOB) == {
        "$.spec.dataset.trainProbability": "unknown field (did you mean trainProb?)",
        "$.spec.trainSpec.trigger.checkPeriodSecond":
            "unknown field (did you mean checkPeriodSeconds?)",
        "$.spec.trainSpec.trigger.condition.metrik": "unknown field (did you mean metric?)",
        "$.spec.deploySpec.strategy": "unknown field (known here: template, trigger)",
        "$.spec.outputDirectory": "unknown field (did you mean outputDir?)",
    }  # fmt: skip


def test_templates_metadata_and_status_stay_free_form() -> None:
    paths = set(reasons(JOB))
    assert not {p for p in paths if ".template" in p or "metadata" in p or "status" in p}


def test_dataset_spec_and_case_insensitive_hints() -> None:
    dataset = {"kind": "Dataset", "metadata": {"name": "d"},
               "spec": {"url": "/d.txt", "format": "txt", "nodename": "n", "URL2": 1}}  # fmt: skip
    assert reasons(dataset) == {
        "$.spec.nodename": "unknown field (did you mean nodeName?)",
        "$.spec.URL2": "unknown field (did you mean url?)",
    }


def test_known_fields_come_from_the_types_wire_names() -> None:
    (field,) = unknown_fields({"checkPeriodSeconds": 1, "x": 2}, wire.Trigger)
    assert field.path == "$.x"
    assert field.known == ("checkPeriodSeconds", "timer", "condition")
    assert unknown_spec_fields({"kind": "Pod", "spec": {"x": 1}}) == []
    assert unknown_spec_fields({"kind": "Dataset", "spec": "not an object"}) == []


def test_the_service_still_accepts_unknown_fields() -> None:
    sent = json.loads(json.dumps(JOB))
    # the required fields beside their misspellings, which stay
    sent["spec"]["dataset"]["trainProb"] = 0.5
    sent["spec"]["trainSpec"]["trigger"]["condition"]["metric"] = "num_of_samples"
    job = wire.decode_resource(json.dumps(sent).encode())
    assert isinstance(job, wire.LifelongLearningJob)
    assert job.spec.train_spec.trigger.check_period_seconds == 60, "the default, as before"
