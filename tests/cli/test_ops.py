"""The operator CLI's pure parts: manifests, validation, routing, and what gets printed."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from service import cli, messages, ops, tables
from service.core.state import DatasetInfo, DatasetState, JobSpec, JobState, ModelRef
from service.core.triggers import TriggerSpec
from service.errors import InvalidMessage
from service.history import HistoryRecord, decode_records, encode_record, last_change_ms

DATASET: dict[str, Any] = {
    "apiVersion": "sedna.io/v1alpha1",
    "kind": "Dataset",
    "metadata": {"name": "ds"},
    "spec": {"url": "/data/d.txt", "format": "txt", "nodeName": "edge-1"},
}
JOB: dict[str, Any] = {
    "kind": "LifelongLearningJob",
    "metadata": {"name": "job", "namespace": "team-a"},
    "spec": {
        "dataset": {"name": "ds", "trainProb": 0.5},
        "trainSpec": {"template": {"spec": {"nodeName": "edge-2"}}},
        "evalSpec": {"template": {}},
        "deploySpec": {"template": {}},
        "outputDir": "/out",
    },
}


def copy(obj: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(json.dumps(obj))
    return result


def check(obj: object, **kwargs: Any) -> ops.Checked:
    return ops.check_document(ops.Document("f.yaml: document 1", obj), **kwargs)


# ------------------------------------------------------------ tables


def test_render_aligns_columns_and_strips_trailing_space() -> None:
    text = tables.render(["name", "phase"], [["a-long-name", "train"], ["b", ""]])
    assert text.splitlines() == ["NAME          PHASE", "a-long-name   train", "b"]


def test_render_refuses_ragged_rows() -> None:
    with pytest.raises(ValueError, match="2 cells"):
        tables.render(["a"], [["x", "y"]])


@pytest.mark.parametrize(
    ("age_ms", "shown"),
    [(-5, "0s"), (999, "0s"), (59_000, "59s"), (60_000, "1m"), (192_000, "3m12s"),
     (3_600_000, "1h"), (18_240_000, "5h4m"), (86_400_000, "1d"), (97_200_000, "1d3h")],
)  # fmt: skip
def test_format_age_reads_like_kubectl(age_ms: int, shown: str) -> None:
    assert tables.format_age(age_ms) == shown


def test_format_time_is_rfc3339_utc() -> None:
    assert tables.format_time_ms(1_700_000_000_123) == "2023-11-14T22:13:20.123Z"


# ------------------------------------------------------------ manifests


def test_yaml_reads_times_and_dates_as_kubectl_does() -> None:
    text = "a: 02:00\nb: 24:00\nc: 2024-05-01\nd: 500\ne: 0.8\nf: true\ng: '7'\n"
    (doc,) = ops.load_documents(text, "x")
    assert doc.obj == {"a": "02:00", "b": "24:00", "c": "2024-05-01", "d": 500, "e": 0.8,
                       "f": True, "g": "7"}  # fmt: skip


def test_several_documents_lists_and_json_arrays_expand() -> None:
    text = "---\nkind: Dataset\n---\n\n---\nkind: List\nitems: [{a: 1}, {b: 2}]\n"
    docs = ops.load_documents(text, "f.yaml")
    assert [d.where for d in docs] == [
        "f.yaml: document 1", "f.yaml: document 3 item 1", "f.yaml: document 3 item 2",
    ]  # fmt: skip
    array = ops.load_documents(json.dumps([DATASET, JOB]), "stdin")
    assert [d.obj for d in array] == [DATASET, JOB]


def test_yaml_syntax_error_names_line_and_column() -> None:
    with pytest.raises(InvalidMessage, match=r"^f.yaml: not valid YAML at line 2, column 1"):
        ops.load_documents("a: [1\n", "f.yaml")


# ------------------------------------------------------------ validation


def test_every_field_problem_is_reported_with_its_path() -> None:
    job = copy(JOB)
    job["metadata"]["name"] = "Bad_Name"
    job["spec"]["dataset"]["trainProb"] = 2
    job["spec"]["trainSpec"]["trigger"] = {"timer": {"start": "25:00", "end": "24:00"}}
    job["spec"]["outputDir"] = "relative"
    del job["spec"]["deploySpec"]
    resource, problems = ops.resource_problems(job)
    assert resource is None
    assert [p.path for p in problems] == [
        "$.metadata.name",
        "$.spec.dataset.trainProb",
        "$.spec.trainSpec.trigger.timer.start",
        "$.spec.outputDir",
        "$.spec.deploySpec",
    ]
    assert problems[-1].reason == "required field is missing"


def test_a_bad_operator_does_not_invent_further_problems() -> None:
    job = copy(JOB)
    job["spec"]["trainSpec"]["trigger"] = {"condition": {"operator": "~"}}
    _, problems = ops.resource_problems(job)
    assert [p.path for p in problems] == ["$.spec.trainSpec.trigger.condition.operator"]


def test_an_unknown_kind_stops_at_one_problem() -> None:
    _, problems = ops.resource_problems({"kind": "Pod", "metadata": {"name": "x"}})
    assert [(p.path, p.reason) for p in problems] == [
        ("$.kind", "must be Dataset or LifelongLearningJob")
    ]


def test_credential_problems_never_show_the_secret() -> None:
    dataset = copy(DATASET)
    secret = '{"SECRET_ACCESS_KEY": "hunter2", "s3-usehttps": "yes"}'
    dataset["metadata"]["annotations"] = {messages.CREDENTIAL_ANNOTATION: secret}
    checked = check(dataset)
    assert [p.path for p in checked.problems] == [
        '$.metadata.annotations["sedna.io/credential"].s3-usehttps'
    ]
    assert "hunter2" not in "\n".join(checked.problem_lines())


def test_unexpanded_shell_variable_is_pointed_out() -> None:
    dataset = copy(DATASET)
    dataset["spec"]["nodeName"] = "$WORKER_NODE"
    (line,) = check(dataset).problem_lines()
    assert line.startswith("f.yaml: document 1 (Dataset ds): $.spec.nodeName: must be a DNS-1123")
    assert "'$WORKER_NODE' looks like an unexpanded shell variable" in line


@pytest.mark.parametrize(
    ("path", "segments", "exact"),
    [("$", [], True), ("$.spec.a[3].b", ["spec", "a", 3, "b"], True),
     ('$.metadata.annotations["k"].x', ["metadata", "annotations"], False),
     ("$.metadata.annotations[...]", ["metadata", "annotations"], False), ("x", [], False)],
)  # fmt: skip
def test_parse_path(path: str, segments: list[str | int], exact: bool) -> None:
    assert ops.parse_path(path) == (segments, exact)


# ------------------------------------------------------------ routing and envelopes


def test_each_resource_routes_to_the_node_it_names() -> None:
    assert ops.target_node(DATASET, "default-node") == ("edge-1", None)
    assert ops.target_node(JOB, "default-node") == ("edge-2", None)
    unrouted = copy(JOB)
    unrouted["spec"]["trainSpec"]["template"] = {"spec": {"containers": []}}
    assert ops.target_node(unrouted, "default-node") == ("default-node", None)
    bad = copy(JOB)
    bad["spec"]["trainSpec"]["template"]["spec"]["nodeName"] = "a/b"
    node, problem = ops.target_node(bad, "default-node")
    assert node is None and problem is not None
    assert problem.path == "$.spec.trainSpec.template.spec.nodeName"


def test_checked_envelope_is_what_the_controller_accepts() -> None:
    checked = check(DATASET, default_namespace="team-b", default_node="n0")
    assert checked.problems == ()
    assert (checked.kind, checked.namespace, checked.name, checked.node) == (
        "dataset", "team-b", "ds", "edge-1",
    )  # fmt: skip
    decoded = messages.decode_envelope(checked.envelope)
    assert isinstance(decoded, messages.DatasetInsert)
    assert decoded.dataset.metadata.namespace == "team-b"
    job = check(JOB, default_namespace="team-b")
    assert job.namespace == "team-a", "a namespace the document names wins"


def test_delete_envelope_decodes_as_a_delete() -> None:
    decoded = messages.decode_envelope(ops.delete_envelope("lifelonglearningjob", "ns", "j"))
    assert decoded == messages.JobDelete(namespace="ns", name="j")


def test_topics() -> None:
    assert ops.downstream_topic("sedna", "edge-2") == "sedna/edge-2/downstream"
    assert ops.upstream_filter("{prefix}/{node}/upstream", "p", "n") == "p/n/upstream"
    assert ops.upstream_filter("{namespace}/{prefix}-up/{node}", "p", "n") == "+/p-up/n"
    assert ops.upstream_filter("x/ns-{namespace}/{node}", "p", "n") == "x/+/n"


# ------------------------------------------------------------ argument parsing


def test_bad_arguments_are_usage_errors() -> None:
    parser = cli.build_parser()
    for argv in (["get", "pods"], ["delete", "job", "Bad_Name"], ["watch", "--count", "0"],
                 ["describe", "job", "x", "-n", "a.b"], ["apply"]):  # fmt: skip
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(argv)
        assert exc.value.code == 2, argv


def test_kind_aliases() -> None:
    parser = cli.build_parser()
    args: argparse.Namespace = parser.parse_args(["delete", "JOBS", "a", "b"])
    assert (args.kind, args.names) == ("lifelonglearningjob", ["a", "b"])
    assert parser.parse_args(["get", "ds"]).kind == "dataset"


# ------------------------------------------------------------ views of state

SPEC = JobSpec(
    dataset="ds",
    train_prob=0.8,
    trigger=TriggerSpec(check_period_s=30, window=(120, 1440), operator=">", threshold=500,
                        metric="num_of_samples"),
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


RECORDS = [
    HistoryRecord(at_ms=1_000, event="JobApplied", notes=("job created",), outcome="applied",
                  phase="train", step="waiting", version=0),
    HistoryRecord(at_ms=2_000, event="Tick", outcome="ignored",
                  phase="train", step="waiting", version=0),
    HistoryRecord(at_ms=3_000, event="DatasetChanged", outcome="applied",
                  phase="train", step="running", version=2),
    HistoryRecord(at_ms=4_000, event="WorkerReported", outcome="applied",
                  phase="eval", step="running", version=2),
    HistoryRecord(at_ms=5_000, event="Tick", outcome="ignored",
                  phase="eval", step="running", version=2),
]  # fmt: skip


def test_last_change_skips_events_that_changed_nothing() -> None:
    assert last_change_ms(RECORDS) == 4_000
    assert last_change_ms(RECORDS[:2]) == 1_000
    assert last_change_ms([]) is None


def test_records_skip_unreadable_history() -> None:
    history = [encode_record(RECORDS[0]), b"not json", b"[]", b'{"at": "x"}']
    assert decode_records(history) == [RECORDS[0]]


def test_job_row_and_state_word() -> None:
    row = tables.job_row(job_state(), 4_000, 64_000)
    assert row == {
        "namespace": "default", "name": "j", "phase": "eval", "state": "running",
        "version": "2", "pending": "2", "eval-batches": "2", "age": "1m",
    }  # fmt: skip
    assert tables.job_state_word(job_state(dataset=None)) == "no-dataset"
    gone = DatasetInfo(url="/d", format="txt", present=False)
    assert tables.job_state_word(job_state(dataset=gone)) == "paused"


def test_dataset_row_shows_unknown_count_as_dash() -> None:
    state = DatasetState(namespace="n", name="d", url="/d.csv", format="csv", digest="x")
    assert tables.dataset_row(state, None, 0)["samples"] == "-"
    assert tables.dataset_row(state, None, 0)["age"] == "-"


def test_round_files_follow_the_phases_the_round_reached() -> None:
    files = dict(tables.round_files(job_state(), RECORDS))
    assert files == {
        "train data": "/out/data/train/2/data.txt",
        "train index": "/out/data/train/2/dataIndex.txt",
        "train output": "/out/train/2",
        "eval data": "/out/data/eval/2/data.txt",
        "eval index": "/out/data/eval/2/dataIndex.txt",
        "eval output": "/out/eval/2",
    }
    assert tables.round_files(job_state(version=0), []) == []


def test_describe_job_summarises_spec_progress_and_files() -> None:
    credential = '{"ACCESS_KEY_ID": "a", "SECRET_ACCESS_KEY": "s3cr3t"}'
    annotations = {messages.CREDENTIAL_ANNOTATION: credential}
    resource = {**JOB, "metadata": {"name": "j", "annotations": annotations}}
    job = messages.decode_job(json.dumps(resource).encode())
    text = "\n".join(tables.describe_job(job_state(last_error="boom"), job, RECORDS, 10_000))
    assert "Phase:          eval, running (since 6s ago)" in text
    assert "Trigger:        check every 30s; timer 02:00-24:00; when num_of_samples > 500" in text
    assert "pending train 2" in text and "eval batches 2 (4 samples)" in text
    assert "Train models:   pkl /m" in text
    assert "Last error:     boom" in text
    assert "Files of round 2:" in text
    assert "sedna.io/credential (hidden)" in text and "s3cr3t" not in text


def test_history_lines_show_time_event_outcome_and_notes() -> None:
    lines = tables.history_lines(RECORDS[:1], 61_000)
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
    assert tables.watch_line("sedna/n/upstream", ready, 0.5) == (
        "1970-01-01T00:00:00.500Z  lifelonglearningjob ns/j  train/ready  outputDir=/o/train/1"
    )
    failed = upstream({"phase": "eval", "status": "failed", "reason": "copy failed"})
    assert tables.watch_line("t", failed, 0).endswith("eval/failed  reason: copy failed")
    rejection = {"topic": "sedna/n/downstream", "reason": "$.spec.x: bad password=abc"}
    line = tables.watch_line("sedna/n/errors", json.dumps(rejection).encode(), 0)
    assert line.endswith("rejected on sedna/n/downstream: $.spec.x: bad password=***")
    assert tables.watch_line("t", b"\xff", 0).endswith("t: unreadable payload (1 bytes)")
    as_json = json.loads(tables.watch_line("t", ready, 1.0, "json"))
    assert as_json["topic"] == "t" and as_json["payload"]["content"]["status"] == "ready"
