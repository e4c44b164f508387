"""`POST /sedna/workers/{worker}/info`: Sedna's worker library reports here, for every job
kind it reports for (lifelong learning, joint inference, federated learning; dispatched by
`ownerKind`); treated exactly like the MQTT worker topic, but answered at once (200, or 400
with the reason)."""

from __future__ import annotations

import msgspec

from service.adapters.redis_store import Ingress, States
from service.core import passthrough, reports
from service.core.effects import Reject
from service.core.events import OwnerReported, WorkerReported
from service.core.state import decode_state
from service.errors import InvalidMessage, StoreUnavailable
from service.keys import shard_of
from service.metrics import Metrics
from service.runtime.accept import accept_report, encode_accepted, target_of
from service.runtime.clock import Clock
from service.runtime.rejections import Rejections


class WorkerEndpoint:
    def __init__(
        self,
        *,
        states: States,
        ingress: Ingress,
        rejections: Rejections,
        clock: Clock,
        metrics: Metrics,
        volume_prefix: str = "",
    ) -> None:
        self._volume_prefix = volume_prefix
        self._states = states
        self._ingress = ingress
        self._rejections = rejections
        self._clock = clock
        self._metrics = metrics

    def report(self, worker: str, body: bytes) -> tuple[int, str]:
        """The HTTP status and message for one report; 503 while Redis is unreachable."""
        now_ms = self._clock.now_ms()
        topic = f"http:/sedna/workers/{worker}/info"
        try:
            accepted = accept_report(topic, worker, body, now_ms, channel="http")
            event = accepted.event
            assert isinstance(event, WorkerReported | OwnerReported)
            job = target_of(event)
            raw = self._states.load([job])[job]
            try:
                state = decode_state(raw) if raw else None
            except (msgspec.DecodeError, msgspec.ValidationError):
                reason = f"{job} is quarantined: its stored state cannot be decoded"
                raise InvalidMessage(reason, "$.ownerName", code="quarantined") from None
            refusal: Reject | None
            if isinstance(event, OwnerReported):
                refusal = passthrough.refusal(state, event)
            else:
                refusal = reports.refusal(state, event, self._volume_prefix)
            if refusal is not None:
                raise InvalidMessage(refusal.reason, "$.ownerName", code=refusal.code)
            self._ingress.append_ingress(shard_of(job), encode_accepted(accepted))
        except InvalidMessage as e:
            self._rejections.refuse(topic, e.code, e.detail, body, now_ms, publish=False)
            return 400, e.detail
        except StoreUnavailable:
            return 503, "state store unavailable; retry"
        self._metrics.events.labels(type="worker-reported", outcome="accepted").inc()
        return 200, "OK"
