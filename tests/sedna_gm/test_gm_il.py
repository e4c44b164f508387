"""The GM stand-in's incremental-learning controller, driven by fake local controllers over
the websocket: the stage machine with its first-sync inference pod, the pods' environment,
the Models sent before the job, the hot-update path and a missing Model."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import dataset_resource
from tests.sedna_gm import test_gm
from tests.sedna_gm.gm import SednaGm
from tests.sedna_gm.pods import Behaviour, PodRecord
from tests.sedna_gm.resources import il_job_resource, model_resource
from tests.sedna_gm.test_gm import DATASET, JOB, NODE, FakeLc, WorkerEndpoint, make_gm
from tests.wait import wait_until

IL = "incrementallearningjob"
INITIAL = "initial-model"
DEPLOY = "deploy-model"

endpoint = test_gm.endpoint  # the fixture: a local controller's worker report endpoint


def il_lc(gm: SednaGm, node: str = NODE) -> FakeLc:
    return FakeLc(gm, node, kind=IL)


def il_gm(endpoint: WorkerEndpoint, tmp_path: Path, **options: Any) -> SednaGm:
    """A GM whose train and eval workers run until it saw their pod run, hot-update files
    under ``tmp_path``, polled every 50 ms."""
    gm = make_gm(
        endpoint, hot_update_root=tmp_path / "hot", hot_update_poll_s=0.05,
        behaviour=lambda info: Behaviour(until=gm.seen_running(info)), **options,
    )  # fmt: skip
    return gm


@pytest.fixture
def gm(endpoint: WorkerEndpoint, tmp_path: Path) -> Iterator[SednaGm]:
    sim = il_gm(endpoint, tmp_path)
    yield sim
    sim.close()


def setup(gm: SednaGm, tmp_path: Path, *, models: tuple[str, ...] = (INITIAL, DEPLOY),
          **job: Any) -> tuple[Path, Path]:  # fmt: skip
    """The dataset (10 samples), the initial and deploy Models (``initial``, ``deploy-0``)
    and the job applied; the data file and the output dir."""
    data = tmp_path / "data.txt"
    data.write_text("".join(f"sample-{i}\n" for i in range(10)))
    out = tmp_path / "out"
    gm.apply(dataset_resource(DATASET, str(data)))
    (tmp_path / "initial.pkl").write_bytes(b"initial")
    (tmp_path / "deploy.pkl").write_bytes(b"deploy-0")
    for name in models:
        gm.apply(model_resource(name, str(tmp_path / f"{name.split('-')[0]}.pkl")))
    gm.apply(il_job_resource(JOB, DATASET, str(out), initial_model=INITIAL,
                             deploy_model=DEPLOY, node=NODE, **job))  # fmt: skip
    return data, out


def latest_is(gm: SednaGm, condition: tuple[str, str]) -> None:
    gm.wait(lambda: gm.conditions(JOB)[-1:] == [condition], 10, f"{condition}",
            detail=lambda: str(gm.conditions(JOB)))  # fmt: skip


def at_node(lc: FakeLc, condition: tuple[str, str]) -> None:
    lc.wait(lambda: lc.latest() == condition, f"{condition} at {lc.node}")


def frames(lc: FakeLc) -> list[tuple[str, str, str]]:
    """(kind, operation, the model's name or the job copy's latest condition) per frame."""
    seen = []
    for header, content in list(lc.frames):
        kind, what = header["resourceKind"], header["resourceName"]
        if kind == IL and content and content["status"].get("conditions"):
            latest = content["status"]["conditions"][-1]
            what = f"{latest['stage']}/{latest['type']}"
        seen.append((kind, header["operation"], what))
    return seen


def inference(gm: SednaGm) -> list[PodRecord]:
    return [p for p in gm.pods(JOB) if p.type == "inference"]


def models_in(*urls: str) -> list[dict[str, str]]:
    return [{"format": "pkl", "url": url} for url in urls]


def train_input(out: Path, data: Path, *models: str) -> dict[str, Any]:
    """A train ready's input: its base model(s), output dir and data."""
    return {"models": models_in(*models), "outputDir": f"{out}/train/1", "dataURL": str(data)}


