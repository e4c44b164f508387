"""A train round's effect makes the directories its job's next steps write into: they are
exactly where the eval round's data and the deploy copy go, with the volume prefix, and
nothing is made for an output dir on S3 or by any other round."""

from __future__ import annotations

import posixpath

from service.core.effects import WriteRound
from service.wire import Trigger
from tests.core.driver import INCREMENTAL, Driver, report, spec


def fired(**job: object) -> Driver:
    d = Driver(prefix="/rootfs")
    d.create(spec(trigger=Trigger(), **job))  # type: ignore[arg-type]
    d.dataset(10)
    return d


def test_the_train_round_makes_the_eval_data_and_deploy_directories_ahead() -> None:
    d = fired()
    train = d.last_write()
    assert train.ahead == ("/rootfs/output/data/eval/1", "/rootfs/output/deploy")
    d.written("train")
    d.apply(report("train", "completed", "/output/train/1/m.pkl"))
    evaluated = d.last_write()
    assert evaluated.phase == "eval" and evaluated.ahead == ()
    assert posixpath.dirname(evaluated.data_url) == train.ahead[0]
    d.written("eval")
    d.apply(report("eval", "completed", "/output/eval/1/m.pkl"))
    assert posixpath.dirname(d.last_copy().dst_url) == train.ahead[1]


def test_an_incremental_job_deploys_to_its_model_so_only_the_eval_directory_is_made() -> None:
    d = fired(incremental=INCREMENTAL)
    assert d.last_write().ahead == ("/rootfs/output/data/eval/1",)


def test_an_output_dir_on_s3_has_no_directories_to_make() -> None:
    d = fired(output_dir="s3://bucket/out")
    write = d.last_write()
    assert isinstance(write, WriteRound) and write.ahead == ()
