"""Incremental polls of a dataset: only what was appended since the last poll is read.

A dataset is a text file that writers keep appending to. Re-reading it whole on every poll
would cost O(size) per poll; instead a `Cursor` remembers how far we got (byte offset,
sample count, csv header, the last bytes before the offset and the file's identity) and each
poll reads only what was appended. A rewrite (new inode, shrink, or the bytes before the
offset changed) is noticed and answered with a re-read from the start.
"""

from __future__ import annotations

import msgspec

from service import heartbeat
from service.adapters.datasets.scanner import DEFAULT_MAX_LINE_BYTES, SampleScanner
from service.adapters.datasets.sources import (
    DEFAULT_MAX_DATASET_BYTES,
    LocalSource,
    ReadInto,
    S3Source,
    SourceMissing,
    check_dataset_size,
    open_source,
    read_exact,
)
from service.adapters.files import LocalFiles, NotAllowed
from service.adapters.s3 import S3Clients, S3CredentialLike


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

    def poll(
        self, url: str, fmt: str, cursor: Cursor, cred: S3CredentialLike | None
    ) -> Poll:
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
                        fmt, offset=cursor.offset, samples=cursor.samples,
                        header_seen=cursor.header is not None, tail=cursor.tail,
                        keep_lines=False, expected_bytes=source.size - cursor.offset,
                        max_line=self._max_line, source=url,
                    )
                    scanned = _scan(read_into, scanner)
                    return _poll_of(scanner, cursor.header, source.identity,
                                    len(before) + scanned, rewritten=False)
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
        offset=scanner.offset, samples=scanner.samples, header=header, tail=scanner.tail,
        identity=identity,
    )
    pending = 1 if scanner.finish() is not None else 0
    return Poll(
        cursor=cursor, num_samples=cursor.samples + pending, bytes_read=bytes_read,
        rewritten=rewritten,
    )
