"""Dataset and model sources: local files and S3 objects, read incrementally, errors translated.

Local files are opened through ``LocalFiles`` (the file access policy): beneath a data root,
no symlink followed, regular files only. An S3 object is read pinned to the ETag its HEAD
returned, so a rewrite while reading fails instead of mixing two versions. A source's byte
range is read by a `ReadInto`, which fills the caller's reused buffer. OS and boto errors
become `BlobUnavailable` (worth retrying) or `PermanentError` (`translate_io`); a source
that does not exist is `SourceMissing`.

Incremental polls of a dataset (`DatasetReader`): only what was appended since the last poll
is read. A dataset is a text file that writers keep appending to. Re-reading it whole on
every poll would cost O(size) per poll; instead a `Cursor` remembers how far we got (byte
offset, sample count, csv header, the last bytes before the offset and the file's identity)
and each poll reads only what was appended. A rewrite (new inode, shrink, or the bytes
before the offset changed) is noticed and answered with a re-read from the start.
"""

from __future__ import annotations

import errno
import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import boto3.exceptions
import botocore.exceptions
import msgspec

from service import heartbeat
from service.adapters import s3
from service.adapters.files import LocalFiles, NotAllowed
from service.adapters.s3 import S3Clients, S3CredentialLike
from service.adapters.scanner import DEFAULT_MAX_LINE_BYTES, ReadInto, SampleScanner
from service.errors import BlobUnavailable, PermanentError, Refused, ServiceError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

_PERMANENT_ERRNOS = frozenset(
    {
        errno.ENOENT,
        errno.EACCES,
        errno.EPERM,
        errno.EISDIR,
        errno.ENOTDIR,
        errno.EROFS,
        errno.ENAMETOOLONG,
        errno.ELOOP,
        errno.EINVAL,
        errno.EEXIST,
    }
)
BOTO_ERRORS = (
    botocore.exceptions.BotoCoreError,
    botocore.exceptions.ClientError,
    boto3.exceptions.Boto3Error,
)

#: The default cap on a dataset's size (``LIFELONG_MAX_DATASET_BYTES``): 64 GiB.
DEFAULT_MAX_DATASET_BYTES = 64 << 30


class SourceMissing(PermanentError):
    """The dataset or model source does not exist (yet)."""


def translate_io(e: Exception, context: str) -> ServiceError:
    """Map an OS or boto error to BlobUnavailable (worth retrying) or PermanentError."""
    if isinstance(e, ServiceError):
        return e
    if isinstance(e, BOTO_ERRORS):
        return s3.translate(e, context)
    if isinstance(e, OSError):
        reason = e.strerror or type(e).__name__
        if e.errno in _PERMANENT_ERRNOS:
            return PermanentError(f"{context}: {reason}")
        return BlobUnavailable(f"{context}: {reason}")
    return PermanentError(f"{context}: {type(e).__name__}")


@contextmanager
def io_errors(context: str) -> Iterator[None]:
    """Translate OS and boto errors raised inside the block (see ``translate_io``)."""
    try:
        yield
    except (OSError, *BOTO_ERRORS) as e:
        raise translate_io(e, context) from e


class LocalSource:
    """An open local file, its size and identity taken from the same descriptor."""

    def __init__(self, file: io.BufferedReader, context: str) -> None:
        st = os.fstat(file.fileno())
        self.size = st.st_size
        self.identity = f"{st.st_dev}:{st.st_ino}"
        self._file = file
        self._context = context

    def extents(self) -> Iterator[tuple[int, int]]:
        """The stretches ``[start, end)`` below the size seen at open that hold data, holes
        skipped (``SEEK_DATA``/``SEEK_HOLE``); the whole file where the file system cannot
        tell. Read them with ``read_at``, which does not use the file's position."""
        fd, pos = self._file.fileno(), 0
        while pos < self.size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
                end = min(os.lseek(fd, start, os.SEEK_HOLE), self.size)
            except OSError as e:
                if e.errno == errno.ENXIO:  # nothing but a hole from pos on
                    return
                if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                    raise translate_io(e, self._context) from e
                start, end = pos, self.size
            if start >= self.size:
                return
            yield start, end
            pos = end

    def read_at(self, view: memoryview, offset: int) -> int:
        """Fill a prefix of ``view`` with the bytes at ``offset``; how many (0 at the end)."""
        with io_errors(self._context):
            return os.preadv(self._file.fileno(), [view], offset)

    @contextmanager
    def range(self, start: int) -> Iterator[ReadInto]:
        """Read from ``start`` up to the size seen at open (later appends wait a poll)."""
        remaining = max(self.size - start, 0)
        with io_errors(self._context):
            self._file.seek(start)

        def read_into(view: memoryview) -> int:
            nonlocal remaining
            with io_errors(self._context):
                got = self._file.readinto(view[:remaining])
            remaining -= got
            return got

        yield read_into


