"""Effects run inline: a small local round file or model copy done on the processor's thread
before the commit, its result applied in that same commit (`InlineEffects`), and everything
else left to the pool as a stored intent. Real files through a real blob store; the core
is the real one; no Redis is reached (a local lifelong-learning job's effects need none)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import pytest

from service.adapters.blobs import BlobStore
from service.adapters.dataset_sources import DatasetReader
from service.adapters.files import LocalFiles
from service.adapters.redis_store import Ingress, Records, States
from service.adapters.s3 import S3Clients
from service.core.effects import Work, WriteRound, decode_work
from service.core.events import DatasetChanged, Event, JobApplied, RoundWritten
from service.core.lifecycle import transition
from service.core.paths import DataRoots
from service.core.state import JobModels, JobState, ResourceState, decode_state, encode_state
from service.errors import TransientError
from service.heartbeat import SystemClock
from service.keys import MODEL_KIND, rkey
from service.metrics import Metrics
from service.runtime.executor import (
    INLINE_PER_PASS,
    Executor,
    InlineEffects,
    KnownStates,
    OutputDirs,
)
from service.runtime.intake import Accepted
from service.runtime.leases import LeaseKeeper
from service.runtime.processor import Cached, Plan, ResourceRunner
from service.runtime.rejections import Held, Quarantines
from service.wire import IncrementalSpec
from tests.core.driver import DATASET, INCREMENTAL, JOB, MODELS, NS, info, spec
from tests.runtime.test_planner import CONFIG, RKEY, TOKEN, steps_of

SHARD = 3


class _Leases:
    """The shard's lease token as the lease keeper would tell it."""

    def __init__(self, token: str | None) -> None:
        self.current = token

    def token(self, shard: int) -> str | None:
        return self.current


class _Failing:
    """An executor whose work fails transiently."""

    def run(self, work: Work, now_ms: int, known: KnownStates | None = None) -> Event | None:
        raise TransientError("disk busy")


class Node:
    """A job on local disk: its dataset (ten samples) and its output dir, under ``tmp``."""

    def __init__(self, tmp: Path, *, max_bytes: int = 1 << 20, token: str | None = TOKEN) -> None:
        self.dataset = tmp / "data" / "train.txt"
        self.dataset.parent.mkdir()
        self.dataset.write_text("".join(f"/data/img{i}.png {i % 3}\n" for i in range(10)))
        self.out = tmp / "out"
        self.metrics = Metrics()
        self.leases = _Leases(token)
        #: the stored states the processor's cache knows (`ResourceRunner`'s ``known``)
        self.known: dict[str, Cached] = {}
        executor = Executor(
            states=cast(States, None), records=cast(Records, None),
            ingress=cast(Ingress, None),
            blobs=BlobStore(S3Clients(), files=LocalFiles(DataRoots((str(tmp),)))),
            reader=cast(DatasetReader, None),
        ).trying_once()  # fmt: skip
        self.inline = InlineEffects(
            executor=executor, leases=cast(LeaseKeeper, self.leases),
            clock=SystemClock(), metrics=self.metrics, max_bytes=max_bytes,
        )  # fmt: skip
        self.runner = ResourceRunner(
            config=CONFIG, clock=SystemClock(), transition=transition,
            quarantines=Quarantines(self.metrics),
            output_dirs=cast(OutputDirs, None),  # claimed only by an insert; none comes here
            inline=self.inline, known=self.cached, metrics=self.metrics,
        )  # fmt: skip

    def cached(self, rkeys: Sequence[str]) -> dict[str, Cached]:
        return {key: self.known[key] for key in rkeys if key in self.known}

    def samples_arrived(self, incremental: IncrementalSpec | None = None) -> Plan:
        """The job (an incremental-learning one, given its spec), created, learns of its
        dataset's ten samples: its first train round."""
        job_spec = spec(output_dir=str(self.out), incremental=incremental)
        applied = JobApplied(namespace=NS, name=JOB, spec=job_spec, digest="d1")
        created, _ = steps_of(None, applied)
        changed = DatasetChanged(
            namespace=NS, name=JOB, dataset=DATASET, info=info(str(self.dataset)),
            num_samples=10,
        )  # fmt: skip
        self.inline.begin_pass()
        result = self.runner.plan(SHARD, TOKEN, RKEY, {RKEY: created}, [
            Held("1-0", Accepted(event=changed))
        ])  # fmt: skip
        assert isinstance(result, Plan)
        return result

    def inline_count(self) -> float:
        labels = {"type": "WriteRound", "outcome": "inline"}
        return self.metrics.registry.get_sample_value("lifelong_effects_total", labels) or 0.0

    def round_file(self) -> Path:
        return self.out / "data" / "train" / "1" / "data.txt"


