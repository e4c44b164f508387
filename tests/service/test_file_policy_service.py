"""The file access policy through the whole service: a real `lifelong serve` over a real broker
and Redis, with hostile files planted by "workers" and hostile resources sent by "the cloud".
Each refusal reaches the cloud as a `failed` status (or a rejection) with its reason, and the
controller carries on: the next round deploys, and SIGTERM still stops it cleanly.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.harness import Cloud, Controller, append_lines, lines, metric_sum, model_file
from tests.stack import Stack

JOB = "guarded-job"
DATASET = "guarded-dataset"
MiB = 1 << 20


def setup(stack: Stack) -> tuple[Cloud, Controller, Path, Path]:
    """A 10-sample dataset, a job on it, a running controller; returns the data and out dir."""
    cloud = stack.cloud
    data = stack.samples()
    out = stack.workdir / "out"
    out.mkdir()
    controller = stack.serving()
    cloud.insert_dataset(DATASET, data)
    cloud.insert_job(JOB, DATASET, out)
    return cloud, controller, data, out


def train_round(cloud: Cloud, out: Path, version: int, after: int) -> None:
    """Round `version` trains: train ready -> completed with a model -> eval ready."""
    cloud.wait_status(JOB, "train", "ready", after=after)
    trained = model_file(out / "train" / str(version) / "model.pkl", b"trained %d" % version)
    cloud.report(JOB, "train", "completed", trained)
    cloud.wait_status(JOB, "eval", "ready", after=after)


def next_round(cloud: Cloud, data: Path, start: int) -> int:
    """Append samples so the trigger fires again; the upstream count to wait after."""
    after = len(cloud.upstream(JOB))
    append_lines(data, lines(start, start + 10))
    return after


def deploy_failure(cloud: Cloud, after: int) -> str:
    reason: str = cloud.wait_status(JOB, "deploy", "failed", after=after)["content"]["reason"]
    return reason


def test_hostile_models_fail_their_deploy_and_the_next_round_deploys(stack: Stack) -> None:
    cloud, controller, data, out = setup(stack)
    passwd = stack.workdir / "host-etc" / "passwd"
    passwd.parent.mkdir()
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\n")
    passwd.chmod(0o600)
    deploy = out / "deploy" / "index.pkl"

    # round 1: the eval worker planted a symlink to a root-only file as its model
    train_round(cloud, out, 1, after=0)
    planted = out / "eval" / "1" / "model.pkl"
    planted.parent.mkdir(parents=True)
    planted.symlink_to(passwd)
    cloud.report(JOB, "eval", "completed", str(planted))
    assert "eval/1/model.pkl is a symbolic link" in deploy_failure(cloud, 0)
    assert not deploy.exists()

    # round 2: a FIFO as the model: refused at once, no effect thread blocked on it
    after = next_round(cloud, data, 10)
    train_round(cloud, out, 2, after)
    fifo = out / "eval" / "2" / "model.pkl"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    cloud.report(JOB, "eval", "completed", str(fifo))
    assert "model.pkl is a FIFO, not a regular file" in deploy_failure(cloud, after)

    # round 3: a model outside the job's output dir: the report itself is refused (a model
    # must lie in its round's output dir), nothing is copied; the worker then fails the round
    after = next_round(cloud, data, 20)
    train_round(cloud, out, 3, after)
    cloud.report(JOB, "eval", "completed", str(passwd))
    refusal = cloud.wait_for(cloud.errors, 15, "the report's refusal")[0]
    assert f"reported model '{passwd}', which is not under {out}/eval/3/" in refusal["reason"]
    assert not deploy.exists()
    cloud.report(JOB, "eval", "failed")

    # round 4: a real model deploys; the controller saw nothing worse than three refusals
    after = next_round(cloud, data, 30)
    train_round(cloud, out, 4, after)
    cloud.report(JOB, "eval", "completed", model_file(out / "eval" / "4" / "m.pkl", b"good model"))
    cloud.wait_status(JOB, "deploy", "ready", after=after)
    assert deploy.read_bytes() == b"good model"
    assert passwd.read_text().startswith("root:")
    assert controller.stop() == 0


def test_swapped_dirs_system_dirs_fifos_and_huge_lines_are_refused(stack: Stack) -> None:
    cloud, controller, data, out = setup(stack)
    victim = stack.workdir / "victim"
    victim.mkdir()

    # outputDir "/" and "/etc", a dataset in /etc: rejected at intake, with the field and why
    for name, output_dir in (("root-job", "/"), ("etc-job", "/etc")):
        cloud.insert_job(name, DATASET, output_dir)
    cloud.insert_dataset("etc-dataset", "/etc/passwd")
    cloud.wait_for(lambda: len(cloud.errors()) >= 3, 15, "three rejections")
    reasons = sorted(r["reason"] for r in cloud.errors())
    assert reasons == [
        "$.spec.outputDir: '/' is the file system root",
        "$.spec.outputDir: '/etc' is in the system directory /etc",
        "$.spec.url: '/etc/passwd' is in the system directory /etc",
    ]
    assert cloud.upstream("root-job") == cloud.upstream("etc-job") == []
    assert metric_sum(controller, "lifelong_rejections_total", reason="path_refused") == 3

    # a 512 MiB sparse one-line dataset: its poll is refused; the controller stays small
    huge = stack.workdir / "data" / "huge.txt"
    with open(huge, "wb") as f:
        f.truncate(512 * MiB)
    cloud.insert_dataset("huge-dataset", huge)
    cloud.insert_job("huge-job", "huge-dataset", stack.workdir / "huge-out", train_prob=1.0)

    # a FIFO as a dataset: each poll is refused at once (it blocked an effect thread forever)
    fifo = stack.workdir / "data" / "fifo.txt"
    os.mkfifo(fifo)
    cloud.insert_dataset("fifo-dataset", fifo)

    # round 1 runs; the worker then swaps the next round's data dir for a link elsewhere
    train_round(cloud, out, 1, after=0)
    cloud.report(JOB, "eval", "completed", model_file(out / "eval" / "1" / "m.pkl", b"model 1"))
    cloud.wait_status(JOB, "deploy", "ready")
    (out / "data" / "train" / "2").symlink_to(victim)
    after = next_round(cloud, data, 10)
    failed = cloud.wait_status(JOB, "train", "failed", after=after)["content"]["reason"]
    assert "data/train/2 is a symbolic link" in failed

    # the job retries as round 3 one check period later; then the deploy dir is swapped
    train_round(cloud, out, 3, after)
    (out / "deploy" / "index.pkl").unlink()
    (out / "deploy").rmdir()
    (out / "deploy").symlink_to(victim)
    cloud.report(JOB, "eval", "completed", model_file(out / "eval" / "3" / "m.pkl", b"model 3"))
    assert "out/deploy is a symbolic link" in deploy_failure(cloud, after)
    assert list(victim.iterdir()) == []

    # both datasets are reported unreadable on the errors topic, with the reason
    def unreadable(name: str) -> str | None:
        prefix = f"dataset default/{name} cannot be read: "
        return next((r["reason"] for r in cloud.errors() if r["reason"].startswith(prefix)), None)

    huge_reason = cloud.wait_for(lambda: unreadable("huge-dataset"), 15, "huge unreadable")
    assert "huge.txt: the line at byte 0 is longer than 1048576 bytes" in huge_reason
    fifo_reason = cloud.wait_for(lambda: unreadable("fifo-dataset"), 15, "fifo unreadable")
    assert f"cannot read {fifo} (missing, or not readable" in fifo_reason  # the log says why
    assert "fifo.txt is a FIFO, not a regular file" in controller.log()
    assert cloud.samples("huge-dataset") == []
    assert cloud.upstream("huge-job") == []
    assert peak_rss_mb(controller) < 300
    assert controller.stop() == 0


def peak_rss_mb(controller: Controller) -> float:
    assert controller.proc is not None
    with open(f"/proc/{controller.proc.pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")
