"""How describe and get show rounds, deployments and the gate; how rollback reads answers."""

from __future__ import annotations

import copy

import msgspec
import pytest

from service.cli import main
from service.cli.manifests import JOB, resource_problems
from service.cli.rendering import (
    describe_json,
    describe_lines,
    get_columns,
    main_metric,
    metric_value,
    sparkline,
)
from service.cli.sending import answer_of, rollback_envelope
from service.core.rounds import Deployment, RoundRecord
from service.core.state import JobState, ModelRef
from service.wire import Condition, JobSpec
from tests.cli.documents import JOB as REFERENCE_JOB

T0 = 1_700_000_000_000


def job(gate: Condition | None = None, **fields: object) -> JobState:
    state = JobState(
        namespace="default",
        name="j",
        spec=JobSpec(dataset="ds", train_prob=0.8, output_dir="/out", gate=gate),
        digest="d",
        version=3,
    )
    return msgspec.structs.replace(state, **fields)


def deployment(version: int, accuracy: float) -> Deployment:
    model = ModelRef(format="json", url=f"/out/train/{version}/model.json")
    return Deployment(version=version, model=model, metrics={"accuracy": (accuracy,)})


ROUNDS = [
    RoundRecord(version=1, outcome="deployed", train_started_ms=T0, eval_started_ms=T0 + 1500,
                deploy_started_ms=T0 + 2500, ended_ms=T0 + 2600, train_samples=200,
                eval_samples=50, candidate={"accuracy": (0.9,)}),
    RoundRecord(version=2, outcome="held_back", train_started_ms=T0 + 5000,
                eval_started_ms=T0 + 6000, deploy_started_ms=T0 + 7000, ended_ms=T0 + 7000,
                train_samples=210, eval_samples=50, candidate={"accuracy": (0.85,)},
                deployed={"accuracy": (0.9,)}, deployed_version=1,
                reason="held back by the deploy gate: accuracy_delta = -0.05: ..."),
    RoundRecord(version=3, outcome="failed", train_started_ms=T0 + 9000, ended_ms=T0 + 9500,
                train_samples=400, reason="train worker j-train failed (exit code 3)"),
    RoundRecord(version=1, kind="rollback", outcome="rolled_back", deploy_started_ms=T0 + 10_000,
                ended_ms=T0 + 10_040, deployed_version=2, candidate={"accuracy": (0.9,)}),
]  # fmt: skip


def test_the_main_metric_is_the_conditions_quantity_else_the_first_reported() -> None:
    assert main_metric(job(Condition(operator=">", threshold=0, metric="f1_delta[2]"))) == "f1[2]"
    assert main_metric(job(Condition(operator=">", threshold=0, metric="acc"))) == "acc"
    assert main_metric(job(), ROUNDS) == "accuracy"
    assert main_metric(job()) is None
    assert metric_value({"f1": (0.1, 0.2, 0.3)}, "f1[2]") == 0.3
    assert metric_value({"f1": (0.1,)}, "f1[2]") is None
    assert metric_value({}, None) is None


def test_sparkline_scales_between_the_extremes_and_marks_gaps() -> None:
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert sparkline([0.7, None, 0.7]) == "▄·▄"
    assert sparkline([None, None]) == "··"
    assert sparkline([]) == ""


def test_describe_shows_the_gate_the_deployed_model_and_a_table_of_rounds() -> None:
    gate = Condition(operator=">", threshold=0.05, metric="accuracy_delta")
    state = job(gate, deployed=deployment(1, 0.9), deployments=(deployment(2, 0.85),))
    lines = describe_lines(state, ROUNDS)
    assert lines[0] == (
        "Deploy gate:    deploy when accuracy_delta > 0.05 (eval scores the new model and the "
        "deployed one)"
    )
    assert lines[1] == (
        "Deployed:       version 1 (/out/train/1/model.json), accuracy 0.9; rollback to: 2"
    )
    assert lines[2] == "Rounds (last 4, oldest first), accuracy: █▁·█"
    header, *rows = lines[3:]
    assert header.split() == [
        "ROUND", "OUTCOME", "STARTED", "TRAIN", "EVAL", "DEPLOY", "TRAIN-N", "EVAL-N", "NEW",
        "VS", "DEPLOYED", "REASON",
    ]  # fmt: skip
    assert rows[0].split()[:11] == [
        "v1", "deployed", "2023-11-14T22:13:20.000Z", "1.5s", "1.0s", "0.1s", "200", "50", "0.9",
        "-", "-",
    ]  # fmt: skip
    assert rows[1].split()[:12] == [
        "v2", "held", "back", "2023-11-14T22:13:25.000Z", "1.0s", "1.0s", "0.0s", "210", "50",
        "0.85", "v1", "0.9",
    ]  # fmt: skip
    assert "held back by the deploy gate: accuracy_delta = -0.05" in rows[1]
    assert rows[2].split()[3:6] == ["0.5s", "-", "-"], "a round failed in train"
    assert rows[3].split()[:3] == ["v1", "rollback", "rolled"]


