"""What the metrics say about datasets: how many samples each holds and which cannot be read
now, for the datasets of the shards this replica holds (a shard's next owner takes over its
gauges), and a count of every report of an unreadable dataset."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Sequence

from service.core.effects import DatasetUnreadable
from service.core.state import DatasetState, State
from service.keys import parse_rkey, shard_of
from service.metrics import Metrics

log = logging.getLogger(__name__)


class DatasetHealth:
    """Follows committed dataset states into gauges; used by the processor's thread only."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._shown: dict[str, tuple[str, str]] = {}  # dataset rkey -> (namespace, name)

    def committed(
        self, rkey: str, state: State | None, unreadable: Sequence[DatasetUnreadable]
    ) -> None:
        """A commit of `rkey` applied, leaving `state` (None: deleted)."""
        for report in unreadable:
            log.warning(
                "dataset %s/%s cannot be read: %s",
                report.namespace,
                report.name,
                report.reason,
                extra={"dataset": f"{report.namespace}/{report.name}"},
            )
            labels = {"namespace": report.namespace, "name": report.name}
            self._metrics.dataset_unreadable_reports.labels(**labels).inc()
        if parse_rkey(rkey).kind != "dataset":
            return
        if not isinstance(state, DatasetState):
            self._forget(rkey)
            return
        labels = {"namespace": state.namespace, "name": state.name}
        self._shown[rkey] = (state.namespace, state.name)
        if state.num_samples >= 0:
            self._metrics.dataset_samples.labels(**labels).set(state.num_samples)
        if state.unreadable is not None:
            self._metrics.dataset_unreadable.labels(**labels).set(1)
        else:
            with contextlib.suppress(KeyError):
                self._metrics.dataset_unreadable.remove(state.namespace, state.name)

    def keep_only(self, shards: Collection[int]) -> None:
        """Drop the gauges of datasets on shards no longer held."""
        for rkey in [r for r in self._shown if shard_of(r) not in shards]:
            self._forget(rkey)

    def _forget(self, rkey: str) -> None:
        """Remove the dataset's series, whether or not this replica showed them (a shard's
        first commit here may be the dataset's deletion)."""
        self._shown.pop(rkey, None)
        key = parse_rkey(rkey)
        for gauge in (self._metrics.dataset_samples, self._metrics.dataset_unreadable):
            with contextlib.suppress(KeyError):
                gauge.remove(key.namespace, key.name)
