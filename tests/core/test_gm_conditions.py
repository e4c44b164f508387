"""Jobs managed by Sedna's GM follow the GM's conditions, level-triggered: a stage's ready
only while the GM's latest copy shows the stage Waiting (a copy newer than the job's last
status to the GM), at most once per round and stage, sent again when it went unseen, and
the job follows the GM where the GM moves it."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.conditions import REPORTED_BY_LC, STAGED_DOUBT_MS, view_of
from service.core.effects import CopyModel, Publish, WriteRound, gm_accepts
from service.core.events import JobApplied, ModelCopied, RollbackRequested
from service.core.state import GmView
from service.wire import Condition, JobCondition, JobStatus
from tests.core.driver import JOB, NS, Driver, content, info, report, spec

OUT = "/output"


class Gm:
    """The GM's copies of the job as the core sees them: conditions appended one by one. A
    condition matching the oldest status the job sent the GM and the GM has not taken in yet
    is that status, taken in (marked "reported by lc", as Sedna's GM marks them)."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.conditions: list[JobCondition] = []
        self.taken = 0

    def sent(self) -> list[tuple[str, str]]:
        return [
            (content(e)["phase"], content(e)["status"])
            for e in self.driver.effects
            if isinstance(e, Publish) and e.to_gm
        ]

    def add(self, stage: str, kind: str, data: dict[str, Any] | None = None) -> None:
        text = json.dumps(data) if data is not None else ""
        pending = self.sent()[self.taken :]
        ours = bool(pending) and pending[0] == (stage.lower(), kind.lower())
        self.taken += ours
        message = REPORTED_BY_LC if ours else ""
        self.conditions.append(JobCondition(stage=stage, type=kind, data=text, message=message))

    def send(self, job_spec: Any = None) -> tuple[Any, ...]:
        """The GM sends its latest copy of the job."""
        return self.driver.apply(
            JobApplied(
                namespace=NS, name=JOB, spec=job_spec or spec(), digest="d1",
                gm=view_of(self.conditions),
            )
        )  # fmt: skip

    def step(self, stage: str, kind: str, data: dict[str, Any] | None = None) -> tuple[Any, ...]:
        self.add(stage, kind, data)
        return self.send()


def readies(effects: Any) -> list[tuple[str, str]]:
    """The stage statuses the GM waits for that the effects publish: readies, and a deploy
    completed that is the controller's own (not a forwarded worker report)."""
    published = [content(e) for e in effects if isinstance(e, Publish)]
    return [
        (c["phase"], c["status"])
        for c in published
        if c["status"] == "ready" or (c["phase"] == "deploy" and c["status"] == "completed")
    ]


def started(gm_spec: Any = None) -> tuple[Driver, Gm]:
    """A GM-managed job with 10 samples, its dataset here: the GM shows Train/Waiting."""
    driver = Driver()
    gm = Gm(driver)
    gm.add("Train", "Waiting")
    gm.send(gm_spec)
    driver.dataset(10, info())
    return driver, gm


def test_a_gm_job_waits_for_train_waiting_before_its_trigger_fires() -> None:
    driver = Driver()
    gm = Gm(driver)
    gm.send()  # no condition yet (a 2021 GM sends the job before its first sync)
    driver.dataset(10, info())
    assert not driver.of(WriteRound) and driver.job.step == "waiting"
    gm.step("Train", "Waiting")
    assert driver.job.step == "preparing" and driver.last_write().phase == "train"


def test_the_eval_ready_waits_for_a_copy_newer_than_the_train_completed() -> None:
    driver, gm = started()
    driver.written("train")
    gm.step("Train", "Ready", {"input": {"outputDir": f"{OUT}/train/1"}})
    gm.step("Train", "Starting")
    gm.step("Eval", "Waiting")  # the GM saw the pod succeed before the worker's report came
    effects = driver.apply(report("train", "completed", f"{OUT}/train/1/m.pkl"))
    assert driver.job.step == "staged", "not in the same breath as the train completed"
    assert not any(isinstance(e, WriteRound) for e in effects)
    gm.send()  # a resync re-sends the same copy: nothing newer than the completed
    assert driver.job.step == "staged"
    gm.step("Train", "Completed", {"output": {"models": [{"url": f"{OUT}/train/1/m.pkl"}]}})
    assert driver.job.step == "staged"
    gm.step("Eval", "Waiting")
    assert driver.job.step == "preparing" and driver.last_write().phase == "eval"
    effects = driver.written("eval")
    assert readies(effects) == [("eval", "ready")]
    for _ in range(3):
        assert readies(gm.send()) == [], "at most once per round and stage"


def test_a_ready_unseen_by_the_gm_is_sent_again_after_the_resend_interval() -> None:
    driver, gm = started()
    first = driver.written("train")
    assert readies(first) == [("train", "ready")]
    gm.send()  # the GM's write-back dropped our Ready: still Train/Waiting, no newer copy
    driver.now_ms += 29_000
    assert readies(driver.tick()) == []
    driver.now_ms += 1_000
    again = driver.tick()
    assert readies(again) == [("train", "ready")]
    assert (
        content(next(e for e in again if isinstance(e, Publish)))["input"]
        == content(next(e for e in first if isinstance(e, Publish)))["input"]
    )
    gm.step("Train", "Ready", {"input": {"outputDir": f"{OUT}/train/1"}})
    driver.now_ms += 60_000
    assert readies(driver.tick()) == [], "a newer copy shows the GM took it in"


def test_the_job_follows_the_gm_when_a_pod_fails() -> None:
    driver, gm = started()
    driver.written("train")
    gm.step("Train", "Ready", {"input": {"outputDir": f"{OUT}/train/1"}})
    gm.step("Train", "Failed")
    gm.step("Train", "Waiting")
    job = driver.job
    assert (job.phase, job.step) == ("train", "waiting")
    assert job.consecutive_failures == 1 and "Sedna's GM moved the job" in (job.last_error or "")
    assert job.pending == ((0, 8),), "the round's train samples come back first"
    assert job.retry_at_ms is not None, "the failure backs off"


def test_a_stage_completed_on_another_node_goes_on_from_the_gms_data() -> None:
    driver, gm = started()
    driver.written("train")
    gm.step("Train", "Ready", {"input": {"outputDir": f"{OUT}/train/1"}})
    gm.step("Train", "Running")
    gm.step(
        "Train",
        "Completed",
        {"output": {"models": [{"format": "pkl", "url": f"{OUT}/train/1/m.pkl"}]}},
    )
    assert (driver.job.phase, driver.job.step) == ("eval", "staged")
    gm.step("Eval", "Waiting")
    assert (driver.job.phase, driver.job.step) == ("eval", "preparing")
    assert driver.job.train_models[0].url == f"{OUT}/train/1/m.pkl"


def test_models_of_another_round_in_the_gms_data_are_not_taken() -> None:
    driver, gm = started()
    driver.written("train")
    gm.step("Train", "Ready", {"input": {"outputDir": f"{OUT}/train/1"}})
    gm.step("Train", "Completed", {"output": {"models": [{"url": f"{OUT}/train/0/m.pkl"}]}})
    gm.step("Eval", "Waiting")
    assert driver.job.step == "running"
    assert any("not this round's" in n for n in driver.notes())


def test_a_stage_the_gm_ended_with_no_model_reported_fails_after_the_resend_interval() -> None:
    """The worker's pod succeeded but no model came (its report was lost, or it never sent
    one): the job and the GM would wait for each other for good; the round fails instead,
    and the GM hears it."""
    driver, gm = started()
    driver.written("train")
    gm.step("Train", "Ready", {"input": {"outputDir": f"{OUT}/train/1"}})
    gm.step("Train", "Completed")  # the GM's own: the pod succeeded
    gm.step("Eval", "Waiting")
    assert driver.job.step == "running"
    driver.now_ms += 29_000
    driver.tick()
    assert driver.job.step == "running", "a report may still come"
    driver.now_ms += 1_000
    effects = driver.tick()
    assert (driver.job.phase, driver.job.step) == ("train", "waiting")
    to_gm = [content(e) for e in effects if isinstance(e, Publish) and e.to_gm]
    assert [(c["phase"], c["status"]) for c in to_gm] == [("eval", "failed")], "where the GM is"
    assert "no worker reported the round's model within 30 s" in (driver.job.last_error or "")
    assert driver.job.consecutive_failures == 1 and driver.job.pending == ((0, 8),)


def test_a_report_after_the_gm_ended_the_stage_goes_on_as_usual() -> None:
    driver, gm = started()
    driver.written("train")
    gm.step("Train", "Ready", {"input": {"outputDir": f"{OUT}/train/1"}})
    gm.step("Train", "Completed")
    gm.step("Eval", "Waiting")
    driver.now_ms += 10_000
    driver.apply(report("train", "completed", f"{OUT}/train/1/m.pkl"))
    assert driver.job.phase == "eval"
    driver.now_ms += 30_000
    driver.tick()
    assert driver.job.phase == "eval" and driver.job.consecutive_failures == 0


def gm_round_to_deploy(driver: Driver, gm: Gm, eval_results: list[dict[str, Any]]) -> None:
    """From the trigger fired (train/preparing) to the eval's report (deploy/staged)."""
    v = driver.job.version
    driver.written("train")
    gm.step("Train", "Ready", {"input": {"outputDir": f"{OUT}/train/{v}"}})
    driver.apply(report("train", "completed", f"{OUT}/train/{v}/m.pkl"))
    gm.step("Train", "Completed")
    gm.step("Eval", "Waiting")
    driver.written("eval")
    gm.step("Eval", "Ready", {"input": {"outputDir": f"{OUT}/eval/{v}"}})
    driver.apply(report("eval", "completed", results=eval_results))


def deployed_round(driver: Driver, gm: Gm) -> None:
    """A whole round through to the GM's Deploy/Completed."""
    v = driver.job.version
    model = {"format": "pkl", "url": f"{OUT}/eval/{v}/m.pkl", "metrics": {"accuracy": [0.8]}}
    gm_round_to_deploy(driver, gm, [model])
    gm.step("Eval", "Completed")
    gm.step("Deploy", "Waiting")
    driver.copied()
    gm.step("Deploy", "Ready")
    gm.step("Deploy", "Completed")


def test_the_deploy_decision_waits_for_deploy_waiting() -> None:
    driver, gm = started()
    gm_round_to_deploy(driver, gm, [{"format": "pkl", "url": f"{OUT}/eval/1/m.pkl"}])
    assert (driver.job.phase, driver.job.step) == ("deploy", "staged")
    assert not driver.of(CopyModel)
    gm.step("Eval", "Completed")
    gm.step("Deploy", "Waiting")
    assert driver.job.step == "copying"
    effects = driver.copied()
    assert readies(effects) == [("deploy", "ready")]
    assert (driver.job.phase, driver.job.step) == ("train", "waiting")
    gm.step("Deploy", "Ready")
    gm.step("Deploy", "Completed")
    driver.dataset(20, info())
    assert not driver.of(WriteRound)[1:] or driver.of(WriteRound)[-1].version == 1
    gm.step("Train", "Waiting")
    assert driver.job.version == 2, "the next round starts once the GM shows Train/Waiting"


def gated_to_a_worse_model() -> tuple[Driver, Gm]:
    """A gated job: round 1 deployed, round 2's model worse, its eval reported (deploy/
    staged)."""
    gate = Condition(operator=">", threshold=0.01, metric="accuracy_delta[0]")
    driver, gm = started(msgspec.structs.replace(spec(), gate=gate))
    deployed_round(driver, gm)  # round 1: nothing deployed to beat
    assert driver.job.deployed is not None
    driver.dataset(20, info())
    gm.step("Train", "Waiting")
    worse = [
        {"format": "pkl", "url": f"{OUT}/eval/2/m.pkl", "metrics": {"accuracy": [0.5]}},
        {"format": "pkl", "url": f"{OUT}/eval/1/m.pkl", "metrics": {"accuracy": [0.9]}},
    ]
    gm_round_to_deploy(driver, gm, worse)
    return driver, gm


def test_a_held_back_model_sends_deploy_completed_at_deploy_waiting() -> None:
    driver, gm = gated_to_a_worse_model()
    assert (driver.job.phase, driver.job.step) == ("deploy", "staged")
    copies = len(driver.of(CopyModel))
    gm.step("Eval", "Completed")
    effects = gm.step("Deploy", "Waiting")
    assert readies(effects) == [("deploy", "completed")]
    assert len(driver.of(CopyModel)) == copies, "no copy: the deploy file keeps its model"
    assert driver.job.deployed.version == 1


def test_a_rollbacks_ready_waits_for_train_waiting() -> None:
    driver, gm = started()
    deployed_round(driver, gm)
    driver.dataset(20, info())
    gm.step("Train", "Waiting")
    deployed_round(driver, gm)
    assert driver.job.deployed is not None and driver.job.deployed.version == 2
    driver.apply(RollbackRequested(namespace=NS, name=JOB, version=1))
    effects = driver.apply(ModelCopied(namespace=NS, name=JOB, version=1, rollback=True))
    assert readies(effects) == [], "the GM has not shown Train/Waiting since the last deploy"
    assert driver.job.gm_rollback is not None and driver.job.deployed.version == 1
    effects = gm.step("Train", "Waiting")
    assert readies(effects) == [("deploy", "ready")]
    assert driver.job.gm_rollback is None
    assert driver.job.version == 2, "the trigger waits for the next copy showing Train/Waiting"


def test_only_statuses_the_gm_accepts_go_to_it() -> None:
    assert gm_accepts(JobStatus(phase="train", status="ready"))
    assert gm_accepts(JobStatus(phase="deploy", status="completed"))
    assert not gm_accepts(JobStatus(phase="train", status="running"))
    assert not gm_accepts(JobStatus(phase="inference", status="completed"))
    driver, _gm = started()
    driver.written("train")
    running = driver.apply(report("train", "running"))
    trained = driver.apply(report("train", "completed", f"{OUT}/train/1/m.pkl"))
    inference = driver.apply(report("deploy", "completed", "/output/deploy/index.pkl"))
    forwarded = [e for e in (*running, *trained, *inference) if isinstance(e, Publish)]
    assert [(content(e)["status"], e.to_gm) for e in forwarded] == [
        ("running", False), ("completed", True), ("completed", False),
    ]  # fmt: skip


def test_a_node_without_the_dataset_only_binds_reports_to_the_gms_round() -> None:
    driver = Driver()
    gm = Gm(driver)
    gm.add("Train", "Waiting")
    gm.add("Train", "Ready", {"input": {"outputDir": f"{OUT}/train/3"}})
    gm.add("Train", "Running")
    gm.send()
    outside = driver.apply(report("train", "completed", f"{OUT}/train/2/m.pkl"))
    assert any(type(e).__name__ == "Reject" for e in outside)
    inside = driver.apply(report("train", "completed", f"{OUT}/train/3/m.pkl"))
    assert [content(e)["status"] for e in inside if isinstance(e, Publish)] == ["completed"]
    assert driver.job.version == 0 and not driver.of(WriteRound)


def test_view_of_reads_the_latest_condition_and_the_models() -> None:
    ready = {"input": {"outputDir": "/o/train/1"}}
    trained = {"output": {"models": [{"url": "/o/train/1/a", "format": "pb", "classes": None}]}}
    conditions = [
        JobCondition(stage="Train", type="Waiting"),
        JobCondition(stage="Train", type="Ready", data=json.dumps(ready)),
        JobCondition(stage="Train", type="Completed", data=json.dumps(trained)),
        JobCondition(stage="Train", type="Completed", data="not json"),
        JobCondition(stage="Eval", type="Waiting"),
    ]
    view = view_of(conditions)
    assert view == GmView(
        stage="eval", type="waiting", count=5, round_dir="/o/train/1",
        trained=({"url": "/o/train/1/a", "format": "pb"},),
    )  # fmt: skip


_STAGES = st.sampled_from(["Train", "Eval", "Deploy"])
_TYPES = st.sampled_from(["Waiting", "Ready", "Starting", "Running", "Completed", "Failed"])


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(_STAGES, _TYPES), st.sampled_from(["report", "written", "copied", "tick"])
        ),
        max_size=40,
    )
)
def test_a_ready_never_goes_out_in_the_same_breath_as_another_status_to_the_gm(
    steps: list[Any],
) -> None:
    driver, gm = started()
    for step in steps:
        job = driver.job
        if isinstance(step, tuple):
            effects = gm.step(*step)
        elif step == "report" and job.step == "running":
            kind = job.phase
            effects = driver.apply(report(kind, "completed", f"{OUT}/{kind}/{job.version}/m.pkl"))
        elif step == "written" and job.step == "preparing":
            effects = driver.written(job.phase)
        elif step == "copied" and job.step == "copying":
            effects = driver.copied()
        elif step == "tick":
            driver.now_ms += 31_000
            effects = driver.tick()
        else:
            continue
        to_gm = [content(e) for e in effects if isinstance(e, Publish) and e.to_gm]
        if any(c["status"] == "ready" for c in to_gm):
            assert len(to_gm) == 1, to_gm


