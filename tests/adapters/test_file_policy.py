"""The file access policy against real files (and moto's S3 server): what a hostile worker or
resource can plant, and that the controller refuses it at once, with a reason, touching nothing.

Layout of each test: `root/` is the only data root; `root/out/` is the job's output dir;
`outside/` stands for the rest of the host (`/etc/passwd`, other jobs' files).
"""

from __future__ import annotations

import errno
import logging
import os
import platform
import re
import socket
import stat
import tempfile
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from service.adapters import files as files_module
from service.adapters.blobs import BlobStore
from service.adapters.dataset_sources import Cursor, DatasetReader
from service.adapters.files import LocalFiles, NotAllowed
from service.adapters.s3 import S3Clients
from service.core.paths import DataRoots
from service.errors import ConfigError, PermanentError, Refused
from tests.adapters.blob_calls import Cred, write_round

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

MiB = 1 << 20
GiB = 1 << 30
BOUND_S = 10  # generous: a refusal takes milliseconds; a blocked open() never returns


@dataclass
class Layout:
    root: Path
    out: Path
    outside: Path
    staging: Path
    files: LocalFiles
    store: BlobStore
    reader: DatasetReader

    @property
    def deploy(self) -> Path:
        return self.out / "deploy" / "index.pkl"

    def copy(self, src: Path | str) -> None:
        self.store.copy_model(
            src_url=str(src),
            dst_url=str(self.deploy),
            output_dir=str(self.out),
            src_cred=None,
            dst_cred=None,
        )

    def write_round(self, source: Path, data: Path, ranges: list[tuple[int, int]]) -> int:
        return write_round(self.store, source, data, ranges)

    def poll(self, source: Path, fmt: str = "txt") -> int:
        """The samples of a poll; a source the reader may not read (which it reports like a
        missing one, the reason in `why`) raises ``NotAllowed`` with that reason."""
        polled = self.reader.poll(str(source), fmt, Cursor(), None)
        if polled.missing and polled.why:
            raise NotAllowed(polled.why)
        return polled.num_samples

    def leftovers(self) -> set[Path]:
        """Temporary files anywhere under the root or the staging dir."""
        return {
            p
            for d in (self.root, self.staging)
            for p in d.rglob("*")
            if p.name.endswith(".tmp") and not p.is_symlink()
        }


def layout_in(tmp_path: Path, *, in_one_call: bool = True, **caps: int) -> Layout:
    root, outside, staging = tmp_path / "root", tmp_path / "outside", tmp_path / "staging"
    for d in (root / "out", outside, staging):
        d.mkdir(parents=True)
    files = LocalFiles(DataRoots(roots=(str(root),)), in_one_call=in_one_call)
    store = BlobStore(
        S3Clients(), files=files, attempts=3, max_backoff_s=0.01, tmp_dir=str(staging), **caps
    )
    reader = DatasetReader(S3Clients(), files=files)
    return Layout(root, root / "out", outside, staging, files, store, reader)


#: Both ways of reaching a path: one openat2 call, and the walk one component at a time
#: (where the kernel has no openat2); every attack here is tried on each.
WAYS = pytest.mark.parametrize("in_one_call", [True, False], ids=["openat2", "walk"])


@pytest.fixture(params=[True, False], ids=["openat2", "walk"])
def lay(tmp_path: Path, request: pytest.FixtureRequest) -> Layout:
    return layout_in(tmp_path, in_one_call=request.param)


def deployed(lay: Layout, content: bytes = b"the deployed model") -> None:
    lay.deploy.parent.mkdir(parents=True, exist_ok=True)
    lay.deploy.write_bytes(content)


