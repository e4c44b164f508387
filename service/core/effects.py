"""Effects a transition asks for, as data, and the frame of every transition: what it takes
from outside (`Context`), the `Recorder` its handlers write effects to, and what it gives
back (`Outcome`).

Effects are messages to publish, refusals, notes, timers, and work that does I/O in the
background and reports back as an event. Work items are stored as msgpack intents in Redis
until done; `Publish`, `Forward`, `Reject`, `Refused`, `DatasetUnreadable`, `RecordRound`,
`Note` and `ScheduleCheck` are folded into the transition's commit and never stored on their
own.
"""


from typing import Literal

import msgspec

from service.core.rounds import ModelDigest, RoundRecord
from service.core.samples import Ranges
from service.core.state import Codec, DatasetInfo, RoundPhase, State
from service.errors import RejectCode
from service.wire import DatasetStatus, IncrementalSpec, JobStatus, ReportStatus

#: The job statuses Sedna's GM takes in as conditions (it refuses others with an error log).
GM_STATUSES = frozenset({"ready", "completed", "failed", "waiting"})
GM_PHASES = frozenset({"train", "eval", "deploy"})


def gm_accepts(status: JobStatus | DatasetStatus) -> bool:
    """Whether Sedna's GM takes this status in: dataset statuses, and job statuses ready,
    completed, failed and waiting of the train, eval and deploy phases."""
    if isinstance(status, DatasetStatus):
        return True
    return status.phase in GM_PHASES and status.status.lower() in GM_STATUSES


