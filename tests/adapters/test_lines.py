"""The C module `_lines` against plain Python: the line census across buffers of every kind
and alignment, and sizes across its 16-byte vectors and its 4080-byte stretches (where each
8-bit lane's count is added up before it could wrap); a round's index entries against
splitting each line."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.adapters import _lines

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
        assert _lines.count(view) == expected_count(data)
        assert [_lines.end_of_line(view, k) for k in range(len(ends) + 1)] == [0, *ends]
        with pytest.raises(ValueError, match=f"line {len(ends) + 1} asked of bytes holding"):
            _lines.end_of_line(view, len(ends) + 1)


@pytest.mark.parametrize(
    "size", [0, 1, 2, 15, 16, 17, 31, 33, STRETCH - 1, STRETCH, STRETCH + 1, 3 * STRETCH + 17]
)
def test_every_byte_a_newline_fills_the_lanes(size: int) -> None:
    """The densest bytes: every lane counts one a step, so a stretch brings each lane to
    255, the most it holds; every newline ends an empty line."""
    data = b"\n" * size
    for view in views(data, size % 16):
        assert _lines.count(view) == (size, size)
        assert [_lines.end_of_line(view, k) for k in range(size + 1)] == list(range(size + 1))


@pytest.mark.parametrize("size", [STRETCH - 1, STRETCH, STRETCH + 1, 70_000, 300_000])
def test_big_buffers_scanned_without_the_interpreter_lock_agree(size: int) -> None:
    """Sizes both sides of a stretch and of the size from which the lock is let go."""
    data = bytes((b"\n" if i % 7 in (0, 1) else b"a")[0] for i in range(size))
    ends = line_ends(data)
    assert _lines.count(data) == expected_count(data)
    for k in (1, len(ends) // 2, len(ends) - 1, len(ends)):
        assert _lines.end_of_line(data, k) == ends[k - 1]


def test_refusals_are_specific() -> None:
    with pytest.raises(TypeError, match="bytes-like object is required"):
        _lines.count("a\n")  # type: ignore[arg-type]
    with pytest.raises(BufferError):
        _lines.count(memoryview(b"a\nb\n")[::2])  # not contiguous
    with pytest.raises(ValueError, match="line -1 asked: lines count from 0"):
        _lines.end_of_line(b"a\n", -1)
    with pytest.raises(ValueError, match="line 2 asked of bytes holding 1"):
        _lines.end_of_line(b"a\nb", 2)
    assert _lines.end_of_line(b"", 0) == 0


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(
        st.lists(st.sampled_from([b"a", b"bc", b"/x.jpg", b""]), max_size=4).map(b" ".join),
        max_size=200,
    ),
    shift=st.integers(0, 15),
)
def test_first_fields_are_each_lines_text_up_to_its_first_space(
    lines: list[bytes], shift: int
) -> None:
    """Fields of any length, empty ones too (a line that starts with a space, or is one)."""
    data = b"".join(line + b"\n" for line in lines)
    expected = b"".join(line.split(b" ", 1)[0] + b"\n" for line in lines)
    for view in views(data, shift):
        assert _lines.first_fields(view) == expected


def test_first_fields_of_a_big_buffer_and_refusals() -> None:
    """A buffer scanned without the interpreter lock; bytes that are not whole lines."""
    lines = [b"path/%d.jpg label-%d" % (i, i % 3) for i in range(20_000)]
    data = b"\n".join(lines) + b"\n"
    assert _lines.first_fields(data) == b"".join(b"path/%d.jpg\n" % i for i in range(20_000))
    with pytest.raises(ValueError, match="last line is not ended by a newline"):
        _lines.first_fields(b"a b\nc d")
    with pytest.raises(TypeError, match="bytes-like object is required"):
        _lines.first_fields("a\n")  # type: ignore[arg-type]
    assert _lines.first_fields(b"") == b""
