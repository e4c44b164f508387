"""A replica whose processor hangs (a failpoint stalls it mid-commit) says so: the log shows
the stall with the thread's stack, the metric counts it, /healthz turns 503 once the thread
has been silent for the lease, the other replica takes every shard over and finishes the
hung replica's work, and /healthz recovers once the thread moves again. An idle thread is
no stall: it beats within the limit on any lease."""

from __future__ import annotations

import math
import urllib.error
import urllib.request

import pytest

from service.config import Config
from service.heartbeat import Beat
from service.runtime.replica import Replica
from tests.harness import Controller, metric_sum
from tests.stack import Stack
from tests.wait import wait_until

LEASE_S = 2  # the harness's LIFELONG_LEASE_SECONDS
STALL_S = 8  # past the lease, long enough to watch the other replica take over


def healthz(controller: Controller) -> tuple[int, str]:
    url = f"http://127.0.0.1:{controller.http_port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_a_hung_thread_is_reported_fails_liveness_and_its_shards_move(stack: Stack) -> None:
    hung = stack.controller("hung", env={"LIFELONG_FAILPOINTS": f"process-before-commit:{STALL_S}"})
    assert healthz(hung) == (200, "ok")
    # an event for the processor: it stops right before committing it
    stack.cloud.downstream("lifelonglearningjob", "delete", None, name="probe")
    wait_until(lambda: "failpoint process-before-commit: stalling" in hung.log(), 20,
               "the processor to hang")  # fmt: skip
    other = stack.controller("other")

    wait_until(lambda: "thread processor stalled" in hung.log(), 20, "the stall in the log")
    report = hung.log()[hung.log().index("thread processor stalled") :]
    assert f"(limit {LEASE_S / 2:g} s;" in report
    assert "in _apply" in report and 'failpoints.hit("process-before-commit")' in report
    assert metric_sum(hung, "lifelong_thread_stalls_total", thread="processor") == 1
    assert metric_sum(hung, "lifelong_thread_beat_age_seconds", thread="processor") > LEASE_S / 2

    _, body = wait_until(lambda: (seen := healthz(hung))[0] == 503 and seen, 20, "/healthz 503")
    assert body.startswith("thread processor silent for ") and body.endswith(
        f"(limit {LEASE_S:g} s)"
    ), body
    wait_until(lambda: "giving up every lease" in hung.log(), 20, "the hung one stepping down")

    # the other replica takes every shard and the ingress, and commits the hung one's event
    wait_until(lambda: metric_sum(other, "lifelong_leases_held") == 16, 20, "all 16 shards moved")
    wait_until(lambda: metric_sum(other, "lifelong_ingress_held") == 1, 20, "the ingress moved")
    wait_until(lambda: metric_sum(other, "lifelong_events_total", type="JobDeleted") >= 1, 20,
               "the other replica committing the event")  # fmt: skip
    wait_until(lambda: metric_sum(hung, "lifelong_leases_held") == 0, 20, "the hung one at 0")

    # the stall ends: the thread beats again and the replica is live again
    wait_until(lambda: healthz(hung) == (200, "ok"), STALL_S + 20, "/healthz 200 again")
    wait_until(lambda: "thread processor beats again" in hung.log(), 20, "the recovery logged")
    assert metric_sum(hung, "lifelong_thread_stalls_total", thread="processor") == 1



@pytest.mark.parametrize("lease_s", ["1", "2", "10", "60"])
def test_an_idle_outbox_beats_well_within_the_stall_limit(lease_s: str) -> None:
    """Every watched thread beats at least once per watchdog check while it has nothing to
    do, on any lease allowed. The outbox's thread, idle, waited 1 s between beats, and on a
    2 s lease (a stall limit of 1 s) was reported stalled whenever its wake-up came a moment
    late (once in a full run of the suite)."""
    config = Config.from_env(
        {"LIFELONG_MQTT_URL": "mqtt://127.0.0.1:9", "LIFELONG_REDIS_URL": "redis://127.0.0.1:9",
         "LIFELONG_LEASE_SECONDS": lease_s}
    )  # fmt: skip
    replica = Replica(config, replica_id="idle")  # made, never started: nothing connects
    limit = replica.heartbeats.check_interval_s
    assert replica.outbox._idle_wait_s <= limit < replica.heartbeats.stall_after_s  # test-only peek


@pytest.mark.parametrize("lease_s", ["1", "2"])
def test_a_loops_pause_between_runs_beats_at_every_watchdog_check(
    lease_s: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A watched loop's pause between runs is cut into waits no longer than the watchdog's
    check interval, with a beat after each: presence pauses 0.5 s, the whole stall limit on
    the shortest lease, and beat only around its runs, so the watchdog found it stalled
    whenever a run came a moment late. Here the pause is the stall limit itself."""
    config = Config.from_env(
        {"LIFELONG_MQTT_URL": "mqtt://127.0.0.1:9", "LIFELONG_REDIS_URL": "redis://127.0.0.1:9",
         "LIFELONG_LEASE_SECONDS": lease_s}
    )  # fmt: skip
    replica = Replica(config, replica_id="paused")  # made, never started: nothing connects
    runs: list[int] = []
    beats_after_run: list[int] = []
    beat = Beat.__call__

    def counting(self: Beat) -> None:
        beats_after_run.append(len(runs))
        beat(self)

    def loop() -> None:
        runs.append(1)
        if len(runs) == 2:
            replica._stop.set()  # test-only peek: the run after the pause is the last

    monkeypatch.setattr(Beat, "__call__", counting)
    pause_s = replica.heartbeats.stall_after_s
    replica._guarded("probe", loop, pause_s)  # on this thread: returns once stopped
    checks = math.ceil(pause_s / replica.heartbeats.check_interval_s)
    # after run 1 and before run 2: the beat after the run, one per slice, the one before
    assert beats_after_run.count(1) == 1 + checks + 1
