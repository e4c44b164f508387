"""Incremental-learning jobs in the CLI: their names, their envelopes, Sedna's own example
validated as it is, and how `describe` shows their Models, hot update and deploy target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from service import cli, wire
from service.cli import rendering
from service.cli.manifests import (
    INCREMENTAL_JOB,
    JOB,
    check_document,
    delete_envelope,
    kind_named,
    load_documents,
)
from service.cli.sending import rollback_envelope
from service.core.gate import judge
from service.core.state import DatasetInfo, JobModels, JobState, ModelInfo
from service.history import HistoryRecord
from service.wire import Condition, IncrementalSpec, JobSpec
from tests.cli.runner import cli_env, run_cli

HELMET = Path(__file__).parent / "data" / "helmet_detection.yaml"
OFFLINE = ("mqtt://127.0.0.1:1", "redis://127.0.0.1:1/0")


@pytest.mark.parametrize(
    "typed",
    ["ij", "ilj", "IJ", "incrementallearningjob", "IncrementalLearningJobs",
     "incrementallearningjobs"],
)  # fmt: skip
def test_every_name_of_the_incremental_kind(typed: str) -> None:
    kind = kind_named(typed)
    assert kind is INCREMENTAL_JOB
    assert (kind.wire, kind.store, kind.title) == (
        "incrementallearningjob", "job", "IncrementalLearningJob",
    )  # fmt: skip


def test_job_still_means_a_lifelong_learning_job() -> None:
    for typed in ("job", "jobs", "llj", "lifelonglearningjob"):
        assert kind_named(typed) is JOB, typed
    assert JOB.store == INCREMENTAL_JOB.store, "one store kind: one namespace/name space"


def test_envelopes_carry_each_kind_its_own_wire_name() -> None:
    deleted = wire.decode_envelope(delete_envelope(INCREMENTAL_JOB.wire, "ns", "x"))
    assert isinstance(deleted, wire.JobDelete)
    envelope = rollback_envelope(INCREMENTAL_JOB, "ns", "x", 3)
    assert b'"resourceKind":"incrementallearningjob"' in envelope
    rollback = wire.decode_envelope(envelope)
    assert isinstance(rollback, wire.JobRollback) and rollback.version == 3
    assert b'"resourceKind":"lifelonglearningjob"' in rollback_envelope(JOB, "ns", "x", None)


def test_rollback_takes_either_job_kind_and_no_other() -> None:
    parser = cli.build_parser()
    assert parser.parse_args(["rollback", "ij", "x"]).kind is INCREMENTAL_JOB
    assert parser.parse_args(["rollback", "job", "x"]).kind is JOB
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["rollback", "dataset", "x"])
    assert exc.value.code == 2


def helmet() -> dict[str, Any]:
    (doc,) = load_documents(HELMET.read_text(), str(HELMET))
    assert isinstance(doc.obj, dict)
    return doc.obj


def test_unquoted_clock_times_are_strings_as_kubernetes_reads_them() -> None:
    # Kubernetes reads manifests with Go's yaml (YAML 1.1 too), which purposely drops
    # YAML 1.1's base-60 numbers: `02:00` is the string "02:00", never PyYAML's 120.
    timer = helmet()["spec"]["trainSpec"]["trigger"]["timer"]
    assert timer == {"start": "02:00", "end": "20:00"}
    checked = check_document(load_documents(HELMET.read_text(), "helmet")[0])
    assert checked.problems == ()
    job = wire.decode_envelope(checked.envelope)
    assert isinstance(job, wire.JobInsert)
    assert wire.job_spec(job.job).trigger.window == (2 * 60, 20 * 60)


def test_sednas_helmet_detection_example_validates_as_it_is() -> None:
    result = run_cli(cli_env(*OFFLINE), "validate", "-f", str(HELMET))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == (
        f"{HELMET}: document 1: IncrementalLearningJob default/helmet-detection-demo is valid\n"
    )


def test_a_bare_list_metric_is_accepted_at_apply_and_refused_by_the_gate() -> None:
    """`precision_delta` is what Sedna's example names; its eval reports lists. Apply takes
    it (a worker may report a number); the gate refuses a list at evaluation, saying why,
    instead of reading it as 0 as Sedna does."""
    checked = check_document(load_documents(HELMET.read_text(), "helmet")[0])
    assert checked.problems == ()
    insert = wire.decode_envelope(checked.envelope)
    assert isinstance(insert, wire.JobInsert)
    gate = wire.job_spec(insert.job).gate
    assert gate is not None and gate.metric == "precision_delta"
    verdict = judge(gate, {"precision": [0.9]}, {"precision": [0.7]})
    assert not verdict.holds
    assert "precision of the new model is a list of values" in verdict.reason
    assert judge(gate, {"precision": 0.9}, {"precision": 0.7}).holds


def test_the_shipped_incremental_example_validates() -> None:
    result = run_cli(
        cli_env(*OFFLINE), "validate", "-f", "examples/dataset.yaml", "-f",
        "examples/models.yaml", "-f", "examples/incrementallearningjob.yaml",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "IncrementalLearningJob default/helmet-detection-demo is valid" in result.stdout
    assert "Model default/initial-model is valid" in result.stdout
    assert "Model default/deploy-model is valid" in result.stdout


def test_a_bad_incremental_job_names_every_bad_field() -> None:
    obj = helmet()
    obj["spec"]["deploySpec"]["model"] = {"name": "Bad_Name"}
    obj["spec"]["initialModel"] = {}
    obj["spec"]["dataset"]["trainProb"] = 2
    doc = load_documents(msgspec.json.encode(obj).decode(), "bad")[0]
    paths = [p.path for p in check_document(doc).problems]
    assert paths == [
        "$.spec.initialModel.name", "$.spec.dataset.trainProb", "$.spec.deploySpec.model.name",
    ]  # fmt: skip


INCREMENTAL = IncrementalSpec(
    initial_model="initial-model", deploy_model="deploy-model",
    hot_update_config="/var/lib/sedna/model-hot-update/default/il/j/model_config.json",
)  # fmt: skip


def il_state(**changes: Any) -> JobState:
    spec = JobSpec(dataset="ds", train_prob=0.8, output_dir="/out", incremental=INCREMENTAL)
    fields: dict[str, Any] = {
        "namespace": "default", "name": "j", "spec": spec, "digest": "d", "phase": "train",
        "step": "waiting", "dataset": DatasetInfo(url="/d.txt", format="txt"),
    }  # fmt: skip
    return JobState(**{**fields, **changes})


MODELS = JobModels(
    initial=ModelInfo(url="/models/base_model", format="ckpt"),
    compared=ModelInfo(url="/models/deploy/saved_model.pb", format="pb", devices=("rk3588",)),
    deploy=ModelInfo(url="/models/deploy/saved_model.pb", format="pb", devices=("rk3588",)),
)


def test_describe_shows_the_models_hot_update_and_deploy_target() -> None:
    lines = rendering.describe_job(il_state(models=MODELS), None, [], 0)
    assert lines[10:15] == [
        "Initial model:  initial-model: ckpt /models/base_model (round 1 trains from it)",
        "Eval model:     deploy-model: pb /models/deploy/saved_model.pb, devices rk3588 (the "
        "deploy Model: evals compare with it until a model is deployed)",
        "Deploy model:   deploy-model: pb /models/deploy/saved_model.pb, devices rk3588 "
        "(deployed models are copied to its url)",
        "Hot update:     config /var/lib/sedna/model-hot-update/default/il/j/model_config.json "
        "(rewritten to name each deployed model, copied beside it)",
        "Deploy target:  /models/deploy/saved_model.pb",
    ]


def test_describe_before_the_models_are_resolved() -> None:
    evaluated = msgspec.structs.replace(
        INCREMENTAL, eval_model="eval-model", hot_update_config=None
    )
    spec = msgspec.structs.replace(il_state().spec, incremental=evaluated)
    lines = rendering.incremental_lines(il_state(spec=spec))
    assert lines == [
        "Initial model:  initial-model: not looked up yet (a round that needs it will) (round 1 "
        "trains from it)",
        "Eval model:     eval-model: not looked up yet (a round that needs it will) "
        "(evalSpec.initialEvalModel: evals compare with it until a model is deployed)",
        "Deploy model:   deploy-model: not looked up yet (a round that needs it will) (deployed "
        "models are copied to its url)",
        "Hot update:     off",
        "Deploy target:  the url of Model deploy-model (an eval round looks it up)",
    ]


def test_a_deployed_round_names_the_deploy_models_url_not_the_output_dir() -> None:
    records = [HistoryRecord(at_ms=0, event="E", outcome="applied", phase="deploy",
                             step="running", version=1)]  # fmt: skip
    files = dict(rendering.round_files(il_state(models=MODELS, version=1), records))
    assert files["deployed model"] == "/models/deploy/saved_model.pb"
    lifelong = il_state(spec=JobSpec(dataset="ds", train_prob=0.8, output_dir="/out"), version=1)
    assert dict(rendering.round_files(lifelong, records))["deployed model"] == (
        "/out/deploy/index.pkl"
    )
    assert rendering.incremental_lines(lifelong) == []


def test_gate_of_an_incremental_job_is_shown_as_for_a_lifelong_one() -> None:
    gate = Condition(operator=">", threshold=0.1, metric="precision_delta")
    state = il_state(spec=msgspec.structs.replace(il_state().spec, gate=gate))
    assert rendering.gate_summary(state).startswith("deploy when precision_delta > 0.1")
    assert rendering.main_metric(state) == "precision"


def test_describe_json_adds_the_models_for_an_incremental_job_only() -> None:
    data = rendering.describe_json(il_state(models=MODELS), [])
    assert data["incremental"]["deployModel"] == "deploy-model"
    assert data["models"]["deploy"] == {
        "url": "/models/deploy/saved_model.pb", "format": "pb", "devices": ("rk3588",),
    }  # fmt: skip
    assert data["deployTarget"] == "/models/deploy/saved_model.pb"
    assert rendering.describe_json(il_state(), [])["models"] is None
    lifelong = il_state(spec=JobSpec(dataset="ds", train_prob=0.8, output_dir="/out"))
    assert "models" not in rendering.describe_json(lifelong, [])
