"""Wire messages to core events: conversion, routing and what counts as "identical"."""

from __future__ import annotations

import base64
import copy
import json
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from service.core import reports
from service.core.events import JobApplied, WorkerReported
from service.core.paths import DataRoots
from service.errors import InvalidMessage
from service.runtime.intake import (
    accept_downstream,
    accept_report,
    decode_accepted,
    target_of,
    worker_topic_levels,
)
from service.wire import make_rejection
from tests.harness import job_resource, worker_message

#: A job as the GM sends it, with a trigger of its own (the tests read it back).
JOB = job_resource(
    "job-a",
    "ds",
    "/output",
    trigger={
        "checkPeriodSeconds": 30,
        "timer": {"start": "22:00", "end": "02:00"},
        "condition": {"operator": ">=", "threshold": "500", "metric": "num_of_samples"},
    },
)
JOB["metadata"]["resourceVersion"] = "1"


def envelope(resource: dict[str, Any]) -> bytes:
    header = {
        "namespace": "default",
        "resourceKind": "LifelongLearningJob",
        "resourceName": resource["metadata"]["name"],
        "operation": "insert",
    }
    return json.dumps({"header": header, "content": resource}).encode()


def applied(resource: dict[str, Any]) -> JobApplied:
    event = accept_downstream("t", envelope(resource), 0).event
    assert isinstance(event, JobApplied)
    return event


def test_job_spec_is_interpreted() -> None:
    event = applied(JOB)
    trigger = event.spec.trigger
    assert (event.spec.dataset, event.spec.train_prob, event.spec.output_dir) == (
        "ds",
        0.8,
        "/output",
    )
    assert (trigger.check_period_seconds, trigger.window) == (30, (22 * 60, 2 * 60))
    condition = trigger.condition
    assert condition is not None
    assert (condition.operator, condition.threshold_value, condition.metric) == (
        ">=",
        500.0,
        "num_of_samples",
    )
    assert target_of(event) == "job:default/job-a"


def test_resync_with_new_resource_version_and_status_is_identical() -> None:
    resent = copy.deepcopy(JOB)
    resent["metadata"]["resourceVersion"] = "2"
    resent["status"] = {"phase": "train"}
    assert applied(resent).digest == applied(JOB).digest


def test_spec_or_credential_change_is_a_change() -> None:
    changed = copy.deepcopy(JOB)
    changed["spec"]["dataset"]["trainProb"] = 0.5
    assert applied(changed).digest != applied(JOB).digest
    with_cred = copy.deepcopy(JOB)
    with_cred["metadata"]["annotations"] = {
        "sedna.io/credential": json.dumps({"ACCESS_KEY_ID": "a", "SECRET_ACCESS_KEY": "b"})
    }
    assert applied(with_cred).digest != applied(JOB).digest


def test_unset_condition_means_no_condition() -> None:
    unset = copy.deepcopy(JOB)
    unset["spec"]["trainSpec"]["trigger"]["condition"] = {
        "operator": "",
        "metric": "",
        "threshold": 0,
    }
    assert applied(unset).spec.trigger.has_condition is False


def test_worker_report_without_usable_model_says_why() -> None:
    report = worker_message("job-a", "train", "completed", worker="w1")
    report["results"] = [{"format": "pkl"}, {"url": 3}]
    event = accept_report("t", "w1", json.dumps(report).encode(), 0).event
    assert isinstance(event, WorkerReported)
    assert reports.model_refs(event) == ()
    assert "usable model" in reports.no_usable_model(event)


def test_worker_name_must_match_the_topic_or_path() -> None:
    report = worker_message("job-a", "train", "running", worker="w1")
    with pytest.raises(InvalidMessage) as caught:
        accept_report("t", "w2", json.dumps(report).encode(), 0)
    assert caught.value.path == "$.name" and caught.value.code == "name_mismatch"


def test_bad_credential_is_rejected_without_echoing_it() -> None:
    bad = copy.deepcopy(JOB)
    bad["metadata"]["annotations"] = {"sedna.io/credential": '{"SECRET_ACCESS_KEY": "s3cr3t"}'}
    with pytest.raises(InvalidMessage) as caught:
        accept_downstream("t", envelope(bad), 0)
    assert "s3cr3t" not in str(caught.value)


def test_worker_topic_levels() -> None:
    assert worker_topic_levels("sedna/node/workers/w-1/info") == (None, "w-1")
    assert worker_topic_levels("sedna/node/workers/ns-a/w-1/info") == ("ns-a", "w-1")
    assert worker_topic_levels("sedna/node/workers/w-1/other") is None
    assert worker_topic_levels("sedna/node/workers/ns-a/w-1/other") is None
    assert worker_topic_levels("sedna/node/downstream") is None


