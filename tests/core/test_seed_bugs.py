"""One test per bug of Sedna's controller (docs/lifecycle.md, "Sedna's bugs this fixes") that lives
in the pure core.

Each would fail on the behaviour of Sedna's controller ("seed" below); the comment says what
it did.
"""

from __future__ import annotations

from service.core import samples
from service.core.effects import Context, Note, Publish, Reject, ScheduleCheck
from service.core.events import JobApplied, WorkerReported
from service.core.lifecycle import transition
from service.core.state import DatasetInfo
from service.wire import Condition, Timer, Trigger
from tests.core.driver import JOB, NS, Driver, content, info, report, spec


def started(train_prob: float = 0.8, trigger: Trigger | None = None, **kw: object) -> Driver:
    d = Driver(**kw)  # type: ignore[arg-type]
    d.create(
        spec(
            train_prob=train_prob,
            trigger=trigger
            or Trigger(condition=Condition(operator="ge", threshold=1000, metric="num_of_samples")),
        )
    )
    return d


def test_bug01_batch_takes_samples_from_p_not_p_plus_one() -> None:
    # seed: samples[P+1 : P+trainNum+1] skipped sample P of every batch
    d = started(train_prob=0.5)
    d.dataset(10)
    d.dataset(20)
    assert d.job.pending == ((0, 5), (10, 15))
    assert d.job.eval_batches == ((5, 10), (15, 20))
    assert samples.count(d.job.pending) + samples.count(d.job.eval_batches) == 20


def test_bug02_eval_samples_not_appended_again_on_every_poll() -> None:
    # seed: every poll re-appended every eval batch to EvalSamples
    d = started()
    d.dataset(10)
    before = d.job
    for _ in range(5):
        d.dataset(10)
    assert d.job == before
    assert d.job.eval_batches == ((8, 10),)


def test_bug03_samples_arriving_during_training_are_kept() -> None:
    # seed: TrainSamples = TrainSamples[:0] on completion wiped samples that arrived meanwhile
    d = started(trigger=Trigger())
    d.dataset(10)
    assert d.job.step == "preparing" and d.job.round == ((0, 8),)
    d.written("train")
    d.dataset(20)  # 8 new train samples while the worker trains
    d.apply(report("train", "completed", "/output/train/1/m.pkl"))
    assert d.job.pending == ((10, 18),)
    assert d.job.phase == "eval"


def test_bug04_failed_eval_returns_to_train() -> None:
    # seed: evalTask returned an error on a failed eval worker and the job stayed in eval forever
    d = started(trigger=Trigger())
    d.dataset(10)
    d.written("train")
    d.apply(report("train", "completed", "/output/train/1/m.pkl"))
    d.written("eval")
    d.apply(report("eval", "failed"))
    assert (d.job.phase, d.job.step) == ("train", "waiting")
    d.dataset(20)
    assert d.job.step == "waiting", "a failed round waits one check period before the next"
    d.now_ms += d.job.spec.trigger.check_period_seconds * 1000
    d.tick()
    assert d.job.step == "preparing" and d.job.version == 2


def test_bug05_failed_worker_without_results_moves_the_job() -> None:
    # seed: len(models) != 1 returned before recording the status: a failure with no
    # results never moved the job
    d = started(trigger=Trigger())
    d.dataset(10)
    d.written("train")
    d.apply(report("train", "failed"))
    assert (d.job.phase, d.job.step, d.job.pending) == ("train", "waiting", ((0, 8),))
    # the failed round's samples go back in front and the retry (v2), one check period
    # later, trains on them again
    d.now_ms += d.job.spec.trigger.check_period_seconds * 1000
    d.tick()
    assert d.job.version == 2 and d.job.round == ((0, 8),)


def test_bug05_two_models_tensorflow_do_not_stall() -> None:
    # seed: a worker reporting two models (pb and ckpt) hit len(models) != 1 and stalled
    d = started(trigger=Trigger())
    d.dataset(10)
    d.written("train")
    d.apply(report("train", "completed", "/output/train/1/model.pb", "/output/train/1/ckpt"))
    d.written("eval")
    eval_ready = d.published()[-1]
    assert [m["url"] for m in eval_ready["input"]["models"]] == [
        "/output/train/1/model.pb",
        "/output/train/1/ckpt",
    ]


