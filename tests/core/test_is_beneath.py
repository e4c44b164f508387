"""`paths.is_beneath`: the one answer to "does this path lie in that directory", by name.

Checked against an independent oracle (component lists, built the long way) on paths made
of every kind of component an attacker might use: empty ones, ".", "..", names sharing a
prefix with their siblings, and S3 URLs with doubled slashes.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from service.core.paths import is_beneath

NAMES = st.sampled_from(["a", "b", "ab", "b.", ".b", "..b", "x y", "é"])
COMPONENTS = NAMES | st.sampled_from(["", ".", ".."])
BUCKETS = st.sampled_from(["bk", "bk2", "b"])


def local(parts: list[str]) -> str:
    return "/" + "/".join(parts)


def oracle_local(path: str, directory: str) -> bool:
    def parts(p: str) -> list[str] | None:
        if not p.startswith("/"):
            return None
        kept = []
        for part in p.split("/"):
            if part == "..":
                return None
            if part not in ("", "."):
                kept.append(part)
        return kept

    inner, outer = parts(path), parts(directory)
    if inner is None or outer is None:
        return False
    return len(inner) >= len(outer) and all(x == y for x, y in zip(inner, outer, strict=False))


@given(st.lists(COMPONENTS, max_size=5), st.lists(COMPONENTS, max_size=5))
def test_local_paths_agree_with_the_oracle(path: list[str], directory: list[str]) -> None:
    p, d = local(path), local(directory)
    assert is_beneath(p, d) == oracle_local(p, d)


@given(st.lists(NAMES, max_size=4), st.lists(NAMES, min_size=1, max_size=3))
def test_what_is_joined_to_a_directory_lies_beneath_it(
    directory: list[str], child: list[str]
) -> None:
    d = local(directory)
    assert is_beneath(d, d)
    assert is_beneath(d.rstrip("/") + "/" + "/".join(child), d)
    assert is_beneath(d.rstrip("/") + "//./" + "/".join(child) + "/", d + "/")


@given(st.lists(NAMES, min_size=1, max_size=4), NAMES)
def test_a_sibling_sharing_a_prefix_is_not_beneath(directory: list[str], tail: str) -> None:
    d = local(directory)
    assert not is_beneath(d + tail, d)  # /a/b + c = /a/bc
    assert not is_beneath(d + tail + "/m.pkl", d)


@given(st.lists(NAMES, max_size=3), st.lists(NAMES, max_size=3), st.lists(NAMES, max_size=3))
def test_dot_dot_never_escapes(directory: list[str], up: list[str], rest: list[str]) -> None:
    d = local(directory)
    escaped = d.rstrip("/") + "/" + "/".join([*up, "..", *rest])
    assert not is_beneath(escaped, d)
    assert not is_beneath(d, escaped)
    assert not is_beneath(d + "/..", d)


def test_relative_nul_and_mixed_schemes_are_never_beneath() -> None:
    assert not is_beneath("out/train/1/m", "out")
    assert not is_beneath("/out/m", "out")
    assert not is_beneath("/out/\0/m", "/out")
    assert not is_beneath("s3://bk/out/m", "/out")
    assert not is_beneath("/out/m", "s3://bk/out")
    assert not is_beneath("/bk/out/m", "s3://bk/out")
    assert is_beneath("/out/m", "/")


@given(BUCKETS, st.lists(COMPONENTS, max_size=4), BUCKETS, st.lists(COMPONENTS, max_size=4))
def test_s3_urls_compare_by_bucket_then_literal_key_prefix(
    bucket: str, key: list[str], dir_bucket: str, dir_key: list[str]
) -> None:
    path, directory = f"s3://{bucket}/" + "/".join(key), f"s3://{dir_bucket}/" + "/".join(dir_key)
    dotted = any(part in (".", "..") for part in key + dir_key)
    prefix = "/".join(dir_key).rstrip("/")
    literal = "/".join(key)
    expected = (
        bucket == dir_bucket
        and not dotted
        and (not prefix or literal.rstrip("/") == prefix or literal.startswith(prefix + "/"))
    )
    assert is_beneath(path, directory) == expected


def test_s3_examples() -> None:
    assert is_beneath("s3://bk/out/train/1/m.pkl", "s3://bk/out/train/1")
    assert is_beneath("s3://bk/out/train/1/m.pkl", "s3://bk/out/train/1/")
    assert is_beneath("s3://bk/anything", "s3://bk")
    assert not is_beneath("s3://bk/out/train/10/m.pkl", "s3://bk/out/train/1")
    assert not is_beneath("s3://bk2/out/train/1/m.pkl", "s3://bk/out/train/1")
    assert not is_beneath("s3://bk/out//train/1/m.pkl", "s3://bk/out/train/1")
    assert not is_beneath("s3://bk/out/train/1/../2/m.pkl", "s3://bk/out/train/1")
    assert not is_beneath("s3://bk", "s3://bk/out")
