"""Datasets that cannot be read are said so, once, and clear when they can be read.

The shipped example's `/data/trainData.csv` did not exist and the dataset showed `Samples: 0`
forever, silently. Here, through a real broker, Redis, real files and an S3 server that
enforces IAM: a missing file, a file the controller may not read and an S3 object it is
forbidden (403) each give one message on the errors topic however often they are polled, a
gauge says which datasets are unreadable now, the dataset's state keeps the reason; a job on
the missing dataset waits, and trains once the file appears.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

from service.core.state import DatasetState
from service.keys import dataset_key
from service.runtime.executor import unreadable
from tests.conftest import DeniedS3
from tests.harness import (
    NODE,
    NS,
    PREFIX,
    Controller,
    append_lines,
    lines,
    metric_sum,
    wait_ingress,
)
from tests.stack import Stack

MISSING, LOCKED, FORBIDDEN = "missing-data", "locked-data", "forbidden-data"
JOB = "waiting-job"
POLLS = 3  # polls (1 s apart) watched after the reports, to see they are not repeated


def dataset_state(stack: Stack, name: str) -> DatasetState:
    state = stack.stored_state(dataset_key(NS, name))
    assert isinstance(state, DatasetState)
    return state


def unreadable_now(controller: Controller, name: str) -> float:
    return metric_sum(controller, "lifelong_dataset_unreadable", namespace=NS, name=name)


def reports(controller: Controller, name: str) -> float:
    return metric_sum(
        controller, "lifelong_dataset_unreadable_reports_total", namespace=NS, name=name
    )


def polls(controller: Controller) -> float:
    return metric_sum(controller, "lifelong_events_total", type="DatasetPolled")


def unprivileged_controller(stack: Stack) -> Controller:
    """A controller that file permissions apply to: as root, one without the capabilities
    that let root read any file (mode 000 would not stop it)."""
    controller = stack.controller(start=False)
    if os.geteuid() == 0:
        controller.argv_prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    controller.start()
    controller.wait_ready()
    return controller


def test_unreadable_datasets_are_reported_once_and_clear(
    stack: Stack, s3_denied: DeniedS3
) -> None:
    cloud = stack.cloud
    controller = unprivileged_controller(stack)
    wait_ingress(controller, cloud)
    data = stack.workdir / "data"
    data.mkdir()
    missing = data / "trainData.csv"
    locked = data / "locked.txt"
    append_lines(locked, lines(0, 4))
    locked.chmod(0)
    forbidden_url = f"s3://{s3_denied.bucket}/{s3_denied.key}"
    credential = {
        "s3-endpoint": s3_denied.endpoint.removeprefix("http://"), "s3-usehttps": "0",
        "ACCESS_KEY_ID": s3_denied.access_key_id,
        "SECRET_ACCESS_KEY": s3_denied.secret_access_key,
    }  # fmt: skip
    cloud.insert_dataset(MISSING, missing, "csv")
    cloud.insert_dataset(LOCKED, locked)
    cloud.insert_dataset(FORBIDDEN, forbidden_url, credential=credential)
    out = stack.workdir / "out"
    cloud.insert_job(JOB, MISSING, out)

    errors = cloud.wait_for(lambda: len(cloud.errors()) >= 3 and cloud.errors(), 20, "3 reports")
    by_name = {e["reason"].split(":")[0]: e for e in errors}
    names = (MISSING, LOCKED, FORBIDDEN)
    assert set(by_name) == {f"dataset {NS}/{n} cannot be read" for n in names}
    first = by_name[f"dataset {NS}/{MISSING} cannot be read"]
    assert first["reason"].endswith(unreadable(str(missing)))
    assert first["topic"] == f"{PREFIX}/{NODE}/downstream"
    assert base64.b64decode(first["payload"]) == str(missing).encode()
    # missing and forbidden read alike on the errors topic; the log says which
    locked_reason = by_name[f"dataset {NS}/{LOCKED} cannot be read"]["reason"]
    assert locked_reason.endswith(unreadable(str(locked)))
    assert "permission denied" in controller.log()
    forbidden = by_name[f"dataset {NS}/{FORBIDDEN} cannot be read"]["reason"]
    assert "HTTP 403" in forbidden and s3_denied.secret_access_key not in forbidden

    # polled again and again: nothing more is said, the gauges and the states say it
    seen = polls(controller)
    cloud.wait_for(lambda: polls(controller) >= seen + 3 * POLLS, 20, "more polls")
    assert len(cloud.errors()) == 3, cloud.errors()
    for name in (MISSING, LOCKED, FORBIDDEN):
        assert unreadable_now(controller, name) == 1
        assert reports(controller, name) == 1
    assert dataset_state(stack, MISSING).unreadable == unreadable(str(missing))
    assert dataset_state(stack, MISSING).num_samples == -1, "not 'Samples: 0'"
    assert cloud.samples(MISSING) == [] and cloud.upstream(JOB) == []

    # the file appears and the other is opened up: counted, cleared, and the job trains
    append_lines(missing, ["temperature,humidity,label", *[f"{i},{i},0" for i in range(10)]])
    locked.chmod(0o644)
    cloud.wait_for(lambda: 10 in cloud.samples(MISSING), 20, "numberOfSamples 10")
    cloud.wait_for(lambda: 4 in cloud.samples(LOCKED), 20, "numberOfSamples 4")
    ready = cloud.wait_status(JOB, "train", "ready")
    assert Path(ready["content"]["input"]["dataURL"]).read_text().splitlines()[0] == (
        "temperature,humidity,label"
    )
    cloud.wait_for(lambda: unreadable_now(controller, MISSING) == 0, 10, "gauge gone")
    assert unreadable_now(controller, LOCKED) == 0
    assert dataset_state(stack, MISSING).unreadable is None
    assert dataset_state(stack, LOCKED).unreadable is None
    assert unreadable_now(controller, FORBIDDEN) == 1

    # deleting the forbidden dataset takes its gauge along
    cloud.downstream("dataset", "delete", None, name=FORBIDDEN)
    cloud.wait_for(lambda: unreadable_now(controller, FORBIDDEN) == 0, 10, "deleted gauge gone")
    assert len(cloud.errors()) == 3, "clearing is no error"
    log = controller.log()
    assert log.count(f"dataset {NS}/{MISSING} cannot be read") == 1, "one warning, not one a poll"
    assert s3_denied.secret_access_key not in log
