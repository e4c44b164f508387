"""The blob store: round sample files and the deploy copy, local or S3, retried.

Every write lands whole or not at all (`staging`), so each call is idempotent, and the whole
call is what is retried on transient errors, with jittered exponential backoff. Local paths
go through ``LocalFiles``, the file access policy: sources are regular files beneath a data
root reached without following a symlink. A model is copied only from inside the job's
output dir (local or S3) and only up to ``max_model_bytes``. Refusals are ``Refused``:
permanent, not retried.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Callable, Sequence
from typing import TypeVar

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from service.adapters.blobs.models import ModelCopier
from service.adapters.blobs.rounds import (
    SampleRange,
    ascending_runs,
    copy_run,
    prune,
    round_writer,
)
from service.adapters.blobs.staging import Staging
from service.adapters.datasets.scanner import DEFAULT_MAX_LINE_BYTES
from service.adapters.datasets.sources import (
    DEFAULT_MAX_DATASET_BYTES,
    SourceMissing,
    check_dataset_size,
    open_source,
)
from service.adapters.files import LocalFiles
from service.adapters.s3 import S3Clients, S3CredentialLike
from service.core import paths
from service.core.rounds import ModelDigest
from service.errors import PermanentError, Refused, TransientError

T = TypeVar("T")
log = logging.getLogger(__name__)
#: The default cap on a model's size (``LIFELONG_MAX_MODEL_BYTES``): 4 GiB.
DEFAULT_MAX_MODEL_BYTES = 4 << 30
#: The default cap on a round's bytes (``LIFELONG_MAX_ROUND_BYTES``): 16 GiB.
DEFAULT_MAX_ROUND_BYTES = 16 << 30


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

