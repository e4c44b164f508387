"""The effect runner's two ways for a result: handed to the processor in process (applied
by the commit that retires the intent) or, when that is not this replica's to do now,
through the ingress stream in the script that retires the intent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, cast

import pytest

from service.core.effects import PollDataset
from service.core.events import DatasetPolled, Event
from service.heartbeat import Heartbeats, SystemClock
from service.keys import dataset_key, shard_of
from service.metrics import Metrics
from service.runtime.executor import EffectRunner
from service.runtime.handoff import Handoff, LocalResult
from tests.wait import wait_until

SHARD = shard_of(dataset_key("ns", "ds"))  # the shard of the effect's own resource
WORK = PollDataset(id="s3-1-0/0", namespace="ns", name="ds", url="/data/ds.txt", format="txt")
RESULT = DatasetPolled(namespace="ns", name="ds", url="/data/ds.txt", num_samples=2)


class FakeExecutor:
    def __init__(self) -> None:
        self.runs = 0

    def run(self, work: Any, now_ms: int) -> Event | None:
        self.runs += 1
        return RESULT


class FakeOutboxes:
    def __init__(self) -> None:
        self.completed: list[tuple[int, str, str, bytes | None]] = []

    def complete_effect(self, shard: int, token: str, effect_id: str, data: bytes | None) -> bool:
        self.completed.append((shard, token, effect_id, data))
        return True


class FakeLeases:
    """The shard's lease token, and how often the runner asked for it (it asks once a run
    is done, to choose the result's way)."""

    def __init__(self, token: str | None) -> None:
        self.current = token
        self.asked = 0

    def token(self, shard: int) -> str | None:
        self.asked += 1
        return self.current


class Runner(EffectRunner):
    """The runner with the processor's side of its hand-off."""

    def __init__(self, handoff: Handoff, **parts: Any) -> None:
        super().__init__(handoff=handoff, **parts)
        self.handoff = handoff

    def take_results(self) -> list[LocalResult]:
        results, messages = self.handoff.take()
        assert messages == []
        return results

    def wait_results(self, timeout_s: float) -> bool:
        return self.handoff.wait(timeout_s)


@pytest.fixture
def parts() -> Iterator[tuple[Runner, FakeExecutor, FakeOutboxes, FakeLeases]]:
    executor, outboxes, leases = FakeExecutor(), FakeOutboxes(), FakeLeases("r1:7")
    clock = SystemClock()
    runner = Runner(
        Handoff(),
        executor=cast(Any, executor), outboxes=cast(Any, outboxes), leases=cast(Any, leases),
        clock=clock, metrics=Metrics(), rejections=cast(Any, None),
        stop=threading.Event(), heartbeats=Heartbeats(clock.monotonic_s, 10.0),
    )  # fmt: skip
    yield runner, executor, outboxes, leases
    runner.shutdown()


def test_a_result_under_the_intents_token_is_handed_over_and_runs_once_until_settled(
    parts: tuple[Runner, FakeExecutor, FakeOutboxes, FakeLeases],
) -> None:
    runner, executor, outboxes, _ = parts
    runner.submit(SHARD, WORK.id, WORK, "r1:7")
    assert runner.wait_results(5)
    (result,) = runner.take_results()
    assert (result.shard, result.token, result.effect_id, result.event) == (
        SHARD, "r1:7", WORK.id, RESULT
    )  # fmt: skip
    assert outboxes.completed == []
    # recovery finding the intent still pending in Redis meanwhile: `submit` decides at once
    runner.submit(SHARD, WORK.id, WORK, "r1:7")
    assert executor.runs == 1, "the intent runs once until its result is settled"
    runner.settled([WORK.id])
    runner.submit(SHARD, WORK.id, WORK, "r1:7")
    assert runner.wait_results(5), "the settled intent's second run"
    assert (len(runner.take_results()), executor.runs) == (1, 2)


def test_a_result_goes_through_the_stream_while_the_processor_blocks_in_redis(
    parts: tuple[Runner, FakeExecutor, FakeOutboxes, FakeLeases],
) -> None:
    runner, _, outboxes, _ = parts
    assert runner.handoff.begin_blocking()
    runner.submit(SHARD, WORK.id, WORK, "r1:7")
    wait_until(lambda: outboxes.completed, 5, "the result in the stream")
    runner.handoff.end_blocking()
    assert runner.take_results() == []
    assert [(s, t, e) for s, t, e, _ in outboxes.completed] == [(SHARD, "r1:7", WORK.id)]


def test_a_result_of_a_shard_held_under_another_token_goes_through_the_stream(
    parts: tuple[Runner, FakeExecutor, FakeOutboxes, FakeLeases],
) -> None:
    runner, _, outboxes, leases = parts
    leases.current = "r1:9"  # the shard moved and came back while the work ran
    runner.submit(SHARD, WORK.id, WORK, "r1:7")
    wait_until(lambda: outboxes.completed, 5, "the result in the stream")
    assert runner.take_results() == []
    assert [(s, t, e) for s, t, e, _ in outboxes.completed] == [(SHARD, "r1:9", WORK.id)]


def test_a_result_of_a_shard_no_longer_held_is_dropped(
    parts: tuple[Runner, FakeExecutor, FakeOutboxes, FakeLeases],
) -> None:
    runner, _, outboxes, leases = parts
    leases.current = None
    runner.submit(SHARD, WORK.id, WORK, "r1:7")
    # once the runner asked whose the shard is, the result's fate is decided: no lease, none
    wait_until(lambda: leases.asked, 5, "the run's end")
    assert runner.take_results() == [] and outboxes.completed == []
