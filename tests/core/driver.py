"""A pure, in-memory driver of the core for unit tests: no servers, no I/O.

It applies events through `transition`, records every effect, and can play the part of the
effect executor (answering WriteRound / CopyModel with their result events).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from service.core.effects import Context, CopyModel, Effect, Note, Publish, WriteRound
from service.core.events import (
    DatasetChanged,
    Event,
    JobApplied,
    ModelCopied,
    RoundWritten,
    Tick,
    WorkerReported,
)
from service.core.lifecycle import transition
from service.core.rounds import ModelDigest
from service.core.state import DatasetInfo, JobModels, JobState, ModelInfo, State
from service.wire import IncrementalSpec, JobSpec, Trigger

NS = "default"
JOB = "job-a"
DATASET = "ds"


def spec(
    *,
    train_prob: float = 0.8,
    trigger: Trigger | None = None,
    output_dir: str = "/output",
    dataset: str = DATASET,
    incremental: IncrementalSpec | None = None,
) -> JobSpec:
    return JobSpec(
        dataset=dataset,
        train_prob=train_prob,
        trigger=trigger or Trigger(),
        output_dir=output_dir,
        incremental=incremental,
    )


#: An incremental-learning job's Models: initial and deploy, in format pkl.
INCREMENTAL = IncrementalSpec(initial_model="initial", deploy_model="deployed")
MODELS = JobModels(
    initial=ModelInfo(url="/models/initial.pkl", format="pkl"),
    compared=ModelInfo(url="/models/deployed.pkl", format="pkl"),
    deploy=ModelInfo(url="/models/deployed.pkl", format="pkl"),
)


def info(url: str = "/data/train.txt", fmt: str = "txt", present: bool = True) -> DatasetInfo:
    return DatasetInfo(url=url, format=fmt, present=present)


def report(
    kind: str,
    status: str,
    *urls: str,
    results: list[dict[str, Any]] | None = None,
    owner: str = "lifelonglearningjob",
) -> WorkerReported:
    raw = results if results is not None else [{"format": "pkl", "url": url} for url in urls]
    return WorkerReported(
        namespace=NS,
        name=JOB,
        worker=f"{JOB}-{kind}-pod",  # a name without a round: bound by stage
        kind=kind,  # type: ignore[arg-type]
        status=status,  # type: ignore[arg-type]
        results=tuple(raw),
        owner=owner,  # type: ignore[arg-type]
    )


@dataclass
class Driver:
    state: State | None = None
    now_ms: int = 1_000_000
    minute: int = 12 * 60
    prefix: str = ""
    effects: list[Effect] = field(default_factory=list)
    seq: int = 0

    def ctx(self) -> Context:
        self.seq += 1
        return Context(
            now_ms=self.now_ms,
            minute_of_day=self.minute,
            event_id=f"e{self.seq}",
            volume_prefix=self.prefix,
            strict=True,
        )

    def apply(self, event: Event) -> tuple[Effect, ...]:
        outcome = transition(self.state, event, self.ctx())
        self.state = outcome.state
        self.effects.extend(outcome.effects)
        return outcome.effects

    @property
    def job(self) -> JobState:
        assert isinstance(self.state, JobState)
        return self.state

    # ------------------------------------------------------------ scenario steps
    def create(self, job_spec: JobSpec | None = None, digest: str = "d1") -> None:
        self.apply(JobApplied(namespace=NS, name=JOB, spec=job_spec or spec(), digest=digest))

    def dataset(self, n: int | None, ds: DatasetInfo | None = None) -> tuple[Effect, ...]:
        return self.apply(
            DatasetChanged(
                namespace=NS, name=JOB, dataset=DATASET, info=ds or info(), num_samples=n
            )
        )

    def tick(self) -> tuple[Effect, ...]:
        return self.apply(Tick(kind="job", namespace=NS, name=JOB, due_ms=self.now_ms))

    def written(
        self, phase: str, error: str | None = None, models: JobModels | None = None
    ) -> tuple[Effect, ...]:
        """The round's data is written; an incremental-learning job's round brings the
        Models it needs (of `MODELS`, unless given)."""
        if models is None and self.job.spec.incremental is not None:
            models = (
                JobModels(initial=MODELS.initial)
                if phase == "train"
                else JobModels(compared=MODELS.compared, deploy=MODELS.deploy)
            )
        return self.apply(
            RoundWritten(
                namespace=NS,
                name=JOB,
                phase=phase,  # type: ignore[arg-type]
                version=self.job.version,
                error=error,
                models=None if error else models,
            )
        )

    def copied(self, error: str | None = None) -> tuple[Effect, ...]:
        """The deploy copy of the current round is done (its digest names its round)."""
        version = self.job.version
        digest = None if error else ModelDigest(size=version, sha256=f"{version:064x}")
        return self.apply(
            ModelCopied(namespace=NS, name=JOB, version=version, error=error, digest=digest)
        )

    def complete_round(self, output_dir: str = "/output") -> None:
        """From train/preparing through to train/waiting with successful workers, each
        reporting a model in its round's output dir."""
        version = self.job.version
        self.written("train")
        self.apply(report("train", "completed", f"{output_dir}/train/{version}/m.pkl"))
        self.written("eval")
        self.apply(report("eval", "completed", f"{output_dir}/eval/{version}/m.pkl"))
        self.copied()

    # ------------------------------------------------------------ effect views
    def of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.effects if isinstance(e, kind)]

    def published(self) -> list[dict[str, Any]]:
        return [content(e) for e in self.of(Publish)]

    def notes(self) -> list[str]:
        return [e.reason for e in self.of(Note)]

    def last_write(self) -> WriteRound:
        writes = self.of(WriteRound)
        assert writes, "no WriteRound effect"
        return writes[-1]  # type: ignore[no-any-return]

    def last_copy(self) -> CopyModel:
        copies = self.of(CopyModel)
        assert copies, "no CopyModel effect"
        return copies[-1]  # type: ignore[no-any-return]


def content(publish: Publish) -> dict[str, Any]:
    """The upstream message's content as it goes on the wire."""
    wire = msgspec.json.decode(msgspec.json.encode(publish.status))
    assert isinstance(wire, dict)
    return wire
