"""Every (phase, step, event) pair: the resulting state and effects.

A pair outside the lifecycle table leaves the state unchanged and yields a reason (a Note),
except progress reports (forwarded only), timer ticks (quietly dropped outside
train/waiting) and train or eval reports while the job does not run that stage (refused,
not forwarded). Every job here has already failed twice in a row: a pair that fails the
round makes it three and waits four check periods, a completed deploy resets the count, and
every other pair leaves it alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.core import events, training
from service.core.effects import (
    Context,
    CopyModel,
    Note,
    Publish,
    Reject,
    ScheduleCheck,
    WriteRound,
)
from service.core.events import Event, JobApplied, ModelCopied, RoundWritten, Tick, WorkerReported
from service.core.lifecycle import (
    JOB_TABLE,
    UndeclaredMove,
    event_key,
    job_table,
    transition,
    where,
)
from service.core.state import GmView, JobState
from service.core.training import retry_delay_ms
from service.wire import Condition, Trigger
from tests.core.driver import DATASET, INCREMENTAL, JOB, NS, Driver, content, info, report, spec

replace = msgspec.structs.replace

SUBSTATES = [
    ("train", "waiting"),
    ("train", "preparing"),
    ("train", "running"),
    ("eval", "preparing"),
    ("eval", "running"),
    ("deploy", "copying"),
]


def reach(phase: str, step: str, incremental: bool = False) -> Driver:
    """A job in the given sub-state at round 1, with 8 pending samples not yet enough to fire
    (`incremental`: an incremental-learning job)."""
    d = Driver()
    d.create(
        spec(
            trigger=Trigger(
                condition=Condition(operator="ge", threshold=10, metric="num_of_samples")
            ),
            incremental=INCREMENTAL if incremental else None,
        )
    )
    d.dataset(10)  # 8 train samples pending, condition (>= 10) not met
    if (phase, step) == ("train", "waiting"):
        return d
    d.apply(_update_threshold(d, 1))  # applies from the next evaluation: the next check
    d.tick()
    assert d.job.step == "preparing"
    d.apply(_update_threshold(d, 10))  # so a failure below lands in train/waiting
    walk = [
        lambda: d.written("train"),
        lambda: d.apply(owned(d, report("train", "completed", "/output/train/1/m.pkl"))),
        lambda: d.written("eval"),
        lambda: d.apply(owned(d, report("eval", "completed", "/output/eval/1/m.pkl"))),
    ]
    for step_fn in walk:
        if (d.job.phase, d.job.step) == (phase, step):
            break
        step_fn()
    assert (d.job.phase, d.job.step) == (phase, step)
    d.effects.clear()
    return d


def _update_threshold(d: Driver, threshold: float) -> Event:
    trigger = Trigger(
        condition=Condition(operator="ge", threshold=threshold, metric="num_of_samples")
    )
    job_spec = replace(d.job.spec, trigger=trigger)
    return JobApplied(namespace=NS, name=JOB, spec=job_spec, digest=f"t{threshold}")


def _version(d: Driver) -> int:
    return d.job.version


EVENTS: dict[str, Callable[[Driver], Event]] = {
    "tick": lambda d: Tick(kind="job", namespace=NS, name=JOB, due_ms=d.now_ms),
    "train-written": lambda d: RoundWritten(
        namespace=NS, name=JOB, phase="train", version=_version(d)
    ),
    "train-write-failed": lambda d: RoundWritten(
        namespace=NS, name=JOB, phase="train", version=_version(d), error="disk full"
    ),
    "eval-written": lambda d: RoundWritten(
        namespace=NS, name=JOB, phase="eval", version=_version(d)
    ),
    "eval-write-failed": lambda d: RoundWritten(
        namespace=NS, name=JOB, phase="eval", version=_version(d), error="disk full"
    ),
    "model-copied": lambda d: ModelCopied(namespace=NS, name=JOB, version=_version(d)),
    "copy-failed": lambda d: ModelCopied(
        namespace=NS, name=JOB, version=_version(d), error="no such file"
    ),
    "train/completed": lambda d: report("train", "completed", f"/output/train/{_version(d)}/m.pkl"),
    "train/completed-no-model": lambda d: report("train", "completed", results=[{"x": 1}]),
    "train/failed": lambda d: report("train", "failed"),
    "train/running": lambda d: report("train", "running"),
    "eval/completed": lambda d: report("eval", "completed", f"/output/eval/{_version(d)}/m.pkl"),
    "eval/completed-no-model": lambda d: report("eval", "completed"),
    "eval/failed": lambda d: report("eval", "failed"),
    "eval/ready": lambda d: report("eval", "ready"),
    "deploy/completed": lambda d: report("deploy", "completed", "/m.pkl"),
    "inference/running": lambda d: report("inference", "running"),
}

W, TP, TR = ("train", "waiting"), ("train", "preparing"), ("train", "running")
EP, ER, DC = ("eval", "preparing"), ("eval", "running"), ("deploy", "copying")


class Move(NamedTuple):
    after: tuple[str, str]
    #: the effect types it must produce (besides worker forwards and notes)
    effects: set[type]
    #: it fails the round: counts a failure and backs off
    fails: bool = False


#: (sub-state, event) -> the move it makes. Pairs not listed leave the state unchanged.
MOVES: dict[tuple[tuple[str, str], str], Move] = {
    (W, "tick"): Move(W, {ScheduleCheck}),
    (TP, "train-written"): Move(TR, {Publish}),
    (TP, "train-write-failed"): Move(W, {Publish, ScheduleCheck}, fails=True),
    (TR, "train/completed"): Move(EP, {WriteRound}),
    (TR, "train/completed-no-model"): Move(W, {Publish, ScheduleCheck}, fails=True),
    (TR, "train/failed"): Move(W, {ScheduleCheck}, fails=True),
    (EP, "eval-written"): Move(ER, {Publish}),
    (EP, "eval-write-failed"): Move(W, {Publish, ScheduleCheck}, fails=True),
    (ER, "eval/completed"): Move(DC, {CopyModel}),
    (ER, "eval/completed-no-model"): Move(W, {Publish, ScheduleCheck}, fails=True),
    (ER, "eval/failed"): Move(W, {ScheduleCheck}, fails=True),
    (DC, "model-copied"): Move(W, {Publish}),
    (DC, "copy-failed"): Move(W, {Publish, ScheduleCheck}, fails=True),
}
EARLIER_FAILURES = 2


def test_the_examples_are_moves_the_table_declares() -> None:
    for (substate, event_name), move in MOVES.items():
        event = EVENTS[event_name](reach(*substate))
        assert JOB_TABLE.allows("/".join(substate), event_key(event), "/".join(move.after))


#: Events any job may be sent besides `EVENTS`: inserts (from the cloud, or copies from
#: Sedna's GM showing any condition), deletes, dataset changes and rollbacks.
GM_STAGES = st.sampled_from(["train", "eval", "deploy"])
GM_TYPES = st.sampled_from(
    ["", "waiting", "ready", "starting", "running", "completed", "failed"]
)


def _any_state_event(draw: st.DrawFn, d: Driver) -> Event:
    kind = draw(st.sampled_from(["gm", "applied", "deleted", "dataset", "rollback", "rb-copied"]))
    if kind == "gm":
        reported = draw(st.integers(0, 8))
        gm = GmView(stage=draw(GM_STAGES), type=draw(GM_TYPES), count=reported, reported=reported)
        return JobApplied(namespace=NS, name=JOB, spec=d.job.spec, digest=d.job.digest, gm=gm)
    if kind == "applied":
        return _update_threshold(d, draw(st.sampled_from([1, 10])))
    if kind == "deleted":
        return events.JobDeleted(namespace=NS, name=JOB)
    if kind == "dataset":
        return events.DatasetChanged(
            namespace=NS, name=JOB, dataset=DATASET, info=info(present=draw(st.booleans())),
            num_samples=draw(st.integers(0, 40)),
        )  # fmt: skip
    if kind == "rollback":
        return events.RollbackRequested(namespace=NS, name=JOB)
    version = draw(st.integers(0, 2))
    return ModelCopied(
        namespace=NS, name=JOB, version=version, rollback=True,
        error=draw(st.sampled_from([None, "gone"])),
    )  # fmt: skip


def owned(d: Driver, event: Event) -> Event:
    """A worker report as the job's own kind's workers send it."""
    if isinstance(event, WorkerReported):
        return replace(event, owner=d.job.spec.kind)
    return event


@st.composite
def _situations(draw: st.DrawFn) -> tuple[Driver, list[Event]]:
    """A job of either kind in any sub-state the examples reach, and a few events of any
    kind for it."""
    d = reach(*draw(st.sampled_from(SUBSTATES)), incremental=draw(st.booleans()))
    events: list[Event] = []
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            events.append(_any_state_event(draw, d))
        else:
            events.append(owned(d, EVENTS[draw(st.sampled_from(list(EVENTS)))](d)))
    return d, events


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_situations(), st.integers(0, 120_000))
def test_every_move_is_one_the_table_declares(
    situation: tuple[Driver, list[Event]], step_ms: int
) -> None:
    """Whatever the state and the event, the handlers move a job only where the table says
    (the driver's strict context raises `UndeclaredMove` on any other move)."""
    d, events = situation
    for event in events:
        before, table = where(d.state), job_table(d.state, event)
        d.now_ms += step_ms
        d.apply(event)
        assert table.allows(before, event_key(event), where(d.state))


def test_an_undeclared_move_raises_in_tests_and_is_refused_in_production(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d = reach("train", "running")
    before = d.job
    monkeypatch.setattr(training, "worker_failed", lambda job, *_: replace(job, step="copying"))
    failed = report("train", "failed")
    with pytest.raises(UndeclaredMove, match="train/running to train/copying"):
        d.apply(failed)
    outcome = transition(before, failed, Context(now_ms=0, minute_of_day=0, event_id="e"))
    assert outcome.state == before
    assert outcome.verdict == "rejected"
    assert [e.code for e in outcome.effects if isinstance(e, Reject)] == ["undeclared_move"]
    assert len(outcome.effects) == 1, "the refused move's effects are dropped"


@pytest.mark.parametrize("substate", SUBSTATES, ids="/".join)
@pytest.mark.parametrize("event_name", list(EVENTS))
def test_every_phase_step_event_pair(substate: tuple[str, str], event_name: str) -> None:
    d = reach(*substate)
    d.state = msgspec.structs.replace(d.job, consecutive_failures=EARLIER_FAILURES)
    before = d.job
    d.now_ms += 1000  # so a phase-entry time stamped now differs from the one before
    event = EVENTS[event_name](d)
    effects = d.apply(event)
    after = d.state
    assert isinstance(after, JobState)
    move = MOVES.get((substate, event_name))
    is_report = event_name.count("/") == 1
    forwards = [e for e in effects if isinstance(e, Publish) and "output" in content(e)]
    stage = event_name.split("/", maxsplit=1)[0]
    if is_report and stage in ("train", "eval") and substate != (stage, "running"):
        assert after == before, "a report of a stage the job does not run changes nothing"
        assert [e.code for e in effects if isinstance(e, Reject)] == ["not_running"]
        assert [e for e in effects if not isinstance(e, Reject)] == [], "nor is forwarded"
        return
    if is_report:
        assert len(forwards) == 1, "every worker message for a known job is forwarded"
        assert content(forwards[0])["phase"] == event_name.split("/", maxsplit=1)[0]
    if move is None:
        # illegal or informational: state unchanged (a tick only forgets its timer)
        assert msgspec.structs.replace(after, next_check_ms=before.next_check_ms) == before
        if event_name.endswith(("/running", "/ready")) or event_name.startswith(
            ("deploy/", "inference/")
        ):
            assert [e for e in effects if not isinstance(e, Publish)] == []
        elif event_name != "tick":
            assert any(isinstance(e, Note) for e in effects), "an ignored event yields a reason"
        return
    assert (after.phase, after.step) == move.after
    moved = move.after != substate
    assert after.phase_since_ms == (d.now_ms if moved else before.phase_since_ms)
    got = {type(e) for e in effects if e not in forwards}
    assert move.effects <= got, f"missing {move.effects - got}"
    _assert_backoff(d, (substate, event_name), before, after, effects)


def _assert_backoff(
    d: Driver,
    pair: tuple[tuple[str, str], str],
    before: JobState,
    after: JobState,
    effects: tuple[object, ...],
) -> None:
    if MOVES[pair].fails:
        failures = EARLIER_FAILURES + 1
        due_ms = d.now_ms + retry_delay_ms(after.spec.trigger.check_period_seconds, failures)
        assert after.consecutive_failures == failures
        assert after.retry_at_ms == due_ms == after.next_check_ms
        assert ScheduleCheck(due_ms=due_ms) in effects
        assert after.last_error
        assert after.step == "waiting", "nothing starts before the backoff is over"
    elif pair == (DC, "model-copied"):
        assert (after.consecutive_failures, after.retry_at_ms) == (0, None)
        assert after.last_error is None
    else:
        assert after.consecutive_failures == before.consecutive_failures


def test_a_new_job_enters_its_phase_when_created() -> None:
    d = Driver()
    d.create()
    assert d.job.phase_since_ms == d.now_ms
    d.now_ms += 5000
    d.create(spec(train_prob=0.5), digest="d2")  # a changed spec keeps the phase and step
    assert d.job.phase_since_ms == d.now_ms - 5000
