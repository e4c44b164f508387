"""What the service sends: job and dataset statuses in their upstream envelope, the
errors-topic record of a refused message, and a replica's presence.

These types are built by the code that sends them (never hand-built dicts), and the
schemas in `schemas/` are generated from them.
"""

import base64
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec

from service import masking
from service.wire.base import REJECTION_PAYLOAD_BYTES, Wire
from service.wire.fields import Count, JsonObject, ReportedStatus, WorkerKind, WorkerStatus
from service.wire.resources import Header

__all__ = [
    "DatasetStatus",
    "GateResult",
    "JobInput",
    "JobOutput",
    "JobStatus",
    "ModelRef",
    "Presence",
    "PresenceState",
    "Rejection",
    "ReportOutput",
    "ReportStatus",
    "RollbackResult",
    "UpstreamEnvelope",
    "make_rejection",
    "rfc3339_utc",
]


class ModelRef(Wire, frozen=True, kw_only=True):
    """A model handed to a worker as input; `devices`: the device SoC versions it runs on,
    when its worker or its Model named any."""

    format: str
    url: str
    devices: list[str] = []


class JobInput(Wire, frozen=True, kw_only=True):
    """What the next worker gets; note Sedna's capitals in `dataURL` and `dataIndexURL`.

    For a job with a deploy condition, once a model is deployed, an eval round's `models`
    ends with the deployed model (its own round's model file, of which the deploy file is a
    copy), which `deployedModel` names again: the eval worker reports the new model's result
    first and the deployed one's second.
    """

    models: list[ModelRef] = []
    data_url: str | None = msgspec.field(default=None, name="dataURL")
    data_index_url: str | None = msgspec.field(default=None, name="dataIndexURL")
    output_dir: str | None = None
    deployed_model: ModelRef | None = None


class JobOutput(Wire, frozen=True, kw_only=True):
    """A worker's results and owner info, forwarded upstream as reported."""

    models: list[dict[str, Any]]
    owner_info: JsonObject


class GateResult(Wire, frozen=True, kw_only=True):
    """What the deploy gate compared for round `version`: the condition, the value it read
    (absent when there was none: a metric missing or not finite, or nothing deployed to
    compare with) and whether it held; `deployedVersion`: the model compared with."""

    metric: str
    operator: str
    threshold: float
    value: float | None = None
    holds: bool
    version: Count
    deployed_version: Count | None = None


class RollbackResult(Wire, frozen=True, kw_only=True):
    """A rollback: the version whose model the deploy file holds again, and the one before."""

    to_version: Count
    from_version: Count | None = None


class JobStatus(Wire, frozen=True, kw_only=True):
    """Upstream job status: the phase entered or reported, and its status.

    `gate` comes with the deploy decision of a job with a deploy condition (status `ready`
    when the model was deployed, `completed` when the gate held it back: Sedna's
    incremental-learning LC says "nothing to deploy" so); `rollback` with a rollback's
    deploy `ready`.
    """

    phase: WorkerKind
    status: WorkerStatus
    reason: str | None = None
    input: JobInput | None = None
    output: JobOutput | None = None
    gate: GateResult | None = None
    rollback: RollbackResult | None = None


class ReportOutput(Wire, frozen=True, kw_only=True):
    """A forwarded report's output: the owner info as reported and, for a
    federated-learning job, the worker's results (`models`) as reported."""

    models: list[dict[str, Any]] | None = None
    owner_info: JsonObject


class ReportStatus(Wire, frozen=True, kw_only=True):
    """A worker report of a joint-inference service or a federated-learning job, forwarded
    upstream as Sedna's local controller forwards it: the worker's kind as `phase`, its
    status (empty when it gave none), its output. `reason` only says what was left out of
    a report too large to forward whole."""

    phase: WorkerKind
    status: ReportedStatus
    output: ReportOutput
    reason: str | None = None


class DatasetStatus(Wire, frozen=True, kw_only=True):
    """Upstream dataset status, sent whenever the sample count changes."""

    number_of_samples: Count


class UpstreamEnvelope(Wire, frozen=True, kw_only=True):
    """An upstream envelope (operation `status`); encoded only, never decoded."""

    header: Header
    content: JobStatus | DatasetStatus | ReportStatus


class Rejection(Wire, frozen=True, kw_only=True):
    """Published on the errors topic for every message the service refuses."""

    topic: str
    reason: str
    payload: str  # base64 of the first 4 KiB of the refused message
    received_at: str


PresenceState = Literal["online", "offline"]


class Presence(Wire, frozen=True, kw_only=True):
    """A replica's retained presence (its last will says offline)."""

    replica: str
    state: PresenceState
    since: str


def rfc3339_utc(moment: datetime) -> str:
    """`2024-05-01T12:00:00.000Z`; a naive datetime is taken to be UTC already."""
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return aware.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def make_rejection(topic: str, reason: str, payload: bytes, received_at: datetime) -> Rejection:
    """The errors-topic record of a refused message (first 4 KiB of it, base64).

    Credentials are masked by structure (`service.masking`) in the first 4 KiB, cut off or
    not, and in the reason; the masked text is cut to 4 KiB again (masking may lengthen it),
    which can only drop masked text: a refused resource never carries its credential onto
    the errors topic, the dead-letter stream or a log line.
    """
    head = masking.mask_bytes(bytes(payload[:REJECTION_PAYLOAD_BYTES]))
    return Rejection(
        topic=topic,
        reason=masking.mask(reason),
        payload=base64.b64encode(head[:REJECTION_PAYLOAD_BYTES]).decode("ascii"),
        received_at=rfc3339_utc(received_at),
    )
