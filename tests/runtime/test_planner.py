"""The commit planner folds a resource's transitions into one commit: pure, so it is tested
on outcomes of the real core without Redis."""

from __future__ import annotations

import base64
import dataclasses
import json
import logging

import msgspec
import pytest

from service import wire
from service.config import Config
from service.core.effects import (
    AttachDataset,
    Context,
    DetachDataset,
    Outcome,
    ReleaseOutputDir,
    decode_work,
)
from service.core.events import (
    DatasetApplied,
    DatasetChanged,
    DatasetPolled,
    Event,
    JobApplied,
    JobDeleted,
    ModelCopied,
    RollbackRequested,
    Tick,
    WorkerReported,
)
from service.core.lifecycle import transition
from service.core.rounds import decode_rounds
from service.core.state import DatasetState, State, decode_state
from service.history import decode_records
from service.keys import dataset_key, job_key
from service.metrics import Metrics
from service.runtime.intake import Accepted
from service.runtime.processor import Journal, Plan, Step, plan
from tests.core.driver import DATASET, JOB, NS, info, report, spec
from tests.core.test_rollback import rollback_copied, three_deployed

CONFIG = Config(node_name="edge-1", upstream_topic="{prefix}/{node}/{namespace}/up")
RKEY = job_key(NS, JOB)
TOKEN = "r1:7"


def steps_of(
    state: State | None, *events: Event | None, resource: bytes | None = None
) -> tuple[State | None, list[Step]]:
    """Run the events through the core as the processor does (None: a corrupt entry)."""
    steps = []
    for i, event in enumerate(events):
        entry = f"100-{i}"
        if event is None:
            steps.append(Step(entry, None, None, 1_000 + i))
            continue
        ctx = Context(now_ms=1_000 + i, minute_of_day=0, event_id=f"s3-{entry}")
        outcome = transition(state, event, ctx)
        accepted = Accepted(event=event, topic="t", head=b"h", received_ms=900, resource=resource)
        steps.append(Step(entry, accepted, outcome, 1_000 + i))
        state = outcome.state
    return state, steps


def planned(initial: State | None, *events: Event | None, resource: bytes | None = None) -> Plan:
    _, steps = steps_of(initial, *events, resource=resource)
    return plan(RKEY, TOKEN, initial, steps, CONFIG)


def created() -> State | None:
    state, _ = steps_of(None, JobApplied(namespace=NS, name=JOB, spec=spec(), digest="d1"))
    return state


def test_an_insert_commits_state_resource_intents_and_acks_every_entry() -> None:
    applied = JobApplied(namespace=NS, name=JOB, spec=spec(), digest="d1")
    result = planned(None, applied, None, resource=b'{"kind":"LifelongLearningJob"}')
    commit = result.commit
    assert commit.ack_ids == ("100-0", "100-1"), "a corrupt entry is acknowledged and dropped"
    assert commit.state is not None and decode_state(commit.state).name == JOB
    assert commit.resource == b'{"kind":"LifelongLearningJob"}'
    (intent_id, intent), = commit.effects
    assert intent_id == "s3-100-0/0" and isinstance(decode_work(intent), AttachDataset)
    assert [w for _, w in result.work] == [decode_work(intent)]
    (record,) = decode_records(commit.history)
    assert (record.event, record.outcome, record.token) == ("JobApplied", "applied", TOKEN)


def test_statuses_go_to_the_namespace_upstream_topic_with_their_effect_id() -> None:
    changed = DatasetChanged(namespace=NS, name=JOB, dataset=DATASET, info=info(), num_samples=10)
    state, _ = steps_of(created(), changed)
    assert state is not None and state.step == "preparing"  # type: ignore[union-attr]
    result = planned(state, report("inference", "running"))  # forwarded in any stage
    (entry,) = result.commit.outbox
    assert entry.topic == f"sedna/edge-1/{NS}/up"
    envelope = json.loads(entry.payload)
    assert envelope["header"] == {
        "namespace": NS, "resourceKind": "lifelonglearningjob", "resourceName": JOB,
        "operation": "status", "id": entry.id,
    }  # fmt: skip
    assert envelope["content"]["phase"] == "inference"
    assert envelope["content"]["status"] == "running"