def test_a_ready_the_gms_write_back_dropped_is_sent_again() -> None:
    """The GM appends the job's Ready, then writes back a stale copy plus Eval/Waiting over
    it: later copies have more conditions, yet none holds the Ready."""
    driver, gm = started()
    driver.written("train")
    gm.step("Train", "Ready", {"input": {"outputDir": f"{OUT}/train/1"}})
    driver.apply(report("train", "completed", f"{OUT}/train/1/m.pkl"))
    gm.step("Train", "Completed")
    gm.step("Eval", "Waiting")
    assert readies(driver.written("eval")) == [("eval", "ready")]
    gm.add("Train", "Completed")  # the GM's own, from its pod path, written over our Ready
    gm.add("Eval", "Waiting")
    gm.send()
    driver.now_ms += 29_000
    assert readies(driver.tick()) == []
    driver.now_ms += 1_000
    assert readies(driver.tick()) == [("eval", "ready")], "still Eval/Waiting: sent again"
    gm.step("Eval", "Ready", {"input": {"outputDir": f"{OUT}/eval/1"}})
    driver.now_ms += 60_000
    assert readies(driver.tick()) == [], "taken in at last"


def test_a_staged_eval_believes_the_gm_soon_when_its_write_back_dropped_the_completed() -> None:
    """The GM's pod path completed the train stage and wrote back over the forwarded
    `completed`: the copy shows Eval/Waiting but never the job's status. The eval starts
    once the doubt is over, not a resend interval later."""
    driver, gm = started()
    driver.written("train")
    gm.step("Train", "Ready", {"input": {"outputDir": f"{OUT}/train/1"}})
    driver.apply(report("train", "completed", f"{OUT}/train/1/m.pkl"))
    assert driver.job.step == "staged"
    due = driver.job.next_check_ms
    assert due is not None and due == driver.now_ms + STAGED_DOUBT_MS
    gm.add("Train", "Completed")  # the GM's own; the forwarded one is lost
    gm.taken -= 1  # (not taken in: the write-back dropped it)
    gm.conditions[-1] = JobCondition(stage="Train", type="Completed")
    gm.step("Eval", "Waiting")
    assert driver.job.step == "staged", "a copy lacking the completed is doubted at first"
    driver.now_ms += STAGED_DOUBT_MS - 1
    driver.tick()
    assert driver.job.step == "staged"
    driver.now_ms += 1
    driver.tick()
    assert driver.job.step == "preparing" and driver.last_write().phase == "eval"
    assert readies(driver.written("eval")) == [("eval", "ready")]


