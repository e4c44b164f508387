"""The shared sample definition: SampleScanner against a line-by-line reference."""

from __future__ import annotations

from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.adapters import scanner as scanning
from service.adapters.dataset_sources import read_exact
from service.adapters.scanner import TAIL_BYTES, ReadInto, SampleScanner, iter_batches, sample_lines


def reference(data: bytes, fmt: str) -> tuple[bytes | None, list[bytes]]:
    """The definition, written the obvious way: (csv header, samples)."""
    lines = [line[:-1] if line.endswith(b"\r") else line for line in data.split(b"\n")]
    samples = [line for line in lines if line]
    if fmt == "csv":
        return (samples[0] if samples else None), samples[1:]
    return None, samples


def chunked(data: bytes, sizes: list[int]) -> ReadInto:
    """A reader that returns ``data`` in the given (cycled) chunk sizes, or less when the
    view is smaller."""
    state = {"pos": 0, "i": 0}

    def read_into(view: memoryview) -> int:
        size = sizes[state["i"] % len(sizes)] if sizes else len(data)
        state["i"] += 1
        start = state["pos"]
        part = data[start : start + min(max(size, 1), len(view))]
        view[: len(part)] = part
        state["pos"] = start + len(part)
        return len(part)

    return read_into


def scan(data: bytes, fmt: str, sizes: list[int]) -> tuple[SampleScanner, list[bytes]]:
    scanner = SampleScanner(fmt)
    got: list[bytes] = []
    for batch in iter_batches(chunked(data, sizes), scanner):
        lines = sample_lines(batch.body)
        assert len(lines) == batch.count
        assert batch.first == len(got)
        got.extend(lines)
    return scanner, got


@pytest.mark.parametrize(
    ("data", "fmt", "samples"),
    [
        (b"a\nb\n", "txt", [b"a", b"b"]),
        (b"a\r\nb\r\n", "txt", [b"a", b"b"]),
        (b"\n\r\n\na\n\n\nb\n\r\n", "txt", [b"a", b"b"]),
        (b"a\nb", "txt", [b"a", b"b"]),
        (b"a\nb\r", "txt", [b"a", b"b"]),
        (b"a\n\r", "txt", [b"a"]),
        (b"\r\r\n x\n", "txt", [b"\r", b" x"]),
        (b"\n\nh1,h2\r\n1,2\n\n3,4", "csv", [b"1,2", b"3,4"]),
        (b"h\n", "csv", []),
        (b"", "txt", []),
    ],
)
def test_examples(data: bytes, fmt: str, samples: list[bytes]) -> None:
    assert reference(data, fmt)[1] == samples
    for sizes in ([1], [2, 3], [1 << 20]):
        assert scan(data, fmt, sizes)[1] == samples


def test_csv_header_is_first_non_empty_line() -> None:
    scanner, samples = scan(b"\r\n\nname,age\r\nann,3\n", "csv", [1])
    assert scanner.header == b"name,age"
    assert samples == [b"ann,3"]


def test_unterminated_line_is_a_sample_but_not_consumed() -> None:
    scanner, samples = scan(b"a\nbc", "txt", [3])
    assert samples == [b"a", b"bc"]
    assert scanner.samples == 1
    assert scanner.offset == 2
    assert scanner.tail == b"a\n"


def test_counting_mode_shortens_a_long_partial_line_but_counts_it() -> None:
    scanner = SampleScanner("txt", keep_lines=False)
    read_into = chunked(b"x" * 50_000, [1000])
    while scanner.read_from(read_into)[0]:
        partial = scanner.finish()
        assert partial is not None and len(partial.body) <= 3
    finished = scanner.finish()
    assert finished is not None and finished.count == 1
    assert len(finished.body) <= 3


def test_read_exact_joins_short_reads() -> None:
    assert read_exact(chunked(b"abcdef", [1, 2]), 4) == b"abcd"
    assert read_exact(chunked(b"ab", [5]), 4) == b"ab"


lines_st = st.lists(
    st.sampled_from([b"", b"\r", b"a", b"b c", b"\r\r", b"x\r", b"1,2", b" "]), max_size=40
)


@settings(max_examples=300, deadline=None)
@given(
    lines=lines_st,
    terminated=st.booleans(),
    fmt=st.sampled_from(["txt", "csv"]),
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=5),
)
def test_scanner_matches_reference(
    lines: list[bytes], terminated: bool, fmt: str, sizes: list[int]
) -> None:
    data = b"\n".join(lines) + (b"\n" if terminated and lines else b"")
    header, expected = reference(data, fmt)
    scanner, got = scan(data, fmt, sizes)
    assert got == expected
    last_newline = data.rfind(b"\n") + 1
    assert scanner.offset == last_newline
    assert scanner.tail == data[max(0, last_newline - TAIL_BYTES) : last_newline]
    assert scanner.samples == len(reference(data[:last_newline], fmt)[1])
    assert scanner.header == reference(data[:last_newline], fmt)[0]
    if header is None:
        assert scanner.header is None


@settings(max_examples=200, deadline=None)
@given(
    lines=lines_st,
    block=st.integers(1, 40),
    fmt=st.sampled_from(["txt", "csv"]),
)
def test_batches_say_whether_they_are_clean(lines: list[bytes], block: int, fmt: str) -> None:
    """A clean batch's body is exactly its samples; others hold an empty line."""
    data = b"\n".join(lines) + b"\n"
    with mock.patch.object(scanning, "BLOCK_BYTES", block):
        for batch in iter_batches(chunked(data, [block]), SampleScanner(fmt)):
            body = bytes(batch.body)
            assert batch.clean == (not body.startswith(b"\n") and b"\n\n" not in body)
            if batch.clean:
                assert body.count(b"\n") == batch.count
