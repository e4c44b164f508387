"""BlobStore against real files and a real (moto) S3 server: round files and model copies."""

from __future__ import annotations

import hashlib
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

from service.adapters import staging
from service.adapters.blobs import BlobStore
from service.adapters.s3 import S3Clients, S3Location, parse_s3_url, translate
from service.core.rounds import ModelDigest
from service.errors import BlobUnavailable, PermanentError, Refused
from tests.adapters.blob_calls import Cred, write_round
from tests.servers import free_port

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def files_under(*dirs: Path) -> set[Path]:
    return {p for d in dirs if d.exists() for p in d.rglob("*") if p.is_file()}


@pytest.fixture
def tmp_dir(tmp_path: Path) -> Path:
    path = tmp_path / "staging"
    path.mkdir()
    return path


@pytest.fixture
def store(tmp_dir: Path) -> BlobStore:
    return BlobStore(S3Clients(), attempts=3, max_backoff_s=0.01, tmp_dir=str(tmp_dir))


@pytest.fixture
def txt_source(tmp_path: Path) -> Path:
    """Samples s0..s9 with blank lines, CRLF and an unterminated last line."""
    path = tmp_path / "src" / "data.txt"
    path.parent.mkdir()
    path.write_bytes(
        b"\n/img/0.jpg 0\r\n/img/1.jpg 1\n\n/img/2.jpg 2\n/img/3.jpg 3\r\n\r\n/img/4.jpg 4\n"
        b"/img/5.jpg 5\n/img/6.jpg 6\n/img/7.jpg 7\n/img/8.jpg 8\n/img/9.jpg 9"
    )
    return path


def sample(i: int) -> bytes:
    return b"/img/%d.jpg %d\n" % (i, i)


def test_txt_round_out_of_order_ranges(
    store: BlobStore, txt_source: Path, tmp_path: Path, tmp_dir: Path
) -> None:
    out = tmp_path / "job" / "data" / "train" / "3" / "data.txt"
    index = out.parent / "dataIndex.txt"
    written = write_round(
        store,
        txt_source,
        out,
        [(7, 10), (2, 4), (0, 1), (5, 6)],
        index=index,
        index_prefix="s3://bkt/sets/",
    )
    order = [7, 8, 9, 2, 3, 0, 5]
    assert written == len(order)
    assert out.read_bytes() == b"".join(sample(i) for i in order)
    assert index.read_bytes() == b"s3://bkt/sets/\n" + b"".join(b"/img/%d.jpg\n" % i for i in order)
    assert files_under(out.parent, tmp_dir) == {out, index}


def test_csv_round_has_header_first(store: BlobStore, tmp_path: Path) -> None:
    src = tmp_path / "data.csv"
    src.write_bytes(b"\r\nname,age\r\n" + b"".join(b"p%d,%d\r\n" % (i, i) for i in range(6)))
    out = tmp_path / "out" / "data.csv"
    written = write_round(store, src, out, [(4, 6), (0, 2)], fmt="csv")
    assert written == 4
    assert out.read_bytes() == b"name,age\np4,4\np5,5\np0,0\np1,1\n"


def test_csv_round_without_samples_still_has_header(store: BlobStore, tmp_path: Path) -> None:
    src = tmp_path / "data.csv"
    src.write_bytes(b"a,b\n1,2\n")
    out = tmp_path / "out" / "data.csv"
    assert write_round(store, src, out, [], fmt="csv") == 0
    assert out.read_bytes() == b"a,b\n"


def test_round_redo_is_identical_and_replaces_whole(
    store: BlobStore, txt_source: Path, tmp_path: Path
) -> None:
    out = tmp_path / "round" / "data.txt"
    out.parent.mkdir()
    out.write_bytes(b"x" * 10_000)
    write_round(store, txt_source, out, [(3, 5), (0, 2)])
    first = out.read_bytes()
    write_round(store, txt_source, out, [(3, 5), (0, 2)])
    assert out.read_bytes() == first == b"".join(sample(i) for i in (3, 4, 0, 1))


