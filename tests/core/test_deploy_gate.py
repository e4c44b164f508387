"""The deploy gate in the lifecycle: what eval is told, what a held-back round does (and
never does: touch the deploy file), the round records, and that samples are never lost."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core import samples
from service.core.effects import CopyModel, Publish, RecordRound, ScheduleCheck
from service.core.events import WorkerReported
from service.core.rounds import RoundRecord
from service.wire import Condition, Trigger
from tests.core.driver import JOB, NS, Driver, content, report, spec

GATE = Condition(operator=">", threshold=0.01, metric="accuracy_delta[0]")
OUT = "/output"


def model(version: int) -> str:
    return f"{OUT}/train/{version}/model.json"


def gated(gate: Condition | None = GATE, check_period_s: int = 60) -> Driver:
    d = Driver()
    d.create(
        msgspec.structs.replace(
            spec(trigger=Trigger(check_period_seconds=check_period_s)), gate=gate
        )
    )
    return d


def results(*accuracies: float | None) -> list[dict[str, Any]]:
    """An eval report's results: the new model first, then the deployed one."""
    out = []
    for i, accuracy in enumerate(accuracies):
        metrics = {} if accuracy is None else {"accuracy": [accuracy]}
        url = "/output/eval/{v}/m.json" if i == 0 else f"{OUT}/deploy/index.pkl"
        out.append({"format": "json", "url": url, "metrics": metrics})
    return out


def eval_report(d: Driver, rs: list[dict[str, Any]]) -> WorkerReported:
    """The report, its "{v}" in urls the round's version (a model lies in its round's dir)."""
    version = str(d.job.version)
    placed = [{**r, "url": r["url"].replace("{v}", version)} if "url" in r else r for r in rs]
    return report("eval", "completed", results=placed)


def to_eval(d: Driver, taken: int) -> None:
    """Grow the dataset to `taken` samples, fire, train, and reach eval/running."""
    d.dataset(taken)
    assert (d.job.phase, d.job.step) == ("train", "preparing"), d.notes()[-3:]
    d.written("train")
    d.apply(report("train", "completed", model(d.job.version)))
    d.written("eval")
    assert (d.job.phase, d.job.step) == ("eval", "running")


def eval_input(d: Driver) -> dict[str, Any]:
    ready = [c for c in d.published() if c["phase"] == "eval" and c["status"] == "ready"]
    return ready[-1]["input"]  # type: ignore[no-any-return]


def deploy_statuses(d: Driver) -> list[dict[str, Any]]:
    """The controller's deploy statuses (no deploy worker reports in these tests)."""
    return [c for c in d.published() if c["phase"] == "deploy"]


def records(d: Driver) -> list[RoundRecord]:
    return [e.record for e in d.of(RecordRound)]


def deploy_round(d: Driver, taken: int, *accuracies: float | None) -> None:
    to_eval(d, taken)
    d.apply(eval_report(d, results(*accuracies)))
    assert d.job.step == "copying"
    d.copied()


def test_the_first_round_deploys_with_nothing_to_beat() -> None:
    d = gated()
    to_eval(d, 10)
    given_input = eval_input(d)
    assert "deployedModel" not in given_input
    assert given_input["models"] == [{"format": "pkl", "url": model(1)}]
    d.apply(eval_report(d, results(0.7)))
    copy = d.last_copy()
    assert (copy.src_url, copy.dst_url) == ("/output/eval/1/m.json", "/output/deploy/index.pkl")
    d.copied()
    ready = deploy_statuses(d)[-1]
    assert ready["status"] == "ready"
    assert ready["gate"] == {
        "metric": "accuracy_delta[0]", "operator": ">", "threshold": 0.01, "holds": True,
        "version": 1,
    }  # fmt: skip
    assert d.job.deployed is not None and d.job.deployed.version == 1
    assert d.job.deployed.metrics == {"accuracy": (0.7,)}
    [record] = records(d)
    assert record.outcome == "deployed" and record.version == 1
    assert record.reason is not None and "nothing deployed to compare with" in record.reason


