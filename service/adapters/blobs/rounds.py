"""Round files: the samples of given index ranges, copied from the dataset in one pass each.

The requested ranges are split into runs that one forward scan of the source can serve, and
each run is one scan through the shared `SampleScanner`, so "sample i" is the same line the
dataset polls counted. A clean block (no empty line, the common case) is sliced at line ends
found by the scanner's census and written as it is; only a block with empty lines is split
into lines. For remote txt datasets an index file lists the first field of each sample. A
round's files hold at most ``LIFELONG_MAX_ROUND_BYTES`` (a sparse dataset of 2 MB on disk
once made a 409 MiB round file), and old rounds' local files are removed (`prune`).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import BinaryIO

from service import failpoints
from service.adapters.blobs.pipelined import PipelinedWriter
from service.adapters.blobs.staging import Staging
from service.adapters.datasets.scanner import (
    Chunk,
    LineCensus,
    SampleBatch,
    SampleScanner,
    iter_batches,
    sample_lines,
)
from service.adapters.datasets.sources import LocalSource, S3Source
from service.adapters.files import LocalFiles
from service.adapters.s3 import S3CredentialLike
from service.core import paths
from service.errors import Refused

#: The files the controller writes in a round's data directory (``paths.round_data_file``).
ROUND_FILES = (paths.data_file("txt"), paths.data_file("csv"), paths.DATA_INDEX)
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

SampleRange = tuple[int, int]
"""Half-open sample indices ``[start, end)``."""


def ascending_runs(ranges: Sequence[SampleRange]) -> list[list[SampleRange]]:
    """Split the requested order into maximal runs that one forward scan can serve."""
    runs: list[list[SampleRange]] = []
    for start, end in ranges:
        if start < 0 or end < start:
            raise ValueError(f"bad sample range [{start}, {end})")
        if start == end:
            continue
        if runs and start >= runs[-1][-1][1]:
            runs[-1].append((start, end))
        else:
            runs.append([(start, end)])
    return runs


class RoundWriter:
    """Writes the csv header once, then sample lines (and their index entries), refusing to
    write more than ``max_bytes`` in all."""

    def __init__(
        self, data: PipelinedWriter, index: BinaryIO | None, needs_header: bool, max_bytes: int
    ) -> None:
        self.needs_header = needs_header
        self.written = 0
        self.bytes = 0
        self._data = data
        self._index = index
        self._max_bytes = max_bytes

    def _count(self, size: int) -> None:
        self.bytes += size
        if self.bytes > self._max_bytes:
            raise Refused(
                f"the round's data would hold more than {self._max_bytes} bytes "
                "(LIFELONG_MAX_ROUND_BYTES); nothing was written"
            )

    def _put(self, data: Chunk) -> None:
        self._count(len(data))
        self._data.write(data)

    def header(self, line: bytes) -> None:
        self._put(line + b"\n")
        self.needs_header = False

    def samples(self, lines: list[bytes]) -> None:
        self._put(b"\n".join(lines) + b"\n")
        if self._index is not None:
            entries = b"\n".join(line.split(b" ", 1)[0] for line in lines) + b"\n"
            self._count(len(entries))
            self._index.write(entries)
        self.written += len(lines)

    def clean(self, body: Chunk, count: int) -> None:
        """``count`` samples as newline-terminated lines with no empty one: already output."""
        if self._index is not None:
            self.samples(sample_lines(body))
            return
        self._put(body)
        self.written += count


def _take(
    batch: SampleBatch, run: list[SampleRange], i: int, writer: RoundWriter, census: LineCensus
) -> int:
    """Write the part of ``run`` (from range ``i``) that ``batch`` holds; return the new i.

    A clean batch (the common case) is sliced at line ends found by ``census``; only a batch
    with empty lines is split into lines.
    """
    low, high = batch.first, batch.first + batch.count
    body = batch.body
    lines: list[bytes] | None = None
    while i < len(run) and run[i][0] < high:
        start, end = run[i]
        a, b = max(start, low), min(end, high)
        if a < b and batch.clean:
            whole = (a, b) == (low, high)
            begin = 0 if whole else census.end_of_line(body, a - low)
            stop = len(body) if whole else census.end_of_line(body, b - low)
            writer.clean(body[begin:stop], b - a)
        elif a < b:
            lines = sample_lines(body) if lines is None else lines
            writer.samples(lines[a - low : b - low])
        if end > high:
            break
        i += 1
    return i


@contextmanager
def round_writer(
    staging: Staging,
    *,
    fmt: str,
    data_url: str,
    index_url: str | None,
    index_prefix: str | None,
    cred: S3CredentialLike | None,
    max_bytes: int,
) -> Iterator[RoundWriter]:
    """A writer of the round file ``data_url`` (and of its index, if ``index_url``), staged:
    the files become their targets only if the block succeeds, and hold at most
    ``max_bytes`` together."""
    with ExitStack() as stack:
        data_file = stack.enter_context(staging.staged(data_url, cred))
        data = stack.enter_context(PipelinedWriter(data_file))
        index = None
        if index_url is not None:
            index = stack.enter_context(staging.staged(index_url, cred))
            index.write((index_prefix or "").encode() + b"\n")
        yield RoundWriter(data, index, needs_header=fmt == "csv", max_bytes=max_bytes)
        failpoints.hit("blob-mid-write", data)


def copy_run(
    source: LocalSource | S3Source,
    run: list[SampleRange],
    writer: RoundWriter,
    *,
    url: str,
    fmt: str,
    max_line: int,
) -> None:
    """One forward scan of the open ``source`` (read from ``url``) serving an ascending run
    of ranges; lines over ``max_line`` bytes are refused."""
    i = 0
    with source.range(0) as read_into:
        scanner = SampleScanner(fmt, expected_bytes=source.size, max_line=max_line, source=url)
        for batch in iter_batches(read_into, scanner):
            if writer.needs_header and scanner.header is not None:
                writer.header(scanner.header)
            i = _take(batch, run, i, writer, scanner.census)
            if i >= len(run) and not writer.needs_header:
                return


def prune(files: LocalFiles, phase_dir: str, keep: Callable[[int], bool]) -> list[int]:
    """Remove the round directories of ``phase_dir`` (a local ``<out>/data/{train|eval}``)
    whose version ``keep`` refuses, with the files the controller writes there; return their
    versions. A directory that holds anything else, or is not a directory, is left as it is;
    nothing is followed through a link."""
    removed = []
    with files.directory(phase_dir, create=False) as (parent, _):
        for name in os.listdir(parent):
            if not name.isdecimal() or keep(int(name)):
                continue
            try:
                fd = os.open(name, _OPEN_DIR, dir_fd=parent)
            except OSError:
                continue  # a file or a link where a round directory would be: not ours
            try:
                for inner in ROUND_FILES:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(inner, dir_fd=fd)
            finally:
                os.close(fd)
            try:
                os.rmdir(name, dir_fd=parent)
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                continue
            removed.append(int(name))
    return sorted(removed)