def model(path: Path, content: bytes = b"a good model", mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    path.chmod(mode)
    return path


# ================================================================ F1: worker-chosen model paths


def test_a_model_in_the_job_output_is_copied(lay: Layout) -> None:
    deployed(lay)
    lay.copy(model(lay.out / "eval" / "1" / "model.pkl", b"evaluated", mode=0o600))
    assert lay.deploy.read_bytes() == b"evaluated"
    assert lay.leftovers() == set()


def test_models_a_worker_points_elsewhere_are_refused(lay: Layout) -> None:
    deployed(lay)
    passwd = model(lay.outside / "passwd", b"root:x:0:0:root:/root:/bin/bash\n")
    private = model(lay.root / "other-job" / "key.pem", b"-----BEGIN PRIVATE KEY-----", 0o600)
    planted = lay.out / "eval" / "1" / "model.pkl"
    planted.parent.mkdir(parents=True)
    planted.symlink_to(passwd)
    stolen_dir = lay.outside / "stolen"
    model(stolen_dir / "1" / "model.pkl", b"someone else's model")
    (lay.out / "train").symlink_to(stolen_dir)  # a directory on the model's path is a link
    cases = [
        (passwd, "not in the job's output dir"),
        (private, "not in the job's output dir"),
        (planted, "eval/1/model.pkl is a symbolic link"),
        (lay.out / "train" / "1" / "model.pkl", "out/train is a symbolic link"),
    ]
    for src, reason in cases:
        with pytest.raises(Refused, match=reason):
            lay.copy(src)
        assert lay.deploy.read_bytes() == b"the deployed model", src
    assert lay.leftovers() == set()


def test_a_job_output_outside_the_roots_is_refused(lay: Layout) -> None:
    out = lay.outside / "job"
    src = model(out / "eval" / "1" / "model.pkl")
    with pytest.raises(Refused, match="not under a data root"):
        lay.store.copy_model(
            src_url=str(src),
            dst_url=str(out / "deploy" / "index.pkl"),
            output_dir=str(out),
            src_cred=None,
            dst_cred=None,
        )
    assert not (out / "deploy").exists()


def test_a_symlinked_dataset_is_not_read(lay: Layout) -> None:
    secret = lay.outside / "shadow"
    secret.write_text("root:$6$hash:19000::::::\nalice:$6$other:19000::::::\n")
    dataset = lay.root / "data" / "d.txt"
    dataset.parent.mkdir()
    dataset.symlink_to(secret)
    with pytest.raises(Refused, match=r"d\.txt is a symbolic link"):
        lay.poll(dataset)
    data = lay.out / "data" / "train" / "1" / "data.txt"
    with pytest.raises(Refused, match=r"d\.txt is a symbolic link"):
        lay.write_round(dataset, data, [(0, 2)])
    assert not data.exists()
    with pytest.raises(Refused, match="not under a data root"):
        lay.poll(secret)


def test_the_deploy_target_symlink_is_replaced_not_written_through(lay: Layout) -> None:
    victim = model(lay.outside / "victim.pkl", b"not yours")
    lay.deploy.parent.mkdir(parents=True)
    lay.deploy.symlink_to(victim)
    lay.copy(model(lay.out / "eval" / "1" / "model.pkl", b"evaluated"))
    assert not lay.deploy.is_symlink() and lay.deploy.read_bytes() == b"evaluated"
    assert victim.read_bytes() == b"not yours"


# ================================================================ F6: FIFOs, devices, sockets


def finishes(fn: Callable[[], object], unblock: Path) -> BaseException | None:
    """Run `fn` in a thread; its exception (None if it returned). A call still running after
    BOUND_S fails the test, after opening `unblock` for writing so the thread can end."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND_S)
    if thread.is_alive():
        if stat.S_ISFIFO(unblock.lstat().st_mode):
            os.close(os.open(unblock, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(BOUND_S)
        pytest.fail(f"blocked for {BOUND_S} s on {unblock}")
    return outcome[0]


@contextmanager
def special(kind: str, path: Path) -> Iterator[None]:
    """A FIFO, socket, character device or directory at `path` for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # a copy of /dev/null
        except PermissionError:
            pytest.skip("this sandbox cannot make device nodes")
    else:  # a socket path is short (108 bytes): bind in a short dir, then move it in place
        with tempfile.TemporaryDirectory(dir="/tmp") as short:
            server = socket.socket(socket.AF_UNIX)
            server.bind(f"{short}/s")
            os.rename(f"{short}/s", path)
        try:
            yield
        finally:
            server.close()
        return
    yield


REASONS = {
    "fifo": "model.pkl is a FIFO, not a regular file",
    "socket": "model.pkl is a socket, not a regular file",
    "device": "model.pkl is a character device, not a regular file",
    "directory": "model.pkl is a directory, not a regular file",
}


@pytest.mark.parametrize("kind", sorted(REASONS))
def test_special_files_are_refused_at_once(lay: Layout, kind: str) -> None:
    """A FIFO blocked open() forever (four of them stopped all effects, SIGTERM hung) and was
    retried as transient; now each is refused at once, permanently, before any open."""
    deployed(lay)
    src = lay.out / "eval" / "1" / "model.pkl"
    data = lay.out / "data" / "train" / "1" / "data.txt"
    with special(kind, src):
        for call in (
            lambda: lay.copy(src),
            lambda: lay.poll(src),
            lambda: lay.write_round(src, data, [(0, 1)]),
        ):
            error = finishes(call, src)
            assert isinstance(error, Refused) and isinstance(error, PermanentError), error
            assert REASONS[kind] in str(error)
    assert lay.deploy.read_bytes() == b"the deployed model"
    assert not data.exists()
    assert lay.leftovers() == set()


# ================================================================ F7: size caps, sparse files


def sparse(path: Path, size: int, islands: dict[int, bytes] | None = None) -> Path:
    """A file of `size` bytes that is a hole except for `islands` (offset -> bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
        for offset, chunk in (islands or {}).items():
            f.seek(offset)
            f.write(chunk)
    return path


def traced_peak(fn: Callable[[], object]) -> int:
    """The peak of Python allocations while `fn` runs (its Refused is expected)."""
    tracemalloc.start()
    try:
        with pytest.raises(Refused) as caught:
            fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value is not None
    return peak


def test_a_huge_one_line_dataset_is_refused_without_holding_it(lay: Layout) -> None:
    """A 512 MiB sparse one-line dataset took the controller to 2.7 GB."""
    huge = sparse(lay.root / "data" / "huge.txt", 512 * MiB)
    data = lay.out / "data" / "train" / "1" / "data.txt"
    reason = r"huge\.txt: the line at byte 0 is longer than 1048576 bytes \(LIFELONG_MAX_LINE"
    for call in (
        lambda: lay.poll(huge),
        lambda: lay.poll(huge, "csv"),  # no header yet: the line was kept whole
        lambda: lay.write_round(huge, data, [(0, 1)]),
    ):
        with pytest.raises(Refused, match=reason):
            call()
        assert traced_peak(call) < 8 * MiB
    assert not data.exists()
    assert lay.leftovers() == set()


def test_the_line_cap_is_exact(lay: Layout) -> None:
    at_cap, over = b"a" * MiB, b"b" * (MiB + 1)
    path = lay.root / "data" / "d.txt"
    path.parent.mkdir()
    data = lay.out / "data" / "train" / "1" / "data.txt"
    path.write_bytes(b"x\n" + at_cap + b"\ny\n")
    assert lay.poll(path) == 3
    assert lay.write_round(path, data, [(0, 3)]) == 3
    assert data.read_bytes() == b"x\n" + at_cap + b"\ny\n"

    path.write_bytes(b"x\n" + at_cap + b"\n" + over + b"\ny\n")
    where = f"the line at byte {2 + MiB + 1} is longer than {MiB} bytes"
    with pytest.raises(Refused, match=where):
        lay.poll(path)
    with pytest.raises(Refused, match=where):
        lay.write_round(path, data, [(0, 3)])
    assert lay.write_round(path, data, [(0, 2)]) == 2  # the writer stops before the long line
    path.write_bytes(b"x\n" + over)  # an unterminated last line counts too
    with pytest.raises(Refused, match="the line at byte 2 is longer"):
        lay.poll(path)
    bigger = DatasetReader(S3Clients(), files=lay.files, max_line_bytes=2 * MiB)
    assert bigger.poll(str(path), "txt", Cursor(), None).num_samples == 2


def test_a_sparse_model_stays_sparse(lay: Layout) -> None:
    """A 1 GiB sparse model became 1 GiB of real blocks in index.pkl."""
    deployed(lay)
    src = sparse(lay.out / "eval" / "1" / "model.pkl", GiB, {GiB // 2: b"weights"})
    lay.copy(src)
    copied = lay.deploy.stat()
    assert copied.st_size == GiB
    assert copied.st_blocks * 512 <= MiB
    with open(lay.deploy, "rb") as f:
        f.seek(GiB // 2)
        assert f.read(7) == b"weights"


@pytest.mark.parametrize("tail", ["data", "hole"])
def test_sparse_copies_are_byte_exact(lay: Layout, tail: str) -> None:
    size = 24 * MiB
    islands = {
        0: b"head",
        MiB - 3: b"across a block boundary",
        5 * MiB: os.urandom(3 * MiB + 17),
    }
    if tail == "data":
        islands[size - 5] = b"tail!"
    src = sparse(lay.out / "eval" / "1" / "model.pkl", size, islands)
    lay.copy(src)
    assert lay.deploy.read_bytes() == src.read_bytes()


def test_models_over_the_cap_are_refused(tmp_path: Path) -> None:
    lay = layout_in(tmp_path, max_model_bytes=MiB)
    deployed(lay)
    src = model(lay.out / "eval" / "1" / "model.pkl", b"m" * (MiB + 1))
    with pytest.raises(Refused, match=r"holds 1048577 bytes, more than 1048576 \(LIFELONG_MAX"):
        lay.copy(src)
    assert lay.deploy.read_bytes() == b"the deployed model"
    lay.copy(model(src, b"m" * MiB))
    assert lay.deploy.stat().st_size == MiB
    assert lay.leftovers() == set()


# ================================================================ F8: swapped directories


def test_a_symlinked_deploy_dir_is_refused(lay: Layout) -> None:
    victim = lay.outside / "victim"
    victim.mkdir()
    (lay.out / "deploy").symlink_to(victim)
    with pytest.raises(Refused, match="out/deploy is a symbolic link"):
        lay.copy(model(lay.out / "eval" / "1" / "model.pkl"))
    assert list(victim.iterdir()) == []


@pytest.mark.parametrize("link", ["data", "data/train", "data/train/1"])
def test_a_symlinked_round_dir_is_refused(lay: Layout, link: str) -> None:
    victim = lay.outside / "victim"
    victim.mkdir()
    (lay.out / link).parent.mkdir(parents=True, exist_ok=True)
    (lay.out / link).symlink_to(victim)
    dataset = lay.root / "d.txt"
    dataset.write_bytes(b"s0\ns1\n")
    data = lay.out / "data" / "train" / "1" / "data.txt"
    with pytest.raises(Refused, match=f"out/{link} is a symbolic link"):
        lay.write_round(dataset, data, [(0, 2)])
    assert list(victim.iterdir()) == []


# ================================================================ F10: system directories


@WAYS
def test_system_directories_are_refused_at_effect_time(tmp_path: Path, in_one_call: bool) -> None:
    """Seen through a volume prefix, as in a Sedna pod: `<rootfs>/etc` is the host's /etc."""
    rootfs = tmp_path / "rootfs"
    dataset = rootfs / "data" / "d.txt"
    dataset.parent.mkdir(parents=True)
    dataset.write_bytes(b"s0\n")
    roots = DataRoots(roots=(str(rootfs),), prefix=str(rootfs))
    files = LocalFiles(roots, in_one_call=in_one_call)
    store = BlobStore(S3Clients(), files=files, attempts=1, tmp_dir=str(tmp_path))
    for target, system in (("etc/cron.d", "/etc"), ("usr/lib", "/usr"), ("proc/1", "/proc")):
        with pytest.raises(Refused, match=f"system directory {system}"):
            write_round(store, dataset, rootfs / target / "data.txt", [(0, 1)])
    passwd = rootfs / "etc" / "passwd"
    polled = DatasetReader(S3Clients(), files=files).poll(str(passwd), "txt", Cursor(), None)
    assert polled.missing and "'/etc/passwd' is in the system directory /etc" in polled.why
    assert sorted(p.name for p in rootfs.iterdir()) == ["data"]


# ================================================================ S3: the job's bucket/prefix


def test_s3_models_must_be_in_the_job_output(
    tmp_path: Path, s3c: S3Client, bucket: str, s3_endpoint: str
) -> None:
    lay = layout_in(tmp_path, max_model_bytes=MiB)
    cred = Cred(endpoint=s3_endpoint.removeprefix("http://"))
    other = f"{bucket}-other"
    s3c.create_bucket(Bucket=other)
    for where, key in (
        (bucket, "jobs/a/eval/1/model.pkl"),
        (bucket, "jobs/b/eval/1/model.pkl"),
        (bucket, "jobs/a-evil/model.pkl"),
        (other, "jobs/a/eval/1/model.pkl"),
    ):
        s3c.put_object(Bucket=where, Key=key, Body=f"{where}/{key}".encode())
    s3c.put_object(Bucket=bucket, Key="jobs/a/eval/2/big.pkl", Body=b"m" * (MiB + 1))
    out = f"s3://{bucket}/jobs/a"

    def copy(src: str) -> None:
        lay.store.copy_model(
            src_url=src,
            dst_url=f"{out}/deploy/index.pkl",
            output_dir=out,
            src_cred=cred,
            dst_cred=cred,
        )

    def deployed_body() -> bytes:
        return s3c.get_object(Bucket=bucket, Key="jobs/a/deploy/index.pkl")["Body"].read()

    copy(f"{out}/eval/1/model.pkl")
    assert deployed_body() == f"{bucket}/jobs/a/eval/1/model.pkl".encode()
    for src in (
        f"s3://{bucket}/jobs/b/eval/1/model.pkl",
        f"s3://{bucket}/jobs/a-evil/model.pkl",
        f"s3://{other}/jobs/a/eval/1/model.pkl",
        str(lay.out / "eval" / "1" / "model.pkl"),
    ):
        with pytest.raises(Refused, match="not in the job's output dir"):
            copy(src)
    with pytest.raises(Refused, match=r"holds 1048577 bytes, more than 1048576"):
        copy(f"{out}/eval/2/big.pkl")
    assert deployed_body() == f"{bucket}/jobs/a/eval/1/model.pkl".encode()
    assert lay.leftovers() == set()


# ================================================================ links, owners, roots, caps


def test_hard_links_and_foreign_owners_are_refused_and_own_files_read(lay: Layout) -> None:
    private = model(lay.root / "other-job" / "m.pkl", b"another job's", 0o600)
    linked = lay.out / "eval" / "1" / "model.pkl"
    linked.parent.mkdir(parents=True)
    os.link(private, linked)
    with pytest.raises(NotAllowed, match=r"model\.pkl has 2 hard links"):
        lay.copy(linked)
    foreign = model(lay.out / "eval" / "2" / "model.pkl", b"someone's")
    os.chown(foreign, 4242, 4242)
    with pytest.raises(NotAllowed, match="belongs to uid 4242"):
        lay.copy(foreign)
    own = model(lay.out / "eval" / "3" / "model.pkl", b"ours")  # the neighbour: one link, ours
    lay.copy(own)
    assert lay.deploy.read_bytes() == b"ours"


@pytest.mark.parametrize(
    ("mode", "owner", "refused"),
    [
        (0o777, 0, "writable by others (mode 0777, no sticky bit)"),
        (0o770, 0, "writable by others (mode 0770"),
        (0o755, 4242, "owned by uid 4242"),
        (0o1777, 0, None),  # sticky, as /tmp: only an entry's owner renames it
        (0o755, 0, None),
    ],
)
def test_roots_in_directories_others_can_change_are_refused(
    tmp_path: Path, mode: int, owner: int, refused: str | None
) -> None:
    parent = tmp_path / "parent"
    (parent / "root").mkdir(parents=True)
    parent.chmod(mode)
    os.chown(parent, owner, owner)
    roots = DataRoots(roots=(str(parent / "root"),))
    if refused is None:
        LocalFiles(roots)
        return
    with pytest.raises(ConfigError, match=re.escape(refused)):
        LocalFiles(roots)


@WAYS
def test_a_root_is_resolved_once_and_never_followed_later(
    tmp_path: Path, in_one_call: bool
) -> None:
    real = tmp_path / "volume"
    (real / "d.txt").parent.mkdir()
    (real / "d.txt").write_text("s0\ns1\n")
    mount = tmp_path / "mount"
    mount.symlink_to(real)  # the operator's root may be a link: followed once, at start
    files = LocalFiles(DataRoots(roots=(str(mount),)), in_one_call=in_one_call)
    reader = DatasetReader(S3Clients(), files=files)
    assert reader.poll(str(mount / "d.txt"), "txt", Cursor(), None).num_samples == 2
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "d.txt").write_text("secret\n")
    real.rename(tmp_path / "volume.old")
    real.symlink_to(elsewhere)  # the resolved root swapped for a link later
    polled = reader.poll(str(mount / "d.txt"), "txt", Cursor(), None)
    assert polled.missing and "is no longer a directory there" in polled.why


