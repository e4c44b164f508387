"""Attacks on the controller's files and paths, through a real `lifelong serve` over a real
broker and Redis, with real files: a second spelling of another job's outputDir, an outputDir
inside another's, host files named as datasets, a data root swapped for a link, hard-linked
and foreign files, a sparse dataset that balloons into a round file, and round files that
pile up. Each is refused with its reason, and the valid neighbour still works.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.harness import Cloud, append_lines, job_resource, lines, wait_ingress
from tests.stack import Stack
from tests.wait import wait_until

MiB = 1 << 20
DATASET = "shared-data"


def job_in(namespace: str, name: str, output_dir: str, **kw: Any) -> dict[str, Any]:
    job = job_resource(name, DATASET, output_dir, **kw)
    job["metadata"]["namespace"] = namespace
    return job


def reason_of(cloud: Cloud, words: str) -> str:
    """The first errors-topic reason holding ``words``, once there is one."""
    found: str = cloud.wait_for(
        lambda: next((r["reason"] for r in cloud.errors() if words in r["reason"]), None),
        20,
        f"an error saying {words!r}",
    )
    return found


def unreadable(cloud: Cloud, dataset: str) -> str:
    return reason_of(cloud, f"dataset default/{dataset} cannot be read: ")


def test_one_directory_has_one_spelling_and_no_outputdir_nests_in_another(stack: Stack) -> None:
    """With a volume prefix, `/rootfs/output/v` was a second spelling of job v's `/output/v`
    and was accepted; `/output/v/deploy/index.pkl` as another job's outputDir was accepted and
    its first round made the victim's deploy model a directory."""
    rootfs = stack.workdir / "rootfs"
    data = rootfs / "data" / "train.txt"
    data.parent.mkdir(parents=True)
    append_lines(data, lines(0, 10))
    # the default data roots: Sedna's directories under the volume prefix
    env = {"LIFELONG_VOLUME_PREFIX": str(rootfs), "LIFELONG_DATA_ROOTS": ""}
    controller = stack.controller(env=env)
    cloud = stack.cloud
    wait_ingress(controller, cloud)
    cloud.insert_dataset(DATASET, "/data/train.txt")
    cloud.downstream("lifelonglearningjob", "insert", job_in("default", "v", "/output/v"))
    cloud.wait_status("v", "train", "ready")

    twice = job_in("attacker", "evil", f"{rootfs}/output/v")
    cloud.downstream("lifelonglearningjob", "insert", twice)
    assert "already carries the volume prefix" in reason_of(cloud, "$.spec.outputDir")
    inside = job_in("attacker", "nest", "/output/v/deploy/index.pkl")
    cloud.downstream("lifelonglearningjob", "insert", inside)
    assert "already used by job default/v, whose outputDir /output/v contains it" in reason_of(
        cloud, "index.pkl is already used"
    )
    above = job_in("attacker", "above", "/output")
    cloud.downstream("lifelonglearningjob", "insert", above)
    assert "whose outputDir /output/v lies inside it" in reason_of(cloud, "/output is already")

    # the valid neighbour: a sibling with a longer name trains as usual
    cloud.downstream("lifelonglearningjob", "insert", job_in("default", "v2", "/output/v2"))
    cloud.wait_status("v2", "train", "ready")
    assert (rootfs / "output" / "v2" / "data" / "train" / "1").is_dir()
    assert len(cloud.errors()) == 3, cloud.errors()
    # job v made its deploy directory ahead of its deploy; its deploy model is no directory
    assert not (rootfs / "output" / "v" / "deploy" / "index.pkl").exists()


def test_default_data_roots_are_an_allow_list(stack: Stack) -> None:
    """The default roots were "/": `/var/lib/dpkg/status` and `/root/.ssh` were datasets."""
    controller = stack.controller(env={"LIFELONG_DATA_ROOTS": ""})
    cloud = stack.cloud
    wait_ingress(controller, cloud)
    for name, url in (
        ("dpkg", "/var/lib/dpkg/status"), ("ssh", "/root/.ssh/id_rsa"), ("home", "/home/a/x.txt"),
    ):  # fmt: skip
        cloud.insert_dataset(name, url)
    cloud.wait_for(lambda: len(cloud.errors()) >= 3, 20, "three refusals")
    for error in cloud.errors():
        roots = "/data:/output:/models:/var/lib/sedna/model-hot-update"
        assert f"is not under a data root (LIFELONG_DATA_ROOTS={roots})" in (
            error["reason"]
        )
    assert all(cloud.upstream(name) == [] for name in ("dpkg", "ssh", "home"))


