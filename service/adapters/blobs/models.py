"""Model copies: the deployed model replaced whole by the bytes of the one that passed eval.

A copy within one S3 endpoint is a server-side copy; a local model goes to S3 by upload; any
other pair is streamed through a staged file (`Staging`) by the pipelined writer. Holes of a
sparse local model stay holes in a local copy. A model bigger than the cap
(``LIFELONG_MAX_MODEL_BYTES``) is ``Refused``; a source that does not exist is
``SourceMissing``.
"""

from __future__ import annotations

import os

from service import failpoints, heartbeat
from service.adapters import s3
from service.adapters.blobs.pipelined import PipelinedWriter
from service.adapters.blobs.staging import Staging
from service.adapters.datasets.scanner import BLOCK_BYTES
from service.adapters.datasets.sources import (
    BOTO_ERRORS,
    LocalSource,
    S3Source,
    SourceMissing,
    io_errors,
    open_local,
    open_source,
)
from service.adapters.files import LocalFiles
from service.adapters.s3 import S3Clients, S3CredentialLike
from service.errors import Refused


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
    ) -> None:
        both_s3 = s3.is_s3_url(src_url) and s3.is_s3_url(dst_url)
        if both_s3 and self._s3.client(src_cred) is self._s3.client(dst_cred):
            self._copy_in_s3(src_url, dst_url, dst_cred)
            return
        if s3.is_s3_url(dst_url) and not s3.is_s3_url(src_url):
            self._upload_local(src_url, dst_url, dst_cred)
            return
        with self._staging.staged(dst_url, dst_cred) as out, PipelinedWriter(out) as pipelined:
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
            beat = heartbeat.current_beat()  # the transfer's threads report its progress
            self._s3.client(cred).upload_fileobj(
                file, location.bucket, location.key, Callback=lambda _sent: beat()
            )

    def _check_model_size(self, url: str, size: int) -> None:
        if size > self._max_bytes:
            raise Refused(
                f"model {url} holds {size} bytes, more than {self._max_bytes} "
                "(LIFELONG_MAX_MODEL_BYTES)"
            )

    def _download(self, url: str, cred: S3CredentialLike | None, out: PipelinedWriter) -> None:
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


def _copy_extents(source: LocalSource, out: PipelinedWriter, buffer: memoryview) -> None:
    """The data stretches of a local source, each at its own offset in ``out``."""
    for start, end in source.extents():
        out.seek(start)
        position = start
        while position < end and (size := source.read_at(buffer[: end - position], position)):
            out.write(buffer[:size])
            position += size
            failpoints.hit("blob-mid-copy", out)


def _copy_stream(source: S3Source, out: PipelinedWriter, buffer: memoryview) -> None:
    with source.range(0) as read_into:
        while size := read_into(buffer):
            out.write(buffer[:size])
            failpoints.hit("blob-mid-copy", out)
