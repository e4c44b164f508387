"""Incremental reading of dataset sources: local files and S3 objects.

A dataset is a text file that writers keep appending to. Re-reading it whole on every poll
(the seed's bug 13) costs O(size) per poll; instead a ``Cursor`` remembers how far we got
(byte offset, sample count, csv header, the last bytes before the offset and the file's
identity) and each poll reads only what was appended. A rewrite (new inode, shrink, or the
bytes before the offset changed) is noticed and answered with a re-read from the start.

The sample definition lives here, once, in ``SampleScanner``; the blob writer streams round
files through the same scanner so that "sample i" means the same line everywhere:
lines split on b"\\n", one trailing b"\\r" stripped, empty lines skipped, the first non-empty
csv line is the header, and an unterminated last line is a sample that is not yet consumed.
Blocks are processed with C-level bytes operations (replace, translate, count), never a
Python loop per line, and memory stays at a few blocks whatever the file size.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

import boto3.exceptions
import botocore.exceptions
import msgspec

from service.adapters import s3
from service.adapters.s3 import S3Clients, S3CredentialLike
from service.errors import BlobUnavailable, PermanentError, ServiceError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

BLOCK_BYTES = 1 << 20
TAIL_BYTES = 64

# Every byte except b"\n" becomes b"x": a non-empty line then ends in b"x\n", and those
# occurrences cannot overlap, so bytes.count counts non-empty lines exactly.
_MARK_TABLE = bytes(0x0A if i == 0x0A else 0x78 for i in range(256))

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

Read = Callable[[int], bytes]
"""Reads up to n bytes (fewer only at the end); b"" at the end of the range."""


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


@dataclass(frozen=True, slots=True)
class SampleBatch:
    """Complete lines of one block: samples ``first .. first+count``.

    ``body`` is b"\\n"-terminated lines with CRLF folded; it may still contain empty lines
    (``sample_lines`` drops them) and never contains the csv header.
    """

    first: int
    count: int
    body: bytes


def sample_lines(body: bytes) -> list[bytes]:
    """The samples of a batch body, in order."""
    return [line for line in body.split(b"\n") if line]


def _fold_crlf(lines: bytes) -> bytes:
    """Strip one b"\\r" before each b"\\n" (a replace pass consumes each CR at most once).

    The single-byte test first: it runs at memchr speed, the two-byte search of `replace`
    at a fraction of it, and most files have no CR at all.
    """
    return lines.replace(b"\r\n", b"\n") if b"\r" in lines else lines


def has_empty_lines(folded: bytes) -> bool:
    """Whether newline-terminated ``folded`` holds an empty line (rare: the fast paths skip
    the per-line work when it does not)."""
    return folded.startswith(b"\n") or b"\n\n" in folded


def _count_non_empty(folded: bytes) -> int:
    if not has_empty_lines(folded):
        return folded.count(b"\n")
    return folded.translate(_MARK_TABLE).count(b"x\n")


def _split_header(folded: bytes) -> tuple[bytes, bytes]:
    """The first non-empty line of ``folded`` and everything after it."""
    start = len(folded) - len(folded.lstrip(b"\n"))
    end = folded.index(b"\n", start)
    return folded[start:end], folded[end + 1 :]


class SampleScanner:
    """Splits a byte stream, fed in blocks from a line boundary, into samples.

    ``offset`` is the absolute end of the last complete line, ``samples`` the number of
    samples before it, ``tail`` the last ``TAIL_BYTES`` bytes before ``offset``. With
    ``keep_lines=False`` (counting only) a long partial line is shortened to two bytes, which
    keeps its emptiness verdict, so one endless line cannot grow memory.
    """

    def __init__(
        self,
        fmt: str,
        *,
        offset: int = 0,
        samples: int = 0,
        header_seen: bool = False,
        tail: bytes = b"",
        keep_lines: bool = True,
    ) -> None:
        self.offset = offset
        self.samples = samples
        self.header: bytes | None = None
        self.tail = tail[-TAIL_BYTES:]
        self._header_seen = header_seen or fmt != "csv"
        self._recent = self.tail
        self._position = offset
        self._carry = b""
        self._keep_lines = keep_lines

    def feed(self, block: bytes) -> SampleBatch | None:
        """Take the next block; return the batch of lines it completed, if any."""
        base = self._position
        self._position += len(block)
        end = block.rfind(b"\n")
        if end < 0:
            self._carry = self._shorten(self._carry + block)
            self._recent = (self._recent + block)[-TAIL_BYTES:]
            return None
        if end + 1 >= TAIL_BYTES:
            self.tail = block[end + 1 - TAIL_BYTES : end + 1]
        else:
            self.tail = (self._recent + block[: end + 1])[-TAIL_BYTES:]
        self._recent = (self._recent + block[-TAIL_BYTES:])[-TAIL_BYTES:]
        folded = _fold_crlf(self._carry + block[: end + 1])
        self._carry = self._shorten(block[end + 1 :])
        self.offset = base + end + 1
        return self._batch(folded)

    def finish(self) -> SampleBatch | None:
        """The unterminated last line as a one-sample batch (not consumed), if it is one."""
        line = self._carry[:-1] if self._carry.endswith(b"\r") else self._carry
        if not line or not self._header_seen:
            return None
        return SampleBatch(self.samples, 1, line + b"\n")

    def _batch(self, folded: bytes) -> SampleBatch:
        first = self.samples
        count = _count_non_empty(folded)
        if not self._header_seen and count:
            self.header, folded = _split_header(folded)
            self._header_seen = True
            count -= 1
        self.samples += count
        return SampleBatch(first, count, folded)

    def _shorten(self, carry: bytes) -> bytes:
        if self._keep_lines or not self._header_seen or len(carry) <= 2:
            return carry
        return carry[:2]


def iter_batches(read: Read, scanner: SampleScanner) -> Iterator[SampleBatch]:
    """Feed ``read`` to ``scanner`` block by block; the unterminated last line comes last."""
    while block := read(BLOCK_BYTES):
        batch = scanner.feed(block)
        if batch is not None:
            yield batch
    last = scanner.finish()
    if last is not None:
        yield last


def read_exact(read: Read, n: int) -> bytes:
    """Up to ``n`` bytes, fewer only when the range ends first."""
    parts: list[bytes] = []
    while n > 0 and (part := read(n)):
        parts.append(part)
        n -= len(part)
    return b"".join(parts)


class LocalSource:
    """An open local file, its size and identity taken from the same descriptor."""

    def __init__(self, file: BinaryIO, context: str) -> None:
        st = os.fstat(file.fileno())
        self.size = st.st_size
        self.identity = f"{st.st_dev}:{st.st_ino}"
        self._file = file
        self._context = context

    @contextmanager
    def range(self, start: int) -> Iterator[Read]:
        """Read from ``start`` up to the size seen at open (later appends wait a poll)."""
        remaining = max(self.size - start, 0)
        with io_errors(self._context):
            self._file.seek(start)

        def read(n: int) -> bytes:
            nonlocal remaining
            with io_errors(self._context):
                data = self._file.read(min(n, remaining))
            remaining -= len(data)
            return data

        yield read


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
    def range(self, start: int) -> Iterator[Read]:
        """Stream ``[start, size)`` with one ranged GET (nothing at all for an empty range)."""
        if start >= self.size:
            yield lambda _n: b""
            return
        loc = self._location
        with io_errors(self._context):
            response = self._client.get_object(
                Bucket=loc.bucket, Key=loc.key, Range=f"bytes={start}-{self.size - 1}",
                IfMatch=self._etag or "*",
            )
        body = response["Body"]

        def read(n: int) -> bytes:
            with io_errors(self._context):
                return body.read(n)

        try:
            yield read
        finally:
            body.close()


@contextmanager
def open_source(
    clients: S3Clients, url: str, cred: S3CredentialLike | None
) -> Iterator[LocalSource | S3Source]:
    """Open a dataset or model source; a missing one raises ``SourceMissing``."""
    context = f"reading {url}"
    if s3.is_s3_url(url):
        with io_errors(context):
            client = clients.client(cred)
        yield S3Source(client, url, context)
        return
    try:
        file = open(url, "rb")  # noqa: SIM115 - closed below, after the caller is done
    except FileNotFoundError as e:
        raise SourceMissing(f"{url} does not exist") from e
    except OSError as e:
        raise translate_io(e, context) from e
    try:
        with io_errors(context):
            source = LocalSource(file, context)
        yield source
    finally:
        file.close()


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


class DatasetReader:
    """Polls dataset sources incrementally (local files and S3 objects)."""

    def __init__(self, clients: S3Clients) -> None:
        self._clients = clients

    def poll(
        self, url: str, fmt: str, cursor: Cursor, cred: S3CredentialLike | None
    ) -> Poll:
        """Count the samples of ``url`` reading only what was appended since ``cursor``.

        Raises BlobUnavailable (retry later) or PermanentError; a missing source is not an
        error but ``Poll(missing=True)`` with the cursor unchanged.
        """
        try:
            with open_source(self._clients, url, cred) as source:
                return self._poll_open(source, fmt, cursor)
        except SourceMissing:
            return Poll(cursor=cursor, num_samples=0, bytes_read=0, rewritten=False, missing=True)

    def _poll_open(self, source: LocalSource | S3Source, fmt: str, cursor: Cursor) -> Poll:
        replaced = bool(cursor.identity) and cursor.identity != source.identity
        if not replaced and source.size >= cursor.offset:
            with source.range(cursor.offset - len(cursor.tail)) as read:
                before = read_exact(read, len(cursor.tail))
                if before == cursor.tail:
                    scanner = SampleScanner(
                        fmt, offset=cursor.offset, samples=cursor.samples,
                        header_seen=cursor.header is not None, tail=cursor.tail,
                        keep_lines=False,
                    )
                    scanned = _scan(read, scanner)
                    return _poll_of(scanner, cursor.header, source.identity,
                                    len(before) + scanned, rewritten=False)
            bytes_before = len(before)
        else:
            bytes_before = 0
        scanner = SampleScanner(fmt, keep_lines=False)
        with source.range(0) as read:
            scanned = _scan(read, scanner)
        return _poll_of(scanner, None, source.identity, bytes_before + scanned, rewritten=True)


def _scan(read: Read, scanner: SampleScanner) -> int:
    """Feed everything ``read`` yields to ``scanner``; return the number of bytes read."""
    total = 0
    while block := read(BLOCK_BYTES):
        total += len(block)
        scanner.feed(block)
    return total


def _poll_of(
    scanner: SampleScanner, header: str | None, identity: str, bytes_read: int, *, rewritten: bool
) -> Poll:
    if header is None and scanner.header is not None:
        header = scanner.header.decode("utf-8", errors="replace")
    cursor = Cursor(
        offset=scanner.offset, samples=scanner.samples, header=header, tail=scanner.tail,
        identity=identity,
    )
    pending = 1 if scanner.finish() is not None else 0
    return Poll(
        cursor=cursor, num_samples=cursor.samples + pending, bytes_read=bytes_read,
        rewritten=rewritten,
    )
