"""What the CLI prints: tables, ages, job and dataset views, history and watch lines."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from service import wire
from service.cli import rendering
from service.core.state import DatasetInfo, DatasetState, GmView, JobState, ModelRef
from service.wire import Condition, JobSpec, Timer, Trigger
from tests.cli.documents import JOB, RECORDS


def test_render_aligns_columns_and_strips_trailing_space() -> None:
    text = rendering.render(["name", "phase"], [["a-long-name", "train"], ["b", ""]])
    assert text.splitlines() == ["NAME          PHASE", "a-long-name   train", "b"]


def test_render_refuses_ragged_rows() -> None:
    with pytest.raises(ValueError, match="2 cells"):
        rendering.render(["a"], [["x", "y"]])


@pytest.mark.parametrize(
    ("age_ms", "shown"),
    [(-5, "0s"), (999, "0s"), (59_000, "59s"), (60_000, "1m"), (192_000, "3m12s"),
     (3_600_000, "1h"), (18_240_000, "5h4m"), (86_400_000, "1d"), (97_200_000, "1d3h")],
)  # fmt: skip
def test_format_age_reads_like_kubectl(age_ms: int, shown: str) -> None:
    assert rendering.format_age(age_ms) == shown


def test_format_time_is_rfc3339_utc() -> None:
    assert rendering.format_time_ms(1_700_000_000_123) == "2023-11-14T22:13:20.123Z"


SPEC = JobSpec(
    dataset="ds",
    train_prob=0.8,
    trigger=Trigger(
        check_period_seconds=30, timer=Timer(start="02:00", end="24:00"),
        condition=Condition(operator=">", threshold=500, metric="num_of_samples"),
    ),
    output_dir="/out",
)  # fmt: skip


def job_state(**changes: Any) -> JobState:
    fields: dict[str, Any] = {
        "namespace": "default", "name": "j", "spec": SPEC, "digest": "d", "phase": "eval",
        "step": "running", "version": 2, "taken": 20, "pending": ((16, 18),),
        "eval_batches": ((8, 10), (18, 20)), "train_models": (ModelRef(format="pkl", url="/m"),),
        "dataset": DatasetInfo(url="s3://b/data/d.txt", format="txt"),
    }  # fmt: skip
    return JobState(**{**fields, **changes})


def test_job_row_and_state_word() -> None:
    row = rendering.job_row(job_state(), 4_000, 64_000)
    assert row == {
        "namespace": "default", "name": "j", "phase": "eval", "state": "running",
        "version": 2, "pending": 2, "eval-batches": 2, "age": "1m",
    }  # fmt: skip
    assert rendering.job_state_word(job_state(dataset=None)) == "no-dataset"
    gone = DatasetInfo(url="/d", format="txt", present=False)
    assert rendering.job_state_word(job_state(dataset=gone)) == "paused"
    backing_off = job_state(phase="train", step="waiting", retry_at_ms=9_000)
    assert rendering.job_state_word(backing_off) == "backoff"


def test_dataset_row_shows_unknown_count_as_dash() -> None:
    state = DatasetState(namespace="n", name="d", url="/d.csv", format="csv", digest="x")
    row = rendering.dataset_row(state, None, 0)
    assert (row["samples"], row["age"]) == (None, None), "null in JSON"
    assert rendering.render(list(row), [list(row.values())]).splitlines()[1].split() == [
        "n", "d", "csv", "-", "-", "/d.csv", "-",
    ]  # fmt: skip
    read = rendering.dataset_row(msgspec.structs.replace(state, num_samples=7), 0, 0)
    assert (read["samples"], read["status"]) == (7, "ok"), "a number in JSON"


def test_an_unreadable_dataset_says_so_and_why() -> None:
    state = DatasetState(namespace="n", name="d", url="/d.csv", format="csv", digest="x",
                         num_samples=7, unreadable="/d.csv: no such file")  # fmt: skip
    assert rendering.dataset_row(state, None, 0)["status"] == "unreadable"
    lines = rendering.describe_dataset(state, ["job:n/j"], [], 0)
    assert "Unreadable:     /d.csv: no such file" in lines
    assert "Used by:        n/j" in lines


def test_round_files_follow_the_phases_the_round_reached() -> None:
    files = dict(rendering.round_files(job_state(), RECORDS))
    assert files == {
        "train data": "/out/data/train/2/data.txt",
        "train index": "/out/data/train/2/dataIndex.txt",
        "train output": "/out/train/2",
        "eval data": "/out/data/eval/2/data.txt",
        "eval index": "/out/data/eval/2/dataIndex.txt",
        "eval output": "/out/eval/2",
    }
    assert rendering.round_files(job_state(version=0), []) == []


def test_describe_job_summarises_spec_progress_and_files() -> None:
    credential = '{"ACCESS_KEY_ID": "a", "SECRET_ACCESS_KEY": "s3cr3t"}'
    annotations = {wire.CREDENTIAL_ANNOTATION: credential}
    resource = {**JOB, "metadata": {"name": "j", "annotations": annotations}}
    job = wire.decode_job(json.dumps(resource).encode())
    text = "\n".join(rendering.describe_job(job_state(last_error="boom"), job, RECORDS, 10_000))
    assert "Phase:          eval, running (since 6s ago)" in text
    assert "Trigger:        check every 30s; timer 02:00-24:00; when num_of_samples > 500" in text
    assert "pending train 2" in text and "eval batches 2 (4 samples)" in text
    assert "Train models:   pkl /m" in text
    assert "Last error:     boom" in text
    assert "Files of round 2:" in text
    assert "sedna.io/credential (hidden)" in text and "s3cr3t" not in text


def test_history_lines_show_time_event_outcome_and_notes() -> None:
    lines = rendering.history_lines(RECORDS[:1], 61_000)
    assert lines[0] == "History (last 1 events, oldest first):"
    assert lines[1].split() == [
        "1970-01-01T00:00:01.000Z", "1m", "ago", "JobApplied", "applied", "train/waiting", "v0",
    ]  # fmt: skip
    assert lines[2].strip() == "job created"


def test_watch_lines() -> None:
    def upstream(content: dict[str, Any]) -> bytes:
        header = {"namespace": "ns", "resourceKind": "lifelonglearningjob", "resourceName": "j"}
        return json.dumps({"header": header, "content": content}).encode()

    ready = upstream({"phase": "train", "status": "ready", "input": {"outputDir": "/o/train/1"}})
    assert rendering.watch_line("sedna/n/upstream", ready, 0.5) == (
        "1970-01-01T00:00:00.500Z  lifelonglearningjob ns/j  train/ready  outputDir=/o/train/1"
    )
    failed = upstream({"phase": "eval", "status": "failed", "reason": "copy failed"})
    assert rendering.watch_line("t", failed, 0).endswith("eval/failed  reason: copy failed")
    rejection = {"topic": "sedna/n/downstream", "reason": "$.spec.x: bad password=abc"}
    line = rendering.watch_line("sedna/n/errors", json.dumps(rejection).encode(), 0)
    assert line.endswith("rejected on sedna/n/downstream: $.spec.x: bad password=***")
    assert rendering.watch_line("t", b"\xff", 0).endswith("t: unreadable payload (1 bytes)")
    as_json = json.loads(rendering.watch_line("t", ready, 1.0, "json"))
    assert as_json["topic"] == "t" and as_json["payload"]["content"]["status"] == "ready"


def test_describe_job_shows_the_failures_in_a_row_and_the_next_try() -> None:
    error = "train worker w failed (exit code 2)"
    failing = job_state(
        phase="train", step="waiting", consecutive_failures=3, retry_at_ms=250_000, last_error=error
    )
    text = "\n".join(rendering.describe_job(failing, None, [], 10_000))
    assert "Last error:     train worker w failed (exit code 2)" in text
    assert "Failures:       3 in a row; next try 1970-01-01T00:04:10.000Z (in 4m)" in text
    assert "Failures:       none in a row" in "\n".join(
        rendering.describe_job(job_state(), None, [], 10_000)
    )


def test_a_gm_managed_job_says_what_the_gm_shows_and_what_it_waits_for() -> None:
    binding = job_state(dataset=None, gm=GmView(stage="train", type="running", count=4))
    assert rendering.job_state_word(binding) == "binding"
    assert "binds and forwards its workers' reports" in rendering.gm_summary(binding)
    waiting = job_state(
        phase="train", step="waiting", gm=GmView(stage="deploy", type="ready", count=9),
        gm_rollback=wire.RollbackResult(to_version=2, from_version=3),
    )  # fmt: skip
    summary = rendering.gm_summary(waiting)
    assert summary.startswith("shows Deploy/Ready (9 conditions)")
    assert "the rollback to version 2 is copied, its deploy ready waits" in summary
