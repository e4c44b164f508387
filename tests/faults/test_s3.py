"""The S3 endpoint becomes unreachable, then comes back.

The round's files go to S3 through a proxy the test can take down (moto keeps its buckets in
memory, so stopping moto itself would wipe them). The replica runs in this process with a
small retry budget (`Tuning`): a short outage is ridden out by the blob writer's retries with
backoff; a longer one exhausts the budget, the job reports `failed` upstream with the reason,
and the next round (the same samples, version + 1) succeeds once S3 is back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from service.embedded.processes import Server
from service.runtime import Tuning
from tests.faults.conftest import DATASET, JOB, FlakyProxy, probe_of, replica_on
from tests.harness import lines
from tests.stack import Stack
from tests.wait import wait_until

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


@pytest.fixture
def proxy(s3_server: Server) -> Iterator[FlakyProxy]:
    flaky = FlakyProxy(s3_server.port)
    yield flaky
    flaky.close()


def start_job(stack: Stack, proxy: FlakyProxy, bucket: str) -> str:
    """A local dataset and a job whose outputDir is in S3, reached through the proxy."""
    data = stack.samples()
    credential = {
        "s3-endpoint": f"127.0.0.1:{proxy.port}",
        "s3-usehttps": "0",
        "ACCESS_KEY_ID": "testing",
        "SECRET_ACCESS_KEY": "testing",
    }
    out = f"s3://{bucket}/out"
    stack.cloud.insert_dataset(DATASET, data)
    stack.cloud.insert_job(JOB, DATASET, out, credential=credential)
    return out


def get(s3c: S3Client, url: str) -> list[str]:
    bucket, _, key = url.removeprefix("s3://").partition("/")
    return s3c.get_object(Bucket=bucket, Key=key)["Body"].read().decode().splitlines()


def failures(stack: Stack) -> list[dict[str, Any]]:
    return [
        m["content"] for m in stack.cloud.upstream(JOB) if m["content"].get("status") == "failed"
    ]


def test_short_s3_outage_is_ridden_out_by_retries(
    stack: Stack, proxy: FlakyProxy, bucket: str, s3c: S3Client
) -> None:
    with replica_on(stack, tuning=Tuning(blob_attempts=10, blob_max_backoff_s=0.5)):
        out = start_job(stack, proxy, bucket)
        wait_until(lambda: len(proxy.refused_at) >= 2, 10, "the upload to be retried")
        proxy.up()
        ready = stack.cloud.wait_status(JOB, "train", "ready")["content"]["input"]
    assert ready["outputDir"] == f"{out}/train/1"
    assert get(s3c, ready["dataURL"]) == lines(0, 8)
    assert failures(stack) == []


def test_s3_outage_past_the_retry_budget_fails_the_round_then_recovers(
    stack: Stack, proxy: FlakyProxy, bucket: str, s3c: S3Client
) -> None:
    attempts = 3
    with replica_on(stack, tuning=Tuning(blob_attempts=attempts, blob_max_backoff_s=0.5)):
        out = start_job(stack, proxy, bucket)
        failed = stack.cloud.wait_status(JOB, "train", "failed")
        refused = len(proxy.refused_at)
        proxy.up()
        after = stack.cloud.upstream(JOB).index(failed) + 1
        ready = stack.cloud.wait_status(JOB, "train", "ready", after=after)["content"]["input"]
        with probe_of(stack.redis_url) as probe:
            state = probe.job(JOB)

    assert refused >= attempts, f"{refused} attempts, budget {attempts}"
    reason = failed["content"]["reason"]
    assert "writing train data of round 1 failed" in reason, reason
    assert f"{out}/data/train/1/data.txt" in reason, reason
    # the round after the last failed one (normally round 2: S3 was back before its check)
    # trains on the very samples round 1 could not write
    failed_rounds = failures(stack)
    version = len(failed_rounds) + 1
    assert [f["phase"] for f in failed_rounds] == ["train"] * (version - 1)
    assert ready["outputDir"] == f"{out}/train/{version}"
    assert get(s3c, ready["dataURL"]) == lines(0, 8)
    assert (state.version, state.phase, state.step) == (version, "train", "running")
