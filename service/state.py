"""States, events and effects of the pure core: small frozen typed values.

Everything here is plain data: msgspec Structs that serialise to msgpack for Redis (state,
ingress events, effect intents). Events and effects are tagged unions so one decoder reads
any of them back.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from service.samples import Ranges
from service.triggers import TriggerSpec

Phase = Literal["train", "eval", "deploy"]
#: waiting: trigger armed, no worker; preparing: round data being written; running: a worker
#: was told "ready" and is outstanding; copying: the deploy copy is in flight.
Step = Literal["waiting", "preparing", "running", "copying"]
WorkerKind = Literal["train", "eval", "deploy", "inference"]
WorkerStatus = Literal["ready", "running", "completed", "failed"]


class ModelRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    format: str
    url: str


# ---------------------------------------------------------------- resources' interpreted specs
class JobSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the lifecycle reads of a LifelongLearningJob (templates are stored, not read)."""

    dataset: str
    train_prob: float
    trigger: TriggerSpec = TriggerSpec()
    output_dir: str


class DatasetInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a job knows of its dataset; `present` false means deleted: the job pauses."""

    url: str
    format: str
    present: bool = True


# ---------------------------------------------------------------- states
class JobState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="job"):
    namespace: str
    name: str
    spec: JobSpec
    digest: str
    phase: Phase = "train"
    step: Step = "waiting"
    version: int = 0
    taken: int = 0
    pending: Ranges = ()
    round: Ranges = ()
    eval_batches: Ranges = ()
    train_models: tuple[ModelRef, ...] = ()
    eval_models: tuple[ModelRef, ...] = ()
    dataset: DatasetInfo | None = None
    shrunk: bool = False
    next_check_ms: int | None = None
    last_error: str | None = None
    #: when the job entered its current (phase, step), set by `transition`; 0: not known
    #: (a state written before this field existed)
    phase_since_ms: int = 0


class DatasetState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="dataset"):
    namespace: str
    name: str
    url: str
    format: str
    digest: str
    num_samples: int = -1
    cursor: bytes = b""
    polling: bool = False


State = JobState | DatasetState


# ---------------------------------------------------------------- events
class JobApplied(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="job-applied"):
    namespace: str
    name: str
    spec: JobSpec
    digest: str


class JobDeleted(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="job-deleted"):
    namespace: str
    name: str


class DatasetApplied(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="dataset-applied"
):
    namespace: str
    name: str
    url: str
    format: str
    digest: str


class DatasetDeleted(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="dataset-deleted"
):
    namespace: str
    name: str


class DatasetPolled(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="dataset-polled"
):
    """A poll's result: the sample count and the reader's opaque cursor, or why it failed."""

    namespace: str
    name: str
    url: str
    num_samples: int = 0
    cursor: bytes = b""
    error: str | None = None


class DatasetChanged(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="dataset-changed"
):
    """Sent to each job of a dataset: its location, and its sample count when known."""

    namespace: str
    name: str
    dataset: str
    info: DatasetInfo
    num_samples: int | None = None


class WorkerReported(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="worker-reported"
):
    namespace: str
    name: str  # the owning job
    worker: str
    kind: WorkerKind
    status: WorkerStatus
    models: tuple[ModelRef, ...] = ()
    results: tuple[dict[str, Any], ...] = ()
    owner_info: dict[str, Any] = {}
    unusable: str | None = None  # why results held no usable model (set by the decoder)


class Tick(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="tick"):
    """A durable timer came due for the resource (trigger check or dataset poll)."""

    kind: Literal["job", "dataset"]
    namespace: str
    name: str
    due_ms: int


class RoundWritten(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="round-written"
):
    namespace: str
    name: str
    phase: Literal["train", "eval"]
    version: int
    error: str | None = None


class ModelCopied(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="model-copied"
):
    namespace: str
    name: str
    version: int
    error: str | None = None


Event = (
    JobApplied
    | JobDeleted
    | DatasetApplied
    | DatasetDeleted
    | DatasetPolled
    | DatasetChanged
    | WorkerReported
    | Tick
    | RoundWritten
    | ModelCopied
)


# ---------------------------------------------------------------- effects
class Publish(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="publish"):
    """An upstream status message; `id` is stable, so receivers can drop duplicates."""

    id: str
    kind: Literal["lifelonglearningjob", "dataset"]
    namespace: str
    name: str
    content: dict[str, Any]


class Reject(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="reject"):
    """The event is refused; the runtime sends a Rejection to the errors topic."""

    reason: str


class Note(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="note"):
    """The event changed nothing, or something worth a log line happened; `reason` says what."""

    reason: str


class ScheduleCheck(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="schedule"):
    due_ms: int


class WriteRound(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="write-round"):
    """Stream the round's sample ranges from the dataset into the round's data files."""

    id: str
    namespace: str
    name: str
    phase: Literal["train", "eval"]
    version: int
    dataset: str  # the dataset's name (for its credential)
    source_url: str  # disk path or s3 URL of the dataset
    format: str
    ranges: Ranges
    data_url: str  # disk path or s3 URL
    index_url: str | None = None
    index_prefix: str | None = None


class CopyModel(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="copy-model"):
    """Replace the deploy target whole with the model's file."""

    id: str
    namespace: str
    name: str
    version: int
    src_url: str
    dst_url: str


class PollDataset(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="poll-dataset"
):
    id: str
    namespace: str
    name: str
    url: str  # disk path or s3 URL
    format: str
    cursor: bytes = b""


class NotifyJobs(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="notify-jobs"):
    """Fan a dataset change out to every job using the dataset."""

    id: str
    namespace: str
    dataset: str
    info: DatasetInfo
    num_samples: int | None = None


class AttachDataset(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="attach-dataset"
):
    """Register the job as a user of its dataset and send it the dataset's current state."""

    id: str
    namespace: str
    name: str
    dataset: str


class DetachDataset(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="detach-dataset"
):
    id: str
    namespace: str
    name: str
    dataset: str


Effect = (
    Publish
    | Reject
    | Note
    | ScheduleCheck
    | WriteRound
    | CopyModel
    | PollDataset
    | NotifyJobs
    | AttachDataset
    | DetachDataset
)
#: Effects that do I/O in the background and report back as events.
Work = WriteRound | CopyModel | PollDataset | NotifyJobs | AttachDataset | DetachDataset


class Context(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Everything from outside a transition may depend on: time, ids and settings."""

    now_ms: int
    minute_of_day: int  # local time, for timer windows
    event_id: str  # unique per event; effect ids derive from it
    volume_prefix: str = ""
    dataset_poll_ms: int = 60_000


class Outcome(msgspec.Struct, frozen=True):
    state: State | None
    effects: tuple[Effect, ...] = ()


def job_key(namespace: str, name: str) -> str:
    return f"job:{namespace}/{name}"


def dataset_key(namespace: str, name: str) -> str:
    return f"dataset:{namespace}/{name}"


_state_encoder = msgspec.msgpack.Encoder()
_state_decoder = msgspec.msgpack.Decoder(State)
_event_decoder = msgspec.msgpack.Decoder(Event)
_work_decoder = msgspec.msgpack.Decoder(Work)


def encode(value: State | Event | Effect) -> bytes:
    return _state_encoder.encode(value)


def decode_state(data: bytes) -> State:
    return _state_decoder.decode(data)


def decode_event(data: bytes) -> Event:
    return _event_decoder.decode(data)


def decode_work(data: bytes) -> Work:
    return _work_decoder.decode(data)
