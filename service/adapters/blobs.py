"""The blob store: round sample files and the deploy copy, local or S3, retried.

`BlobStore` is the face the runtime uses. Every write lands whole or not at all
(`service.adapters.staging`), so each call is idempotent, and the whole call is what is
retried on transient errors, with jittered exponential backoff. Local paths go through
``LocalFiles``, the file access policy: sources are regular files beneath a data root
reached without following a symlink. A model is copied only from inside the job's output dir
(local or S3) and only up to ``max_model_bytes``. Refusals are ``Refused``: permanent, not
retried.

Round files: the samples of given index ranges, copied from the dataset in one pass each.
The requested ranges are split into runs that one forward scan of the source can serve, and
each run is one scan through the shared `SampleScanner`, so "sample i" is the same line the
dataset polls counted. A clean block (no empty line, the common case) is sliced at line ends
found by the scanner's census and written as it is; only a block with empty lines is split
into lines. For remote txt datasets an index file lists the first field of each sample. A
round's files hold at most ``LIFELONG_MAX_ROUND_BYTES`` (a sparse dataset of 2 MB on disk
once made a 409 MiB round file), and old rounds' local files are removed (`prune`).

Model copies: the deployed model replaced whole by the bytes of the one that passed eval
(`ModelCopier`). A copy within one S3 endpoint is a server-side copy of the object version it
read and hashed (``CopySourceIfMatch`` its ETag); any other copy streams the model through a
staged file (`Staging`, by the pipelined writer), hashing what it reads. Either returns the
model's size and SHA-256 and, given the ones a rollback expects, refuses a model that no
longer matches before the target is replaced: the target then keeps what it held. Holes of a
sparse local model stay holes in a local copy (and are hashed as the zeros they read as). A
model bigger than the cap (``LIFELONG_MAX_MODEL_BYTES``) is ``Refused``; a source that does
not exist is ``SourceMissing``.
"""


import contextlib
import copy
import errno
import hashlib
import logging
import os
import posixpath
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import BinaryIO, Self, TypeVar

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from service import failpoints, heartbeat
from service.adapters import _lines, s3
from service.adapters.dataset_sources import (
    BOTO_ERRORS,
    DEFAULT_MAX_DATASET_BYTES,
    LocalSource,
    S3Source,
    SourceMissing,
    check_dataset_size,
    io_errors,
    open_source,
)
from service.adapters.files import LocalFiles
from service.adapters.s3 import S3Clients, S3CredentialLike
from service.adapters.scanner import (
    BLOCK_BYTES,
    DEFAULT_MAX_LINE_BYTES,
    Chunk,
    SampleBatch,
    SampleScanner,
    iter_batches,
    sample_lines,
)
from service.adapters.staging import PipelinedWriter, Staging
from service.core import paths
from service.core.rounds import ModelDigest
from service.errors import PermanentError, Refused, TransientError

T = TypeVar("T")
log = logging.getLogger(__name__)

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
        self.clean(b"\n".join(lines) + b"\n", len(lines))

    def clean(self, body: Chunk, count: int) -> None:
        """``count`` samples as newline-terminated lines with no empty one: already output
        (their index entries, their first fields, made from them in one C pass)."""
        self._put(body)
        if self._index is not None:
            entries = _lines.first_fields(body)
            self._count(len(entries))
            self._index.write(entries)
        self.written += count


def _take(batch: SampleBatch, run: list[SampleRange], i: int, writer: RoundWriter) -> int:
    """Write the part of ``run`` (from range ``i``) that ``batch`` holds; return the new i.

    A clean batch (the common case) is sliced at line ends found by the line census; only a
    batch with empty lines is split into lines.
    """
    low, high = batch.first, batch.first + batch.count
    body = batch.body
    lines: list[bytes] | None = None
    while i < len(run) and run[i][0] < high:
        start, end = run[i]
        a, b = max(start, low), min(end, high)
        if a < b and batch.clean:
            whole = (a, b) == (low, high)
            begin = 0 if whole else _lines.end_of_line(body, a - low)
            stop = len(body) if whole else _lines.end_of_line(body, b - low)
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
        data = stack.enter_context(PipelinedWriter(data_file, behind=False))
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
            i = _take(batch, run, i, writer)
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