def test_the_next_trigger_believes_the_gm_soon_when_its_write_back_dropped_the_last_status(
) -> None:
    """A held-back model's deploy `completed` goes to the GM, whose write-back drops it as
    it moves the job to Train/Waiting: no copy will ever hold it. The next round's trigger,
    a stage waiting to start as a staged one does, fires once the doubt is over, not a
    resend interval (30 s) later."""
    driver, gm = gated_to_a_worse_model()
    gm.step("Eval", "Completed")
    assert readies(gm.step("Deploy", "Waiting")) == [("deploy", "completed")]
    gm.add("Deploy", "Completed")
    gm.taken -= 1  # (not taken in: the write-back dropped it)
    gm.conditions[-1] = JobCondition(stage="Deploy", type="Completed")  # the GM's own
    gm.step("Train", "Waiting")
    driver.dataset(30, info())
    assert driver.job.version == 2, "a copy lacking the completed is doubted at first"
    driver.now_ms += STAGED_DOUBT_MS - 1
    driver.tick()
    assert (driver.job.phase, driver.job.step, driver.job.version) == ("train", "waiting", 2)
    driver.now_ms += 1
    driver.tick()
    assert (driver.job.step, driver.job.version) == ("preparing", 3)


def test_a_copy_after_one_that_held_every_status_counts_though_it_lost_one() -> None:
    """Once a copy held the forwarded `completed`, a later copy the write-back wrote without
    it still comes after it: its Eval/Waiting starts the eval at once."""
    driver, gm = started()
    driver.written("train")
    gm.step("Train", "Ready", {"input": {"outputDir": f"{OUT}/train/1"}})
    driver.apply(report("train", "completed", f"{OUT}/train/1/m.pkl"))
    gm.step("Train", "Completed")  # the forwarded one, taken in
    assert driver.job.step == "staged"
    del gm.conditions[-1]  # the GM's write-back from its older copy drops it again...
    gm.add("Train", "Completed")
    gm.conditions[-1] = JobCondition(stage="Train", type="Completed")
    gm.step("Eval", "Waiting")  # ...and moves on
    assert driver.job.step == "preparing" and driver.last_write().phase == "eval"