def test_eval_gets_the_deployed_model_last_and_by_name() -> None:
    d = gated()
    deploy_round(d, 10, 0.7)
    to_eval(d, 20)
    given_input = eval_input(d)
    deployed = {"format": "json", "url": "/output/eval/1/m.json"}
    assert given_input["models"] == [{"format": "pkl", "url": model(2)}, deployed]
    assert given_input["deployedModel"] == deployed
    assert d.job.current is not None and d.job.current.deployed_version == 1


def test_a_worse_model_is_held_back_the_deploy_file_untouched_the_samples_kept() -> None:
    d = gated(check_period_s=30)
    deploy_round(d, 10, 0.8)
    d.state = msgspec.structs.replace(d.job, consecutive_failures=2)
    to_eval(d, 20)
    trained = d.job.trained
    assert samples.count(trained) == 8
    d.effects.clear()
    d.apply(eval_report(d, results(0.75, 0.8)))
    assert not d.of(CopyModel), "a held-back model is never copied"
    assert (d.job.phase, d.job.step) == ("train", "waiting")
    held = deploy_statuses(d)[-1]
    assert held["status"] == "completed"
    assert held["reason"].startswith("held back by the deploy gate: accuracy_delta[0] = -0.05")
    assert held["gate"]["holds"] is False and held["gate"]["value"] < 0
    assert held["gate"]["deployedVersion"] == 1
    assert [m["metrics"] for m in held["output"]["models"]] == [
        {"accuracy": [0.75]}, {"accuracy": [0.8]}
    ]
    assert d.job.pending == trained and d.job.returned == 8
    assert d.job.trained == ()
    assert d.job.deployed is not None and d.job.deployed.version == 1
    # not a failure: the count resets, no backoff; the trigger is checked as after a deploy
    assert (d.job.consecutive_failures, d.job.last_error, d.job.retry_at_ms) == (0, None, None)
    assert ScheduleCheck(due_ms=d.now_ms + 30_000) in d.effects
    record = records(d)[-1]
    assert (record.version, record.outcome) == (2, "held_back")
    assert record.candidate == {"accuracy": (0.75,)} and record.deployed == {"accuracy": (0.8,)}
    assert record.deployed_version == 1 and record.gate is not None
    # the returned samples alone do not fire a round: the same data would give the same model
    d.now_ms += 30_000
    d.tick()
    assert (d.job.step, d.job.version) == ("waiting", 2)
    # the next round trains on them and on what arrived since
    d.dataset(25)
    assert d.job.version == 3 and d.job.round == samples.concat(trained, ((20, 24),))
    assert d.job.returned == 0


def test_samples_arriving_during_a_held_back_round_start_the_next_at_once() -> None:
    d = gated()
    deploy_round(d, 10, 0.8)
    to_eval(d, 20)
    trained = d.job.trained
    d.dataset(25)  # arrived while round 2 was evaluated: they wait behind its samples
    later = d.job.pending
    d.apply(eval_report(d, results(0.7, 0.8)))
    assert (d.job.version, d.job.step) == (3, "preparing")
    assert d.job.round == samples.concat(trained, later)


def test_a_better_model_then_deploys_and_the_previous_is_kept_for_rollback() -> None:
    d = gated(check_period_s=1)
    deploy_round(d, 10, 0.8)
    to_eval(d, 20)
    d.apply(eval_report(d, results(0.7, 0.8)))
    d.dataset(30)  # new samples: round 3
    d.written("train")
    d.apply(report("train", "completed", model(3)))
    d.written("eval")
    d.apply(eval_report(d, results(0.9, 0.8)))
    assert d.job.step == "copying"
    d.copied()
    assert d.job.deployed is not None and d.job.deployed.version == 3
    assert [dep.version for dep in d.job.deployments] == [1]
    assert [(r.version, r.outcome) for r in records(d)] == [
        (1, "deployed"), (2, "held_back"), (3, "deployed")
    ]


