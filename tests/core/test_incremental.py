"""Incremental-learning jobs in the pure core: where a round's models come from, what an eval
compares, where a deployed model goes, and the GM's Deploy/Running after a hot update."""

from __future__ import annotations

import msgspec
import pytest

from service.core import kinds
from service.core.effects import CopyModel, HotUpdate, Publish, Reject
from service.core.events import JobApplied
from service.core.lifecycle import INCREMENTAL_TABLE, JOB_TABLE, job_table
from service.core.state import GmView, JobState, ModelInfo
from service.wire import Condition, ModelRef, Trigger
from tests.core.driver import INCREMENTAL, JOB, NS, Driver, report, spec

replace = msgspec.structs.replace
GATE = Condition(operator=">", threshold=0, metric="accuracy_delta[0]")


def incremental(**options: object) -> Driver:
    """An incremental-learning job whose first round was triggered (train/preparing)."""
    d = Driver()
    d.create(spec(incremental=replace(INCREMENTAL, **options), trigger=Trigger()))
    d.dataset(10)
    assert (d.job.phase, d.job.step) == ("train", "preparing")
    return d


def scored(url: str, accuracy: float, fmt: str = "pkl") -> dict[str, object]:
    return {"format": fmt, "url": url, "metrics": {"accuracy": [accuracy]}}


def evaluate(d: Driver, new: float, old: float) -> None:
    """The round's eval data written and its report: the new model, then the compared one."""
    d.written("eval")
    urls = [m["url"] for m in d.published()[-1]["input"]["models"]]
    d.apply(report("eval", "completed", results=[scored(urls[0], new), scored(urls[1], old)],
                   owner="incrementallearningjob"))  # fmt: skip


def train(d: Driver, *results: dict[str, object]) -> None:
    version = d.job.version
    d.written("train")
    default = [{"format": "pkl", "url": f"/output/train/{version}/m.pkl"}]
    d.apply(report("train", "completed", results=list(results) or default,
                   owner="incrementallearningjob"))  # fmt: skip


def test_choose_follows_the_models_format_and_device_soc_versions() -> None:
    ascend = ModelInfo(url="/m", format="pb", devices=("Ascend310", "Ascend710"))
    models = [
        ModelRef(format="pkl", url="/a"),
        ModelRef(format="pb", url="/b", devices=["Jetson"]),
        ModelRef(format="pb", url="/c", devices=["Ascend710"]),
        ModelRef(format="pb", url="/d"),
    ]
    assert kinds.choose(models, ascend) == models[2]
    assert kinds.choose(models, ModelInfo(url="/m", format="pb")) == models[1]
    assert kinds.choose(models, ModelInfo(url="/m")) == models[0], "no format: any"
    assert kinds.choose(models[:2], ascend) is None


def test_round_one_trains_from_the_initial_model_and_compares_with_the_deploy_model() -> None:
    d = incremental()
    assert d.last_write().models == INCREMENTAL, "the train round looks its Models up"
    d.written("train")
    ready = d.of(Publish)[-1]
    assert ready.resource_kind == "incrementallearningjob"
    assert d.published()[-1]["input"]["models"] == [{"format": "pkl", "url": "/models/initial.pkl"}]
    train(d)
    evaluate(d, new=0.7, old=0.5)
    evaluated = d.published()[-2]
    assert [m["url"] for m in evaluated["input"]["models"]] == [
        "/output/train/1/m.pkl", "/models/deployed.pkl"
    ]  # fmt: skip
    assert d.job.current is not None and d.job.current.deployed_version == 0
    copy = d.last_copy()
    assert (copy.src_url, copy.dst_url) == ("/output/train/1/m.pkl", "/models/deployed.pkl")
    assert copy.output_dir == "/output" and copy.hot_update is None
    d.copied()
    deployed = d.published()[-1]
    assert (deployed["phase"], deployed["status"]) == ("deploy", "ready")
    assert [m["url"] for m in deployed["input"]["models"]] == [
        "/output/train/1/m.pkl", "/models/deployed.pkl"
    ]  # fmt: skip


def test_later_rounds_train_from_the_last_trained_model() -> None:
    d = incremental()
    train(d)
    evaluate(d, new=0.7, old=0.5)
    d.copied()
    d.dataset(20)
    d.written("train")
    assert d.published()[-1]["input"]["models"] == [
        {"format": "pkl", "url": "/output/train/1/m.pkl"}
    ]


def test_no_trained_model_in_the_initial_models_format_trains_from_it_again() -> None:
    d = incremental()
    pb, pkl = "/output/train/1/m.pb", "/output/train/1/m.pkl"
    train(d, {"format": "pb", "url": pb}, {"format": "pkl", "url": pkl})
    d.written("eval")
    assert d.published()[-1]["input"]["models"][0]["url"] == pkl, "the one that fits"
    only_pb = (ModelRef(format="pb", url=pb),)
    d.state = replace(d.job, phase="train", step="preparing", version=2, train_models=only_pb)
    d.written("train")
    assert d.published()[-1]["input"]["models"][0]["url"] == "/models/initial.pkl"
    assert any("trains from the initial model again" in n for n in d.notes())