def test_datasets_and_rounds_over_their_caps_are_refused_at_the_cap_not_below(
    tmp_path: Path,
) -> None:
    lay = layout_in(tmp_path, max_dataset_bytes=40, max_round_bytes=20)
    dataset = lay.root / "d.txt"
    dataset.write_bytes(b"0123456789\n" * 3 + b"012345\n")  # 40 bytes: at the cap
    reader = DatasetReader(S3Clients(), files=lay.files, max_dataset_bytes=40)
    assert reader.poll(str(dataset), "txt", Cursor(), None).num_samples == 4
    data = lay.out / "data" / "train" / "1" / "data.txt"
    assert lay.write_round(dataset, data, [(0, 1), (3, 4)]) == 2  # 18 bytes: under the cap
    with pytest.raises(Refused, match=r"more than 20 bytes \(LIFELONG_MAX_ROUND_BYTES\)"):
        lay.write_round(dataset, data, [(0, 2)])  # 22 bytes
    assert data.read_bytes() == b"0123456789\n012345\n"  # the refused round replaced nothing
    with open(dataset, "ab") as f:
        f.write(b"x")
    with pytest.raises(Refused, match="holds 41 bytes, more than the 40 a dataset may"):
        reader.poll(str(dataset), "txt", Cursor(), None)
    with pytest.raises(Refused, match="holds 41 bytes"):
        lay.write_round(dataset, data, [(0, 1)])


