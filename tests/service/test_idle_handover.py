"""A report reaching an idle replica, its processor waiting in Redis for ingress entries,
is handed to the processor in process: it ends that wait (CLIENT UNBLOCK) and never becomes
an ingress entry, yet is applied and forwarded as any other."""

from __future__ import annotations

from typing import Any

import redis

from service.keys import Keys, job_key, shard_of
from tests.faults.conftest import QUIET_POLLS, QUIET_TRIGGER, distinct_upstream, kind_of
from tests.stack import Stack
from tests.wait import wait_until

JOB = "idle-job"
DATASET = "idle-dataset"


def processor_waiting(client: redis.Redis[bytes]) -> bool:
    """Whether a client blocks in an XREADGROUP: the processor's read of new entries."""
    clients: list[dict[str, Any]] = client.client_list()
    return any(c["cmd"] == "xreadgroup" and "b" in c["flags"] for c in clients)


def test_a_report_to_an_idle_replica_ends_its_wait_and_skips_the_stream(stack: Stack) -> None:
    cloud = stack.cloud
    stack.serving(env=QUIET_POLLS)
    cloud.insert_dataset(DATASET, stack.samples())
    cloud.insert_job(JOB, DATASET, stack.workdir / "out", trigger=QUIET_TRIGGER)
    cloud.wait_status(JOB, "train", "ready")
    client: redis.Redis[bytes] = redis.Redis.from_url(stack.redis_url)
    stream = Keys("lifelong").ingress(shard_of(job_key("default", JOB)))

    def forwarded() -> int:
        statuses = [kind_of(m["content"]) for m in distinct_upstream(cloud, JOB).values()]
        return statuses.count(("train", "running", "output"))

    try:
        wait_until(lambda: processor_waiting(client), 10, "the processor to wait in Redis")
        added = client.xinfo_stream(stream)["entries-added"]
        client.config_resetstat()
        cloud.report(JOB, "train", "running")
        wait_until(lambda: forwarded() == 1, 10, "the report forwarded upstream")
        assert client.xinfo_stream(stream)["entries-added"] == added, "it took the stream"
        unblocks = client.info("commandstats").get("cmdstat_client|unblock", {}).get("calls")
        assert unblocks == 1, "the processor's wait was not ended by the hand-over"
    finally:
        client.close()
    assert cloud.errors() == []
