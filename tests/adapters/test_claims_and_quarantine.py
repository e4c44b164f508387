"""The store's outputDir claims and quarantine marks, on a real redis-server: claims that
survive restarts of the controller (they live in Redis), no outputDir inside or above another
job's, stale takeovers only past the grace period, and quarantine operations fenced by the
shard lease."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from service.adapters.redis_store import Commit, Quarantine, RedisStore
from service.errors import LeaseLost
from service.keys import Keys, job_key, shard_of
from service.runtime.executor import OutputDirs
from tests.servers import Server

A, B = job_key("team-a", "job"), job_key("team-b", "job")


@pytest.fixture
def store(redis_proc: Server) -> Iterator[RedisStore]:
    s = RedisStore(f"redis://127.0.0.1:{redis_proc.port}/0", Keys("t"), socket_timeout_s=2.0)
    s.ingress.ensure_groups()
    yield s
    s.close()


def test_the_second_job_to_claim_an_output_dir_is_told_the_first(store: RedisStore) -> None:
    assert store.records.claim_output_dir("/out", A, 1_000, grace_ms=100) is None
    assert store.records.claim_output_dir("/out", A, 2_000, grace_ms=100) is None  # its own: kept
    for spelling in ("/out", "/out/", "//out", "/./out"):
        assert store.records.claim_output_dir(spelling, B, 3_000, grace_ms=100) == (A, "/out")
    assert store.records.claim_output_dir("/outside", B, 3_000, grace_ms=100) is None  # a neighbour
    assert store.records.claim_output_dir("/out-b", B, 3_000, grace_ms=100) is None
    assert not store.records.release_output_dir("/out", B), "only the holder releases"
    assert store.records.release_output_dir("/out/", A)
    assert store.records.claim_output_dir("/out", B, 4_000, grace_ms=100) is None


def test_no_output_dir_inside_or_above_another_jobs(store: RedisStore) -> None:
    assert store.records.claim_output_dir("/output/v3", A, 1_000, grace_ms=100) is None
    # inside it (the victim's deploy model as a directory), and above it
    deploy = "/output/v3/deploy/index.pkl"
    assert store.records.claim_output_dir(deploy, B, 2_000, grace_ms=100) == (A, "/output/v3")
    assert store.records.claim_output_dir("/output", B, 2_000, grace_ms=100) == (A, "/output/v3")
    # the valid neighbours: siblings, a longer name, the same names on S3
    for free in ("/output/v", "/output/v30", "/output/v3-b", "/outputs", "s3://b/output/v3/x"):
        assert store.records.claim_output_dir(free, B, 2_000, grace_ms=100) is None, free
    # a job's own claims never stand in its way (moving into a subdirectory holds both)
    assert store.records.claim_output_dir("/output/v3/next", A, 3_000, grace_ms=100) is None
    assert store.records.release_output_dir("/output/v3", A)
    assert store.records.claim_output_dir("/output/v3/next/deeper", B, 4_000, grace_ms=100) == (
        A, "/output/v3/next",
    )  # fmt: skip
    # S3 prefixes nest the same way
    assert store.records.claim_output_dir("s3://b/jobs/a", A, 5_000, grace_ms=100) is None
    assert store.records.claim_output_dir("s3://b/jobs", B, 5_000, grace_ms=100) == (A, "s3://b/jobs/a")


def test_a_directory_above_many_claims_finds_the_first_other_job(store: RedisStore) -> None:
    """The range above a directory is read a page at a time: a job's own claims in it are
    skipped, stale ones past the grace removed, and the first other job's is named."""
    for i in range(20):
        assert store.records.claim_output_dir(f"/out/a{i:02}", A, 1_000, grace_ms=100) is None
    assert store.records.claim_output_dir("/out/z", B, 1_000, grace_ms=100) is None
    assert store.records.claim_output_dir("/out", A, 1_000, grace_ms=100) == (B, "/out/z")
    assert store.records.claim_output_dir("/out", B, 9_000, stale=A, grace_ms=100) is None
    assert store.records.claim_output_dir("/out/a05", A, 9_000, grace_ms=100) == (B, "/out")