def test_missing_and_forbidden_datasets_read_alike(stack: Stack) -> None:
    """The errors topic told "does not exist" from "is a symbolic link" or "permission
    denied": a probe for which files exist. Both say "cannot read" now."""
    root = stack.workdir / "root"
    root.mkdir()
    secret = stack.workdir / "secret.txt"
    append_lines(secret, lines(0, 5))
    (root / "link.txt").symlink_to(secret)
    readable = root / "ok.txt"
    append_lines(readable, lines(0, 7))
    controller = stack.controller(env={"LIFELONG_DATA_ROOTS": str(root)})
    cloud = stack.cloud
    wait_ingress(controller, cloud)
    for name, path in (("missing", "none.txt"), ("linked", "link.txt"), ("ok", "ok.txt")):
        cloud.insert_dataset(name, root / path)
    said = {name: unreadable(cloud, name).split(": ", 1)[1] for name in ("missing", "linked")}
    assert said == {
        name: f"cannot read {root / path} (missing, or not readable by the controller)"
        for name, path in (("missing", "none.txt"), ("linked", "link.txt"))
    }
    cloud.wait_for(lambda: 7 in cloud.samples("ok"), 20, "the readable dataset counted")
    assert "link.txt is a symbolic link" in controller.log()  # the operator's log says which


def test_a_root_swapped_for_a_link_is_not_followed(stack: Stack) -> None:
    """The root was opened following links: swapped for a link to another directory, the
    files there were read as datasets."""
    share = stack.workdir / "share"
    root = share / "root"
    root.mkdir(parents=True)
    elsewhere = stack.workdir / "elsewhere"
    elsewhere.mkdir()
    append_lines(elsewhere / "passwd", lines(0, 9))
    controller = stack.controller(env={"LIFELONG_DATA_ROOTS": str(root)})
    cloud = stack.cloud
    wait_ingress(controller, cloud)
    root.rename(share / "root.old")
    root.symlink_to(elsewhere)
    cloud.insert_dataset("swapped", root / "passwd")
    assert str(root / "passwd") in unreadable(cloud, "swapped")
    assert cloud.samples("swapped") == []
    assert "is no longer a directory there" in controller.log()


@pytest.mark.parametrize(("mode", "starts"), [(0o777, False), (0o775, False), (0o1777, True)])
def test_a_root_others_can_swap_is_refused_at_start(
    stack: Stack, mode: int, starts: bool
) -> None:
    """A root in a directory anyone can write (without the sticky bit) can be swapped by
    anyone; with the sticky bit (as /tmp) only its owner can rename it."""
    open_dir = stack.workdir / "open"
    (open_dir / "root").mkdir(parents=True)
    open_dir.chmod(mode)
    env = {"LIFELONG_DATA_ROOTS": str(open_dir / "root")}
    if starts:
        stack.controller(env=env)
        return
    with pytest.raises(RuntimeError, match="writable by others"):
        stack.controller(env=env)


def test_hard_linked_and_foreign_files_are_not_read(stack: Stack) -> None:
    """Another job's 0600 file, hard-linked into a worker's round dir, was copied as the
    model (and read as a dataset); a file owned by another user too."""
    cloud = stack.cloud
    controller, out = stack.job_at_train_ready("j", DATASET)
    private = stack.workdir / "other-job" / "model.pkl"
    private.parent.mkdir()
    private.write_bytes(b"another job's model")
    private.chmod(0o600)

    trained = out / "train" / "1" / "model.pkl"
    trained.parent.mkdir(parents=True)
    trained.write_bytes(b"trained")
    cloud.report("j", "train", "completed", str(trained))
    cloud.wait_status("j", "eval", "ready")
    linked = out / "eval" / "1" / "model.pkl"
    linked.parent.mkdir(parents=True)
    os.link(private, linked)
    cloud.report("j", "eval", "completed", str(linked))
    failed = cloud.wait_status("j", "deploy", "failed")["content"]["reason"]
    assert "model.pkl has 2 hard links" in failed
    assert not (out / "deploy" / "index.pkl").exists()

    # a dataset hard-linked to a file elsewhere, and one owned by another user
    os.link(private, stack.workdir / "data" / "linked.txt")
    foreign = stack.workdir / "data" / "foreign.txt"
    append_lines(foreign, lines(0, 3))
    os.chown(foreign, 12345, 12345)
    for name in ("linked", "foreign"):
        path = stack.workdir / "data" / f"{name}.txt"
        cloud.insert_dataset(name, path)
    for name in ("linked", "foreign"):
        assert "cannot read" in unreadable(cloud, name)
    wait_until(lambda: "belongs to uid 12345" in controller.log(), 20, "the owner in the log")
    assert cloud.samples("linked") == cloud.samples("foreign") == []
    assert controller.stop() == 0


