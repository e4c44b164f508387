"""Time comes from one injectable clock: the trigger's timer window and checkPeriodSeconds
read it, so moving it (and only moving it) makes a waiting job train.

The replica runs in this process with a `ManualClock` stopped at 09:00. The job may train
only between 10:00 and 11:00, is checked every 60 s, and has samples pending from the
start. The replica's timer loop goes round and nothing fires; the window opening on the clock alone
does not fire either (the next check is still 60 clock-seconds away); moving the clock past
the check period fires round 1 at once.
"""

from __future__ import annotations

import threading
import time

import redis

from service.core.state import JobState
from service.keys import Keys, job_key, shard_of
from tests.faults.conftest import DATASET, JOB, Probe, probe_of, replica_on
from tests.stack import Stack
from tests.wait import wait_until

START_MS = 1_700_000_000_000
PERIOD_S = 60


class ManualClock:
    """A `service.runtime.Clock` the test moves by hand (threads read it concurrently)."""

    def __init__(self, now_ms: int, minute_of_day: int) -> None:
        self._lock = threading.Lock()
        self._now_ms = now_ms
        self._minute = minute_of_day
        self._timer_reads = 0

    def now_ms(self) -> int:
        with self._lock:
            if threading.current_thread().name == "timers":  # the replica's timer loop
                self._timer_reads += 1
            return self._now_ms

    def timer_reads(self) -> int:
        """How often the replica's timer loop has read the time to fire what is due."""
        with self._lock:
            return self._timer_reads

    def minute_of_day(self) -> int:
        with self._lock:
            return self._minute

    def monotonic_s(self) -> float:
        """Only lifecycle time stands still: the replica's own deadlines run as usual."""
        return time.monotonic()

    def set(self, *, now_ms: int | None = None, minute_of_day: int | None = None) -> None:
        with self._lock:
            self._now_ms = self._now_ms if now_ms is None else now_ms
            self._minute = self._minute if minute_of_day is None else minute_of_day


def pending_check(probe: Probe) -> JobState | None:
    """The job's state once it has samples and a check scheduled."""
    job = probe.job_or_none(JOB)
    return job if job is not None and job.taken and job.next_check_ms is not None else None


def timers_went_round(clock: ManualClock) -> None:
    """Until the timer loop has fired what was due at the clock's current time: it reads
    the clock once a round, before firing, so the second read from now ends a whole round
    that began after this call."""
    reads = clock.timer_reads()
    wait_until(lambda: clock.timer_reads() >= reads + 2, 10, "a round of the timer loop")


def check_still_pending(redis_url: str) -> bool:
    """The job's trigger check is still among its shard's timers, not fired."""
    client = redis.Redis.from_url(redis_url)
    try:
        key = job_key("default", JOB)
        return client.zscore(Keys().timers(shard_of(key)), key) is not None
    finally:
        client.close()


def test_timer_window_and_check_period_follow_the_injected_clock(stack: Stack) -> None:
    cloud = stack.cloud
    clock = ManualClock(START_MS, minute_of_day=9 * 60)
    data = stack.samples()
    out = stack.workdir / "out"
    trigger = {
        "checkPeriodSeconds": PERIOD_S,
        "timer": {"start": "10:00", "end": "11:00"},
        "condition": {"operator": ">", "threshold": 0, "metric": "num_of_samples"},
    }
    with replica_on(stack, clock=clock), probe_of(stack.redis_url) as probe:
        cloud.insert_dataset(DATASET, data)
        cloud.insert_job(JOB, DATASET, out, trigger=trigger)
        waiting = wait_until(lambda: pending_check(probe), 10, "samples to be pending")
        assert waiting.taken == 10 and waiting.version == 0
        assert waiting.next_check_ms == START_MS + PERIOD_S * 1000, "the period is on the clock"

        timers_went_round(clock)  # the stopped clock says nothing is due
        assert check_still_pending(stack.redis_url)
        clock.set(minute_of_day=10 * 60 + 5)  # the window opens, the period has not passed
        timers_went_round(clock)
        assert check_still_pending(stack.redis_url)
        assert cloud.status(JOB, "train", "ready") is None
        assert probe.job(JOB).version == 0

        clock.set(now_ms=START_MS + PERIOD_S * 1000)  # the check falls due: it fires
        ready = cloud.wait_status(JOB, "train", "ready", timeout_s=10)
        assert ready["content"]["input"]["outputDir"] == f"{out}/train/1"
        fired = probe.job(JOB)
        assert (fired.version, fired.phase) == (1, "train")
