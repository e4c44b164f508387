"""The lifecycle of one dataset: polled for new samples, and what its jobs are told.

A source that cannot be read (missing, permission denied, S3 403/404) is kept in the state
with its reason and reported once per change of condition, not on every poll; the next poll
that reads it clears it.
"""


import msgspec

from service.core import paths
from service.core.effects import DatasetUnreadable, NotifyJobs, PollDataset, Recorder
from service.core.events import (
    DatasetApplied,
    DatasetChanged,
    DatasetDeleted,
    DatasetPolled,
    Event,
    Tick,
)
from service.core.state import DatasetInfo, DatasetState, State
from service.wire import DatasetStatus

replace = msgspec.structs.replace

def apply(state: State | None, event: Event, out: Recorder) -> State | None:
    """Apply one event to a dataset (None: it does not exist, or no longer does)."""
    if state is not None and not isinstance(state, DatasetState):
        out.note(f"{type(event).__name__} does not apply to a job")
        return state
    if isinstance(event, DatasetApplied):
        return _dataset_applied(state, event, out)
    if state is None:
        out.note(f"{type(event).__name__} for a dataset that does not exist: ignored")
        return None
    if isinstance(event, DatasetDeleted):
        out.add(
            NotifyJobs(
                id=out.next_id(),
                namespace=state.namespace,
                dataset=state.name,
                info=_info(state, present=False),
            )
        )
        out.note("dataset deleted: its jobs pause")
        return None
    if isinstance(event, DatasetPolled):
        return _dataset_polled(state, event, out)
    assert isinstance(event, Tick), event
    if state.polling:
        return state
    return _poll(state, out)


def notice_for_job(namespace: str, job: str, dataset: DatasetState) -> DatasetChanged:
    """What a job that starts using `dataset` is told of it: where it is, and its sample
    count once the dataset has been read."""
    count = dataset.num_samples if dataset.num_samples >= 0 else None
    return DatasetChanged(
        namespace=namespace, name=job, dataset=dataset.name, info=_info(dataset), num_samples=count
    )


def change_for_job(job_namespace: str, job: str, notify: NotifyJobs) -> DatasetChanged:
    """What each job of a dataset is told when the dataset changed."""
    return DatasetChanged(
        namespace=job_namespace,
        name=job,
        dataset=notify.dataset,
        info=notify.info,
        num_samples=notify.num_samples,
    )


def _info(state: DatasetState, *, present: bool = True) -> DatasetInfo:
    return DatasetInfo(url=state.url, format=state.format, present=present)


def _poll(state: DatasetState, out: Recorder) -> DatasetState:
    out.add(
        PollDataset(
            id=out.next_id(),
            namespace=state.namespace,
            name=state.name,
            url=paths.add_prefix(out.ctx.volume_prefix, state.url),
            format=state.format,
            cursor=state.cursor,
        )
    )
    return replace(state, polling=True)


def _dataset_applied(
    state: DatasetState | None, event: DatasetApplied, out: Recorder
) -> DatasetState:
    fmt = event.format.lower()
    if state is None:
        new = DatasetState(
            namespace=event.namespace,
            name=event.name,
            url=event.url,
            format=fmt,
            digest=event.digest,
        )
        out.note("dataset created")
        return _poll(new, out)
    if event.digest == state.digest:
        return state if state.polling else _poll(state, out)  # polled on every insert
    moved = (event.url, fmt) != (state.url, state.format)
    updated = replace(state, url=event.url, format=fmt, digest=event.digest)
    if moved:
        updated = replace(updated, cursor=b"", unreadable=None)
        out.add(
            NotifyJobs(
                id=out.next_id(), namespace=state.namespace, dataset=state.name, info=_info(updated)
            )
        )
        out.note(f"dataset moved to {event.url} ({fmt}): counting again from its start")
    return updated if updated.polling else _poll(updated, out)


def _unreadable(state: DatasetState, reason: str, out: Recorder) -> DatasetState:
    """The source cannot be read: say so when that is news; its count and cursor stay."""
    if reason == state.unreadable:
        return state
    out.add(
        DatasetUnreadable(namespace=state.namespace, name=state.name, url=state.url, reason=reason)
    )
    out.note(f"dataset cannot be read: {reason}; its jobs wait until it can")
    return replace(state, unreadable=reason)


def _dataset_polled(state: DatasetState, event: DatasetPolled, out: Recorder) -> DatasetState:
    state = replace(state, polling=False)
    if event.url != paths.add_prefix(out.ctx.volume_prefix, state.url):
        return _poll(state, out)  # a poll of the old location: poll the new one
    out.schedule(out.ctx.now_ms + out.ctx.dataset_poll_ms)
    if event.error is not None:
        out.note(f"dataset poll failed: {event.error}")
        return state
    if event.unreadable is not None:
        return _unreadable(state, event.unreadable, out)
    if state.unreadable is not None:
        out.note("dataset can be read again")
        state = replace(state, unreadable=None)
    state = replace(state, cursor=event.cursor)
    if event.num_samples == state.num_samples:
        return state
    state = replace(state, num_samples=event.num_samples)
    out.publish(state.namespace, state.name, DatasetStatus(number_of_samples=event.num_samples))
    out.add(
        NotifyJobs(
            id=out.next_id(),
            namespace=state.namespace,
            dataset=state.name,
            info=_info(state),
            num_samples=event.num_samples,
        )
    )
    return state