_ZEROS = memoryview(bytes(BLOCK_BYTES))


class ModelCopier:
    """Copies models of at most ``max_bytes`` bytes, local or S3, through ``staging``."""

    def __init__(
        self, s3_clients: S3Clients, files: LocalFiles, staging: Staging, max_bytes: int
    ) -> None:
        self._s3 = s3_clients
        self._files = files
        self._staging = staging
        self._max_bytes = max_bytes

    def copy(
        self,
        src_url: str,
        dst_url: str,
        src_cred: S3CredentialLike | None,
        dst_cred: S3CredentialLike | None,
        expect: ModelDigest | None = None,
    ) -> ModelDigest:
        """Replace ``dst_url`` whole with the bytes of ``src_url``; what was read of it.

        With ``expect``, a source of another size or SHA-256 is ``Refused`` (naming both)
        and ``dst_url`` keeps what it held.
        """
        both_s3 = s3.is_s3_url(src_url) and s3.is_s3_url(dst_url)
        if both_s3 and self._s3.client(src_cred) is self._s3.client(dst_cred):
            return self._copy_in_s3(src_url, dst_url, dst_cred, expect)
        with self._staging.staged(dst_url, dst_cred) as out, PipelinedWriter(out) as pipelined:
            digest = self._download(src_url, src_cred, pipelined, expect)
            if expect is not None and digest != expect:
                raise _changed(src_url, digest, expect)
        return digest

    def _copy_in_s3(
        self, src_url: str, dst_url: str, cred: S3CredentialLike | None,
        expect: ModelDigest | None,
    ) -> ModelDigest:  # fmt: skip
        """Hash the source object as it is now, then copy that very version server-side."""
        src, dst = s3.parse_s3_url(src_url), s3.parse_s3_url(dst_url)
        client = self._s3.client(cred)
        try:
            head = client.head_object(Bucket=src.bucket, Key=src.key)
            size, etag = int(head["ContentLength"]), str(head.get("ETag", ""))
            self._check_model_size(src_url, size)
            if expect is not None and size != expect.size:
                raise _changed(src_url, None, expect, size)
            digest = _Digest()
            body = client.get_object(Bucket=src.bucket, Key=src.key, IfMatch=etag or "*")["Body"]
            with body:
                while chunk := body.read(BLOCK_BYTES):
                    digest.update(memoryview(chunk))
                    heartbeat.progress()  # a big model takes a while to hash
            result = digest.result()
            if expect is not None and result != expect:
                raise _changed(src_url, result, expect)
            client.copy_object(
                Bucket=dst.bucket,
                Key=dst.key,
                CopySource={"Bucket": src.bucket, "Key": src.key},
                CopySourceIfMatch=etag or "*",
            )
        except BOTO_ERRORS as e:
            if s3.is_not_found(e):
                raise SourceMissing(f"{src_url} does not exist") from e
            raise s3.translate(e, f"copying {src_url} to {dst_url}") from e
        return result

    def _check_model_size(self, url: str, size: int) -> None:
        if size > self._max_bytes:
            raise Refused(
                f"model {url} holds {size} bytes, more than {self._max_bytes} "
                "(LIFELONG_MAX_MODEL_BYTES)"
            )

    def _download(
        self,
        url: str,
        cred: S3CredentialLike | None,
        out: PipelinedWriter,
        expect: ModelDigest | None,
    ) -> ModelDigest:
        """Copy the whole of ``url`` into ``out`` in large blocks, hashing it (a local file's
        holes are skipped, then the copy is cut to the source's size: it stays as sparse)."""
        with (
            open_source(self._s3, self._files, url, cred) as source,
            io_errors(f"writing a copy of {url}"),
        ):
            self._check_model_size(url, source.size)
            if expect is not None and source.size != expect.size:
                raise _changed(url, None, expect, source.size)
            # a block, or the whole model if smaller: zeroing a block for a small model costs
            # more than copying it
            buffer = memoryview(bytearray(max(1, min(BLOCK_BYTES, source.size))))
            digest = _Digest()
            if isinstance(source, LocalSource):
                _copy_extents(source, out, buffer, digest)
            else:
                _copy_stream(source, out, buffer, digest)
            return digest.result()