def test_describe_json_holds_the_same_data() -> None:
    state = job(deployed=deployment(1, 0.9))
    data = describe_json(state, ROUNDS)
    assert data["mainMetric"] == "accuracy"
    assert data["mainMetricValues"] == [0.9, 0.85, None, 0.9]
    assert data["deployed"]["version"] == 1
    assert [r["outcome"] for r in data["rounds"]] == [
        "deployed", "held_back", "failed", "rolled_back"
    ]
    assert data["rounds"][1]["deployedVersion"] == 1
    assert data["rounds"][0]["trainStartedMs"] == T0


def test_get_jobs_shows_the_deployed_version_and_its_main_metric() -> None:
    assert get_columns(job()) == {"deployed": None, "metric": None}
    assert get_columns(job(deployed=deployment(4, 0.91234))) == {
        "deployed": 4, "metric": "accuracy=0.9123"
    }


def test_rollback_answers() -> None:
    envelope = rollback_envelope(JOB, "default", "j", 2)
    assert b'"operation":"rollback"' in envelope and b'"version":2' in envelope
    assert b'"content"' not in rollback_envelope(JOB, "default", "j", None)
    up = "sedna/n/upstream"
    ready = {
        "header": {"namespace": "default", "resourceName": "j"},
        "content": {"phase": "deploy", "status": "ready",
                    "rollback": {"toVersion": 2, "fromVersion": 3}},
    }  # fmt: skip
    assert answer_of(up, ready, "default", "j", 2) == (
        True, "job default/j rolled back from version 3 to version 2"
    )
    assert answer_of(up, ready, "default", "j", None) is not None
    assert answer_of(up, ready, "default", "j", 1) is None, "another version's"
    assert answer_of(up, ready, "default", "k", 2) is None, "another job's"
    deployed = {**ready, "content": {"phase": "deploy", "status": "ready"}}
    assert answer_of(up, deployed, "default", "j", None) is None, "a round's deploy"
    refused = {"reason": "rollback of job default/j refused: version 9 was not deployed ..."}
    assert answer_of("sedna/n/errors", refused, "default", "j", 9) == (
        False, "lifelong: rollback of job default/j refused: version 9 was not deployed ..."
    )
    other = {"reason": "rollback of job default/jj refused: ..."}
    assert answer_of("sedna/n/errors", other, "default", "j", 9) is None


@pytest.mark.parametrize("text", ["0", "-1", "x"])
def test_a_bad_version_is_a_usage_error(text: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["rollback", "job", "j", "--to-version", text])
    assert exited.value.code == 2


def test_validate_knows_the_deploy_condition() -> None:
    job = copy.deepcopy(REFERENCE_JOB)
    job["spec"]["deploySpec"]["trigger"] = {
        "condition": {"operator": ">", "threshold": "1e999", "metric": "acc[x]"}
    }
    _, problems = resource_problems(job)
    assert [(p.path, p.reason) for p in problems] == [
        ("$.spec.deploySpec.trigger.condition.metric",
         "must be a metric name like 'num_of_samples' or 'name[i]'"),
        ("$.spec.deploySpec.trigger.condition.threshold", "must be a finite number"),
    ]  # fmt: skip
    job["spec"]["deploySpec"]["trigger"]["condition"] = {
        "operator": "ge", "threshold": 0.02, "metric": "precision_delta[1]"
    }
    assert resource_problems(job)[1] == []