def test_an_il_round_through_the_stage_machine(
    gm: SednaGm, endpoint: WorkerEndpoint, tmp_path: Path
) -> None:
    home, evaluator = il_lc(gm), il_lc(gm, "node-b")
    data, out = setup(gm, tmp_path, eval_node="node-b")
    at_node(home, ("Train", "Waiting"))
    # the first sync created the inference pod, serving the deploy Model
    (infer,) = inference(gm)
    assert infer.env["MODEL_URL"] == str(tmp_path / "deploy.pkl")
    assert infer.env["WORKER_NAME"].startswith("inferworker-")
    assert infer.env["HEM_NAME"] == "IBT"
    assert json.loads(infer.env["HEM_PARAMETERS"]) == [{"key": "threshold_img", "value": "0.9"}]
    assert "MODEL_HOT_UPDATE" not in infer.env
    wait_until(lambda: infer.loaded == [b"deploy-0"], 10, "the deploy model served")
    # the initial Model reached the dataset's node before the job
    assert frames(home)[-2:] == [("model", "insert", INITIAL), (IL, "insert", "Train/Waiting")]
    model = next(c for h, c in home.frames if h["resourceKind"] == "model")
    assert model == {"kind": "Model", "metadata": model["metadata"],
                     "spec": {"url": str(tmp_path / "initial.pkl"), "format": "pkl"},
                     "status": {}}  # fmt: skip

    initial = str(tmp_path / "initial.pkl")
    home.status("train", "running")  # refused, as Go refuses it
    home.status("TRAIN", "Ready", input={**train_input(out, data, initial), "extra": 1},
                output={"models": [{"url": "/m", "classes": ["a"]}]})  # fmt: skip
    latest_is(gm, ("Eval", "Waiting"))
    assert gm.conditions(JOB) == [("Train", "Waiting"), ("Train", "Ready"), ("Train", "Starting"),
                                  ("Train", "Running"), ("Train", "Completed"),
                                  ("Eval", "Waiting")]  # fmt: skip
    assert [r.reason for r in gm.refused] == ["invalid condition type: running"]
    ready = gm.job(JOB)["status"]["conditions"][1]
    assert ready["message"] == "reported by lc"
    assert json.loads(ready["data"]) == {  # through IncrementalCondData
        "input": {"models": [{"format": "pkl", "url": initial, "classes": None}],
                  "dataURL": str(data), "outputDir": f"{out}/train/1"},
        "output": {"models": [{"format": "", "url": "/m", "classes": ["a"]}]},
    }  # fmt: skip
    assert "knowledgeBase" not in gm.job(JOB)["status"]
    train = next(p for p in gm.pods(JOB) if p.type == "train")
    assert train.env["BASE_MODEL_URL"] == initial and train.base_model == b"initial"
    assert train.env["MODEL_URL"] == f"{out}/train/1"
    assert train.env["TRAIN_DATASET_URL"] == str(data)
    assert train.env["ORIGINAL_DATASET_URL"] == str(data)
    assert train.env["WORKER_NAME"].startswith("train-worker-")
    assert "OUTPUT_URL" not in train.env and train.phase == "Succeeded"
    trained = out / "train" / "1" / "model.pkl"
    assert "10 samples" in trained.read_text()
    report = train.reports[-1].message
    assert report["ownerKind"] == IL and "ownerInfo" not in report
    assert report["results"] == [{"format": "pkl", "url": str(trained),
                                  "metrics": {"accuracy": [0.9]}}]  # fmt: skip
    # Eval/Waiting at the dataset's node, the deploy Model first
    at_node(home, ("Eval", "Waiting"))
    assert frames(home)[-2:] == [("model", "insert", DEPLOY), (IL, "insert", "Eval/Waiting")]

    home.status(
        "eval",
        "ready",
        input={
            "models": models_in(str(trained), initial),
            "dataURL": str(data),
            "dataIndexURL": "/index.txt",
        },
    )
    latest_is(gm, ("Deploy", "Waiting"))
    evaluation = next(p for p in gm.pods(JOB) if p.type == "eval")
    assert evaluation.node == "node-b"
    assert evaluation.env["MODEL_URLS"] == f"{trained};{initial}"
    assert evaluation.env["TEST_DATASET_URL"] == str(data)
    assert evaluation.env["ORIGINAL_DATASET_URL"] == "/index.txt"
    assert [r["url"] for r in evaluation.reports[-1].message["results"]] == [str(trained), initial]
    assert gm.job(JOB)["metadata"]["annotations"]["sedna.io/Eval"] == "node-b"
    # Deploy/Waiting goes to the eval node, the deploy Model first
    at_node(evaluator, ("Deploy", "Waiting"))
    assert frames(evaluator)[-2:] == [("model", "insert", DEPLOY),
                                      (IL, "insert", "Deploy/Waiting")]  # fmt: skip

    (tmp_path / "deploy.pkl").write_bytes(b"deploy-1")  # the LC's copy of the new model
    evaluator.status("deploy", "ready", input={"model": {"format": "pkl", "url": str(trained)}})
    gm.wait_rounds(JOB, 1, 10)
    assert gm.conditions(JOB)[-3:] == [("Deploy", "Ready"), ("Deploy", "Completed"),
                                       ("Train", "Waiting")]  # fmt: skip
    # without hot update the inference pod is restarted, serving the new deploy model
    restarted = inference(gm)[-1]
    assert restarted.name != infer.name
    wait_until(lambda: restarted.loaded == [b"deploy-1"], 10, "the new deploy model served")
    assert infer.name not in {p["metadata"]["name"] for p in gm.store.list("pod")}
    at_node(home, ("Train", "Waiting"))
    assert gm.order_problems(JOB) == [] and len(gm.refused) == 1 and gm.sync_failures == []