class S3Source:
    """An S3 object's size and ETag (from HEAD); ranges are read pinned to that ETag."""

    def __init__(self, client: S3Client, url: str, context: str) -> None:
        self._client = client
        self._location = s3.parse_s3_url(url)
        self._context = context
        try:
            head = client.head_object(Bucket=self._location.bucket, Key=self._location.key)
        except BOTO_ERRORS as e:
            if s3.is_not_found(e):
                raise SourceMissing(f"{url} does not exist") from e
            raise translate_io(e, context) from e
        self.size = int(head["ContentLength"])
        self.identity = ""
        self._etag = head.get("ETag", "")

    @contextmanager
    def range(self, start: int) -> Iterator[ReadInto]:
        """Stream ``[start, size)`` with one ranged GET (nothing at all for an empty range)."""
        if start >= self.size:
            yield lambda _view: 0
            return
        loc = self._location
        with io_errors(self._context):
            response = self._client.get_object(
                Bucket=loc.bucket,
                Key=loc.key,
                Range=f"bytes={start}-{self.size - 1}",
                IfMatch=self._etag or "*",
            )
        body = response["Body"]

        def read_into(view: memoryview) -> int:
            with io_errors(self._context):
                data = body.read(len(view))
            view[: len(data)] = data
            return len(data)

        try:
            yield read_into
        finally:
            body.close()


@contextmanager
def open_source(
    clients: S3Clients, files: LocalFiles, url: str, cred: S3CredentialLike | None
) -> Iterator[LocalSource | S3Source]:
    """Open a dataset or model source; a missing one raises ``SourceMissing``, one the file
    access policy (``files``) or the file's permissions forbid raises ``NotAllowed``."""
    context = f"reading {url}"
    if s3.is_s3_url(url):
        with io_errors(context):
            client = clients.client(cred)
        yield S3Source(client, url, context)
        return
    file = open_local(files, url)
    try:
        with io_errors(context):
            source = LocalSource(file, context)
        yield source
    finally:
        file.close()


def open_local(files: LocalFiles, path: str) -> io.BufferedReader:
    """The regular file ``path`` opened for reading by the file access policy."""
    try:
        fd = files.open_regular(path)
    except FileNotFoundError as e:
        raise SourceMissing(f"{path} does not exist") from e
    except PermissionError as e:
        raise NotAllowed(f"{path}: permission denied") from e
    except OSError as e:
        raise translate_io(e, f"reading {path}") from e
    return io.BufferedReader(io.FileIO(fd, "r"))  # os.fdopen's isatty() probe spared


def read_exact(read_into: ReadInto, n: int) -> bytes:
    """Up to ``n`` bytes, fewer only when the range ends first."""
    view = memoryview(bytearray(n))
    got = 0
    while got < n and (part := read_into(view[got:])):
        got += part
    return bytes(view[:got])


def check_dataset_size(url: str, size: int, max_bytes: int) -> None:
    """``Refused`` when a dataset holds more than ``max_bytes``."""
    if size > max_bytes:
        raise Refused(
            f"{url} holds {size} bytes, more than the {max_bytes} a dataset may "
            "(LIFELONG_MAX_DATASET_BYTES)"
        )


class Cursor(msgspec.Struct, frozen=True, kw_only=True):
    """How far a dataset has been read; stored with the dataset's state."""

    offset: int = 0
    samples: int = 0
    header: str | None = None
    tail: bytes = b""
    identity: str = ""


