"""Model copies: the deployed model replaced whole by the bytes of the one that passed eval.

A copy within one S3 endpoint is a server-side copy of the object version it read and
hashed (``CopySourceIfMatch`` its ETag); any other copy streams the model through a staged
file (`Staging`, by the pipelined writer), hashing what it reads. Either returns the model's
size and SHA-256 and, given the ones a rollback expects, refuses a model that no longer
matches before the target is replaced: the target then keeps what it held. Holes of a
sparse local model stay holes in a local copy (and are hashed as the zeros they read as).
A model bigger than the cap (``LIFELONG_MAX_MODEL_BYTES``) is ``Refused``; a source that
does not exist is ``SourceMissing``.
"""

from __future__ import annotations

import hashlib

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
    open_source,
)
from service.adapters.files import LocalFiles
from service.adapters.s3 import S3Clients, S3CredentialLike
from service.core.rounds import ModelDigest
from service.errors import Refused

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
    end stays one."""
    position = 0
    for start, end in source.extents():
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
