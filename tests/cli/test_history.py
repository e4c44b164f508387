"""History records: typed, skipped when unreadable, and when a resource last changed."""

from __future__ import annotations

from service.history import decode_records, encode_record, last_change_ms
from tests.cli.documents import RECORDS


def test_last_change_skips_events_that_changed_nothing() -> None:
    assert last_change_ms(RECORDS) == 4_000
    assert last_change_ms(RECORDS[:2]) == 1_000
    assert last_change_ms([]) is None


def test_records_skip_unreadable_history() -> None:
    history = [encode_record(RECORDS[0]), b"not json", b"[]", b'{"at": "x"}']
    assert decode_records(history) == [RECORDS[0]]
