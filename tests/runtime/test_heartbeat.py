"""The watchdog, on a clock the test moves: stalls logged once with the stack, counted, the
replica not live past the lease and live again after a beat; ended threads; idle waits."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

import pytest

from service.heartbeat import Heartbeats, current_beat, progress
from service.metrics import Metrics

LEASE_S = 10.0


class StepClock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> StepClock:
    return StepClock()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def heartbeats(clock: StepClock, metrics: Metrics) -> Heartbeats:
    return Heartbeats(clock, LEASE_S, metrics=metrics)


class Sleeper:
    """A thread parked in a function of its own, so its stack has a name to look for."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.thread = threading.Thread(target=self.parked_in_a_slow_call, daemon=True)

    def parked_in_a_slow_call(self) -> None:
        self.release.wait(30)


@pytest.fixture
def sleeper() -> Iterator[Sleeper]:
    s = Sleeper()
    s.thread.start()
    yield s
    s.release.set()
    s.thread.join(5)


def advance(clock: StepClock, heartbeats: Heartbeats, seconds: float) -> None:
    """Time passes under a running watchdog: it looks every check interval on the way."""
    step = heartbeats.check_interval_s
    while seconds > step:
        clock.now += step
        seconds -= step
        heartbeats.check()
    clock.now += seconds


def value(metrics: Metrics, name: str, thread: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"thread": thread})


def stall_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "stalled" in r.getMessage()]


def test_a_stall_is_logged_once_with_its_stack_counted_and_fails_liveness_past_the_lease(
    heartbeats: Heartbeats,
    clock: StepClock,
    metrics: Metrics,
    sleeper: Sleeper,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="service.heartbeat")
    beat = heartbeats.watch("processor", sleeper.thread)

    advance(clock, heartbeats, LEASE_S / 2)  # exactly half the lease: not yet a stall
    heartbeats.check()
    assert stall_lines(caplog) == []
    assert value(metrics, "lifelong_thread_stalls_total", "processor") == 0
    assert value(metrics, "lifelong_thread_beat_age_seconds", "processor") == LEASE_S / 2

    advance(clock, heartbeats, 0.5)
    heartbeats.check()
    heartbeats.check()  # the same stall, seen again: not logged or counted again
    [line] = stall_lines(caplog)
    assert "thread processor stalled: no beat for 5.5 s" in line
    assert "in parked_in_a_slow_call" in line  # the stack the thread is in
    assert value(metrics, "lifelong_thread_stalls_total", "processor") == 1
    assert heartbeats.live() == (True, "ok")  # stalled, but not past the lease yet

    advance(clock, heartbeats, LEASE_S / 2)
    live, why = heartbeats.live()
    assert not live
    assert why == "thread processor silent for 10.5 s (limit 10 s)"

    beat()  # it moves again
    assert heartbeats.live() == (True, "ok")
    heartbeats.check()
    assert any("processor beats again after 10.5 s" in r.getMessage() for r in caplog.records)

    advance(
        clock, heartbeats, LEASE_S / 2 + 1
    )  # a second stall is a new one: logged and counted again
    heartbeats.check()
    assert len(stall_lines(caplog)) == 2
    assert value(metrics, "lifelong_thread_stalls_total", "processor") == 2


def test_a_loop_that_beats_each_time_round_is_never_stalled(
    heartbeats: Heartbeats, clock: StepClock, metrics: Metrics
) -> None:
    """An idle loop (waiting on a queue with a timeout shorter than half the lease) beats
    each time round: however long it idles, it is never stalled."""
    beat = heartbeats.watch("intake")
    for _ in range(100):
        advance(clock, heartbeats, LEASE_S / 2 - 0.01)
        beat()
        heartbeats.check()
    assert heartbeats.live() == (True, "ok")
    assert value(metrics, "lifelong_thread_stalls_total", "intake") == 0


def test_a_thread_that_ended_counts_as_stalled_at_once(
    heartbeats: Heartbeats, clock: StepClock, metrics: Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="service.heartbeat")

    def crashes() -> None:
        """Ends as a thread killed by an exception does: its beat never closed."""
        with contextlib.suppress(RuntimeError), heartbeats.watch("timers"):
            raise RuntimeError("a bug")

    thread = threading.Thread(target=crashes)
    thread.start()
    thread.join(5)
    advance(clock, heartbeats, 0.1)
    live, why = heartbeats.live()
    assert not live
    assert why == "thread timers ended for 0.1 s (limit 10 s)"
    heartbeats.check()
    heartbeats.check()
    assert [r.getMessage() for r in caplog.records] == [
        "thread timers ended (silent for 0.1 s): the replica is not live"
    ]
    assert value(metrics, "lifelong_thread_stalls_total", "timers") == 1