class _Effect(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What every effect shares: an immutable, keyword-only value, tagged in its union."""


class _Addressed(_Effect, frozen=True, kw_only=True):
    """An effect on one resource (`namespace`/`name`); `id` is stable (derived from the
    event's), so a receiver or a re-run can tell a duplicate."""

    id: str
    namespace: str
    name: str


class _DatasetUse(_Addressed, frozen=True, kw_only=True):
    """The job `namespace`/`name`'s use of its dataset `dataset` begins or ends."""

    dataset: str


class Publish(_Addressed, frozen=True, kw_only=True, tag="publish"):
    """An upstream status message of the resource; `id` is stable, so receivers can drop
    duplicates; `to_gm`: Sedna's GM gets it too (when there is a GM link), else only the
    MQTT upstream topic does. Never decoded: `status` is one of two untagged wire types."""

    status: JobStatus | DatasetStatus
    to_gm: bool = True
    #: the resource's kind as the envelope names it (empty: its resource key's: a dataset's,
    #: a lifelong-learning job's)
    resource_kind: str = ""


class Forward(_Addressed, frozen=True, kw_only=True, tag="forward"):
    """A worker report of a stored resource (a joint-inference service, a federated-learning
    job), forwarded upstream under the resource's kind; `id` is stable like a `Publish`'s."""

    status: ReportStatus


class Reject(_Effect, frozen=True, kw_only=True, tag="reject"):
    """The event is refused: `code` labels the metric, `reason` goes to the errors topic."""

    code: RejectCode
    reason: str


class DatasetUnreadable(_Effect, frozen=True, kw_only=True, tag="dataset-unreadable"):
    """The dataset's source cannot be read, newly or for a new reason: said once on the errors
    topic (not on every poll) and counted. Nothing was refused: the event applied."""

    namespace: str
    name: str
    url: str
    reason: str


class Refused(_Effect, frozen=True, kw_only=True, tag="refused"):
    """A request the job took in turned out impossible later (a rollback whose model file is
    gone): said on the errors topic like a refusal, `subject` standing for its payload."""

    code: RejectCode
    reason: str
    subject: str


class RecordRound(_Effect, frozen=True, kw_only=True, tag="record-round"):
    """A round (or a rollback) ended: its record joins the job's round history."""

    record: RoundRecord


class Note(_Effect, frozen=True, kw_only=True, tag="note"):
    """The event changed nothing, or something worth a log line happened; `reason` says what."""

    reason: str


class ScheduleCheck(_Effect, frozen=True, kw_only=True, tag="schedule"):
    due_ms: int


class WriteRound(_Addressed, frozen=True, kw_only=True, tag="write-round"):
    """Stream the round's sample ranges from the dataset into the round's data files; for an
    incremental-learning job, also look up the Models of `models` the round needs (the
    initial model for a train round, the compared and deploy models for an eval round; they
    come back with `RoundWritten.models`; one missing fails the round)."""

    phase: RoundPhase
    version: int
    dataset: str  # the dataset's name (for its credential)
    source_url: str  # disk path or s3 URL of the dataset
    format: str
    ranges: Ranges
    data_url: str  # disk path or s3 URL
    index_url: str | None = None
    index_prefix: str | None = None
    #: versions whose data files stay however old they are: the deployed round's and those
    #: a rollback can restore
    keep: tuple[int, ...] = ()
    models: IncrementalSpec | None = None
    #: directories the job's next steps write into, made once this round's files are
    #: written (`training.made_ahead`)
    ahead: tuple[str, ...] = ()


class HotUpdate(msgspec.Struct, frozen=True, kw_only=True):
    """Where an inference worker with hot update finds its model: the model is copied to
    `model_file` (beside its config file), then the config file `config` is rewritten whole
    to name it as the worker's container sees it (`model_path`) with the time of the
    update, which the worker's next poll picks up (disk paths: volume prefix added)."""

    config: str
    model_file: str
    model_path: str


class CopyModel(_Addressed, frozen=True, kw_only=True, tag="copy-model"):
    """Replace the deploy target whole with the model's file (round `version`'s model; for a
    rollback, `rollback` is set, and `expect` is what the copy read of that file when it was
    deployed: a file that no longer matches is refused and the target left as it is). The
    source must lie in `output_dir` (the job's, as on disk; empty in a copy queued before
    the field: the deploy target's). `hot_update`: the inference worker is told too."""

    version: int
    src_url: str
    dst_url: str
    rollback: bool = False
    expect: ModelDigest | None = None
    output_dir: str = ""
    hot_update: HotUpdate | None = None


class PollDataset(_Addressed, frozen=True, kw_only=True, tag="poll-dataset"):
    url: str  # disk path or s3 URL
    format: str
    cursor: bytes = b""


class NotifyJobs(_Effect, frozen=True, kw_only=True, tag="notify-jobs"):
    """Fan a dataset change out to every job using the dataset."""

    id: str
    namespace: str
    dataset: str
    info: DatasetInfo
    num_samples: int | None = None


class AttachDataset(_DatasetUse, frozen=True, kw_only=True, tag="attach-dataset"):
    """Register the job as a user of its dataset and send it the dataset's current state."""


class DetachDataset(_DatasetUse, frozen=True, kw_only=True, tag="detach-dataset"):
    """The job no longer uses its dataset: it is told of its changes no more."""


class ReleaseOutputDir(_Addressed, frozen=True, kw_only=True, tag="release-output-dir"):
    """The job no longer writes to `output_dir` (as it lies on disk: `paths.claim_dir`):
    give up its claim on it (if still its)."""

    output_dir: str


#: Effects that do I/O in the background and report back as events.
Work = (
    WriteRound
    | CopyModel
    | PollDataset
    | NotifyJobs
    | AttachDataset
    | DetachDataset
    | ReleaseOutputDir
)
Effect = (
    Publish
    | Forward
    | Reject
    | Refused
    | DatasetUnreadable
    | RecordRound
    | Note
    | ScheduleCheck
    | Work
)

_works: Codec[Work] = Codec(Work)
encode_work = _works.encode
decode_work = _works.decode


# ================================================================= the transition's frame
#: applied: the event changed the resource or made it say something; ignored: it changed
#: nothing but bookkeeping; rejected: it was refused (a `Reject` effect says why).
Verdict = Literal["applied", "ignored", "rejected"]


class Context(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Everything from outside a transition may depend on: time, ids and settings."""

    now_ms: int
    minute_of_day: int  # local time, for timer windows
    event_id: str  # unique per event; effect ids derive from it
    volume_prefix: str = ""
    dataset_poll_ms: int = 60_000
    #: how long a ready sent to Sedna's GM may go unseen before it is sent again
    gm_resend_ms: int = 30_000
    #: a move the lifecycle table does not declare raises (tests) instead of being refused
    strict: bool = False


class Outcome(msgspec.Struct, frozen=True):
    """The next state (None: the resource is gone), the effects, and the verdict."""

    state: State | None
    effects: tuple[Effect, ...] = ()
    verdict: Verdict = "applied"

    @property
    def rejection(self) -> Reject | None:
        return next((e for e in self.effects if isinstance(e, Reject)), None)

    @property
    def notes(self) -> tuple[str, ...]:
        """What the transition said: its notes and refusals, in order."""
        return tuple(e.reason for e in self.effects if isinstance(e, Note | Reject))


class Recorder:
    """Collects the effects of one transition and numbers their ids from the event's id."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.effects: list[Effect] = []

    def next_id(self) -> str:
        return f"{self.ctx.event_id}/{len(self.effects)}"

    def add(self, effect: Effect) -> None:
        self.effects.append(effect)

    def note(self, reason: str) -> None:
        self.add(Note(reason=reason))

    def publish(
        self,
        namespace: str,
        name: str,
        status: JobStatus | DatasetStatus,
        *,
        to_gm: bool = True,
        resource_kind: str = "",
    ) -> None:
        """An upstream status; Sedna's GM gets it too when it accepts it and `to_gm`."""
        publish = Publish(
            id=self.next_id(), namespace=namespace, name=name, status=status,
            to_gm=to_gm and gm_accepts(status), resource_kind=resource_kind,
        )  # fmt: skip
        self.add(publish)

    def schedule(self, due_ms: int) -> None:
        self.add(ScheduleCheck(due_ms=due_ms))
