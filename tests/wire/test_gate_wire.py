"""The deploy condition and the rollback operation on the wire: decoded, validated with a
path, turned into the core's spec and event."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from service import schemas, wire
from service.core.events import RollbackRequested
from service.errors import InvalidMessage
from service.runtime.intake import accept_downstream
from service.wire import Condition, job_spec
from tests.wire.test_messages import JOB


def with_condition(condition: dict[str, Any] | None) -> dict[str, Any]:
    job = copy.deepcopy(JOB)
    job["spec"]["deploySpec"]["trigger"] = {} if condition is None else {"condition": condition}
    return job


def envelope(operation: str, content: object = None, kind: str = "lifelonglearningjob") -> bytes:
    header = {
        "namespace": "default", "resourceKind": kind, "resourceName": "atcii-classifier-demo",
        "operation": operation,
    }  # fmt: skip
    body: dict[str, Any] = {"header": header}
    if content is not None:
        body["content"] = content
    return json.dumps(body).encode()


def test_a_deploy_condition_becomes_the_jobs_gate() -> None:
    condition = {"operator": ">", "threshold": "0.1", "metric": "precision_delta[1]"}
    job = wire.decode_job(json.dumps(with_condition(condition)).encode())
    assert job_spec(job).gate == Condition(
        operator=">", threshold=0.1, metric="precision_delta[1]"
    )


@pytest.mark.parametrize(
    "condition", [None, {"operator": "", "threshold": 0, "metric": ""}, {}]
)
def test_no_condition_or_an_empty_operator_is_no_gate(condition: dict[str, Any] | None) -> None:
    job = wire.decode_job(json.dumps(with_condition(condition)).encode())
    assert job_spec(job).gate is None


def test_a_job_without_a_deploy_trigger_has_no_gate() -> None:
    job = wire.decode_job(json.dumps(JOB).encode())
    assert "trigger" not in JOB["spec"]["deploySpec"]
    assert job_spec(job).gate is None


@pytest.mark.parametrize(
    ("condition", "path", "words"),
    [
        ({"operator": "gt", "threshold": 1, "metric": "acc[x]"}, ".metric", "name[i]"),
        ({"operator": "bigger", "threshold": 1, "metric": "acc"}, ".operator", "Invalid enum"),
        ({"operator": "gt", "threshold": "1e999", "metric": "acc"}, ".threshold", "finite"),
        ({"operator": "gt", "threshold": "high", "metric": "acc"}, ".threshold", "numeric"),
        ({"operator": "gt", "threshold": 1}, ".metric", "required when operator is 'gt'"),
        ({"operator": "gt", "metric": "acc"}, ".threshold", "required when operator is 'gt'"),
    ],
)
def test_a_bad_deploy_condition_is_refused_naming_the_field(
    condition: dict[str, Any], path: str, words: str
) -> None:
    with pytest.raises(InvalidMessage) as caught:
        wire.decode_job(json.dumps(with_condition(condition)).encode())
    assert caught.value.path == "$.spec.deploySpec.trigger.condition" + path
    assert words in caught.value.reason


@pytest.mark.parametrize(
    ("content", "version"),
    [
        ({"version": 3}, 3),
        (None, None),
        ({}, None),
        (base64.b64encode(b'{"version": 7}').decode(), 7),
        ('{"version": 2}', 2),
    ],
)
def test_a_rollback_on_the_downstream_topic(content: object, version: int | None) -> None:
    accepted = accept_downstream("sedna/n/downstream", envelope("RollBack", content), 5)
    assert accepted.event == RollbackRequested(
        namespace="default", name="atcii-classifier-demo", version=version
    )
    assert accepted.resource is None


@pytest.mark.parametrize(
    ("payload", "path", "words"),
    [
        (envelope("rollback", {"version": 0}), "$.content.version", ">= 1"),
        (envelope("rollback", {"version": "3"}), "$.content.version", "Expected `int"),
        (envelope("rollback", {"versoin": 3}), "$.content", "unknown field `versoin`"),
        (envelope("rollback", [3]), "$.content", "expected an object"),
        (envelope("rollback", kind="dataset"), "$.header.operation", "expected insert or delete"),
        (envelope("undo"), "$.header.operation", "expected insert, delete or rollback"),
    ],
)
def test_a_bad_rollback_is_refused_naming_the_field(payload: bytes, path: str, words: str) -> None:
    with pytest.raises(InvalidMessage) as caught:
        accept_downstream("sedna/n/downstream", payload, 5)
    assert caught.value.path == path
    assert words in caught.value.reason


def test_the_rollback_schema_and_the_decoder_agree() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(schemas.generate()["rollback-envelope.json"])
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid(json.loads(envelope("rollback", {"version": 3})))
    assert not validator.is_valid(json.loads(envelope("rollback", {"version": 0})))
