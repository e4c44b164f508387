"""The core's part of outputDir claims: an insert whose outputDir another job holds is
refused naming it and changes nothing; a job gives its claim up when deleted or moved."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from service.core import paths
from service.core.effects import Reject, ReleaseOutputDir
from service.core.events import JobApplied, JobDeleted
from tests.core.driver import JOB, NS, Driver, spec


def taken(digest: str, output_dir: str = "/output") -> JobApplied:
    return JobApplied(
        namespace=NS, name=JOB, spec=spec(output_dir=output_dir), digest=digest,
        output_dir_holder="other-ns/other-job",
    )  # fmt: skip


def test_a_new_job_on_a_taken_output_dir_is_refused_and_not_created() -> None:
    d = Driver()
    effects = d.apply(taken("d1"))
    assert d.state is None
    (reject,) = effects
    assert isinstance(reject, Reject) and reject.code == "output_dir_taken"
    assert "outputDir /output is already used by job other-ns/other-job" in reject.reason


def test_moving_to_a_taken_output_dir_keeps_the_old_spec() -> None:
    d = Driver()
    d.create()
    before = d.state
    effects = d.apply(taken("d2", "/elsewhere"))
    assert d.state == before
    assert [type(e) for e in effects] == [Reject]


def test_deleting_or_moving_a_job_releases_its_output_dir() -> None:
    d = Driver()
    d.create(spec(output_dir="/output/"))
    moved = d.apply(JobApplied(namespace=NS, name=JOB, spec=spec(output_dir="/new"), digest="2"))
    # the directory released as it lies on disk (canonical), as the shell claimed it
    assert [e.output_dir for e in moved if isinstance(e, ReleaseOutputDir)] == ["/output"]
    same = d.apply(JobApplied(namespace=NS, name=JOB, spec=spec(output_dir="/new/"), digest="3"))
    assert not any(isinstance(e, ReleaseOutputDir) for e in same), "the same dir, spelled anew"
    deleted = d.apply(JobDeleted(namespace=NS, name=JOB))
    assert [e.output_dir for e in deleted if isinstance(e, ReleaseOutputDir)] == ["/new"]


@given(st.lists(st.sampled_from(["a", "b", "", ".", "x y"]), max_size=5), st.booleans())
def test_one_spelling_per_directory(parts: list[str], trailing: bool) -> None:
    path = "/" + "/".join(parts) + ("/" if trailing else "")
    canonical = paths.canonical_dir(path)
    assert canonical == paths.canonical_dir(canonical)
    assert paths.is_beneath(path, canonical) and paths.is_beneath(canonical, path)
    assert paths.canonical_dir("s3://b/out/") == "s3://b/out"
    assert paths.canonical_dir("s3://b/out//x") == "s3://b/out//x"


def test_the_holder_is_not_on_the_wire() -> None:
    """Set by the shell only: an ingress entry never carries it unless the shell put it."""
    plain = JobApplied(namespace=NS, name=JOB, spec=spec(), digest="d")
    assert b"output_dir_holder" not in msgspec.msgpack.encode(plain)


def test_a_release_names_the_directory_on_disk() -> None:
    """With a volume prefix the shell claims `/rootfs/output/v`: that is what is released."""
    d = Driver(prefix="/rootfs")
    d.create(spec(output_dir="/output/v/"))
    deleted = d.apply(JobDeleted(namespace=NS, name=JOB))
    released = [e.output_dir for e in deleted if isinstance(e, ReleaseOutputDir)]
    assert released == ["/rootfs/output/v"]