def test_old_rounds_are_pruned_but_kept_ones_and_foreign_content_stay(lay: Layout) -> None:
    phase = lay.out / "data" / "train"
    for version in range(1, 7):
        (phase / str(version)).mkdir(parents=True)
        (phase / str(version) / "data.txt").write_text("s\n")
    (phase / "2" / "notes.txt").write_text("a worker's")  # not ours: the directory stays
    (phase / "latest").mkdir()
    (phase / "3" / "dataIndex.txt").write_text("s3://b/\n")
    keep = {1}
    removed = lay.store.prune_rounds(str(phase / "6" / "data.txt"), lambda v: v >= 5 or v in keep)
    assert removed == [3, 4]
    assert sorted(p.name for p in phase.iterdir()) == ["1", "2", "5", "6", "latest"]
    assert sorted(p.name for p in (phase / "2").iterdir()) == ["notes.txt"]
    assert lay.store.prune_rounds("s3://b/out/data/train/6/data.txt", lambda v: False) == []


# ================================================================ F11: the two ways to a path


def test_openat2_follows_no_link_anywhere_on_the_path(tmp_path: Path) -> None:
    openat2 = files_module.kernel_openat2()
    if openat2 is None:
        pytest.skip("this kernel has no openat2 (paths are walked)")
    inner = tmp_path / "a" / "b"
    inner.mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "a")
    (tmp_path / "a" / "last").symlink_to(inner)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    fd = openat2(str(inner), flags)
    try:
        assert os.fstat(fd).st_ino == inner.stat().st_ino
    finally:
        os.close(fd)
    for through in (tmp_path / "link" / "b", tmp_path / "a" / "last"):
        with pytest.raises(OSError) as refused:
            os.close(openat2(str(through), flags))
        assert refused.value.errno == errno.ELOOP


