"""Refused messages: a log line, a counter by reason code, the dead-letter stream and the
errors topic, then the service carries on."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Literal

from service import masking, messages
from service.errors import RejectCode, ServiceError, StoreUnavailable
from service.metrics import Metrics
from service.runtime.ports import DeadLetters, Publisher

log = logging.getLogger(__name__)

#: The internal queues whose unreadable entries are set aside (`Rejections.unreadable`).
Queue = Literal["outbox", "gm-outbox", "effects"]


def rejection_record(topic: str, reason: str, payload: bytes, at_ms: int) -> bytes:
    """The encoded errors-topic record of a refused message (secrets masked)."""
    received = datetime.fromtimestamp(at_ms / 1000, UTC)
    return messages.encode(messages.make_rejection(topic, reason, payload, received))


class Rejections:
    """Records refusals; publishes them itself for the intake path (the processor's go out
    through the outbox, committed with the state)."""

    def __init__(
        self,
        *,
        dead_letters: DeadLetters,
        publisher: Publisher,
        errors_topic: str,
        metrics: Metrics,
    ) -> None:
        self._dead_letters = dead_letters
        self._publisher = publisher
        self._errors_topic = errors_topic
        self._metrics = metrics

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
                log.warning("could not publish rejection: %s", e)

    def set_aside(self, topic: str, reason: str, payload: bytes, at_ms: int) -> None:
        """Dead-letter an ingress entry set aside by a quarantine (which logs and counts)."""
        try:
            self._dead_letters.dead_letter(rejection_record(topic, reason, payload, at_ms))
        except StoreUnavailable as e:
            log.warning("dead-letter stream unavailable: %s", e)

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
        log.warning("rejected message on %s: %s", topic, masked, extra={"outcome": "rejected"})
        self._metrics.rejections.labels(reason=code).inc()
        try:
            self._dead_letters.dead_letter(record)
        except StoreUnavailable as e:
            log.warning("dead-letter stream unavailable: %s", e)
