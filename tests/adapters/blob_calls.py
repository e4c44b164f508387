"""What the blob and dataset tests share: S3 credentials for the test server, and a round
write that names only what a test varies."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from service.adapters.blobs import BlobStore


@dataclass(frozen=True)
class Cred:
    endpoint: str | None
    use_https: bool = False
    access_key_id: str | None = "testing"
    secret_access_key: str | None = "testing"


def write_round(
    store: BlobStore,
    source: str | Path,
    data: str | Path,
    ranges: Sequence[tuple[int, int]],
    *,
    fmt: str = "txt",
    index: str | Path | None = None,
    index_prefix: str | None = None,
    source_cred: Cred | None = None,
    dest_cred: Cred | None = None,
) -> int:
    """`BlobStore.write_round` from ``source`` to ``data``: no index file and no credentials
    (local files) unless given."""
    return store.write_round(
        source_url=str(source),
        fmt=fmt,
        ranges=ranges,
        data_url=str(data),
        index_url=None if index is None else str(index),
        index_prefix=index_prefix,
        source_cred=source_cred,
        dest_cred=dest_cred,
    )
