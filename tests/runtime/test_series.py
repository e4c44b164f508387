"""Dataset series have one owner, `DatasetHealth`, which removes them with the dataset or
its shard, whatever the order of what one commit did."""

from __future__ import annotations

from service.core.state import DatasetState
from service.history import HistoryRecord
from service.keys import dataset_key, shard_of
from service.metrics import Metrics
from service.runtime.processor import DatasetHealth, Journal

RKEY = dataset_key("default", "ds")
STATE = DatasetState(
    namespace="default", name="ds", url="/d.txt", format="txt", digest="d", num_samples=10
)


def series(metrics: Metrics) -> list[str]:
    text = metrics.render()[0].decode()
    return [line for line in text.splitlines() if line.startswith("lifelong_dataset_samples{")]


def test_a_dataset_polled_and_deleted_in_one_commit_leaves_no_series() -> None:
    """The commit's records count samples, its final state is gone: no series stays."""
    metrics = Metrics()
    records = [
        HistoryRecord(at_ms=1, event="DatasetPolled", outcome="applied", samples=10),
        HistoryRecord(at_ms=2, event="DatasetDeleted", outcome="applied"),
    ]
    Journal(metrics).write(RKEY, records, [True, True])
    DatasetHealth(metrics).committed(RKEY, None, ())
    assert series(metrics) == []


def test_a_lost_shard_takes_its_datasets_series() -> None:
    metrics = Metrics()
    health = DatasetHealth(metrics)
    health.committed(RKEY, STATE, ())
    assert series(metrics) == ['lifelong_dataset_samples{name="ds",namespace="default"} 10.0']
    health.keep_only({shard_of(RKEY)})
    assert len(series(metrics)) == 1
    health.keep_only({(shard_of(RKEY) + 1) % 16})
    assert series(metrics) == []
