"""Checking resources: every problem with its path, secrets masked, routing to nodes."""

from __future__ import annotations

from typing import Any

import pytest

from service import wire
from service.cli import manifests
from service.cli.manifests import Document
from tests.cli.documents import DATASET, JOB, copy


def check(obj: object, **kwargs: Any) -> manifests.Checked:
    return manifests.check_document(Document("f.yaml: document 1", obj), **kwargs)


def test_every_field_problem_is_reported_with_its_path() -> None:
    job = copy(JOB)
    job["metadata"]["name"] = "Bad_Name"
    job["spec"]["dataset"]["trainProb"] = 2
    job["spec"]["trainSpec"]["trigger"] = {"timer": {"start": "25:00", "end": "24:00"}}
    job["spec"]["outputDir"] = "relative"
    del job["spec"]["deploySpec"]
    resource, problems = manifests.resource_problems(job)
    assert resource is None
    assert [p.path for p in problems] == [
        "$.metadata.name",
        "$.spec.dataset.trainProb",
        "$.spec.trainSpec.trigger.timer.start",
        "$.spec.outputDir",
        "$.spec.deploySpec",
    ]
    assert problems[-1].reason == "required field is missing"


def test_a_bad_operator_does_not_invent_further_problems() -> None:
    job = copy(JOB)
    job["spec"]["trainSpec"]["trigger"] = {"condition": {"operator": "~"}}
    _, problems = manifests.resource_problems(job)
    assert [p.path for p in problems] == ["$.spec.trainSpec.trigger.condition.operator"]


def test_an_unknown_kind_stops_at_one_problem() -> None:
    _, problems = manifests.resource_problems({"kind": "Pod", "metadata": {"name": "x"}})
    assert [(p.path, p.reason) for p in problems] == [
        (
            "$.kind",
            "unknown kind 'Pod'; expected one of dataset, lifelonglearningjob, "
            "incrementallearningjob, model, jointinferenceservice, federatedlearningjob",
        )
    ]


def test_credential_problems_never_show_the_secret() -> None:
    dataset = copy(DATASET)
    secret = '{"SECRET_ACCESS_KEY": "hunter2", "s3-usehttps": "yes"}'
    dataset["metadata"]["annotations"] = {wire.CREDENTIAL_ANNOTATION: secret}
    checked = check(dataset)
    assert [p.path for p in checked.problems] == [
        '$.metadata.annotations["sedna.io/credential"].s3-usehttps'
    ]
    assert "hunter2" not in "\n".join(checked.problem_lines())


def test_unexpanded_shell_variable_is_pointed_out() -> None:
    dataset = copy(DATASET)
    dataset["spec"]["nodeName"] = "$WORKER_NODE"
    (line,) = check(dataset).problem_lines()
    assert line.startswith("f.yaml: document 1 (Dataset ds): $.spec.nodeName: must be a DNS-1123")
    assert "'$WORKER_NODE' looks like an unexpanded shell variable" in line


@pytest.mark.parametrize(
    ("path", "segments", "exact"),
    [("$", [], True), ("$.spec.a[3].b", ["spec", "a", 3, "b"], True),
     ('$.metadata.annotations["k"].x', ["metadata", "annotations"], False),
     ("$.metadata.annotations[...]", ["metadata", "annotations"], False), ("x", [], False)],
)  # fmt: skip
def test_parse_path(path: str, segments: list[str | int], exact: bool) -> None:
    assert manifests.parse_path(path) == (segments, exact)


def test_each_resource_routes_to_the_node_it_names() -> None:
    assert manifests.target_nodes(DATASET, "default-node") == (("edge-1",), [])
    assert manifests.target_nodes(JOB, "default-node") == (("edge-2",), [])
    unrouted = copy(JOB)
    unrouted["spec"]["trainSpec"]["template"] = {"spec": {"containers": []}}
    assert manifests.target_nodes(unrouted, "default-node") == (("default-node",), [])
    bad = copy(JOB)
    bad["spec"]["trainSpec"]["template"]["spec"]["nodeName"] = "a/b"
    nodes, problems = manifests.target_nodes(bad, "default-node")
    assert nodes == ()
    assert [p.path for p in problems] == ["$.spec.trainSpec.template.spec.nodeName"]


def test_checked_envelope_is_what_the_controller_accepts() -> None:
    checked = check(DATASET, default_namespace="team-b", default_node="n0")
    assert checked.problems == ()
    assert (checked.kind, checked.namespace, checked.name, checked.nodes) == (
        "dataset", "team-b", "ds", ("edge-1",),
    )  # fmt: skip
    decoded = wire.decode_envelope(checked.envelope)
    assert isinstance(decoded, wire.DatasetInsert)
    assert decoded.dataset.metadata.namespace == "team-b"
    job = check(JOB, default_namespace="team-b")
    assert job.namespace == "team-a", "a namespace the document names wins"


def test_misspelt_spec_fields_are_problems_with_a_hint() -> None:
    job = copy(JOB)
    job["spec"]["trainSpec"]["trigger"] = {"checkPeriodSecond": 5}
    job["spec"]["outputDirectory"] = "/elsewhere"
    job["spec"]["dataset"]["trainProbability"] = 0.9
    job["spec"]["trainSpec"]["template"]["spec"]["anyField"] = 1  # templates stay free-form
    job["metadata"]["creationTimestamp"] = "2024-05-01T00:00:00Z"  # metadata too
    checked = check(job)
    assert checked.envelope == b"", "nothing to send"
    assert checked.problem_lines() == [
        "f.yaml: document 1 (LifelongLearningJob job): $.spec.dataset.trainProbability: "
        "unknown field (did you mean trainProb?)",
        "f.yaml: document 1 (LifelongLearningJob job): $.spec.trainSpec.trigger."
        "checkPeriodSecond: unknown field (did you mean checkPeriodSeconds?)",
        "f.yaml: document 1 (LifelongLearningJob job): $.spec.outputDirectory: "
        "unknown field (did you mean outputDir?)",
    ]
