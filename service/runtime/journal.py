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

    def write(
        self, rkey: str, records: Iterable[HistoryRecord], changed: Iterable[bool]
    ) -> None:
        """Count every record; log the applied ones and those that say something: at INFO
        when the transition changed the resource's view or said something, else at DEBUG
        (thousands of forwarded progress reports a second would otherwise cost more than
        applying them)."""
        for record, moved in zip(records, changed, strict=True):
            self._metrics.events.labels(type=record.event, outcome=record.outcome).inc()
            level = logging.INFO if moved or record.notes else logging.DEBUG
            if worth_keeping(record) and log.isEnabledFor(level):
                key = parse_rkey(rkey)
                log.log(
                    level,
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
