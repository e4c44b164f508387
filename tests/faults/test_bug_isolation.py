"""A transition that raises (a bug) costs only its own shard's events, and only until it is
fixed: they stay pending in Redis, the other shards' events of the same reads commit, and
the owner's periodic replay of pending entries applies them once the bug is gone."""

from __future__ import annotations

from typing import Any

from service.core.effects import Context, Outcome
from service.core.events import Event, WorkerReported
from service.core.lifecycle import transition
from service.core.state import State
from service.keys import job_key, shard_of
from tests.faults.conftest import probe_of, replica_on
from tests.harness import job_resource
from tests.stack import Stack
from tests.wait import wait_until

BROKEN, HEALTHY = "buggy-job", "healthy-job"


def forwarded(stack: Stack, job: str) -> list[dict[str, Any]]:
    return [m for m in stack.cloud.upstream(job) if "output" in m["content"]]


def test_a_failing_transition_holds_back_only_its_shard(stack: Stack) -> None:
    assert shard_of(job_key("default", BROKEN)) != shard_of(job_key("default", HEALTHY))
    fixed = False

    def buggy(state: State | None, event: Event, ctx: Context) -> Outcome:
        if isinstance(event, WorkerReported) and event.name == BROKEN and not fixed:
            raise RuntimeError("a bug in the lifecycle")
        return transition(state, event, ctx)

    cloud = stack.cloud
    out = stack.workdir / "out"
    with replica_on(stack, transition=buggy), probe_of(stack.redis_url) as probe:
        for job in (BROKEN, HEALTHY):
            resource = job_resource(job, "none", str(out / job))  # an outputDir each
            cloud.downstream("lifelonglearningjob", "insert", resource)
        wait_until(
            lambda: all(probe.job_or_none(job) for job in (BROKEN, HEALTHY)), 15, "both jobs"
        )
        for _ in range(3):
            cloud.report(BROKEN, "inference", "running")  # forwarded in any stage
            cloud.report(HEALTHY, "inference", "running")
        cloud.wait_for(lambda: len(forwarded(stack, HEALTHY)) == 3, 15, "the healthy reports")
        assert forwarded(stack, BROKEN) == []
        fixed = True  # the next replay of pending entries (every lease period, 2 s) applies them
        cloud.wait_for(lambda: len(forwarded(stack, BROKEN)) == 3, 15, "the held-back reports")
    assert len(forwarded(stack, HEALTHY)) == 3