def test_rejections_never_carry_the_secret() -> None:
    bad = copy.deepcopy(JOB)
    bad["spec"]["outputDir"] = "../escape"
    bad["metadata"]["annotations"] = {
        "sedna.io/credential": json.dumps(
            {"ACCESS_KEY_ID": "AKIDCANARY", "SECRET_ACCESS_KEY": "s3cr3t-canary"}
        )
    }
    payload = envelope(bad)
    with pytest.raises(InvalidMessage) as caught:
        accept_downstream("t", payload, 0)
    rejection = make_rejection("t", caught.value.reason, payload, datetime.now(UTC))
    text = base64.b64decode(rejection.payload).decode()
    assert "s3cr3t-canary" not in text and "s3cr3t-canary" not in rejection.reason
    assert "outputDir" in text  # the rest of the message is still there to debug with


def dataset_envelope(url: str) -> bytes:
    header = {
        "namespace": "default",
        "resourceKind": "Dataset",
        "resourceName": "ds",
        "operation": "insert",
    }
    content = {
        "metadata": {"name": "ds", "namespace": "default"},
        "spec": {"url": url, "format": "txt", "nodeName": "n"},
    }
    return json.dumps({"header": header, "content": content}).encode()


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("outputDir", "/", ["$.spec.outputDir", "file system root"]),
        ("outputDir", "/etc", ["$.spec.outputDir", "system directory /etc"]),
        ("outputDir", "/proc/1/root/x", ["system directory /proc"]),
        ("outputDir", "/elsewhere/out", ["not under a data root", "/data:/output"]),
        ("url", "/etc/passwd", ["$.spec.url", "system directory /etc"]),
        ("url", "/dev/zero", ["$.spec.url", "system directory /dev"]),
        ("url", "/srv/data.txt", ["$.spec.url", "not under a data root"]),
    ],
)
def test_paths_outside_the_data_roots_are_rejected_at_intake(
    field: str, value: str, words: list[str]
) -> None:
    roots = DataRoots(roots=("/data", "/output"))
    if field == "url":
        payload = dataset_envelope(value)
    else:
        job = copy.deepcopy(JOB)
        job["spec"]["outputDir"] = value
        payload = envelope(job)
    accept_downstream("t", payload, 0)  # without data roots: the shape-only check
    with pytest.raises(InvalidMessage) as caught:
        accept_downstream("t", payload, 0, data_roots=roots)
    assert caught.value.code == "path_refused"
    for word in words:
        assert word in str(caught.value)


def test_paths_within_the_data_roots_and_s3_pass_intake() -> None:
    roots = DataRoots(roots=("/data", "/output"))
    assert accept_downstream("t", envelope(JOB), 0, data_roots=roots)
    assert accept_downstream("t", dataset_envelope("/data/d.txt"), 0, data_roots=roots)
    assert accept_downstream("t", dataset_envelope("s3://bkt/etc/d.txt"), 0, data_roots=roots)
    # with a volume prefix, the worker-visible path is judged where it lies on disk
    mounted = DataRoots(roots=("/rootfs",), prefix="/rootfs")
    assert accept_downstream("t", envelope(JOB), 0, data_roots=mounted)
    with pytest.raises(InvalidMessage, match="system directory /etc"):
        accept_downstream("t", dataset_envelope("/etc/shadow"), 0, data_roots=mounted)


def test_a_job_insert_an_older_replica_queued_is_read_with_its_spec() -> None:
    """A rolling upgrade: a job insert taken in before a job's spec was the wire's own sits in
    an ingress stream in that older layout (spelled out here field by field, as it was
    written); it is read, not quarantined, and its spec is the one it stood for."""
    older = msgspec.msgpack.encode(
        {
            "event": {
                "type": "job-applied",
                "namespace": "default",
                "name": "j1",
                "spec": {
                    "dataset": "ds",
                    "train_prob": 0.8,
                    "trigger": {
                        "check_period_s": 30,
                        "window": [60, 330],
                        "operator": ">",
                        "threshold": 100.0,
                        "metric": "num_of_samples",
                    },
                    "output_dir": "/data/out/j1",
                    "gate": {"operator": ">", "threshold": 0.01, "metric": "accuracy_delta[0]"},
                },
                "digest": "e0c51c88",
            },
            "topic": "sedna/edge/downstream",
            "received_ms": 1_700_000_000_000,
        }
    )
    accepted = decode_accepted(older)
    event = accepted.event
    assert isinstance(event, JobApplied)
    assert (event.name, event.digest, accepted.topic) == ("j1", "e0c51c88", "sedna/edge/downstream")
    assert event.spec.dataset == "ds" and event.spec.output_dir == "/data/out/j1"
    trigger = event.spec.trigger
    assert trigger.check_period_seconds == 30
    assert trigger.timer is not None and (trigger.timer.start, trigger.timer.end) == (
        "01:00",
        "05:30",
    )
    assert trigger.condition is not None and trigger.condition.metric == "num_of_samples"
    assert event.spec.gate is not None and event.spec.gate.metric == "accuracy_delta[0]"


def test_an_ingress_entry_of_neither_layout_keeps_its_own_error() -> None:
    with pytest.raises(msgspec.ValidationError, match="event"):
        decode_accepted(msgspec.msgpack.encode({"event": {"type": "job-applied", "name": 1}}))