def test_with_hot_update_deploy_runs_until_the_lc_reports_it_completed(
    gm: SednaGm, endpoint: WorkerEndpoint, tmp_path: Path
) -> None:
    lc = il_lc(gm)
    data, out = setup(gm, tmp_path, models=(INITIAL, DEPLOY, "eval-model"), hot_update=True,
                      poll_period_s=30, initial_eval_model="eval-model")  # fmt: skip
    at_node(lc, ("Train", "Waiting"))
    config = gm.hot_update_config(JOB)
    assert config == tmp_path / "hot" / "default" / IL / JOB / "model_config.json"
    assert gm.job(JOB)["metadata"]["annotations"]["sedna.io/model-hot-update-config"] == str(config)
    (infer,) = inference(gm)
    assert infer.env["MODEL_HOT_UPDATE"] == "true"
    assert infer.env["MODEL_POLL_PERIOD_SECONDS"] == "30"
    assert infer.env["MODEL_HOT_UPDATE_CONFIG"] == "/model-hot-update/model_config.json"
    assert infer.mounts == {"/model-hot-update": str(config.parent)}

    initial = str(tmp_path / "initial.pkl")
    lc.status("train", "ready", input=train_input(out, data, initial))
    at_node(lc, ("Eval", "Waiting"))
    assert frames(lc)[-3:] == [("model", "insert", DEPLOY), ("model", "insert", "eval-model"),
                               (IL, "insert", "Eval/Waiting")]  # fmt: skip
    lc.status("eval", "ready", input={"models": models_in(initial), "dataURL": str(data)})
    at_node(lc, ("Deploy", "Waiting"))
    # with hot update the initial eval Model is not sent at Deploy/Waiting, only at Running
    assert frames(lc)[-2:] == [("model", "insert", DEPLOY), (IL, "insert", "Deploy/Waiting")]
    lc.status("deploy", "ready", input={"model": {"format": "pkl", "url": initial}})
    # Starting, then Running while the inference pod runs: the deploy node annotated
    at_node(lc, ("Deploy", "Running"))
    assert gm.conditions(JOB)[-3:] == [("Deploy", "Ready"), ("Deploy", "Starting"),
                                       ("Deploy", "Running")]  # fmt: skip
    assert gm.job(JOB)["metadata"]["annotations"]["sedna.io/Deploy"] == NODE
    assert inference(gm) == [infer], "no restart with hot update"
    assert frames(lc)[-3:] == [("model", "insert", "eval-model"), ("model", "insert", DEPLOY),
                               (IL, "insert", "Deploy/Running")]  # fmt: skip

    # what Sedna's LC does on deploy: the new model beside the config, the config rewritten
    (config.parent / "model.pkl").write_bytes(b"hot-1")
    config.write_text(json.dumps({"model_config": {
        "model_path": "/model-hot-update/model.pkl", "model_update_time": "t1"}}))  # fmt: skip
    wait_until(lambda: infer.loaded == [b"deploy-0", b"hot-1"], 10, "the hot-updated model")
    wait_until(lambda: infer.reports, 10, "the worker's report of its load")
    assert infer.reports[-1].message == {
        "name": infer.env["WORKER_NAME"], "namespace": "default", "ownerName": JOB,
        "ownerKind": IL, "kind": "deploy", "status": "completed",
    }  # fmt: skip
    assert infer.reports[-1].answer == 200
    # the GM never leaves Deploy/Running by itself, however its pod goes on running
    assert gm.conditions(JOB)[-1] == ("Deploy", "Running")

    lc.status("deploy", "completed")
    gm.wait_rounds(JOB, 1, 10)
    assert gm.conditions(JOB)[-2:] == [("Deploy", "Completed"), ("Train", "Waiting")]
    assert inference(gm) == [infer] and infer.phase == "Running"
    assert gm.order_problems(JOB) == [] and gm.refused == []


