"""`get` and `describe` on what a real controller wrote: why a job's rounds fail and when it
tries again, as the worker reported it (exit code, stderr tail, secrets masked), and a
dataset whose source cannot be read."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.cli.runner import cli_env, run_cli, wait_rows
from tests.harness import (
    NODE,
    PREFIX,
    append_lines,
    lines,
    wait_ingress,
    worker_message,
)
from tests.stack import Stack

JOB = "failing-job"
DATASET = "failing-data"


def test_a_failing_job_shows_why_and_when_it_tries_again(stack: Stack, tmp_path: Path) -> None:
    data = tmp_path / "data.txt"
    append_lines(data, lines(0, 10))
    cloud = stack.cloud
    wait_ingress(stack.controller(), cloud)
    cloud.insert_dataset(DATASET, data)
    trigger = {"checkPeriodSeconds": 600, "condition": {"operator": ">", "threshold": 0,
                                                        "metric": "num_of_samples"}}  # fmt: skip
    cloud.insert_job(JOB, DATASET, tmp_path / "out", trigger=trigger)
    cloud.wait_status(JOB, "train", "ready")

    # what `lifelong worker` reports when the command exits 3
    report = worker_message(JOB, "train", "failed", worker=f"{JOB}-train-1")
    stderr = "reading data\nconnecting with password=hunter2\nValueError: no label column\n"
    report["ownerInfo"] = {"exitCode": 3, "stderr": stderr}
    cloud.publish(f"{PREFIX}/{NODE}/workers/{report['name']}/info", json.dumps(report).encode())

    env = cli_env(stack.mqtt_url, stack.redis_url)
    wait_rows(env, "jobs", lambda rows: [r["state"] for r in rows] == ["backoff"])
    described = run_cli(env, "describe", "job", JOB)
    assert described.returncode == 0, described.stderr
    shown = {ln.split(":", 1)[0]: ln for ln in described.stdout.splitlines() if ":" in ln}
    assert shown["Last error"] == (
        f"Last error:     train worker {JOB}-train-1 failed (exit code 3; stderr: reading data | "
        "connecting with password=*** | ValueError: no label column)"
    )
    # one check period (600 s) after the failure: minutes away, whatever the test's pace
    failures = r"Failures:       1 in a row; next try \S+Z \(in \d+m(\d+s)?\)"
    assert re.fullmatch(failures, shown["Failures"]), shown["Failures"]
    assert "hunter2" not in described.stdout


def test_an_unreadable_dataset_is_shown_with_its_reason(stack: Stack, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-file.txt"
    cloud = stack.cloud
    wait_ingress(stack.controller(), cloud)
    cloud.insert_dataset(DATASET, missing)
    env = cli_env(stack.mqtt_url, stack.redis_url)
    rows = wait_rows(env, "datasets", lambda r: [d["status"] for d in r] == ["unreadable"])
    assert rows[0]["samples"] is None
    described = run_cli(env, "describe", "dataset", DATASET)
    assert described.returncode == 0, described.stderr
    (line,) = [ln for ln in described.stdout.splitlines() if ln.startswith("Unreadable:")]
    assert str(missing) in line, line

    append_lines(missing, lines(0, 3))  # it appears: the condition clears
    rows = wait_rows(env, "datasets", lambda r: [d["status"] for d in r] == ["ok"])
    assert rows[0]["samples"] == 3
