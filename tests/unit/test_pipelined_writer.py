"""The round writer's pipelined file: order, copy-on-write of the caller's bytes, errors."""

from __future__ import annotations

import io
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.adapters.blobs import PIPELINED_MIN_BYTES, _Pipelined

BIG = PIPELINED_MIN_BYTES


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 1, 100, BIG - 1, BIG, BIG + 7, 3 * BIG]), max_size=8))
def test_writes_land_in_order_even_when_the_caller_reuses_its_buffer(sizes: list[int]) -> None:
    out = io.BytesIO()
    scratch = bytearray(3 * BIG + 7)
    expected = b""
    with _Pipelined(out) as file:
        for i, size in enumerate(sizes):
            scratch[:size] = bytes([i % 251]) * size
            assert file.write(memoryview(scratch)[:size]) == size
            scratch[:size] = b"\xff" * size  # the scanner's next read overwrites its buffer
            expected += bytes([i % 251]) * size
    assert out.getvalue() == expected


class FailingFile(io.BytesIO):
    """Fails its second write, from whichever thread makes it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.threads: set[str] = set()

    def write(self, data: object) -> int:
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        if self.calls == 2:
            raise OSError(28, "No space left on device")
        return super().write(data)  # type: ignore[arg-type]


def test_an_error_on_the_helper_thread_comes_out_of_the_next_call() -> None:
    out = FailingFile()
    file = _Pipelined(out)
    with pytest.raises(OSError, match="No space"), file:
        file.write(b"a" * BIG)
        file.write(b"b" * BIG)  # fails on the helper
        file.write(b"c")  # waits for it, and raises
    assert any(name.startswith("round-writer") for name in out.threads)
    assert out.getvalue() == b"a" * BIG


def test_an_error_in_the_last_write_comes_out_of_the_with_block() -> None:
    out = FailingFile()
    with pytest.raises(OSError, match="No space"), _Pipelined(out) as file:
        file.write(b"a")
        file.write(b"b" * BIG)


def test_a_failing_body_still_waits_for_the_write_in_flight() -> None:
    out = io.BytesIO()
    with pytest.raises(RuntimeError, match="scan failed"), _Pipelined(out) as file:
        file.write(b"x" * (3 * BIG))
        raise RuntimeError("scan failed")
    assert out.getvalue() == b"x" * (3 * BIG)
