"""Round files sliced at line ends against the sample definition, with blocks small enough
that every range starts, ends and spans inside and across them."""

from __future__ import annotations

import tempfile
from pathlib import Path
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from service.adapters import scanner as scanning
from service.adapters.blobs import BlobStore
from service.adapters.s3 import S3Clients

line_st = st.sampled_from([b"", b"\r", b"a", b"bb", b"c d", b"e\r"])
range_st = st.tuples(st.integers(0, 25), st.integers(0, 8)).map(lambda t: (t[0], t[0] + t[1]))


def samples_of(data: bytes) -> list[bytes]:
    lines = [line[:-1] if line.endswith(b"\r") else line for line in data.split(b"\n")]
    return [line for line in lines if line]


@settings(max_examples=150, deadline=None)
@given(
    lines=st.lists(line_st, max_size=30),
    ranges=st.lists(range_st, max_size=4),
    block=st.integers(1, 40),
)
def test_round_holds_exactly_the_ranges_samples(
    lines: list[bytes], ranges: list[tuple[int, int]], block: int
) -> None:
    data = b"\n".join(lines) + b"\n"
    expected = [s for start, end in ranges for s in samples_of(data)[start:end]]
    with (
        tempfile.TemporaryDirectory() as tmp,
        mock.patch.object(scanning, "BLOCK_BYTES", block),
    ):
        source, out = Path(tmp) / "source.txt", Path(tmp) / "round" / "data.txt"
        source.write_bytes(data)
        written = BlobStore(S3Clients(), tmp_dir=tmp).write_round(
            source_url=str(source),
            fmt="txt",
            ranges=ranges,
            data_url=str(out),
            index_url=None,
            index_prefix=None,
            source_cred=None,
            dest_cred=None,
        )
        assert written == len(expected)
        assert out.read_bytes() == b"".join(s + b"\n" for s in expected)