def test_bug06_malformed_results_do_not_crash() -> None:
    # seed: result["format"].(string) panicked on a non-string
    d = started(trigger=Trigger())
    d.dataset(10)
    d.written("train")
    bad = [{"format": 3, "url": None}, "not an object", {"url": ["x"]}]
    d.apply(report("train", "completed", results=bad))  # type: ignore[arg-type]
    assert d.job.phase == "train"
    assert any("without a usable model" in n for n in d.notes())
    forwarded = [p for p in d.published() if "output" in p]
    assert forwarded[-1]["output"]["models"] == bad
    failed = [p for p in d.published() if p.get("status") == "failed"]
    reason = (
        "train worker job-a-train-pod completed without a usable model "
        "(3 results; each model needs a string url)"
    )
    assert failed == [{"phase": "train", "status": "failed", "reason": reason}]


def test_bug07_deploy_does_not_prefix_the_model_url_again() -> None:
    # seed: model.URL = AddPrefixPath(prefix, model.URL) mutated the stored model every deploy
    d = started(trigger=Trigger(), prefix="/rootfs")
    for n, v in ((10, 1), (20, 2)):
        d.dataset(n)
        d.written("train")
        d.apply(report("train", "completed", f"/output/train/{v}/m.pkl"))
        d.written("eval")
        d.apply(report("eval", "completed", f"/output/eval/{v}/m.pkl"))
        assert d.last_copy().src_url == f"/rootfs/output/eval/{v}/m.pkl"
        assert d.last_copy().dst_url == "/rootfs/output/deploy/index.pkl"
        d.copied()
        deploy = d.published()[-1]
        assert deploy["input"]["models"][0]["url"] == f"/output/eval/{v}/m.pkl"
    # a worker that reports the host path is not prefixed twice either
    d.dataset(30)
    d.written("train")
    d.apply(report("train", "completed", "/output/train/3/m.pkl"))
    d.written("eval")
    d.apply(report("eval", "completed", "/rootfs/output/eval/3/m.pkl"))
    assert d.last_copy().src_url == "/rootfs/output/eval/3/m.pkl"


def test_bug08_timer_window_is_checked_against_the_clock() -> None:
    # seed: the daily timer compared the window against an empty string and never matched
    trigger = Trigger(timer=Timer(start="02:00", end="04:00"))
    d = started(trigger=trigger, minute=12 * 60)
    d.dataset(10)
    assert d.job.step == "waiting"
    d.minute = 3 * 60
    d.tick()
    assert d.job.step == "preparing"


def test_bug09_check_period_is_honoured() -> None:
    # seed: checkPeriodSeconds was ignored (a fixed 10 s tick)
    d = started(
        trigger=Trigger(
            check_period_seconds=37,
            condition=Condition(operator="ge", threshold=100, metric="num_of_samples"),
        )
    )
    d.dataset(10)
    checks = d.of(ScheduleCheck)
    assert checks and checks[-1].due_ms == d.now_ms + 37_000


def test_bug10_deploy_copy_targets_the_whole_file() -> None:
    # seed: CopyFile wrote over the old model without truncating. The core names one whole
    # target per deploy (the blob adapter replaces it atomically: tests/integration/test_blobs)
    d = started(trigger=Trigger())
    d.dataset(10)
    d.complete_round()
    d.dataset(20)
    d.complete_round()
    targets = {c.dst_url for c in d.of(type(d.last_copy()))}
    assert targets == {"/output/deploy/index.pkl"}


def test_bug14_csv_format_is_case_insensitive() -> None:
    # seed: format == "csv" was compared case-sensitively, so "CSV" datasets lost their header
    d = started(trigger=Trigger())
    d.dataset(10, DatasetInfo(url="/data/d.csv", format="CSV"))
    assert d.last_write().format == "csv"
    assert d.last_write().data_url == "/output/data/train/1/data.csv"


def test_bug15_unset_condition_trains_on_the_first_sample() -> None:
    # seed: an empty operator made the condition false forever
    d = started(trigger=Trigger(condition=Condition(operator="", threshold=0, metric="")))
    d.dataset(2)  # floor(0.8 * 2) = 1 train sample
    assert d.job.step == "preparing" and d.job.round == ((0, 1),)


def test_bug17_train_prob_one_does_not_crash() -> None:
    # seed: samples[P+trainNum+1:] ran past the end with trainProb 1.0
    d = started(train_prob=1.0, trigger=Trigger())
    d.dataset(10)
    assert d.job.round == ((0, 10),)
    d.written("train")
    d.apply(report("train", "completed", "/output/train/1/m.pkl"))
    assert d.last_write().phase == "eval" and samples.count(d.last_write().ranges) == 0