def test_a_new_round_dir_is_made_without_an_open_that_fails_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each round writes into a new version directory: openat2 found it missing, so it is
    made at once, not opened in vain first (an open that fails costs as much as a mkdir)."""
    if files_module.kernel_openat2() is None:
        pytest.skip("this kernel has no openat2 (paths are walked)")
    files = LocalFiles(DataRoots(roots=(str(tmp_path),)))
    (tmp_path / "out" / "data" / "eval").mkdir(parents=True)
    failed: list[str] = []
    real_open = os.open

    def open_(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        try:
            return real_open(path, flags, mode, dir_fd=dir_fd)
        except FileNotFoundError:
            failed.append(path)
            raise

    monkeypatch.setattr(os, "open", open_)
    with files.directory(str(tmp_path / "out" / "data" / "eval" / "7"), create=True) as (_, made):
        assert made
    assert (tmp_path / "out" / "data" / "eval" / "7").is_dir()
    assert failed == []


@WAYS
def test_dot_dot_and_missing_roots(tmp_path: Path, in_one_call: bool) -> None:
    """'..' never climbs out of a root; a root that does not exist yet is made on a write."""
    lay = layout_in(tmp_path, in_one_call=in_one_call)
    (lay.outside / "secret").write_bytes(b"secret")
    escape = f"{lay.out}/../../outside"
    refused = re.escape("is not an absolute path without '..'")
    with pytest.raises(NotAllowed, match=refused):
        lay.files.open_regular(f"{escape}/secret")
    with pytest.raises(NotAllowed, match=refused), lay.files.directory(escape, create=True):
        pass
    later = tmp_path / "later"
    files = LocalFiles(DataRoots(roots=(str(later),)), in_one_call=in_one_call)
    for made in (True, False):
        with files.directory(str(later / "out" / "deploy"), create=True) as opened:
            assert os.fstat(opened.fd).st_ino == (later / "out" / "deploy").stat().st_ino
            assert opened.made is made
    with pytest.raises(FileNotFoundError):
        files.open_regular(str(later / "out" / "none"))


@pytest.mark.parametrize(
    ("machine", "number", "why"),
    [
        ("vax", None, "no openat2 system call known on vax"),
        ("x86_64", 1 << 20, "openat2 fails here"),  # ENOSYS, as a seccomp filter answers
    ],
)
def test_without_openat2_paths_are_walked_and_the_log_says_so(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    machine: str,
    number: int | None,
    why: str,
) -> None:
    monkeypatch.setattr(platform, "machine", lambda: machine)
    monkeypatch.setattr(files_module, "_SYS_OPENAT2", {} if number is None else {machine: number})
    with caplog.at_level(logging.INFO, logger=files_module.__name__):
        assert files_module.kernel_openat2.__wrapped__() is None
    assert [r.getMessage() for r in caplog.records] == [
        f"{why}"
        + ("" if number is None else " (Function not implemented)")
        + ": local paths are walked one component at a time"
    ]
