"""What a job remembers of its rounds: one record per round (and per rollback), the models it
deployed, and the latest eval's metrics. Plain values; the lifecycle fills them in.

A round's record is built in the job's state while the round runs and handed to the history
(a capped per-job list written in the same commit) when it ends: deployed, held back by the
deploy gate, or failed. A rollback gets a record of its own.
"""


from typing import Literal

import msgspec

from service.core.gate import Metrics
from service.wire import GateResult, ModelRef

#: Rounds (and rollbacks) a job's history keeps, newest last.
ROUNDS_KEPT = 50
#: Earlier deployments a job keeps to roll back to, newest last.
DEPLOYMENTS_KEPT = 10

RoundOutcome = Literal["running", "deployed", "held_back", "failed", "rolled_back", "refused"]
RoundKind = Literal["round", "rollback"]


class RoundRecord(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"
):
    """One round, or one rollback (`kind`), as `describe job` shows it.

    Each phase runs from its `..._started_ms` to the next phase's start, the last one to
    `ended_ms`; a phase never reached has no start. `candidate` and `deployed` are the
    metrics the eval reported for the new model and for the model deployed at the time
    (`deployed_version`; for a rollback, the version rolled back from); `gate` what the
    deploy gate compared; `reason` why a round was not deployed, or how the gate judged one
    that was.
    """

    version: int
    kind: RoundKind = "round"
    outcome: RoundOutcome = "running"
    train_started_ms: int | None = None
    eval_started_ms: int | None = None
    deploy_started_ms: int | None = None
    ended_ms: int | None = None
    train_samples: int = 0
    eval_samples: int = 0
    candidate: Metrics = {}
    deployed: Metrics = {}
    deployed_version: int | None = None
    gate: GateResult | None = None
    reason: str | None = None


class ModelDigest(msgspec.Struct, frozen=True, kw_only=True):
    """What the deploy copy read of a model: its size in bytes and its SHA-256 (hex)."""

    size: int
    sha256: str

    def describe(self) -> str:
        return f"{self.size} bytes, sha256 {self.sha256}"


class Deployment(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A model that was copied to the deploy file: its round, its file, what the copy read of
    it (`digest`: a rollback copies it back only while its file still matches; None for a
    deployment recorded before digests were), and the metrics the eval reported for it in
    that round."""

    version: int
    model: ModelRef
    metrics: Metrics = {}
    at_ms: int = 0
    digest: ModelDigest | None = None


class Scores(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The latest eval's metrics: the new model's (round `version`) and, when the report had
    a second result, the deployed model's (`deployed_version`)."""

    version: int
    candidate: Metrics = {}
    deployed: Metrics = {}
    deployed_version: int | None = None


def remember(previous: tuple[Deployment, ...], old: Deployment | None, new_version: int) -> (
    tuple[Deployment, ...]
):
    """The deployments to roll back to once `new_version` replaces `old`: `old` joins them
    (newest last), `new_version` leaves them, each version once, at most DEPLOYMENTS_KEPT."""
    kept = [d for d in previous if d.version != new_version]
    if old is not None:
        kept = [d for d in kept if d.version != old.version] + [old]
    return tuple(kept[-DEPLOYMENTS_KEPT:])


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(RoundRecord)


def encode_round(record: RoundRecord) -> bytes:
    return _encoder.encode(record)


def decode_rounds(stored: list[bytes]) -> list[RoundRecord]:
    """Stored records in order; unreadable ones (from another version) are skipped."""
    records = []
    for data in stored:
        try:
            records.append(_decoder.decode(data))
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
    return records
