"""Round sample files and the deploy copy: the controller's writes, local or S3.

Every write lands whole or not at all: local targets are written to a temporary file in
the target's own directory, fsynced and renamed onto the target (so a smaller new model
never leaves old bytes behind, the seed's bug 10, and a symlink planted as the target is
replaced, not written through); S3 targets are uploaded from a temporary file. Temporary
files are removed on every path (the seed's bug 11). Each call is idempotent, so the whole
call is what we retry on transient errors, with jittered exponential backoff.

Local paths go through ``LocalFiles``, the file access policy: sources are regular files
beneath a data root reached without following a symlink, and the target's directory is
created and opened the same way, then written through its descriptor. A model is copied only
from inside the job's output dir (local or S3), only up to ``max_model_bytes``, and holes of
a sparse local model stay holes in the copy. Refusals are ``Refused``: permanent, not retried.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import secrets
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
    DEFAULT_MAX_LINE_BYTES,
    Chunk,
    LineCensus,
    LocalSource,
    S3Source,
    SampleBatch,
    SampleScanner,
    SourceMissing,
    io_errors,
    iter_batches,
    open_local,
    open_source,
    sample_lines,
)
from service.adapters.files import LocalFiles
from service.adapters.s3 import S3Clients, S3CredentialLike
from service.core import paths
from service.errors import PermanentError, Refused, TransientError

T = TypeVar("T")
#: Writes at least this big go to the blob writer's helper thread.
PIPELINED_MIN_BYTES = 1 << 16
#: The default cap on a model's size (``LIFELONG_MAX_MODEL_BYTES``): 4 GiB.
DEFAULT_MAX_MODEL_BYTES = 4 << 30
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
    """Writes round files and copies models, local or S3, retrying transient failures.

    ``files`` is the file access policy for local paths (default: any path outside the
    system directories); ``max_model_bytes`` and ``max_line_bytes`` the size caps.
    """

    def __init__(
        self,
        s3: S3Clients,
        *,
        files: LocalFiles | None = None,
        max_model_bytes: int = DEFAULT_MAX_MODEL_BYTES,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        attempts: int = 5,
        max_backoff_s: float = 8.0,
        tmp_dir: str | None = None,
    ) -> None:
        self._s3 = s3
        self._files = files or LocalFiles()
        self._max_model = max_model_bytes
        self._max_line = max_line_bytes
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
        with open_source(self._s3, self._files, url, cred) as source, source.range(0) as read_into:
            scanner = SampleScanner(
                fmt, expected_bytes=source.size, max_line=self._max_line, source=url
            )
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
        output_dir: str | None,
        src_cred: S3CredentialLike | None,
        dst_cred: S3CredentialLike | None,
    ) -> None:
        """Replace ``dst_url`` whole with the bytes of ``src_url``.

        The source must lie in ``output_dir`` (the job's output dir, local or S3; None: a
        caller with no job, nothing to check), be a regular file reached without a symlink
        (local) and hold at most ``max_model_bytes``: else ``Refused``. A missing source
        raises PermanentError naming it.
        """
        if src_url == dst_url:
            return
        if output_dir is not None and not paths.is_beneath(src_url, output_dir):
            raise Refused(f"model {src_url} is not in the job's output dir {output_dir}")
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
            head = client.head_object(Bucket=src.bucket, Key=src.key)
            self._check_model_size(src_url, int(head["ContentLength"]))
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
        file = open_local(self._files, src_url)
        location = s3.parse_s3_url(dst_url)
        with file, io_errors(f"uploading {src_url} to {dst_url}"):
            self._check_model_size(src_url, os.fstat(file.fileno()).st_size)
            self._s3.client(cred).upload_fileobj(file, location.bucket, location.key)

    def _check_model_size(self, url: str, size: int) -> None:
        if size > self._max_model:
            raise Refused(
                f"model {url} holds {size} bytes, more than {self._max_model} "
                "(LIFELONG_MAX_MODEL_BYTES)"
            )

    def _download(self, url: str, cred: S3CredentialLike | None, out: _Pipelined) -> None:
        """Copy the whole of ``url`` into ``out`` in large blocks (a local file's holes are
        skipped, then the copy is cut to the source's size: it stays as sparse)."""
        with (
            open_source(self._s3, self._files, url, cred) as source,
            io_errors(f"writing a copy of {url}"),
        ):
            self._check_model_size(url, source.size)
            buffer = memoryview(bytearray(BLOCK_BYTES))
            if isinstance(source, LocalSource):
                _copy_extents(source, out, buffer)
                out.truncate(source.size)
            else:
                _copy_stream(source, out, buffer)

    @contextmanager
    def _staged(self, url: str, cred: S3CredentialLike | None) -> Iterator[BinaryIO]:
        """A temporary file that becomes ``url`` if the block succeeds; always cleaned up."""
        if not s3.is_s3_url(url):
            with self._staged_local(url) as out:
                yield out
            return
        context = f"writing {url}"
        with io_errors(context):
            directory, prefix = self._tmp_dir or tempfile.gettempdir(), "lifelong-"
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
                self._upload(tmp_path, url, cred)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_path)

    @contextmanager
    def _staged_local(self, path: str) -> Iterator[BinaryIO]:
        """``_staged`` for a local target: its directory is created and opened by the file
        access policy, and the temporary file is created, renamed onto the target and
        removed through that directory's descriptor, never through the path again."""
        context = f"writing {path}"
        directory, name = posixpath.split(path)
        prefix = f".{name}."
        with io_errors(context), self._files.directory(directory, create=True) as dir_fd:
            _sweep_dead_writers(dir_fd, prefix)
            tmp_name, fd = _create_temporary(dir_fd, prefix)
            try:
                with os.fdopen(fd, "wb") as out:
                    yield out
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp_name, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                os.fsync(dir_fd)  # the rename itself is durable
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp_name, dir_fd=dir_fd)

    def _upload(self, path: str, url: str, cred: S3CredentialLike | None) -> None:
        location = s3.parse_s3_url(url)
        self._s3.client(cred).upload_file(path, location.bucket, location.key)