def test_a_missing_deploy_model_keeps_the_job_from_starting(gm: SednaGm, tmp_path: Path) -> None:
    setup(gm, tmp_path, models=(INITIAL,))
    (failure,) = gm.wait(lambda: gm.sync_failures, 10, "the first sync's failure")
    assert failure.kind == IL and failure.name == JOB and not failure.retried
    assert "failed to get infer model deploy-model" in failure.reason
    assert gm.pods(JOB) == [] and gm.conditions(JOB) == []

    gm.apply(model_resource(DEPLOY, str(tmp_path / "deploy.pkl")))
    resource = il_job_resource(JOB, DATASET, str(tmp_path / "out"), initial_model=INITIAL,
                               deploy_model=DEPLOY, node=NODE)  # fmt: skip
    resource["metadata"]["labels"] = {"touched": "1"}
    gm.apply(resource)  # an update of the job: its next sync
    latest_is(gm, ("Train", "Waiting"))
    assert [p.type for p in gm.pods(JOB)] == ["inference"]


def test_a_missing_initial_model_keeps_the_train_pod_from_being_created(
    endpoint: WorkerEndpoint, tmp_path: Path
) -> None:
    gm = il_gm(endpoint, tmp_path, retry_backoff_s=0.05)
    try:
        lc = il_lc(gm)
        data, out = setup(gm, tmp_path, models=(DEPLOY,))
        at_node(lc, ("Train", "Waiting"))
        assert not [h for h, _ in lc.frames if h["resourceKind"] == "model"], "none to send"
        initial = str(tmp_path / "initial.pkl")
        lc.status("train", "ready", input=train_input(out, data, initial))
        gm.wait(lambda: len(gm.sync_failures) >= 2, 10, "the sync failing again after back-off")
        assert {f.reason for f in gm.sync_failures} == {
            'failed to get initial model initial-model: model "default/initial-model" not found'
        }
        assert all(f.retried for f in gm.sync_failures)
        assert gm.conditions(JOB)[-1] == ("Train", "Ready")
        assert [p.type for p in gm.pods(JOB)] == ["inference"]

        gm.apply(model_resource(INITIAL, initial))
        latest_is(gm, ("Eval", "Waiting"))
        assert [p.type for p in gm.pods(JOB)] == ["inference", "train"]
    finally:
        gm.close()


def test_a_restarted_gm_sends_the_models_again_and_a_deleted_job_leaves_every_node(
    gm: SednaGm, tmp_path: Path
) -> None:
    home, evaluator = il_lc(gm), il_lc(gm, "node-b")
    data, out = setup(gm, tmp_path, eval_node="node-b")
    at_node(home, ("Train", "Waiting"))
    initial = str(tmp_path / "initial.pkl")
    home.status("train", "ready", input=train_input(out, data, initial))
    at_node(home, ("Eval", "Waiting"))
    home.status("eval", "ready", input={"models": models_in(initial), "dataURL": str(data)})
    at_node(evaluator, ("Deploy", "Waiting"))

    gm.restart()  # the new process lists the job again: its Models go before it
    evaluator.wait(lambda: evaluator._ws.state.name == "CLOSED", "the connection to drop")
    again = il_lc(gm, "node-b")
    at_node(again, ("Deploy", "Waiting"))
    assert frames(again)[-2:] == [("model", "insert", DEPLOY), (IL, "insert", "Deploy/Waiting")]

    gm.delete(IL, JOB)  # deleted on the dataset's node and the nodes its stages ran on
    again.wait(lambda: again.jobs()[-1][0] == "delete", "the delete at the eval node")
    home = il_lc(gm)  # the home node's connection was dropped by the restart too
    home.wait(lambda: home.jobs() and home.jobs()[-1][0] == "delete", "the delete at home")