def test_no_trained_model_fitting_the_compared_model_fails_the_round() -> None:
    d = incremental()
    d.written("train")
    d.apply(report("train", "completed", "/output/train/1/m.pb", owner="incrementallearningjob"))
    d.state = replace(d.job, train_models=(ModelRef(format="pb", url="/output/train/1/m.pb"),))
    d.written("eval")
    failed = d.published()[-1]
    assert (failed["phase"], failed["status"]) == ("eval", "failed")
    assert failed["reason"] == "no trained model fits Model deployed's format pkl"
    assert (d.job.phase, d.job.step, d.job.consecutive_failures) == ("train", "waiting", 1)


def test_the_deploy_trigger_compares_with_the_deploy_model_before_any_deploy() -> None:
    d = Driver()
    d.create(spec(incremental=INCREMENTAL))
    d.state = replace(d.job, spec=replace(d.job.spec, gate=GATE))
    d.dataset(10)
    train(d)
    evaluate(d, new=0.4, old=0.5)
    held = d.published()[-1]
    assert (held["phase"], held["status"]) == ("deploy", "completed")
    assert held["gate"]["deployedVersion"] == 0 and held["gate"]["value"] == pytest.approx(-0.1)
    assert not d.of(CopyModel)


def test_hot_update_puts_the_model_beside_the_config_file() -> None:
    d = incremental(hot_update_config="/var/lib/sedna/hot/model_config.json")
    d.prefix = "/rootfs"
    train(d)
    evaluate(d, new=0.7, old=0.5)
    assert d.last_copy().hot_update == HotUpdate(
        config="/rootfs/var/lib/sedna/hot/model_config.json",
        model_file="/rootfs/var/lib/sedna/hot/m.pkl",
        model_path="/model-hot-update/m.pkl",
    )


def _deployed_with_gm(hot: str | None) -> Driver:
    """An incremental-learning job after its first deploy, as Sedna's GM would drive it."""
    d = incremental(hot_update_config=hot)
    train(d)
    evaluate(d, new=0.7, old=0.5)
    d.copied()
    d.state = replace(d.job, gm=GmView(stage="deploy", type="ready", count=9, reported=9))
    return d


@pytest.mark.parametrize("shown", ["starting", "running"])
def test_the_gms_deploy_stage_after_a_hot_update_is_released(shown: str) -> None:
    d = _deployed_with_gm("/hot/model_config.json")
    gm = GmView(stage="deploy", type=shown, count=10, reported=9)
    d.apply(JobApplied(namespace=NS, name=JOB, spec=d.job.spec, digest=d.job.digest, gm=gm))
    done = d.published()[-1]
    assert (done["phase"], done["status"]) == ("deploy", "completed")
    assert done["reason"].startswith("hot update")
    assert d.job.gm_reported == 10, "the next copy must hold it"


def test_without_hot_update_the_gms_deploy_stage_is_left_to_the_gm() -> None:
    d = _deployed_with_gm(None)
    before = len(d.published())
    gm = GmView(stage="deploy", type="starting", count=10, reported=9)
    d.apply(JobApplied(namespace=NS, name=JOB, spec=d.job.spec, digest=d.job.digest, gm=gm))
    assert len(d.published()) == before


def test_a_report_naming_the_other_job_kind_is_refused() -> None:
    d = incremental()
    d.written("train")
    effects = d.apply(report("train", "running"))  # ownerKind lifelonglearningjob
    [refused] = [e for e in effects if isinstance(e, Reject)]
    assert refused.code == "unknown_job"
    assert refused.reason == (
        f"unknown lifelonglearningjob {NS}/{JOB}: the job of that name is of kind "
        "incrementallearningjob"
    )


def test_each_kind_has_its_table() -> None:
    d = incremental()
    assert job_table(d.job, report("train", "running")) is INCREMENTAL_TABLE
    ll = JobState(namespace=NS, name=JOB, spec=spec(), digest="d")
    assert job_table(ll, report("train", "running")) is JOB_TABLE
    assert set(JOB_TABLE.rules) < set(INCREMENTAL_TABLE.rules)


def test_a_job_of_the_other_kind_under_the_same_name_is_refused() -> None:
    d = incremental()
    before = d.job
    effects = d.apply(JobApplied(namespace=NS, name=JOB, spec=spec(), digest="other"))
    [refused] = [e for e in effects if isinstance(e, Reject)]
    assert refused.code == "immutable_field"
    assert refused.reason.startswith(f"{NS}/{JOB} is a incrementallearningjob already")
    assert d.job == before