def test_round_ranges_across_block_boundaries(store: BlobStore, tmp_path: Path) -> None:
    """A source of several 1 MiB blocks: ranges start, end and span inside and across them."""
    lines = [b"line-%06d %s" % (i, b"x" * (i % 13)) for i in range(150_000)]
    src = tmp_path / "big.txt"
    src.write_bytes(b"\r\n".join(lines) + b"\r\n")
    ranges = [(100_000, 100_010), (5, 90_000), (149_990, 150_000), (90_000, 90_001)]
    out = tmp_path / "out" / "data.txt"
    written = write_round(store, src, out, ranges)
    expected = [line for start, end in ranges for line in lines[start:end]]
    assert written == len(expected)
    assert out.read_bytes() == b"\n".join(expected) + b"\n"


def test_a_round_file_is_written_on_the_calling_thread(
    store: BlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes and the writeback they start stay on the thread that scans (no hand-off to a
    helper thread per block); the writeback is still started as the file grows."""
    lines = [b"line-%06d" % i for i in range(400_000)]  # ~4.2 MiB: a few blocks
    src = tmp_path / "big.txt"
    src.write_bytes(b"\n".join(lines) + b"\n")
    threads: list[str] = []
    fadvise = staging.os.posix_fadvise

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        threads.append(threading.current_thread().name)
        fadvise(fd, offset, length, advice)

    monkeypatch.setattr(staging.os, "posix_fadvise", record)
    out = tmp_path / "out" / "data.txt"
    assert write_round(store, src, out, [(0, 400_000)]) == 400_000
    assert out.read_bytes() == src.read_bytes()
    assert len(threads) >= 2 and set(threads) == {threading.current_thread().name}


def test_round_past_the_end_writes_what_exists(
    store: BlobStore, txt_source: Path, tmp_path: Path
) -> None:
    out = tmp_path / "data.txt"
    written = write_round(store, txt_source, out, [(8, 15)])
    assert written == 2
    assert out.read_bytes() == sample(8) + sample(9)


def test_round_missing_source_leaves_nothing(
    store: BlobStore, tmp_path: Path, tmp_dir: Path
) -> None:
    out = tmp_path / "job" / "data.txt"
    with pytest.raises(PermanentError, match=r"nope\.txt"):
        write_round(
            store,
            tmp_path / "nope.txt",
            out,
            [(0, 3)],
            index=out.parent / "dataIndex.txt",
            index_prefix="p/",
        )
    assert files_under(out.parent, tmp_dir) == set()


# --- S3 -------------------------------------------------------------------------------


@pytest.fixture
def cred(s3_endpoint: str) -> Cred:
    return Cred(endpoint=s3_endpoint.removeprefix("http://"))


def get(s3c: S3Client, bucket: str, key: str) -> bytes:
    return s3c.get_object(Bucket=bucket, Key=key)["Body"].read()


def test_round_from_s3_to_s3_with_index(
    store: BlobStore, s3c: S3Client, bucket: str, cred: Cred, txt_source: Path
) -> None:
    tmp_dir = txt_source.parent.parent / "staging"  # the store fixture's tmp_dir
    s3c.put_object(Bucket=bucket, Key="sets/data.txt", Body=txt_source.read_bytes())
    written = write_round(
        store,
        f"s3://{bucket}/sets/data.txt",
        f"s3://{bucket}/out/data/train/1/data.txt",
        [(4, 6), (1, 2)],
        index=f"s3://{bucket}/out/data/train/1/dataIndex.txt",
        index_prefix=f"s3://{bucket}/sets/",
        source_cred=cred,
        dest_cred=cred,
    )
    assert written == 3
    assert get(s3c, bucket, "out/data/train/1/data.txt") == sample(4) + sample(5) + sample(1)
    assert get(s3c, bucket, "out/data/train/1/dataIndex.txt") == (
        f"s3://{bucket}/sets/\n".encode() + b"/img/4.jpg\n/img/5.jpg\n/img/1.jpg\n"
    )
    assert files_under(tmp_dir) == set()


def test_round_s3_missing_source_is_permanent_and_clean(
    store: BlobStore, bucket: str, cred: Cred, tmp_dir: Path
) -> None:
    with pytest.raises(PermanentError, match=r"missing\.txt"):
        write_round(
            store,
            f"s3://{bucket}/missing.txt",
            f"s3://{bucket}/out/data.txt",
            [(0, 1)],
            source_cred=cred,
            dest_cred=cred,
        )
    assert files_under(tmp_dir) == set()


def test_copy_model_local_over_larger_file(store: BlobStore, tmp_path: Path) -> None:
    src = tmp_path / "eval" / "model.pkl"
    src.parent.mkdir()
    src.write_bytes(b"new-model")
    dst = tmp_path / "deploy" / "index.pkl"
    dst.parent.mkdir()
    dst.write_bytes(b"an older and much larger model" * 100)
    store.copy_model(
        src_url=str(src), dst_url=str(dst), output_dir=str(tmp_path), src_cred=None, dst_cred=None
    )
    assert dst.read_bytes() == b"new-model"
    assert files_under(dst.parent) == {dst}


def test_copy_model_between_s3_and_local(
    store: BlobStore, s3c: S3Client, bucket: str, cred: Cred, tmp_path: Path
) -> None:
    tmp_dir = tmp_path / "staging"
    s3c.put_object(Bucket=bucket, Key="eval/1/model.pkl", Body=b"m1")
    store.copy_model(
        src_url=f"s3://{bucket}/eval/1/model.pkl",
        dst_url=f"s3://{bucket}/deploy/index.pkl",
        output_dir=f"s3://{bucket}",
        src_cred=cred,
        dst_cred=cred,
    )
    assert get(s3c, bucket, "deploy/index.pkl") == b"m1"

    local = tmp_path / "deploy" / "index.pkl"
    local.parent.mkdir()
    local.write_bytes(b"old-and-longer")
    store.copy_model(
        src_url=f"s3://{bucket}/deploy/index.pkl",
        dst_url=str(local),
        output_dir=None,
        src_cred=cred,
        dst_cred=None,
    )
    assert local.read_bytes() == b"m1"

    local.write_bytes(b"m2")
    store.copy_model(
        src_url=str(local),
        dst_url=f"s3://{bucket}/deploy/index.pkl",
        output_dir=None,
        src_cred=None,
        dst_cred=cred,
    )
    assert get(s3c, bucket, "deploy/index.pkl") == b"m2"
    assert files_under(local.parent, tmp_dir) == {local}


def test_copy_model_missing_source(
    store: BlobStore, bucket: str, cred: Cred, tmp_path: Path, tmp_dir: Path
) -> None:
    dst = tmp_path / "deploy" / "index.pkl"
    for src, src_cred, to, dst_cred, output_dir in (
        (str(tmp_path / "none.pkl"), None, dst, None, str(tmp_path)),
        (f"s3://{bucket}/none.pkl", cred, dst, None, None),
        (f"s3://{bucket}/none.pkl", cred, f"s3://{bucket}/d.pkl", cred, f"s3://{bucket}"),
    ):
        with pytest.raises(PermanentError, match=r"none\.pkl"):
            store.copy_model(
                src_url=src,
                dst_url=str(to),
                output_dir=output_dir,
                src_cred=src_cred,
                dst_cred=dst_cred,
            )
    assert files_under(dst.parent, tmp_dir) == set()


def test_s3_down_is_blob_unavailable_after_retries(tmp_path: Path, tmp_dir: Path) -> None:
    store = BlobStore(S3Clients(), attempts=3, max_backoff_s=0.05, tmp_dir=str(tmp_dir))
    down = Cred(
        endpoint=f"127.0.0.1:{free_port()}",
        access_key_id="AKIDSECRET",
        secret_access_key="very-secret",
    )
    attempts: list[int] = []
    # test-only: count the attempts of the store's retry policy (it copies it per call)
    store._retrying = store._retrying.copy(before=lambda s: attempts.append(s.attempt_number))
    src = tmp_path / "model.pkl"
    src.write_bytes(b"m")
    with pytest.raises(BlobUnavailable) as info:
        store.copy_model(
            src_url=str(src),
            dst_url="s3://b/deploy/index.pkl",
            output_dir=None,
            src_cred=None,
            dst_cred=down,
        )
    with pytest.raises(BlobUnavailable):
        write_round(store, src, "s3://b/d/data.txt", [(0, 1)], dest_cred=down)
    assert attempts == [1, 2, 3] * 2, "each call gave up after its three attempts"
    assert "SECRET" not in str(info.value) and "very-secret" not in str(info.value)
    assert files_under(tmp_dir) == set()


@contextmanager
def hangup_server() -> Iterator[tuple[int, list[int]]]:
    """A TCP server that accepts and at once closes each connection, counting them."""
    accepted = [0]
    stop = threading.Event()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0.05)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            accepted[0] += 1
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1], accepted
    finally:
        stop.set()
        thread.join(5)
        sock.close()


def test_each_attempt_is_one_request(tmp_path: Path, tmp_dir: Path) -> None:
    """Our budget is the whole budget: botocore does not retry underneath it."""
    store = BlobStore(S3Clients(), attempts=4, max_backoff_s=0.01, tmp_dir=str(tmp_dir))
    src = tmp_path / "model.pkl"
    src.write_bytes(b"m")
    with hangup_server() as (port, accepted):
        with pytest.raises(BlobUnavailable):
            store.copy_model(
                src_url=str(src),
                dst_url="s3://b/deploy/index.pkl",
                output_dir=None,
                src_cred=None,
                dst_cred=Cred(endpoint=f"127.0.0.1:{port}"),
            )
        assert accepted[0] == 4


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("SlowDown", 503, BlobUnavailable),
        ("InternalError", 500, BlobUnavailable),
        ("RequestTimeout", 400, BlobUnavailable),
        ("Whatever", 502, BlobUnavailable),
        ("NoSuchKey", 404, PermanentError),
        ("AccessDenied", 403, PermanentError),
        ("InvalidAccessKeyId", 403, PermanentError),
        ("SignatureDoesNotMatch", 403, PermanentError),
    ],
)
def test_translate_client_errors(code: str, status: int, kind: type[Exception]) -> None:
    response: Any = {
        "Error": {"Code": code, "Message": "key AKIDSECRET was bad"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    error = ClientError(response, "GetObject")
    translated = translate(error, "reading s3://b/k")
    assert type(translated) is kind
    assert code in str(translated) and "s3://b/k" in str(translated)
    assert "AKIDSECRET" not in str(translated)


def test_translate_connection_and_credential_errors() -> None:
    down = EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
    assert isinstance(translate(down), BlobUnavailable)
    assert isinstance(translate(NoCredentialsError()), PermanentError)


def test_clients_are_cached_per_credential() -> None:
    clients = S3Clients()
    a = clients.client(Cred(endpoint="minio:9000"))
    assert clients.client(Cred(endpoint="minio:9000")) is a
    assert a.meta.endpoint_url == "http://minio:9000"
    secure = clients.client(Cred(endpoint="minio:9000", use_https=True))
    assert secure is not a and secure.meta.endpoint_url == "https://minio:9000"
    assert clients.client(Cred(endpoint="minio:9000", access_key_id="other")) is not a
    assert parse_s3_url("s3://bkt/a/b.txt") == S3Location("bkt", "a/b.txt")
    with pytest.raises(ValueError, match="s3://"):
        parse_s3_url("/local/path")


def test_malformed_endpoint_is_permanent() -> None:
    with pytest.raises(PermanentError, match="invalid S3 endpoint"):
        S3Clients().client(Cred(endpoint="http://bad host:x"))


# --- what a copy read, and a rollback's check of it -------------------------------------------


def digest_of(data: bytes) -> ModelDigest:
    return ModelDigest(size=len(data), sha256=hashlib.sha256(data).hexdigest())


@pytest.mark.parametrize(
    "changed", [b"new-modeX", b"new-model, longer"], ids=["same size", "other size"]
)
def test_a_copy_expecting_another_file_is_refused_and_replaces_nothing(
    store: BlobStore, tmp_path: Path, changed: bytes
) -> None:
    src, dst = tmp_path / "eval" / "model.pkl", tmp_path / "deploy" / "index.pkl"
    src.parent.mkdir()
    src.write_bytes(b"new-model")
    copy = {"src_url": str(src), "dst_url": str(dst), "output_dir": str(tmp_path),
            "src_cred": None, "dst_cred": None}  # fmt: skip
    recorded = store.copy_model(**copy)  # type: ignore[arg-type]
    assert recorded == digest_of(b"new-model")
    dst.write_bytes(b"deployed since")
    src.write_bytes(changed)
    with pytest.raises(Refused, match=r"is no longer the file that was deployed") as refused:
        store.copy_model(**copy, expect=recorded)  # type: ignore[arg-type]
    assert f"{len(changed)} bytes" in str(refused.value) and recorded.sha256 in str(refused.value)
    assert dst.read_bytes() == b"deployed since"
    assert files_under(dst.parent) == {dst}, "no staging file left behind"
    src.write_bytes(b"new-model")  # the valid neighbour: the same bytes again
    assert store.copy_model(**copy, expect=recorded) == recorded  # type: ignore[arg-type]
    assert dst.read_bytes() == b"new-model"


def test_a_sparse_model_is_hashed_as_the_zeros_its_holes_read_as(
    store: BlobStore, tmp_path: Path
) -> None:
    src, dst = tmp_path / "model.bin", tmp_path / "deploy" / "index.pkl"
    with src.open("wb") as f:
        f.seek(3 << 20)
        f.write(b"data")
        f.truncate(5 << 20)
    digest = store.copy_model(
        src_url=str(src), dst_url=str(dst), output_dir=None, src_cred=None, dst_cred=None
    )
    assert digest == digest_of(src.read_bytes()) == digest_of(dst.read_bytes())


def test_an_s3_copy_expecting_another_object_is_refused_and_replaces_nothing(
    store: BlobStore, s3c: S3Client, bucket: str, cred: Cred
) -> None:
    s3c.put_object(Bucket=bucket, Key="eval/1/model.pkl", Body=b"m1")
    copy = {"src_url": f"s3://{bucket}/eval/1/model.pkl", "dst_url": f"s3://{bucket}/deploy/m",
            "output_dir": f"s3://{bucket}", "src_cred": cred, "dst_cred": cred}  # fmt: skip
    recorded = store.copy_model(**copy)  # type: ignore[arg-type]
    assert recorded == digest_of(b"m1")
    s3c.put_object(Bucket=bucket, Key="eval/1/model.pkl", Body=b"m2")
    s3c.put_object(Bucket=bucket, Key="deploy/m", Body=b"deployed since")
    with pytest.raises(Refused, match=r"is no longer the file that was deployed"):
        store.copy_model(**copy, expect=recorded)  # type: ignore[arg-type]
    assert get(s3c, bucket, "deploy/m") == b"deployed since"
    s3c.put_object(Bucket=bucket, Key="eval/1/model.pkl", Body=b"m1")
    assert store.copy_model(**copy, expect=recorded) == recorded  # type: ignore[arg-type]
    assert get(s3c, bucket, "deploy/m") == b"m1"


def _dead_writers_file(directory: Path, target: str) -> Path:
    """A temporary file of `target` as a writer of this host that died left it (its pid is
    above any the kernel hands out: `_alive` says no)."""
    path = directory / f".{target}.999999999@{socket.gethostname()}~dead.tmp"
    path.write_bytes(b"half a model")
    return path


def test_a_dead_writers_file_is_swept_by_the_next_process_once_per_place(
    tmp_path: Path, tmp_dir: Path
) -> None:
    """What a dead writer left is swept by the first write to its place (a new store: a
    new process); the same store's next writes there do not look again, since nothing of
    its own can be left there by a death it survives; another place is swept on its own."""
    src = tmp_path / "eval" / "model.pkl"
    src.parent.mkdir()
    src.write_bytes(b"model")
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    left = _dead_writers_file(deploy, "index.pkl")
    other_place = _dead_writers_file(deploy, "other.pkl")
    store = BlobStore(S3Clients(), tmp_dir=str(tmp_dir))

    def copy(target: str) -> None:
        store.copy_model(src_url=str(src), dst_url=str(deploy / target),
                         output_dir=str(tmp_path), src_cred=None, dst_cred=None)  # fmt: skip

    copy("index.pkl")
    assert not left.exists(), "the first write to the place sweeps it"
    assert other_place.exists(), "a sweep takes the files of its own target only"
    planted_since = _dead_writers_file(deploy, "index.pkl")
    copy("index.pkl")
    assert planted_since.exists(), "a place is swept once per process"
    copy("other.pkl")
    assert not other_place.exists()
    assert (deploy / "index.pkl").read_bytes() == b"model"


def test_the_places_swept_are_remembered_up_to_a_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(staging.Swept, "LIMIT", 2)
    swept = staging.Swept()
    assert swept.first("/a", ".x.") and swept.first("/b", ".x.")
    assert not swept.first("/a", ".x.")
    assert swept.first("/c", ".x."), "past the limit the memory starts over"
    assert swept.first("/a", ".x."), "so a place is swept once more"


def test_no_place_in_a_directory_made_ahead_is_swept(store: BlobStore, tmp_path: Path) -> None:
    made, there = tmp_path / "out" / "deploy", tmp_path / "out" / "data"
    there.mkdir(parents=True)
    store.make_dirs([str(made), str(there)])
    swept = store._staging.swept
    assert not swept.first(str(made), ".index.pkl."), "made here: nothing to sweep"
    assert swept.first(str(there), ".index.pkl."), "there before: swept on its first write"


def _record_naming(monkeypatch: pytest.MonkeyPatch, *, links: bool = True) -> list[str]:
    """The staging module's naming calls, in order (each still made); without ``links``,
    a hard link fails as on a file system that has none."""
    calls: list[str] = []
    real = {name: getattr(staging.os, name) for name in ("fsync", "link", "replace")}

    def recorder(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            if name == "link" and not links:
                raise PermissionError(1, "Operation not permitted")
            return real[name](*args, **kwargs)

        return call

    for name in real:
        monkeypatch.setattr(staging.os, name, recorder(name))
    return calls


def test_a_new_target_is_linked_then_fsynced_and_a_replaced_one_fsynced_then_renamed(
    store: BlobStore, txt_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new name carries bytes, inode and name in one fsync (the directory's then has
    nothing left to commit); a target in place is replaced only once the new bytes are
    durable. Either way the target is whole and no staging file is left."""
    out = tmp_path / "round" / "data.txt"
    calls = _record_naming(monkeypatch)
    write_round(store, txt_source, out, [(0, 2)])
    assert calls == ["link", "fsync", "fsync"], "linked, the file fsynced, then its directory"
    calls.clear()
    write_round(store, txt_source, out, [(2, 4)])
    assert calls == ["link", "fsync", "replace", "fsync"], "in place: fsynced before renamed"
    assert out.read_bytes() == sample(2) + sample(3)
    assert sorted(p.name for p in out.parent.iterdir()) == ["data.txt"]


def test_a_planted_link_is_replaced_and_no_hard_links_means_a_rename(
    store: BlobStore, txt_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"not ours")
    out = tmp_path / "round" / "data.txt"
    out.parent.mkdir()
    out.symlink_to(outside)
    write_round(store, txt_source, out, [(0, 1)])
    assert not out.is_symlink() and out.read_bytes() == sample(0)
    assert outside.read_bytes() == b"not ours", "the link is replaced, never written through"
    calls = _record_naming(monkeypatch, links=False)
    new = tmp_path / "round2" / "data.txt"
    write_round(store, txt_source, new, [(1, 2)])
    assert calls == ["link", "fsync", "replace", "fsync"]
    assert new.read_bytes() == sample(1)
    assert sorted(p.name for p in new.parent.iterdir()) == ["data.txt"]
