"""The effect executor on real files and a real Redis: each kind of work does its I/O and
reports its outcome as the event the core expects."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from service.adapters.blobs import BlobStore
from service.adapters.dataset_sources import DatasetReader
from service.adapters.redis_store import Commit, RedisStore
from service.adapters.s3 import S3Clients
from service.core.effects import (
    AttachDataset,
    CopyModel,
    DetachDataset,
    NotifyJobs,
    PollDataset,
    WriteRound,
)
from service.core.events import DatasetChanged, DatasetPolled, ModelCopied, RoundWritten
from service.core.rounds import ModelDigest
from service.core.state import DatasetInfo, DatasetState, encode_state
from service.keys import NUM_SHARDS, Keys, dataset_key, job_key, shard_of
from service.runtime.executor import Executor, unreadable
from service.runtime.intake import decode_accepted
from tests.conftest import DeniedS3
from tests.harness import dataset_resource
from tests.servers import Server, free_port

NS = "default"


@pytest.fixture
def store(redis_proc: Server) -> Iterator[RedisStore]:
    store = RedisStore(f"redis://127.0.0.1:{redis_proc.port}/0", Keys("t"))
    store.ingress.ensure_groups()
    yield store
    store.close()


@pytest.fixture
def executor(store: RedisStore) -> Executor:
    s3 = S3Clients()
    blobs = BlobStore(s3, attempts=1, max_backoff_s=0.1)
    return Executor(
        states=store.states,
        records=store.records,
        ingress=store.ingress,
        blobs=blobs,
        reader=DatasetReader(s3),
    )


def delivered(store: RedisStore) -> list[tuple[int, object]]:
    """Every event appended to any shard's ingress, with its shard."""
    entries = store.ingress.read(range(NUM_SHARDS), count=100, block_ms=0, pending=False)
    return [(e.shard, decode_accepted(e.event or b"").event) for e in entries]


def test_write_round_streams_the_ranges_and_reports_written(
    executor: Executor, tmp_path: Path
) -> None:
    source = tmp_path / "d.txt"
    source.write_text("".join(f"s{i}\n" for i in range(10)))
    data = tmp_path / "out" / "data" / "train" / "1" / "data.txt"
    work = WriteRound(
        id="e/0", namespace=NS, name="j", phase="train", version=1, dataset="ds",
        source_url=str(source), format="txt", ranges=((2, 4), (7, 9)), data_url=str(data),
    )  # fmt: skip
    assert executor.run(work, 0) == RoundWritten(namespace=NS, name="j", phase="train", version=1)
    assert data.read_text().splitlines() == ["s2", "s3", "s7", "s8"]


