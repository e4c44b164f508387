"""The file layout of a job's rounds, the volume prefix, and where a job's files may lie.

Workers see paths as the cloud wrote them (`/output/...`); the controller may see the host's
root mounted elsewhere (`ROOTFS_MOUNT_DIR=/rootfs`), so local paths get the prefix added before
touching disk and trimmed before going to a worker. S3 URLs are never prefixed. Adding is
idempotent (a path already under the prefix is not prefixed again: Sedna's bug 7).

The data roots (`LIFELONG_DATA_ROOTS`) bound every local path the controller reads or writes
for a job: dataset files, output directories, models. `outside_roots` is the one check, pure,
used at intake (a resource naming such a path is rejected) and again by the file adapter
before it touches the disk. Everything here is string work: no I/O.
"""


import functools
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass

S3_SCHEME = "s3://"
DEPLOY_MODEL = "deploy/index.pkl"
DATA_INDEX = "dataIndex.txt"


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


def round_data_file(output_dir: str, phase: str, version: int, fmt: str) -> str:
    """`<out>/data/{train|eval}/{v}/data.txt|csv`: a round's samples."""
    return join(round_data_dir(output_dir, phase, version), data_file(fmt))


def round_index_file(output_dir: str, phase: str, version: int) -> str:
    """`<out>/data/{train|eval}/{v}/dataIndex.txt`: a round's index (see `needs_index`)."""
    return join(round_data_dir(output_dir, phase, version), DATA_INDEX)


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


def claim_dir(prefix: str, url: str) -> str:
    """The one spelling of an outputDir as it lies on disk: the volume prefix added (local
    paths), then ``canonical_dir``. Claims are keyed by it, so ``/output/v`` and
    ``/rootfs/output/v`` (prefix ``/rootfs``) are one directory, as they are on disk."""
    return canonical_dir(add_prefix(prefix, url))


def ancestors(directory: str) -> list[str]:
    """The directories ``directory`` (a ``claim_dir``) lies in, outermost first, down to its
    parent: ``/a/b/c`` -> ``/a``, ``/a/b``; ``s3://bkt/a/b`` -> ``s3://bkt``, ``s3://bkt/a``.
    "/" is left out (nothing may claim it)."""
    head = S3_SCHEME if is_remote(directory) else ""
    rest = directory[len(head) :]
    cuts = [i for i, char in enumerate(rest) if char == "/" and i > 0]
    return [head + rest[:i] for i in cuts if rest[:i] != ""]


def output_dir_of(deploy_url: str) -> str:
    """The output dir whose deploy model ``deploy_url`` is (``deploy_model``'s inverse).

    A URL that is not a deploy model is returned unchanged: nothing lies beneath a file, so a
    check "beneath the output dir" made with it refuses everything.
    """
    suffix = "/" + DEPLOY_MODEL
    return deploy_url[: -len(suffix)] if deploy_url.endswith(suffix) else deploy_url


# --- where a job's files may lie -------------------------------------------------------------

#: Host directories that hold the operating system, kernel interfaces, devices and runtime
#: state. No dataset, output dir or model may lie in one (or be "/" itself), whatever the data
#: roots say: the controller runs as root in a Sedna pod, with the host's root mounted.
SYSTEM_DIRS = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
    "/var/lock",
    "/var/run",
)


@functools.lru_cache(maxsize=1024)
def segments(path: str) -> tuple[str, ...] | None:
    """The components of an absolute local path (empty and "." ones dropped), or None when
    it is relative, holds a NUL or has a ".." component. Remembered for the latest 1,024
    paths (a few MB at most, URLs being capped at 4,096 characters): each local file an
    effect touches is checked against the roots and the system directories, a dozen splits
    of the same few paths."""
    if not path.startswith("/") or "\0" in path:
        return None
    parts = tuple(part for part in path.split("/") if part not in ("", "."))
    return None if ".." in parts else parts