def sparse_lines(path: Path, count: int, line_bytes: int) -> None:
    """``count`` lines of ``line_bytes`` NULs each (the last byte a newline), as holes: a
    few KiB on disk."""
    with open(path, "wb") as f:
        for i in range(count):
            f.seek((i + 1) * line_bytes - 1)
            f.write(b"\n")


def test_sparse_datasets_are_capped_and_old_round_files_removed(stack: Stack) -> None:
    """512 lines of 1 MiB NULs (2 MB on disk) became a 409 MiB round file, and round files
    were never removed."""
    cloud = stack.cloud
    env = {
        "LIFELONG_MAX_DATASET_BYTES": "256MiB",
        "LIFELONG_MAX_ROUND_BYTES": "8MiB",
        "LIFELONG_ROUNDS_KEPT": "2",
    }
    data = stack.samples()
    out = stack.workdir / "out"
    controller = stack.serving(env=env)

    huge = stack.workdir / "data" / "huge.txt"
    sparse_lines(huge, 512, MiB)
    cloud.insert_dataset("huge", huge)
    assert f"{huge} holds {512 * MiB} bytes, more than the {256 * MiB} a dataset may" in (
        unreadable(cloud, "huge")
    )
    big = stack.workdir / "data" / "big.txt"
    sparse_lines(big, 16, MiB - 1)  # under the dataset cap, over the round cap
    cloud.insert_dataset("big", big)
    cloud.insert_job("big-job", "big", stack.workdir / "big-out", train_prob=1.0)
    failed = cloud.wait_status("big-job", "train", "failed")["content"]["reason"]
    assert f"more than {8 * MiB} bytes (LIFELONG_MAX_ROUND_BYTES)" in failed

    # the valid neighbour: a small job's rounds; round 1 deploys, round 2 fails, round 3
    # deploys, and round 4's data leaves rounds 3 and 4 (the newest two) and 1 (a rollback
    # target) on disk
    cloud.insert_dataset(DATASET, data)
    cloud.insert_job("j", DATASET, out)

    def deploy_round(version: int, after: int) -> None:
        cloud.wait_status("j", "train", "ready", after=after)
        trained = out / "train" / str(version) / "m.pkl"
        trained.parent.mkdir(parents=True)
        trained.write_bytes(b"trained")
        cloud.report("j", "train", "completed", str(trained))
        cloud.wait_status("j", "eval", "ready", after=after)
        evaluated = out / "eval" / str(version) / "m.pkl"
        evaluated.parent.mkdir(parents=True)
        evaluated.write_bytes(b"model %d" % version)
        cloud.report("j", "eval", "completed", str(evaluated))
        cloud.wait_status("j", "deploy", "ready", after=after)

    deploy_round(1, 0)
    after = len(cloud.upstream("j"))
    append_lines(data, lines(10, 20))
    cloud.wait_status("j", "train", "ready", after=after)
    cloud.report("j", "train", "failed")
    cloud.wait_status("j", "train", "failed", after=after)
    deploy_round(3, len(cloud.upstream("j")))
    after = len(cloud.upstream("j"))
    append_lines(data, lines(20, 30))
    cloud.wait_status("j", "train", "ready", after=after)
    rounds = out / "data" / "train"
    wait_until(lambda: not (rounds / "2").exists(), 20, "round 2's data removed")
    assert sorted(p.name for p in rounds.iterdir()) == ["1", "3", "4"]
    assert (out / "deploy" / "index.pkl").read_bytes() == b"model 3"
    assert controller.stop() == 0