def test_write_round_makes_the_directories_ahead_and_a_refused_one_fails_nothing(
    executor: Executor, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = tmp_path / "d.txt"
    source.write_text("s0\n")
    out = tmp_path / "out"
    (tmp_path / "blocked").write_text("a file where a directory would go")
    ahead = (out / "data" / "eval" / "1", tmp_path / "blocked" / "deploy", out / "deploy")
    work = WriteRound(
        id="e/0", namespace=NS, name="j", phase="train", version=1, dataset="ds",
        source_url=str(source), format="txt", ranges=((0, 1),),
        data_url=str(out / "data" / "train" / "1" / "data.txt"), ahead=tuple(map(str, ahead)),
    )  # fmt: skip
    assert executor.run(work, 0) == RoundWritten(namespace=NS, name="j", phase="train", version=1)
    assert ahead[0].is_dir() and ahead[2].is_dir()
    assert not list(ahead[0].iterdir()), "made empty: the eval round writes into it"
    (refused,) = [r for r in caplog.records if "not made ahead" in r.getMessage()]
    assert str(ahead[1]) in refused.getMessage()
    assert executor.run(work, 0) == RoundWritten(namespace=NS, name="j", phase="train", version=1)


def test_write_round_removes_the_rounds_older_than_the_newest_kept(
    executor: Executor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "d.txt"
    source.write_text("s0\n")
    phase = tmp_path / "out" / "data" / "train"
    listed: list[str] = []
    prune_rounds = BlobStore.prune_rounds

    def spy(self: BlobStore, data_url: str, keep: Callable[[int], bool]) -> list[int]:
        listed.append(data_url)
        return prune_rounds(self, data_url, keep)

    monkeypatch.setattr(BlobStore, "prune_rounds", spy)
    for version in range(1, 6):
        work = WriteRound(
            id=f"e/{version}", namespace=NS, name="j", phase="train", version=version,
            dataset="ds", source_url=str(source), format="txt", ranges=((0, 1),),
            data_url=str(phase / str(version) / "data.txt"),
        )  # fmt: skip
        assert executor.run(work, 0) == RoundWritten(
            namespace=NS, name="j", phase="train", version=version
        )
    assert sorted(p.name for p in phase.iterdir()) == ["3", "4", "5"]  # 3 kept by default
    # the first rounds, with no round older than the kept ones, list nothing
    assert listed == [str(phase / str(version) / "data.txt") for version in (3, 4, 5)]


def test_write_round_of_a_missing_dataset_reports_why(executor: Executor, tmp_path: Path) -> None:
    work = WriteRound(
        id="e/0", namespace=NS, name="j", phase="eval", version=2, dataset="ds",
        source_url=str(tmp_path / "gone.txt"), format="txt", ranges=((0, 1),),
        data_url=str(tmp_path / "data.txt"),
    )  # fmt: skip
    result = executor.run(work, 0)
    assert isinstance(result, RoundWritten) and result.error is not None
    assert "round 2" in result.error and (result.phase, result.version) == ("eval", 2)


def test_copy_model_replaces_the_deploy_file_or_says_why(
    executor: Executor, tmp_path: Path
) -> None:
    model, deployed = tmp_path / "m.pkl", tmp_path / "deploy" / "index.pkl"
    model.write_bytes(b"new model")
    copy = CopyModel(
        id="e/0", namespace=NS, name="j", version=3, src_url=str(model), dst_url=str(deployed)
    )
    digest = ModelDigest(size=9, sha256=hashlib.sha256(b"new model").hexdigest())
    assert executor.run(copy, 0) == ModelCopied(namespace=NS, name="j", version=3, digest=digest)
    assert deployed.read_bytes() == b"new model"
    model.unlink()
    result = executor.run(copy, 0)
    assert isinstance(result, ModelCopied) and result.error and "copying model" in result.error
    assert deployed.read_bytes() == b"new model"


def test_poll_counts_samples_and_reads_only_what_was_appended(
    executor: Executor, tmp_path: Path
) -> None:
    source = tmp_path / "d.csv"
    source.write_text("a,b\n1,2\n3,4\n")
    poll = PollDataset(id="e/0", namespace=NS, name="ds", url=str(source), format="csv")
    first = executor.run(poll, 0)
    assert isinstance(first, DatasetPolled) and first.num_samples == 2 and first.error is None
    with source.open("a") as f:
        f.write("5,6\n")
    again = PollDataset(
        id="e/1", namespace=NS, name="ds", url=str(source), format="csv", cursor=first.cursor
    )
    second = executor.run(again, 0)
    assert isinstance(second, DatasetPolled) and second.num_samples == 3


def test_attach_registers_the_job_and_tells_it_of_a_known_dataset(
    executor: Executor, store: RedisStore
) -> None:
    attach = AttachDataset(id="e/0", namespace=NS, name="j", dataset="ds")
    executor.run(attach, 0)
    assert store.records.dataset_jobs(dataset_key(NS, "ds")) == [job_key(NS, "j")]
    assert delivered(store) == [], "an unknown dataset: the job waits for its first poll"
    ds = dataset_key(NS, "ds")
    token = store.leases.acquire(
        store.keys.lease(shard_of(ds)), store.keys.fence(shard_of(ds)), "r", 9999
    )
    assert token is not None
    state = DatasetState(namespace=NS, name="ds", url="/d", format="txt", digest="x", num_samples=7)
    store.states.commit([(shard_of(ds), token, [Commit(rkey=ds, state=encode_state(state))])])
    executor.run(attach, 0)
    expected = DatasetChanged(
        namespace=NS, name="j", dataset="ds", info=DatasetInfo(url="/d", format="txt"),
        num_samples=7,
    )  # fmt: skip
    assert delivered(store) == [(shard_of(job_key(NS, "j")), expected)]


def test_notify_tells_every_job_of_the_dataset_and_detach_stops_it(
    executor: Executor, store: RedisStore
) -> None:
    for job in ("j1", "j2"):
        executor.run(AttachDataset(id=f"a/{job}", namespace=NS, name=job, dataset="ds"), 0)
    executor.run(DetachDataset(id="d", namespace=NS, name="j2", dataset="ds"), 0)
    info = DatasetInfo(url="/d", format="txt", present=False)
    executor.run(NotifyJobs(id="n", namespace=NS, dataset="ds", info=info), 0)
    told = DatasetChanged(namespace=NS, name="j1", dataset="ds", info=info)
    assert delivered(store) == [(shard_of(job_key(NS, "j1")), told)]


def _poll(executor: Executor, url: str, fmt: str = "txt") -> DatasetPolled:
    result = executor.run(PollDataset(id="e/0", namespace=NS, name="ds", url=url, format=fmt), 0)
    assert isinstance(result, DatasetPolled)
    return result


def test_poll_of_a_missing_or_unreadable_file_says_why(executor: Executor, tmp_path: Path) -> None:
    """Missing and forbidden alike: "cannot read", so whoever named the dataset cannot tell
    which files exist."""
    missing = _poll(executor, str(tmp_path / "trainData.csv"), "csv")
    assert missing.unreadable == unreadable(str(tmp_path / "trainData.csv"))
    assert missing.unreadable.startswith("cannot read ")
    assert missing.error is None and missing.cursor == b""
    directory = _poll(executor, str(tmp_path))
    assert directory.unreadable == unreadable(str(tmp_path))
    (tmp_path / "trainData.csv").write_text("a,b\n1,2\n")
    readable = _poll(executor, str(tmp_path / "trainData.csv"), "csv")
    assert (readable.unreadable, readable.error, readable.num_samples) == (None, None, 1)


def _with_credential(store: RedisStore, endpoint: str, key_id: str, secret: str) -> None:
    """Store the dataset's resource with a credential annotation, as intake does."""
    credential = {"s3-endpoint": endpoint, "s3-usehttps": "0", "ACCESS_KEY_ID": key_id,
                  "SECRET_ACCESS_KEY": secret}  # fmt: skip
    resource = dataset_resource("ds", "s3://b/k", credential=credential)
    ds = dataset_key(NS, "ds")
    lease, fence = store.keys.lease(shard_of(ds)), store.keys.fence(shard_of(ds))
    token = store.leases.lease_holder(lease) or store.leases.acquire(lease, fence, "r", 99_999)
    assert token is not None
    state = DatasetState(namespace=NS, name="ds", url="s3://b/k", format="txt", digest="x")
    commit = Commit(rkey=ds, state=encode_state(state), resource=json.dumps(resource).encode())
    store.states.commit([(shard_of(ds), token, [commit])])


def test_poll_of_an_s3_object_that_is_missing_or_forbidden_says_why(
    executor: Executor, store: RedisStore, s3_denied: DeniedS3, s3_endpoint: str, bucket: str
) -> None:
    _with_credential(store, s3_endpoint.removeprefix("http://"), "testing", "testing")
    absent = _poll(executor, f"s3://{bucket}/no/such/key.txt")
    assert absent.unreadable == unreadable(f"s3://{bucket}/no/such/key.txt")
    no_bucket = _poll(executor, "s3://no-such-bucket-here/k.txt")
    assert no_bucket.unreadable == unreadable("s3://no-such-bucket-here/k.txt")

    denied = S3Clients()  # a fresh cache: the credential below is another client
    executor = Executor(states=store.states, records=store.records, ingress=store.ingress,
                        blobs=BlobStore(denied, attempts=1, max_backoff_s=0.1),
                        reader=DatasetReader(denied))  # fmt: skip
    _with_credential(store, s3_denied.endpoint.removeprefix("http://"),
                     s3_denied.access_key_id, s3_denied.secret_access_key)  # fmt: skip
    forbidden = _poll(executor, f"s3://{s3_denied.bucket}/{s3_denied.key}")
    assert forbidden.unreadable is not None and "HTTP 403" in forbidden.unreadable
    assert s3_denied.secret_access_key not in forbidden.unreadable
    assert forbidden.error is None


def test_poll_of_an_s3_endpoint_that_is_down_is_worth_retrying(
    executor: Executor, store: RedisStore
) -> None:
    _with_credential(store, f"127.0.0.1:{free_port()}", "testing", "testing")
    down = _poll(executor, "s3://b/k.txt")
    assert down.unreadable is None and down.error is not None