def test_the_last_scheduled_check_is_the_timer() -> None:
    changed = DatasetChanged(namespace=NS, name=JOB, dataset=DATASET, info=info(), num_samples=0)
    tick = Tick(kind="job", namespace=NS, name=JOB, due_ms=0)
    result = planned(created(), changed, tick)
    assert result.commit.timer_due_ms is not None
    assert result.commit.timer_due_ms == 1_001 + 60_000, "the tick's reschedule, not the first"


def test_a_refusal_keeps_the_state_and_goes_to_the_errors_topic() -> None:
    result = planned(None, report("train", "completed", "/m"))
    assert result.commit.keep_state and result.commit.state is None
    (entry,) = result.commit.outbox
    assert entry.topic == "sedna/edge-1/errors" and entry.id == "100-0/rejection"
    rejection = json.loads(entry.payload)
    assert rejection["reason"] == f"unknown job {NS}/{JOB}" and rejection["topic"] == "t"
    (rejected,) = result.rejected
    assert rejected.code == "unknown_job" and rejected.record == entry.payload
    assert result.records[0].outcome == "rejected"


def test_a_delete_removes_the_state_and_keeps_its_detach_and_release_intents() -> None:
    result = planned(created(), JobDeleted(namespace=NS, name=JOB))
    assert result.commit.delete and result.commit.state is None
    assert [type(decode_work(i)) for _, i in result.commit.effects] == [
        DetachDataset,
        ReleaseOutputDir,
    ]
    assert result.commit.history == ()


def test_events_that_change_nothing_are_counted_but_not_kept() -> None:
    again = JobApplied(namespace=NS, name=JOB, spec=spec(), digest="d1")  # a resync re-send
    result = planned(created(), again)
    assert [r.outcome for r in result.records] == ["ignored"]
    assert result.commit.history == ()
    assert result.commit.keep_state and result.commit.state is None  # nothing rewritten
    assert result.state == created()


def test_a_changed_state_is_written_and_an_unchanged_one_kept() -> None:
    """A state is rewritten only when an event changed it: a forwarded report leaves it as
    it was, and only its history record and upstream message are written."""
    changed = DatasetChanged(namespace=NS, name=JOB, dataset=DATASET, info=info(), num_samples=10)
    result = planned(created(), changed)
    assert not result.commit.keep_state and result.commit.state is not None
    assert decode_state(result.commit.state) == result.state != created()
    forwarded = planned(result.state, report("inference", "running"))
    assert forwarded.commit.keep_state and forwarded.commit.state is None
    assert len(forwarded.commit.outbox) == 1 and len(forwarded.commit.history) == 1


def test_an_unreadable_dataset_goes_to_the_errors_topic_and_is_not_a_refusal() -> None:
    rkey = dataset_key(NS, DATASET)
    applied = DatasetApplied(namespace=NS, name=DATASET, url="/d.csv", format="csv", digest="1")
    created_state, _ = steps_of(None, applied)
    missing = DatasetPolled(
        namespace=NS, name=DATASET, url="/d.csv", unreadable="/d.csv does not exist"
    )
    _, steps = steps_of(created_state, missing, missing)
    result = plan(rkey, TOKEN, created_state, steps, CONFIG)
    (entry,) = result.commit.outbox  # the second poll found the same: nothing new to say
    assert entry.topic == "sedna/edge-1/errors" and entry.id == "100-0/unreadable"
    record = json.loads(entry.payload)
    assert record["topic"] == "sedna/edge-1/downstream"
    assert record["reason"] == f"dataset {NS}/{DATASET} cannot be read: /d.csv does not exist"
    assert base64.b64decode(record["payload"]) == b"/d.csv"
    assert [r.reason for r in result.unreadable] == ["/d.csv does not exist"]
    assert result.rejected == ()
    assert [r.outcome for r in result.records] == ["applied", "ignored"]
    assert isinstance(result.state, DatasetState) and result.state.unreadable is not None


