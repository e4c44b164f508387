"""The pure path rules: `is_beneath`, the data roots and system directories, `output_dir_of`."""

from __future__ import annotations

import posixpath

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from service.core import paths
from service.core.paths import DataRoots, is_beneath, outside_roots, system_dir_of

NAMES = st.sampled_from(["a", "b", "out", "etc", "train", "1", "x.pkl", "ab", "a.b"])
PARTS = st.lists(NAMES, max_size=5)
# ways of writing one path: extra slashes, "." components, a trailing slash
SEPARATORS = st.sampled_from(["/", "//", "/./"])


def local(parts: list[str]) -> str:
    return "/" + "/".join(parts)


@st.composite
def spelled(draw: st.DrawFn, parts: list[str]) -> str:
    """The path of `parts`, written with redundant separators."""
    text = "".join(draw(SEPARATORS) + part for part in parts) or "/"
    return text + ("/" if draw(st.booleans()) else "")


@given(PARTS, PARTS)
def test_beneath_is_component_prefix(inner: list[str], outer: list[str]) -> None:
    expected = inner[: len(outer)] == outer
    assert is_beneath(local(inner), local(outer)) is expected
    assert is_beneath(local(outer + inner), local(outer))


@given(PARTS, PARTS, st.data())
def test_beneath_ignores_spelling(inner: list[str], outer: list[str], data: st.DataObject) -> None:
    plain = is_beneath(local(inner), local(outer))
    assert is_beneath(data.draw(spelled(inner)), data.draw(spelled(outer))) is plain


@given(PARTS, PARTS)
def test_string_prefix_is_not_beneath(inner: list[str], outer: list[str]) -> None:
    """`/out-evil` starts with `/out` but is not in it."""
    assume(outer)
    sibling = [*outer[:-1], outer[-1] + "x"]
    assert not is_beneath(local(sibling + inner), local(outer))


@given(PARTS, PARTS, st.integers(min_value=0, max_value=5))
def test_dotdot_is_never_beneath(inner: list[str], outer: list[str], at: int) -> None:
    escaping = [*inner[:at], "..", *inner[at:]]
    assert not is_beneath(local(outer + escaping), local(outer))
    assert not is_beneath(local(outer), local(escaping))


@given(PARTS)
def test_relative_and_mixed_are_never_beneath(parts: list[str]) -> None:
    assume(parts)
    assert not is_beneath("/".join(parts), "/")
    assert not is_beneath(local(parts), "s3://" + parts[0])
    assert not is_beneath("s3://" + "/".join(parts), "/")


@given(st.sampled_from(["bkt", "other"]), PARTS, PARTS)
def test_s3_beneath_is_bucket_and_key_prefix(
    bucket: str, inner: list[str], outer: list[str]
) -> None:
    url = f"s3://{bucket}/" + "/".join(inner)
    expected = bucket == "bkt" and inner[: len(outer)] == outer
    assert is_beneath(url, "s3://bkt/" + "/".join(outer)) is expected
    assert is_beneath(url + "/", "s3://bkt/" + "/".join(outer) + "/") is expected


def test_s3_examples() -> None:
    assert is_beneath("s3://bkt/out/train/1/m.pkl", "s3://bkt/out")
    assert not is_beneath("s3://bkt/out-x/m.pkl", "s3://bkt/out")
    assert not is_beneath("s3://other/out/m.pkl", "s3://bkt/out")
    assert not is_beneath("s3://bkt/out/../secret", "s3://bkt/out")
    assert not is_beneath("s3://", "s3://")


@pytest.mark.parametrize(
    ("path", "system"),
    [
        ("/", "/"),
        ("//", "/"),
        ("/etc", "/etc"),
        ("/etc/", "/etc"),
        ("/etc/passwd", "/etc"),
        ("/proc/self/environ", "/proc"),
        ("/sys/kernel", "/sys"),
        ("/dev/zero", "/dev"),
        ("/boot", "/boot"),
        ("/usr/lib/x", "/usr"),
        ("/lib64/ld.so", "/lib64"),
        ("/var/run/docker.sock", "/var/run"),
        ("/run/secrets/x", "/run"),
        ("/etcetera", None),
        ("/var/lib/data", None),
        ("/data/etc", None),
        ("/tmp/x", None),
        ("/output", None),
    ],
)
def test_system_dirs(path: str, system: str | None) -> None:
    assert system_dir_of(path) == system