def _copy_extents(source: LocalSource, out: _Pipelined, buffer: memoryview) -> None:
    """The data stretches of a local source, each at its own offset in ``out``."""
    for start, end in source.extents():
        out.seek(start)
        position = start
        while position < end and (size := source.read_at(buffer[: end - position], position)):
            out.write(buffer[:size])
            position += size
            failpoints.hit("blob-mid-copy", out)


def _copy_stream(source: S3Source, out: _Pipelined, buffer: memoryview) -> None:
    with source.range(0) as read_into:
        while size := read_into(buffer):
            out.write(buffer[:size])
            failpoints.hit("blob-mid-copy", out)


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

    def seek(self, offset: int) -> None:
        """Go on writing at ``offset``; skipped bytes stay a hole."""
        self.wait()
        self._file.seek(offset)
        self._written = offset

    def truncate(self, size: int) -> None:
        """Cut or extend (with a hole) the file to ``size`` bytes."""
        self.wait()
        self._file.truncate(size)

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


def _create_temporary(dir_fd: int, prefix: str) -> tuple[str, int]:
    """A new file `<prefix><writer>~<random>.tmp` (mode 0600) in the directory; its name and
    a descriptor open for writing."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        name = f"{prefix}{_WRITER}~{secrets.token_hex(4)}.tmp"
        with contextlib.suppress(FileExistsError):
            return name, os.open(name, flags, 0o600, dir_fd=dir_fd)


def _sweep_dead_writers(directory: str | int, prefix: str) -> None:
    """Remove temporary files left in `directory` (a path or a descriptor) by writers on
    this host that died."""
    host = socket.gethostname()
    dir_fd = directory if isinstance(directory, int) else None
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            name = entry.name
            if not (name.startswith(prefix) and name.endswith(".tmp")):
                continue
            tag, sep, _ = name[len(prefix) :].partition("~")
            pid, _, writer_host = tag.partition("@")
            if sep and writer_host == host and pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name if dir_fd is not None else entry.path, dir_fd=dir_fd)


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
