"""Hypothesis: no event, in any order, on any state, makes transition() raise.

Events and states are built from strategies over the real types (msgspec structs), with
names, versions, counts and phases drawn wide enough to hit every table entry and every
"does not fit" path; each outcome must also serialise (it is committed to Redis as msgpack).
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.effects import Context, Publish
from service.core.events import (
    DatasetApplied,
    DatasetChanged,
    DatasetDeleted,
    DatasetPolled,
    Event,
    JobApplied,
    JobDeleted,
    ModelCopied,
    RoundWritten,
    Tick,
    WorkerReported,
)
from service.core.lifecycle import transition
from service.core.state import DatasetInfo, State, decode_state, encode_state
from service.core.triggers import OPERATORS
from service.wire import Condition, JobSpec, Timer, Trigger
from tests.core.test_transition_table import SUBSTATES, reach

NAMES = st.sampled_from(["job-a", "ds"])
NS = st.just("default")
COUNTS = st.integers(min_value=0, max_value=10**7)
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)  # what decoding lets through
URLS = st.sampled_from(["/data/d.txt", "/data/d.csv", "s3://b/d.txt", "/rootfs/x/m.pkl", ""])
#: model urls: in round 1's output dirs (with and without the volume prefix) and elsewhere
MODEL_URLS = URLS | st.sampled_from(
    ["/output/train/1/m.pkl", "/output/eval/1/m.pkl", "/rootfs/output/eval/1/m", "/output"]
)
#: worker names: for the job and kind, Sedna's library names, and strangers
WORKERS = st.sampled_from(
    ["w", "job-a-train-1", "job-a-eval-x7k2p", "job-a-inference-1", "train-worker-ab12c"]
)
CHANNELS = st.sampled_from(["mqtt", "http"])
FORMATS = st.sampled_from(["txt", "csv", "CSV", "weird"])

CLOCKS = st.integers(0, 1440).map(lambda m: f"{m // 60:02d}:{m % 60:02d}")
triggers = st.builds(
    Trigger,
    check_period_seconds=st.integers(1, 10**6),
    timer=st.none() | st.builds(Timer, start=CLOCKS, end=CLOCKS),
    condition=st.none()
    | st.builds(
        Condition,
        operator=st.sampled_from(["", *OPERATORS]),
        threshold=st.floats(allow_nan=False, allow_infinity=False, width=32),
        metric=st.sampled_from(["", "num_of_samples", "num_of_samples[0]", "other"]),
    ),
)
specs = st.builds(
    JobSpec,
    dataset=st.sampled_from(["ds", "other"]),
    train_prob=st.sampled_from([0.0, 0.29, 0.5, 0.8, 1.0]),
    trigger=triggers,
    output_dir=st.sampled_from(["/output", "s3://bucket/out", "/rootfs/out"]),
)
#: worker results: models with good and bad urls, and things that are no model at all
model_results = st.lists(
    st.fixed_dictionaries(
        {"url": MODEL_URLS | INT64 | st.none()},
        optional={"format": st.sampled_from(["pkl", "", "pb"]) | INT64},
    )
    | st.dictionaries(st.sampled_from(["x", "metrics"]), INT64),
    max_size=3,
).map(tuple)
infos = st.builds(DatasetInfo, url=URLS, format=FORMATS, present=st.booleans())


def _event(cls: type[Event], /, **fields: Any) -> st.SearchStrategy[Event]:
    """Events of one class for one of the resources the fuzz drives."""
    return st.builds(cls, namespace=NS, name=NAMES, **fields)


_any_event: st.SearchStrategy[Event] = st.one_of(
    _event(JobApplied, spec=specs, digest=st.sampled_from("abc")),
    _event(JobDeleted),
    _event(DatasetApplied, url=URLS, format=FORMATS, digest=st.sampled_from("abc")),
    _event(DatasetDeleted),
    _event(
        DatasetPolled,
        url=URLS,
        num_samples=COUNTS,
        cursor=st.binary(max_size=8),
        error=st.none() | st.just("boom"),
    ),
    _event(
        DatasetChanged,
        dataset=st.sampled_from(["ds", "x"]),
        info=infos,
        num_samples=st.none() | COUNTS,
    ),
    _event(
        WorkerReported,
        worker=WORKERS,
        kind=st.sampled_from(["train", "eval", "deploy", "inference"]),
        status=st.sampled_from(["ready", "running", "completed", "failed"]),
        results=model_results,
        channel=CHANNELS,
    ),
    _event(Tick, kind=st.sampled_from(["job", "dataset"]), due_ms=COUNTS),
    _event(
        RoundWritten,
        phase=st.sampled_from(["train", "eval"]),
        version=st.integers(0, 5),
        error=st.none() | st.just("disk full"),
    ),
    _event(ModelCopied, version=st.integers(0, 5), error=st.none() | st.just("gone")),
)


reports = st.builds(
    WorkerReported,
    namespace=NS,
    name=NAMES,
    worker=WORKERS,
    kind=st.sampled_from(["train", "eval"]),
    status=st.sampled_from(["completed", "failed"]),
    results=model_results,
    channel=CHANNELS,
)
results = st.builds(
    RoundWritten,
    namespace=NS,
    name=NAMES,
    phase=st.sampled_from(["train", "eval"]),
    version=st.integers(0, 2),
    error=st.none() | st.just("disk full"),
) | st.builds(
    ModelCopied,
    namespace=NS,
    name=NAMES,
    version=st.integers(0, 2),
    error=st.none() | st.just("gone"),
)
#: the events that move a round, drawn as often as all the others together
events: st.SearchStrategy[Event] = st.one_of(_any_event, reports, results)


@settings(max_examples=1500, deadline=None)
@given(
    st.sampled_from([None, *SUBSTATES]),
    st.lists(events, min_size=1, max_size=40),
    st.integers(0, 1439),
    st.sampled_from(["", "/rootfs"]),
)
def test_no_event_sequence_makes_transition_raise(
    start: tuple[str, str] | None, history: list[Event], minute: int, prefix: str
) -> None:
    """From nothing or from each real sub-state of a round (reached by the lifecycle itself),
    any sequence of events."""
    state: State | None = None if start is None else reach(*start).state
    for i, event in enumerate(history):
        ctx = Context(
            now_ms=1_000 * i, minute_of_day=minute, event_id=f"e{i}", volume_prefix=prefix,
            strict=True,
        )  # fmt: skip
        outcome = transition(state, event, ctx)
        state = outcome.state
        if state is not None:
            assert decode_state(encode_state(state)) == state
        for effect in outcome.effects:
            msgspec.msgpack.encode(effect)
            if isinstance(effect, Publish):
                msgspec.json.encode(effect.status)
