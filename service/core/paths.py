"""The file layout of a job's rounds, and the volume prefix.

Workers see paths as the cloud wrote them (`/output/...`); the controller may see the host's
root mounted elsewhere (`ROOTFS_MOUNT_DIR=/rootfs`), so local paths get the prefix added before
touching disk and trimmed before going to a worker. S3 URLs are never prefixed. Adding is
idempotent (a path already under the prefix is not prefixed again: Sedna's bug 7).
"""

from __future__ import annotations

import posixpath

S3_SCHEME = "s3://"
DEPLOY_MODEL = "deploy/index.pkl"


def is_remote(url: str) -> bool:
    return url.startswith(S3_SCHEME)


def join(base: str, *parts: str) -> str:
    """Join with "/" for both local paths and s3:// URLs, without doubling slashes."""
    return "/".join([base.rstrip("/"), *(part.strip("/") for part in parts)])


def add_prefix(prefix: str, path: str) -> str:
    """The disk path of a worker-visible local path."""
    if not prefix or is_remote(path):
        return path
    clean = prefix.rstrip("/")
    if path == clean or path.startswith(clean + "/"):
        return path
    return clean + "/" + path.lstrip("/")


def trim_prefix(prefix: str, path: str) -> str:
    """The worker-visible path of a disk path."""
    if not prefix or is_remote(path):
        return path
    clean = prefix.rstrip("/")
    if path.startswith(clean + "/"):
        return path[len(clean) :]
    return path


def data_file(fmt: str) -> str:
    return "data.csv" if fmt == "csv" else "data.txt"


def round_data_dir(output_dir: str, phase: str, version: int) -> str:
    """`<out>/data/{train|eval}/{v}`: where a round's sample files go."""
    return join(output_dir, "data", phase, str(version))


def round_output_dir(output_dir: str, phase: str, version: int) -> str:
    """`<out>/{train|eval}/{v}`: the worker's output directory for a round."""
    return join(output_dir, phase, str(version))


def deploy_model(output_dir: str) -> str:
    return join(output_dir, DEPLOY_MODEL)


def needs_index(dataset_url: str, fmt: str) -> bool:
    """dataIndex.txt is written beside the data when the dataset is remote and txt."""
    return is_remote(dataset_url) and fmt == "txt"


def index_prefix(dataset_url: str) -> str:
    """The dataset URL's directory with a trailing "/" (dataIndex.txt's first line)."""
    if is_remote(dataset_url):
        head, _, _ = dataset_url[len(S3_SCHEME) :].rpartition("/")
        return S3_SCHEME + head + "/"
    return posixpath.dirname(dataset_url).rstrip("/") + "/"


def canonical_dir(url: str) -> str:
    """One spelling of a directory: local paths without empty or "." components and without
    a trailing "/"; S3 URLs without a trailing "/" (their keys are otherwise literal)."""
    if is_remote(url):
        return url.rstrip("/")
    return "/" + "/".join(part for part in url.split("/") if part not in ("", "."))


def is_beneath(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or lies inside it, judged on the names alone.

    Local paths must both be absolute; they are compared component by component after
    dropping empty and "." components (`/a//b/./c` is `/a/b/c`), so `/a/bc` is not beneath
    `/a/b`. A ".." component anywhere, a NUL, or a relative path makes the answer False:
    without the file system, ".." cannot be resolved safely. S3 URLs compare by bucket, then
    by key prefix ending at a "/" (S3 keys are literal: `s3://b/a//x` is not beneath
    `s3://b/a/x`); a "." or ".." key component makes the answer False, since some clients
    normalise them. A local path is never beneath an S3 URL, nor the other way round.
    Nothing is resolved: symlinks are the file system's business.
    """
    if is_remote(path) != is_remote(directory):
        return False
    if is_remote(path):
        return _s3_beneath(path[len(S3_SCHEME) :], directory[len(S3_SCHEME) :])
    inner, outer = _local_parts(path), _local_parts(directory)
    if inner is None or outer is None:
        return False
    return inner[: len(outer)] == outer


def _local_parts(path: str) -> tuple[str, ...] | None:
    if not path.startswith("/") or "\0" in path:
        return None
    parts = tuple(part for part in path.split("/") if part not in ("", "."))
    return None if ".." in parts else parts


def _s3_beneath(path: str, directory: str) -> bool:
    """Both without the scheme: `bucket/key`."""
    bucket, _, key = path.partition("/")
    dir_bucket, _, dir_key = directory.partition("/")
    if not bucket or bucket != dir_bucket or "\0" in path:
        return False
    if any(part in (".", "..") for part in key.split("/") + dir_key.split("/")):
        return False
    prefix = dir_key.rstrip("/")
    if not prefix:
        return True  # the whole bucket
    return key.rstrip("/") == prefix or key.startswith(prefix + "/")
