"""A dataset whose source cannot be read (missing, permission denied, S3 403/404) keeps the
reason in its state and says so once per change of condition, as a `DatasetUnreadable`
effect, never as a refusal; the first poll that reads it clears it."""

from __future__ import annotations

from service.core.effects import (
    Context,
    DatasetUnreadable,
    Note,
    NotifyJobs,
    Outcome,
    PollDataset,
    Publish,
)
from service.core.events import DatasetApplied, DatasetDeleted, DatasetPolled, Event, Tick
from service.core.lifecycle import transition
from service.core.state import DatasetState, State

NS = "default"
NAME = "ds"
URL = "/data/trainData.csv"
MISSING = f"{URL} does not exist"
DENIED = f"reading {URL}: Permission denied"


class Dataset:
    """Drives one dataset through the core, answering each poll with the given result."""

    def __init__(self) -> None:
        self.state: State | None = None
        self.now_ms = 1_000
        self.seq = 0
        self.last_tick: Outcome | None = None
        self.apply(DatasetApplied(namespace=NS, name=NAME, url=URL, format="csv", digest="d1"))

    def apply(self, event: Event) -> Outcome:
        self.seq += 1
        ctx = Context(now_ms=self.now_ms, minute_of_day=0, event_id=f"e{self.seq}")
        outcome = transition(self.state, event, ctx)
        self.state = outcome.state
        return outcome

    @property
    def dataset(self) -> DatasetState:
        assert isinstance(self.state, DatasetState)
        return self.state

    def poll(self, *, unreadable: str | None = None, samples: int = 0) -> Outcome:
        """The poll in flight completes; then the next period's tick starts another."""
        assert self.dataset.polling
        result = DatasetPolled(
            namespace=NS, name=NAME, url=URL, num_samples=samples, cursor=b"c%d" % samples,
            unreadable=unreadable,
        )  # fmt: skip
        outcome = self.apply(result)
        self.now_ms += 60_000
        self.last_tick = self.apply(
            Tick(kind="dataset", namespace=NS, name=NAME, due_ms=self.now_ms)
        )
        return outcome


def reports(outcome: Outcome) -> list[DatasetUnreadable]:
    return [e for e in outcome.effects if isinstance(e, DatasetUnreadable)]


def test_a_missing_file_is_reported_once_not_on_every_poll() -> None:
    d = Dataset()
    first = d.poll(unreadable=MISSING)
    assert reports(first) == [DatasetUnreadable(namespace=NS, name=NAME, url=URL, reason=MISSING)]
    assert first.verdict == "applied", "a poll that found the file missing refused nothing"
    assert first.rejection is None
    assert d.dataset.unreadable == MISSING
    assert d.dataset.num_samples == -1, "nothing was counted: not 'Samples: 0'"
    assert not any(isinstance(e, Publish | NotifyJobs) for e in first.effects)
    assert any("cannot be read" in n for n in first.notes)
    for _ in range(5):
        again = d.poll(unreadable=MISSING)
        assert reports(again) == [] and again.verdict == "ignored" and again.notes == ()
        assert d.last_tick is not None, "and it is polled again every period"
        assert any(isinstance(e, PollDataset) for e in d.last_tick.effects)


def test_a_new_reason_is_a_new_report_and_reading_again_clears_it() -> None:
    d = Dataset()
    d.poll(unreadable=MISSING)
    denied = d.poll(unreadable=DENIED)
    assert [r.reason for r in reports(denied)] == [DENIED]
    assert d.dataset.unreadable == DENIED
    readable = d.poll(samples=7)
    assert reports(readable) == [] and d.dataset.unreadable is None
    assert "dataset can be read again" in readable.notes
    assert d.dataset.num_samples == 7 and d.dataset.cursor == b"c7"
    published = [e for e in readable.effects if isinstance(e, Publish)]
    assert len(published) == 1, "the count goes upstream as soon as it is known"
    # missing again after being read: reported again, the count and cursor stay as they were
    gone = d.poll(unreadable=MISSING)
    assert [r.reason for r in reports(gone)] == [MISSING]
    assert (d.dataset.num_samples, d.dataset.cursor) == (7, b"c7")


def test_transient_errors_are_not_unreadable() -> None:
    d = Dataset()
    outcome = d.apply(
        DatasetPolled(namespace=NS, name=NAME, url=URL, error="S3 endpoint unavailable")
    )
    assert reports(outcome) == [] and d.dataset.unreadable is None
    assert any(isinstance(e, Note) and "poll failed" in e.reason for e in outcome.effects)


def test_moving_the_dataset_forgets_the_old_locations_condition() -> None:
    d = Dataset()
    d.poll(unreadable=MISSING)
    moved = DatasetApplied(namespace=NS, name=NAME, url="/data/other.csv", format="csv", digest="2")
    d.apply(moved)
    assert d.dataset.unreadable is None
    d.apply(DatasetDeleted(namespace=NS, name=NAME))
    assert d.state is None
