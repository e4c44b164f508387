"""Seed bug 16: a burst of 1,000 job inserts crashed Sedna's controller (concurrent map
writes). Here every insert is taken in durably and each job exists exactly once."""

from __future__ import annotations

import json
import urllib.request

import redis

from service.keys import Keys
from tests.harness import NODE, PREFIX, job_resource
from tests.stack import Stack
from tests.wait import wait_until

JOBS = 1000


def test_bug16_burst_of_1000_job_inserts(stack: Stack) -> None:
    controller = stack.controller()
    out = stack.workdir / "out"
    for i in range(JOBS):
        resource = job_resource(f"burst-{i}", "ds", f"{out}/{i}")
        envelope = {
            "header": {
                "namespace": "default",
                "resourceKind": "lifelonglearningjob",
                "resourceName": f"burst-{i}",
                "operation": "insert",
            },
            "content": resource,
        }
        stack.cloud.client.publish(f"{PREFIX}/{NODE}/downstream", json.dumps(envelope), qos=1)
    client = redis.Redis.from_url(stack.redis_url)
    keys = Keys()

    def jobs() -> int:
        pipe = client.pipeline()
        for shard in range(16):
            pipe.scard(keys.index(shard))
        return sum(pipe.execute())

    wait_until(lambda: jobs() >= JOBS, 60, f"{JOBS} jobs to exist", detail=lambda: str(jobs()))
    assert jobs() == JOBS, f"{jobs()} of {JOBS} jobs exist"
    with urllib.request.urlopen(f"http://127.0.0.1:{controller.http_port}/readyz") as r:
        assert r.status == 200
    assert controller.proc is not None and controller.proc.poll() is None, "controller alive"
    assert stack.cloud.errors() == []
    assert "Traceback" not in controller.log()
