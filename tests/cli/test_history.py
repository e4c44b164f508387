"""History records: typed, skipped when unreadable, and when a resource last changed."""

from __future__ import annotations

import msgspec

from service.history import decode_records, encode_record, last_change_ms
from tests.cli.documents import RECORDS


def test_last_change_skips_events_that_changed_nothing() -> None:
    assert last_change_ms(RECORDS) == 4_000
    assert last_change_ms(RECORDS[:2]) == 1_000
    assert last_change_ms([]) is None


def test_records_skip_unreadable_history() -> None:
    history = [encode_record(RECORDS[0]), b"not json", b"[]", b'{"at": "x"}', b"\x93\x01"]
    assert decode_records(history) == [RECORDS[0]]


def test_records_stored_as_json_by_earlier_versions_are_read() -> None:
    earlier = msgspec.json.encode(RECORDS[1])
    assert earlier.startswith(b"{") and decode_records([earlier]) == [RECORDS[1]]
    assert len(encode_record(RECORDS[1])) < len(earlier), "msgpack is the smaller form"


def test_records_are_stored_without_field_names_and_earlier_maps_are_read() -> None:
    for record in RECORDS:
        stored = encode_record(record)
        as_map = msgspec.msgpack.encode(record)  # the form of the version before
        assert b"outcome" not in stored and b"outcome" in as_map
        assert len(stored) < len(as_map)
        assert decode_records([stored]) == decode_records([as_map]) == [record]
        assert type(decode_records([stored])[0]) is type(record)