def test_bug18_report_for_unknown_job_is_rejected() -> None:
    # seed: monitorWorker `continue`d silently (and HTTP answered 200)
    outcome = transition(
        None,
        report("train", "completed", "/m.pkl"),
        Context(now_ms=0, minute_of_day=0, event_id="e"),
    )
    assert outcome.state is None
    assert [type(e) for e in outcome.effects] == [Reject]
    assert f"{NS}/{JOB}" in outcome.effects[0].reason  # type: ignore[union-attr]


# ---------------------------------------------------------------- more contract rules
def test_identical_resend_changes_nothing() -> None:
    d = started()
    d.dataset(10)
    before = d.job
    effects = d.apply(JobApplied(namespace=NS, name=JOB, spec=before.spec, digest=before.digest))
    assert effects == () and d.job == before


def test_dataset_name_cannot_change() -> None:
    d = started()
    effects = d.apply(JobApplied(namespace=NS, name=JOB, spec=spec(dataset="other"), digest="x"))
    assert any(isinstance(e, Reject) for e in effects)
    assert d.job.spec.dataset == "ds"


def test_shrink_changes_nothing_until_growth_past_p_and_is_logged_once() -> None:
    d = started()
    d.dataset(10)
    before = d.job
    d.dataset(4)
    d.dataset(3)
    assert sum("shrank" in n for n in d.notes()) == 1
    assert d.job.pending == before.pending and d.job.taken == 10
    d.dataset(15)
    assert d.job.pending == ((0, 8), (10, 14)) and d.job.taken == 15


def test_deleted_dataset_pauses_and_resumes() -> None:
    d = started(
        trigger=Trigger(condition=Condition(operator="ge", threshold=10, metric="num_of_samples"))
    )
    d.dataset(8)  # 6 pending, below the threshold
    d.dataset(None, info(present=False))
    paused = d.job
    d.effects.clear()
    d.tick()
    assert d.job.step == "waiting" and d.job.version == 0 and d.job.pending == paused.pending
    assert not d.of(ScheduleCheck), "a paused job keeps no timer"
    d.dataset(20, info())  # back: 6 + floor(0.8 * 12) = 15 pending
    assert d.job.step == "preparing" and d.job.version == 1
    assert samples.count(d.job.round) == 15


def test_round_paths_and_ready_messages() -> None:
    d = started(trigger=Trigger(), prefix="/rootfs")
    d.dataset(10, DatasetInfo(url="s3://bucket/data/train.txt", format="txt"))
    write = d.last_write()
    assert write.source_url == "s3://bucket/data/train.txt"
    assert write.data_url == "/rootfs/output/data/train/1/data.txt"
    assert write.index_url == "/rootfs/output/data/train/1/dataIndex.txt"
    assert write.index_prefix == "s3://bucket/data/"
    d.written("train")
    assert d.published()[-1] == {
        "phase": "train",
        "status": "ready",
        "input": {
            "dataURL": "/output/data/train/1/data.txt",
            "dataIndexURL": "/output/data/train/1/dataIndex.txt",
            "outputDir": "/output/train/1",
        },
    }
    d.apply(report("train", "completed", "/output/train/1/m.pkl"))
    d.written("eval")
    assert d.published()[-1]["input"] == {
        "models": [{"format": "pkl", "url": "/output/train/1/m.pkl"}],
        "dataURL": "/output/data/eval/1/data.txt",
        "dataIndexURL": "/output/data/eval/1/dataIndex.txt",
        "outputDir": "/output/eval/1",
    }


def test_worker_messages_are_forwarded_with_owner_info() -> None:
    d = started(trigger=Trigger())
    d.dataset(10)
    d.written("train")
    msg = WorkerReported(
        namespace=NS,
        name=JOB,
        worker=f"{JOB}-train-x7k2p",
        kind="train",
        status="running",
        owner_info=b'{"a":1}',
    )
    effects = d.apply(msg)
    assert [content(e) for e in effects if isinstance(e, Publish)] == [
        {"phase": "train", "status": "running", "output": {"models": [], "ownerInfo": {"a": 1}}}
    ]
    assert not any(isinstance(e, Note) for e in effects)


def test_publish_ids_are_unique_and_stable() -> None:
    d = started(trigger=Trigger())
    d.dataset(10)
    d.complete_round()
    ids = [e.id for e in d.of(Publish)]
    assert len(ids) == len(set(ids))
    replay = started(trigger=Trigger())
    replay.dataset(10)
    replay.complete_round()
    assert [e.id for e in replay.of(Publish)] == ids