def test_a_report_with_one_result_is_judged_as_if_nothing_were_deployed() -> None:
    d = gated()
    deploy_round(d, 10, 0.8)
    to_eval(d, 20)
    d.apply(eval_report(d, results(0.1)))  # no second result: nothing to beat
    assert d.job.step == "copying"
    assert d.job.current is not None and d.job.current.reason is not None
    assert "only the new model's result" in d.job.current.reason
    # a condition on the metric itself is judged as usual
    d = gated(Condition(operator=">=", threshold=0.5, metric="accuracy[0]"))
    deploy_round(d, 10, 0.8)
    to_eval(d, 20)
    d.apply(eval_report(d, results(0.1)))
    assert not d.of(CopyModel)[1:], "round 2 was not copied"


def test_a_report_missing_the_metric_holds_back_even_the_first_round() -> None:
    d = gated()
    to_eval(d, 10)
    d.apply(eval_report(d, results(None)))
    assert not d.of(CopyModel)
    assert "has no metric accuracy_delta" in deploy_statuses(d)[-1]["reason"]


def test_without_a_condition_nothing_changes() -> None:
    d = gated(gate=None)
    deploy_round(d, 10, 0.9)
    to_eval(d, 20)
    assert "deployedModel" not in eval_input(d)
    assert len(eval_input(d)["models"]) == 1
    d.apply(eval_report(d, results(0.1, 0.9)))  # much worse: deployed all the same
    assert d.job.step == "copying"
    d.copied()
    assert all("gate" not in status for status in deploy_statuses(d))


def test_a_gated_eval_whose_first_result_is_not_a_model_fails_the_round() -> None:
    d = gated()
    to_eval(d, 10)
    d.apply(eval_report(d, [{"metrics": {"accuracy": [0.9]}}, *results(0.5)]))
    assert not d.of(CopyModel)
    assert d.job.consecutive_failures == 1


# ------------------------------------------------------------------ property
@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0.5, 0.7, 0.9, float("nan"), None]),
            st.sampled_from([0.5, 0.7, 0.9, float("inf"), None, "absent"]),
            st.booleans(),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_rounds_with_any_reports_copy_only_what_the_gate_passed(
    rounds: list[tuple[float | None, float | str | None, bool]],
) -> None:
    d = gated(check_period_s=1)
    taken = 0
    deployed: int | None = None
    for new, old, copy_ok in rounds:
        taken += 10
        d.now_ms += 3_600_000  # past any backoff
        d.effects.clear()
        to_eval(d, taken)
        pending_before = samples.count(d.job.pending) + samples.count(d.job.trained)
        rs = results(new) if old == "absent" else results(new, old)  # type: ignore[arg-type]
        d.apply(eval_report(d, rs))
        copies = d.of(CopyModel)
        status = deploy_statuses(d)
        if not copies:
            # held back: no copy, told so, samples back in front, nothing deployed changes
            assert status[-1]["status"] == "completed" and not status[-1]["gate"]["holds"]
            assert samples.count(d.job.pending) == pending_before
            assert (d.job.deployed.version if d.job.deployed else None) == deployed
            assert records(d)[-1].outcome == "held_back"
            continue
        assert [c.rollback for c in copies] == [False]
        d.copied(error=None if copy_ok else "disk full")
        if copy_ok:
            deployed = d.job.version
            assert deploy_statuses(d)[-1]["gate"]["holds"] is True
        assert (d.job.deployed.version if d.job.deployed else None) == deployed
        assert records(d)[-1].outcome == ("deployed" if copy_ok else "failed")
    assert [r.version for r in records(d)] == list(range(1, len(rounds) + 1))[-len(records(d)):]


