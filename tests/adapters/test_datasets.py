"""DatasetReader against real files and a real (moto) S3 server: incremental sample counts."""

from __future__ import annotations

import os
import tempfile
import tracemalloc
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.adapters.dataset_sources import Cursor, DatasetReader, Poll
from service.adapters.s3 import S3Clients
from service.adapters.scanner import TAIL_BYTES
from service.errors import BlobUnavailable
from tests.adapters.blob_calls import Cred
from tests.servers import free_port

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def reference_count(data: bytes, fmt: str) -> int:
    lines = [line[:-1] if line.endswith(b"\r") else line for line in data.split(b"\n")]
    samples = [line for line in lines if line]
    return max(len(samples) - 1, 0) if fmt == "csv" else len(samples)


@pytest.fixture
def reader() -> DatasetReader:
    return DatasetReader(S3Clients())


class LocalDataset:
    """A dataset file plus the cursor a caller would keep for it."""

    def __init__(self, reader: DatasetReader, path: Path, fmt: str = "txt") -> None:
        self.reader, self.path, self.fmt = reader, path, fmt
        self.cursor = Cursor()

    def append(self, data: bytes) -> None:
        with open(self.path, "ab") as f:
            f.write(data)

    def poll(self) -> Poll:
        poll = self.reader.poll(str(self.path), self.fmt, self.cursor, None)
        self.cursor = poll.cursor
        return poll


def test_txt_counts_and_reads_only_appended_bytes(reader: DatasetReader, tmp_path: Path) -> None:
    ds = LocalDataset(reader, tmp_path / "data.txt")
    ds.append(b"".join(b"sample-%06d label\n" % i for i in range(1000)))
    first = ds.poll()
    assert (first.num_samples, first.rewritten, first.missing) == (1000, False, False)
    assert first.bytes_read == ds.path.stat().st_size
    appended = b"".join(b"more-%06d label\n" % i for i in range(200))
    ds.append(appended)
    second = ds.poll()
    assert second.num_samples == 1200
    assert len(appended) <= second.bytes_read <= len(appended) + TAIL_BYTES
    idle = ds.poll()
    assert idle.num_samples == 1200
    assert idle.bytes_read <= TAIL_BYTES
    assert idle.cursor == second.cursor


def test_csv_header_crlf_and_blank_lines(reader: DatasetReader, tmp_path: Path) -> None:
    ds = LocalDataset(reader, tmp_path / "data.csv", "csv")
    ds.append(b"\r\nname,age\r\n\r\nann,3\r\n\n")
    poll = ds.poll()
    assert poll.num_samples == 1
    assert poll.cursor.header == "name,age"
    ds.append(b"bob,4\r\n\r\n\r\ncid,5\r\n")
    poll = ds.poll()
    assert poll.num_samples == 3
    assert poll.cursor.header == "name,age"


def test_csv_header_alone_is_no_sample(reader: DatasetReader, tmp_path: Path) -> None:
    ds = LocalDataset(reader, tmp_path / "data.csv", "csv")
    ds.append(b"h1,h2")
    assert ds.poll().num_samples == 0
    ds.append(b"\n1,2")
    assert ds.poll().num_samples == 1
    assert ds.cursor.header == "h1,h2"


def test_unterminated_line_counted_then_completed_once(
    reader: DatasetReader, tmp_path: Path
) -> None:
    ds = LocalDataset(reader, tmp_path / "data.txt")
    ds.append(b"a\nb\npartial")
    poll = ds.poll()
    assert poll.num_samples == 3
    assert poll.cursor.samples == 2
    assert poll.cursor.offset == 4
    ds.append(b"-done\n")
    poll = ds.poll()
    assert poll.num_samples == 3
    assert poll.cursor.samples == 3
    assert not poll.rewritten
    ds.append(b"c\n")
    assert ds.poll().num_samples == 4


def test_shrink_is_a_rewrite(reader: DatasetReader, tmp_path: Path) -> None:
    ds = LocalDataset(reader, tmp_path / "data.txt")
    ds.append(b"1\n2\n3\n4\n")
    assert ds.poll().num_samples == 4
    with open(ds.path, "r+b") as f:
        f.truncate(4)
    poll = ds.poll()
    assert (poll.num_samples, poll.rewritten) == (2, True)
    assert poll.cursor.offset == 4


def test_same_size_rewrite_in_place_is_detected(reader: DatasetReader, tmp_path: Path) -> None:
    ds = LocalDataset(reader, tmp_path / "data.txt")
    ds.append(b"aa\nbb\n")
    assert ds.poll().num_samples == 2
    with open(ds.path, "r+b") as f:  # same inode, same size, different lines
        f.write(b"\n\n\n\n\nc\n\nd\n")
    poll = ds.poll()
    assert (poll.num_samples, poll.rewritten) == (2, True)
    assert poll.bytes_read >= ds.path.stat().st_size