def test_a_small_local_round_runs_inline_and_its_result_lands_in_the_same_commit(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)
    result = node.samples_arrived()
    commit = result.commit
    assert commit.effects == (), "no intent is stored for an effect already done"
    assert commit.ack_ids == ("1-0",), "the result is no entry: nothing more to acknowledge"
    assert node.round_file().read_text().count("\n") == 8  # trainProb 0.8 of 10 samples
    assert [r.event for r in result.records] == ["DatasetChanged", "RoundWritten"]
    assert commit.state is not None
    state = decode_state(commit.state)
    # the train ready is out: the job waits for its worker
    assert isinstance(state, JobState) and (state.phase, state.step) == ("train", "running")
    (ready,) = [e for e in commit.outbox if b'"ready"' in e.payload]
    assert ready.id.startswith(f"s{SHARD}-1-0+0"), "the result's ids derive from its cause's"
    assert node.inline_count() == 1
    assert isinstance(result.initial, JobState) and result.initial.phase == "train"
    assert result.initial.step == "waiting" and result.state == state
    jobs = node.metrics.registry.get_sample_value(
        "lifelong_jobs", {"phase": "train", "step": "running"}
    )
    assert not jobs, "the job metrics count the move once its commit is done, not here"


def test_an_incremental_round_takes_its_models_from_the_cache_without_reading_redis(
    tmp_path: Path,
) -> None:
    """The initial Model an incremental-learning job's train round needs, known to the
    processor's cache (decoded, or as the bytes read), is taken from it: this node has no
    Redis, so a read would fail the round."""
    initial = ResourceState(
        kind=MODEL_KIND, namespace=NS, name=INCREMENTAL.initial_model, digest="m1",
        model=MODELS.initial,
    )  # fmt: skip
    model_key = rkey(MODEL_KIND, NS, INCREMENTAL.initial_model)
    for known in (initial, encode_state(initial)):
        (tmp_path / type(known).__name__).mkdir()
        node = Node(tmp_path / type(known).__name__)
        node.known[model_key] = known
        result = node.samples_arrived(incremental=INCREMENTAL)
        assert [r.event for r in result.records] == ["DatasetChanged", "RoundWritten"]
        assert result.commit.state is not None
        state = decode_state(result.commit.state)
        assert isinstance(state, JobState) and (state.phase, state.step) == ("train", "running")
        assert state.models == JobModels(initial=MODELS.initial)


def test_a_round_from_a_source_over_the_limit_is_left_to_the_pool(tmp_path: Path) -> None:
    node = Node(tmp_path, max_bytes=100)  # the dataset holds 170 bytes
    result = node.samples_arrived()
    ((_, intent),) = result.commit.effects
    assert isinstance(decode_work(intent), WriteRound)
    assert [r.event for r in result.records] == ["DatasetChanged"]
    assert not node.round_file().exists() and node.inline_count() == 0


def test_nothing_runs_inline_once_the_shard_moved_to_another_token(tmp_path: Path) -> None:
    node = Node(tmp_path, token="r2:8")
    ((_, intent),) = node.samples_arrived().commit.effects
    assert isinstance(decode_work(intent), WriteRound)
    assert not node.round_file().exists()


def test_a_pass_runs_a_few_inline_and_leaves_the_rest_to_the_pool(tmp_path: Path) -> None:
    node = Node(tmp_path)
    work = WriteRound(
        id="s3-1-0/0", namespace=NS, name=JOB, phase="train", version=1, dataset=DATASET,
        source_url=str(node.dataset), format="txt", ranges=((0, 2),),
        data_url=str(node.round_file()),
    )  # fmt: skip
    node.inline.begin_pass()
    done = [node.inline.run(SHARD, TOKEN, RKEY, work) for _ in range(INLINE_PER_PASS + 1)]
    assert all(isinstance(r, RoundWritten) for r in done[:-1]) and done[-1] is None
    node.inline.begin_pass()
    assert isinstance(node.inline.run(SHARD, TOKEN, RKEY, work), RoundWritten)
    s3 = WriteRound(
        id="s3-1-0/1", namespace=NS, name=JOB, phase="train", version=1, dataset=DATASET,
        source_url=str(node.dataset), format="txt", ranges=((0, 2),),
        data_url="s3://bucket/out/data/train/1/data.txt",
    )  # fmt: skip
    assert node.inline.run(SHARD, TOKEN, RKEY, s3) is None, "S3 work always goes to the pool"
    another_job = WriteRound(
        id="s3-1-0/2", namespace=NS, name="job-b", phase="train", version=1, dataset=DATASET,
        source_url=str(node.dataset), format="txt", ranges=((0, 2),),
        data_url=str(node.round_file()),
    )  # fmt: skip
    assert node.inline.run(SHARD, TOKEN, RKEY, another_job) is None, "its result is not RKEY's"


def test_a_transient_failure_leaves_the_work_to_the_pool(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="service.runtime.executor")
    node = Node(tmp_path)
    node.inline = InlineEffects(
        executor=cast(Executor, _Failing()),
        leases=cast(LeaseKeeper, node.leases), clock=SystemClock(), metrics=node.metrics,
        max_bytes=1 << 20,
    )  # fmt: skip
    node.runner = ResourceRunner(
        config=CONFIG, clock=SystemClock(), transition=transition,
        quarantines=Quarantines(node.metrics), output_dirs=cast(OutputDirs, None),
        inline=node.inline, known=node.cached, metrics=node.metrics,
    )  # fmt: skip
    ((_, intent),) = node.samples_arrived().commit.effects
    assert isinstance(decode_work(intent), WriteRound)
    assert "its WriteRound on the processor's thread failed (disk busy)" in caplog.text


def test_no_bytes_allowed_runs_nothing_inline(tmp_path: Path) -> None:
    node = Node(tmp_path, max_bytes=0)
    ((_, intent),) = node.samples_arrived().commit.effects
    assert isinstance(decode_work(intent), WriteRound)