def test_every_round_has_a_record_with_its_times_and_counts() -> None:
    d = gated(check_period_s=1)
    d.dataset(10)
    started = d.now_ms
    d.now_ms += 100
    d.written("train")
    d.now_ms += 100
    d.apply(report("train", "completed", model(1)))
    d.now_ms += 100
    d.written("eval")
    d.now_ms += 100
    d.apply(eval_report(d, results(0.8)))
    d.now_ms += 100
    d.copied()
    [record] = records(d)
    assert record == RoundRecord(
        version=1, outcome="deployed", train_started_ms=started, eval_started_ms=started + 200,
        deploy_started_ms=started + 400, ended_ms=started + 500, train_samples=8,
        eval_samples=2, candidate={"accuracy": (0.8,)}, gate=record.gate, reason=record.reason,
    )  # fmt: skip
    # a round failing in train has a record too, with the failure
    d.dataset(20)
    d.written("train", error="disk full")
    failed = records(d)[-1]
    assert (failed.version, failed.outcome, failed.reason) == (2, "failed", "disk full")
    assert failed.eval_started_ms is None and failed.train_samples == 8
    assert d.job.current is None


def _publishes(d: Driver) -> list[Publish]:
    return d.of(Publish)


def test_the_upstream_of_a_held_back_round_is_one_deploy_completed() -> None:
    d = gated()
    deploy_round(d, 10, 0.8)
    to_eval(d, 20)
    d.effects.clear()
    d.apply(eval_report(d, results(0.8, 0.8)))
    statuses = [content(p) for p in _publishes(d)]
    assert [(s["phase"], s["status"]) for s in statuses] == [
        ("eval", "completed"), ("deploy", "completed")
    ]
    assert statuses[1]["gate"]["value"] == 0.0
    assert JOB and NS  # the driver's job


GATED_ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["grow", "grow", "advance", "advance", "advance", "fail", "tick"]),
        st.integers(1, 30),
        st.sampled_from([0.5, 0.7, 0.9]),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(GATED_ACTIONS)
def test_with_a_gate_no_train_sample_is_lost_or_duplicated(
    actions: list[tuple[str, int, float]],
) -> None:
    """Every train sample is in exactly one place: consumed by a round that ended (deployed,
    or failed after training), in the round training, trained awaiting the deploy decision,
    or pending; a held-back round gives its samples back."""
    d = gated(check_period_s=1)
    available, consumed, all_train = 0, [], []
    for action, amount, accuracy in actions:
        before = d.job
        d.effects.clear()
        d.now_ms += 3_600_000  # past any backoff
        if action == "grow":
            available += amount
            train, _eval = samples.split_batch(before.taken, available, before.spec.train_prob)
            all_train += range(*train)
            d.dataset(available)
        elif action == "tick":
            d.tick()
        elif before.step == "preparing":
            d.written(before.phase, None if action == "advance" else "disk full")
        elif before.step == "running" and before.phase == "eval" and action == "advance":
            d.apply(eval_report(d, results(accuracy, 0.7)))
        elif before.step == "running":
            url = f"/output/train/{before.version}/m.pkl"
            d.apply(report(before.phase, "completed", url) if action == "advance"
                    else report(before.phase, "failed"))  # fmt: skip
        elif before.step == "copying":
            d.copied(None if action == "advance" else "copy failed")
        if any(r.outcome in ("deployed", "failed") for r in records(d)):
            consumed += samples.indices(before.trained)
        job = d.job
        train_side = (
            consumed + samples.indices(job.round) + samples.indices(job.trained)
            + samples.indices(job.pending)
        )  # fmt: skip
        assert len(train_side) == len(set(train_side)), "a train sample is duplicated"
        assert sorted(train_side) == all_train, "a train sample was lost"
        assert 0 <= job.returned <= samples.count(job.pending)
        if job.phase == "deploy":
            assert job.step == "copying"
