"""The big-file writer behind round files and model copies, on real files: order, copies of
the caller's bytes, and errors."""

from __future__ import annotations

import errno
import io
import threading
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.adapters import staging as pipelining
from service.adapters.staging import PIPELINED_MIN_BYTES, PipelinedWriter

BIG = PIPELINED_MIN_BYTES


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sizes=st.lists(st.sampled_from([0, 1, 100, BIG - 1, BIG, BIG + 7, 3 * BIG]), max_size=8))
def test_writes_land_in_order_even_when_the_caller_reuses_its_buffer(
    tmp_path: Path, sizes: list[int]
) -> None:
    scratch = bytearray(3 * BIG + 7)
    expected = b""
    out = tmp_path / "out.bin"
    with open(out, "wb") as file, PipelinedWriter(file) as pipelined:
        for i, size in enumerate(sizes):
            scratch[:size] = bytes([i % 251]) * size
            assert pipelined.write(memoryview(scratch)[:size]) == size
            scratch[:size] = b"\xff" * size  # the scanner's next read overwrites its buffer
            expected += bytes([i % 251]) * size
        pipelined.flush()
        assert out.read_bytes() == expected


class FailingWrites(io.BufferedWriter):
    """Fails its second write, from whichever thread makes it."""

    calls = 0
    threads: set[str]

    def write(self, data: object) -> int:
        self.calls += 1
        self.threads = getattr(self, "threads", set()) | {threading.current_thread().name}
        if self.calls == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(data)  # type: ignore[call-overload,no-any-return]


def test_an_error_on_the_helper_thread_comes_out_of_the_next_call(tmp_path: Path) -> None:
    file = FailingWrites(io.FileIO(tmp_path / "out.bin", "wb"))
    pipelined = PipelinedWriter(file)
    with file, pytest.raises(OSError, match="No space"), pipelined:
        pipelined.write(b"a" * BIG)
        pipelined.write(b"b" * BIG)  # fails on the helper
        pipelined.write(b"c")  # waits for it, and raises
    assert any(name.startswith("blob-writer") for name in file.threads)
    assert (tmp_path / "out.bin").read_bytes() == b"a" * BIG


def test_an_error_in_the_last_write_comes_out_of_the_with_block(tmp_path: Path) -> None:
    file = FailingWrites(io.FileIO(tmp_path / "out.bin", "wb"))
    with file, pytest.raises(OSError, match="No space"), PipelinedWriter(file) as pipelined:
        pipelined.write(b"a")
        pipelined.write(b"b" * BIG)


def test_a_failing_body_still_waits_for_the_write_in_flight(tmp_path: Path) -> None:
    out = tmp_path / "out.bin"
    with open(out, "wb") as file:
        with pytest.raises(RuntimeError, match="scan failed"), PipelinedWriter(file) as pipelined:
            pipelined.write(b"x" * (3 * BIG))
            raise RuntimeError("scan failed")
        file.flush()
        assert out.read_bytes() == b"x" * (3 * BIG)


def test_writeback_is_started_once_per_stretch_written(tmp_path: Path) -> None:
    """Each byte is advised once, in order: advising pages again once they are clean would
    drop them from the page cache the worker is about to read the file from."""
    calls: list[tuple[int, int]] = []
    real = pipelining.os.posix_fadvise

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        calls.append((offset, length))
        real(fd, offset, length, advice)

    block = pipelining.BLOCK_BYTES
    with (
        mock.patch.object(pipelining.os, "posix_fadvise", side_effect=record),
        open(tmp_path / "out.bin", "wb") as file,
        PipelinedWriter(file) as pipelined,
    ):
        for _ in range(5):
            pipelined.write(b"x" * (block // 2 + 1))
            pipelined.write(b"y" * 10)
    ends = [offset + length for offset, length in calls]
    assert calls and calls[0][0] == 0
    assert all(offset == end for (offset, _), end in zip(calls[1:], ends, strict=False))
    assert all(length >= block for _, length in calls)


def test_without_behind_big_writes_are_made_on_the_callers_thread(tmp_path: Path) -> None:
    """A round file's writer: each write done when the call returns, writeback still
    started per stretch written."""
    threads: list[str] = []
    real = pipelining.os.posix_fadvise

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        threads.append(threading.current_thread().name)
        real(fd, offset, length, advice)

    out = tmp_path / "out.bin"
    block = pipelining.BLOCK_BYTES
    with (
        mock.patch.object(pipelining.os, "posix_fadvise", side_effect=record),
        open(out, "wb") as file,
        PipelinedWriter(file, behind=False) as pipelined,
    ):
        for i in range(3):
            scratch = bytearray(bytes([i]) * block)
            pipelined.write(memoryview(scratch))
            scratch[:] = b"\xff" * block  # written already: changing it changes nothing
        file.flush()
        assert out.read_bytes() == b"".join(bytes([i]) * block for i in range(3))
    assert threads == [threading.current_thread().name] * 3