def test_a_stale_claim_is_taken_over_only_past_the_grace_period(store: RedisStore) -> None:
    assert store.records.claim_output_dir("s3://b/out", A, 1_000, grace_ms=500) is None
    assert store.records.claim_output_dir("s3://b/out/", B, 1_400, stale=A, grace_ms=500) == (
        A, "s3://b/out",
    )  # fmt: skip
    assert store.records.claim_output_dir("s3://b/out", B, 1_600, stale=job_key("x", "y"),
                                  grace_ms=500) == (A, "s3://b/out")  # fmt: skip
    assert store.records.claim_output_dir("s3://b/out", B, 1_600, stale=A, grace_ms=500) is None


def test_output_dirs_take_over_the_claim_of_a_job_that_is_gone(store: RedisStore) -> None:
    dirs = OutputDirs(store.records, store.states, grace_ms=0)
    assert dirs.claim(A, "/shared", 1_000) is None
    # A has no state (deleted by hand, say): its claim is stale
    assert dirs.claim(B, "/shared", 2_000) is None
    patient = OutputDirs(store.records, store.states, grace_ms=10**9)
    assert patient.claim(A, "/shared", 3_000) == "team-b/job"
    assert patient.claim(A, "/shared/in", 3_000) == (
        "team-b/job, whose outputDir /shared contains it"
    )


def test_claims_are_keyed_by_the_directory_on_disk(store: RedisStore) -> None:
    """With a volume prefix, `/output/v` and `/rootfs/output/v` are one directory on disk."""
    dirs = OutputDirs(store.records, store.states, grace_ms=10**9, volume_prefix="/rootfs")
    assert dirs.claim(A, "/output/v", 1_000) is None
    assert dirs.claim(B, "/rootfs/output/v", 1_000) == "team-a/job"
    assert dirs.claim(B, "/output", 1_000) == "team-a/job, whose outputDir /output/v lies inside it"
    assert dirs.claim(B, "/output/w", 1_000) is None


def test_claims_are_one_key_in_a_slot_of_its_own(store: RedisStore) -> None:
    key = store.keys.output_claims()
    assert "{" not in key
    store.records.claim_output_dir("/out", A, 1_000, grace_ms=100)
    store.records.claim_output_dir("s3://b/out", A, 1_000, grace_ms=100)
    assert store.keys.output_claims() == key


def test_quarantine_marks_are_fenced_and_listed(store: RedisStore, redis_proc: Server) -> None:
    shard = shard_of(A)
    keys = store.keys
    token = store.leases.acquire(keys.lease(shard), keys.fence(shard), "r1", 10_000)
    assert token is not None
    entry = store.ingress.append(shard, b"\xc1garbage")
    assert entry is not None
    store.ingress.read([shard], count=10, block_ms=0, pending=False)
    op = Quarantine(rkey=A, ack_ids=(entry,), mark=b'{"cause":"state"}', retry_at_ms=5)
    [outcome] = store.states.commit([(shard, "r1:999", [op])])
    assert isinstance(outcome, LeaseLost) and store.states.quarantined() == {}
    [outcome] = store.states.commit([(shard, token, [op])])
    assert outcome == [[]]
    assert store.states.quarantined() == {A: b'{"cause":"state"}'}
    assert store.states.quarantine_mark(A) == b'{"cause":"state"}'
    assert store.ingress.read([shard], count=10, block_ms=0, pending=True) == []
    client = redis.Redis(port=redis_proc.port)
    try:
        assert client.zscore(keys.timers(shard), A) == 5
    finally:
        client.close()
    # a commit of the resource that ends the quarantine clears the mark in the same step
    cleared = Commit(rkey=A, state=b"s", clear_mark=True)
    [outcome] = store.states.commit([(shard, token, [cleared])])
    assert outcome == [[]] and store.states.quarantined() == {}
