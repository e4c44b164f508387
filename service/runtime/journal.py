"""Every transition leaves a trace: a counter by event type and verdict, and a log line for
those worth one (the same records the commit stored as the resource's history). A dataset's
sample gauge is `DatasetHealth`'s, which also removes it."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from service.history import HistoryRecord, worth_keeping
from service.keys import parse_rkey
from service.metrics import Metrics

log = logging.getLogger(__name__)


class Journal:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def write(self, rkey: str, records: Iterable[HistoryRecord]) -> None:
        for record in records:
            self._metrics.events.labels(type=record.event, outcome=record.outcome).inc()
            if worth_keeping(record):
                key = parse_rkey(rkey)
                log.info(
                    "%s %s -> %s%s",
                    record.event,
                    record.outcome,
                    _view(record),
                    ("; " + "; ".join(record.notes)) if record.notes else "",
                    extra={key.kind: key.path, "event": record.event, "outcome": record.outcome},
                )


def _view(record: HistoryRecord) -> str:
    fields = {
        "phase": record.phase,
        "step": record.step,
        "version": record.version,
        "samples": record.samples,
    }
    return " ".join(f"{name}={value}" for name, value in fields.items() if value is not None)