def test_replaced_file_is_a_rewrite(reader: DatasetReader, tmp_path: Path) -> None:
    ds = LocalDataset(reader, tmp_path / "data.txt")
    ds.append(b"a\nb\n")
    assert ds.poll().num_samples == 2
    new = tmp_path / "new.txt"
    new.write_bytes(b"a\nb\nc\n")
    os.replace(new, ds.path)
    poll = ds.poll()
    assert (poll.num_samples, poll.rewritten) == (3, True)
    assert poll.cursor.identity != ""


def test_missing_file_then_created(reader: DatasetReader, tmp_path: Path) -> None:
    ds = LocalDataset(reader, tmp_path / "later.txt")
    poll = ds.poll()
    assert (poll.missing, poll.num_samples, poll.cursor) == (True, 0, Cursor())
    ds.append(b"x\n")
    poll = ds.poll()
    assert (poll.missing, poll.num_samples) == (False, 1)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lines=st.lists(st.sampled_from([b"", b"\r", b"a", b"b c", b"1,2", b"x\r", b" "]), max_size=30),
    cuts=st.lists(st.integers(0, 400), max_size=6),
    fmt=st.sampled_from(["txt", "csv"]),
)
def test_incremental_equals_from_scratch(
    reader: DatasetReader, lines: list[bytes], cuts: list[int], fmt: str
) -> None:
    data = b"\n".join(lines)
    points = sorted({min(c, len(data)) for c in cuts} | {len(data)})
    with tempfile.TemporaryDirectory() as tmp:
        ds = LocalDataset(reader, Path(tmp) / "d", fmt)
        ds.path.write_bytes(b"")
        written = 0
        for point in points:
            ds.append(data[written:point])
            written = point
            poll = ds.poll()
            assert not poll.rewritten
            assert poll.num_samples == reference_count(data[:point], fmt)
            scratch = reader.poll(str(ds.path), fmt, Cursor(), None)
            assert scratch.num_samples == poll.num_samples
            assert scratch.cursor == poll.cursor


def test_million_lines_memory_stays_flat(reader: DatasetReader, tmp_path: Path) -> None:
    path = tmp_path / "big.txt"
    with open(path, "wb") as f:
        for chunk in range(10):
            f.write(
                b"".join(
                    b"/data/img-%07d.jpg %d\n" % (i, i % 7)
                    for i in range(chunk * 100_000, (chunk + 1) * 100_000)
                )
            )
    tracemalloc.start()
    try:
        poll = reader.poll(str(path), "txt", Cursor(), None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert poll.num_samples == 1_000_000
    assert peak < 20 * 1024 * 1024


# --- S3 -------------------------------------------------------------------------------


def test_s3_incremental_ranged_reads(
    reader: DatasetReader, s3_endpoint: str, bucket: str, s3c: S3Client
) -> None:
    cred = Cred(endpoint=s3_endpoint.removeprefix("http://"))
    url = f"s3://{bucket}/sets/data.csv"
    put = s3c.put_object
    body = b"h1,h2\n" + b"".join(b"%d,x\n" % i for i in range(500))
    put(Bucket=bucket, Key="sets/data.csv", Body=body)
    poll = reader.poll(url, "csv", Cursor(), cred)
    assert (poll.num_samples, poll.bytes_read, poll.cursor.header) == (500, len(body), "h1,h2")
    assert poll.cursor.identity == ""

    appended = b"".join(b"%d,y\n" % i for i in range(100)) + b"tail,z"
    body += appended
    put(Bucket=bucket, Key="sets/data.csv", Body=body)
    poll2 = reader.poll(url, "csv", poll.cursor, cred)
    assert poll2.num_samples == 601
    assert not poll2.rewritten
    assert len(appended) <= poll2.bytes_read <= len(appended) + TAIL_BYTES

    put(Bucket=bucket, Key="sets/data.csv", Body=body + b"\n")
    poll3 = reader.poll(url, "csv", poll2.cursor, cred)
    assert (poll3.num_samples, poll3.cursor.samples, poll3.rewritten) == (601, 601, False)

    rewritten = b"h1,h2\n" + b"".join(b"%d,q\n" % i for i in range(700))
    put(Bucket=bucket, Key="sets/data.csv", Body=rewritten)
    poll4 = reader.poll(url, "csv", poll3.cursor, cred)
    assert (poll4.num_samples, poll4.rewritten) == (700, True)


def test_s3_missing_key_and_bucket(reader: DatasetReader, s3_endpoint: str, bucket: str) -> None:
    cred = Cred(endpoint=s3_endpoint)
    for url in (f"s3://{bucket}/nope.txt", f"s3://no-such-bucket-{bucket}/x.txt"):
        poll = reader.poll(url, "txt", Cursor(), cred)
        assert (poll.missing, poll.num_samples) == (True, 0)


def test_s3_endpoint_down_is_blob_unavailable(reader: DatasetReader) -> None:
    cred = Cred(endpoint=f"127.0.0.1:{free_port()}")
    with pytest.raises(BlobUnavailable) as info:
        reader.poll("s3://b/k.txt", "txt", Cursor(), cred)
    assert "testing" not in str(info.value)
