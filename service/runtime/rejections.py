"""Refused messages: a log line, a counter by reason code, the dead-letter stream and the
errors topic, then the service carries on.

A flood of refusals must not become a flood of log lines: per reason code, the first
`LOG_BURST` of each `LOG_INTERVAL_S` are logged one by one and the rest are summed up in one
line, "N more like this", once the interval is over (`LogLimiter`); the counter, the
dead-letter stream and the errors topic still get every one."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, Protocol

from service import masking, wire
from service.adapters.mqtt import PublishTicket
from service.adapters.redis_store import Records
from service.errors import RejectCode, ServiceError, StoreUnavailable
from service.metrics import Metrics

log = logging.getLogger(__name__)

LOG_BURST = 5
LOG_INTERVAL_S = 10.0

#: The internal queues whose unreadable entries are set aside (`Rejections.unreadable`).
Queue = Literal["outbox", "gm-outbox", "effects"]


def rejection_record(topic: str, reason: str, payload: bytes, at_ms: int) -> bytes:
    """The encoded errors-topic record of a refused message (secrets masked)."""
    received = datetime.fromtimestamp(at_ms / 1000, UTC)
    return wire.encode(wire.make_rejection(topic, reason, payload, received))


class Publisher(Protocol):
    """An MQTT connection that publishes (QoS 1 completes on the broker's PUBACK)."""

    @property
    def connected(self) -> bool: ...

    def publish(
        self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False
    ) -> PublishTicket: ...

    def batch(self) -> AbstractContextManager[None]:
        """Publishes made inside go out together, at the end at the latest."""
        ...


@dataclass
class _Window:
    started_s: float
    seen: int = 0
    example: str = ""


class LogLimiter:
    """Which warnings of a kind (a reason code) are logged one by one: the first ``burst`` of
    each ``interval_s``, counted from the first of them; the others are counted and `flush`
    (or the next warning of the kind) logs how many there were once the interval is over."""

    def __init__(
        self,
        *,
        burst: int = LOG_BURST,
        interval_s: float = LOG_INTERVAL_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._burst = burst
        self._interval_s = interval_s
        self._monotonic = monotonic
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()

    def admit(self, kind: str, example: str) -> bool:
        """True when this warning of ``kind`` is to be logged now; ``example`` (an already
        loggable text) stands for it in the summary line otherwise."""
        now = self._monotonic()
        with self._lock:
            window = self._windows.get(kind)
            if window is not None and now - window.started_s >= self._interval_s:
                self._summarise(kind, window)
                window = None
            if window is None:
                window = self._windows[kind] = _Window(started_s=now)
            window.seen += 1
            if window.seen > self._burst:
                window.example = example
            return window.seen <= self._burst

    def flush(self) -> None:
        """Log the summary of every kind whose interval is over (called every second or so)."""
        now = self._monotonic()
        with self._lock:
            for kind, window in list(self._windows.items()):
                if now - window.started_s >= self._interval_s:
                    self._summarise(kind, window)
                    del self._windows[kind]

    def _summarise(self, kind: str, window: _Window) -> None:
        more = window.seen - self._burst
        if more > 0:
            log.warning("%d more like this (%s) in %.0fs, not logged one by one; the last: %s",
                        more, kind, self._interval_s, window.example,
                        extra={"outcome": "rejected", "suppressed": more})  # fmt: skip


class Rejections:
    """Records refusals; publishes them itself for the intake path (the processor's go out
    through the outbox, committed with the state)."""

    def __init__(
        self,
        *,
        dead_letters: Records,
        publisher: Publisher,
        errors_topic: str,
        metrics: Metrics,
    ) -> None:
        self._dead_letters = dead_letters
        self._publisher = publisher
        self._errors_topic = errors_topic
        self._metrics = metrics
        self._log = LogLimiter()

    def flush_log(self) -> None:
        """Log the "N more like this" lines that are due (`LogLimiter.flush`)."""
        self._log.flush()

    def refuse(
        self,
        topic: str,
        code: RejectCode,
        reason: str,
        payload: bytes,
        at_ms: int,
        *,
        publish: bool = True,
    ) -> None:
        """A message refused at the door; published on the errors topic unless ``publish`` is
        false (the HTTP endpoint answers its caller instead)."""
        record = rejection_record(topic, reason, payload, at_ms)
        self.recorded(topic, code, reason, record)
        if publish:
            try:
                self._publisher.publish(self._errors_topic, record)
            except ServiceError as e:
                self._warn("errors topic", "could not publish rejection: %s", e)

    def set_aside(self, topic: str, reason: str, payload: bytes, at_ms: int) -> None:
        """Dead-letter an ingress entry set aside by a quarantine (which logs and counts)."""
        try:
            self._dead_letters.dead_letter(rejection_record(topic, reason, payload, at_ms))
        except StoreUnavailable as e:
            self._warn("dead-letter stream", "dead-letter stream unavailable: %s", e)

    def unreadable(self, queue: Queue, where: str, reason: str, raw: bytes, at_ms: int) -> None:
        """An entry of an internal queue that cannot be decoded (``where`` names it: shard
        and id), taken out by the caller so the entries after it go on: a log line, a count
        by queue and the dead-letter stream (its record's topic is ``{queue} {where}``)."""
        log.warning("set aside an unreadable %s entry (%s): %s", queue, where, reason,
                    extra={"outcome": "set-aside"})  # fmt: skip
        self._metrics.set_aside.labels(queue=queue).inc()
        self.set_aside(f"{queue} {where}", reason, raw, at_ms)

    def recorded(self, topic: str, code: RejectCode, reason: str, record: bytes) -> None:
        """Log, count and dead-letter a rejection whose record is already built (its reason
        is logged masked, as the record holds it)."""
        masked = masking.mask(reason)
        self._metrics.rejections.labels(reason=code).inc()
        if self._log.admit(f"reason code {code}", f"on {topic}: {masked}"):
            log.warning("rejected message on %s: %s", topic, masked, extra={"outcome": "rejected"})
        try:
            self._dead_letters.dead_letter(record)
        except StoreUnavailable as e:
            self._warn("dead-letter stream", "dead-letter stream unavailable: %s", e)

    def _warn(self, kind: str, message: str, error: ServiceError) -> None:
        if self._log.admit(kind, message % error):
            log.warning(message, error)
