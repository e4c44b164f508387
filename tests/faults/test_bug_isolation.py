"""A transition that raises (a bug) costs only its own shard's events, and only until it is
fixed: they stay pending in Redis, the other shards' events of the same reads commit, and
the owner's periodic replay of pending entries applies them once the bug is gone."""

from __future__ import annotations

from typing import Any

import pytest

from service.core.state import WorkerReported
from service.keys import rkey, shard_of
from service.runtime import Replica
from tests.faults.conftest import probe_of, replica_on, wait_until
from tests.integration.conftest import Stack
from tests.integration.harness import job_resource

BROKEN, HEALTHY = "buggy-job", "healthy-job"


def forwarded(stack: Stack, job: str) -> list[dict[str, Any]]:
    return [m for m in stack.cloud.upstream(job) if "output" in m["content"]]


def test_a_failing_transition_holds_back_only_its_shard(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken_key = rkey("job", "default", BROKEN)
    assert shard_of(broken_key) != shard_of(rkey("job", "default", HEALTHY))
    run_resource = Replica._run_resource
    fixed = False

    def buggy(self: Replica, *args: Any) -> Any:
        key, items = args[2], args[4]
        reports = [i for _, i in items if i is not None and isinstance(i.event, WorkerReported)]
        if key == broken_key and reports and not fixed:
            raise RuntimeError("a bug in the lifecycle")
        return run_resource(self, *args)

    monkeypatch.setattr(Replica, "_run_resource", buggy)
    cloud = stack.cloud
    out = stack.workdir / "out"
    with replica_on(stack), probe_of(stack.redis_url) as probe:
        for job in (BROKEN, HEALTHY):
            cloud.downstream("lifelonglearningjob", "insert", job_resource(job, "none", str(out)))
        wait_until(
            lambda: all(probe.job_or_none(job) for job in (BROKEN, HEALTHY)), 15, "both jobs"
        )
        for _ in range(3):
            cloud.report(BROKEN, "train", "running")
            cloud.report(HEALTHY, "train", "running")
        cloud.wait_for(lambda: len(forwarded(stack, HEALTHY)) == 3, 15, "the healthy reports")
        assert forwarded(stack, BROKEN) == []
        fixed = True  # the next replay of pending entries (every lease period, 2 s) applies them
        cloud.wait_for(lambda: len(forwarded(stack, BROKEN)) == 3, 15, "the held-back reports")
    assert len(forwarded(stack, HEALTHY)) == 3