@given(st.sampled_from(paths.SYSTEM_DIRS), PARTS)
def test_nothing_in_a_system_dir_is_allowed(system: str, parts: list[str]) -> None:
    path = posixpath.join(system, *parts)
    reason = outside_roots(path, ("/",))
    assert reason is not None and system in reason


@pytest.mark.parametrize(
    ("path", "roots", "prefix", "words"),
    [
        ("/", ("/",), "", ["file system root"]),
        ("/etc", ("/",), "", ["system directory /etc"]),
        ("/data/out", ("/data",), "", None),
        ("/data", ("/data",), "", None),
        ("/database/x", ("/data",), "", ["not under a data root", "LIFELONG_DATA_ROOTS=/data"]),
        ("/other/x", ("/data", "/srv"), "", ["LIFELONG_DATA_ROOTS=/data:/srv"]),
        ("/srv/x", ("/data", "/srv"), "", None),
        ("relative/x", ("/",), "", ["absolute"]),
        ("/data/../etc", ("/",), "", ["'..'"]),
        # with a volume prefix, system directories are judged as the host sees them
        ("/rootfs/etc/passwd", ("/rootfs",), "/rootfs", ["'/etc/passwd'", "/etc"]),
        ("/rootfs", ("/rootfs",), "/rootfs", ["file system root"]),
        ("/rootfs/output/j", ("/rootfs",), "/rootfs", None),
        ("/output/j", ("/rootfs",), "/rootfs", ["not under a data root"]),
    ],
)
def test_outside_roots(
    path: str, roots: tuple[str, ...], prefix: str, words: list[str] | None
) -> None:
    reason = outside_roots(path, roots, prefix)
    if words is None:
        assert reason is None
    else:
        assert reason is not None
        for word in words:
            assert word in reason


def test_data_roots_check_worker_visible_urls() -> None:
    mounted = DataRoots(roots=("/rootfs",), prefix="/rootfs")
    assert mounted.problem("/output/job") is None  # becomes /rootfs/output/job on disk
    # already prefixed: a second spelling of /output/job, refused so each has one
    twice = mounted.problem("/rootfs/output/job") or ""
    assert "already carries the volume prefix /rootfs" in twice and "'/output/job'" in twice
    assert mounted.problem("/rootfsx/job") is None  # a neighbour whose name merely starts so
    assert "system directory /etc" in (mounted.problem("/etc") or "")
    assert "file system root" in (mounted.problem("/") or "")
    assert mounted.problem("s3://bkt/etc") is None  # not a local path
    assert mounted.locate("/rootfs/output") == ("/rootfs", ("output",))
    nested = DataRoots(roots=("/", "/data", "/data/jobs"))
    assert nested.locate("/data/jobs/j/x") == ("/data/jobs", ("j", "x"))
    assert nested.locate("/data/jobs") == ("/data/jobs", ())
    assert nested.locate("/database") == ("/", ("database",))
    assert DataRoots(roots=("/data",)).locate("/srv") is None
    assert DataRoots(roots=("/data",)).locate("/data/../srv") is None


def test_claim_dir_is_the_one_spelling_on_disk() -> None:
    assert paths.claim_dir("/rootfs", "/output/v") == "/rootfs/output/v"
    assert paths.claim_dir("/rootfs", "/rootfs/output/v/") == "/rootfs/output/v"
    assert paths.claim_dir("", "//output/./v/") == "/output/v"
    assert paths.claim_dir("/rootfs", "s3://b/out/") == "s3://b/out"


def test_ancestors_are_the_directories_a_claim_lies_in() -> None:
    assert paths.ancestors("/rootfs/output/v") == ["/rootfs", "/rootfs/output"]
    assert paths.ancestors("/output") == []
    assert paths.ancestors("s3://bkt/jobs/a") == ["s3://bkt", "s3://bkt/jobs"]
    assert paths.ancestors("s3://bkt") == []


@given(PARTS)
def test_output_dir_of_inverts_deploy_model(parts: list[str]) -> None:
    out = local(parts)
    assert paths.output_dir_of(paths.deploy_model(out)) == out.rstrip("/")
    assert paths.output_dir_of(paths.deploy_model("s3://b" + out)) == ("s3://b" + out).rstrip("/")
    model = paths.join(out, "train", "1", "model.pkl")
    assert paths.output_dir_of(model) == model  # not a deploy target: nothing lies beneath it