def is_beneath(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or lies inside it, judged on the names alone.

    Local paths must both be absolute; they are compared component by component after
    dropping empty and "." components (``/a//b/./c`` is ``/a/b/c``), so ``/a/bc`` is not
    beneath ``/a/b``. A ".." component anywhere, a NUL, or a relative path makes the answer
    False: without the file system, ".." cannot be resolved safely. S3 URLs compare by
    bucket, then by key prefix ending at a "/" (S3 keys are literal: ``s3://b/a//x`` is not
    beneath ``s3://b/a/x``); a "." or ".." key component makes the answer False, since some
    clients normalise them. A local path is never beneath an S3 URL, nor the other way
    round. Nothing is resolved: symlinks are the file adapter's business.
    """
    if is_remote(path) != is_remote(directory):
        return False
    if is_remote(path):
        return _s3_beneath(path[len(S3_SCHEME) :], directory[len(S3_SCHEME) :])
    inner, outer = segments(path), segments(directory)
    if inner is None or outer is None:
        return False
    return inner[: len(outer)] == outer


def _s3_beneath(path: str, directory: str) -> bool:
    """Both without the scheme: ``bucket/key``."""
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


_SYSTEM_PARTS = {tuple(d.strip("/").split("/")): d for d in SYSTEM_DIRS}
_SYSTEM_DEPTH = max(map(len, _SYSTEM_PARTS))


def system_dir_of(path: str) -> str | None:
    """The system directory (``SYSTEM_DIRS``, or "/" for the root itself) ``path`` is or lies
    in; None for any other path."""
    parts = segments(path)
    if parts == ():
        return "/"
    for depth in range(1, min(len(parts or ()), _SYSTEM_DEPTH) + 1):
        found = _SYSTEM_PARTS.get((parts or ())[:depth])
        if found is not None:
            return found
    return None


def host_path(prefix: str, path: str) -> str:
    """The host's view of a disk path: the volume prefix trimmed ("/" for the prefix itself)."""
    if prefix and path.rstrip("/") == prefix.rstrip("/"):
        return "/"
    return trim_prefix(prefix, path)


def outside_roots(path: str, roots: Sequence[str], prefix: str = "") -> str | None:
    """Why the local disk path ``path`` may not hold a job's files, or None when it may.

    It must be absolute without "..", seen from the host (``prefix``, the volume prefix,
    trimmed) be neither "/" nor in a system directory (``SYSTEM_DIRS``), and lie under one
    of ``roots`` (disk paths, as ``LIFELONG_DATA_ROOTS``).
    """
    if segments(path) is None:
        return f"{path!r} is not an absolute path without '..'"
    host = host_path(prefix, path)
    system = system_dir_of(host)
    if system == "/":
        return f"{host!r} is the file system root"
    if system is not None:
        return f"{host!r} is in the system directory {system}"
    if not any(is_beneath(path, root) for root in roots):
        return f"{path!r} is not under a data root (LIFELONG_DATA_ROOTS={':'.join(roots)})"
    return None


@dataclass(frozen=True, slots=True)
class DataRoots:
    """The data roots and volume prefix one controller applies to every local path."""

    roots: tuple[str, ...] = ("/",)
    prefix: str = ""

    def problem(self, url: str) -> str | None:
        """Why the worker-visible ``url`` (a dataset url, an outputDir, a model url) may not be
        used, or None; S3 URLs are not local paths and have no problem here."""
        if is_remote(url):
            return None
        if self.prefix and is_beneath(url, self.prefix):
            # adding the prefix leaves it as it is: a second spelling of a directory
            return (
                f"{url!r} already carries the volume prefix {self.prefix} (LIFELONG_VOLUME_"
                f"PREFIX); name it as workers see it: {host_path(self.prefix, url)!r}"
            )
        return self.disk_problem(add_prefix(self.prefix, url))

    def disk_problem(self, path: str) -> str | None:
        """``problem`` for a path that already carries the volume prefix."""
        return outside_roots(path, self.roots, self.prefix)

    def locate(self, path: str) -> tuple[str, tuple[str, ...]] | None:
        """The innermost root ``path`` lies under (where a walk down to it starts) and the
        components of ``path`` below it; None if it lies under no root."""
        parts = segments(path)
        if parts is None:
            return None
        found: tuple[str, tuple[str, ...]] | None = None
        for root in self.roots:
            root_parts = segments(root)
            if root_parts is None or parts[: len(root_parts)] != root_parts:
                continue
            if found is None or len(root_parts) > len(found[1]):
                found = root, root_parts
        return None if found is None else (found[0], parts[len(found[1]) :])
