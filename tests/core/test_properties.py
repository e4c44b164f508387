"""Hypothesis over random histories: no sample lost or duplicated, eval data is the last five
eval batches, versions strictly increase, and the state does not grow with samples or rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from service.core import samples
from service.core.effects import WriteRound
from service.core.events import JobApplied
from service.core.state import encode_state
from service.wire import Condition, Trigger
from tests.core.driver import JOB, NS, Driver, info, report, spec

ACTIONS = st.sampled_from(
    ["grow", "grow", "grow", "tick", "advance", "advance", "advance", "fail", "update", "pause"]
)


@dataclass
class Model:
    """What the test itself expects, computed independently of the core."""

    taken: int = 0
    eval_batches: list[tuple[int, int]] = field(default_factory=list)
    completed: list[tuple[int, int]] = field(default_factory=list)
    paused: bool = False


def _trigger(threshold: int) -> Trigger:
    return Trigger(condition=Condition(operator="ge", threshold=threshold, metric="num_of_samples"))


def _advance(d: Driver, ok: bool) -> None:
    """Play the effect executor and the workers one step, succeeding or failing."""
    job = d.job
    if job.step == "preparing":
        d.written(job.phase, None if ok else "disk full")
    elif job.step == "running":
        model = f"/output/{job.phase}/{job.version}/m.pkl"
        d.apply(report(job.phase, "completed", model) if ok else report(job.phase, "failed"))
    elif job.step == "copying":
        d.copied(None if ok else "copy failed")


def run_history(actions: list[tuple[str, int, float]]) -> None:
    d = Driver()
    prob = 0.7
    d.create(spec(train_prob=prob, trigger=_trigger(3)))
    model = Model()
    last_train_version = 0
    available = 0
    for action, amount, new_prob in actions:
        before = d.job
        if action == "grow":
            available += amount
            if not model.paused:
                split = samples.train_share(d.job.spec.train_prob, available - model.taken)
                model.eval_batches.append((model.taken + split, available))
                model.taken = available
            d.dataset(None if model.paused else available, info(present=not model.paused))
        elif action == "tick":
            d.now_ms += 60_000
            d.tick()
        elif action in ("advance", "fail"):
            _advance(d, ok=action == "advance")
        elif action == "update":
            prob = new_prob
            d.apply(
                JobApplied(
                    namespace=NS,
                    name=JOB,
                    spec=spec(train_prob=prob, trigger=_trigger(amount % 7 + 1)),
                    digest=f"{prob}-{amount}",
                )
            )
        elif action == "pause":
            model.paused = not model.paused
            d.dataset(None if model.paused else available, info(present=not model.paused))
            if not model.paused and available > model.taken:
                split = samples.train_share(d.job.spec.train_prob, available - model.taken)
                model.eval_batches.append((model.taken + split, available))
                model.taken = available
        job = d.job
        # a round's training completed: its samples are now in a completed round
        if (before.phase, before.step) == ("train", "running") and job.phase == "eval":
            model.completed.extend(before.round)
        # versions strictly increase with every train round fired
        for write in d.of(WriteRound):
            if write.phase == "train" and write.version > last_train_version:
                assert write.version == last_train_version + 1
                last_train_version = write.version
        assert job.version == last_train_version
        # every sample is in exactly one place
        train_side = (
            samples.indices(model.completed)
            + samples.indices(job.round)
            + samples.indices(job.pending)
        )
        eval_side = samples.indices(model.eval_batches)
        assert len(train_side) == len(set(train_side)), "a train sample is duplicated"
        assert sorted(train_side + eval_side) == list(range(model.taken)), "a sample was lost"
        assert job.taken == model.taken
        # eval data is exactly the last five eval batches
        assert list(job.eval_batches) == model.eval_batches[-5:]
        for write in d.of(WriteRound):
            if write.phase == "eval" and write.version == job.version:
                assert list(write.ranges) == model.eval_batches[-5:] or job.phase != "eval"
        d.effects.clear()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(ACTIONS, st.integers(1, 40), st.sampled_from([0.0, 0.29, 0.5, 0.8, 1.0])),
        max_size=60,
    )
)
def test_random_histories_keep_every_invariant(actions: list[tuple[str, int, float]]) -> None:
    run_history(actions)


def test_state_stays_small_after_10000_rounds_over_10_million_samples() -> None:
    d = Driver()
    d.create(spec(train_prob=0.8, trigger=Trigger()))
    for round_number in range(1, 10_001):
        d.dataset(round_number * 1_000)
        assert d.job.version == round_number
        d.complete_round()
        if round_number % 1000 == 0:
            d.effects.clear()
    assert d.job.taken == 10_000_000
    # now 20 batches pending (the trigger holds them back)
    high = JobApplied(
        namespace=NS, name=JOB, spec=spec(train_prob=0.8, trigger=_trigger(10**9)), digest="high"
    )
    d.apply(high)
    for extra in range(1, 21):
        d.dataset(10_000_000 + extra * 1_000)
    assert len(d.job.pending) == 20
    size = len(encode_state(d.job))
    assert size < 4096, size
