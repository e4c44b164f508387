"""Round files: the samples of given index ranges, copied from the dataset in one pass each.

The requested ranges are split into runs that one forward scan of the source can serve, and
each run is one scan through the shared `SampleScanner`, so "sample i" is the same line the
dataset polls counted. A clean block (no empty line, the common case) is sliced at line ends
found by the scanner's census and written as it is; only a block with empty lines is split
into lines. For remote txt datasets an index file lists the first field of each sample.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
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
from service.adapters.s3 import S3CredentialLike

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
    """Writes the csv header once, then sample lines (and their index entries)."""

    def __init__(self, data: PipelinedWriter, index: BinaryIO | None, needs_header: bool) -> None:
        self.needs_header = needs_header
        self.written = 0
        self._data = data
        self._index = index

    def header(self, line: bytes) -> None:
        self._data.write(line + b"\n")
        self.needs_header = False

    def samples(self, lines: list[bytes]) -> None:
        self._data.write(b"\n".join(lines) + b"\n")
        if self._index is not None:
            self._index.write(b"\n".join(line.split(b" ", 1)[0] for line in lines) + b"\n")
        self.written += len(lines)

    def clean(self, body: Chunk, count: int) -> None:
        """``count`` samples as newline-terminated lines with no empty one: already output."""
        if self._index is not None:
            self.samples(sample_lines(body))
            return
        self._data.write(body)
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
) -> Iterator[RoundWriter]:
    """A writer of the round file ``data_url`` (and of its index, if ``index_url``), staged:
    the files become their targets only if the block succeeds."""
    with ExitStack() as stack:
        data_file = stack.enter_context(staging.staged(data_url, cred))
        data = stack.enter_context(PipelinedWriter(data_file))
        index = None
        if index_url is not None:
            index = stack.enter_context(staging.staged(index_url, cred))
            index.write((index_prefix or "").encode() + b"\n")
        yield RoundWriter(data, index, needs_header=fmt == "csv")
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