def test_a_forwarded_report_over_the_size_limit_goes_out_trimmed_with_a_reason() -> None:
    """Outbound messages keep the inbound limit: a report whose forward would be larger (its
    numbers written longer than the worker wrote them) is forwarded with each result's
    format and url only and no ownerInfo, and a reason saying so."""
    big = [{"format": "pkl", "url": f"/m{i}", "metrics": {"a": [1e15] * 1000}} for i in range(60)]
    state, _ = steps_of(created())
    event = WorkerReported(
        namespace=NS, name=JOB, worker=f"{JOB}-inference-1", kind="inference",
        status="running", results=tuple(big), owner_info=b'{"note": "x"}',
    )  # fmt: skip
    result = planned(state, event)
    (entry,) = result.commit.outbox
    assert len(entry.payload) <= wire.MAX_PAYLOAD_BYTES
    content = json.loads(entry.payload)["content"]
    assert content["output"] == {
        "models": [{"format": "pkl", "url": f"/m{i}"} for i in range(60)],
        "ownerInfo": {},
    }
    assert "over the 1048576-byte limit" in content["reason"]
    assert "ownerInfo left out" in content["reason"]
    # one that fits goes out as it came
    small = msgspec.structs.replace(event, results=tuple(big[:2]))
    (entry,) = planned(state, small).commit.outbox
    output = json.loads(entry.payload)["content"]["output"]
    assert output == {"models": json.loads(json.dumps(big[:2])), "ownerInfo": {"note": "x"}}


def test_an_ended_round_joins_the_commit_and_a_late_refusal_goes_to_the_errors_topic() -> None:
    d = three_deployed()
    d.apply(RollbackRequested(namespace=NS, name=JOB, version=1))
    before = d.state
    effects = rollback_copied(d, 1, "model /m does not exist")
    outcome = Outcome(d.state, effects)
    accepted = Accepted(event=ModelCopied(namespace=NS, name=JOB, version=1, rollback=True))
    result = plan(RKEY, TOKEN, before, [Step("100-0", accepted, outcome, 2_000)], CONFIG)
    (record,) = decode_rounds(list(result.commit.rounds))
    assert (record.kind, record.version, record.outcome) == ("rollback", 1, "refused")
    (entry,) = result.commit.outbox
    assert entry.topic == "sedna/edge-1/errors" and entry.id == "100-0/refused"
    refusal = json.loads(entry.payload)
    assert refusal["topic"] == "sedna/edge-1/downstream"
    assert refusal["reason"].startswith(f"rollback of job {NS}/{JOB} to version 1 refused: ")
    assert json.loads(base64.b64decode(refusal["payload"])) == {"job": f"{NS}/{JOB}", "version": 1}
    (rejected,) = result.rejected
    assert rejected.code == "rollback_refused" and rejected.record == entry.payload


def test_only_transitions_that_change_the_view_count_as_changed() -> None:
    changed = DatasetChanged(namespace=NS, name=JOB, dataset=DATASET, info=info(), num_samples=10)
    state, _ = steps_of(created(), changed)  # round 1 fires: train/preparing
    result = planned(state, report("train", "running"), report("train", "running"))
    assert result.changed == (False, False), "forwarded progress reports move nothing"
    moved = planned(created(), changed)
    assert moved.changed == (True,) and moved.records[0].step == "preparing"


def test_the_journal_logs_moves_at_info_and_forwards_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, "service.runtime.processor")
    changed = DatasetChanged(namespace=NS, name=JOB, dataset=DATASET, info=info(), num_samples=10)
    state, _ = steps_of(created(), changed)
    forwarded = planned(state, report("inference", "running"))
    moved = planned(created(), changed)
    journal = Journal(Metrics())
    journal.write(RKEY, forwarded.records, forwarded.changed)
    journal.write(RKEY, moved.records, moved.changed)
    levels = [(r.levelno, r.getMessage().split()[0]) for r in caplog.records]
    assert levels == [(logging.DEBUG, "WorkerReported"), (logging.INFO, "DatasetChanged")]


def test_a_result_handed_over_in_process_retires_its_intent_instead_of_an_ack() -> None:
    """An effect's result applied in process has no ingress entry: the commit acknowledges
    the entries read and retires the result's intent, in the same fenced transaction."""
    initial = created()
    _, (read, handed) = steps_of(
        initial, report("train", "running"), report("train", "completed")
    )
    handed = dataclasses.replace(handed, entry_id="L7.1", effect_id="s3-99-0/0")
    result = plan(RKEY, TOKEN, initial, [read, handed], CONFIG)
    assert result.commit.ack_ids == ("100-0",)
    assert result.commit.retire == ("s3-99-0/0",)
