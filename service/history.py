"""The history of a job or dataset: one typed record per event that changed or said something.

Written by the processor in the same commit as the state the event produced, read back by the
CLI (`describe`, `get`); stored as compact msgpack arrays (an idle job's history is much of
what it costs in Redis), read back from msgpack maps and JSON too (the forms records had
before).
"""


from collections.abc import Iterable

import msgspec

from service.core.effects import Outcome, Verdict
from service.core.state import DatasetState, JobState, State


class HistoryRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What one event did to a resource.

    ``phase``/``step``/``version`` describe a job after the event, ``samples`` a dataset's
    count (absent until it was first read). ``token`` is the lease token the commit was made
    under, so a history shows which replica wrote each record.
    """

    at_ms: int = msgspec.field(name="at")
    event: str
    outcome: Verdict
    notes: tuple[str, ...] = ()
    phase: str | None = None
    step: str | None = None
    version: int | None = None
    samples: int | None = None
    token: str | None = None

    def view(self) -> tuple[str | int | None, ...]:
        """What `last change` compares between records: phase, step, version, samples."""
        return (self.phase, self.step, self.version, self.samples)


def view_of(state: State | None) -> tuple[str | int | None, ...]:
    """The view a record of `state` would have (`HistoryRecord.view`)."""
    if isinstance(state, JobState):
        return (state.phase, state.step, state.version, None)
    if isinstance(state, DatasetState) and state.num_samples >= 0:
        return (None, None, None, state.num_samples)
    return (None, None, None, None)


def record_of(event: str, outcome: Outcome, *, at_ms: int, token: str) -> HistoryRecord:
    """The record of one transition: its verdict, what it said, and the view it left."""
    record = HistoryRecord(
        at_ms=at_ms, event=event, outcome=outcome.verdict, notes=outcome.notes, token=token
    )
    state: State | None = outcome.state
    if isinstance(state, JobState):
        return msgspec.structs.replace(
            record, phase=state.phase, step=state.step, version=state.version
        )
    if isinstance(state, DatasetState) and state.num_samples >= 0:
        return msgspec.structs.replace(record, samples=state.num_samples)
    return record


def worth_keeping(record: HistoryRecord) -> bool:
    """Whether a record is stored: an event that changed nothing but bookkeeping and said
    nothing (an idle trigger check, a poll that found nothing new) is only counted, so
    10,000 idle jobs do not fill Redis with their heartbeats. Every applied event is kept:
    the history is the audit of what was applied (a forwarded report included)."""
    return record.outcome != "ignored" or bool(record.notes)


class _Packed(HistoryRecord, frozen=True, kw_only=True, array_like=True):
    """A record as stored: a msgpack array of the fields in order, without their names (an
    idle job keeps two records; the names were a third of their bytes)."""


_encoder = msgspec.msgpack.Encoder()
_packed_decoder = msgspec.msgpack.Decoder(_Packed)
_map_decoder = msgspec.msgpack.Decoder(HistoryRecord)
_json_decoder = msgspec.json.Decoder(HistoryRecord)


def encode_record(record: HistoryRecord) -> bytes:
    """The stored form (`_Packed`): the record's fields as an array, in order."""
    return _encoder.encode(msgspec.structs.astuple(record))


def _decode(data: bytes) -> HistoryRecord:
    """A stored record: a msgpack array, or a msgpack map or JSON object as earlier versions
    stored them."""
    first = data[0] if data else 0
    if first == ord("{"):
        return _json_decoder.decode(data)
    if 0x80 <= first <= 0x8F or first in (0xDE, 0xDF):  # a msgpack map
        return _map_decoder.decode(data)
    return HistoryRecord(**msgspec.structs.asdict(_packed_decoder.decode(data)))


def decode_records(stored: Iterable[bytes]) -> list[HistoryRecord]:
    """Stored records in order; unreadable ones (from another version) are skipped."""
    records = []
    for data in stored:
        try:
            records.append(_decode(data))
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
    return records


def last_change_ms(records: Iterable[HistoryRecord]) -> int | None:
    """When the resource last changed phase, step, version or sample count: the newest record
    whose view differs from the one before it; the oldest record if none does."""
    changed: int | None = None
    previous: tuple[str | int | None, ...] | None = None
    for record in records:
        view = record.view()
        if view != previous:
            changed, previous = record.at_ms, view
    return changed
