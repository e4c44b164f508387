"""The states of jobs and datasets: small frozen typed values, stored in Redis as msgpack."""

from __future__ import annotations

from typing import Literal

import msgspec

from service.core.gate import GateSpec
from service.core.rounds import Deployment, RoundRecord, Scores
from service.core.samples import Ranges
from service.core.triggers import TriggerSpec
from service.messages import ModelRef

Phase = Literal["train", "eval", "deploy"]
#: waiting: trigger armed, no worker (in deploy: the deploy copy waits for a rollback's copy
#: to finish); preparing: round data being written; running: a worker was told "ready" and
#: is outstanding; copying: the deploy copy is in flight.
Step = Literal["waiting", "preparing", "running", "copying"]
#: The phases that write round data and wait for a worker.
RoundPhase = Literal["train", "eval"]

__all__ = [
    "DatasetInfo",
    "DatasetState",
    "JobSpec",
    "JobState",
    "ModelRef",
    "Phase",
    "RoundPhase",
    "State",
    "Step",
    "decode_state",
    "encode_state",
]


class JobSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the lifecycle reads of a LifelongLearningJob (templates are stored, not read)."""

    dataset: str
    train_prob: float
    trigger: TriggerSpec = TriggerSpec()
    output_dir: str
    #: `deploySpec.trigger.condition`; None: every evaluated model is deployed
    gate: GateSpec | None = None


class DatasetInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a job knows of its dataset; `present` false means deleted: the job pauses."""

    url: str
    format: str
    present: bool = True


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
    #: when the job entered its (phase, step), ms; 0: unknown (a state from before this field)
    phase_since_ms: int = 0
    #: rounds failed in a row (reset by a completed deploy); each waits longer to retry
    consecutive_failures: int = 0
    #: no round starts before this time after a failure (None: no failure waiting)
    retry_at_ms: int | None = None
    #: the round under way, as its history record will say (None between rounds)
    current: RoundRecord | None = None
    #: the round's train samples once trained, until its deploy decision: a model the
    #: deploy gate holds back gives them back to the pending set
    trained: Ranges = ()
    #: how many pending samples (at the front) came back from a held-back round: the next
    #: round trains on them too, but only samples that arrived since count for its trigger
    returned: int = 0
    #: the model the deploy file holds, as this controller last copied it there
    deployed: Deployment | None = None
    #: the models it held before, newest last: what a rollback can restore
    deployments: tuple[Deployment, ...] = ()
    #: the rollback whose copy is in flight: the deployment it restores
    rollback: Deployment | None = None
    #: the latest eval's metrics, for the new model and the deployed one
    scores: Scores | None = None


class DatasetState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="dataset"):
    namespace: str
    name: str
    url: str
    format: str
    digest: str
    num_samples: int = -1
    cursor: bytes = b""
    polling: bool = False
    #: why the source cannot be read now (missing, permission, S3 403/404); None: it can
    unreadable: str | None = None


State = JobState | DatasetState

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(State)


def encode_state(state: State) -> bytes:
    return _encoder.encode(state)


def decode_state(data: bytes) -> State:
    return _decoder.decode(data)