class Poll(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of one poll: the new cursor and the dataset's current sample count."""

    cursor: Cursor
    num_samples: int
    bytes_read: int
    rewritten: bool
    missing: bool = False
    #: why a missing source cannot be read (for the log: it does not exist, permission
    #: denied, or the file access policy forbids it)
    why: str = ""


class DatasetReader:
    """Polls dataset sources incrementally (local files and S3 objects).

    ``files`` is the file access policy for local sources (default: any path outside the
    system directories); ``max_line_bytes`` the line cap, ``max_dataset_bytes`` the size cap.
    """

    def __init__(
        self,
        clients: S3Clients,
        *,
        files: LocalFiles | None = None,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_dataset_bytes: int = DEFAULT_MAX_DATASET_BYTES,
    ) -> None:
        self._clients = clients
        self._files = files or LocalFiles()
        self._max_line = max_line_bytes
        self._max_dataset = max_dataset_bytes

    def poll(self, url: str, fmt: str, cursor: Cursor, cred: S3CredentialLike | None) -> Poll:
        """Count the samples of ``url`` reading only what was appended since ``cursor``.

        Raises BlobUnavailable (retry later) or PermanentError (``Refused`` for a line over the
        cap or a dataset over the size cap); a missing source is not an error but
        ``Poll(missing=True)`` with the cursor unchanged, and so is one that may not be read
        (permission denied, or the file access policy): whoever names a dataset cannot tell
        a file that exists from one that does not.
        """
        try:
            with open_source(self._clients, self._files, url, cred) as source:
                return self._poll_open(source, url, fmt, cursor)
        except (SourceMissing, NotAllowed) as e:
            return Poll(
                cursor=cursor, num_samples=0, bytes_read=0, rewritten=False, missing=True,
                why=str(e),
            )  # fmt: skip

    def _poll_open(
        self, source: LocalSource | S3Source, url: str, fmt: str, cursor: Cursor
    ) -> Poll:
        check_dataset_size(url, source.size, self._max_dataset)
        replaced = bool(cursor.identity) and cursor.identity != source.identity
        if not replaced and source.size >= cursor.offset:
            with source.range(cursor.offset - len(cursor.tail)) as read_into:
                before = read_exact(read_into, len(cursor.tail))
                if before == cursor.tail:
                    scanner = SampleScanner(
                        fmt,
                        offset=cursor.offset,
                        samples=cursor.samples,
                        header_seen=cursor.header is not None,
                        tail=cursor.tail,
                        keep_lines=False,
                        expected_bytes=source.size - cursor.offset,
                        max_line=self._max_line,
                        source=url,
                    )
                    scanned = _scan(read_into, scanner)
                    return _poll_of(
                        scanner,
                        cursor.header,
                        source.identity,
                        len(before) + scanned,
                        rewritten=False,
                    )
            bytes_before = len(before)
        else:
            bytes_before = 0
        scanner = SampleScanner(
            fmt, keep_lines=False, expected_bytes=source.size, max_line=self._max_line, source=url
        )
        with source.range(0) as read_into:
            scanned = _scan(read_into, scanner)
        return _poll_of(scanner, None, source.identity, bytes_before + scanned, rewritten=True)


def _scan(read_into: ReadInto, scanner: SampleScanner) -> int:
    """Scan the whole range (counting only); return the number of bytes read."""
    total = 0
    while size := scanner.read_from(read_into)[0]:
        heartbeat.progress()  # a first poll of a big dataset is many reads
        total += size
    return total


def _poll_of(
    scanner: SampleScanner, header: str | None, identity: str, bytes_read: int, *, rewritten: bool
) -> Poll:
    if header is None and scanner.header is not None:
        header = scanner.header.decode("utf-8", errors="replace")
    cursor = Cursor(
        offset=scanner.offset,
        samples=scanner.samples,
        header=header,
        tail=scanner.tail,
        identity=identity,
    )
    pending = 1 if scanner.finish() is not None else 0
    return Poll(
        cursor=cursor,
        num_samples=cursor.samples + pending,
        bytes_read=bytes_read,
        rewritten=rewritten,
    )
