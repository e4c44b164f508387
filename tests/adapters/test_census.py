"""The line census (the C module `_census`) against a plain byte-by-byte loop: buffers of
every kind and alignment, and sizes across its 16-byte vectors and its 4080-byte stretches
(where each 8-bit lane's count is added up before it could wrap)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.adapters import _census

#: 255 steps of 16 bytes: the most an 8-bit lane counts before the lanes are added up
STRETCH = 255 * 16


def line_ends(data: bytes) -> list[int]:
    return [i + 1 for i, byte in enumerate(data) if byte == 0x0A]


def expected_count(data: bytes) -> tuple[int, int]:
    ends = line_ends(data)
    return len(ends), sum(1 for end in ends if end == 1 or data[end - 2] == 0x0A)


def views(data: bytes, shift: int) -> list[bytes | bytearray | memoryview]:
    """The same bytes as bytes, as a bytearray, and as a memoryview starting ``shift`` bytes
    into a bigger buffer (so vectors load across any alignment)."""
    padded = bytearray(b"\n" * shift + data + b"\n")
    return [data, bytearray(data), memoryview(padded)[shift : shift + len(data)]]


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), max_size=400),
    shift=st.integers(0, 15),
)
def test_counts_and_line_ends_match_a_plain_loop(lengths: list[int], shift: int) -> None:
    """Lines of any length (empty ones included), so counts and pairs fall anywhere in and
    across vectors and stretches."""
    data = b"".join(b"x" * n + b"\n" for n in lengths)
    ends = line_ends(data)
    for view in views(data, shift):
        assert _census.count(view) == expected_count(data)
        assert [_census.end_of_line(view, k) for k in range(len(ends) + 1)] == [0, *ends]
        with pytest.raises(ValueError, match=f"line {len(ends) + 1} asked of bytes holding"):
            _census.end_of_line(view, len(ends) + 1)


@pytest.mark.parametrize(
    "size", [0, 1, 2, 15, 16, 17, 31, 33, STRETCH - 1, STRETCH, STRETCH + 1, 3 * STRETCH + 17]
)
def test_every_byte_a_newline_fills_the_lanes(size: int) -> None:
    """The densest bytes: every lane counts one a step, so a stretch brings each lane to
    255, the most it holds; every newline ends an empty line."""
    data = b"\n" * size
    for view in views(data, size % 16):
        assert _census.count(view) == (size, size)
        assert [_census.end_of_line(view, k) for k in range(size + 1)] == list(range(size + 1))


@pytest.mark.parametrize("size", [STRETCH - 1, STRETCH, STRETCH + 1, 70_000, 300_000])
def test_big_buffers_scanned_without_the_interpreter_lock_agree(size: int) -> None:
    """Sizes both sides of a stretch and of the size from which the lock is let go."""
    data = bytes((b"\n" if i % 7 in (0, 1) else b"a")[0] for i in range(size))
    ends = line_ends(data)
    assert _census.count(data) == expected_count(data)
    for k in (1, len(ends) // 2, len(ends) - 1, len(ends)):
        assert _census.end_of_line(data, k) == ends[k - 1]


def test_refusals_are_specific() -> None:
    with pytest.raises(TypeError, match="bytes-like object is required"):
        _census.count("a\n")  # type: ignore[arg-type]
    with pytest.raises(BufferError):
        _census.count(memoryview(b"a\nb\n")[::2])  # not contiguous
    with pytest.raises(ValueError, match="line -1 asked: lines count from 0"):
        _census.end_of_line(b"a\n", -1)
    with pytest.raises(ValueError, match="line 2 asked of bytes holding 1"):
        _census.end_of_line(b"a\nb", 2)
    assert _census.end_of_line(b"", 0) == 0