class _Digest:
    """The size and SHA-256 of the bytes fed to it, in order."""

    def __init__(self) -> None:
        self._sha256 = hashlib.sha256()
        self._size = 0

    def update(self, data: memoryview) -> None:
        self._sha256.update(data)
        self._size += len(data)

    def zeros(self, count: int) -> None:
        """A hole of ``count`` bytes, which reads as zeros."""
        while count > 0:
            chunk = _ZEROS[: min(count, len(_ZEROS))]
            self.update(chunk)
            count -= len(chunk)

    def result(self) -> ModelDigest:
        return ModelDigest(size=self._size, sha256=self._sha256.hexdigest())


def _changed(
    url: str, digest: ModelDigest | None, expect: ModelDigest, size: int | None = None
) -> Refused:
    now = digest.describe() if digest is not None else f"{size} bytes"
    return Refused(
        f"model {url} is no longer the file that was deployed ({now} now, "
        f"{expect.describe()} then): it is not copied"
    )


def _copy_extents(
    source: LocalSource, out: PipelinedWriter, buffer: memoryview, digest: _Digest
) -> None:
    """The data stretches of a local source, each at its own offset in ``out`` (a new,
    empty file), which is then cut to the source's size: a hole before a stretch or at the
    end stays one. A source that fits in ``buffer`` is one stretch: finding its holes
    would cost more system calls than copying its zeros."""
    position = 0
    small = source.size <= len(buffer)
    for start, end in [(0, source.size)] if small else source.extents():
        if start != position:
            digest.zeros(start - position)
            out.seek(start)
            position = start
        while position < end and (size := source.read_at(buffer[: end - position], position)):
            digest.update(buffer[:size])
            out.write(buffer[:size])
            position += size
            failpoints.hit("blob-mid-copy", out)
    if position != source.size:  # a hole at the end (or a source cut short since its open)
        digest.zeros(source.size - position)
        out.truncate(source.size)


def _copy_stream(
    source: S3Source, out: PipelinedWriter, buffer: memoryview, digest: _Digest
) -> None:
    with source.range(0) as read_into:
        while size := read_into(buffer):
            digest.update(buffer[:size])
            out.write(buffer[:size])
            failpoints.hit("blob-mid-copy", out)


#: The default cap on a model's size (``LIFELONG_MAX_MODEL_BYTES``): 4 GiB.
DEFAULT_MAX_MODEL_BYTES = 4 << 30
#: The default cap on a round's bytes (``LIFELONG_MAX_ROUND_BYTES``): 16 GiB.
DEFAULT_MAX_ROUND_BYTES = 16 << 30