def test_a_thread_that_stops_on_purpose_is_no_longer_watched(
    heartbeats: Heartbeats, clock: StepClock, metrics: Metrics
) -> None:
    def returns() -> None:
        with heartbeats.watch("outbox"):
            pass

    thread = threading.Thread(target=returns)
    thread.start()
    thread.join(5)
    advance(clock, heartbeats, LEASE_S * 2)
    heartbeats.check()
    assert heartbeats.live() == (True, "ok")
    assert value(metrics, "lifelong_thread_beat_age_seconds", "outbox") is None


def test_progress_beats_the_calling_threads_beat_and_nothing_elsewhere(
    heartbeats: Heartbeats, clock: StepClock
) -> None:
    progress()  # a thread that holds no beat: nothing happens
    current_beat()()
    with heartbeats.watch("effects_0"):
        advance(clock, heartbeats, LEASE_S - 1)
        progress()  # deep inside a long copy
        advance(clock, heartbeats, LEASE_S - 1)
        assert heartbeats.live() == (True, "ok")
        on_behalf = current_beat()  # handed to a transfer's own threads
        advance(clock, heartbeats, LEASE_S - 1)
        helper = threading.Thread(target=on_behalf)
        helper.start()
        helper.join(5)
        advance(clock, heartbeats, LEASE_S - 1)
        assert heartbeats.live() == (True, "ok")
        advance(clock, heartbeats, 2)
        assert heartbeats.live() == (False, "thread effects_0 silent for 11.0 s (limit 10 s)")


def test_a_name_watched_again_takes_over_and_the_old_beat_forgets_nothing(
    heartbeats: Heartbeats, clock: StepClock
) -> None:
    """An effect worker watches its name for each effect: closing an older watch of the name
    leaves the newer one watched."""
    old = heartbeats.watch("effects_1")
    new = heartbeats.watch("effects_1")
    old.close()
    advance(clock, heartbeats, LEASE_S + 1)
    assert heartbeats.live() == (False, "thread effects_1 silent for 11.0 s (limit 10 s)")
    new.close()
    assert heartbeats.live() == (True, "ok")


def test_a_paused_process_blames_no_thread(
    heartbeats: Heartbeats, clock: StepClock, metrics: Metrics, sleeper: Sleeper,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """SIGSTOP or a frozen VM: the watchdog itself looked last long ago, every beat is old
    for that reason alone; a thread that then stays silent is a stall again."""
    caplog.set_level(logging.INFO, logger="service.heartbeat")
    heartbeats.watch("processor", sleeper.thread)
    heartbeats.check()
    clock.now += LEASE_S * 3  # nobody ran, the watchdog neither
    heartbeats.check()
    assert stall_lines(caplog) == []
    assert any("whole process was paused" in r.getMessage() for r in caplog.records)
    assert heartbeats.live() == (True, "ok")
    advance(clock, heartbeats, LEASE_S / 2 + 1)
    heartbeats.check()
    assert len(stall_lines(caplog)) == 1
    assert value(metrics, "lifelong_thread_stalls_total", "processor") == 1


def test_a_liveness_question_asked_first_after_a_pause_blames_no_thread(
    heartbeats: Heartbeats, clock: StepClock, sleeper: Sleeper, caplog: pytest.LogCaptureFixture
) -> None:
    """The lease loop may ask before the watchdog looks again after a pause: the answer is
    live, and a thread silent for a whole lease after the pause is dead again."""
    caplog.set_level(logging.INFO, logger="service.heartbeat")
    heartbeats.watch("processor", sleeper.thread)
    heartbeats.check()
    clock.now += LEASE_S * 3
    assert heartbeats.live() == (True, "ok")
    assert any("whole process was paused" in r.getMessage() for r in caplog.records)
    heartbeats.check()
    assert stall_lines(caplog) == []
    advance(clock, heartbeats, LEASE_S + 1)
    assert heartbeats.live()[0] is False
