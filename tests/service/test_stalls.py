"""A replica whose processor hangs (a failpoint stalls it mid-commit) says so: the log shows
the stall with the thread's stack, the metric counts it, /healthz turns 503 once the thread
has been silent for the lease, the other replica takes every shard over and finishes the
hung replica's work, and /healthz recovers once the thread moves again."""

from __future__ import annotations

import urllib.error
import urllib.request

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
