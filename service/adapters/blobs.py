"""Round sample files and the deploy copy: the controller's writes, local or S3.

Every write lands whole or not at all: local targets are written to a temporary file in
the target's own directory, fsynced and ``os.replace``d onto the target (so a smaller new
model never leaves old bytes behind, the seed's bug 10); S3 targets are uploaded from a
temporary file. Temporary files are removed on every path (the seed's bug 11). Each call is
idempotent, so the whole call is what we retry on transient errors, with jittered
exponential backoff.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from typing import BinaryIO, TypeVar

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from service import failpoints
from service.adapters import s3
from service.adapters.datasets import (
    BLOCK_BYTES,
    BOTO_ERRORS,
    Chunk,
    LineCensus,
    SampleBatch,
    SampleScanner,
    SourceMissing,
    io_errors,
    iter_batches,
    open_source,
    sample_lines,
    translate_io,
)
from service.adapters.s3 import S3Clients, S3CredentialLike
from service.errors import PermanentError, TransientError

T = TypeVar("T")
#: Writes at least this big go to the blob writer's helper thread.
PIPELINED_MIN_BYTES = 1 << 16
SampleRange = tuple[int, int]
"""Half-open sample indices ``[start, end)``."""


def _ascending_runs(ranges: Sequence[SampleRange]) -> list[list[SampleRange]]:
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


class _RoundWriter:
    """Writes the csv header once, then sample lines (and their index entries)."""

    def __init__(self, data: _Pipelined, index: BinaryIO | None, needs_header: bool) -> None:
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
    batch: SampleBatch, run: list[SampleRange], i: int, writer: _RoundWriter, census: LineCensus
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


class BlobStore:
    """Writes round files and copies models, local or S3, retrying transient failures."""

    def __init__(
        self,
        s3: S3Clients,
        *,
        attempts: int = 5,
        max_backoff_s: float = 8.0,
        tmp_dir: str | None = None,
    ) -> None:
        self._s3 = s3
        self._tmp_dir = tmp_dir
        self._retrying = Retrying(
            stop=stop_after_attempt(attempts),
            wait=wait_random_exponential(multiplier=min(0.25, max_backoff_s), max=max_backoff_s),
            retry=retry_if_exception_type(TransientError),
            reraise=True,
        )

    def _retry(self, fn: Callable[[], T]) -> T:
        return self._retrying.copy()(fn)

    def write_round(
        self,
        *,
        source_url: str,
        fmt: str,
        ranges: Sequence[SampleRange],
        data_url: str,
        index_url: str | None,
        index_prefix: str | None,
        source_cred: S3CredentialLike | None,
        dest_cred: S3CredentialLike | None,
    ) -> int:
        """Write the samples of ``ranges`` (in that order) to ``data_url``; return their count.

        csv: the header line first. ``index_url`` (remote txt datasets): ``index_prefix`` then
        the first space-separated field of each sample. Samples the source no longer has are
        not written, so the count can fall short of the ranges; a missing source raises
        PermanentError.
        """

        def once() -> int:
            with ExitStack() as stack:
                data_file = stack.enter_context(self._staged(data_url, dest_cred))
                data = stack.enter_context(_Pipelined(data_file))
                index = None
                if index_url is not None:
                    index = stack.enter_context(self._staged(index_url, dest_cred))
                    index.write((index_prefix or "").encode() + b"\n")
                writer = _RoundWriter(data, index, needs_header=fmt == "csv")
                for run in _ascending_runs(ranges) or [[]]:
                    self._copy_run(source_url, fmt, source_cred, run, writer)
                failpoints.hit("blob-mid-write", data)
                return writer.written

        return self._retry(once)

    def _copy_run(
        self,
        url: str,
        fmt: str,
        cred: S3CredentialLike | None,
        run: list[SampleRange],
        writer: _RoundWriter,
    ) -> None:
        """One forward scan of the source serving an ascending run of ranges."""
        i = 0
        with open_source(self._s3, url, cred) as source, source.range(0) as read_into:
            scanner = SampleScanner(fmt, expected_bytes=source.size)
            for batch in iter_batches(read_into, scanner):
                if writer.needs_header and scanner.header is not None:
                    writer.header(scanner.header)
                i = _take(batch, run, i, writer, scanner.census)
                if i >= len(run) and not writer.needs_header:
                    return

    def copy_model(
        self,
        *,
        src_url: str,
        dst_url: str,
        src_cred: S3CredentialLike | None,
        dst_cred: S3CredentialLike | None,
    ) -> None:
        """Replace ``dst_url`` whole with the bytes of ``src_url``.

        A missing source raises PermanentError naming it.
        """
        if src_url == dst_url:
            return
        try:
            self._retry(lambda: self._copy_once(src_url, dst_url, src_cred, dst_cred))
        except SourceMissing as e:
            raise PermanentError(f"model {src_url} does not exist") from e

    def _copy_once(
        self,
        src_url: str,
        dst_url: str,
        src_cred: S3CredentialLike | None,
        dst_cred: S3CredentialLike | None,
    ) -> None:
        both_s3 = s3.is_s3_url(src_url) and s3.is_s3_url(dst_url)
        if both_s3 and self._s3.client(src_cred) is self._s3.client(dst_cred):
            self._copy_in_s3(src_url, dst_url, dst_cred)
            return
        if s3.is_s3_url(dst_url) and not s3.is_s3_url(src_url):
            self._upload_local(src_url, dst_url, dst_cred)
            return
        with self._staged(dst_url, dst_cred) as out, _Pipelined(out) as pipelined:
            self._download(src_url, src_cred, pipelined)

    def _copy_in_s3(self, src_url: str, dst_url: str, cred: S3CredentialLike | None) -> None:
        src, dst = s3.parse_s3_url(src_url), s3.parse_s3_url(dst_url)
        client = self._s3.client(cred)
        try:
            client.copy_object(
                Bucket=dst.bucket,
                Key=dst.key,
                CopySource={"Bucket": src.bucket, "Key": src.key},
            )
        except BOTO_ERRORS as e:
            if s3.is_not_found(e):
                raise SourceMissing(f"{src_url} does not exist") from e
            raise s3.translate(e, f"copying {src_url} to {dst_url}") from e

    def _upload_local(self, src_url: str, dst_url: str, cred: S3CredentialLike | None) -> None:
        try:
            file = open(src_url, "rb")  # noqa: SIM115 - closed by the with below
        except FileNotFoundError as e:
            raise SourceMissing(f"{src_url} does not exist") from e
        except OSError as e:
            raise translate_io(e, f"reading {src_url}") from e
        location = s3.parse_s3_url(dst_url)
        with file, io_errors(f"uploading {src_url} to {dst_url}"):
            self._s3.client(cred).upload_fileobj(file, location.bucket, location.key)

    def _download(self, url: str, cred: S3CredentialLike | None, out: _Pipelined) -> None:
        """Stream the whole of ``url`` into ``out`` in large blocks."""
        with (
            open_source(self._s3, url, cred) as source,
            source.range(0) as read_into,
            io_errors(f"writing a copy of {url}"),
        ):
            buffer = memoryview(bytearray(BLOCK_BYTES))
            while size := read_into(buffer):
                out.write(buffer[:size])
                failpoints.hit("blob-mid-copy", out)

    @contextmanager
    def _staged(self, url: str, cred: S3CredentialLike | None) -> Iterator[BinaryIO]:
        """A temporary file that becomes ``url`` if the block succeeds; always cleaned up."""
        context = f"writing {url}"
        remote = s3.is_s3_url(url)
        with io_errors(context):
            if remote:
                directory, prefix = self._tmp_dir or tempfile.gettempdir(), "lifelong-"
            else:
                directory, name = os.path.split(url)
                directory, prefix = directory or ".", f".{name}."
                os.makedirs(directory, exist_ok=True)
            _sweep_dead_writers(directory, prefix)
            fd, tmp_path = tempfile.mkstemp(
                prefix=f"{prefix}{_WRITER}~", suffix=".tmp", dir=directory
            )
        try:
            with os.fdopen(fd, "wb") as out, io_errors(context):
                yield out
                out.flush()
                os.fsync(out.fileno())
            with io_errors(context):
                if remote:
                    self._upload(tmp_path, url, cred)
                else:
                    _replace(tmp_path, url)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_path)

    def _upload(self, path: str, url: str, cred: S3CredentialLike | None) -> None:
        location = s3.parse_s3_url(url)
        self._s3.client(cred).upload_file(path, location.bucket, location.key)


class _Pipelined:
    """The writer of a big staged file: a round file or a model copy.

    - Big writes run on a helper thread, so that reading and scanning the next block
      overlaps writing this one. Each is first copied into one of two reused buffers (the
      caller's bytes are a view of a scanner's buffer, which its next read overwrites).
    - The kernel is asked to start writing back each megabyte once it is written:
      ``POSIX_FADV_DONTNEED`` on pages still dirty only starts their writeback on Linux, so
      the closing fsync waits for the last stretch instead of the whole file (16 ms -> 11 ms
      for 20 MB here).

    At most one write is in flight and writes land in order; small ones go straight to the
    file after it. An error from the helper comes out of the next call, or of the with
    block.
    """

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self._buffers = [bytearray(), bytearray()]
        self._turn = 0
        self._helper: ThreadPoolExecutor | None = None
        self._in_flight: Future[None] | None = None
        self._written = 0  # bytes handed to the file so far
        self._advised = 0  # bytes whose writeback was started (helper thread only)

    def __enter__(self) -> _Pipelined:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        try:
            if exc_type is None:
                self.wait()
        finally:
            if self._helper is not None:  # waits for a write still in flight
                self._helper.shutdown(wait=True)
                self._helper = None

    def write(self, data: Chunk) -> int:
        size = len(data)
        if size < PIPELINED_MIN_BYTES:
            self.wait()
            self._written += size
            return self._file.write(data)
        buffer = self._buffers[self._turn]
        if len(buffer) < size:
            buffer = self._buffers[self._turn] = bytearray(size)
        buffer[:size] = data
        self._turn ^= 1
        self.wait()
        self._written += size
        if self._helper is None:
            self._helper = ThreadPoolExecutor(1, thread_name_prefix="blob-writer")
        self._in_flight = self._helper.submit(
            self._write_behind, memoryview(buffer)[:size], self._written
        )
        return size

    def flush(self) -> None:
        self.wait()
        self._file.flush()

    def wait(self) -> None:
        """Until the write in flight is done (its error raised here)."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight.result()

    def _write_behind(self, data: memoryview, end: int) -> None:
        self._file.write(data)
        if end - self._advised >= BLOCK_BYTES:
            self._file.flush()
            advice = os.POSIX_FADV_DONTNEED
            os.posix_fadvise(self._file.fileno(), self._advised, end - self._advised, advice)
            self._advised = end


#: Temporary files are named `<prefix><pid>@<host>~<random>.tmp`, so the next writer can
#: tell a file whose writer died mid-write (a crash: no `finally` ran) from a live one.
_WRITER = f"{os.getpid()}@{socket.gethostname()}"


def _sweep_dead_writers(directory: str, prefix: str) -> None:
    """Remove temporary files left in `directory` by writers on this host that died."""
    host = socket.gethostname()
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            name = entry.name
            if not (name.startswith(prefix) and name.endswith(".tmp")):
                continue
            tag, sep, _ = name[len(prefix) :].partition("~")
            pid, _, writer_host = tag.partition("@")
            if sep and writer_host == host and pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _replace(tmp_path: str, url: str) -> None:
    """Atomically move ``tmp_path`` onto ``url`` and make the rename itself durable."""
    os.replace(tmp_path, url)
    directory = os.path.dirname(url) or "."
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
