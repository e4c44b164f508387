"""The pure lifecycle: `transition(state, event, ctx) -> Outcome(state', effects, verdict)`.

No I/O, no clock, no randomness: time, ids and settings arrive in `ctx`. Everything a job or
dataset decides lives in this package and nowhere else; the shell carries the effects out.
Job events go to `service.core.jobs`, dataset events to `service.core.datasets`, the events of
the resources the controller only stores to `service.core.passthrough`.
"""

from __future__ import annotations

import msgspec

from service.core import datasets, jobs, passthrough
from service.core.effects import Effect, Publish, Reject
from service.core.events import (
    DatasetApplied,
    DatasetDeleted,
    DatasetPolled,
    Event,
    OwnerReported,
    ResourceApplied,
    ResourceDeleted,
    Tick,
)
from service.core.outcome import Context, Outcome, Recorder, Verdict
from service.core.state import DatasetState, JobState, State

__all__ = ["Context", "Outcome", "transition", "verdict"]


def transition(state: State | None, event: Event, ctx: Context) -> Outcome:
    """Apply one event to one resource's state. Never raises for any well-typed input."""
    out = Recorder(ctx)
    if isinstance(event, DatasetApplied | DatasetDeleted | DatasetPolled) or (
        isinstance(event, Tick) and event.kind == "dataset"
    ):
        result = datasets.apply(state, event, out)
    elif isinstance(event, ResourceApplied | ResourceDeleted | OwnerReported):
        result = passthrough.apply(state, event, out)
    else:
        result = jobs.apply(state, event, out)
    result = _stamp_phase(state, result, ctx.now_ms)
    effects = tuple(out.effects)
    return Outcome(result, effects, verdict(state, result, effects))


def _stamp_phase(before: State | None, after: State | None, now_ms: int) -> State | None:
    """Record when a job entered its (phase, step): now, if it is new or they changed."""
    if not isinstance(after, JobState):
        return after
    if isinstance(before, JobState) and (before.phase, before.step) == (after.phase, after.step):
        return after
    return msgspec.structs.replace(after, phase_since_ms=now_ms)


def verdict(before: State | None, after: State | None, effects: tuple[Effect, ...]) -> Verdict:
    """Rejected when refused; ignored when only bookkeeping changed and nothing was said
    upstream; applied otherwise."""
    if any(isinstance(e, Reject) for e in effects):
        return "rejected"
    if _material(before) == _material(after) and not any(isinstance(e, Publish) for e in effects):
        return "ignored"
    return "applied"


def _material(state: State | None) -> State | None:
    """The state without its bookkeeping of timers and polls in flight."""
    if isinstance(state, JobState):
        return msgspec.structs.replace(state, next_check_ms=None)
    if isinstance(state, DatasetState):
        return msgspec.structs.replace(state, polling=False)
    return state