def local_size(path: str) -> int | None:
    """The size of the local regular file ``path`` now, an estimate (links followed: the
    work that reads it opens it by the file access policy, which refuses what it must); None
    for what is no regular file or cannot be looked at (the work then says why). The caller
    has told a local path from an S3 URL already."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_size if stat.S_ISREG(found.st_mode) else None


class BlobStore:
    """Writes round files and copies models, local or S3, retrying transient failures.

    ``files`` is the file access policy for local paths (default: any path outside the
    system directories); ``max_model_bytes``, ``max_line_bytes``, ``max_dataset_bytes`` and
    ``max_round_bytes`` the size caps.
    """

    def __init__(
        self,
        s3: S3Clients,
        *,
        files: LocalFiles | None = None,
        max_model_bytes: int = DEFAULT_MAX_MODEL_BYTES,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_dataset_bytes: int = DEFAULT_MAX_DATASET_BYTES,
        max_round_bytes: int = DEFAULT_MAX_ROUND_BYTES,
        attempts: int = 5,
        max_backoff_s: float = 8.0,
        tmp_dir: str | None = None,
    ) -> None:
        self._s3 = s3
        self._files = files or LocalFiles()
        self._max_line = max_line_bytes
        self._max_dataset = max_dataset_bytes
        self._max_round = max_round_bytes
        self._staging = Staging(s3, self._files, tmp_dir)
        self._models = ModelCopier(s3, self._files, self._staging, max_model_bytes)
        self._once = attempts <= 1
        self._retrying = Retrying(
            stop=stop_after_attempt(attempts),
            wait=wait_random_exponential(multiplier=min(0.25, max_backoff_s), max=max_backoff_s),
            retry=retry_if_exception_type(TransientError),
            reraise=True,
        )

    def _retry(self, fn: Callable[[], T]) -> T:
        if self._once:
            return fn()  # no retry to wait for: tenacity's machinery would only cost time
        return self._retrying.copy()(fn)

    def trying_once(self) -> Self:
        """This store (its files, staging and caps shared) trying each write or copy once:
        a transient failure is raised at once, for a caller that redoes the work elsewhere
        rather than wait out the retries' backoff."""
        once = copy.copy(self)
        once._once = True
        return once

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
        PermanentError; a source over ``max_dataset_bytes``, or files that would hold more than
        ``max_round_bytes``, raise ``Refused``.
        """

        def once() -> int:
            with (
                round_writer(
                    self._staging,
                    fmt=fmt,
                    data_url=data_url,
                    index_url=index_url,
                    index_prefix=index_prefix,
                    cred=dest_cred,
                    max_bytes=self._max_round,
                ) as writer,
                open_source(self._s3, self._files, source_url, source_cred) as source,
            ):
                # one open serves every run: each is a scan from the start of what it saw
                check_dataset_size(source_url, source.size, self._max_dataset)
                for run in ascending_runs(ranges) or [[]]:
                    copy_run(source, run, writer, url=source_url, fmt=fmt, max_line=self._max_line)
                return writer.written

        return self._retry(once)

    def copy_model(
        self,
        *,
        src_url: str,
        dst_url: str,
        output_dir: str | None,
        src_cred: S3CredentialLike | None,
        dst_cred: S3CredentialLike | None,
        expect: ModelDigest | None = None,
    ) -> ModelDigest:
        """Replace ``dst_url`` whole with the bytes of ``src_url``; their size and SHA-256.

        The source must lie in ``output_dir`` (the job's output dir, local or S3; None: a
        caller with no job, nothing to check), be a regular file reached without a symlink
        (local), hold at most ``max_model_bytes`` and, given ``expect``, have that size and
        SHA-256: else ``Refused``, and ``dst_url`` keeps what it held. A missing source
        raises PermanentError naming it.
        """
        if output_dir is not None and not paths.is_beneath(src_url, output_dir):
            raise Refused(f"model {src_url} is not in the job's output dir {output_dir}")
        try:
            return self._retry(
                lambda: self._models.copy(src_url, dst_url, src_cred, dst_cred, expect)
            )
        except SourceMissing as e:
            raise PermanentError(f"model {src_url} does not exist") from e

    def write_file(self, url: str, data: bytes, cred: S3CredentialLike | None) -> None:
        """Replace ``url`` whole with ``data`` (a reader sees the old bytes or the new, never
        a part), retrying transient failures."""

        def once() -> None:
            with self._staging.staged(url, cred) as out, io_errors(f"writing {url}"):
                out.write(data)

        self._retry(once)

    def make_dirs(self, urls: Iterable[str]) -> None:
        """Make the local directories ``urls`` that do not exist yet (with those they lie
        in), as the file access policy allows. Best effort: a failure is logged, never
        raised (the write that needs a directory makes it). S3 URLs are left alone: S3 has
        no directories."""
        for url in urls:
            if paths.is_remote(url):
                continue
            try:
                with self._files.directory(url, create=True) as (_, made):
                    if made:
                        self._staging.swept.made(url)
            except (OSError, Refused) as e:
                log.warning("directory %s not made ahead: %s", url, e)

    def prune_rounds(self, data_url: str, keep: Callable[[int], bool]) -> list[int]:
        """Remove the local data files of the rounds beside the round file ``data_url`` (its
        phase's ``<out>/data/{train|eval}``) whose version ``keep`` refuses; return those
        versions. Best effort: a failure is logged, never raised (the round itself is
        written). Round files on S3 are left as they are."""
        if paths.is_remote(data_url):
            return []
        phase_dir = posixpath.dirname(posixpath.dirname(data_url))
        try:
            return prune(self._files, phase_dir, keep)
        except (OSError, Refused) as e:
            log.warning("old round files in %s not removed: %s", phase_dir, e)
            return []
